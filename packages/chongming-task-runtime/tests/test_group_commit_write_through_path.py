"""经组提交的写穿（SQLite）的直写路径（runtime/persistence.py 的 ``WriteThrough.on_transition``、
``_defer_running``、``_handoff`` / ``_after_write``）：每个任务的 starting、推迟写的 running、交出的终态不再经
``sync`` → ``_rounds`` → ``_written`` → ``_caught_up`` 几层，但交给组提交的每一项、记账与存储里的结果必须与
通用路径逐项相同；状态机已又走了一步（监听器里嵌套的迁移）、任务已不归本进程管时照旧走通用路径。
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from chongming_task import SqliteTaskStore, TaskStatus
from chongming_task.clock import SYSTEM_CLOCK
from chongming_task.core.state_machine import StateMachine
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.runtime.group_commit import GroupCommit, Pending
from chongming_task.runtime.persistence import WriteThrough, _TaskState
from chongming_task.storage import SaveRequest

S = TaskStatus


class Recorded:
    """一个经组提交写穿的 SQLite 存储，记下交给组提交的每一项（``save`` 与 ``enqueue``）。"""

    def __init__(self, tmp_path: Path) -> None:
        self.store = SqliteTaskStore(str(tmp_path / "wt.db"))
        self.write = WriteThrough(self.store, owner="me", lease_ttl=30.0, clock=SYSTEM_CLOCK)
        commits = self.write.commits
        assert commits is not None, "SQLite 的写穿经组提交"
        self.commits: GroupCommit = commits
        self.saved: list[SaveRequest] = []
        self.enqueued: list[SaveRequest] = []
        save, enqueue = commits.save, commits.enqueue

        def recording_save(request: SaveRequest) -> None:
            self.saved.append(request)
            save(request)

        def recording_enqueue(request: SaveRequest) -> Pending:
            self.enqueued.append(request)
            return enqueue(request)

        commits.save = recording_save  # type: ignore[method-assign]
        commits.enqueue = recording_enqueue  # type: ignore[method-assign]

    def queued(self, task_id: str) -> StateMachine:
        machine = StateMachine.create(task_id, "noop", lock=threading.RLock(), **self.write.lease_fields())
        machine.mark_queued()
        self.write.create(machine)
        return machine

    def close(self) -> None:
        self.store.close()


@pytest.fixture
def rec(tmp_path: Path) -> Recorded:
    recorded = Recorded(tmp_path)
    yield recorded  # type: ignore[misc]
    recorded.close()


def test_starting_running_and_the_handed_over_terminal_write_what_sync_would(rec: Recorded) -> None:
    """一个任务在执行槽上的三次写：starting 直接写（期望存储里的版本、只带这一条记录）；running 只记下那一项
    （同样的一项）、不排进组提交，记账换成带着这一项的 _TaskState、登记到点补写；终态丢掉登记、连同 running 的
    记录一起交出，写完记账换回 int、登记清掉——与 ``sync`` / ``_write_lazily`` / ``sync_later`` 的通用路径逐项
    相同。"""
    write = rec.write
    machine = rec.queued("t")
    queued_version = machine.snapshot.status_version
    listening = [True]  # 终态由控制器交出（sync_later），不经监听器：那时关掉

    def listener(snapshot: TaskSnapshot, record: Transition) -> None:
        if listening[0]:
            write.on_transition(machine, snapshot, record)

    machine.add_listener(listener)

    machine.mark_starting(executor="thread")
    assert rec.saved == [
        SaveRequest(machine.snapshot, queued_version, machine.transitions_since(queued_version))
    ]
    assert write._tasks["t"] == machine.snapshot.status_version
    stored = rec.store.get("t")
    assert stored is not None and stored.status is S.STARTING, "任务体开始之前 starting 已落库"

    starting_version = machine.snapshot.status_version
    machine.mark_running()
    assert rec.enqueued == [] and rec.commits._pending == [], "推迟写的 running 不排进组提交"
    state = write._tasks["t"]
    assert isinstance(state, _TaskState)
    assert state.lazy == SaveRequest(
        machine.snapshot, starting_version, machine.transitions_since(starting_version)
    )
    assert state.persisted_version == starting_version and not state.uncertain and not state.fenced
    assert "t" in write._lazy and write._lazy["t"][1] is machine
    stored = rec.store.get("t")
    assert stored is not None and stored.status is S.STARTING, "running 推迟写：还没落库"

    listening[0] = False
    with machine.lock:
        machine.mark_succeeded()
        done = machine.transitions[-1]
        finish = write.sync_later(machine, done)
        assert finish is not None
        assert rec.enqueued[-1] == SaveRequest(
            machine.snapshot, starting_version, machine.transitions_since(starting_version)
        ), "撤回的 running 连同终态一起交出"
        assert finish() is True
    assert write._tasks["t"] == machine.snapshot.status_version
    assert write._lazy == {} and rec.commits._pending == []
    stored = rec.store.get("t")
    assert stored is not None and (stored.status, stored.status_version) == (
        S.SUCCEEDED,
        machine.snapshot.status_version,
    )
    assert [t.to_status for t in rec.store.history("t")] == [t.to_status for t in machine.transitions]


def test_a_listener_snapshot_the_machine_has_moved_past_goes_through_sync(rec: Recorded) -> None:
    """监听器拿到的快照已不是状态机此刻的快照（嵌套的迁移）：不直接写那一版，照旧经 sync 写状态机此刻的
    快照与存储之后的全部记录。"""
    write = rec.write
    machine = rec.queued("t")
    queued_version = machine.snapshot.status_version
    seen: list[tuple[TaskSnapshot, Transition]] = []
    machine.add_listener(lambda snapshot, record: seen.append((snapshot, record)))
    machine.mark_starting(executor="thread")
    machine.mark_running()
    stale_snapshot, stale_record = seen[0]  # starting 那一版：状态机已走到 running
    with machine.lock:
        write.on_transition(machine, stale_snapshot, stale_record)
    assert rec.saved == [
        SaveRequest(machine.snapshot, queued_version, machine.transitions_since(queued_version))
    ]
    assert rec.enqueued == []
    stored = rec.store.get("t")
    assert stored is not None and (stored.status, stored.status_version) == (
        S.RUNNING,
        machine.snapshot.status_version,
    )
    assert write._tasks["t"] == machine.snapshot.status_version


def test_deferring_running_for_a_forgotten_task_queues_and_registers_nothing(rec: Recorded) -> None:
    """任务已不归本进程管（forget 了）时推迟写的 running 什么也不排、不登记、不把记账加回来（否则是一个再也
    没人删的 _TaskState 与到点补写的登记）；经监听器走到这里时照旧由 sync 判定"不在管"。"""
    write = rec.write
    machine = rec.queued("t")
    seen: list[tuple[TaskSnapshot, Transition]] = []
    machine.add_listener(lambda snapshot, record: seen.append((snapshot, record)))
    machine.mark_starting(executor="thread")
    with machine.lock:
        write.on_transition(machine, *seen[-1])
    persisted = write._tasks["t"]
    assert isinstance(persisted, int)
    machine.mark_running()
    write.forget("t")
    with machine.lock:
        snapshot, record = seen[-1]
        assert not write._defer_running(rec.commits, machine, snapshot, persisted, (record,))
        write.on_transition(machine, *seen[-1])
    assert "t" not in write._tasks and write._lazy == {}
    assert rec.enqueued == [] and rec.commits._pending == []


def test_a_failing_withdraw_leaves_the_group_commit_lock_free(rec: Recorded) -> None:
    """组提交的加锁改成不经 ``with`` 的写法：临界区里抛出时锁照样放开（撤回一项从没排进来的 Pending）。"""
    with pytest.raises(ValueError):
        rec.commits.withdraw(Pending(None))
    assert not rec.commits._lock.locked()


def _start_thread_style(write: WriteThrough, machine: StateMachine) -> None:
    """starting 与 running 经监听器写穿（执行槽上的写法）；之后的迁移由测试自己交出（sync / sync_later），
    监听器不再写。"""
    listening = [True]

    def listener(snapshot: TaskSnapshot, record: Transition) -> None:
        if listening[0]:
            write.on_transition(machine, snapshot, record)

    machine.add_listener(listener)
    machine.mark_starting(executor="thread")
    machine.mark_running()
    listening[0] = False


def test_deferred_running_is_only_registered_not_queued_in_the_group_commit(rec: Recorded) -> None:
    """running 推迟写时只登记（``state.lazy`` 是 SaveRequest）、不排进组提交：别的任务的提交不捎它，存储里仍是
    starting；终态那次写连同它的记录一起落库，组提交的批数只多终态那一次（main 上排进组提交再撤回，失败）。"""
    write = rec.write
    machine = rec.queued("t")
    other = rec.queued("u")
    _start_thread_style(write, machine)
    state = write._tasks["t"]
    assert isinstance(state, _TaskState) and isinstance(state.lazy, SaveRequest)
    assert rec.commits._pending == [] and rec.enqueued == []
    with other.lock:  # 别的任务的一次提交：不捎带 t 的 running
        other.mark_starting(executor="thread")
        write.sync(other)
    stored = rec.store.get("t")
    assert stored is not None and stored.status is S.STARTING
    before = rec.commits.batches
    with machine.lock:
        machine.mark_succeeded()
        finish = write.sync_later(machine, machine.transitions[-1])
        assert finish is not None and finish() is True
    assert rec.commits.batches == before + 1
    assert [t.to_status for t in rec.store.history("t")] == [S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED]
    assert write._lazy == {} and write._tasks["t"] == machine.snapshot.status_version


def test_flush_lazy_writes_every_due_running_in_one_commit(rec: Recorded) -> None:
    """到点的推迟写 running 由后台循环一次提交写完（先全部排进组提交，第一个 sync 捎上其余），而不是一个任务
    一次提交；之后其中一个落终态照常交出、历史没有空洞。"""
    write = rec.write
    machines = [rec.queued(f"t{i}") for i in range(5)]
    for machine in machines:
        _start_thread_style(write, machine)
    assert set(write._lazy) == {f"t{i}" for i in range(5)}
    write._lazy = {task_id: (0.0, machine) for task_id, (_, machine) in write._lazy.items()}  # 全部到点
    before = rec.commits.batches
    write.flush_lazy()
    assert rec.commits.batches == before + 1, "同时到点的 running 应当一次提交写完"
    assert write._lazy == {} and rec.commits._pending == []
    for machine in machines:
        stored = rec.store.get(machine.task_id)
        assert stored is not None and stored.status is S.RUNNING
        assert write._tasks[machine.task_id] == machine.snapshot.status_version
    first = machines[0]
    with first.lock:
        first.mark_succeeded()
        finish = write.sync_later(first, first.transitions[-1])
        assert finish is not None and finish() is True
    assert [t.to_status for t in rec.store.history("t0")] == [S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED]


def test_a_running_the_loop_queued_is_withdrawn_by_the_terminal_write(rec: Recorded) -> None:
    """后台循环把到点的 running 排进组提交之后、写它之前任务落了终态：交出终态时撤回排着的那一项、连同它的
    记录一起写（与别的写者还没捎走它时相同），只一次提交。"""
    write = rec.write
    machine = rec.queued("t")
    _start_thread_style(write, machine)
    state = write._tasks["t"]
    assert isinstance(state, _TaskState) and isinstance(state.lazy, SaveRequest)
    with machine.lock:  # flush_lazy 的第一步：排进组提交
        state.lazy = rec.commits.enqueue(state.lazy)
    before = rec.commits.batches
    with machine.lock:
        machine.mark_succeeded()
        finish = write.sync_later(machine, machine.transitions[-1])
        assert finish is not None and finish() is True
    assert rec.commits.batches == before + 1 and rec.commits._pending == []
    assert [t.to_status for t in rec.store.history("t")] == [S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED]
    assert write._lazy == {}
