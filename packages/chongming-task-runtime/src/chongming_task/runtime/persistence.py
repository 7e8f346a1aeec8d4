"""Controller 与存储之间的写穿层。

* 每次状态迁移：在任务自己的锁内，把新快照连同它新增的迁移记录原子地 save（带 expect_version）。
  锁内写保证同一任务的写入按版本顺序到达存储。
* 存储故障绝不让任务失败：记进 ``failures``（最多 20 条，保留最新的）并打日志。存储里落后的
  版本由下一次成功的写入追平（一次 save 带上所有缺的迁移记录），所以存储最终收敛。
* 进度、心跳与租约走 touch，由 Controller 的后台循环按固定节奏批量写，从不逐次 checkpoint 写。
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from chongming_task.clock import Clock
from chongming_task.core.state_machine import StateMachine
from chongming_task.errors import (
    ConcurrencyConflict,
    ConfigurationError,
    DuplicateTaskId,
    StoreError,
    TaskError,
)
from chongming_task.models import Progress, TaskSnapshot, Transition
from chongming_task.storage import TaskStore

logger = logging.getLogger("chongming_task.controller")

MAX_PERSIST_FAILURES = 20


@dataclass(frozen=True)
class PersistFailure:
    """一次写存储失败的记录。任务本身没问题，坏的只是可观测性——但绝不静默。"""

    at: datetime
    task_id: str
    operation: str
    error: str


@dataclass(slots=True)
class _TaskState:
    persisted_version: int | None  # None：存储里还没有这个任务（create 失败过）
    last_progress: Progress | None = None
    last_heartbeat: datetime | None = None


class WriteThrough:
    """一个 Controller 的写穿状态。"""

    def __init__(
        self,
        store: TaskStore,
        *,
        owner: str,
        lease_ttl: float,
        clock: Clock,
        on_failure: Callable[[PersistFailure], None] | None = None,
    ) -> None:
        self.store = store
        # 每次失败都告诉它（事件钩子的 StoreErrorEvent）；failures 只留最新 20 条，计数得靠这个。
        self.on_failure = on_failure
        self.owner = owner
        self.lease_ttl = lease_ttl
        self.clock = clock
        self.failures: deque[PersistFailure] = deque(maxlen=MAX_PERSIST_FAILURES)
        self._tasks: dict[str, _TaskState] = {}
        self._behind: dict[str, StateMachine] = {}
        self._lock = threading.Lock()

    def record(self, task_id: str, operation: str, exc: BaseException) -> None:
        """记一次写存储失败（最多保留最新 20 条）并打日志。"""
        failure = PersistFailure(self.clock.now(), task_id, operation, f"{type(exc).__name__}: {exc}")
        with self._lock:
            self.failures.append(failure)
        logger.warning("写存储失败（任务照常运行）：%s %s：%s", operation, task_id, failure.error)
        if self.on_failure is not None:
            self.on_failure(failure)

    def lease_until(self) -> datetime:
        return self.clock.now() + timedelta(seconds=self.lease_ttl)

    def create(self, machine: StateMachine) -> None:
        """提交时落库：必须成功，任务才会执行（issue 16.6）。

        首次落库失败（没有写权限的角色、只读文件、存储宕机）抛 StoreError，调用方据此拒绝提交、任务体一行
        也不跑——否则任务在存储里永远不可见，只留下一串"写存储失败（任务照常运行）"。"存储故障不让任务失败"
        只从这一步成功之后开始：之后的 save / touch 失败记进 persist_failures，恢复后追平。
        重复 id 原样抛出。
        """
        # 先在状态机上记下租约，再把这同一个快照对象交给存储（不另造一份副本）。
        snapshot = machine.update_side(lease_owner=self.owner, lease_until=self.lease_until())
        try:
            self.store.create(snapshot, machine.transitions)
        except (DuplicateTaskId, ConfigurationError):
            raise
        except TaskError as exc:
            raise StoreError(
                f"任务 {snapshot.task_id!r} 没能写进存储，已拒绝提交（任务没有执行）：{exc}"
            ) from exc
        self._tasks[snapshot.task_id] = _TaskState(persisted_version=snapshot.status_version)

    def on_transition(self, machine: StateMachine, snapshot: TaskSnapshot, record: Transition) -> None:
        """在任务锁内调用：把存储追到当前版本。"""
        self.sync(machine)

    def sync(self, machine: StateMachine) -> bool:
        """把存储追到状态机的当前版本（调用方持有 machine.lock）。返回存储是否已追平。"""
        snapshot = machine.snapshot
        state = self._tasks.get(snapshot.task_id)
        if state is None:
            return True
        if state.persisted_version == snapshot.status_version:
            return True
        if state.persisted_version == -1:
            return False  # 已发生版本冲突：这个任务在存储里归别人写了
        try:
            if state.persisted_version is None:
                self.store.create(snapshot, machine.transitions)
            else:
                self.store.save(
                    snapshot,
                    expect_version=state.persisted_version,
                    transitions=machine.transitions_since(state.persisted_version),
                )
        except ConcurrencyConflict as exc:
            # 别的写者（例如另一节点的 reconcile）改写了存储：重试无济于事，如实记下，不再追写。
            self.record(snapshot.task_id, "save", ConcurrencyConflict(f"存储中的版本已被其他写者改写：{exc}"))
            with self._lock:
                self._behind.pop(snapshot.task_id, None)
            state.persisted_version = -1
            return False
        except TaskError as exc:
            self.record(snapshot.task_id, "create" if state.persisted_version is None else "save", exc)
            with self._lock:
                self._behind[snapshot.task_id] = machine
            return False
        state.persisted_version = snapshot.status_version
        with self._lock:
            self._behind.pop(snapshot.task_id, None)
        if snapshot.is_terminal:
            self._flush_one(snapshot, state)
        return True

    def catch_up(self) -> int:
        """后台循环调用：重试所有落后于内存的任务。返回仍落后的数量。"""
        with self._lock:
            behind = list(self._behind.values())
        remaining = 0
        for machine in behind:
            with machine.lock:
                if not self.sync(machine):
                    remaining += 1
        return remaining

    @property
    def behind_count(self) -> int:
        with self._lock:
            return len(self._behind)

    def _flush_one(self, snapshot: TaskSnapshot, state: _TaskState) -> None:
        """终态时补写最后的进度（看板上"最终推进到哪了"）。

        只有进度变了才写：已结束任务的心跳没有用途（idle 判定与 reconcile 都不看终态任务），为它单独多一次
        写事务不值得——这条路径每个任务都要走一次。进度要写时顺带写上心跳，不多花一次往返。
        """
        if snapshot.progress is None or snapshot.progress == state.last_progress:
            return
        fields: dict[str, object] = {"progress": snapshot.progress}
        if snapshot.last_heartbeat_at is not None and snapshot.last_heartbeat_at != state.last_heartbeat:
            fields["heartbeat_at"] = snapshot.last_heartbeat_at
        try:
            self.store.touch(snapshot.task_id, **fields)  # type: ignore[arg-type]
        except TaskError as exc:
            self.record(snapshot.task_id, "touch", exc)
            return
        state.last_progress = snapshot.progress
        state.last_heartbeat = snapshot.last_heartbeat_at

    def flush_side_channel(self, snapshots: list[TaskSnapshot], *, renew_lease: bool) -> None:
        """批量回写进度、心跳（有变化才写）与租约（renew_lease 时为全部在管任务续租）。"""
        updates: list[tuple[str, dict[str, object]]] = []
        lease_until = self.lease_until() if renew_lease else None
        touched: list[tuple[_TaskState, TaskSnapshot]] = []
        for snapshot in snapshots:
            state = self._tasks.get(snapshot.task_id)
            if state is None or state.persisted_version is None:
                continue
            fields: dict[str, object] = {}
            if snapshot.progress is not None and snapshot.progress != state.last_progress:
                fields["progress"] = snapshot.progress
            if snapshot.last_heartbeat_at is not None and snapshot.last_heartbeat_at != state.last_heartbeat:
                fields["heartbeat_at"] = snapshot.last_heartbeat_at
            if lease_until is not None and not snapshot.is_terminal:
                fields["lease_owner"] = self.owner
                fields["lease_until"] = lease_until
            if fields:
                updates.append((snapshot.task_id, fields))
                touched.append((state, snapshot))
        if not updates:
            return
        try:
            self.store.touch_many(updates)
        except TaskError as exc:
            self.record(updates[0][0], f"touch×{len(updates)}", exc)
            return
        for state, snapshot in touched:
            state.last_progress = snapshot.progress
            state.last_heartbeat = snapshot.last_heartbeat_at

    def forget(self, task_id: str) -> None:
        self._tasks.pop(task_id, None)
        with self._lock:
            self._behind.pop(task_id, None)

    def snapshot_failures(self) -> list[PersistFailure]:
        with self._lock:
            return list(self.failures)


__all__ = ["MAX_PERSIST_FAILURES", "PersistFailure", "WriteThrough"]
