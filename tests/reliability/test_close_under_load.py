"""close() / stop_all() 在积压几千个排队任务时（issue 22 第 6 项）。

用户指南 §8.3：close() 时"排队中的任务**直接**落 stopped，任务体一行都不执行"；stop_all() 返回本轮发出的
请求数。修之前，8 个在跑 + 3,008 个排队时 close() 之后仍有 2,974 个排队任务的任务体被执行——每停掉一个在跑的
任务，让出的槽立刻交给下一个排队任务；stop_all() 也因此只数到 74 个请求（其余的在轮到它之前已经跑完）。
现在 close() / stop_all() 先冻结派发再停。

每个场景：8 个占满执行槽的任务（协作地在 checkpoint 上转圈），再加 3,000 个排队任务，任务体执行一次就在计数器
上记一笔。有存储（SQLite）与无存储各跑一遍：存储里的每个任务也必须落 stopped。
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from chongming_task import Controller, SqliteTaskStore, TaskContext, TaskStatus
from chongming_task.storage import TaskQuery, TaskStore

BUSY = 8
QUEUED = 3000


class Recorder:
    """排队任务的任务体每执行一次记一笔（线程安全）。"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.executed: list[str] = []
        self.busy_started = threading.Semaphore(0)

    def body(self, ctx: TaskContext) -> None:
        with self._lock:
            self.executed.append(ctx.task_id)

    def busy(self, ctx: TaskContext) -> None:
        self.busy_started.release()
        while True:  # 占着槽，直到被停止（checkpoint 里抛 TaskCancelled）
            ctx.checkpoint()
            time.sleep(0.005)


def _loaded_controller(store: TaskStore | None, recorder: Recorder) -> Controller:
    controller = Controller(max_parallel=BUSY, store=store, graceful_stop=5.0)
    controller.register("busy", recorder.busy)
    controller.register("body", recorder.body)
    for _ in range(BUSY):
        controller.submit("busy")
    for _ in range(BUSY):
        assert recorder.busy_started.acquire(timeout=30), "占槽任务没有全部开始执行"
    for _ in range(QUEUED):
        controller.submit("body")
    assert controller.active_count == BUSY
    assert controller.queued_count == QUEUED
    assert recorder.executed == []  # 槽全被占着：还没有任何排队任务开始
    return controller


def _store(kind: str, tmp_path: Path) -> TaskStore | None:
    return None if kind == "none" else SqliteTaskStore(tmp_path / "tasks.db")


def _assert_all_stopped(controller: Controller, store: TaskStore | None) -> None:
    runs = controller.runs()
    assert len(runs) == BUSY + QUEUED
    statuses = {run.task_id: run.status for run in runs}
    assert set(statuses.values()) == {TaskStatus.STOPPED}
    if store is not None:
        stored = store.query(TaskQuery())
        assert len(stored) == BUSY + QUEUED
        assert {snapshot.status for snapshot in stored} == {TaskStatus.STOPPED}


@pytest.mark.slow
@pytest.mark.parametrize("store_kind", ["none", "sqlite"])
def test_close_with_thousands_queued_runs_no_queued_body(store_kind: str, tmp_path: Path) -> None:
    recorder = Recorder()
    store = _store(store_kind, tmp_path)
    controller = _loaded_controller(store, recorder)
    started = time.monotonic()
    controller.close(timeout=20)
    elapsed = time.monotonic() - started
    assert recorder.executed == [], f"close() 之后有 {len(recorder.executed)} 个排队任务的任务体被执行了"
    _assert_all_stopped(controller, store)
    # 排队的从没启动过：停止直接落 stopped，不经过 stopping
    for run in controller.runs():
        if run.name == "body":
            assert [t.to_status.value for t in run.transitions][-2:] == ["queued", "stopped"]
    assert controller.active_count == 0 and controller.queued_count == 0
    print(f"close() with {QUEUED} queued ({store_kind}): {elapsed:.2f}s, queued bodies executed: 0")
    if store is not None:
        store.close()


@pytest.mark.slow
@pytest.mark.parametrize("store_kind", ["none", "sqlite"])
def test_stop_all_with_thousands_queued_issues_one_request_per_task(store_kind: str, tmp_path: Path) -> None:
    recorder = Recorder()
    store = _store(store_kind, tmp_path)
    controller = _loaded_controller(store, recorder)
    requests: list[str] = []
    for run in controller.runs():  # 数出真正发出的停止请求（每个任务的 stop() 被调用几次）

        def counting_stop(*args: Any, _orig: Any = run.stop, _id: str = run.task_id, **kwargs: Any) -> bool:
            requests.append(_id)
            result: bool = _orig(*args, **kwargs)
            return result

        run.stop = counting_stop  # type: ignore[method-assign]
    try:
        issued = controller.stop_all(reason="收工")
        assert issued == BUSY + QUEUED, f"stop_all() 只发出 {issued} 个请求（应为 {BUSY + QUEUED}）"
        assert len(requests) == BUSY + QUEUED and len(set(requests)) == BUSY + QUEUED
        controller.wait_all(timeout=20)
        assert recorder.executed == [], (
            f"stop_all() 之后有 {len(recorder.executed)} 个排队任务的任务体被执行了"
        )
        _assert_all_stopped(controller, store)
        # 扫荡完派发已解冻：控制器照常可用，新提交的任务会被执行
        controller.submit("body", task_id="after-stop-all").wait(timeout=10)
        assert recorder.executed == ["after-stop-all"]
        assert controller.stop_all() == 0
    finally:
        controller.close(timeout=10)
        if store is not None:
            store.close()
