"""内存存储的行：save 之间不读时，存储自己的旁路字段与配方怎么留下来（``stores/memory`` 的 ``_Row._sides``）。

save 只记下存储自己的那组值、不再逐次比较，比较挪到读的时候做（issue 17）。这里钉住的是"连着几次 save、
中间没人读"的情形：契约套件的用例多半每次 save 之后就读一次，读会把行合成、清掉记下的值。
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from chongming_task import InMemoryTaskStore
from chongming_task.core.state_machine import StateMachine
from chongming_task.models import Failure, FailureKind, Progress, TaskSnapshot, Transition
from chongming_task.states import TaskStatus
from chongming_task.storage import TaskQuery

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _machine(store: InMemoryTaskStore, task_id: str) -> StateMachine:
    machine = StateMachine.create(
        task_id, "job", lease_owner="node-a", lease_until=T0 + timedelta(seconds=30)
    )
    machine.mark_queued()
    store._create_direct(machine.snapshot, machine.packed_transitions())
    return machine


def _write_next(store: InMemoryTaskStore, machine: StateMachine, snapshot: TaskSnapshot) -> None:
    """写穿的"正好落后一条"那次写（同 WriteThrough.on_transition 的快路径）。"""
    record: Transition = machine.transitions[-1]
    store._save_next(snapshot, record, machine.last_packed())


def test_saves_in_a_row_without_reads_keep_the_stores_side_fields() -> None:
    store = InMemoryTaskStore()
    machine = _machine(store, "t1")
    # 存储里的旁路字段被 touch 改过：状态机手里那份从此是过时的。
    beat = T0 + timedelta(seconds=5)
    store.touch(
        "t1", progress=Progress(done=3, total=9), heartbeat_at=beat, lease_until=T0 + timedelta(seconds=60)
    )
    with machine.lock:
        _write_next(store, machine, machine.mark_starting(executor="thread"))
        _write_next(store, machine, machine.mark_running())
        # 终态那次：调用方的心跳是另一个时刻，进度还是空的——都不采用。
        _write_next(
            store, machine, machine.mark_succeeded_with_heartbeat({"rows": 3}, T0 + timedelta(seconds=9))
        )
    got = store.get("t1")
    assert got is not None
    assert (got.status, got.status_version, got.executor) == (TaskStatus.SUCCEEDED, 4, "thread")
    assert got.outcome == {"rows": 3}
    assert got.progress == Progress(done=3, total=9)
    assert got.last_heartbeat_at == beat
    assert (got.lease_owner, got.lease_until) == ("node-a", T0 + timedelta(seconds=60))
    assert [r.version for r in store.history("t1")] == [1, 2, 3, 4]


def test_an_equal_but_not_identical_side_value_is_replaced_by_the_stores_own() -> None:
    store = InMemoryTaskStore()
    machine = _machine(store, "t2")
    stored_until = machine.snapshot.lease_until
    assert stored_until is not None
    # 同一时刻、另一个时区：按值相等，却不是存储里那一个——save 不采用调用方这份。
    other = stored_until.astimezone(timezone(timedelta(hours=8)))
    with machine.lock:
        starting = machine.mark_starting(executor="thread")
        store.save(starting.evolve(lease_until=other), expect_version=1, transitions=machine.transitions[-1:])
        _write_next(store, machine, machine.mark_running())
    got = store.get("t2")
    assert got is not None and got.status is TaskStatus.RUNNING
    assert got.lease_until == stored_until
    assert got.lease_until.utcoffset() == timedelta(0)


def test_the_outcome_is_the_last_saves_even_when_side_fields_are_carried_over() -> None:
    store = InMemoryTaskStore()
    machine = _machine(store, "t3")
    store.touch("t3", progress=Progress(done=1, total=2))
    with machine.lock:
        _write_next(store, machine, machine.mark_starting(executor="thread"))
        running = machine.mark_running()
        _write_next(store, machine, running)
    # 同一版本、不带迁移记录地只改 outcome（存储不查转移表）：容器、标量、空、再容器，中间没人读。
    for outcome in ([1, 2], "done", None, {"k": [3]}):
        store.save(running.evolve(outcome=outcome), expect_version=3)
    with machine.lock:
        _write_next(store, machine, machine.mark_succeeded(outcome=7))
    got = store.get("t3")
    assert got is not None
    assert (got.status, got.outcome, got.progress) == (TaskStatus.SUCCEEDED, 7, Progress(done=1, total=2))
    # 查询与统计读的是同一份合成之后的快照。
    assert store.query(TaskQuery(statuses=frozenset({TaskStatus.SUCCEEDED}))) == [got]
    assert store.stats().counts[TaskStatus.SUCCEEDED] == 1


def test_a_container_outcome_saved_last_reads_back_as_a_fresh_copy() -> None:
    store = InMemoryTaskStore()
    machine = _machine(store, "t4")
    store.touch("t4", heartbeat_at=T0 + timedelta(seconds=1))
    result = {"rows": [1, 2]}
    with machine.lock:
        _write_next(store, machine, machine.mark_starting(executor="thread"))
        _write_next(store, machine, machine.mark_running())
        _write_next(store, machine, machine.mark_succeeded(outcome=result))
    result["rows"].append(3)  # 调用方改它碰不到存储里的那一份
    got = store.get("t4")
    assert got is not None
    assert got.outcome == {"rows": [1, 2]}
    assert got.last_heartbeat_at == T0 + timedelta(seconds=1)


def test_changes_equal_to_the_last_checked_ones_are_still_refused_with_a_bad_priority() -> None:
    """有变的那组可存储字段值与上一次查过的相等时不再逐项查（``_save_next`` 的 ``_last_changed``）；但
    priority 不是上一版的那个对象时照样查，不合法的照样拒绝、什么也不写。"""
    import pytest

    from chongming_task.errors import ConfigurationError

    store = InMemoryTaskStore()
    first, second = _machine(store, "p1"), _machine(store, "p2")
    with first.lock:
        _write_next(store, first, first.mark_starting(executor="thread"))  # 有变的一组，查过
    with second.lock:
        starting = second.mark_starting(executor="thread")
        for bad in (True, 5.0):  # 都"等于"一个整数，却不是合法的 priority（绕过构造校验塞进快照）
            with pytest.raises(ConfigurationError):
                store._save_next(starting.evolve(priority=bad), second.transitions[-1], second.last_packed())
        got = store.get("p2")
        assert got is not None and got.status is TaskStatus.QUEUED
        with pytest.raises(ConfigurationError):
            store._save_next(
                starting.evolve(executor="thr\x00ead"), second.transitions[-1], second.last_packed()
            )
        _write_next(store, second, starting)
    got = store.get("p2")
    assert got is not None and (got.status, got.executor) == (TaskStatus.STARTING, "thread")


def test_a_conditional_save_sees_the_stores_lease_not_the_callers() -> None:
    """``save(lease_expired_before=...)``（reconcile 判 lost 的写）看的是存储里的租约：touch 续过的、写穿之后
    只记在行里"存储自己的那组值"里、还没人读过合成的，也照样算。"""
    import pytest

    from chongming_task.errors import ConcurrencyConflict

    store = InMemoryTaskStore()
    machine = _machine(store, "l1")  # 调用方手里的租约到 T0 + 30 秒
    store.touch("l1", lease_owner="node-a", lease_until=T0 + timedelta(seconds=100))
    with machine.lock:
        _write_next(store, machine, machine.mark_starting(executor="thread"))
        lost = machine.mark_lost(reason="节点失联")
    with pytest.raises(ConcurrencyConflict):
        store.save(
            lost,
            expect_version=2,
            transitions=machine.transitions[-1:],
            lease_expired_before=T0 + timedelta(seconds=50),
        )
    got = store.get("l1")
    assert got is not None and got.status is TaskStatus.STARTING
    # 租约真的过期了（早于给定时刻）才写得进去。
    store.save(
        lost,
        expect_version=2,
        transitions=machine.transitions[-1:],
        lease_expired_before=T0 + timedelta(seconds=101),
    )
    got = store.get("l1")
    assert got is not None and got.status is TaskStatus.LOST
    assert got.lease_until == T0 + timedelta(seconds=100)


def _long_history(store: InMemoryTaskStore, task_id: str, rounds: int) -> StateMachine:
    """写穿一串迁移：每轮 starting → running → failed(可重试) → retry 回到 queued（每轮四条）。"""
    machine = StateMachine.create(task_id, "job", max_attempts=rounds + 1)
    machine.mark_queued()
    store._create_direct(machine.snapshot, machine.packed_transitions())
    with machine.lock:
        for _ in range(rounds):
            _write_next(store, machine, machine.mark_starting(executor="thread"))
            _write_next(store, machine, machine.mark_running())
            _write_next(store, machine, machine.mark_failed(failure=Failure(FailureKind.EXCEPTION, "boom")))
            _write_next(store, machine, machine.retry())
    return machine


def test_a_write_through_history_reads_back_whole_before_and_after_it_outgrows_a_tuple() -> None:
    # 行的历史平常是状态机那个连续的元组，超过 32 条、或有乱序 / 删除时换成 dict（stores/memory 的 _Row）。
    # 两种形状读回来都是完整、按版本升序的历史，与状态机的逐条相等；已有的版本保留先到的那条。
    store = InMemoryTaskStore()
    for task_id, rounds in (("short", 2), ("long", 10)):
        machine = _long_history(store, task_id, rounds)
        expected = list(machine.transitions)
        assert len(expected) == 1 + 4 * rounds
        assert store.history(task_id) == expected
        # 同一版本再写一次（另一个写者抢先记下过）：保留先到的那条
        late = expected[-1]
        store.append(
            [Transition(task_id, late.from_status, late.to_status, "other", None, None, late.version, T0)]
        )
        assert store.history(task_id) == expected
        # 再往后接着写穿，照样接得上（dict 形状的行也走 _save_next）
        with machine.lock:
            _write_next(store, machine, machine.mark_starting(executor="thread"))
        assert store.history(task_id) == list(machine.transitions)
        got = store.get(task_id)
        assert got is not None and got.status is TaskStatus.STARTING
        assert got.status_version == len(machine.transitions)


def test_a_created_task_with_a_gap_in_its_history_keeps_every_record() -> None:
    # _create_direct 交来的紧凑记录版本不连续时（只凭快照重建的状态机、再走几步）不能当元组存：
    # 按版本记进 dict。
    store = InMemoryTaskStore()
    machine = StateMachine.create("gap", "job")
    machine.mark_queued()
    packed = machine.packed_transitions()
    later = (*packed[0][:5], 3, packed[0][6])
    snapshot = machine.snapshot.evolve(status_version=3)
    store._create_direct(snapshot, (packed[0], later))
    assert [r.version for r in store.history("gap")] == [1, 3]
