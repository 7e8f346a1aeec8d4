"""StateMachine：唯一能改 ``status`` 的地方。

每个动作一个方法。每个方法先查转移表（``chongming_task.states.TRANSITIONS``，只在那里声明一次）
与守卫，再生成新的不可变快照并追加一条 Transition。非法动作抛 InvalidTransition，
绝不静默返回 False——"停止指令没生效"这类问题靠静默失败是查不出来的。

线程安全：所有写入都在 ``self.lock`` 下进行。TaskRun 把自己的锁传进来，于是"每个 TaskRun
一把锁"与"状态机是唯一写者"是同一件事。
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from chongming_task.clock import SYSTEM_CLOCK, Clock
from chongming_task.errors import AttemptsExhausted, ConfigurationError, InvalidTransition
from chongming_task.models import Failure, FailureKind, Progress, TaskSnapshot, Transition
from chongming_task.states import RETRYABLE_FROM, TERMINAL_STATUSES, TRANSITIONS, TaskStatus

S = TaskStatus

TransitionListener = Callable[[TaskSnapshot, Transition], None]

# 各动作的默认触发源。trigger 说明"是谁/什么事件引起的"，出现在历史与错误消息里。
TRIGGER_BLOCKED = "scheduler:blocked"
TRIGGER_QUEUED = "scheduler:queued"
TRIGGER_STARTING = "scheduler:dispatched"
TRIGGER_RUNNING = "executor:launched"
TRIGGER_SUCCEEDED = "executor:returned"
TRIGGER_FAILED = "executor:failed"
TRIGGER_RETRY_WAIT = "runtime:retry_scheduled"
TRIGGER_PAUSING = "control:pause"
TRIGGER_PAUSED = "runtime:paused"
TRIGGER_PAUSE_ABORTED = "runtime:pause_aborted"
TRIGGER_STOPPING = "control:stop"
TRIGGER_STOPPED = "runtime:stopped"
TRIGGER_CANCELLED = "orchestrator:cancelled"
TRIGGER_SKIPPED = "orchestrator:skipped"
TRIGGER_LOST = "runtime:lost"
TRIGGER_RETRY = "control:retry"
TRIGGER_RESET = "control:reset"
TRIGGER_FORCE = "control:force"


class StateMachine:
    """一个任务的状态机：当前快照 + 只追加的迁移历史。"""

    __slots__ = ("_clock", "_listeners", "_snapshot", "_transitions", "lock")

    def __init__(
        self,
        snapshot: TaskSnapshot,
        transitions: Iterable[Transition] = (),
        *,
        clock: Clock | None = None,
        lock: threading.RLock | None = None,
    ) -> None:
        history = list(transitions)
        for expected, record in enumerate(history, start=1):
            if record.task_id != snapshot.task_id:
                raise ConfigurationError(f"迁移记录属于任务 {record.task_id!r}，不属于 {snapshot.task_id!r}")
            if record.version != expected:
                raise ConfigurationError(
                    f"任务 {snapshot.task_id!r} 的历史不连续：第 {expected} 条记录的版本号是 {record.version}"
                )
        if history and history[-1].version != snapshot.status_version:
            raise ConfigurationError(
                f"任务 {snapshot.task_id!r} 的快照版本 {snapshot.status_version} 与历史末条版本 {history[-1].version} 不一致"
            )
        if history and history[-1].to_status is not snapshot.status:
            raise ConfigurationError(
                f"任务 {snapshot.task_id!r} 的快照状态 {snapshot.status.value} 与历史末条 {history[-1].to_status.value} 不一致"
            )
        self._snapshot = snapshot
        self._transitions = history
        self._clock: Clock = clock or SYSTEM_CLOCK
        self._listeners: list[TransitionListener] = []
        self.lock = lock or threading.RLock()

    # -- construction -------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        task_id: str,
        name: str,
        max_attempts: int = 1,
        *,
        clock: Clock | None = None,
        lock: threading.RLock | None = None,
        **fields: Any,
    ) -> StateMachine:
        """新建一个处于 pending 的任务（版本 0，尚无迁移记录）。"""
        clock = clock or SYSTEM_CLOCK
        for forbidden in ("status", "status_version", "attempt"):
            if forbidden in fields:
                raise ConfigurationError(f"create() 不接受 {forbidden}：新任务总是从 pending、版本 0、第 0 次尝试开始")
        fields.setdefault("created_at", clock.now())
        snapshot = TaskSnapshot(task_id=task_id, name=name, max_attempts=max_attempts, **fields)
        return cls(snapshot, (), clock=clock, lock=lock)

    @classmethod
    def from_snapshot(
        cls,
        snapshot: TaskSnapshot,
        transitions: Iterable[Transition] = (),
        *,
        clock: Clock | None = None,
        lock: threading.RLock | None = None,
    ) -> StateMachine:
        """从存储交回的快照 + 历史重建状态机。"""
        return cls(snapshot, transitions, clock=clock, lock=lock)

    # -- reading ------------------------------------------------------------------------------------

    @property
    def snapshot(self) -> TaskSnapshot:
        return self._snapshot

    @property
    def status(self) -> TaskStatus:
        return self._snapshot.status

    @property
    def task_id(self) -> str:
        return self._snapshot.task_id

    @property
    def transitions(self) -> tuple[Transition, ...]:
        return tuple(self._transitions)

    @property
    def clock(self) -> Clock:
        return self._clock

    def transitions_since(self, version: int) -> tuple[Transition, ...]:
        """版本号大于 ``version`` 的迁移记录（写穿存储时只送新增的那几条）。"""
        with self.lock:
            return tuple(self._transitions[version:])

    def can(self, target: TaskStatus) -> bool:
        return target in TRANSITIONS[self._snapshot.status]

    @property
    def can_stop(self) -> bool:
        allowed = TRANSITIONS[self._snapshot.status]
        return S.STOPPED in allowed or S.STOPPING in allowed

    @property
    def can_pause(self) -> bool:
        allowed = TRANSITIONS[self._snapshot.status]
        return S.PAUSING in allowed or S.PAUSED in allowed

    @property
    def can_resume(self) -> bool:
        return self._snapshot.status in (S.PAUSED, S.PAUSING)

    @property
    def can_retry(self) -> bool:
        return self._snapshot.status in RETRYABLE_FROM

    def add_listener(self, listener: TransitionListener) -> None:
        """每次迁移之后（仍在锁内）以 (新快照, 迁移记录) 调用。用于写穿存储与唤醒调度器。"""
        self._listeners.append(listener)

    # -- the single write path ----------------------------------------------------------------------

    def _apply(
        self,
        target: TaskStatus,
        trigger: str,
        actor: str | None,
        reason: str | None,
        changes: dict[str, Any],
        *,
        checked: bool = True,
    ) -> TaskSnapshot:
        current = self._snapshot
        if checked and target not in TRANSITIONS[current.status]:
            raise InvalidTransition(current.status, target, trigger, TRANSITIONS[current.status])
        now = changes.pop("_now", None) or self._clock.now()
        version = current.status_version + 1
        if target in TERMINAL_STATUSES and "finished_at" not in changes:
            changes["finished_at"] = now
        changes["status"] = target
        changes["status_version"] = version
        snapshot = current.evolve(**changes)
        record = Transition(current.task_id, current.status, target, trigger, actor, reason, version, now)
        self._snapshot = snapshot
        self._transitions.append(record)
        for listener in self._listeners:
            listener(snapshot, record)
        return snapshot

    def _refuse(self, target: TaskStatus, trigger: str, detail: str) -> InvalidTransition:
        status = self._snapshot.status
        return InvalidTransition(status, target, trigger, TRANSITIONS[status], detail)

    # -- one method per action ----------------------------------------------------------------------

    def mark_blocked(self, *, trigger: str = TRIGGER_BLOCKED, actor: str | None = None, reason: str | None = None) -> TaskSnapshot:
        with self.lock:
            return self._apply(S.BLOCKED, trigger, actor, reason, {})

    def mark_queued(self, *, trigger: str = TRIGGER_QUEUED, actor: str | None = None, reason: str | None = None) -> TaskSnapshot:
        with self.lock:
            now = self._clock.now()
            return self._apply(S.QUEUED, trigger, actor, reason, {"queued_at": now, "retry_at": None, "_now": now})

    def mark_starting(
        self,
        *,
        executor: str | None = None,
        trigger: str = TRIGGER_STARTING,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        """开始新一次尝试：attempt + 1，记下 started_at。预算不够时抛 AttemptsExhausted。"""
        with self.lock:
            current = self._snapshot
            if S.STARTING not in TRANSITIONS[current.status]:
                raise InvalidTransition(current.status, S.STARTING, trigger, TRANSITIONS[current.status])
            if current.attempt + 1 > current.max_attempts:
                raise AttemptsExhausted(
                    f"任务 {current.task_id!r} 已尝试 {current.attempt} 次，达到上限 max_attempts={current.max_attempts}；"
                    "如需再跑请用 retry()"
                )
            now = self._clock.now()
            changes: dict[str, Any] = {
                "attempt": current.attempt + 1,
                "started_at": now,
                "retry_at": None,
                "failure": None,
                "pid": None,
                "_now": now,
            }
            if executor is not None:
                changes["executor"] = executor
            return self._apply(S.STARTING, trigger, actor, reason, changes)

    def mark_running(
        self,
        *,
        pid: int | None = None,
        trigger: str = TRIGGER_RUNNING,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        """载体已就位（starting → running），或就地暂停后恢复（paused → running）。"""
        with self.lock:
            if S.RUNNING in TRANSITIONS[self._snapshot.status] and self._snapshot.started_at is None:
                raise self._refuse(S.RUNNING, trigger, "任务从未启动（缺少 started_at）：排队期间暂停的任务恢复后应回到 queued")
            changes: dict[str, Any] = {} if pid is None else {"pid": pid}
            return self._apply(S.RUNNING, trigger, actor, reason, changes)

    def mark_succeeded(
        self,
        *,
        outcome: Any = None,
        trigger: str = TRIGGER_SUCCEEDED,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        with self.lock:
            return self._apply(S.SUCCEEDED, trigger, actor, reason, {"outcome": outcome, "failure": None})

    def mark_failed(
        self,
        *,
        failure: Failure,
        trigger: str = TRIGGER_FAILED,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        with self.lock:
            if not isinstance(failure, Failure):
                raise ConfigurationError("mark_failed() 必须带 failure=Failure(...)：失败原因是排障的起点")
            return self._apply(S.FAILED, trigger, actor, reason, {"failure": failure, "retry_at": None})

    def mark_retry_wait(
        self,
        *,
        failure: Failure,
        retry_at: datetime,
        trigger: str = TRIGGER_RETRY_WAIT,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        with self.lock:
            if not isinstance(failure, Failure):
                raise ConfigurationError("mark_retry_wait() 必须带 failure=Failure(...)：记下这次为什么失败")
            if retry_at.utcoffset() is None:
                raise ConfigurationError("retry_at 必须是带时区的 datetime")
            return self._apply(S.RETRY_WAIT, trigger, actor, reason, {"failure": failure, "retry_at": retry_at})

    def mark_pausing(self, *, trigger: str = TRIGGER_PAUSING, actor: str | None = None, reason: str | None = None) -> TaskSnapshot:
        with self.lock:
            return self._apply(S.PAUSING, trigger, actor, reason, {})

    def mark_paused(self, *, trigger: str = TRIGGER_PAUSED, actor: str | None = None, reason: str | None = None) -> TaskSnapshot:
        with self.lock:
            return self._apply(S.PAUSED, trigger, actor, reason, {})

    def abort_pause(
        self, *, trigger: str = TRIGGER_PAUSE_ABORTED, actor: str | None = None, reason: str | None = None
    ) -> TaskSnapshot:
        """暂停没生效：pausing → running。只允许从 pausing 出发。"""
        with self.lock:
            if self._snapshot.status is not S.PAUSING:
                raise self._refuse(S.RUNNING, trigger, "abort_pause() 只能从 pausing 出发")
            return self._apply(S.RUNNING, trigger, actor, reason, {})

    def mark_stopping(self, *, reason: str | None = None, trigger: str = TRIGGER_STOPPING, actor: str | None = None) -> TaskSnapshot:
        with self.lock:
            return self._apply(S.STOPPING, trigger, actor, reason, {})

    def mark_stopped(
        self,
        *,
        failure: Failure | None = None,
        trigger: str = TRIGGER_STOPPED,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        """人工停止落地。失败类型默认 cancelled、不可重试：重试一个被停止的任务等于无视停止指令。"""
        with self.lock:
            if failure is None:
                failure = Failure(FailureKind.CANCELLED, reason or "任务已按请求停止", retryable=False)
            return self._apply(S.STOPPED, trigger, actor, reason, {"failure": failure, "retry_at": None})

    def mark_cancelled(
        self,
        *,
        failure: Failure | None = None,
        trigger: str = TRIGGER_CANCELLED,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        with self.lock:
            if failure is None:
                failure = Failure(FailureKind.CANCELLED, reason or "已被编排层取消", retryable=False)
            return self._apply(S.CANCELLED, trigger, actor, reason, {"failure": failure, "retry_at": None})

    def mark_skipped(
        self,
        *,
        failure: Failure | None = None,
        trigger: str = TRIGGER_SKIPPED,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        with self.lock:
            if failure is None:
                failure = Failure(FailureKind.CONDITION_FALSE, reason or "条件不满足，已跳过", retryable=False)
            return self._apply(S.SKIPPED, trigger, actor, reason, {"failure": failure})

    def mark_lost(
        self,
        *,
        failure: Failure | None = None,
        trigger: str = TRIGGER_LOST,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        """结果未知。总会带一个 failure：不记原因就无从判断该重跑还是人工核对。"""
        with self.lock:
            if failure is None:
                failure = Failure(FailureKind.LOST, reason or "载体失联或被放弃，结果未知", retryable=True)
            return self._apply(S.LOST, trigger, actor, reason, {"failure": failure})

    # -- side-channel fields (no status change, no version bump) -----------------------------------

    def update_side(
        self,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        pid: int | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> TaskSnapshot:
        """进度、心跳、pid、租约：属于高频旁路，不参与状态机，不递增 status_version。"""
        with self.lock:
            changes: dict[str, Any] = {}
            if progress is not None:
                changes["progress"] = progress
            if heartbeat_at is not None:
                changes["last_heartbeat_at"] = heartbeat_at
            if pid is not None:
                changes["pid"] = pid
            if lease_owner is not None:
                changes["lease_owner"] = lease_owner
            if lease_until is not None:
                changes["lease_until"] = lease_until
            if changes:
                self._snapshot = self._snapshot.evolve(**changes)
            return self._snapshot

    # -- the explicit revivals and the one arbitrary jump ------------------------------------------

    def retry(self, *, actor: str | None = None, reason: str | None = None) -> TaskSnapshot:
        """从 failed / stopped / cancelled / lost 复活到 queued，保留尝试历史与计数。

        若尝试预算已用完，额外再给一次（否则复活后立刻 AttemptsExhausted，毫无意义）。
        """
        with self.lock:
            current = self._snapshot
            if current.status not in RETRYABLE_FROM:
                allowed = ", ".join(sorted(s.value for s in RETRYABLE_FROM))
                raise self._refuse(S.QUEUED, TRIGGER_RETRY, f"retry() 只能从 {allowed} 出发")
            now = self._clock.now()
            changes: dict[str, Any] = {
                "max_attempts": max(current.max_attempts, current.attempt + 1),
                "failure": None,
                "outcome": None,
                "finished_at": None,
                "retry_at": None,
                "queued_at": now,
                "_now": now,
            }
            return self._apply(S.QUEUED, TRIGGER_RETRY, actor, reason, changes, checked=False)

    def reset(self, *, confirm: bool = False, actor: str | None = None, reason: str | None = None) -> TaskSnapshot:
        """回到 pending 并丢弃尝试计数与结果（历史记录仍保留，用于审计）。必须显式 confirm=True。"""
        with self.lock:
            if confirm is not True:
                raise ConfigurationError("reset() 会丢弃全部尝试计数与结果，属于危险操作：请显式传 confirm=True")
            current = self._snapshot
            if current.status not in TERMINAL_STATUSES:
                raise self._refuse(S.PENDING, TRIGGER_RESET, "reset() 只能用于已落终态的任务，请先停止它")
            changes: dict[str, Any] = {
                "attempt": 0,
                "failure": None,
                "outcome": None,
                "progress": None,
                "queued_at": None,
                "started_at": None,
                "finished_at": None,
                "retry_at": None,
                "last_heartbeat_at": None,
                "pid": None,
            }
            return self._apply(S.PENDING, TRIGGER_RESET, actor, reason, changes, checked=False)

    def force_transition(self, target: TaskStatus, *, actor: str, reason: str) -> TaskSnapshot:
        """唯一能任意跳转的入口：必须给出非空 actor 与 reason，记为 control:force。"""
        with self.lock:
            if not isinstance(actor, str) or not actor.strip() or not isinstance(reason, str) or not reason.strip():
                raise ConfigurationError("force_transition() 必须给出非空的 actor 与 reason：没有审计信息就无法事后追溯")
            target = TaskStatus(target)
            if target is self._snapshot.status:
                raise ConfigurationError(f"任务已处于 {target.value}，force_transition() 不做无变化的跳转")
            changes: dict[str, Any] = {}
            if target not in TERMINAL_STATUSES:
                changes["finished_at"] = None
            return self._apply(target, TRIGGER_FORCE, actor, reason, changes, checked=False)

    def __repr__(self) -> str:
        snap = self._snapshot
        return f"StateMachine({snap.task_id!r}, status={snap.status.value}, version={snap.status_version})"


__all__ = ["StateMachine", "TransitionListener"]
