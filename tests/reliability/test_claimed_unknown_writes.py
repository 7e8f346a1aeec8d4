"""认领来的持久任务上"结果未知"的写（docs/distributed.md §7.2、§7.3）：经公开 API（``Controller.enqueue`` +
worker 的 ``Controller.serve``），在内存、SQLite 与 PostgreSQL 上各跑一遍。

worker 认领的任务，本进程的状态机只凭存储里版本 V 的快照重建（V 及以前的记录是提交者写的）。修复之前，写穿层在
一次结果未知的写之后读回对照时把整段历史与本进程的历史逐条比，提交者的那条 pending → queued 永远
"对不上"——于是本进程自己写成的前缀也被判成别人的改写：任务被记为 fenced、不再写，存储停在 starting / running，
直到租约过期被 reconcile 判 lost。

故障是确定的：存储替身在指定的那一次写（带着走到 ``target`` 的迁移记录的那次 save）上，先照常提交
（"回执丢了"）或什么也不写（"没写进去"），然后抛"连接中途断了"；``meanwhile`` 在抛出之前替别的写者写存储
（另一个 worker 接手、reconcile 判 lost、运维 reset、交还后被别人认领），模拟故障窗口里发生的事。

* 只是自己的写结果未知：存储最终与本进程的真相一致（快照、整段历史），没有 fenced，任务体只跑一次；
* 故障窗口里别人改写了它：仍然隔离——不覆盖存储，记一条 fenced 说明是谁。
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from reliability_support import check_history, wait_until
from unknown_writes import Fault, faulty_saves

from chongming_task import Controller, TaskStatus
from chongming_task.clock import SYSTEM_CLOCK
from chongming_task.core.state_machine import StateMachine
from chongming_task.core.storage.claiming import ClaimStart, QueuedClaim
from chongming_task.models import TaskSnapshot
from chongming_task.runtime.taskrun import TaskRun, mark_lease_expired
from chongming_task.storage import TaskStore
from chongming_task.stores.memory import InMemoryTaskStore
from chongming_task.stores.sqlite import SqliteTaskStore

S = TaskStatus
WORKER = "w"
TASK = "t"
SETTLE = 15.0


def faulty_chain(base: type[Any]) -> type[Any]:
    """只覆盖合并的那一环（``_claim_and_start``）：``starts_on_claim`` / ``saves_on_claim`` 仍然成立，认领与
    starting 一次提交，任务落终态时终态与下一次认领一次提交（``ClaimStart.save``）——故障打在这次合并的
    提交上。"""

    class FaultyChain(base):  # type: ignore[misc, valid-type]
        claim_start_saves = True  # 调用 super()：认得 start.save
        fault: Fault | None = None

        def _claim_and_start(self, request: QueuedClaim, start: ClaimStart) -> list[TaskSnapshot]:
            fault = self.fault
            if start.save is not None and fault is not None and fault.take([start.save]):
                return fault.fire(self, lambda: super(FaultyChain, self)._claim_and_start(request, start))  # type: ignore[no-any-return]
            return super()._claim_and_start(request, start)  # type: ignore[no-any-return]

    return FaultyChain


Opener = Callable[[Callable[[type[Any]], type[Any]]], Any]


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def open_faulty(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """``open_faulty(faulty_saves)``：这个后端上套了故障替身的存储。"""
    opened: list[Any] = []
    kind = request.param

    def open_with(wrap: Callable[[type[Any]], type[Any]]) -> Any:
        if kind == "memory":
            store = wrap(InMemoryTaskStore)()
        elif kind == "sqlite":
            store = wrap(SqliteTaskStore)(str(tmp_path / "claimed.db"))
        else:
            from chongming_task.stores.postgres import PostgresTaskStore

            store = wrap(PostgresTaskStore).from_url(request.getfixturevalue("pg_url"))
        opened.append(store)
        return store

    yield open_with
    for store in opened:
        store.close()


class Body:
    """任务体：记下跑了几次。"""

    def __init__(self) -> None:
        self.runs = 0
        self.lock = threading.Lock()

    def __call__(self, ctx: Any, i: int) -> int:
        with self.lock:
            self.runs += 1
        return i


def enqueue(store: TaskStore) -> None:
    submitter = Controller(store=store, owner="submitter")
    submitter.register("body", lambda ctx, i: i, durable=True)
    try:
        submitter.enqueue("body", 7, task_id=TASK)
    finally:
        submitter.close()


def serve(store: TaskStore, body: Body, *, until: Callable[[Controller], bool]) -> Controller:
    """一个 worker serve 到 ``until`` 成立（最多 SETTLE 秒），然后停下、关掉（关闭时最后追平一次）。"""
    worker = Controller(1, store=store, owner=WORKER, side_channel_interval=0.02)
    worker.register("body", body)
    stop = threading.Event()
    serving = threading.Thread(target=worker.serve, args=(stop,), kwargs={"poll_interval": 0.02}, daemon=True)
    serving.start()
    try:
        settled = wait_until(lambda: until(worker), SETTLE)
    finally:
        stop.set()
        serving.join(30)
        worker.close()
    assert not serving.is_alive()
    assert settled, (
        f"{SETTLE} 秒内没有收敛：存储 {store.get(TASK)}，persist_failures {worker.persist_failures}"
    )
    return worker


def local_run(worker: Controller) -> TaskRun | None:
    return next((r for r in worker.runs() if r.task_id == TASK), None)


def in_sync(store: TaskStore) -> Callable[[Controller], bool]:
    """本进程的任务落了终态，存储的快照（状态、版本）与历史里本进程写的那一段都与它一致。"""

    def check(worker: Controller) -> bool:
        run = local_run(worker)
        if run is None or not run.snapshot.is_terminal:
            return False
        stored = store.get(TASK)
        mine = list(run.transitions)
        return (
            stored is not None
            and (stored.status, stored.status_version) == (run.status, run.snapshot.status_version)
            and bool(mine)
            and store.history(TASK)[-len(mine) :] == mine
        )

    return check


def fenced(worker: Controller) -> bool:
    return any(f.operation == "fenced" for f in worker.persist_failures)


def assert_converged(store: TaskStore, worker: Controller, body: Body) -> None:
    run = local_run(worker)
    assert run is not None and run.status is S.SUCCEEDED
    stored, history = check_history(store, TASK)
    assert (stored.status, stored.status_version) == (S.SUCCEEDED, 4)
    assert stored.owner == WORKER and stored.outcome == 7
    mine = list(run.transitions)  # 认领与 starting 一次提交时，starting 是存储写的，本进程的从 running 起
    assert len(history) == 4 and history[0].actor == "submitter"
    assert history[-len(mine) :] == mine and len(mine) >= 2, "本进程写的一段逐条相等"
    failures = [(f.operation, f.task_id) for f in worker.persist_failures]
    assert failures == [("save", TASK)], worker.persist_failures  # 只有那一次结果未知的写，没有 fenced
    assert body.runs == 1


# -- 只是自己的写结果未知：从存储的版本接着写 -------------------------------------------------------


@pytest.mark.parametrize("commit", [True, False], ids=["committed", "not-committed"])
@pytest.mark.parametrize("target", [S.STARTING, S.RUNNING, S.SUCCEEDED], ids=lambda s: s.value)
def test_a_claimed_task_whose_save_had_an_unknown_outcome_converges(
    open_faulty: Opener, target: TaskStatus, commit: bool
) -> None:
    """认领与 starting 分开写（claim_queued，再由写穿写 starting / running / 终态）。"""
    store = open_faulty(faulty_saves)
    enqueue(store)
    store.fault = Fault(target, commit=commit, owner=WORKER)
    body = Body()
    worker = serve(store, body, until=in_sync(store))
    assert store.fault.fired == 1
    assert_converged(store, worker, body)


@pytest.mark.parametrize("commit", [True, False], ids=["committed", "not-committed"])
def test_a_terminal_save_chained_with_the_next_claim_with_an_unknown_outcome_converges(
    open_faulty: Opener, commit: bool
) -> None:
    """认领与 starting 一次提交；落终态时终态与下一次认领一次提交（``ClaimStart.save``），这次合并的提交
    结果未知。"""
    store = open_faulty(faulty_chain)
    enqueue(store)
    store.fault = Fault(S.SUCCEEDED, commit=commit, owner=WORKER)
    body = Body()
    worker = serve(store, body, until=in_sync(store))
    assert worker.starts_on_claim and store.saves_on_claim, "前提：走的是合并的认领路径"
    assert store.fault.fired == 1
    assert_converged(store, worker, body)


# -- 故障窗口里别人改写了它：仍然隔离 -----------------------------------------------------------------


def adopted_by_b(store: TaskStore) -> None:
    """w 的租约过期之后，另一个 worker b 接手（``cluster:adopted``，版本 +1，持有者换成 b）。"""
    stored = store.get(TASK)
    assert stored is not None and stored.status is S.QUEUED
    machine = StateMachine(stored, ())
    machine.adopt("b", actor="b", reason="原持有者 w 的租约已过期：由 b 接手")
    store.save(machine.snapshot, expect_version=stored.status_version, transitions=machine.transitions)


def released_and_claimed_by_b(store: TaskStore) -> None:
    """持有者被清空（交还，版本不变），另一个 worker b 随即认领（也不改版本）。"""
    stored = store.get(TASK)
    assert stored is not None and stored.status is S.QUEUED
    store.save(stored.evolve(owner=None), expect_version=stored.status_version)
    until = datetime.now(UTC) + timedelta(seconds=30)
    assert [s.task_id for s in store.claim_queued("b", names=["body"], limit=1, lease_until=until)] == [TASK]


def judged_lost_by_peer(store: TaskStore) -> None:
    """本进程的 starting 已写进去之后，别的节点的 reconcile 判 lost（就像 w 被隔离期间那样）。"""
    stored = store.get(TASK)
    assert stored is not None and stored.status is S.STARTING
    lost = mark_lease_expired(stored, clock=SYSTEM_CLOCK, actor="peer-b")
    store.save(lost.snapshot, expect_version=stored.status_version, transitions=lost.transitions)


def reset_by_operator(store: TaskStore) -> None:
    """本进程的终态已写进去之后，运维把它 reset（回到 pending）。"""
    stored = store.get(TASK)
    assert stored is not None and stored.status is S.SUCCEEDED
    machine = StateMachine(stored, store.history(TASK))
    machine.reset(confirm=True, actor="ops", reason="从头再来")
    store.save(machine.snapshot, expect_version=stored.status_version, transitions=machine.transitions[-1:])


@pytest.mark.parametrize(
    ("target", "commit", "meanwhile", "final", "who"),
    [
        (S.STARTING, False, adopted_by_b, (S.QUEUED, 2), "b（v2，cluster:adopted）"),
        (S.STARTING, False, released_and_claimed_by_b, (S.QUEUED, 1), "另一个持有者 b"),
        (S.STARTING, True, judged_lost_by_peer, (S.LOST, 3), "peer-b（v3，reconcile:lease_expired）"),
        (S.SUCCEEDED, True, reset_by_operator, (S.PENDING, 5), "ops（v5，control:reset）"),
    ],
    ids=["adopted", "released-and-reclaimed", "judged-lost", "reset-after-terminal"],
)
def test_a_claimed_task_rewritten_by_someone_else_during_the_outage_is_still_fenced(
    open_faulty: Opener,
    target: TaskStatus,
    commit: bool,
    meanwhile: Callable[[TaskStore], None],
    final: tuple[TaskStatus, int],
    who: str,
) -> None:
    store = open_faulty(faulty_saves)
    enqueue(store)
    store.fault = Fault(target, commit=commit, meanwhile=meanwhile, owner=WORKER)
    body = Body()
    worker = serve(
        store, body, until=lambda w: fenced(w) and (r := local_run(w)) is not None and r.snapshot.is_terminal
    )
    assert store.fault.fired == 1
    stored = store.get(TASK)
    assert stored is not None
    StateMachine.from_snapshot(stored, store.history(TASK))  # 快照与历史自洽（接手那条是表外的同状态记录）
    assert (stored.status, stored.status_version) == final, "存储里别人写的结论原样保留，没被覆盖"
    (note,) = [f for f in worker.persist_failures if f.operation == "fenced"]
    assert who in note.error, note.error
    run = local_run(worker)
    assert run is not None and run.status is S.SUCCEEDED, "本地句柄记着本进程的真实结果"
    assert body.runs == 1
