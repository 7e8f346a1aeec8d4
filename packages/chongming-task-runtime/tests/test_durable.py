"""持久任务（issue 19）：配方、enqueue、worker 的认领 / 接手 / 重跑 / 停止交还，经公开 API。

跨进程、kill -9 的场景在 tests/integration/test_durable_processes.py；这里用同进程的几个 Controller 共享一个
存储（SQLite 文件或内存存储），每个 worker 在自己的线程里 ``serve()``。
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from chongming_runtime_test_support import wait_until

from chongming_task import Controller, task
from chongming_task.core.recipes import OnLost, Recipe
from chongming_task.core.state_machine import StateMachine
from chongming_task.core.triggers import TRIGGER_ADOPTED, TRIGGER_LOST, TRIGGER_RECONCILE, TRIGGER_RETRY
from chongming_task.errors import ConfigurationError, StoreError
from chongming_task.models import TaskSnapshot
from chongming_task.runtime.worker import ServeReport
from chongming_task.states import TaskStatus
from chongming_task.storage import TaskQuery, TaskStore
from chongming_task.stores.memory import InMemoryTaskStore
from chongming_task.stores.sqlite import SqliteTaskStore

S = TaskStatus
RAN: list[tuple[str, Any]] = []
RAN_LOCK = threading.Lock()


def record(ctx: Any, value: Any = None, *, pause: float = 0.0) -> Any:
    with RAN_LOCK:
        RAN.append((ctx.task_id, value))
    if pause:
        time.sleep(pause)
    return value


@task(durable=True, on_lost="retry")
def durable_by_default(ctx: Any, x: int) -> int:
    return x * 2


@pytest.fixture(autouse=True)
def _clear() -> Iterator[None]:
    RAN.clear()
    yield
    RAN.clear()


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "durable.db")


class Serving:
    """一个在线程里 serve() 的 worker。"""

    def __init__(self, controller: Controller, **kwargs: Any) -> None:
        self.controller = controller
        self.stop = threading.Event()
        self.report: ServeReport | None = None
        self.thread = threading.Thread(target=self._run, kwargs=kwargs, daemon=True)
        self.thread.start()

    def _run(self, **kwargs: Any) -> None:
        self.report = self.controller.serve(self.stop, poll_interval=0.02, **kwargs)

    def finish(self) -> ServeReport:
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "worker 没有停下来"
        self.controller.close()
        assert self.report is not None
        return self.report


def worker(store: TaskStore, owner: str, *, max_parallel: int = 2, **kwargs: Any) -> Controller:
    controller = Controller(
        max_parallel, store=store, owner=owner, lease_ttl=kwargs.pop("lease_ttl", 1.0), **kwargs
    )
    controller.register("record", record, retry=None)
    return controller


def settled(store: TaskStore, count: int) -> Callable[[], bool]:
    return lambda: sum(1 for s in store.query() if s.is_terminal) >= count


# -- recipes at submit ------------------------------------------------------------------------------


def test_submit_durable_stores_the_recipe_atomically_with_the_snapshot(db: str) -> None:
    store = SqliteTaskStore(db)
    with Controller(2, store=store) as controller:
        controller.register("record", record, on_lost="retry")
        run = controller.submit("record", {"行": [1, 2.5]}, pause=0.0, durable=True, tags={"io"}, priority=3)
        assert run.wait(10).ok
    stored = store.get(run.task_id)
    assert stored is not None and stored.recipe is not None
    assert stored.recipe == Recipe(
        name="record",
        args=({"行": [1, 2.5]},),
        kwargs={"pause": 0.0},
        max_attempts=1,
        tags=("io",),
        priority=3,
        on_lost=OnLost.RETRY,
    )
    # 第一条迁移写进存储的那一刻配方就在：读 create 之后的任何一个版本都带着它（save 从不改写）。
    assert stored.status is S.SUCCEEDED and stored.durable


def test_non_json_arguments_are_refused_at_submit_naming_argument_and_type(db: str) -> None:
    store = SqliteTaskStore(db)
    with Controller(2, store=store) as controller:
        controller.register("record", record)
        with pytest.raises(ConfigurationError, match=r"参数 value（args\[0\]）：值的类型是 tuple"):
            controller.submit("record", (1, 2), durable=True)
        with pytest.raises(ConfigurationError, match="参数 pause：值的类型是 datetime"):
            controller.submit("record", 1, pause=datetime.now(UTC), durable=True)
        with pytest.raises(
            ConfigurationError, match=r"参数 value（args\[0\]）\['a'\] 的键 1：值的类型是 int"
        ):
            controller.enqueue("record", {"a": {1: "x"}})
        with pytest.raises(ConfigurationError, match="float"):
            controller.submit("record", float("nan"), durable=True)
    assert store.query() == [], "被拒绝的提交什么也不写"


def test_task_decorator_durable_is_the_default_and_submit_can_override(db: str) -> None:
    store = SqliteTaskStore(db)
    with Controller(2, store=store) as controller:
        controller.register_all(durable_by_default)
        first = controller.submit("durable_by_default", 4)
        second = controller.submit("durable_by_default", 5, durable=False)
        assert first.wait(10).value == 8 and second.wait(10).value == 10
    one, two = store.get(first.task_id), store.get(second.task_id)
    assert one is not None and one.recipe is not None and one.recipe.on_lost is OnLost.RETRY
    assert two is not None and two.recipe is None


def test_enqueue_creates_a_queued_task_with_no_holder_and_runs_nothing(db: str) -> None:
    store = SqliteTaskStore(db)
    with Controller(store=store, owner="submitter") as submitter:
        task_id = submitter.enqueue("record", 7, bucket_key="tenant-7", priority=2)
        time.sleep(0.1)
        stored = store.get(task_id)
        assert stored is not None
        assert (stored.status, stored.owner, stored.lease_owner) == (S.QUEUED, None, None)
        assert stored.bucket == submitter.bucket_policy.bucket_for("tenant-7")
        assert stored.recipe is not None and stored.recipe.args == (7,)
        assert RAN == []
        assert submitter.runs() == []
    with pytest.raises(ConfigurationError, match="需要共享存储"):
        Controller().enqueue("record", 1)


# -- workers ----------------------------------------------------------------------------------------


def test_workers_claim_each_task_once_only_registered_names_within_owned_buckets(db: str) -> None:
    submitter = Controller(store=SqliteTaskStore(db), owner="submitter")
    policy = submitter.bucket_policy
    keys = [f"k{i}" for i in range(200)]
    even = {policy.bucket_for(k) for k in keys if policy.bucket_for(k) % 2 == 0}
    ids = [submitter.enqueue("record", i, bucket_key=key) for i, key in enumerate(keys)]
    stranger = submitter.enqueue("nobody-registers-this", 1)
    a = worker(SqliteTaskStore(db), "w-even", owned_buckets=even or {0})
    b = worker(SqliteTaskStore(db), "w-all")
    serving = [Serving(a), Serving(b)]
    store = SqliteTaskStore(db)
    wait_until(settled(store, len(ids)))
    reports = [s.finish() for s in serving]
    assert sorted(v for _, v in RAN) == list(range(200)), "每个任务恰好执行一次"
    assert sum(r.claimed for r in reports) == 200
    for snapshot in store.query():
        if snapshot.task_id == stranger:
            assert (snapshot.status, snapshot.owner) == (S.QUEUED, None), "没有 worker 登记的名字一直排队"
            continue
        assert snapshot.status is S.SUCCEEDED
        if snapshot.owner == "w-even":
            assert snapshot.bucket in even, "worker 只认领自己负责的桶"
    submitter.close()


def test_worker_claims_only_as_many_as_free_slots(db: str) -> None:
    submitter = Controller(store=SqliteTaskStore(db), owner="submitter")
    for i in range(12):
        submitter.enqueue("record", i, pause=0.1)
    store = SqliteTaskStore(db)
    peak = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            held = [s for s in store.query() if s.owner == "w" and not s.is_terminal]
            peak = max(peak, len(held))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    serving = Serving(worker(SqliteTaskStore(db), "w", max_parallel=3))
    wait_until(settled(store, 12))
    done.set()
    watcher.join()
    serving.finish()
    assert 1 <= peak <= 3, f"worker 同时持有了 {peak} 个未结束的任务（槽位 3）：不许囤积"
    submitter.close()


def test_worker_refills_a_freed_slot_at_once_without_waiting_for_a_poll(db: str) -> None:
    """队列里有活时，一个任务结束就马上认领下一个（Controller.watch_slots），不在两个任务之间空等轮询间隔：
    轮询间隔设成 60 秒，SQLite 没有通知——8 个任务若要靠轮询，20 秒内跑不完。"""
    submitter = Controller(store=SqliteTaskStore(db), owner="submitter")
    for i in range(8):
        submitter.enqueue("record", i, pause=0.05)
    store = SqliteTaskStore(db)
    controller = worker(SqliteTaskStore(db), "w", max_parallel=2)
    stop = threading.Event()
    thread = threading.Thread(target=controller.serve, args=(stop,), kwargs={"poll_interval": 60.0})
    thread.start()
    try:
        wait_until(settled(store, 8))
        assert sorted(value for _, value in RAN) == list(range(8))
    finally:
        stop.set()
        thread.join(30)
        controller.close()
        submitter.close()
    assert not thread.is_alive()


def test_stop_releases_unstarted_tasks_and_drains_running_ones(db: str) -> None:
    store = SqliteTaskStore(db)
    submitter = Controller(store=SqliteTaskStore(db), owner="submitter")
    ids = [submitter.enqueue("record", i, pause=0.3) for i in range(2)]
    controller = worker(SqliteTaskStore(db), "w", max_parallel=2)
    serving = Serving(controller, drain_timeout=10)
    wait_until(lambda: all((s := store.get(i)) is not None and s.status is S.RUNNING for i in ids))
    later = submitter.enqueue("record", 99)
    report = serving.finish()
    assert report.drained and report.stopped_at_drain == 0
    assert all((s := store.get(i)) is not None and s.status is S.SUCCEEDED for i in ids), "在跑的跑完再停"
    left = store.get(later)
    assert left is not None and left.status in (S.QUEUED, S.SUCCEEDED)
    if left.status is S.QUEUED:
        assert left.owner is None, "没开始的持久任务交还存储，别的 worker 可立刻认领"
    submitter.close()


class _Interrupted(BaseException):
    """测试里代替 KeyboardInterrupt：真的 KeyboardInterrupt 漏出去会中止整个 pytest 会话。"""


def test_interrupt_during_serve_does_not_wait_out_the_drain(db: str) -> None:
    """serve() 被异常打断（Ctrl-C、命令行的第二下中断）时只交还、不再等满 drain_timeout。

    原来 Worker.run 的 finally 无条件 drain：信号在循环里到达，异常要先等 30 秒才传出来。"""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("信号处理函数只能装在主线程")
    store = SqliteTaskStore(db)
    submitter = Controller(store=SqliteTaskStore(db), owner="submitter")
    running = submitter.enqueue("record", 1, pause=30.0)
    controller = worker(SqliteTaskStore(db), "w", max_parallel=1)
    stop = threading.Event()
    sent_at: list[float] = []

    def interrupt(signum: int, frame: Any) -> None:
        raise _Interrupted

    def send_when_running() -> None:
        wait_until(lambda: (s := store.get(running)) is not None and s.status is S.RUNNING)
        time.sleep(0.05)  # 让主线程回到认领循环里等
        sent_at.append(time.monotonic())
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, interrupt)
    sender = threading.Thread(target=send_when_running, daemon=True)
    try:
        sender.start()
        with pytest.raises(_Interrupted):
            controller.serve(stop, poll_interval=0.02, drain_timeout=30)
        interrupted_at = time.monotonic()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not stop.is_set() and sent_at
    assert interrupted_at - sent_at[0] < 3.0, f"中断之后 serve() 还等了 {interrupted_at - sent_at[0]:.1f} 秒"
    assert (s := store.get(running)) is not None and s.status is S.RUNNING  # 没等它跑完
    sender.join(5)
    controller.close(timeout=0)
    submitter.close(timeout=0)


def until_stopped(ctx: Any) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ctx.checkpoint()
        time.sleep(0.01)


class _StopArrivesWhileHosting(SqliteTaskStore):
    """把"认领提交 → 登记进控制器"这个窗口确定地撑开：认领到 ``target`` 之后先让 ``on_claimed`` 发一条
    stop，等指令轮询取到并处理过它（交还或完成），认领才返回、任务才登记。"""

    target = ""
    on_claimed: Callable[[], None] = staticmethod(lambda: None)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen = threading.Event()
        self.handled = threading.Event()
        self.command_ids: set[str] = set()

    def _claim_queued(self, request: Any) -> list[TaskSnapshot]:
        claimed = super()._claim_queued(request)
        if any(s.task_id == self.target for s in claimed):
            self.on_claimed()
            assert self.seen.wait(20), "指令轮询没有在窗口里取到这条指令"
            self.handled.wait(2)  # 修好之前：取到的指令既不交还也不完成，这里等满 2 秒后照常返回
        return claimed

    def _claim_commands(self, request: Any) -> list[Any]:
        commands = super()._claim_commands(request)
        for command in commands:
            if command.task_id == self.target:
                self.command_ids.add(command.command_id)
                self.seen.set()
        return commands

    def release_command(self, command_id: str, claimant: str) -> bool:
        if command_id in self.command_ids:
            self.handled.set()
        return super().release_command(command_id, claimant)

    def complete_command(self, command_id: str, claimant: str) -> bool:
        if command_id in self.command_ids:
            self.handled.set()
        return super().complete_command(command_id, claimant)


def test_stop_arriving_between_claim_and_hosting_is_delivered_at_the_next_poll(db: str) -> None:
    """指令按持有者认领：worker 刚认领、还没登记的任务在存储里已归它、本地却没有——与"同名前任留下的任务"
    一个样子。窗口里到达的 stop 必须交还、下一轮就执行（Controller.claiming），不能扣到指令租约到期
    （这里租约 60 秒：扣住的话 20 秒内停不下来）。"""
    store = SqliteTaskStore(db)
    submitter = Controller(store=SqliteTaskStore(db), owner="submitter")
    submitter.register("until_stopped", until_stopped, retry=None)
    hosting = _StopArrivesWhileHosting(db)
    hosting.target = "late"
    hosting.on_claimed = lambda: submitter.stop("late", reason="刚认领就停")
    controller = worker(hosting, "w", max_parallel=2, lease_ttl=60.0)
    controller.register("until_stopped", until_stopped, retry=None)
    first = submitter.enqueue("until_stopped", task_id="first")
    serving = Serving(controller, drain_timeout=1)
    try:
        # 先让一个任务在 worker 上跑着：本节点有在管的任务时才轮询指令。
        wait_until(lambda: (s := store.get(first)) is not None and s.status is S.RUNNING)
        submitter.enqueue("until_stopped", task_id="late")
        wait_until(lambda: (s := store.get("late")) is not None and s.status is S.STOPPED)
        assert hosting.handled.is_set(), "窗口里取到的指令应当交还（下一轮再取）"
    finally:
        serving.finish()
        submitter.close()


# -- adoption and re-run ----------------------------------------------------------------------------


def _held_by_dead(
    store: TaskStore, task_id: str, status: TaskStatus, *, on_lost: str = "fail", **extra: Any
) -> None:
    """在存储里放一个由已死的 "dead" 持有、租约早已过期的持久任务。"""
    recipe = Recipe(
        name="record", args=(task_id,), max_attempts=extra.pop("max_attempts", 2), on_lost=on_lost
    )
    machine = StateMachine.create(
        task_id, "record", max_attempts=recipe.max_attempts, owner="dead", recipe=recipe, **extra
    )
    machine.mark_queued()
    if status in (S.RUNNING, S.RETRY_WAIT):
        machine.mark_starting()
        machine.mark_running()
    if status is S.RETRY_WAIT:
        from chongming_task.models import Failure, FailureKind

        failure = Failure(FailureKind.EXCEPTION, "第一次失败", retryable=True)
        machine.mark_retry_wait(failure=failure, retry_at=datetime.now(UTC) + timedelta(seconds=0.5))
    if status is S.PAUSED:
        machine.mark_paused()
    expired = datetime.now(UTC) - timedelta(minutes=5)
    machine.update_side(lease_owner="dead", lease_until=expired)
    store.create(machine.snapshot, machine.transitions)


def test_dead_holders_durable_tasks_are_adopted_status_unchanged(db: str) -> None:
    store = SqliteTaskStore(db)
    _held_by_dead(store, "q", S.QUEUED)
    _held_by_dead(store, "p", S.PAUSED)
    _held_by_dead(store, "rw", S.RETRY_WAIT)
    serving = Serving(worker(SqliteTaskStore(db), "alive"))
    wait_until(lambda: (s := store.get("q")) is not None and s.status is S.SUCCEEDED)
    wait_until(lambda: (s := store.get("rw")) is not None and s.status is S.SUCCEEDED)
    paused = store.get("p")
    assert paused is not None and paused.status is S.PAUSED and paused.owner == "alive", (
        "暂停的仍暂停，换了持有者"
    )
    for task_id, status in (("q", S.QUEUED), ("p", S.PAUSED), ("rw", S.RETRY_WAIT)):
        adopted = [t for t in store.history(task_id) if t.trigger == TRIGGER_ADOPTED]
        assert len(adopted) == 1, task_id
        assert (adopted[0].from_status, adopted[0].to_status, adopted[0].actor) == (status, status, "alive")
        assert adopted[0].reason is not None and "dead" in adopted[0].reason
    # 重试等待的按它原来的到期时刻排队，不提前
    history = store.history("rw")
    adopted_at = next(t.at for t in history if t.trigger == TRIGGER_ADOPTED)
    requeued = next(t for t in history if t.version > 4 and t.to_status is S.QUEUED)
    assert requeued.at >= adopted_at
    # 接手来的暂停任务能被恢复（指令照常送到新的持有者）
    assert serving.controller.resume("p")
    wait_until(lambda: (s := store.get("p")) is not None and s.status is S.SUCCEEDED)
    serving.finish()


def test_running_durable_task_is_rerun_only_with_on_lost_retry(db: str) -> None:
    store = SqliteTaskStore(db)
    _held_by_dead(store, "retry-me", S.RUNNING, on_lost="retry")
    _held_by_dead(store, "leave-me", S.RUNNING, on_lost="fail")
    _held_by_dead(store, "no-budget", S.RUNNING, on_lost="retry", max_attempts=1)
    serving = Serving(worker(SqliteTaskStore(db), "alive"))
    wait_until(lambda: (s := store.get("retry-me")) is not None and s.status is S.SUCCEEDED)
    wait_until(
        lambda: all((s := store.get(i)) is not None and s.status is S.LOST for i in ("leave-me", "no-budget"))
    )
    serving.finish()
    triggers = [t.trigger for t in store.history("retry-me")]
    assert triggers[-6:-3] == [TRIGGER_RECONCILE, TRIGGER_RETRY, TRIGGER_ADOPTED], triggers
    assert [v for _, v in RAN] == ["retry-me"], "只重跑 on_lost='retry' 且还有尝试预算的"


def test_non_durable_tasks_behave_as_before(db: str) -> None:
    store = SqliteTaskStore(db)
    for task_id, running in (("plain-q", False), ("plain-r", True)):
        machine = StateMachine.create(task_id, "record", owner="dead")
        machine.mark_queued()
        if running:
            machine.mark_starting()
            machine.mark_running()
        machine.update_side(lease_owner="dead", lease_until=datetime.now(UTC) - timedelta(minutes=1))
        store.create(machine.snapshot, machine.transitions)
    serving = Serving(worker(SqliteTaskStore(db), "alive"))
    time.sleep(1.0)  # 至少一轮维护
    serving.finish()
    stored = store.get("plain-q")
    assert stored is not None and (stored.status, stored.owner) == (S.QUEUED, "dead"), "普通任务不被接手"
    running = store.get("plain-r")
    assert running is not None and running.status is S.RUNNING, (
        "普通任务何时判 lost 仍由调用方的 reconcile() 决定"
    )
    assert RAN == []


def test_serve_needs_store_slots_and_registrations() -> None:
    with pytest.raises(ConfigurationError, match="共享存储"):
        Controller(2).serve(threading.Event())
    with pytest.raises(ConfigurationError, match="max_parallel"):
        Controller(store=InMemoryTaskStore()).serve(threading.Event())
    with pytest.raises(ConfigurationError, match="先登记任务"):
        Controller(2, store=InMemoryTaskStore()).serve(threading.Event())


def test_doctor_reports_durable_tasks_no_live_worker_serves(db: str) -> None:
    store = SqliteTaskStore(db)
    submitter = Controller(store=SqliteTaskStore(db), owner="submitter")
    served = submitter.enqueue("record", 1, pause=5.0)
    lonely = submitter.enqueue("nobody-registers-this", 1)
    controller = worker(SqliteTaskStore(db), "w", max_parallel=1)
    serving = Serving(controller)
    wait_until(lambda: (s := store.get(served)) is not None and s.status is S.RUNNING)
    report = submitter.check_cluster()
    assert [s.task_id for s in report.unserved] == [lonely] and report.unserved_count == 1
    assert not report.healthy
    assert any(
        "没有存活的 worker 登记这些名字" in line and "nobody-registers-this" in line
        for line in report.problems()
    )
    assert report.orphan_count == 0, "等认领的持久任务不是孤儿"
    serving.stop.set()
    controller.stop(served)
    serving.finish()
    submitter.close()


def test_reconcile_does_not_report_tasks_waiting_for_a_worker(db: str) -> None:
    with Controller(store=SqliteTaskStore(db), owner="submitter") as submitter:
        waiting = submitter.enqueue("record", 1)
        report = submitter.reconcile()
        assert waiting not in {s.task_id for s in (*report.lost, *report.adoptable, *report.skipped)}
        assert submitter.get(waiting).status is S.QUEUED  # type: ignore[union-attr]


class CountingStore(SqliteTaskStore):
    """记下每次 query 交回了哪些任务。"""

    returned: list[str]

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        rows = super().query(query)
        self.returned.extend(s.task_id for s in rows)
        return rows


def test_reconcile_leaves_tasks_waiting_for_a_worker_in_the_store(db: str) -> None:
    """待认领的任务在存储里就被排除：积压很多时 reconcile（和 worker 的每轮维护）不把它们读进来。"""
    store = CountingStore(db)
    store.returned = []
    _held_by_dead(store, "dead-q", S.QUEUED)
    with Controller(store=store, owner="submitter") as submitter:
        waiting = {submitter.enqueue("record", n) for n in range(200)}
        store.returned.clear()
        report = submitter.reconcile()
        assert [s.task_id for s in report.adoptable] == ["dead-q"]  # 死者手里排队的照常报告
        assert waiting.isdisjoint(store.returned), "待认领的任务被读了出来"
        assert all(submitter.get(t).status is S.QUEUED for t in waiting)  # type: ignore[union-attr]


# -- recovery: lost on_lost="retry" tasks whose revive did not happen -------------------------------


def _stranded_lost(store: TaskStore, task_id: str, *, trigger: str = TRIGGER_RECONCILE, **extra: Any) -> None:
    """存储里放一个已被判 lost、却没被复活的持久任务（判 lost 的 worker 在复活之前死了）。"""
    _held_by_dead(store, task_id, S.RUNNING, **extra)
    stored = store.get(task_id)
    assert stored is not None
    machine = StateMachine(stored, ())
    machine.mark_lost(trigger=trigger, actor="dead-worker", reason="租约过期，载体已消失")
    store.save(
        machine.snapshot,
        expect_version=stored.status_version,
        transitions=machine.transitions_since(stored.status_version),
    )


class FlakyReviveStore(InMemoryTaskStore):
    """故障注入：每个 ``flaky`` 里的任务，第一次把它从 lost 写回 queued（复活）时存储报错，什么也不写。"""

    def __init__(self, flaky: set[str]) -> None:
        super().__init__()
        self.flaky = set(flaky)
        self.failed: list[str] = []

    def save(self, snapshot: Any, *, expect_version: int, **kwargs: Any) -> None:
        if snapshot.task_id in self.flaky and snapshot.status is S.QUEUED:
            stored = self.get(snapshot.task_id)
            if stored is not None and stored.status is S.LOST:
                self.flaky.discard(snapshot.task_id)
                self.failed.append(snapshot.task_id)
                raise StoreError("注入的故障：复活写入失败")
        super().save(snapshot, expect_version=expect_version, **kwargs)


def _retries(store: TaskStore, task_id: str) -> int:
    return sum(1 for t in store.history(task_id) if t.trigger == TRIGGER_RETRY)


def test_lost_task_whose_revive_failed_is_revived_next_round_exactly_once() -> None:
    store = FlakyReviveStore({"flaky", "stranded"})
    _held_by_dead(store, "flaky", S.RUNNING, on_lost="retry")  # 这一轮判 lost，复活写入失败
    _stranded_lost(store, "stranded", on_lost="retry")  # 已是 lost，第一次补救也失败
    _stranded_lost(store, "fail", on_lost="fail")
    _stranded_lost(store, "stopped-late", on_lost="retry", trigger=TRIGGER_LOST)  # 优雅窗口用尽，不是载体消失
    _stranded_lost(store, "no-budget", on_lost="retry", max_attempts=1)
    serving = Serving(worker(store, "alive", lease_ttl=0.4))
    for task_id in ("flaky", "stranded"):
        wait_until(lambda i=task_id: (s := store.get(i)) is not None and s.status is S.SUCCEEDED)
    time.sleep(0.6)  # 再过几轮维护：已复活的不会再被复活
    report = serving.finish()
    assert sorted(store.failed) == ["flaky", "stranded"], "两个任务的第一次复活都被注入了故障"
    for task_id in ("flaky", "stranded"):
        assert _retries(store, task_id) == 1, task_id
        history = store.history(task_id)
        assert [t.trigger for t in history].count(TRIGGER_ADOPTED) == 1, task_id
    assert sorted(v for _, v in RAN) == ["flaky", "stranded"], "各只重跑一次"
    assert report.revived == 2
    for task_id in ("fail", "stopped-late", "no-budget"):
        stored = store.get(task_id)
        assert stored is not None and stored.status is S.LOST and _retries(store, task_id) == 0, task_id


class RacingStore(InMemoryTaskStore):
    """前两次"找 lost 任务"的查询互相等齐：两个 worker 读到同一批 lost 快照之后才各自去复活。"""

    def __init__(self) -> None:
        super().__init__()
        self.barrier = threading.Barrier(2, timeout=10)
        self.lost_queries = 0
        self.count_lock = threading.Lock()

    def query(self, query: Any = None) -> Any:
        result = super().query(query)
        if query is not None and query.statuses == frozenset({S.LOST}):
            with self.count_lock:
                self.lost_queries += 1
                first_two = self.lost_queries <= 2
            if first_two:
                self.barrier.wait()
        return result


def test_two_workers_recovering_the_same_lost_tasks_revive_each_once() -> None:
    store = RacingStore()
    ids = [f"lost-{i:02d}" for i in range(30)]
    for task_id in ids:
        _stranded_lost(store, task_id, on_lost="retry")
    a = Serving(worker(store, "w-a", max_parallel=4, lease_ttl=0.4))
    b = Serving(worker(store, "w-b", max_parallel=4, lease_ttl=0.4))
    wait_until(lambda: all((s := store.get(i)) is not None and s.status is S.SUCCEEDED for i in ids), 60)
    time.sleep(0.6)
    reports = [a.finish(), b.finish()]
    assert store.lost_queries >= 2 and not store.barrier.broken, "两个 worker 确实同时读到了同一批 lost"
    assert [_retries(store, i) for i in ids] == [1] * len(ids), "每个只被复活一次"
    assert sorted(v for _, v in RAN) == ids, "每个只重跑一次"
    assert sum(r.revived for r in reports) == len(ids)


def test_recipe_dict_without_copy_encodes_the_same_and_the_default_copy_is_independent() -> None:
    """存储编码配方时用 ``to_dict(copy=False)`` 省掉参数的深拷；文本必须与默认的深拷版本一样，
    默认版本改了也碰不到配方本身。"""
    recipe = Recipe(name="sync", args=([1, {"a": [2.5, None]}], "x"), kwargs={"day": {"k": [True]}})
    shared = recipe.to_dict(copy=False)
    copied = recipe.to_dict()
    assert json.dumps(shared, sort_keys=True) == json.dumps(copied, sort_keys=True)
    copied["args"][0].append(3)
    copied["kwargs"]["day"]["k"].append(False)
    assert recipe.args[0] == [1, {"a": [2.5, None]}] and recipe.kwargs == {"day": {"k": [True]}}
    assert Recipe.from_dict(json.loads(json.dumps(shared))) == recipe
