"""worker 的执行槽接着认领（issue 19）：任务落终态、空出的槽上 worker 还要认领时，终态与下一个任务的认领 +
starting 一次提交（``ClaimStart.save``），认领到的在同一条线程上接着开始；合并的提交失败时终态按一次失败的
save 追平、认领按一次失败的认领处理，任务照样每个只跑一次。"""

from __future__ import annotations

import threading
from typing import Any

from chongming_runtime_test_support import wait_until

from chongming_task import Controller
from chongming_task.core.storage.claiming import ClaimStart, QueuedClaim
from chongming_task.errors import StoreError
from chongming_task.models import TaskSnapshot
from chongming_task.states import TaskStatus
from chongming_task.stores.memory import InMemoryTaskStore

S = TaskStatus


class RecordsChains(InMemoryTaskStore):
    """记下每次带 ``start.save`` 的认领：写了哪个任务的哪一版、认领到了谁（覆盖的是合并那一环本身，
    ``starts_on_claim`` 仍然成立）。``fail_first``：第一次带 save 的调用整个失败（什么也没写）。"""

    claim_start_saves = True  # 调用 super()：认得 start.save

    def __init__(self, *, fail_first: bool = False) -> None:
        super().__init__()
        self.chains: list[tuple[str, TaskStatus, list[str]]] = []
        self._fail = fail_first
        self.failed: list[str] = []

    def _claim_and_start(self, request: QueuedClaim, start: ClaimStart) -> list[TaskSnapshot]:
        save = start.save
        if save is not None and self._fail:
            self._fail = False
            self.failed.append(save.snapshot.task_id)
            raise StoreError("注入的故障：合并的提交整个失败（什么也没写）")
        got = super()._claim_and_start(request, start)
        if save is not None:
            self.chains.append((save.snapshot.task_id, save.snapshot.status, [s.task_id for s in got]))
        return got


def serve_all(store: InMemoryTaskStore, controller: Controller, ids: list[str]) -> None:
    stop = threading.Event()
    serving = threading.Thread(target=controller.serve, args=(stop,), kwargs={"poll_interval": 0.02})
    serving.start()
    try:
        wait_until(lambda: all((s := store.get(i)) is not None and s.status is S.SUCCEEDED for i in ids))
    finally:
        stop.set()
        serving.join(30)
        controller.close()
    assert not serving.is_alive()


def enqueue(store: InMemoryTaskStore, body: Any, count: int) -> list[str]:
    submitter = Controller(store=store, owner="submitter")
    submitter.register("body", body, durable=True)
    try:
        return [submitter.enqueue("body", i, task_id=f"t{i}") for i in range(count)]
    finally:
        submitter.close()


def test_a_finished_task_and_the_next_claim_on_its_slot_are_one_store_call() -> None:
    store = RecordsChains()
    # 任务体开始时，认领它的那次调用里写下终态的任务在存储里是什么状态
    before: dict[str, TaskStatus | None] = {}

    def body(ctx: Any, i: int) -> int:
        for saved, _, claimed in list(store.chains):
            if ctx.task_id in claimed:
                stored = store.get(saved)
                before[ctx.task_id] = None if stored is None else stored.status
        return i

    ids = enqueue(store, body, 6)
    worker = Controller(2, store=store, owner="w")
    worker.register("body", body)
    assert worker.starts_on_claim
    serve_all(store, worker, ids)
    started = [claimed for _, _, got in store.chains for claimed in got]
    # 6 个任务、2 个槽：头两个由认领线程认领，之后每个都由前一个任务空出的槽接着认领
    assert len(started) == 4, store.chains
    assert all(status is S.SUCCEEDED for _, status, _ in store.chains), "一起提交的是终态"
    assert before == dict.fromkeys(started, S.SUCCEEDED), (
        "同一个槽上下一个任务的任务体开始时，上一个任务的终态已经落库（与它的 starting 同一次提交）"
    )
    for task_id in ids:
        assert [(t.from_status, t.to_status) for t in store.history(task_id)] == [
            (S.PENDING, S.QUEUED),
            (S.QUEUED, S.STARTING),
            (S.STARTING, S.RUNNING),
            (S.RUNNING, S.SUCCEEDED),
        ], "历史没有空洞：推迟写的 running 随终态一起写下"


def test_a_failed_combined_commit_is_a_failed_save_and_a_failed_claim() -> None:
    """合并的提交整个失败：终态那一半与今天一次失败的 save 一样交给写穿层（记下失败、结果未知、下次先读回
    对照）；认领那一半什么也没认领，空出的槽照常交给认领线程——其余任务每个只开始一次、全部成功。"""
    store = RecordsChains(fail_first=True)
    ran: dict[str, int] = {}
    lock = threading.Lock()

    def body(ctx: Any, i: int) -> int:
        with lock:
            ran[ctx.task_id] = ran.get(ctx.task_id, 0) + 1
        return i

    ids = enqueue(store, body, 5)
    worker = Controller(2, store=store, owner="w")
    worker.register("body", body)
    stop = threading.Event()
    serving = threading.Thread(target=worker.serve, args=(stop,), kwargs={"poll_interval": 0.02})
    serving.start()
    try:
        wait_until(lambda: store.failed)
        (failed,) = store.failed
        rest = [task_id for task_id in ids if task_id != failed]
        wait_until(lambda: all((s := store.get(i)) is not None and s.status is S.SUCCEEDED for i in rest))
        failures = [(f.task_id, f.operation) for f in worker.persist_failures]
        assert (failed, "save") in failures, "终态那一半按一次失败的 save 记下"
        local = worker.get(failed)
        assert local is not None and local.status is S.SUCCEEDED, "存储写失败绝不让任务失败"
        # 终态那一半下次先读回：存储停在认领时写下的 starting（本进程接手的版本），之后一条也没写进去——
        # 从那里接着写，而不是把认领来的任务判成被别人改写（隔离）、让它一直停在 starting
        wait_until(lambda: (s := store.get(failed)) is not None and s.status is S.SUCCEEDED)
        assert not [f for f in worker.persist_failures if f.operation == "fenced"], worker.persist_failures
    finally:
        stop.set()
        serving.join(30)
        worker.close()
    assert not serving.is_alive()
    assert ran == dict.fromkeys(ids, 1), "每个任务只跑一次：失败的那次认领什么也没开始"


def test_a_local_controller_never_chains_a_claim() -> None:
    """不 serve 的控制器（普通任务、持久任务的提交者）终态照旧只写终态，不去认领。"""
    store = RecordsChains()
    controller = Controller(2, store=store, owner="local")
    controller.register("body", lambda ctx, i: i)
    try:
        runs = [controller.submit("body", i) for i in range(4)]
        assert all(run.wait(10).ok for run in runs)
    finally:
        controller.close()
    assert store.chains == []


def test_a_name_registered_while_serving_is_claimed() -> None:
    """worker 认领时按的名字集合是登记时换上的那一个（不再每次认领拿控制器锁重建）：serve 途中新登记的
    名字，它的持久任务照样被认领、跑完；登记之前入队的也是。"""
    store = InMemoryTaskStore()
    ids = enqueue(store, lambda ctx, i: i, 2)
    worker = Controller(2, store=store, owner="w")
    worker.register("body", lambda ctx, i: i)
    assert worker.registered_names == frozenset({"body"})
    late_submitter = Controller(store=store, owner="late-submitter")
    late_submitter.register("late", lambda ctx, i: i, durable=True)
    late = late_submitter.enqueue("late", 7, task_id="late-0")
    late_submitter.close()
    stop = threading.Event()
    serving = threading.Thread(target=worker.serve, args=(stop,), kwargs={"poll_interval": 0.02})
    serving.start()
    try:
        wait_until(lambda: all((s := store.get(i)) is not None and s.status is S.SUCCEEDED for i in ids))
        stored = store.get(late)
        assert stored is not None and stored.status is S.QUEUED, "还没登记 late：不认领它"
        worker.register("late", lambda ctx, i: i * 2)
        assert worker.registered_names == frozenset({"body", "late"})
        wait_until(lambda: (s := store.get(late)) is not None and s.status is S.SUCCEEDED)
    finally:
        stop.set()
        serving.join(30)
        worker.close()
    assert not serving.is_alive()
