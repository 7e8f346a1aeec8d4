"""StateMachine：15×15 的穷举、§11.3 的每条守卫、错误消息、retry/reset/force、重建与监听器。

穷举的思路：对每个源状态，用一串合法动作把一台全新的状态机开到那里；再对每个目标状态调用
"走向它的那个自然动作"。表里有这条边 → 必须成功并留下一条记录；没有 → 必须抛
InvalidTransition，且状态、版本、历史一律不变。表只查 ``TRANSITIONS``，测试里不另写一份。
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from chongming_task.core.state_machine import (
    AUDITED_TRIGGERS,
    TRIGGER_FORCE,
    TRIGGER_PAUSE_ABORTED,
    TRIGGER_RESET,
    TRIGGER_RETRY,
    StateMachine,
)
from chongming_task.errors import AttemptsExhausted, ConfigurationError, InvalidTransition
from chongming_task.models import Failure, FailureKind, Progress, TaskSnapshot, Transition
from chongming_task.states import (
    NON_TERMINAL_STATUSES,
    RETRYABLE_FROM,
    TERMINAL_STATUSES,
    TRANSITIONS,
    TaskStatus,
)
from chongming_task.testing import FakeClock

S = TaskStatus
ALL = list(TaskStatus)
BOOM = Failure(FailureKind.EXCEPTION, "boom", retryable=True, exc_type="RuntimeError")


# -- helpers -------------------------------------------------------------------------------------------


def fresh(clock: FakeClock | None = None, max_attempts: int = 3) -> StateMachine:
    return StateMachine.create("t1", "抽取", max_attempts=max_attempts, clock=clock or FakeClock())


def _retry_at(m: StateMachine) -> Any:
    return m.clock.now() + timedelta(seconds=5)


# 目标状态 → (自然动作, 该动作的默认 trigger)。PENDING 没有 mark_* 动作：表里没有任何边通向它，
# 回到 pending 只能走 reset()（审计过的显式入口），见 test_no_action_leads_back_to_pending。
ACTIONS: dict[TaskStatus, tuple[Callable[[StateMachine], TaskSnapshot], str]] = {
    S.BLOCKED: (lambda m: m.mark_blocked(), "scheduler:blocked"),
    S.QUEUED: (lambda m: m.mark_queued(), "scheduler:queued"),
    S.STARTING: (lambda m: m.mark_starting(executor="thread"), "scheduler:dispatched"),
    S.RUNNING: (lambda m: m.mark_running(), "executor:launched"),
    S.PAUSING: (lambda m: m.mark_pausing(), "control:pause"),
    S.PAUSED: (lambda m: m.mark_paused(), "runtime:paused"),
    S.RETRY_WAIT: (
        lambda m: m.mark_retry_wait(failure=BOOM, retry_at=_retry_at(m)),
        "runtime:retry_scheduled",
    ),
    S.STOPPING: (lambda m: m.mark_stopping(reason="发布窗口"), "control:stop"),
    S.SUCCEEDED: (lambda m: m.mark_succeeded(outcome={"rows": 42}), "executor:returned"),
    S.FAILED: (lambda m: m.mark_failed(failure=BOOM), "executor:failed"),
    S.STOPPED: (lambda m: m.mark_stopped(), "runtime:stopped"),
    S.CANCELLED: (lambda m: m.mark_cancelled(), "orchestrator:cancelled"),
    S.SKIPPED: (lambda m: m.mark_skipped(), "orchestrator:skipped"),
    S.LOST: (lambda m: m.mark_lost(), "runtime:lost"),
}

# 把全新状态机开到每个源状态的合法路径（只用公开动作）。
PATHS: dict[TaskStatus, tuple[TaskStatus, ...]] = {
    S.PENDING: (),
    S.BLOCKED: (S.BLOCKED,),
    S.QUEUED: (S.QUEUED,),
    S.STARTING: (S.QUEUED, S.STARTING),
    S.RUNNING: (S.QUEUED, S.STARTING, S.RUNNING),
    S.PAUSING: (S.QUEUED, S.STARTING, S.RUNNING, S.PAUSING),
    S.PAUSED: (S.QUEUED, S.STARTING, S.RUNNING, S.PAUSING, S.PAUSED),  # 就地暂停
    S.RETRY_WAIT: (S.QUEUED, S.STARTING, S.RUNNING, S.RETRY_WAIT),
    S.STOPPING: (S.QUEUED, S.STARTING, S.RUNNING, S.STOPPING),
    S.SUCCEEDED: (S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED),
    S.FAILED: (S.QUEUED, S.STARTING, S.RUNNING, S.FAILED),
    S.STOPPED: (S.QUEUED, S.STARTING, S.RUNNING, S.STOPPING, S.STOPPED),
    S.CANCELLED: (S.QUEUED, S.CANCELLED),
    S.SKIPPED: (S.SKIPPED,),
    S.LOST: (S.QUEUED, S.STARTING, S.RUNNING, S.LOST),
}


def drive_to(status: TaskStatus, clock: FakeClock | None = None, max_attempts: int = 3) -> StateMachine:
    clock = clock or FakeClock()
    machine = fresh(clock, max_attempts)
    for step in PATHS[status]:
        clock.advance(1)
        ACTIONS[step][0](machine)
    assert machine.status is status
    return machine


def assert_refused(
    machine: StateMachine, action: Callable[[StateMachine], Any], target: TaskStatus, trigger: str
) -> InvalidTransition:
    before_snapshot = machine.snapshot
    before_history = machine.transitions
    with pytest.raises(InvalidTransition) as info:
        action(machine)
    error = info.value
    assert error.from_status is before_snapshot.status
    assert error.to_status is target
    assert error.action == trigger
    assert error.allowed == TRANSITIONS[before_snapshot.status]
    # 拒绝就是什么都没发生：同一个快照对象、同样的历史。
    assert machine.snapshot is before_snapshot
    assert machine.transitions == before_history
    return error


# -- the table itself ----------------------------------------------------------------------------------


def test_fifteen_statuses_with_exact_values() -> None:
    assert [s.value for s in TaskStatus] == [
        "pending",
        "blocked",
        "queued",
        "starting",
        "running",
        "pausing",
        "paused",
        "retry_wait",
        "stopping",
        "succeeded",
        "failed",
        "stopped",
        "cancelled",
        "skipped",
        "lost",
    ]


def test_table_covers_every_status_and_terminals_are_explicit_empty_frozensets() -> None:
    assert set(TRANSITIONS) == set(TaskStatus)
    terminals = {S.SUCCEEDED, S.FAILED, S.STOPPED, S.CANCELLED, S.SKIPPED, S.LOST}
    assert terminals == TERMINAL_STATUSES
    for status in TERMINAL_STATUSES:
        assert type(TRANSITIONS[status]) is frozenset
        assert TRANSITIONS[status] == frozenset()
        assert status.is_terminal
    for status in NON_TERMINAL_STATUSES:
        assert type(TRANSITIONS[status]) is frozenset
        assert TRANSITIONS[status], f"{status} 不是终态，却没有出边"
        assert not status.is_terminal
    assert len(NON_TERMINAL_STATUSES) == 9


def test_table_is_read_only() -> None:
    with pytest.raises(TypeError):
        TRANSITIONS[S.SUCCEEDED] = frozenset({S.RUNNING})  # type: ignore[index]


def test_table_matches_guide_section_9_2() -> None:
    # 用户指南 §11.2 的原文，逐行解析后与 TRANSITIONS 比较：表只在 states.py 声明，这里核对的是规格。
    guide = """
    PENDING:    {BLOCKED, QUEUED, SKIPPED, CANCELLED, STOPPED}
    BLOCKED:    {QUEUED, SKIPPED, CANCELLED, STOPPED}
    QUEUED:     {STARTING, PAUSED, SKIPPED, STOPPED, CANCELLED}
    STARTING:   {RUNNING, RETRY_WAIT, PAUSING, STOPPING, FAILED, CANCELLED, LOST}
    RUNNING:    {SUCCEEDED, FAILED, RETRY_WAIT, PAUSING, STOPPING, CANCELLED, LOST}
    PAUSING:    {PAUSED, RUNNING, STOPPING, FAILED, CANCELLED, LOST}
    PAUSED:     {QUEUED, RUNNING, STOPPED, CANCELLED}
    RETRY_WAIT: {STARTING, QUEUED, PAUSED, STOPPED, FAILED, CANCELLED}
    STOPPING:   {STOPPED, SUCCEEDED, FAILED, LOST}
    SUCCEEDED / FAILED / STOPPED / CANCELLED / SKIPPED / LOST:  {}
    """
    parsed: dict[TaskStatus, frozenset[TaskStatus]] = {}
    for line in guide.strip().splitlines():
        left, right = line.split(":", 1)
        inner = right.strip().strip("{}").strip()
        targets = frozenset(S[name.strip()] for name in inner.split(",")) if inner else frozenset()
        for name in left.split("/"):
            parsed[S[name.strip()]] = targets
    assert parsed == dict(TRANSITIONS)


def _status_members_in(node: ast.AST) -> int:
    return sum(
        1
        for sub in ast.walk(node)
        if isinstance(sub, ast.Attribute) and sub.attr in TaskStatus.__members__ and sub.attr.isupper()
    )


def test_nothing_re_encodes_the_transition_table() -> None:
    # 一张"状态 → 状态集合"的字典字面量（键是 3 个以上的状态成员、值是集合）只允许出现在 core/statuses.py
    # （公开路径 chongming_task.states 只是它的转出）。
    root = pathlib.Path(__file__).resolve().parents[2]
    offenders: list[str] = []
    for path in root.glob("*/src/**/*.py"):
        if path.name == "statuses.py" and path.parent.name == "core":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Dict) or len(node.keys) < 3:
                continue
            status_keys = [k for k in node.keys if k is not None and _status_members_in(k) == 1]
            set_values = [
                v
                for v in node.values
                if isinstance(v, ast.Set) or (isinstance(v, ast.Call) and _status_members_in(v) > 0)
            ]
            if len(status_keys) >= 3 and len(set_values) >= 3:
                offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, f"这些地方重新编码了转移表，请改为查 chongming_task.states.TRANSITIONS：{offenders}"


def test_state_machine_consults_the_same_table_objects() -> None:
    from chongming_task.core import state_machine

    for status, targets in TRANSITIONS.items():
        assert state_machine._TABLE[status] is targets


# -- exhaustive 15×15 ----------------------------------------------------------------------------------


def test_drive_to_reaches_every_status() -> None:
    for status in TaskStatus:
        machine = drive_to(status)
        assert machine.snapshot.status_version == len(PATHS[status]) == len(machine.transitions)


@pytest.mark.parametrize("source", ALL, ids=lambda s: s.value)
@pytest.mark.parametrize("target", [s for s in ALL if s is not S.PENDING], ids=lambda s: s.value)
def test_every_pair_through_the_public_api(source: TaskStatus, target: TaskStatus) -> None:
    clock = FakeClock()
    machine = drive_to(source, clock)
    action, trigger = ACTIONS[target]
    clock.advance(1)
    if target in TRANSITIONS[source]:
        assert machine.can(target)
        version = machine.snapshot.status_version
        snapshot = action(machine)
        assert snapshot is machine.snapshot
        assert snapshot.status is target
        assert snapshot.status_version == version + 1
        record = machine.transitions[-1]
        assert (record.from_status, record.to_status, record.trigger) == (source, target, trigger)
        assert record.version == version + 1
        assert record.at == clock.now()
        assert record.task_id == "t1"
        if target in TERMINAL_STATUSES:
            assert snapshot.finished_at == clock.now()
        else:
            assert snapshot.finished_at is None
    else:
        assert not machine.can(target)
        assert_refused(machine, action, target, trigger)


@pytest.mark.parametrize("source", ALL, ids=lambda s: s.value)
def test_no_action_leads_back_to_pending(source: TaskStatus) -> None:
    assert S.PENDING not in TRANSITIONS[source]
    machine = drive_to(source)
    assert not machine.can(S.PENDING)
    assert not any(name in ("mark_pending", "mark_created") for name in dir(machine))
    if source in TERMINAL_STATUSES:
        machine.reset(confirm=True, actor="ops", reason="重跑")
        assert machine.status is S.PENDING
        assert machine.transitions[-1].trigger == TRIGGER_RESET
    else:
        assert_refused(machine, lambda m: m.reset(confirm=True), S.PENDING, TRIGGER_RESET)


def test_pausing_to_running_has_two_actions() -> None:
    for action, trigger in (
        (lambda m: m.abort_pause(), TRIGGER_PAUSE_ABORTED),
        (lambda m: m.mark_running(), "executor:launched"),
    ):
        machine = drive_to(S.PAUSING)
        action(machine)
        record = machine.transitions[-1]
        assert (record.from_status, record.to_status, record.trigger) == (S.PAUSING, S.RUNNING, trigger)


# -- guards of §11.3 -----------------------------------------------------------------------------------


def test_mark_running_needs_started_at_queued_pause_resumes_to_queued() -> None:
    machine = drive_to(S.QUEUED)
    machine.mark_paused()
    assert machine.snapshot.started_at is None
    assert not machine.can(S.RUNNING)
    assert machine.can(S.QUEUED)
    error = assert_refused(machine, lambda m: m.mark_running(), S.RUNNING, "executor:launched")
    assert "started_at" in str(error)
    assert error.detail is not None and "queued" in error.detail
    machine.mark_queued()  # 正确的恢复目标
    assert machine.status is S.QUEUED


def test_mark_running_after_retry_wait_pause_is_refused() -> None:
    # retry_wait 时 started_at 还记着刚失败的那次尝试；从 retry_wait 暂停的任务没有在跑的载体，
    # 恢复到 running 会凭空造出一个"正在运行"的快照。
    machine = drive_to(S.RETRY_WAIT)
    assert machine.snapshot.started_at is not None
    machine.mark_paused()
    assert machine.snapshot.started_at is None
    assert not machine.can(S.RUNNING)
    assert_refused(machine, lambda m: m.mark_running(), S.RUNNING, "executor:launched")


def test_mark_running_after_retry_and_queued_pause_is_refused() -> None:
    machine = drive_to(S.FAILED)
    machine.retry(actor="ops", reason="重跑")
    assert machine.snapshot.started_at is None
    machine.mark_paused()
    assert_refused(machine, lambda m: m.mark_running(), S.RUNNING, "executor:launched")


def test_in_place_pause_resumes_to_running_and_keeps_started_at() -> None:
    clock = FakeClock()
    machine = drive_to(S.PAUSED, clock)
    started = machine.snapshot.started_at
    assert started is not None
    assert machine.can(S.RUNNING)
    clock.advance(3)
    machine.mark_running()
    assert machine.status is S.RUNNING
    assert machine.snapshot.started_at == started


def test_paused_to_queued_clears_started_at() -> None:
    machine = drive_to(S.PAUSED)
    machine.mark_queued()
    assert machine.snapshot.started_at is None
    assert machine.snapshot.queued_at == machine.clock.now()


@pytest.mark.parametrize("source", [s for s in ALL if s is not S.PAUSING], ids=lambda s: s.value)
def test_abort_pause_only_from_pausing(source: TaskStatus) -> None:
    machine = drive_to(source)
    error = assert_refused(machine, lambda m: m.abort_pause(), S.RUNNING, TRIGGER_PAUSE_ABORTED)
    assert error.detail == "abort_pause() 只能从 pausing 出发"


def test_abort_pause_records_pause_aborted() -> None:
    machine = drive_to(S.PAUSING)
    machine.abort_pause(reason="窗口内没到检查点")
    record = machine.transitions[-1]
    assert record.trigger == "runtime:pause_aborted"
    assert record.reason == "窗口内没到检查点"
    assert machine.snapshot.started_at is not None


def test_mark_starting_budget_raises_attempts_exhausted() -> None:
    clock = FakeClock()
    machine = fresh(clock, max_attempts=2)
    machine.mark_queued()
    for expected_attempt in (1, 2):
        assert machine.can(S.STARTING)
        machine.mark_starting()
        assert machine.snapshot.attempt == expected_attempt
        machine.mark_running()
        machine.mark_retry_wait(failure=BOOM, retry_at=clock.now())
    # 表里有 retry_wait → starting，但预算用完了：这是预算问题，不是状态表问题。
    assert S.STARTING in TRANSITIONS[S.RETRY_WAIT]
    assert not machine.can(S.STARTING)
    before = machine.snapshot
    with pytest.raises(AttemptsExhausted) as info:
        machine.mark_starting()
    assert not isinstance(info.value, InvalidTransition)
    assert "max_attempts=2" in str(info.value)
    assert "retry()" in str(info.value)
    assert machine.snapshot is before
    assert len(machine.transitions) == before.status_version
    machine.mark_failed(failure=BOOM)


def test_mark_starting_checks_the_table_before_the_budget() -> None:
    machine = drive_to(S.SUCCEEDED, max_attempts=1)
    assert_refused(machine, lambda m: m.mark_starting(), S.STARTING, "scheduler:dispatched")


def test_mark_starting_stamps_attempt_and_clears_previous_failure() -> None:
    clock = FakeClock()
    machine = drive_to(S.RETRY_WAIT, clock)
    assert machine.snapshot.failure == BOOM
    assert machine.snapshot.retry_at is not None
    clock.advance(7)
    machine.mark_starting(executor="process")
    snap = machine.snapshot
    assert snap.attempt == 2
    assert snap.started_at == clock.now()
    assert snap.failure is None and snap.retry_at is None
    assert snap.executor == "process"


@pytest.mark.parametrize(
    ("actor", "reason"),
    [("", "核对过"), ("   ", "核对过"), ("ops", ""), ("ops", "  "), (None, "核对过"), ("ops", None)],
)
def test_force_transition_requires_non_blank_actor_and_reason(actor: Any, reason: Any) -> None:
    machine = drive_to(S.LOST)
    before = machine.snapshot
    with pytest.raises(ConfigurationError, match="actor 与 reason"):
        machine.force_transition(S.SUCCEEDED, actor=actor, reason=reason)
    assert machine.snapshot is before


def test_force_transition_is_recorded_as_such() -> None:
    clock = FakeClock()
    machine = drive_to(S.LOST, clock)
    clock.advance(60)
    machine.force_transition(S.SUCCEEDED, actor="值班-张三", reason="人工核对：副作用已完成")
    record = machine.transitions[-1]
    assert (record.from_status, record.to_status) == (S.LOST, S.SUCCEEDED)
    assert record.trigger == TRIGGER_FORCE == "control:force"
    assert record.actor == "值班-张三"
    assert record.reason == "人工核对：副作用已完成"
    assert record.version == machine.snapshot.status_version
    assert machine.snapshot.finished_at == clock.now()


def test_force_transition_can_jump_anywhere_but_not_in_place() -> None:
    for source in TaskStatus:
        for target in TaskStatus:
            machine = drive_to(source)
            if target is source:
                with pytest.raises(ConfigurationError, match="无变化"):
                    machine.force_transition(target, actor="ops", reason="测试")
                continue
            machine.force_transition(target, actor="ops", reason="测试")
            assert machine.status is target
            assert (machine.snapshot.finished_at is None) == (target not in TERMINAL_STATUSES)


def test_force_transition_accepts_status_values_and_refuses_unknown() -> None:
    machine = drive_to(S.LOST)
    machine.force_transition("failed", actor="ops", reason="核对")  # type: ignore[arg-type]
    assert machine.status is S.FAILED
    with pytest.raises(ConfigurationError, match="未知的目标状态"):
        machine.force_transition("done", actor="ops", reason="核对")  # type: ignore[arg-type]


@pytest.mark.parametrize("source", [S.STARTING, S.RUNNING, S.PAUSING, S.STOPPING], ids=lambda s: s.value)
def test_mark_lost_always_carries_a_failure(source: TaskStatus) -> None:
    machine = drive_to(source)
    machine.mark_lost()
    failure = machine.snapshot.failure
    assert failure is not None
    assert failure.kind is FailureKind.LOST
    assert failure.retryable is True
    assert failure.message


def test_mark_lost_keeps_the_given_failure_and_reason() -> None:
    machine = drive_to(S.STOPPING)
    given = Failure(FailureKind.LOST, "优雅窗口用尽，线程无法强杀", retryable=True)
    machine.mark_lost(failure=given, reason="graceful_stop 用尽")
    assert machine.snapshot.failure is given
    assert machine.transitions[-1].reason == "graceful_stop 用尽"


def test_mark_lost_default_failure_uses_reason() -> None:
    machine = drive_to(S.RUNNING)
    machine.mark_lost(reason="租约过期")
    failure = machine.snapshot.failure
    assert failure is not None and failure.message == "租约过期"


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.mark_failed(failure=None),
        lambda m: m.mark_failed(failure="boom"),
        lambda m: m.mark_retry_wait(failure=None, retry_at=m.clock.now()),
        lambda m: m.mark_lost(failure="boom"),
        lambda m: m.mark_stopped(failure=ValueError("x")),
    ],
)
def test_failure_arguments_must_be_failures(call: Callable[[StateMachine], Any]) -> None:
    machine = drive_to(S.RUNNING)
    before = machine.snapshot
    with pytest.raises(ConfigurationError, match="Failure"):
        call(machine)
    assert machine.snapshot is before


def test_retry_at_must_be_aware() -> None:
    machine = drive_to(S.RUNNING)
    naive = machine.clock.now().replace(tzinfo=None)
    with pytest.raises(ConfigurationError, match="带时区"):
        machine.mark_retry_wait(failure=BOOM, retry_at=naive)
    assert machine.status is S.RUNNING


# -- default failures and outcome fields --------------------------------------------------------------


def test_stop_cancel_skip_default_failures_are_not_retryable() -> None:
    cases = [
        (S.STOPPED, FailureKind.CANCELLED),
        (S.CANCELLED, FailureKind.CANCELLED),
        (S.SKIPPED, FailureKind.CONDITION_FALSE),
    ]
    for status, kind in cases:
        machine = drive_to(status)
        failure = machine.snapshot.failure
        assert failure is not None
        assert failure.kind is kind
        assert failure.retryable is False


def test_stopping_to_succeeded_keeps_the_outcome() -> None:
    machine = drive_to(S.STOPPING)
    machine.mark_succeeded(outcome=17)
    assert machine.status is S.SUCCEEDED
    assert machine.snapshot.outcome == 17
    assert machine.snapshot.failure is None


# -- error message shape ------------------------------------------------------------------------------


def test_guide_example_message_exactly() -> None:
    machine = StateMachine.create("t1", "抽取", max_attempts=3, clock=FakeClock())
    machine.mark_queued()
    machine.mark_starting(executor="thread")
    machine.mark_running()
    machine.mark_succeeded(outcome={"rows": 42})
    with pytest.raises(InvalidTransition) as info:
        machine.mark_running()
    assert (
        str(info.value)
        == "非法状态转移：succeeded -> running；动作 'executor:launched'；当前允许：无（终态）"
    )


def test_message_lists_allowed_targets_in_lifecycle_order() -> None:
    machine = drive_to(S.PAUSED)
    with pytest.raises(InvalidTransition) as info:
        machine.mark_succeeded()
    assert str(info.value) == (
        "非法状态转移：paused -> succeeded；动作 'executor:returned'；"
        "当前允许：queued, running, stopped, cancelled"
    )


def test_message_carries_guard_detail_and_custom_trigger() -> None:
    machine = drive_to(S.QUEUED)
    machine.mark_paused()
    with pytest.raises(InvalidTransition) as info:
        machine.mark_running(trigger="control:resume")
    assert str(info.value) == (
        "非法状态转移：paused -> running；动作 'control:resume'；"
        "当前允许：queued, running, stopped, cancelled；"
        "任务从未启动（缺少 started_at）：排队或重试等待期间暂停的任务，恢复后应回到 queued"
    )
    assert info.value.action == "control:resume"


def test_invalid_transition_without_target() -> None:
    error = InvalidTransition(S.RUNNING, None, "x", TRANSITIONS[S.RUNNING])
    assert "running -> ?" in str(error)


# -- triggers, actors, reasons -------------------------------------------------------------------------


def test_every_action_takes_trigger_actor_reason() -> None:
    machine = fresh()
    machine.mark_queued(trigger="controller:submit", actor="node-a", reason="提交")
    record = machine.transitions[-1]
    assert (record.trigger, record.actor, record.reason) == ("controller:submit", "node-a", "提交")
    machine.mark_stopped(actor="ops", reason="手工干预")
    record = machine.transitions[-1]
    assert (record.trigger, record.actor, record.reason) == ("runtime:stopped", "ops", "手工干预")
    assert machine.snapshot.failure is not None and machine.snapshot.failure.message == "手工干预"


@pytest.mark.parametrize("trigger", [*sorted(AUDITED_TRIGGERS), "", 42])
def test_plain_actions_cannot_spoof_audited_triggers(trigger: Any) -> None:
    machine = fresh()
    with pytest.raises(ConfigurationError, match="trigger"):
        machine.mark_queued(trigger=trigger)
    assert machine.snapshot.status_version == 0


# -- retry / reset ------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", sorted(RETRYABLE_FROM, key=ALL.index), ids=lambda s: s.value)
def test_retry_revives_and_keeps_history_and_attempt(source: TaskStatus) -> None:
    clock = FakeClock()
    machine = drive_to(source, clock)
    assert machine.can_retry
    history = machine.transitions
    attempt = machine.snapshot.attempt
    clock.advance(10)
    machine.retry(actor="ops", reason="上游修好了")
    snap = machine.snapshot
    assert snap.status is S.QUEUED
    assert snap.attempt == attempt
    assert machine.transitions[: len(history)] == history
    record = machine.transitions[-1]
    assert (record.from_status, record.to_status, record.trigger) == (source, S.QUEUED, TRIGGER_RETRY)
    assert (record.actor, record.reason) == ("ops", "上游修好了")
    assert snap.failure is None and snap.outcome is None and snap.finished_at is None
    assert snap.started_at is None and snap.queued_at == clock.now()
    # 复活后真的能再跑一次。
    machine.mark_starting()
    assert machine.snapshot.attempt == attempt + 1


def test_retry_after_exhausted_budget_grants_one_more_attempt() -> None:
    machine = drive_to(S.FAILED, max_attempts=1)
    assert machine.snapshot.attempt == 1
    machine.retry()
    assert machine.snapshot.max_attempts == 2
    machine.mark_starting()
    assert machine.snapshot.attempt == 2


@pytest.mark.parametrize("source", [s for s in ALL if s not in RETRYABLE_FROM], ids=lambda s: s.value)
def test_retry_refused_elsewhere(source: TaskStatus) -> None:
    machine = drive_to(source)
    assert not machine.can_retry
    error = assert_refused(machine, lambda m: m.retry(), S.QUEUED, TRIGGER_RETRY)
    assert error.detail == "retry() 只能从 failed, stopped, cancelled, lost 出发"


@pytest.mark.parametrize("confirm", [False, None, 1, "yes"])
def test_reset_refused_without_explicit_confirm(confirm: Any) -> None:
    machine = drive_to(S.FAILED)
    before = machine.snapshot
    with pytest.raises(ConfigurationError, match="confirm=True"):
        machine.reset(confirm=confirm)
    with pytest.raises(ConfigurationError, match="confirm=True"):
        machine.reset()
    assert machine.snapshot is before


@pytest.mark.parametrize("source", sorted(TERMINAL_STATUSES, key=ALL.index), ids=lambda s: s.value)
def test_reset_discards_attempts_but_keeps_history(source: TaskStatus) -> None:
    machine = drive_to(source)
    machine.update_side(progress=Progress(3, total=10))
    history = machine.transitions
    machine.reset(confirm=True, actor="ops", reason="从头再来")
    snap = machine.snapshot
    assert snap.status is S.PENDING
    assert snap.attempt == 0
    assert snap.failure is None and snap.outcome is None and snap.progress is None
    assert snap.started_at is None and snap.finished_at is None and snap.queued_at is None
    assert snap.status_version == len(history) + 1
    assert machine.transitions[: len(history)] == history
    record = machine.transitions[-1]
    assert (record.from_status, record.to_status, record.trigger) == (source, S.PENDING, TRIGGER_RESET)
    # 回到 pending 之后整条生命周期可以重走。
    machine.mark_queued()
    machine.mark_starting()
    assert machine.snapshot.attempt == 1


# -- can_* ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("source", ALL, ids=lambda s: s.value)
def test_can_helpers_follow_the_table(source: TaskStatus) -> None:
    machine = drive_to(source)
    allowed = TRANSITIONS[source]
    assert machine.can_stop == bool(allowed & {S.STOPPED, S.STOPPING})
    assert machine.can_pause == bool(allowed & {S.PAUSED, S.PAUSING})
    assert machine.can_resume == (source in (S.PAUSED, S.PAUSING))
    assert machine.can_retry == (source in RETRYABLE_FROM)
    # 不占执行资源的任务停止立即生效；占着的经 stopping 缓冲（§11.2 贯穿全表的规则）。
    if source in (S.PENDING, S.BLOCKED, S.QUEUED, S.PAUSED, S.RETRY_WAIT):
        assert S.STOPPED in allowed and S.STOPPING not in allowed
    if source in (S.STARTING, S.RUNNING, S.PAUSING):
        assert S.STOPPING in allowed and S.STOPPED not in allowed


# -- side channel --------------------------------------------------------------------------------------


def test_update_side_never_bumps_version_or_records() -> None:
    clock = FakeClock()
    machine = drive_to(S.RUNNING, clock)
    version = machine.snapshot.status_version
    machine.update_side(
        progress=Progress(5, total=10, unit="批"),
        heartbeat_at=clock.now(),
        pid=4242,
        lease_owner="node-a",
        lease_until=clock.now() + timedelta(seconds=30),
    )
    snap = machine.snapshot
    assert snap.status_version == version
    assert len(machine.transitions) == version
    assert snap.progress == Progress(5, total=10, unit="批")
    assert snap.last_heartbeat_at == clock.now()
    assert (snap.pid, snap.lease_owner) == (4242, "node-a")
    assert machine.update_side() is snap


@pytest.mark.parametrize(
    "kwargs",
    [
        {"progress": 5},
        {"heartbeat_at": "2026-01-01T00:00:00+00:00"},
        {"lease_until": FakeClock().now().replace(tzinfo=None)},
        {"pid": "42"},
    ],
)
def test_update_side_validates(kwargs: dict[str, Any]) -> None:
    machine = drive_to(S.RUNNING)
    with pytest.raises(ConfigurationError):
        machine.update_side(**kwargs)


# -- construction ---------------------------------------------------------------------------------------


def test_create_defaults() -> None:
    clock = FakeClock()
    machine = StateMachine.create(
        "job-1", "抽取", clock=clock, tags={"io"}, priority=5, bucket_key="tenant-A"
    )
    snap = machine.snapshot
    assert snap.status is S.PENDING and snap.status_version == 0 and snap.attempt == 0
    assert snap.max_attempts == 1
    assert snap.created_at == clock.now()
    assert snap.tags == frozenset({"io"}) and snap.priority == 5 and snap.bucket_key == "tenant-A"
    assert machine.transitions == ()
    assert machine.clock is clock


@pytest.mark.parametrize("field", ["status", "status_version", "attempt"])
def test_create_refuses_lifecycle_fields(field: str) -> None:
    with pytest.raises(ConfigurationError, match=field):
        StateMachine.create("t", "n", **{field: S.RUNNING if field == "status" else 3})


@pytest.mark.parametrize(
    ("task_id", "max_attempts"),
    [("", 1), ("a\x00b", 1), ("x" * 513, 1), ("ok", 0), ("ok", True)],
)
def test_create_validates(task_id: str, max_attempts: Any) -> None:
    with pytest.raises(ConfigurationError):
        StateMachine.create(task_id, "n", max_attempts=max_attempts)


def test_rebuild_from_snapshot_and_history_continues_the_trail() -> None:
    clock = FakeClock()
    original = drive_to(S.RUNNING, clock)
    rebuilt = StateMachine.from_snapshot(original.snapshot, original.transitions, clock=clock)
    assert rebuilt.snapshot == original.snapshot
    assert rebuilt.transitions == original.transitions
    rebuilt.mark_succeeded()
    assert rebuilt.transitions[-1].version == 4
    assert rebuilt.transitions_since(3) == (rebuilt.transitions[-1],)
    assert rebuilt.transitions_since(0) == rebuilt.transitions


def test_rebuild_from_snapshot_only_numbers_new_records_correctly() -> None:
    clock = FakeClock()
    original = drive_to(S.RUNNING, clock)
    rebuilt = StateMachine(original.snapshot, clock=clock)
    assert rebuilt.transitions == ()
    assert rebuilt.transitions_since(3) == ()
    rebuilt.mark_succeeded()
    assert [r.version for r in rebuilt.transitions] == [4]
    assert rebuilt.transitions_since(3) == rebuilt.transitions
    assert rebuilt.transitions_since(4) == ()


def _with(record: Transition, **changes: Any) -> Transition:
    data = record.to_dict()
    data.update({k: (v.value if isinstance(v, TaskStatus) else v) for k, v in changes.items()})
    return Transition.from_dict(data)


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        (lambda h: h[:1] + h[2:], "不连续"),  # 中间缺一条
        (lambda h: h[1:], "不连续"),  # 缺了开头
        (lambda h: [h[0], h[0], *h[2:]], "不连续"),  # 重复
        (lambda h: h[:-1], "不一致"),  # 缺了末尾：快照版本对不上
        (lambda h: [*h[:-1], _with(h[-1], to_status=S.PAUSED)], "不一致"),  # 末条状态对不上
        (lambda h: [h[0], _with(h[1], from_status=S.BLOCKED), h[2]], "断裂"),  # 链条接不上
        (lambda h: [*h[:-1], _with(h[-1], task_id="other")], "不属于"),
        (lambda h: [*h[:-1], "not a record"], "Transition"),
    ],
)
def test_rebuild_refuses_gapped_or_inconsistent_history(
    mangle: Callable[[list[Any]], list[Any]], message: str
) -> None:
    original = drive_to(S.RUNNING)
    history = list(original.transitions)
    with pytest.raises(ConfigurationError, match=message):
        StateMachine.from_snapshot(original.snapshot, mangle(history))


def test_rebuild_refuses_non_snapshot() -> None:
    with pytest.raises(ConfigurationError, match="TaskSnapshot"):
        StateMachine({"task_id": "x"})  # type: ignore[arg-type]


def test_shared_lock_is_used() -> None:
    import threading

    lock = threading.RLock()
    machine = StateMachine.create("t", "n", lock=lock, clock=FakeClock())
    assert machine.lock is lock


# -- listeners -----------------------------------------------------------------------------------------


def test_listeners_called_once_per_transition_inside_the_lock() -> None:
    machine = fresh()
    seen: list[tuple[TaskSnapshot, Transition, bool]] = []

    def listener(snapshot: TaskSnapshot, record: Transition) -> None:
        owned = machine.lock._is_owned()  # type: ignore[attr-defined]
        seen.append((snapshot, record, owned))

    machine.add_listener(listener)
    machine.mark_queued()
    machine.mark_starting()
    machine.update_side(pid=1)  # 旁路写入不是迁移，不通知
    machine.mark_running()
    with pytest.raises(InvalidTransition):
        machine.mark_queued()  # 被拒绝的动作也不通知
    machine.mark_lost()
    machine.retry()
    machine.mark_cancelled()
    machine.reset(confirm=True)
    machine.force_transition(S.FAILED, actor="ops", reason="核对")
    assert [r for _, r, _ in seen] == list(machine.transitions)
    assert all(owned for _, _, owned in seen)
    for snapshot, record, _ in seen:
        assert snapshot.status is record.to_status
        assert snapshot.status_version == record.version


def test_failing_listener_does_not_starve_others_and_state_is_committed() -> None:
    machine = fresh()
    calls: list[str] = []

    def broken(snapshot: TaskSnapshot, record: Transition) -> None:
        calls.append("broken")
        raise RuntimeError("store down")

    def healthy(snapshot: TaskSnapshot, record: Transition) -> None:
        calls.append("healthy")

    machine.add_listener(broken)
    machine.add_listener(healthy)
    with pytest.raises(RuntimeError, match="store down"):
        machine.mark_queued()
    assert calls == ["broken", "healthy"]
    assert machine.status is S.QUEUED
    assert len(machine.transitions) == 1
    machine.remove_listener(broken)
    machine.mark_starting()
    assert calls == ["broken", "healthy", "healthy"]


def test_listeners_keep_registration_order_through_add_and_remove() -> None:
    machine = fresh()
    calls: list[str] = []

    def make(name: str) -> Callable[[TaskSnapshot, Transition], None]:
        def listener(snapshot: TaskSnapshot, record: Transition) -> None:
            calls.append(name)
            if name == "a" and record.to_status is S.QUEUED:
                machine.add_listener(make("late"))  # 登记在通知途中：只从下一次迁移起收到

        return listener

    a, b, c = make("a"), make("b"), make("c")
    for listener in (a, b, c):
        machine.add_listener(listener)
    machine.mark_queued()
    assert calls == ["a", "b", "c"]
    machine.remove_listener(b)  # 摘掉中间的
    machine.mark_starting()
    assert calls[3:] == ["a", "c", "late"]
    machine.remove_listener(a)  # 摘掉第一个：其余的顺序不变
    machine.mark_running()
    assert calls[6:] == ["c", "late"]
    with pytest.raises(ValueError):
        machine.remove_listener(a)  # 没登记（或已摘掉）的：同 list.remove
    machine.add_listener(a)  # 再登记排在最后
    machine.mark_succeeded()
    assert calls[8:] == ["c", "late", "a"]


class _Owner:
    def __init__(self, calls: list[str], name: str) -> None:
        self.calls, self.name = calls, name

    def on_transition(self, snapshot: TaskSnapshot, record: Transition) -> None:
        assert snapshot.status is record.to_status
        self.calls.append(self.name)


def test_owner_listener_is_the_bound_method_in_order_and_removal() -> None:
    # add_owner_listener(o, f) 与 add_listener(o.f) 一样：同样的顺序、同样能用 o.f 摘掉——只是不常驻绑定方法
    machine = fresh()
    calls: list[str] = []
    first, late = _Owner(calls, "first"), _Owner(calls, "late")

    def plain(snapshot: TaskSnapshot, record: Transition) -> None:
        calls.append("plain")

    machine.add_owner_listener(first, _Owner.on_transition)
    machine.add_listener(plain)
    machine.add_owner_listener(late, _Owner.on_transition)  # 不是第一个：退回普通登记，仍排在最后
    machine.mark_queued()
    assert calls == ["first", "plain", "late"]
    with pytest.raises(ValueError):
        machine.remove_listener(_Owner(calls, "other").on_transition)  # 别的 owner 的同名方法不相等
    machine.remove_listener(first.on_transition)
    machine.mark_starting()
    assert calls[3:] == ["plain", "late"]
    machine.remove_listener(late.on_transition)
    machine.remove_listener(plain)
    machine.add_owner_listener(late, _Owner.on_transition)  # 摘空之后又能占第一个
    machine.mark_running()
    assert calls[5:] == ["late"]
    with pytest.raises(ConfigurationError, match="owner 不能是 None"):
        machine.add_owner_listener(None, _Owner.on_transition)


def test_owner_listener_error_does_not_starve_others() -> None:
    machine = fresh()
    calls: list[str] = []

    class Broken(_Owner):
        def on_transition(self, snapshot: TaskSnapshot, record: Transition) -> None:
            super().on_transition(snapshot, record)
            raise RuntimeError("store down")

    machine.add_owner_listener(Broken(calls, "broken"), Broken.on_transition)
    machine.add_listener(_Owner(calls, "healthy").on_transition)
    with pytest.raises(RuntimeError, match="store down"):
        machine.mark_queued()
    assert calls == ["broken", "healthy"]
    assert machine.status is S.QUEUED


def test_snapshots_are_immutable_and_old_ones_unchanged() -> None:
    machine = fresh()
    first = machine.snapshot
    machine.mark_queued()
    assert first.status is S.PENDING and first.status_version == 0
    with pytest.raises(AttributeError):
        machine.snapshot.status = S.RUNNING  # type: ignore[misc]
    with pytest.raises(AttributeError):
        machine.transitions[-1].to_status = S.RUNNING  # type: ignore[misc]
    assert isinstance(machine.transitions, tuple)


def test_repr() -> None:
    machine = drive_to(S.RUNNING)
    assert repr(machine) == "StateMachine('t1', status=running, version=3)"


def test_concurrent_writers_never_skip_or_duplicate_versions() -> None:
    # 多个线程争着写：锁保证版本号严格连续，且每个成功的动作正好留下一条记录。
    import threading

    machine = StateMachine.create("race", "n", max_attempts=10_000)
    machine.mark_queued()
    barrier = threading.Barrier(4)
    successes: list[int] = []

    def worker() -> None:
        barrier.wait()
        for _ in range(200):
            for action in (
                lambda: machine.mark_starting(),
                lambda: machine.mark_running(),
                lambda: machine.mark_retry_wait(failure=BOOM, retry_at=machine.clock.now()),
            ):
                try:
                    action()
                except (InvalidTransition, AttemptsExhausted):
                    continue
                successes.append(1)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    versions = [r.version for r in machine.transitions]
    assert versions == list(range(1, len(versions) + 1))
    assert len(versions) == len(successes) + 1
    for previous, record in zip(machine.transitions, machine.transitions[1:], strict=False):
        assert record.from_status is previous.to_status
        assert record.to_status in TRANSITIONS[record.from_status]


def test_force_into_a_failure_terminal_always_records_why() -> None:
    machine = drive_to(S.RUNNING)
    machine.force_transition(S.LOST, actor="ops", reason="机器下线")
    failure = machine.snapshot.failure
    assert failure is not None and failure.kind is FailureKind.LOST and failure.retryable
    assert "机器下线" in failure.message
    # 已有失败记录时沿用它，而不是用一条更含糊的覆盖。
    machine.force_transition(S.FAILED, actor="ops", reason="核对后判失败")
    assert machine.snapshot.failure is failure
    # 显式给出的 failure 优先。
    given = Failure(FailureKind.NONZERO_EXIT, "exit 3")
    machine.force_transition(S.STOPPED, actor="ops", reason="改判", failure=given)
    assert machine.snapshot.failure is given
    # 成功的快照不挂失败。
    machine.force_transition(S.SUCCEEDED, actor="ops", reason="副作用已核对完成")
    assert machine.snapshot.failure is None
    with pytest.raises(ConfigurationError, match="Failure"):
        machine.force_transition(S.LOST, actor="ops", reason="x", failure="boom")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("target", "kind"),
    [
        (S.FAILED, FailureKind.EXCEPTION),
        (S.STOPPED, FailureKind.CANCELLED),
        (S.CANCELLED, FailureKind.CANCELLED),
        (S.SKIPPED, FailureKind.CONDITION_FALSE),
    ],
)
def test_force_default_failure_kinds(target: TaskStatus, kind: FailureKind) -> None:
    machine = drive_to(S.QUEUED)
    machine.force_transition(target, actor="ops", reason="人工")
    failure = machine.snapshot.failure
    assert failure is not None and failure.kind is kind and not failure.retryable


def test_abort_pause_after_forced_pausing_without_start_is_refused() -> None:
    machine = drive_to(S.QUEUED)
    machine.force_transition(S.PAUSING, actor="ops", reason="测试")
    error = assert_refused(machine, lambda m: m.abort_pause(), S.RUNNING, TRIGGER_PAUSE_ABORTED)
    assert error.detail is not None and "started_at" in error.detail


def test_snapshot_holds_slot_distinguishes_the_two_kinds_of_pause() -> None:
    in_place = drive_to(S.PAUSED)
    assert in_place.snapshot.holds_slot and S.PAUSED.holds_slot
    for source in (S.QUEUED, S.RETRY_WAIT):
        machine = drive_to(source)
        machine.mark_paused()
        assert not machine.snapshot.holds_slot
    for status in TaskStatus:
        if status is not S.PAUSED:
            assert drive_to(status).snapshot.holds_slot == status.holds_slot
    assert {s for s in TaskStatus if s.holds_slot} == {S.STARTING, S.RUNNING, S.PAUSING, S.PAUSED, S.STOPPING}


# -- sibling（submit_many 的模板复制）------------------------------------------------------------------


def test_a_sibling_is_what_create_then_mark_queued_would_have_built() -> None:
    clock = FakeClock()
    template = StateMachine.create(
        "t1", "抽取", max_attempts=3, clock=clock, label="批", tags=frozenset({"a"})
    )
    template.mark_queued()
    clock.advance(2)
    sibling = template.sibling("t2")
    # 同一时刻（FakeClock 不自己走）逐个建一台：逐字段相同
    expected = StateMachine.create(
        "t2", "抽取", max_attempts=3, clock=clock, label="批", tags=frozenset({"a"}), created_at=clock.now()
    )
    expected.mark_queued()
    assert sibling.snapshot == expected.snapshot
    assert sibling.snapshot.__dict__ == expected.snapshot.__dict__
    assert sibling.snapshot.created_at == sibling.snapshot.queued_at == clock.now()
    assert sibling.transitions == expected.transitions
    assert template.snapshot.task_id == "t1" and len(template.transitions) == 1, "模板本身不能被改动"
    assert sibling.lock is not template.lock
    sibling.mark_starting(executor="thread")  # 复制出来的是一台正常的状态机：接着走迁移
    assert sibling.snapshot.status_version == 2


def test_a_sibling_is_only_copied_from_a_task_that_has_just_been_queued() -> None:
    pending = fresh()
    with pytest.raises(ConfigurationError, match="只能从刚入队"):
        pending.sibling("t2")
    moved = fresh()
    moved.mark_queued()
    moved.mark_starting(executor="thread")
    with pytest.raises(ConfigurationError, match="只能从刚入队"):
        moved.sibling("t2")  # 带着第一次尝试留下的 attempt / started_at，不能照抄
    blocked = fresh()
    blocked.mark_blocked()
    with pytest.raises(ConfigurationError, match="只能从刚入队"):
        blocked.sibling("t2")


def test_history_is_kept_packed_and_read_back_as_equal_transitions() -> None:
    # 状态机把历史存成紧凑元组（records.PackedTransition），读 transitions 时现造：按值与当初交给监听器的
    # 记录相等，装历史的元组在一次回收之后不再被 GC 追踪（这正是紧凑存放的用意，issue 17）。
    import gc

    machine = fresh()
    seen: list[Transition] = []
    machine.add_listener(lambda snapshot, record: seen.append(record))
    machine.mark_queued()
    machine.mark_starting(executor="thread")
    machine.mark_running()
    machine.mark_stopping(reason="人工停止：维护窗口")
    machine.mark_stopped(reason="人工停止：维护窗口", actor="ops")
    assert list(machine.transitions) == seen
    assert machine.transitions_since(3) == tuple(seen[3:])
    assert all(isinstance(r.from_status, TaskStatus) and r.task_id == "t1" for r in machine.transitions)
    gc.collect()
    assert not any(gc.is_tracked(packed) for packed in machine._transitions)
    rebuilt = StateMachine.from_snapshot(machine.snapshot, machine.transitions)
    assert rebuilt.transitions == machine.transitions


def test_long_history_past_the_tuple_limit_keeps_every_record_in_order() -> None:
    # 历史短时存成元组、超过 PACKED_TUPLE_MAX 条后换成列表原地追加：换的那一刻前后都不能丢、不能乱。
    import itertools

    from chongming_task.core import state_machine

    machine = fresh()
    machine.mark_queued()
    machine.mark_starting()
    machine.mark_running()
    cycles = state_machine.PACKED_TUPLE_MAX // 3 + 5
    for _ in range(cycles):
        machine.mark_pausing()
        machine.mark_paused()
        machine.mark_running()
    machine.mark_succeeded()
    history = machine.transitions
    assert len(history) == 3 + 3 * cycles + 1 > state_machine.PACKED_TUPLE_MAX
    assert [r.version for r in history] == list(range(1, len(history) + 1))
    assert all(a.to_status is b.from_status for a, b in itertools.pairwise(history))
    assert history[-1].to_status is S.SUCCEEDED
    assert machine.transitions_since(len(history) - 2) == history[-2:]
    assert isinstance(machine._transitions, list)


def test_succeeded_with_heartbeat_equals_heartbeat_then_succeeded() -> None:
    """结算的快路径（心跳与 succeeded 一份快照）与"先 note_heartbeat、再 mark_succeeded"结果逐字段相同：
    同一条迁移记录、同一份快照，监听器看到的也一样；不合格的心跳照样被拒，且什么都不改。"""
    seen: dict[str, list[tuple[TaskSnapshot, Transition]]] = {"two": [], "one": []}
    clock = FakeClock()
    two, one = drive_to(S.RUNNING, clock), drive_to(S.RUNNING, FakeClock())  # 两台走过同样的时刻
    two.add_listener(lambda snap, rec: seen["two"].append((snap, rec)))
    one.add_listener(lambda snap, rec: seen["one"].append((snap, rec)))
    beat = clock.now() - timedelta(seconds=1)
    two.note_heartbeat(beat)
    expected = two.mark_succeeded(outcome={"rows": 3})
    got = one.mark_succeeded_with_heartbeat({"rows": 3}, beat)
    assert got == expected and got.last_heartbeat_at == beat
    assert one.transitions == two.transitions
    assert seen["one"] == seen["two"]
    naive = drive_to(S.RUNNING)
    before = (naive.snapshot, naive.transitions)
    with pytest.raises(ConfigurationError):
        naive.mark_succeeded_with_heartbeat(None, beat.replace(tzinfo=None))
    assert (naive.snapshot, naive.transitions) == before
