"""写穿层对认领来的持久任务的读回对照（runtime/persistence.py 的 ``track`` / ``_converge``）——单线程、
FakeClock、逐步驱动，不起 Controller。

worker 认领一个任务后 ``WriteThrough.track`` 记下认领时的版本 V；之后一次 save 结果未知（存储替身先提交或
什么也不写，再抛"连接中途断了"），下一次写先读回：V 之后的记录是本进程的就接着写，是别人的（或持有者换了）
就隔离。
经 Controller.serve、在三种后端上的同一组场景在 tests/reliability/test_claimed_unknown_writes.py。
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from chongming_task.core.recipes import Recipe
from chongming_task.core.state_machine import StateMachine
from chongming_task.errors import StoreError
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.runtime.persistence import WriteThrough
from chongming_task.states import TaskStatus
from chongming_task.storage import TaskStore
from chongming_task.stores.memory import InMemoryTaskStore
from chongming_task.stores.sqlite import SqliteTaskStore
from chongming_task.testing import FakeClock

S = TaskStatus


class _Faulty:
    """下一次写到 ``target`` 的 save：``commit`` 时先照常提交，再（``meanwhile`` 替别人写一笔之后）抛出。"""

    target: TaskStatus | None = None
    commit = False
    meanwhile: Callable[[TaskStore], None] | None = None
    fired = 0

    def _maybe_fail(self, snapshot: TaskSnapshot, write: Callable[[], None]) -> None:
        if snapshot.status is not self.target:
            write()
            return
        self.target = None
        self.fired += 1
        if self.commit:
            write()
        if self.meanwhile is not None:
            self.meanwhile(self)  # type: ignore[arg-type]
        raise StoreError("注入的故障：连接在提交中途断了")

    def save(
        self,
        snapshot: TaskSnapshot,
        *,
        expect_version: int,
        transitions: Sequence[Transition] = (),
        lease_expired_before: datetime | None = None,
    ) -> None:
        # 混入类排在具体存储之前（见下面两个子类）：super() 就是那个存储自己的 save；写穿的快路径不会绕过
        # 这里（TaskStore.__init_subclass__ 按 MRO 判断）。
        base_save = super().save  # type: ignore[misc]
        self._maybe_fail(
            snapshot,
            lambda: base_save(snapshot, expect_version=expect_version, transitions=transitions),
        )


class FaultyMemory(_Faulty, InMemoryTaskStore):
    pass


class FaultySqlite(_Faulty, SqliteTaskStore):
    def save_many(self, requests: Sequence[object]) -> list[object]:  # type: ignore[override]
        # 组提交的批经过 save：每一项的结果与单独一次 save 相同（逐项语义，见 TaskStore.save_many）
        return TaskStore.save_many(self, requests)  # type: ignore[arg-type]


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> _Faulty:
    if request.param == "memory":
        return FaultyMemory()
    return FaultySqlite(str(tmp_path / "claimed.db"))


CLOCK = FakeClock()


def claimed(store: TaskStore, holder: str = "w") -> StateMachine:
    """提交者写下一个持久任务（v1，无人持有），``holder`` 认领它，交回认领到的那一版重建的状态机。"""
    submitted = StateMachine.create("t", "job", clock=CLOCK, owner=None, recipe=Recipe(name="job"))
    submitted.mark_queued(actor="submitter")
    store.create(submitted.snapshot, submitted.transitions)
    (snapshot,) = store.claim_queued(
        holder, names=["job"], limit=1, lease_until=CLOCK.now() + timedelta(hours=1)
    )
    return StateMachine(snapshot, (), clock=CLOCK)


def write_through(store: TaskStore) -> WriteThrough:
    return WriteThrough(store, owner="w", lease_ttl=30.0, clock=CLOCK)


@pytest.mark.parametrize("commit", [True, False], ids=["committed", "not-committed"])
@pytest.mark.parametrize("target", [S.STARTING, S.RUNNING])
def test_an_unknown_save_of_a_claimed_task_is_read_back_from_the_claimed_version(
    store: _Faulty, target: TaskStatus, commit: bool
) -> None:
    assert isinstance(store, TaskStore)
    machine = claimed(store)
    write = write_through(store)
    write.track(machine)
    store.target, store.commit = target, commit
    machine.mark_starting(executor="thread")
    write.sync(machine)
    machine.mark_running()
    write.sync(machine)
    machine.mark_succeeded(outcome=1)
    assert write.sync(machine), "读回：认领之后的记录是本进程的（或一条也没写进去）→ 从存储的版本接着写"
    assert store.fired == 1
    stored = store.get("t")
    assert stored is not None and (stored.status, stored.status_version) == (S.SUCCEEDED, 4)
    history = store.history("t")
    assert history[0].actor == "submitter" and history[1:] == list(machine.transitions)
    assert not write.is_fenced("t")
    assert [f.operation for f in write.snapshot_failures()] == ["save"]


def adopt_by_b(store: TaskStore) -> None:
    stored = store.get("t")
    assert stored is not None
    other = StateMachine(stored, (), clock=CLOCK)
    other.adopt("b", actor="b", reason="原持有者 w 的租约已过期")
    store.save(other.snapshot, expect_version=stored.status_version, transitions=other.transitions)


def release_and_claim_by_b(store: TaskStore) -> None:
    stored = store.get("t")
    assert stored is not None
    store.save(stored.evolve(owner=None), expect_version=stored.status_version)
    store.claim_queued("b", names=["job"], limit=1, lease_until=CLOCK.now() + timedelta(hours=1))


@pytest.mark.parametrize(
    ("meanwhile", "who"),
    [(adopt_by_b, "b（v2，cluster:adopted）"), (release_and_claim_by_b, "另一个持有者 b")],
    ids=["adopted", "released-and-reclaimed"],
)
def test_a_claimed_task_taken_over_while_our_save_was_unknown_is_fenced(
    store: _Faulty, meanwhile: Callable[[TaskStore], None], who: str
) -> None:
    assert isinstance(store, TaskStore)
    machine = claimed(store)
    write = write_through(store)
    write.track(machine)
    store.target, store.meanwhile = S.STARTING, meanwhile  # 本进程的 starting 没写进去，别人接手了
    machine.mark_starting(executor="thread")
    assert not write.sync(machine)
    before = store.get("t")
    machine.mark_running()
    assert write.sync(machine), "被隔离：不再追写"
    assert write.is_fenced("t")
    assert store.get("t") == before, "存储里别人的结论原样保留"
    (fenced,) = [f for f in write.snapshot_failures() if f.operation == "fenced"]
    assert who in fenced.error, fenced.error


def test_forget_drops_the_claimed_version_and_a_reclaim_starts_from_the_new_one(store: _Faulty) -> None:
    """同一个 id 被本节点再次认领（在别处 retry 之后）：起点换成新的认领版本，不沿用上一轮的。"""
    assert isinstance(store, TaskStore)
    machine = claimed(store)
    write = write_through(store)
    write.track(machine)
    machine.mark_starting(executor="thread")
    machine.mark_running()
    machine.mark_stopping(actor="ops")
    machine.mark_stopped(actor="ops")
    assert write.sync(machine)
    write.forget("t")
    stored = store.get("t")
    assert stored is not None
    again = StateMachine(stored, (), clock=CLOCK)
    again.retry(actor="ops")
    store.save(
        again.snapshot.evolve(owner="w"), expect_version=stored.status_version, transitions=again.transitions
    )
    machine2 = StateMachine(store.get("t"), (), clock=CLOCK)  # type: ignore[arg-type]
    write.track(machine2)
    store.target, store.commit = S.STARTING, True
    machine2.mark_starting(executor="thread")
    write.sync(machine2)
    machine2.mark_running()
    assert write.sync(machine2)
    assert not write.is_fenced("t")
    stored = store.get("t")
    assert stored is not None and stored.status_version == machine2.snapshot.status_version
    assert store.history("t")[-2:] == list(machine2.transitions)
