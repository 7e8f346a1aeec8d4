"""StateMachine：唯一能改 ``status`` 的地方。

每个动作一个方法。每个方法先查转移表（``chongming_task.core.statuses.TRANSITIONS``，只在那里声明一次）
与守卫，再生成新的不可变快照并追加一条 Transition。非法动作抛 InvalidTransition，
绝不静默返回 False——"停止指令没生效"这类问题靠静默失败是查不出来的。

转移表之外的守卫（用户指南 §11.3）都在这里：

* ``mark_running()`` 必须已有 ``started_at``。``started_at`` 的含义是"当前这次尝试何时开始"：
  ``mark_starting()`` 写入；任务一旦回到"未启动"（进 queued、从 queued / retry_wait 暂停、
  ``retry()``、``reset()``）就清空。于是 paused → running 只对就地暂停（经 pausing）成立。
* ``abort_pause()`` 只能从 pausing 出发。
* ``mark_starting()`` 要求 attempt + 1 <= max_attempts，否则抛 AttemptsExhausted。
* ``force_transition()`` 必须给出非空 actor 与 reason，记为 ``control:force``。
* ``mark_lost()`` 总会带一个 failure（调用方不给就记一条 kind=lost 的默认失败）。

线程安全：所有写入都在 ``self.lock`` 下进行。TaskRun 把自己的锁传进来，于是"每个 TaskRun
一把锁"与"状态机是唯一写者"是同一件事。

热路径的加锁写法：每个任务都要走的几个动作（入队、开始、就位、成功、记心跳、造兄弟任务、登记 / 弱化监听器、
旁路字段）写成 ``lock.acquire()`` + ``try`` / ``finally: lock.release()``，不经 ``with``。3.11 上 ``with``
一把 C 实现的 ``RLock`` 每次要现查 ``__enter__`` / ``__exit__``、各造一个绑定方法，再以三个 None 调
``__exit__``：约 540 ns，直接调用约 190 ns——一个空任务的受监督执行要加十来次锁（issue 17）。语义相同
（异常照样放锁）。

已持锁的入口：受监督的执行每个任务都走的三个动作（开始、就位、正常返回的成功）另有 ``*_locked`` 版本
（``mark_starting_locked`` / ``mark_running_locked`` / ``mark_succeeded_with_heartbeat_locked``）：公开方法
加锁之后就调它们，检查、结果与通知完全相同；TaskRun 本来就在自己的锁（就是这台状态机的锁）里调用，直接调它们，
不再重入地加一次锁（重入也要经 C 里的参数解析与一次 try / finally，约 0.15 µs）。不持锁时调用它们就是
数据竞争——只给持锁的调用方用。
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from types import MethodType
from typing import Any, TypeVar

from chongming_task.clock import SYSTEM_CLOCK, Clock
from chongming_task.core.records import (
    PACKED_TUPLE_MAX,
    STATUS_VALUE,
    Failure,
    FailureKind,
    PackedTransition,
    Progress,
    TaskSnapshot,
    Transition,
    _SnapshotShell,
    copy_with,
    pack_transition,
    require_aware,
    sanitize_reason,
    unpack_transition,
)
from chongming_task.core.statuses import (
    ADOPTABLE_STATUSES,
    RETRYABLE_FROM,
    TERMINAL_STATUSES,
    TRANSITIONS,
    TaskStatus,
)
from chongming_task.core.triggers import (
    AUDITED_TRIGGERS,
    TRIGGER_ADOPTED,
    TRIGGER_BLOCKED,
    TRIGGER_CANCELLED,
    TRIGGER_FAILED,
    TRIGGER_FORCE,
    TRIGGER_LOST,
    TRIGGER_PAUSE_ABORTED,
    TRIGGER_PAUSED,
    TRIGGER_PAUSING,
    TRIGGER_QUEUED,
    TRIGGER_RESET,
    TRIGGER_RETRY,
    TRIGGER_RETRY_WAIT,
    TRIGGER_RUNNING,
    TRIGGER_SKIPPED,
    TRIGGER_STARTING,
    TRIGGER_STOPPED,
    TRIGGER_STOPPING,
    TRIGGER_SUCCEEDED,
)
from chongming_task.errors import AttemptsExhausted, ConfigurationError, InvalidTransition

S = TaskStatus

TransitionListener = Callable[[TaskSnapshot, Transition], None]

_Owner = TypeVar("_Owner")


# 热路径上直接查普通 dict：它就是 TRANSITIONS 本身的内容（同一批 frozenset 对象），不是另一份表。
_TABLE: dict[TaskStatus, frozenset[TaskStatus]] = dict(TRANSITIONS)
_TERMINAL = TERMINAL_STATUSES
_ADOPTABLE = ADOPTABLE_STATUSES
_PENDING_VALUE = S.PENDING.value
# 每个任务都要走的那几个动作里用到的状态，存成模块常量。为什么：3.11 的 ``enum.EnumType`` 定义了
# ``__getattr__``，于是读 ``S.RUNNING`` 这样的类属性每次都经一个慢的钩子（先经包装调一次
# ``type.__getattribute__``，解释器也不能特化这次读取），约 170 ns，读一个模块全局约 16 ns（见
# core/statuses.py 的说明）。不常走的动作照旧写 ``S.X``。
_QUEUED = S.QUEUED
_STARTING = S.STARTING
_RUNNING = S.RUNNING
_SUCCEEDED = S.SUCCEEDED


# force_transition 落到非成功终态、又没有任何失败记录时补记的失败类型（与对应 mark_* 的默认一致）。
_FORCED_FAILURE: dict[TaskStatus, tuple[FailureKind, bool]] = {
    S.FAILED: (FailureKind.EXCEPTION, False),
    S.STOPPED: (FailureKind.CANCELLED, False),
    S.CANCELLED: (FailureKind.CANCELLED, False),
    S.SKIPPED: (FailureKind.CONDITION_FALSE, False),
    S.LOST: (FailureKind.LOST, True),
}


def _non_blank(value: object) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _check_failure(action: str, failure: object, *, required: bool) -> None:
    if failure is None and not required:
        return
    if not isinstance(failure, Failure):
        raise ConfigurationError(
            f"{action}() 的 failure 必须是 Failure(...)（例如 Failure.from_exception(exc)），收到 {failure!r}"
        )


def _check_aware(name: str, value: object) -> None:
    if value is None:
        raise ConfigurationError(f"{name} 必须是带时区的 datetime（例如 clock.now()），收到 None")
    require_aware(name, value)


_ENDINGS: dict[TaskStatus, tuple[FailureKind, str, bool, bool]] = {
    # 人工停止与编排层取消：不可重试（重试一个被停止的任务等于无视停止指令），并清掉待重试时刻。
    S.STOPPED: (FailureKind.CANCELLED, "任务已按请求停止", False, True),
    S.CANCELLED: (FailureKind.CANCELLED, "已被编排层取消", False, True),
    S.SKIPPED: (FailureKind.CONDITION_FALSE, "条件不满足，已跳过", False, False),
    # 结果未知：总带一个 failure，不记原因就无从判断该重跑还是人工核对。
    S.LOST: (FailureKind.LOST, "载体失联或被放弃，结果未知", True, False),
}
"""带 failure 落地的四个终态：(默认失败分类, 没给 reason 时的说明, 可否重试, 是否清空 retry_at)。"""


class _WeakOwner:
    """``weaken_owner_listener`` 之后的第一个监听器：``handler(owner, 快照, 记录)``，只弱引用 owner。"""

    __slots__ = ("_handler", "_owner")

    def __init__(self, handler: Callable[..., None] | None, owner: object) -> None:
        self._handler = handler
        self._owner = weakref.ref(owner)

    def __call__(self, snapshot: TaskSnapshot, record: Transition) -> None:
        owner = self._owner()
        if owner is not None and self._handler is not None:
            self._handler(owner, snapshot, record)

    def __eq__(self, other: object) -> bool:
        # remove_listener(owner.method) 照样能摘掉它（同 add_owner_listener 的说明）
        owner = self._owner()
        return owner is not None and self._handler is not None and MethodType(self._handler, owner) == other

    __hash__ = None  # type: ignore[assignment]


class StateMachine:
    """一个任务的状态机：当前快照 + 只追加的迁移历史。"""

    __slots__ = ("_clock", "_listener", "_listeners", "_owner", "_snapshot", "_transitions", "lock")

    def __init__(
        self,
        snapshot: TaskSnapshot,
        transitions: Iterable[Transition] = (),
        *,
        clock: Clock | None = None,
        lock: threading.RLock | None = None,
    ) -> None:
        """由快照 + 历史构造。历史可以为空（只有快照），给出时必须完整且与快照一致：

        版本号从 1 起逐一连续、每条的起点等于上一条的终点、末条的版本与状态等于快照的。
        不一致的历史意味着存储丢了或错配了记录，继续往上追加只会把错误固化，所以当场拒绝。
        """
        if not isinstance(snapshot, TaskSnapshot):
            raise ConfigurationError(f"StateMachine 需要一个 TaskSnapshot，收到 {snapshot!r}")
        history = list(transitions)
        task_id = snapshot.task_id
        previous: Transition | None = None
        for expected, record in enumerate(history, start=1):
            if not isinstance(record, Transition):
                raise ConfigurationError(f"任务 {task_id!r} 的历史里混入了非 Transition 对象：{record!r}")
            if record.task_id != task_id:
                raise ConfigurationError(f"迁移记录属于任务 {record.task_id!r}，不属于 {task_id!r}")
            if record.version != expected:
                raise ConfigurationError(
                    f"任务 {task_id!r} 的历史不连续：第 {expected} 条记录的版本号是 {record.version}"
                )
            if previous is not None and record.from_status is not previous.to_status:
                raise ConfigurationError(
                    f"任务 {task_id!r} 的历史断裂：版本 {record.version} 从 {record.from_status.value} 出发，"
                    f"而上一条落在 {previous.to_status.value}"
                )
            previous = record
        if previous is not None:
            if previous.version != snapshot.status_version:
                raise ConfigurationError(
                    f"任务 {task_id!r} 的快照版本 {snapshot.status_version} 与历史末条版本 "
                    f"{previous.version} 不一致"
                )
            if previous.to_status is not snapshot.status:
                raise ConfigurationError(
                    f"任务 {task_id!r} 的快照状态 {snapshot.status.value} 与历史末条 "
                    f"{previous.to_status.value} 不一致"
                )
        self._fill(snapshot, [pack_transition(record) for record in history], clock, lock)

    def _fill(
        self,
        snapshot: TaskSnapshot,
        history: tuple[PackedTransition, ...] | list[PackedTransition],
        clock: Clock | None,
        lock: threading.RLock | None,
    ) -> None:
        """填各个槽（``__init__`` 检查完历史之后；``sibling`` 的字段来自已检查的模板，直接填）。"""
        self._snapshot = snapshot
        # 历史按紧凑形式存（records.PackedTransition：GC 不追踪的元组），读 transitions 时才现造 Transition。
        # 装它们的容器在不长时也是元组：只装不被追踪的元组的元组，GC 同样不再追踪；列表总被追踪（issue 17）。
        # 每次迁移换一个长一条的新元组，复制的代价随条数增长，所以超过 PACKED_TUPLE_MAX 条后换成列表原地追加。
        self._transitions: tuple[PackedTransition, ...] | list[PackedTransition] = (
            tuple(history) if len(history) <= PACKED_TUPLE_MAX else list(history)
        )
        self._clock: Clock = clock or SYSTEM_CLOCK
        # 监听器按登记顺序是 (_listener, *_listeners)。第一个单独放一个槽、其余的放不可变元组（增删时
        # 整体换掉）：受监督的任务几乎都只有一个监听器（TaskRun 的），这样每个任务不必再带一个列表——
        # 在管任务成千上万时，每个少一个被循环 GC 追踪的容器（issue 17）；通知时也不必先复制一份。
        self._listener: Callable[..., None] | None = None
        self._listeners: tuple[TransitionListener, ...] = ()
        # 不为 None 时，第一个监听器是一个普通函数、以 ``_listener(_owner, 快照, 记录)`` 调用（见
        # add_owner_listener）：等价于登记 ``owner.method``，只是不为每台状态机常驻一个绑定方法对象。
        self._owner: Any = None
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
                raise ConfigurationError(
                    f"create() 不接受 {forbidden}：新任务总是从 pending、版本 0、第 0 次尝试开始"
                )
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

    def sibling(
        self, task_id: str, *, lock: threading.RLock | None = None, lease: Mapping[str, object] | None = None
    ) -> StateMachine:
        """批量提交的快路径（``Controller.submit_many`` 的模板）：本机是刚建好、只走过 pending → queued 的
        任务，复制出一台同样形状的新任务——换上 ``task_id`` 与此刻的时间，其余字段原样。

        等价于 ``create(...)`` 再 ``mark_queued()``，只是不再逐字段校验（字段与本机的相同，已校验过；
        ``task_id`` 由调用方校验），也不经 ``_apply`` 复制第二份快照：十万个任务的批量提交里每任务省一份
        快照、一次取时间。新任务的 created_at、queued_at 与那条迁移记录的时间是同一个时刻（提交即入队；
        逐个提交时两者相差几微秒，没有谁依赖那几微秒）。

        ``lease``：换上的租约字段（``lease_owner`` / ``lease_until``，调用方此刻算的）；不给时沿用模板的。
        """
        # 不经 with：见模块说明（热路径的加锁写法）。参数里的 lock 是新任务的锁，这里拿的是模板自己的。
        own = self.lock
        own.acquire()
        try:
            current = self._snapshot
            history = tuple(self._transitions)
        finally:
            own.release()
        first = history[0] if len(history) == 1 else None
        # 只有"刚入队、还没动过"的模板才能照抄：走过更多迁移的快照里带着那些迁移留下的字段（attempt、
        # started_at……），照抄就把别的任务的经历安到了新任务头上。
        if first is None or first[0] != _PENDING_VALUE or current.status is not _QUEUED:
            raise ConfigurationError(
                f"sibling() 只能从刚入队（pending → queued、只有一条迁移）的任务复制，任务 {self.task_id!r} "
                f"的状态是 {current.status.value}、有 {len(history)} 条迁移"
            )
        now = self._clock.now()
        changes: dict[str, Any] = {"task_id": task_id, "created_at": now, "queued_at": now}
        if lease:
            changes.update(lease)
        snapshot = copy_with(current, changes)
        from_value, to_value, trigger, actor, reason = first[:5]
        # 不经 __init__ 的历史检查：一条 pending → queued、版本 1、属于这个 task_id 的记录，按构造就是一致的。
        machine = object.__new__(type(self))
        machine._fill(snapshot, ((from_value, to_value, trigger, actor, reason, 1, now),), self._clock, lock)
        return machine

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
        with self.lock:
            packed = list(self._transitions)
        task_id = self._snapshot.task_id
        return tuple([unpack_transition(task_id, record) for record in packed])

    @property
    def clock(self) -> Clock:
        return self._clock

    def packed_transitions(self) -> tuple[PackedTransition, ...]:
        """全部迁移记录的紧凑形式（``records.PackedTransition``），按版本升序；与 ``transitions`` 逐条对应。

        写穿落库新任务时交给存储（``TaskStore._create_direct``）：内存存储的历史本来就存这种元组，不必先现造
        Transition 再拆回去（每个提交省一次加锁之外的解包与打包，issue 17）。元组本身不可变，直接交出去。"""
        # 不经 with：见模块说明（热路径的加锁写法）
        lock = self.lock
        lock.acquire()
        try:
            history = self._transitions
            return history if history.__class__ is tuple else tuple(history)
        finally:
            lock.release()

    def last_packed(self) -> PackedTransition:
        """（调用方持有 ``self.lock``）最近一条迁移记录的紧凑形式。监听器里（同一次持锁之内）就是刚发生、
        正交给它的那一条：写穿把它原样交给存储（``TaskStore._save_next``），内存存储直接存下这个元组，
        不必再打包一次（issue 17）。还没有任何迁移时抛 IndexError。"""
        return self._transitions[-1]

    def transitions_since(self, version: int) -> tuple[Transition, ...]:
        """版本号大于 ``version`` 的迁移记录（写穿存储时只送新增的那几条）。

        按版本号而不是按下标取：只凭快照（没有历史）重建的状态机，列表下标与版本号并不对齐。
        """
        with self.lock:
            history = self._transitions
            if not history:
                return ()
            start = max(0, version - history[0][5] + 1)
            packed = history[start:]
        task_id = self._snapshot.task_id
        return tuple([unpack_transition(task_id, record) for record in packed])

    def can(self, target: TaskStatus) -> bool:
        """预检：对应的动作现在会不会被接受（转移表 + §11.3 的状态守卫 + 尝试预算）。

        与动作的实际结果一致：``can(x)`` 为 True 时，走向 x 的自然动作不会抛
        InvalidTransition / AttemptsExhausted。
        """
        snapshot = self._snapshot
        if target not in _TABLE[snapshot.status]:
            return False
        if target is S.RUNNING:
            return snapshot.started_at is not None
        if target is S.STARTING:
            return snapshot.attempt + 1 <= snapshot.max_attempts
        return True

    @property
    def can_stop(self) -> bool:
        allowed = _TABLE[self._snapshot.status]
        return S.STOPPED in allowed or S.STOPPING in allowed

    @property
    def can_pause(self) -> bool:
        allowed = _TABLE[self._snapshot.status]
        return S.PAUSING in allowed or S.PAUSED in allowed

    @property
    def can_resume(self) -> bool:
        """paused（恢复到 running 或 queued）或 pausing（撤销暂停请求，回到 running）。"""
        return self._snapshot.status in (S.PAUSED, S.PAUSING)

    @property
    def can_retry(self) -> bool:
        return self._snapshot.status in RETRYABLE_FROM

    def add_listener(self, listener: TransitionListener) -> None:
        """每次迁移之后（仍在锁内）以 (新快照, 迁移记录) 调用一次。用于写穿存储与唤醒调度器。

        迁移在调用监听器之前就已生效；某个监听器抛异常时，其余监听器照常被调用，之后把第一个
        异常抛给动作的调用方——状态已经变了，调用方需要知道通知没送达，但不能因此让别的
        监听器漏掉这次迁移。
        """
        with self.lock:
            if self._listener is None:
                self._listener = listener
            else:
                self._listeners = (*self._listeners, listener)

    def add_owner_listener(
        self, owner: _Owner, handler: Callable[[_Owner, TaskSnapshot, Transition], None]
    ) -> None:
        """同 ``add_listener(MethodType(handler, owner))``（顺序、异常与摘除的规矩都一样）：每次迁移之后以
        ``handler(owner, 新快照, 迁移记录)`` 调用。

        为什么单有这个入口：TaskRun 给自己的状态机登记的监听器是它自己的方法；绑定方法是一个常驻的、被
        循环 GC 追踪的对象，积压上万个任务时每个任务多一个要扫的对象（issue 17）。这里只存函数与 owner 两个
        引用（槽位），调用时再传 owner。只有它是第一个监听器时才这样存；之前已有别的监听器时退回普通登记。
        ``remove_listener(owner.method)`` 照样能摘掉它（绑定方法按 ``__self__`` 与 ``__func__`` 比较相等）。
        """
        if owner is None:
            raise ConfigurationError("add_owner_listener() 的 owner 不能是 None")
        # 不经 with：见模块说明（热路径的加锁写法）
        lock = self.lock
        lock.acquire()
        try:
            if self._listener is None:
                self._listener, self._owner = handler, owner
            else:
                self.add_listener(MethodType(handler, owner))
        finally:
            lock.release()

    def weaken_owner_listener(self) -> None:
        """把 ``add_owner_listener`` 登记的那个监听器改成只弱引用它的 owner（之后照样按顺序通知它，owner
        已被回收就跳过）。没有这样登记的监听器时什么也不做。

        为什么：owner（TaskRun）引用状态机、状态机经监听器引用 owner，是一个环——没人再引用它们时只能等
        循环 GC 的全量回收（它们早已活过年轻代）。控制器不再管一个已落地的任务时（``keep_finished`` 清出、
        ``close()``）调用它：之后谁也不引用这个句柄，引用计数当场释放它；调用方手里的句柄照样收到通知
        （issue 17）。"""
        # 不经 with：见模块说明（热路径的加锁写法）
        lock = self.lock
        lock.acquire()
        try:
            owner = self._owner
            if owner is None:
                return
            self._listener = _WeakOwner(self._listener, owner)
            self._owner = None
        finally:
            lock.release()

    def remove_listener(self, listener: TransitionListener) -> None:
        """摘掉最早登记的那一个（没登记过时抛 ValueError，同 ``list.remove``）。"""
        with self.lock:
            first = self._listener
            if first is not None and self._owner is not None:
                first = MethodType(first, self._owner)
            if first is not None and first == listener:
                rest = self._listeners
                self._listener, self._listeners = (rest[0], rest[1:]) if rest else (None, ())
                self._owner = None
                return
            rest_list = list(self._listeners)
            rest_list.remove(listener)
            self._listeners = tuple(rest_list)

    # -- the single write path ----------------------------------------------------------------------

    def _apply(
        self,
        target: TaskStatus,
        trigger: str,
        actor: str | None,
        reason: str | None,
        changes: dict[str, Any],
        now: datetime | None = None,
        *,
        checked: bool = True,
    ) -> TaskSnapshot:
        """唯一的写路径。调用方持有 ``self.lock``。"""
        current = self._snapshot
        source = current.status
        if checked:
            if target not in _TABLE[source]:
                raise InvalidTransition(source, target, trigger, _TABLE[source])
            if trigger.__class__ is not str or not trigger or trigger in AUDITED_TRIGGERS:
                raise ConfigurationError(
                    f"trigger 必须是非空字符串，且不能冒用 {sorted(AUDITED_TRIGGERS)}（它们只属于 "
                    f"retry() / reset() / force_transition()），收到 {trigger!r}"
                )
        if now is None:
            now = self._clock.now()
        version = current.status_version + 1
        if target in _TERMINAL and "finished_at" not in changes:
            changes["finished_at"] = now
        changes["status_version"] = version
        # 热路径：快照与迁移记录都直接填实例字典，跳过 frozen dataclass 逐字段 object.__setattr__
        # 的 __init__。字段值来自已校验的快照与上面的检查，不需要再走 __post_init__。下面几行就是
        # records.copy_with（同一种复制，内联：每次迁移省一层函数调用）。status 与 tags 在槽里、不进实例
        # 字典（见 records._SnapshotSlots：字典里只剩原子值时循环 GC 不追踪它）；调用方的 changes 从不带
        # 这两个。
        state = current.__dict__.copy()
        state.update(changes)
        shell: Any = _SnapshotShell()  # 空壳：见 records.copy_with
        shell.__dict__ = state
        shell.status = target
        shell.tags = current.tags
        shell.__class__ = TaskSnapshot
        snapshot: TaskSnapshot = shell
        # actor / reason 可能来自用户（stop(reason=...)）或拼进了异常消息：整理成每个后端都存得下的文本。
        if actor is not None:  # 多数迁移两者都没有：不为 None 调用整理函数（每个任务四次迁移）
            actor = sanitize_reason(actor)
        if reason is not None:
            reason = sanitize_reason(reason)
        record = Transition._trusted(current.task_id, source, target, trigger, actor, reason, version, now)
        self._snapshot = snapshot
        packed = (STATUS_VALUE[source], STATUS_VALUE[target], trigger, actor, reason, version, now)
        history = self._transitions
        if history.__class__ is tuple and len(history) < PACKED_TUPLE_MAX:
            self._transitions = (*history, packed)
        elif isinstance(history, list):
            history.append(packed)
        else:
            self._transitions = [*history, packed]
        listener = self._listener
        if listener is not None:
            owner = self._owner
            if owner is not None and not self._listeners:
                # 最常见：只有 TaskRun 登记的那一个（add_owner_listener）。只有一个监听器时 _notify 的
                # "先让其余监听器看到、再抛第一个异常"就是直接调用它、让异常照常抛出：不再多转一层。
                listener(owner, snapshot, record)
            else:
                self._notify(snapshot, record)
        return snapshot

    def _notify(self, snapshot: TaskSnapshot, record: Transition) -> None:
        first_error: BaseException | None = None
        # 先取下这一刻的登记（监听器里增删监听器只影响下一次迁移，同原来"先复制一份列表"的语义）。
        first, owner, rest = self._listener, self._owner, self._listeners
        try:
            if owner is not None:
                first(owner, snapshot, record)  # type: ignore[misc]
            elif first is not None:
                first(snapshot, record)
        except BaseException as exc:  # 记下来，先让其余监听器看到这次迁移，再抛给调用方
            first_error = exc
        for listener in rest:
            try:
                listener(snapshot, record)
            except BaseException as exc:
                if first_error is None:
                    first_error = exc
        if first_error is not None:
            raise first_error

    def _refuse(self, target: TaskStatus, trigger: str, detail: str) -> InvalidTransition:
        status = self._snapshot.status
        return InvalidTransition(status, target, trigger, _TABLE[status], detail)

    # -- one method per action ----------------------------------------------------------------------

    def mark_blocked(
        self, *, trigger: str = TRIGGER_BLOCKED, actor: str | None = None, reason: str | None = None
    ) -> TaskSnapshot:
        """依赖未满足，等待上游（pending → blocked）。"""
        with self.lock:
            return self._apply(S.BLOCKED, trigger, actor, reason, {})

    def mark_queued(
        self, *, trigger: str = TRIGGER_QUEUED, actor: str | None = None, reason: str | None = None
    ) -> TaskSnapshot:
        """就绪，等待执行槽。queued 意味着"未启动"，所以清空 started_at（见模块说明）。"""
        # 不经 with：见模块说明（热路径的加锁写法）
        lock = self.lock
        lock.acquire()
        try:
            now = self._clock.now()
            changes = {"queued_at": now, "started_at": None, "retry_at": None}
            return self._apply(_QUEUED, trigger, actor, reason, changes, now)
        finally:
            lock.release()

    def mark_starting(
        self,
        *,
        executor: str | None = None,
        trigger: str = TRIGGER_STARTING,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        """开始新一次尝试：attempt + 1，记下 started_at。预算不够时抛 AttemptsExhausted。"""
        # 不经 with：见模块说明（热路径的加锁写法）
        lock = self.lock
        lock.acquire()
        try:
            return self.mark_starting_locked(executor, trigger, actor, reason)
        finally:
            lock.release()

    def mark_starting_locked(
        self,
        executor: str | None = None,
        trigger: str = TRIGGER_STARTING,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        """``mark_starting`` 本身，给已持有 ``self.lock`` 的调用方（见模块说明"已持锁的入口"）。"""
        current = self._snapshot
        allowed = _TABLE[current.status]
        if _STARTING not in allowed:
            raise InvalidTransition(current.status, _STARTING, trigger, allowed)
        if current.attempt + 1 > current.max_attempts:
            raise AttemptsExhausted(
                f"任务 {current.task_id!r} 已尝试 {current.attempt} 次，达到上限 "
                f"max_attempts={current.max_attempts}，不能再开始第 {current.attempt + 1} 次；"
                "如需再跑，请让它落终态后调用 retry()"
            )
        now = self._clock.now()
        changes: dict[str, Any] = {
            "attempt": current.attempt + 1,
            "started_at": now,
            "retry_at": None,
            "failure": None,
            "pid": None,
        }
        if executor is not None:
            changes["executor"] = executor
        return self._apply(_STARTING, trigger, actor, reason, changes, now)

    def mark_running(
        self,
        *,
        pid: int | None = None,
        trigger: str = TRIGGER_RUNNING,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        """载体已就位（starting → running），或就地暂停后恢复（pausing / paused → running）。"""
        # 不经 with：见模块说明（热路径的加锁写法）
        lock = self.lock
        lock.acquire()
        try:
            return self.mark_running_locked(pid, trigger, actor, reason)
        finally:
            lock.release()

    def mark_running_locked(
        self,
        pid: int | None = None,
        trigger: str = TRIGGER_RUNNING,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        """``mark_running`` 本身，给已持有 ``self.lock`` 的调用方（见模块说明"已持锁的入口"）。"""
        if self._snapshot.started_at is None and _RUNNING in _TABLE[self._snapshot.status]:
            raise self._refuse(
                _RUNNING,
                trigger,
                "任务从未启动（缺少 started_at）：排队或重试等待期间暂停的任务，恢复后应回到 queued",
            )
        return self._apply(_RUNNING, trigger, actor, reason, {} if pid is None else {"pid": pid})

    def mark_succeeded(
        self,
        *,
        outcome: Any = None,
        trigger: str = TRIGGER_SUCCEEDED,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        """正常完成（running → succeeded，或停止请求发出后恰好跑完：stopping → succeeded）。"""
        # 不经 with：见模块说明（热路径的加锁写法）
        lock = self.lock
        lock.acquire()
        try:
            return self._apply(_SUCCEEDED, trigger, actor, reason, {"outcome": outcome, "failure": None})
        finally:
            lock.release()

    def mark_succeeded_with_heartbeat(self, outcome: Any, heartbeat_at: datetime) -> TaskSnapshot:
        """``note_heartbeat(heartbeat_at)`` 紧接着 ``mark_succeeded(outcome=outcome)``，只复制一份快照。

        为什么单有它：受监督的执行每次结算都先把最后一次心跳记进快照、再落终态（同一次持锁之内），两步各复制
        一份快照；最常见的结局（running 里正常返回）两步并成一次迁移，每个任务少一份快照拷贝与一次方法调用
        （issue 17）。检查与结果都与两步相同：心跳同 ``note_heartbeat`` 那样检查，迁移照常查表、照常记下、
        照常通知监听器（它们看到的新快照里已有这次心跳，与两步时看到的一样）。迁移被拒时心跳也不记（调用方
        只在 running 时用它，迁移不会被拒）。
        """
        # 不经 with：见模块说明（热路径的加锁写法）
        lock = self.lock
        lock.acquire()
        try:
            return self.mark_succeeded_with_heartbeat_locked(outcome, heartbeat_at)
        finally:
            lock.release()

    def mark_succeeded_with_heartbeat_locked(self, outcome: Any, heartbeat_at: datetime) -> TaskSnapshot:
        """``mark_succeeded_with_heartbeat`` 本身，给已持有 ``self.lock`` 的调用方（见模块说明"已持锁的
        入口"）。"""
        if heartbeat_at.__class__ is not datetime or heartbeat_at.tzinfo is not UTC:
            _check_aware("heartbeat_at", heartbeat_at)  # 同 note_heartbeat
        changes = {"outcome": outcome, "failure": None, "last_heartbeat_at": heartbeat_at}
        return self._apply(_SUCCEEDED, TRIGGER_SUCCEEDED, None, None, changes)

    def mark_failed(
        self,
        *,
        failure: Failure,
        trigger: str = TRIGGER_FAILED,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        with self.lock:
            _check_failure("mark_failed", failure, required=True)
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
        """本次尝试失败，退避等待到 ``retry_at``。started_at 保留，记录的是刚失败的那次尝试。"""
        with self.lock:
            _check_failure("mark_retry_wait", failure, required=True)
            _check_aware("retry_at", retry_at)
            return self._apply(
                S.RETRY_WAIT, trigger, actor, reason, {"failure": failure, "retry_at": retry_at}
            )

    def mark_pausing(
        self, *, trigger: str = TRIGGER_PAUSING, actor: str | None = None, reason: str | None = None
    ) -> TaskSnapshot:
        with self.lock:
            return self._apply(S.PAUSING, trigger, actor, reason, {})

    def mark_paused(
        self, *, trigger: str = TRIGGER_PAUSED, actor: str | None = None, reason: str | None = None
    ) -> TaskSnapshot:
        """已挂起。经 pausing 的是就地暂停（保留 started_at，之后可回 running）；
        从 queued / retry_wait 直接暂停的任务没有在跑的载体，清空 started_at，恢复时只能回 queued。"""
        with self.lock:
            changes: dict[str, Any] = {} if self._snapshot.status is S.PAUSING else {"started_at": None}
            return self._apply(S.PAUSED, trigger, actor, reason, changes)

    def abort_pause(
        self, *, trigger: str = TRIGGER_PAUSE_ABORTED, actor: str | None = None, reason: str | None = None
    ) -> TaskSnapshot:
        """暂停没生效：pausing → running。只允许从 pausing 出发（paused → running 是给恢复用的）。"""
        with self.lock:
            if self._snapshot.status is not S.PAUSING:
                raise self._refuse(S.RUNNING, trigger, "abort_pause() 只能从 pausing 出发")
            if self._snapshot.started_at is None:  # 只可能出现在 force_transition 之后
                raise self._refuse(S.RUNNING, trigger, "任务从未启动（缺少 started_at），不能回滚成 running")
            return self._apply(S.RUNNING, trigger, actor, reason, {})

    def mark_stopping(
        self, *, reason: str | None = None, trigger: str = TRIGGER_STOPPING, actor: str | None = None
    ) -> TaskSnapshot:
        """已请求停止，进入优雅窗口。只对占着执行资源的任务（starting / running / pausing）成立。"""
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
        return self._end_with_failure(S.STOPPED, "mark_stopped", failure, trigger, actor, reason)

    def mark_cancelled(
        self,
        *,
        failure: Failure | None = None,
        trigger: str = TRIGGER_CANCELLED,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        """编排层级联取消（例如 fail_fast 连坐）。与 stopped 分开：责任方不同。"""
        return self._end_with_failure(S.CANCELLED, "mark_cancelled", failure, trigger, actor, reason)

    def mark_skipped(
        self,
        *,
        failure: Failure | None = None,
        trigger: str = TRIGGER_SKIPPED,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        return self._end_with_failure(S.SKIPPED, "mark_skipped", failure, trigger, actor, reason)

    def mark_lost(
        self,
        *,
        failure: Failure | None = None,
        trigger: str = TRIGGER_LOST,
        actor: str | None = None,
        reason: str | None = None,
    ) -> TaskSnapshot:
        """结果未知。总会带一个 failure：不记原因就无从判断该重跑还是人工核对。"""
        return self._end_with_failure(S.LOST, "mark_lost", failure, trigger, actor, reason)

    def _end_with_failure(
        self,
        target: TaskStatus,
        action: str,
        failure: Failure | None,
        trigger: str,
        actor: str | None,
        reason: str | None,
    ) -> TaskSnapshot:
        """mark_stopped / mark_cancelled / mark_skipped / mark_lost 的共同实现（默认失败见 ``_ENDINGS``）。"""
        with self.lock:
            _check_failure(action, failure, required=False)
            kind, default_reason, retryable, clears_retry_at = _ENDINGS[target]
            if failure is None:
                failure = Failure(kind, reason or default_reason, retryable=retryable)
            changes: dict[str, Any] = {"failure": failure}
            if clears_retry_at:
                changes["retry_at"] = None
            return self._apply(target, trigger, actor, reason, changes)

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
        # 不经 with：见模块说明（热路径的加锁写法）
        lock = self.lock
        lock.acquire()
        try:
            changes: dict[str, Any] = {}
            if progress is not None:
                if not isinstance(progress, Progress):
                    raise ConfigurationError(f"progress 必须是 Progress(...)，收到 {progress!r}")
                changes["progress"] = progress
            if heartbeat_at is not None:
                _check_aware("heartbeat_at", heartbeat_at)
                changes["last_heartbeat_at"] = heartbeat_at
            if pid is not None:
                if isinstance(pid, bool) or not isinstance(pid, int):
                    raise ConfigurationError(f"pid 必须是整数，收到 {pid!r}")
                changes["pid"] = pid
            if lease_owner is not None:
                changes["lease_owner"] = lease_owner
            if lease_until is not None:
                _check_aware("lease_until", lease_until)
                changes["lease_until"] = lease_until
            if changes:
                self._snapshot = self._snapshot.evolve(**changes)
            return self._snapshot
        finally:
            lock.release()

    def note_heartbeat(self, heartbeat_at: datetime) -> TaskSnapshot:
        """``update_side(heartbeat_at=...)`` 的单字段版本：受监督的执行每次结算都把最后一次心跳记进快照，
        不必为一个字段走一遍五个可选参数的判定（检查与结果都相同）。"""
        # 不经 with：见模块说明（热路径的加锁写法）
        lock = self.lock
        lock.acquire()
        try:
            if heartbeat_at.__class__ is not datetime or heartbeat_at.tzinfo is not UTC:
                _check_aware("heartbeat_at", heartbeat_at)  # UTC 时间（真实时钟给的）显然合格，其余照常检查
            self._snapshot = copy_with(self._snapshot, {"last_heartbeat_at": heartbeat_at})
            return self._snapshot
        finally:
            lock.release()

    # -- the explicit revivals and the one arbitrary jump ------------------------------------------

    def retry(self, *, actor: str | None = None, reason: str | None = None) -> TaskSnapshot:
        """从 failed / stopped / cancelled / lost 复活到 queued，记为 ``control:retry``。

        保留迁移历史与尝试计数（attempt 不归零）。若尝试预算已用完，额外再给一次
        （max_attempts 提到 attempt + 1），否则复活后第一次 mark_starting 就会 AttemptsExhausted。
        """
        with self.lock:
            current = self._snapshot
            if current.status not in RETRYABLE_FROM:
                allowed = ", ".join(s.value for s in TaskStatus if s in RETRYABLE_FROM)
                raise self._refuse(S.QUEUED, TRIGGER_RETRY, f"retry() 只能从 {allowed} 出发")
            now = self._clock.now()
            changes: dict[str, Any] = {
                "max_attempts": max(current.max_attempts, current.attempt + 1),
                "failure": None,
                "outcome": None,
                "started_at": None,
                "finished_at": None,
                "retry_at": None,
                "pid": None,
                "queued_at": now,
            }
            return self._apply(S.QUEUED, TRIGGER_RETRY, actor, reason, changes, now, checked=False)

    def adopt(self, owner: str, *, actor: str, reason: str) -> TaskSnapshot:
        """持久任务换持有者（``cluster:adopted``）：状态不变，记一条 from == to 的迁移记录，
        写明接手者与原持有者。

        只对不占执行资源的非终态（queued / paused / retry_wait）成立：占着资源的任务失联时由 reconcile 判
        lost，不能被"接手"（载体已随进程消失）。暂停的仍暂停，重试等待的保留它的到期时刻。
        """
        with self.lock:
            current = self._snapshot
            if current.recipe is None:
                raise ConfigurationError(f"任务 {current.task_id!r} 不是持久任务（没有配方）：不能被接手")
            if current.status not in _ADOPTABLE:
                allowed = ", ".join(s.value for s in _ADOPTABLE)
                raise self._refuse(current.status, TRIGGER_ADOPTED, f"只有 {allowed} 的持久任务能被接手")
            if not _non_blank(owner) or not _non_blank(actor):
                raise ConfigurationError(f"adopt() 需要非空的 owner 与 actor，收到 {owner!r} / {actor!r}")
            return self._apply(
                current.status, TRIGGER_ADOPTED, actor, reason, {"owner": owner}, checked=False
            )

    def reset(
        self, *, confirm: bool = False, actor: str | None = None, reason: str | None = None
    ) -> TaskSnapshot:
        """回到 pending，丢弃尝试计数与结果，记为 ``control:reset``。必须显式 ``confirm=True``。

        迁移历史仍然保留：审计轨迹只追加，reset 本身也是其中一条记录。只能用于已落终态的任务。
        """
        with self.lock:
            if confirm is not True:
                raise ConfigurationError(
                    "reset() 会丢弃全部尝试计数与结果，属于危险操作：请显式传 confirm=True"
                )
            if self._snapshot.status not in _TERMINAL:
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

    def force_transition(
        self, target: TaskStatus, *, actor: str, reason: str, failure: Failure | None = None
    ) -> TaskSnapshot:
        """唯一能任意跳转的入口：必须给出非空 actor 与 reason，记为 ``control:force``。

        不查转移表也不查守卫——它就是给人工核对之后纠正状态用的（例如把 lost 标成 succeeded）。
        落到非成功终态时快照总带着失败原因：给了 ``failure`` 就用它，否则沿用已有的，再没有就以
        reason 记一条（lost 的意义就是"不知道结果"，连原因都不记就无从判断）。强制成 succeeded
        会清掉旧的失败：一个成功的快照不该同时挂着失败。
        """
        with self.lock:
            if not _non_blank(actor) or not _non_blank(reason):
                raise ConfigurationError(
                    "force_transition() 必须给出非空的 actor 与 reason：没有审计信息就无法事后追溯，"
                    f"收到 actor={actor!r}, reason={reason!r}"
                )
            try:
                target = TaskStatus(target)
            except ValueError:
                known = ", ".join(s.value for s in TaskStatus)
                raise ConfigurationError(f"未知的目标状态 {target!r}；可选：{known}") from None
            if target is self._snapshot.status:
                raise ConfigurationError(f"任务已处于 {target.value}，force_transition() 不做无变化的跳转")
            _check_failure("force_transition", failure, required=False)
            changes: dict[str, Any] = {}
            if target not in _TERMINAL:
                changes["finished_at"] = None
            if target is S.SUCCEEDED:
                changes["failure"] = None
            elif failure is not None:
                changes["failure"] = failure
            elif target in _TERMINAL and self._snapshot.failure is None:
                kind, retryable = _FORCED_FAILURE[target]
                changes["failure"] = Failure(
                    kind, f"人工标记为 {target.value}：{reason}", retryable=retryable
                )
            return self._apply(target, TRIGGER_FORCE, actor, reason, changes, checked=False)

    def __repr__(self) -> str:
        snap = self._snapshot
        return f"StateMachine({snap.task_id!r}, status={snap.status.value}, version={snap.status_version})"


__all__ = [
    "AUDITED_TRIGGERS",
    "TRIGGER_BLOCKED",
    "TRIGGER_CANCELLED",
    "TRIGGER_FAILED",
    "TRIGGER_FORCE",
    "TRIGGER_LOST",
    "TRIGGER_PAUSED",
    "TRIGGER_PAUSE_ABORTED",
    "TRIGGER_PAUSING",
    "TRIGGER_QUEUED",
    "TRIGGER_RESET",
    "TRIGGER_RETRY",
    "TRIGGER_RETRY_WAIT",
    "TRIGGER_RUNNING",
    "TRIGGER_SKIPPED",
    "TRIGGER_STARTING",
    "TRIGGER_STOPPED",
    "TRIGGER_STOPPING",
    "TRIGGER_SUCCEEDED",
    "StateMachine",
    "TransitionListener",
]
