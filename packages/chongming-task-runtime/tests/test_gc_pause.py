"""暂停循环 GC（runtime/gc_pause.py）：submit_many 期间、wait_all 造大结果列表期间；
用户的 GC 开关在任何出口都恢复原样。"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Iterator, Sequence

import pytest

from chongming_task import Controller, Submit
from chongming_task.errors import DuplicateTaskId, TaskError
from chongming_task.models import Outcome, TaskSnapshot, Transition
from chongming_task.runtime import gc_pause
from chongming_task.runtime.controller import GC_PAUSE_MIN_TASKS
from chongming_task.runtime.gc_pause import gc_paused
from chongming_task.stores.memory import InMemoryTaskStore


def noop(ctx: object) -> None:
    return None


class WatchingStore(InMemoryTaskStore):
    """记下每次 create_many 时 GC 开没开。"""

    def __init__(self) -> None:
        super().__init__()
        self.gc_during: list[bool] = []

    def create_many(
        self, items: Sequence[tuple[TaskSnapshot, Sequence[Transition]]]
    ) -> list[TaskError | None]:
        self.gc_during.append(gc.isenabled())
        return super().create_many(items)


@pytest.fixture(autouse=True)
def gc_enabled() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    assert gc_pause.paused_depth() == 0, "暂停计数没有归零"
    if was:
        gc.enable()
    else:
        gc.disable()


def test_a_big_submit_many_pauses_gc_while_writing_and_turns_it_back_on() -> None:
    store = WatchingStore()
    with Controller(max_parallel=1, store=store) as c:
        c.register("noop", noop)
        c.submit_many([Submit("noop") for _ in range(GC_PAUSE_MIN_TASKS)], batch_size=500)
        assert store.gc_during == [False, False]
        assert gc.isenabled()
        c.stop_all(reason="测试结束")


def test_a_small_submit_many_leaves_gc_alone() -> None:
    store = WatchingStore()
    with Controller(max_parallel=1, store=store) as c:
        c.register("noop", noop)
        c.submit_many([Submit("noop") for _ in range(GC_PAUSE_MIN_TASKS - 1)])
        assert store.gc_during == [True]
        c.stop_all(reason="测试结束")


def test_gc_that_was_off_stays_off() -> None:
    gc.disable()
    store = WatchingStore()
    with Controller(max_parallel=1, store=store) as c:
        c.register("noop", noop)
        c.submit_many([Submit("noop") for _ in range(GC_PAUSE_MIN_TASKS)])
        assert not gc.isenabled(), "用户自己关掉的 GC 不能被我们打开"
        c.stop_all(reason="测试结束")


def test_gc_comes_back_when_the_store_refuses_or_the_checks_refuse() -> None:
    store = WatchingStore()
    with Controller(store=store, owner="other") as other:
        other.register("noop", noop)
        other.submit("noop", task_id="taken").wait(timeout=10)
    with Controller(max_parallel=1, store=store) as c:
        c.register("noop", noop)
        specs = [Submit("noop", task_id=f"t{i}") for i in range(GC_PAUSE_MIN_TASKS)]
        specs.append(Submit("noop", task_id="taken"))  # 存储里已有（别的节点的）：这一批停下、抛错
        with pytest.raises(DuplicateTaskId, match="批量提交已停止"):
            c.submit_many(specs)
        assert store.gc_during == [False, False]  # 两批（默认每批 1000 个），第二批撞上
        assert gc.isenabled()
        dupes = [Submit("noop", task_id="same") for _ in range(GC_PAUSE_MIN_TASKS)]
        with pytest.raises(DuplicateTaskId):
            c.submit_many(dupes)  # 构造之前的检查就拒绝了：同样恢复
        assert gc.isenabled()
        c.stop_all(reason="测试结束")


def test_overlapping_pauses_resume_only_when_the_last_one_leaves() -> None:
    first_in = threading.Event()
    second_done = threading.Event()
    seen: list[bool] = []

    def second() -> None:
        assert first_in.wait(10)
        with gc_paused():
            seen.append(gc.isenabled())
        seen.append(gc.isenabled())  # 第一个还在暂停中：仍然关着
        second_done.set()

    thread = threading.Thread(target=second)
    thread.start()
    with gc_paused():
        first_in.set()
        assert second_done.wait(10)
    thread.join(10)
    assert seen == [False, False]
    assert gc.isenabled()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="需要 os.fork")
def test_a_child_forked_during_the_pause_gets_gc_back() -> None:
    with gc_paused():
        pid = os.fork()
        if pid == 0:  # 子进程：没有那次暂停去恢复它，要由 fork 钩子恢复
            os._exit(0 if gc.isenabled() and gc_pause.paused_depth() == 0 else 1)
        _, status = os.waitpid(pid, 0)
        assert not gc.isenabled()
    assert os.waitstatus_to_exitcode(status) == 0


def _watch_outcomes(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """记下 wait_all 造每个结果对象时 GC 开没开。"""
    seen: list[bool] = []
    original = Outcome.from_snapshot.__func__  # type: ignore[attr-defined]

    def watching(cls: type[Outcome], snapshot: TaskSnapshot) -> Outcome:
        seen.append(gc.isenabled())
        result: Outcome = original(cls, snapshot)
        return result

    monkeypatch.setattr(Outcome, "from_snapshot", classmethod(watching))
    return seen


@pytest.mark.parametrize("count", [GC_PAUSE_MIN_TASKS - 1, GC_PAUSE_MIN_TASKS])
def test_wait_all_pauses_gc_only_while_building_a_big_result_list(
    monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    with Controller(max_parallel=2, store=InMemoryTaskStore()) as c:
        c.register("noop", noop)
        for _ in range(count):
            c.submit("noop")
        seen = _watch_outcomes(monkeypatch)
        outcomes = c.wait_all(timeout=30)
        assert len(outcomes) == count and all(o.ok for o in outcomes)
        assert seen == [count < GC_PAUSE_MIN_TASKS] * count
        assert gc.isenabled()


def test_wait_all_leaves_gc_off_when_the_user_turned_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    with Controller(max_parallel=2) as c:
        c.register("noop", noop)
        for _ in range(GC_PAUSE_MIN_TASKS):
            c.submit("noop")
        gc.disable()
        seen = _watch_outcomes(monkeypatch)
        assert len(c.wait_all(timeout=30)) == GC_PAUSE_MIN_TASKS
        assert not any(seen)
        assert not gc.isenabled(), "用户自己关掉的 GC 不能被我们打开"
