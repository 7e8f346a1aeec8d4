"""Hypothesis 有状态测试：随机动作序列下，状态机的不变量始终成立。

每条规则先用 ``can()`` / 已知条件预测动作会不会被接受，再真的调用它：预测与结果必须一致
（接受 → 恰好多一条记录；拒绝 → 什么都没变）。每一步之后检查整条历史：

* 每条记录要么是转移表里的边，要么是审计过的 retry / reset / force（按 trigger 区分）；
* 版本号从 1 起逐一递增，记录首尾相接；
* snapshot.status 等于末条记录的 to_status，status_version 等于记录条数；
* attempt 从不超过 max_attempts。
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from chongming_task.core.state_machine import (
    AUDITED_TRIGGERS,
    TRIGGER_FORCE,
    TRIGGER_RESET,
    TRIGGER_RETRY,
    StateMachine,
)
from chongming_task.errors import AttemptsExhausted, ConfigurationError, InvalidTransition
from chongming_task.models import Failure, FailureKind, Progress
from chongming_task.states import RETRYABLE_FROM, TERMINAL_STATUSES, TRANSITIONS, TaskStatus
from chongming_task.testing import FakeClock

S = TaskStatus
BOOM = Failure(FailureKind.EXCEPTION, "boom", retryable=True)


class StateMachineModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.machine = StateMachine.create("prop", "随机", max_attempts=3, clock=self.clock)
        self.notified = 0
        self.machine.add_listener(self._count)

    def _count(self, snapshot: object, record: object) -> None:
        self.notified += 1

    # -- helpers ------------------------------------------------------------------------------------

    def _attempt(self, accepted_expected: bool, action: object, *, target: TaskStatus | None) -> None:
        assert callable(action)
        before = self.machine.snapshot
        count = len(self.machine.transitions)
        try:
            action()
        except (InvalidTransition, AttemptsExhausted) as exc:
            assert not accepted_expected, f"预测会接受，却被拒绝：{exc}"
            assert self.machine.snapshot is before
            assert len(self.machine.transitions) == count
            if isinstance(exc, InvalidTransition):
                assert exc.from_status is before.status
                assert exc.allowed == TRANSITIONS[before.status]
            return
        assert accepted_expected, f"预测会拒绝，却从 {before.status.value} 走通了"
        assert len(self.machine.transitions) == count + 1
        if target is not None:
            assert self.machine.status is target

    def _plain(self, target: TaskStatus, action: object) -> None:
        self._attempt(self.machine.can(target), action, target=target)

    # -- rules: one per public action ----------------------------------------------------------------

    @rule(seconds=st.floats(min_value=0, max_value=3600, allow_nan=False))
    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def mark_blocked(self) -> None:
        self._plain(S.BLOCKED, self.machine.mark_blocked)

    @rule()
    def mark_queued(self) -> None:
        self._plain(S.QUEUED, self.machine.mark_queued)

    @rule(executor=st.sampled_from([None, "thread", "process", "inline"]))
    def mark_starting(self, executor: str | None) -> None:
        self._plain(S.STARTING, lambda: self.machine.mark_starting(executor=executor))

    @rule(pid=st.one_of(st.none(), st.integers(min_value=1, max_value=2**31)))
    def mark_running(self, pid: int | None) -> None:
        self._plain(S.RUNNING, lambda: self.machine.mark_running(pid=pid))

    @rule(outcome=st.one_of(st.none(), st.integers(), st.text(max_size=5)))
    def mark_succeeded(self, outcome: object) -> None:
        self._plain(S.SUCCEEDED, lambda: self.machine.mark_succeeded(outcome=outcome))

    @rule()
    def mark_failed(self) -> None:
        self._plain(S.FAILED, lambda: self.machine.mark_failed(failure=BOOM))

    @rule(delay=st.integers(min_value=0, max_value=600))
    def mark_retry_wait(self, delay: int) -> None:
        retry_at = self.clock.now() + timedelta(seconds=delay)
        self._plain(S.RETRY_WAIT, lambda: self.machine.mark_retry_wait(failure=BOOM, retry_at=retry_at))

    @rule()
    def mark_pausing(self) -> None:
        self._plain(S.PAUSING, self.machine.mark_pausing)

    @rule()
    def mark_paused(self) -> None:
        self._plain(S.PAUSED, self.machine.mark_paused)

    @rule()
    def abort_pause(self) -> None:
        snapshot = self.machine.snapshot
        expected = snapshot.status is S.PAUSING and snapshot.started_at is not None
        self._attempt(expected, self.machine.abort_pause, target=S.RUNNING)

    @rule()
    def mark_stopping(self) -> None:
        self._plain(S.STOPPING, lambda: self.machine.mark_stopping(reason="随机停止"))

    @rule()
    def mark_stopped(self) -> None:
        self._plain(S.STOPPED, self.machine.mark_stopped)

    @rule()
    def mark_cancelled(self) -> None:
        self._plain(S.CANCELLED, self.machine.mark_cancelled)

    @rule()
    def mark_skipped(self) -> None:
        self._plain(S.SKIPPED, self.machine.mark_skipped)

    @rule()
    def mark_lost(self) -> None:
        self._plain(S.LOST, self.machine.mark_lost)

    @rule()
    def retry(self) -> None:
        self._attempt(
            self.machine.status in RETRYABLE_FROM,
            lambda: self.machine.retry(actor="prop", reason="重试"),
            target=S.QUEUED,
        )

    @rule()
    def reset(self) -> None:
        legal = self.machine.status in TERMINAL_STATUSES
        self._attempt(legal, lambda: self.machine.reset(confirm=True), target=S.PENDING)
        # 只有 reset 真的发生时才丢弃尝试计数；被拒绝的 reset 什么也不改（force_transition 跳到 pending 的
        # 任务仍保留它的 attempt，这是审计过的任意跳转，不是 reset）。
        if legal:
            assert self.machine.status is S.PENDING and self.machine.snapshot.attempt == 0

    @rule()
    def reset_without_confirm(self) -> None:
        before = self.machine.snapshot
        try:
            self.machine.reset()
        except ConfigurationError:
            pass
        else:
            raise AssertionError("reset() 没有 confirm=True 却执行了")
        assert self.machine.snapshot is before

    @precondition(lambda self: len(self.machine.transitions) < 60)
    @rule(status=st.sampled_from(list(TaskStatus)))
    def force_transition(self, status: TaskStatus) -> None:
        before = self.machine.snapshot
        if status is before.status:
            try:
                self.machine.force_transition(status, actor="prop", reason="强制")
            except ConfigurationError:
                return
            raise AssertionError("原地 force_transition 应被拒绝")
        self.machine.force_transition(status, actor="prop", reason="强制")
        assert self.machine.status is status

    @rule(done=st.integers(min_value=0, max_value=100))
    def side_channel(self, done: int) -> None:
        version = self.machine.snapshot.status_version
        self.machine.update_side(progress=Progress(done, total=100), heartbeat_at=self.clock.now())
        assert self.machine.snapshot.status_version == version

    # -- invariants -----------------------------------------------------------------------------------

    @invariant()
    def history_is_a_valid_audited_trail(self) -> None:
        history = self.machine.transitions
        snapshot = self.machine.snapshot
        previous_status = S.PENDING
        previous_at = None
        for index, record in enumerate(history, start=1):
            assert record.version == index
            assert record.from_status is previous_status
            if record.to_status not in TRANSITIONS[record.from_status]:
                # 不是表里的边：只能是三个审计入口之一，而且各自的形状都对。
                assert record.trigger in AUDITED_TRIGGERS, record
                if record.trigger == TRIGGER_RETRY:
                    assert record.from_status in RETRYABLE_FROM and record.to_status is S.QUEUED
                elif record.trigger == TRIGGER_RESET:
                    assert record.from_status in TERMINAL_STATUSES and record.to_status is S.PENDING
            if record.trigger == TRIGGER_FORCE:
                assert record.actor and record.reason
            if previous_at is not None:
                assert record.at >= previous_at
            previous_status = record.to_status
            previous_at = record.at
        assert snapshot.status is previous_status
        assert snapshot.status_version == len(history)
        assert self.notified == len(history)

    @invariant()
    def attempts_within_budget(self) -> None:
        snapshot = self.machine.snapshot
        assert 0 <= snapshot.attempt <= snapshot.max_attempts

    @invariant()
    def finished_at_iff_terminal(self) -> None:
        snapshot = self.machine.snapshot
        assert (snapshot.finished_at is not None) == (snapshot.status in TERMINAL_STATUSES)

    @invariant()
    def running_implies_a_started_attempt(self) -> None:
        # force_transition 不查守卫（它就是给人工纠正用的），之后的快照可能没有 started_at；
        # 没有强制跳转过的轨迹里，占着载体的状态必然有一次已开始的尝试。
        history = self.machine.transitions
        if any(record.trigger == TRIGGER_FORCE for record in history):
            return
        if self.machine.status in (S.STARTING, S.RUNNING, S.PAUSING, S.STOPPING):
            assert self.machine.snapshot.started_at is not None

    @invariant()
    def terminal_failures_are_recorded(self) -> None:
        # lost / failed / stopped / cancelled / skipped 总带着原因；succeeded 不带失败。
        snapshot = self.machine.snapshot
        if snapshot.status in TERMINAL_STATUSES - {S.SUCCEEDED}:
            assert snapshot.failure is not None
        if snapshot.status is S.SUCCEEDED:
            assert snapshot.failure is None

    @invariant()
    def snapshot_round_trips(self) -> None:
        snapshot = self.machine.snapshot
        assert type(snapshot).from_dict(snapshot.to_dict()) == snapshot


StateMachineModel.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestStateMachineModel = StateMachineModel.TestCase
