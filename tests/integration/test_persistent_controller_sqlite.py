"""Controller(store=SqliteTaskStore)：写穿、跨进程查询与控制、租约、崩溃后的 reconcile。

跨进程的用例用真实 OS 进程（node_worker.py），不是线程假装。
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prefork import python_run

from chongming_task import (
    Controller,
    FailureKind,
    InMemoryTaskStore,
    SqliteTaskStore,
    StoreError,
    TaskStatus,
)
from chongming_task.testing import FakeClock

S = TaskStatus


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "tasks.db")


def _held_until(gate: threading.Event) -> Callable[[Any], None]:
    """一个一直在跑、能被停下的任务体：到 ``gate`` 置位为止，每 2 ms 过一次检查点。"""

    def hold(ctx: Any) -> None:
        while not gate.wait(0.002):
            ctx.checkpoint()

    return hold


def test_write_through_keeps_store_identical_to_memory(db: str) -> None:
    store = SqliteTaskStore(db)
    c = Controller(store=store, max_parallel=2, owner="node-a")

    def work(ctx: Any, n: int) -> int:
        ctx.progress(n, total=10, unit="行")
        return n * 2

    c.register("work", work)
    runs = [c.submit("work", i, task_id=f"w{i}") for i in range(4)]
    c.wait_all(timeout=10)
    for run in runs:
        stored = store.get(run.task_id)
        assert stored is not None
        assert stored.status is S.SUCCEEDED and stored.outcome == run.snapshot.outcome
        assert stored.status_version == run.snapshot.status_version
        assert store.history(run.task_id) == list(run.transitions)
        assert stored.progress == run.snapshot.progress  # 终态时旁路字段也追平
        assert stored.lease_owner == "node-a"
    other = Controller(store=SqliteTaskStore(db), owner="console")
    assert [s.task_id for s in other.list_tasks()] == ["w0", "w1", "w2", "w3"]
    assert other.stats()[S.SUCCEEDED] == 4
    other.close(close_store=True)
    c.close(close_store=True)


class FlakyStore(InMemoryTaskStore):
    """故障注入：开关打开时 save / touch 一律失败。"""

    def __init__(self) -> None:
        super().__init__()
        self.broken = threading.Event()

    def save(self, snapshot: Any, *, expect_version: int, transitions: Any = ()) -> None:
        if self.broken.is_set():
            raise StoreError("注入的故障：磁盘不可写")
        super().save(snapshot, expect_version=expect_version, transitions=transitions)

    def touch_many(self, updates: Any) -> None:
        if self.broken.is_set():
            raise StoreError("注入的故障：磁盘不可写")
        super().touch_many(updates)


def test_store_failures_never_fail_a_task_and_store_converges(wait_until: Any) -> None:
    store = FlakyStore()
    c = Controller(store=store, side_channel_interval=0.05)
    gate = threading.Event()

    def work(ctx: Any) -> str:
        while not gate.wait(0.002):
            ctx.checkpoint()
        return "done"

    c.register("work", work)
    run = c.submit("work", task_id="job")
    wait_until(lambda: run.status is S.RUNNING)
    store.broken.set()
    gate.set()
    outcome = run.wait(timeout=5)
    assert outcome.ok and outcome.value == "done"  # 存储坏了，任务照样成功
    failures = c.persist_failures
    assert failures and failures[-1].task_id == "job" and "磁盘不可写" in failures[-1].error
    assert store.get("job").status is not S.SUCCEEDED  # type: ignore[union-attr]
    store.broken.clear()
    wait_until(lambda: store.get("job").status is S.SUCCEEDED)  # type: ignore[union-attr]
    assert store.history("job") == list(run.transitions)  # 一次 save 带上缺的全部迁移记录
    c.close()


def test_persist_failures_keep_at_most_twenty_newest() -> None:
    store = FlakyStore()
    c = Controller(store=store, side_channel_interval=10)
    c.register("quick", lambda ctx: 1)
    store.broken.set()
    for i in range(15):
        # 一个跑完再提交下一个：不限并行时几个任务同时在跑，谁最后失败本来就没有定数，"最新的是 q14" 才确定。
        c.submit("quick", task_id=f"q{i}").wait(timeout=10)
    c.wait_all(timeout=10)
    failures = c.persist_failures
    assert len(failures) == 20
    assert failures[-1].task_id == "q14"
    store.broken.clear()
    c.close()


def test_cross_process_list_pause_resume_stop(db: str, spawn_worker: Any, wait_until: Any) -> None:
    worker = spawn_worker(f"sqlite:///{db}", "worker-1", "orders-worker", "resident")
    console = Controller(store=SqliteTaskStore(db), owner="ops-console")
    snapshot = wait_until(lambda: console.get("orders-worker"))
    assert snapshot.owner == "worker-1"
    wait_until(lambda: console.get("orders-worker").status is S.RUNNING)
    assert [s.task_id for s in console.list_tasks(status=S.RUNNING)] == ["orders-worker"]
    assert console.pause("orders-worker", timeout=2) is False  # 跨进程：未确认
    wait_until(lambda: console.get("orders-worker").status is S.PAUSED)
    paused_progress = console.get("orders-worker").progress
    assert console.resume("orders-worker") is True  # 请求已受理
    wait_until(lambda: console.get("orders-worker").status is S.RUNNING)
    wait_until(lambda: console.get("orders-worker").progress != paused_progress)  # 进度经 touch 回写
    assert console.stop("orders-worker", reason="发布窗口") is True
    status, value = worker.final()
    assert status == "succeeded" and isinstance(value, int) and value > 0  # 优雅收尾，返回值保留
    final = console.wait("orders-worker", timeout=10)
    assert final.status is S.SUCCEEDED
    history = console.store.history("orders-worker")  # type: ignore[union-attr]
    stop_record = next(t for t in history if t.trigger == "control:stop")
    assert stop_record.actor == "ops-console" and stop_record.reason == "发布窗口"  # 谁按的停止，事后可追溯
    pause_record = next(t for t in history if t.to_status is S.PAUSING)
    assert pause_record.actor == "ops-console"
    # 三条指令都已由 worker 执行完毕（没有残留可认领的）；控制台这个纯查询客户端从不认领。
    assert console.store.claim_commands("probe", lease=1.0) == []  # type: ignore[union-attr]
    console.close(close_store=True)


def test_cross_process_stop_of_queued_task_reaches_partitioned_node(db: str, wait_until: Any) -> None:
    """声明了 owned_buckets 的节点从构造起就轮询：停止一个还在排队的任务无需等它再提交。"""
    clock_free = Controller(
        store=SqliteTaskStore(db),
        owner="node-a",
        owned_buckets=range(64),
        max_parallel=1,
        command_poll_interval=0.05,
    )
    gate = threading.Event()
    hold = _held_until(gate)
    clock_free.register("hold", hold)
    clock_free.submit("hold", task_id="busy", bucket_key="k1")
    queued = clock_free.submit("hold", task_id="waiting", bucket_key="k2")
    console = Controller(store=SqliteTaskStore(db), owner="console")
    assert console.stop("waiting", reason="不等了") is True
    wait_until(lambda: queued.status is S.STOPPED)
    wait_until(lambda: console.get("waiting").status is S.STOPPED)
    gate.set()
    console.close(close_store=True)
    clock_free.close(close_store=True)


def test_kill_nine_then_reconcile_marks_lost_only_after_lease_expiry(
    db: str, spawn_worker: Any, wait_until: Any
) -> None:
    worker = spawn_worker(f"sqlite:///{db}", "worker-dead", "doomed", "stubborn", "--lease-ttl", "1.5")
    survivor_store = SqliteTaskStore(db)
    survivor = Controller(
        store=survivor_store, owner="worker-alive", lease_ttl=1.5, side_channel_interval=0.1
    )
    gate = threading.Event()

    def alive(ctx: Any) -> None:
        while not gate.wait(0.005):
            ctx.checkpoint()

    survivor.register("alive", alive)
    survivor.submit("alive", task_id="healthy")
    wait_until(lambda: survivor_store.get("doomed") and survivor_store.get("doomed").status is S.RUNNING)
    worker.kill()
    killed_at = time.monotonic()

    fresh = Controller(store=SqliteTaskStore(db), owner="worker-2")
    early = fresh.reconcile()
    if time.monotonic() - killed_at < 1.0:
        assert early.lost == []  # 租约未过期：有人在管（或者说我们还不知道它死了），一动不动
    time.sleep(1.7)
    preview = fresh.reconcile(dry_run=True)
    assert [s.task_id for s in preview.lost] == ["doomed"]
    assert fresh.get("doomed").status is S.RUNNING  # dry_run 不写任何状态
    report = fresh.reconcile()
    assert [s.task_id for s in report.lost] == ["doomed"]
    lost = fresh.get("doomed")
    assert lost.status is S.LOST
    assert lost.failure.kind is FailureKind.LOST and "worker-dead" in lost.failure.message
    history = fresh.store.history("doomed")  # type: ignore[union-attr]
    assert [t.version for t in history] == list(range(1, len(history) + 1))
    assert history[-1].to_status is S.LOST and history[-1].actor == "worker-2"
    # 活着的监督者在续租：它的任务从不被碰。
    assert fresh.get("healthy").status is S.RUNNING
    assert all(s.task_id != "healthy" for s in report.lost + report.adoptable)
    gate.set()
    survivor.wait("healthy", timeout=5)
    fresh.close(close_store=True)
    survivor.close(close_store=True)


def test_reconcile_reports_adoptable_and_skips_conflicts(tmp_path: Path) -> None:
    clock = FakeClock()
    store = SqliteTaskStore(str(tmp_path / "r.db"), clock=clock)
    from chongming_task import StateMachine

    def put(task_id: str, *actions: str) -> None:
        machine = StateMachine.create(
            task_id, "job", clock=clock, lease_owner="dead", lease_until=clock.now()
        )
        for action in actions:
            getattr(machine, action)()
        store.create(machine.snapshot, machine.transitions)

    put("queued-one", "mark_queued")
    put("running-one", "mark_queued", "mark_starting", "mark_running")
    clock.advance(60)
    c = Controller(store=store, clock=clock, owner="recover")
    report = c.reconcile()
    assert [s.task_id for s in report.adoptable] == ["queued-one"]
    assert [s.task_id for s in report.lost] == ["running-one"]
    assert store.get("queued-one").status is S.QUEUED  # type: ignore[union-attr]
    c.close(close_store=True)


def test_reconcile_only_touches_own_buckets(tmp_path: Path) -> None:
    from chongming_task import BucketPolicy, StateMachine

    clock = FakeClock()
    store = SqliteTaskStore(str(tmp_path / "b.db"), clock=clock)
    policy = BucketPolicy(8)
    mine = next(k for k in (f"k{i}" for i in range(100)) if policy.bucket_for(k) < 4)
    theirs = next(k for k in (f"k{i}" for i in range(100)) if policy.bucket_for(k) >= 4)
    for task_id, key in (("mine", mine), ("theirs", theirs)):
        machine = StateMachine.create(
            task_id, "job", clock=clock, bucket=policy.bucket_for(key), bucket_key=key
        )
        machine.mark_queued()
        machine.mark_starting()
        machine.mark_running()
        store.create(machine.snapshot, machine.transitions)
    clock.advance(100)
    node = Controller(store=store, clock=clock, owned_buckets=range(4), num_buckets=8)
    report = node.reconcile()
    assert [s.task_id for s in report.lost] == ["mine"]
    assert store.get("theirs").status is S.RUNNING  # type: ignore[union-attr]
    node.close(close_store=True)


def test_close_store_flag(db: str) -> None:
    store = SqliteTaskStore(db)
    c = Controller(store=store)
    c.close()
    assert store.get("x") is None  # 未要求时不关存储
    c.close(close_store=True)
    with pytest.raises(StoreError):
        store.get("x")


def test_command_claimed_by_a_non_holder_is_released_not_completed(db: str, wait_until: Any) -> None:
    """两个节点轮询同一组桶：取到不属于自己的指令的那个必须立刻交还，真正的持有者才能收到。"""
    from chongming_task import BucketPolicy

    policy = BucketPolicy(64)
    key = next(k for k in (f"t{i}" for i in range(200)) if policy.bucket_for(k) < 32)
    holder = Controller(
        store=SqliteTaskStore(db), owner="holder", owned_buckets=range(32), command_poll_interval=0.02
    )
    bystander = Controller(
        store=SqliteTaskStore(db), owner="bystander", owned_buckets=range(32), command_poll_interval=0.01
    )
    gate = threading.Event()
    hold = _held_until(gate)
    holder.register("hold", hold)
    runs = [holder.submit("hold", task_id=f"h{i}", bucket_key=key) for i in range(5)]
    wait_until(lambda: all(r.status is S.RUNNING for r in runs))
    console = Controller(store=SqliteTaskStore(db), owner="console")
    for run in runs:
        assert console.stop(run.task_id, reason="收工") is True
    for run in runs:
        wait_until(lambda r=run: r.status is S.STOPPED)
    gate.set()
    for c in (console, bystander, holder):
        c.close(close_store=True)


def test_remote_stop_of_a_finished_task_writes_no_command(db: str) -> None:
    worker = Controller(store=SqliteTaskStore(db), owner="w")
    worker.register("quick", lambda ctx: 1)
    worker.wait(worker.submit("quick", task_id="done").task_id, timeout=5)
    console = Controller(store=SqliteTaskStore(db), owner="console")
    assert console.stop("done") is True  # 找到了
    assert console.stop("missing") is False
    assert console.store.claim_commands("probe", lease=1.0) == []  # type: ignore[union-attr]
    console.close(close_store=True)
    worker.close(close_store=True)


def test_check_cluster_sees_published_nodes_duplicates_and_holes(db: str) -> None:
    a = Controller(store=SqliteTaskStore(db), owner="node-a", owned_buckets=range(40), num_buckets=64)
    b = Controller(store=SqliteTaskStore(db), owner="node-b", owned_buckets=range(32, 60), num_buckets=64)
    console = Controller(store=SqliteTaskStore(db), owner="console", num_buckets=64)
    report = console.check_cluster()
    assert set(report.alive_owners) == {"node-a", "node-b"}
    assert sorted(report.duplicates) == list(range(32, 40))
    assert report.holes == tuple(range(60, 64))
    assert not report.healthy and report.problems()
    b.close(close_store=True)  # 正常下线：登记立刻撤销
    after = console.check_cluster()
    assert set(after.alive_owners) == {"node-a"}
    assert after.duplicates == {} and after.holes == tuple(range(40, 64))
    # 纯查询的控制台从不登记自己。
    assert all(n.owner != "console" for n in console.store.list_nodes())  # type: ignore[union-attr]
    a.close(close_store=True)
    console.close(close_store=True)


def test_wait_returns_only_after_the_terminal_state_is_in_the_store(db: str) -> None:
    """wait() 叫醒调用方的那一刻，终态必须已经写穿：否则别的进程紧接着读到的还是旧状态。"""
    store = SqliteTaskStore(db)
    c = Controller(store=store, max_parallel=4)
    c.register("quick", lambda ctx, i: i)
    for i in range(100):
        run = c.submit("quick", i)
        assert run.wait(timeout=5).value == i
        stored = store.get(run.task_id)
        assert stored is not None and stored.status is S.SUCCEEDED and stored.outcome == i
    c.close(close_store=True)


def test_pipeline_nodes_are_visible_to_another_process(db: str) -> None:
    """管道节点是普通任务：写穿到 SQLite 后，另一个 OS 进程的 list_tasks 看得到它们。"""
    import json

    from chongming_task import Pipeline

    c = Controller(store=SqliteTaskStore(db), max_parallel=2, owner="etl-node")
    c.register("step", lambda ctx, n=0: n)
    p = Pipeline("nightly")
    first = p.node("step", 1, node_id="extract")
    p.node("step", 2, node_id="load", depends_on=[first])
    run = c.submit_pipeline(p)
    assert run.wait(timeout=10).ok
    script = (
        "import json, sys\n"
        "from chongming_task import Controller, SqliteTaskStore\n"
        "c = Controller(store=SqliteTaskStore(sys.argv[1]), owner='viewer')\n"
        "rows = c.list_tasks(pipeline_id=sys.argv[2])\n"
        "print(json.dumps([[s.node_id, s.status.value, s.pipeline_id] for s in rows]))\n"
        "c.close(close_store=True)\n"
    )
    # 经预导入的模板进程 fork（tests/support/prefork.py），省掉解释器启动与导入。
    result = python_run(
        ["-c", script, db, run.pipeline_id],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows = json.loads(result.stdout)
    assert sorted(rows) == [
        ["extract", "succeeded", run.pipeline_id],
        ["load", "succeeded", run.pipeline_id],
    ]
    c.close(close_store=True)


def test_a_restarted_namesake_neither_runs_nor_bounces_its_predecessors_commands(
    db: str, wait_until: Any
) -> None:
    """重启沿用同一个 owner：上一个进程留下的任务在存储里仍归这个名字，本进程却不持有它。它的指令既不执行、
    也不交还给自己（交还 = 下一轮又取到，每个轮询间隔一次）：留着租约，到期才再投递一次；本进程自己的任务的
    指令照常执行。按名字认领，不带 task_id 清单。"""
    from datetime import UTC, datetime

    from chongming_task.models import TaskSnapshot

    earlier = SqliteTaskStore(db)
    earlier.create(
        TaskSnapshot(task_id="stale", name="hold", created_at=datetime.now(UTC), owner="w", status=S.QUEUED)
    )
    earlier.close()
    node = Controller(store=SqliteTaskStore(db), owner="w", command_poll_interval=0.01, lease_ttl=1.0)
    gate = threading.Event()
    hold = _held_until(gate)
    node.register("hold", hold)
    live = node.submit("hold", task_id="live")
    wait_until(lambda: live.status is S.RUNNING)
    console = Controller(store=SqliteTaskStore(db), owner="console")
    assert console.stop("stale", reason="收工") is True
    assert console.stop("live", reason="收工") is True
    wait_until(lambda: live.status is S.STOPPED)
    time.sleep(0.3)  # 约 30 个轮询间隔：交还给自己的话，这里早已被反复取走
    probe = console.store
    assert probe is not None
    assert probe.claim_commands("probe", lease=60) == [], "那条指令仍在本节点的租约里，没有被交还"
    stale = probe.get("stale")
    assert stale is not None and stale.status is S.QUEUED, "不是本进程的任务：不执行它的指令"
    node.close(close_store=True)
    time.sleep(1.1)  # 本节点认领时的租约（max(lease_ttl, 1 s)）到期
    (command,) = probe.claim_commands("probe", lease=60)
    assert command.task_id == "stale"
    assert command.deliveries == 2, "只被本节点取过一次（不是每个轮询间隔取一次再交还）"
    gate.set()
    console.close(close_store=True)


def test_a_store_without_the_holder_filter_still_gets_commands_by_task_id_list() -> None:
    """直接覆盖 claim_commands、还不认识 ``holder`` 的老式第三方后端：照旧按在管的 task_id 清单认领。"""
    seen: list[frozenset[str] | None] = []

    class LegacyClaims(InMemoryTaskStore):
        def claim_commands(  # type: ignore[override]
            self, claimant: str, *, lease: float, limit: int = 100, task_ids: Any = None, buckets: Any = None
        ) -> list[Any]:
            seen.append(None if task_ids is None else frozenset(task_ids))
            return super().claim_commands(
                claimant, lease=lease, limit=limit, task_ids=task_ids, buckets=buckets
            )

    store = LegacyClaims()
    node = Controller(store=store, owner="w", command_poll_interval=0.01)
    gate = threading.Event()
    hold = _held_until(gate)
    node.register("hold", hold)
    run = node.submit("hold", task_id="t1")
    console = Controller(store=store, owner="console")
    assert console.stop("t1") is True
    deadline = time.monotonic() + 10
    while run.status is not S.STOPPED and time.monotonic() < deadline:
        time.sleep(0.01)
    assert run.status is S.STOPPED
    assert frozenset({"t1"}) in seen
    gate.set()
    console.close()
    node.close()
