"""推迟写的 running（runtime/persistence.py 的 ``WriteThrough.on_transition``）：任务体开始之前只等 starting
落库；starting → running 只登记、不排进组提交、不等，由本任务的下一次写带上（终态那次写连同 running 的迁移
记录一起写），最迟 ``LAZY_RUNNING_DELAY`` 秒后由后台循环补写。存储里的历史始终完整。
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import chongming_runtime_test_tasks as tasks
import pytest
from chongming_runtime_test_support import wait_until

from chongming_task import Controller, SqliteTaskStore, TaskStatus
from chongming_task.core.state_machine import StateMachine
from chongming_task.errors import TaskError
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.runtime import persistence
from chongming_task.runtime.executors import ProcessExecutor
from chongming_task.runtime.group_commit import GroupCommit
from chongming_task.runtime.store_link import StoreLink
from chongming_task.storage import SaveRequest
from chongming_task.stores.memory import InMemoryTaskStore
from chongming_task.testing.contract._base import S, snap, step

Writes = list[list[tuple[str, list[TaskStatus]]]]


class CountingStore(SqliteTaskStore):
    """记下每个写事务写了哪些任务的哪些迁移（save 与 save_many 各是一个事务）。"""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.writes: Writes = []
        self._writes_lock = threading.Lock()

    def save(self, snapshot: TaskSnapshot, **kwargs: Any) -> None:
        statuses = [t.to_status for t in kwargs.get("transitions", ())]
        with self._writes_lock:
            self.writes.append([(snapshot.task_id, statuses)])
        super().save(snapshot, **kwargs)

    def save_many(self, requests: Sequence[SaveRequest]) -> list[TaskError | None]:
        with self._writes_lock:
            self.writes.append([(r.snapshot.task_id, [t.to_status for t in r.transitions]) for r in requests])
        return super().save_many(requests)

    def write_many(
        self, creates: Sequence[tuple[TaskSnapshot, Sequence[Transition]]], saves: Sequence[SaveRequest]
    ) -> tuple[list[TaskError | None], list[TaskError | None]]:
        # 单个提交的 create 与排着的 save 同一事务（组提交的混合批）：save 那几项照样记下
        with self._writes_lock:
            self.writes.append([(r.snapshot.task_id, [t.to_status for t in r.transitions]) for r in saves])
        return super().write_many(creates, saves)

    def writes_of(self, task_id: str) -> list[list[TaskStatus]]:
        with self._writes_lock:
            return [statuses for batch in self.writes for tid, statuses in batch if tid == task_id]


def noop(ctx: Any) -> None:
    return None


def test_running_is_written_with_the_terminal_state_not_before_the_body(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 后台补写推迟到很久以后：这里只看"下一次写带上它"，不让负载下的调度时机左右结果。
    monkeypatch.setattr(persistence, "LAZY_RUNNING_DELAY", 60.0)
    store = CountingStore(str(tmp_path / "t.db"))
    controller = Controller(max_parallel=1, store=store)
    controller.register("noop", noop)
    run = controller.submit("noop")
    run.wait(timeout=20)
    assert store.writes_of(run.task_id) == [[S.STARTING], [S.RUNNING, S.SUCCEEDED]]
    history = [t.to_status for t in store.history(run.task_id)]
    assert history == [S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED], "存储里的历史没有空洞"
    controller.close(close_store=True)


def test_a_long_body_shows_running_in_the_store_shortly_after_it_starts(tmp_path: Path) -> None:
    store = CountingStore(str(tmp_path / "t.db"))
    release = threading.Event()
    began = threading.Event()

    def hold(ctx: Any) -> None:
        began.set()
        assert release.wait(30)

    controller = Controller(max_parallel=1, store=store)
    controller.register("hold", hold)
    run = controller.submit("hold")
    assert began.wait(20)
    reader = SqliteTaskStore(str(tmp_path / "t.db"))
    try:
        # 任务体还在跑、没有别的写可以捎带：后台循环在 LAZY_RUNNING_DELAY 之后补写（负载下留足余量）。
        wait_until(lambda: (s := reader.get(run.task_id)) is not None and s.status is S.RUNNING, timeout=10)
        assert not release.is_set()
    finally:
        release.set()
    run.wait(timeout=20)
    assert store.writes_of(run.task_id) == [[S.STARTING], [S.RUNNING], [S.SUCCEEDED]]
    history = [t.to_status for t in reader.history(run.task_id)]
    assert history == [S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED]
    reader.close()
    controller.close(close_store=True)


def test_a_long_body_after_a_quiet_stretch_still_wakes_the_loop_to_write_running(tmp_path: Path) -> None:
    """后台循环已按很远的期限睡下（轮询、旁路回写、续租都在几秒之后）时，新排进来的推迟写的 running 仍会
    叫醒它：存储在 LAZY_RUNNING_DELAY 量级的时间里显示 running，而不是等到那些期限。"""
    store = CountingStore(str(tmp_path / "t.db"))
    release = threading.Event()
    began = threading.Event()

    def hold(ctx: Any) -> None:
        began.set()
        assert release.wait(30)

    controller = Controller(
        max_parallel=1, store=store, command_poll_interval=20.0, side_channel_interval=20.0, lease_ttl=120.0
    )
    controller.register("noop", noop)
    controller.register("hold", hold)
    assert controller.submit("noop").wait(timeout=20).ok
    time.sleep(0.3)  # 循环补写的窗口早已过去、又按 20 秒外的期限睡下
    run = controller.submit("hold")
    assert began.wait(20)
    reader = SqliteTaskStore(str(tmp_path / "t.db"))
    try:
        started = time.monotonic()
        wait_until(lambda: (s := reader.get(run.task_id)) is not None and s.status is S.RUNNING, timeout=15)
        assert time.monotonic() - started < 10, "推迟写的 running 等到了 20 秒外的期限才落库"
    finally:
        release.set()
    assert run.wait(timeout=20).ok
    assert store.writes_of(run.task_id) == [[S.STARTING], [S.RUNNING], [S.SUCCEEDED]]
    reader.close()
    controller.close(close_store=True)


def test_a_stream_of_short_tasks_does_not_wake_the_loop_once_per_task(tmp_path: Path) -> None:
    """短任务一个接一个地跑时，几乎每个任务都有一项推迟写的 running（随即由终态那次写带走）：后台循环这时
    每 LAZY_RUNNING_DELAY 醒一次就够了，不该每个任务被叫醒一次（每次是两次上下文切换加一轮循环）。"""
    store = CountingStore(str(tmp_path / "t.db"))
    controller = Controller(max_parallel=2, store=store)
    controller.register("noop", noop)
    link = controller._link
    assert isinstance(link, StoreLink)
    write = link._write
    wake = write.on_lazy
    assert wake is not None
    woken = [0]

    def counting_wake() -> None:
        woken[0] += 1
        wake()

    write.on_lazy = counting_wake
    n = 300
    runs = [controller.submit("noop") for _ in range(n)]
    assert all(run.wait(timeout=60).ok for run in runs)
    lazy = sum(1 for run in runs if [S.RUNNING, S.SUCCEEDED] in store.writes_of(run.task_id))
    assert lazy > n // 2, "这个场景里大多数任务的 running 应当是推迟写、随终态落库的"
    assert woken[0] <= n // 5, f"{n} 个短任务叫醒了后台循环 {woken[0]} 次"
    for run in runs[:20]:
        history = [t.to_status for t in store.history(run.task_id)]
        assert history == [S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED]
    controller.close(close_store=True)


def test_the_process_executor_still_writes_running_with_the_pid_at_once(tmp_path: Path) -> None:
    """子进程的 pid 要尽快落库（父进程死后据此找孤儿进程）：进程执行器的 running 照常同步写。"""
    store = CountingStore(str(tmp_path / "t.db"))
    controller = Controller(max_parallel=1, store=store, executor=ProcessExecutor())
    controller.register("add", tasks.add)
    run = controller.submit("add", 1)
    assert run.wait(timeout=60).ok
    writes = store.writes_of(run.task_id)
    assert [S.RUNNING] in writes, writes
    controller.close(close_store=True)


# -- GroupCommit.withdraw ---------------------------------------------------------------------------


def _queued(store: InMemoryTaskStore, task_id: str) -> SaveRequest:
    base = snap(task_id)
    store.create(base)
    queued, record = step(base, S.QUEUED)
    return SaveRequest(queued, 0, [record])


def test_withdraw_takes_back_an_item_no_writer_has_taken() -> None:
    store = InMemoryTaskStore()
    commits = GroupCommit(store)
    item = commits.enqueue(_queued(store, "a"))
    assert commits.withdraw(item)
    commits.save(_queued(store, "b"))  # 下一个写者的批次里没有 a
    a = store.get("a")
    b = store.get("b")
    assert a is not None and a.status is S.PENDING, "撤回的那一项没有写"
    assert b is not None and b.status is S.QUEUED
    assert commits.items == 1


def test_an_item_a_writer_already_took_cannot_be_withdrawn_and_finishes_normally() -> None:
    store = InMemoryTaskStore()
    commits = GroupCommit(store)
    item = commits.enqueue(_queued(store, "a"))
    commits.save(_queued(store, "b"))  # 这个写者把 a 一并捎上了
    assert not commits.withdraw(item)
    commits.finish(item)  # 已提交：立刻返回，不抛
    a = store.get("a")
    assert a is not None and a.status is S.QUEUED


# -- 启动不占提交 / 认领线程（存储能并行提交时） ------------------------------------------------------------


class GatedStartStore(InMemoryTaskStore):
    """能并行提交（几个写者）、做组提交的内存存储（第三方后端可以这样取）；写 starting 的 save 停在闸门上。"""

    group_commit = True
    group_commit_writers = 4

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def _gated(self, snapshots: Sequence[TaskSnapshot]) -> None:
        if any(snapshot.status is S.STARTING for snapshot in snapshots) and not self.gate.is_set():
            self.entered.set()
            assert self.gate.wait(30)

    def save(self, snapshot: TaskSnapshot, **kwargs: Any) -> None:
        self._gated([snapshot])
        super().save(snapshot, **kwargs)

    def save_many(self, requests: Sequence[SaveRequest]) -> list[TaskError | None]:
        self._gated([r.snapshot for r in requests])
        return super().save_many(requests)


def test_submit_returns_without_waiting_for_the_starting_commit() -> None:
    """存储能并行提交时，submit() 只等自己的 create；拿到额度的任务由别的线程写 starting 并启动。"""
    store = GatedStartStore()
    controller = Controller(max_parallel=2, store=store)
    controller.register("noop", noop)
    submitted: list[str] = []
    submitter = threading.Thread(target=lambda: submitted.append(controller.submit("noop").task_id))
    try:
        submitter.start()
        assert store.entered.wait(20), "任务应当被启动（starting 的写到了存储）"
        submitter.join(10)
        assert not submitter.is_alive(), "submit() 卡在了 starting 那次提交上"
        stored = store.get(submitted[0])
        assert stored is not None and stored.status is S.QUEUED, "starting 还没落库：任务体不许开始"
    finally:
        store.gate.set()
    controller.wait_all(timeout=20)
    history = [t.to_status for t in store.history(submitted[0])]
    assert history == [S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED]
    controller.close()


def test_a_worker_keeps_claiming_while_a_claimed_task_waits_for_its_starting_commit() -> None:
    store = GatedStartStore()
    submitter = Controller(store=store, owner="submitter")
    submitter.register("noop", noop, durable=True)
    first = submitter.enqueue("noop")
    worker = Controller(2, store=store, owner="w")
    worker.register("noop", noop)
    stop = threading.Event()
    serving = threading.Thread(target=worker.serve, args=(stop,), kwargs={"poll_interval": 0.02})
    serving.start()
    try:
        assert store.entered.wait(20)
        second = submitter.enqueue("noop")
        # 第一个任务的 starting 还停在闸门上：认领线程不被它挡住，第二个空位照样认领。
        wait_until(lambda: (s := store.get(second)) is not None and s.owner == "w", timeout=10)
        held = store.get(first)
        assert held is not None and held.status is S.QUEUED
    finally:
        store.gate.set()
    wait_until(
        lambda: all((s := store.get(t)) is not None and s.status is S.SUCCEEDED for t in (first, second))
    )
    stop.set()
    serving.join(30)
    worker.close()
    submitter.close()


# -- 写穿交出去的记录用手里现成的（persistence._records_since） ----------------------------------------------


def test_the_records_handed_to_the_store_are_the_ones_at_hand_when_they_line_up() -> None:
    """推迟写的 running 与交出的终态那两次写：手里的记录（撤回的 running、刚发生的终态）正好接上存储里的版本
    时原样交出（同一批对象，不从紧凑历史再现造）；接不上（中间缺一条、不是最新的一条）时与
    ``transitions_since`` 逐条相同。"""
    machine = StateMachine.create("t", "noop", lock=threading.RLock())
    machine.mark_queued()
    machine.mark_starting(executor="thread")
    seen: list[Transition] = []
    machine.add_listener(lambda snapshot, record: seen.append(record))
    machine.mark_running()
    running = seen[-1]
    # running 那一次：存储在 starting（版本 2），手里正是 2 → 3 这一条
    assert persistence._records_since(machine, 2, 3, (), running)[0] is running
    machine.mark_succeeded()
    done = seen[-1]
    # 终态那一次：撤回的 running 加上刚发生的终态，正好补上 2 → 4
    handed = persistence._records_since(machine, 2, 4, (running,), done)
    assert handed[0] is running and handed[1] is done
    assert handed == machine.transitions_since(2)
    # 接不上：存储落后两条、手里只有终态 → 照常从历史里取，一条不缺
    assert persistence._records_since(machine, 2, 4, (), done) == machine.transitions_since(2)
    assert persistence._records_since(machine, 1, 4, (running,), done) == machine.transitions_since(1)
    # 手里的不是最新的一条 → 照常取
    assert persistence._records_since(machine, 2, 4, (), running) == machine.transitions_since(2)
