"""TaskRun 与 run_task：受监督地执行一个任务（用户指南 §3–§6）。

一个 TaskRun = 一个状态机 + 一把锁 + 当前这次尝试的把手。不变量：

* 状态只经由 ``StateMachine`` 改变，而且每次写入都在 ``machine.lock`` 下（TaskRun 的锁就是状态机的锁，
  控制器传进来的状态机也一样）；
* 诚实优先：停不掉的线程记 ``lost`` 而不是 ``stopped``；没在检查点挂起就不说"已暂停"
  （``runtime:pause_aborted`` 记录回滚）；停止请求之后正常返回的任务记 ``succeeded``；
* 没有占执行槽的任务（pending / queued / 排队中暂停 / retry_wait），控制动作立即生效，不经过
  pausing / stopping 这类"请等待"的中间态；
* 超时不是状态：到期后请求停止，并把结果记成 ``timeout_*`` 失败（默认可重试）。暂停期间不计时，
  idle 只在本次尝试开始执行之后才计。

所有"到点做事"（超时、优雅窗口、重试等待）都登记在按时钟共享的看门狗线程上（见
``chongming_task.runtime.supervisor``），不为每个任务起监督线程。

和控制器的接缝：

* ``TaskRun(..., machine=...)``：用控制器造好的（可能已经 queued 的）状态机及其锁；
* ``on_requeue``：重试等待到期时调用 ``on_requeue(run)``（在锁外），由控制器把它放回就绪队列并在有
  额度时再次 ``start()``；为 None 时 TaskRun 自己直接开始下一次尝试。排队中暂停的任务恢复时总是
  回到 queued：独立运行的 TaskRun 立即重新启动，带 ``on_requeue`` 的交给控制器（它的状态机监听器
  会看到 queued 这次迁移）；
* ``on_transition``：每次迁移之后（锁内）以 ``on_transition(run, snapshot, record)`` 调用，排在 TaskRun
  自己的处理（叫醒 ``wait()``）之前——控制器的写穿与调度记账都经它。每条终态路径都经过状态机，所以控制器
  由此知道任务结束。
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from chongming_task.clock import SYSTEM_CLOCK, Clock
from chongming_task.context import MAX_LOGS, LogEntry
from chongming_task.core.numbers import MAX_SECONDS, check_int, check_seconds
from chongming_task.core.records import MAX_PRIORITY, MIN_PRIORITY
from chongming_task.core.state_machine import StateMachine
from chongming_task.core.triggers import (
    TRIGGER_CANCEL,
    TRIGGER_CARRIER_EXITED,
    TRIGGER_DEPENDENCY_FAILED,
    TRIGGER_PAUSE,
    TRIGGER_RECONCILE,
    TRIGGER_RELEASED,
    TRIGGER_RESUME,
    TRIGGER_RETRY_DUE,
    TRIGGER_START,
    TRIGGER_STOP,
    TRIGGER_TIMEOUT_ATTEMPT,
    TRIGGER_TIMEOUT_IDLE,
    TRIGGER_TIMEOUT_START,
)
from chongming_task.decorators import TaskSpec, task_spec
from chongming_task.errors import ConfigurationError, InvalidTransition
from chongming_task.models import (
    Failure,
    FailureKind,
    Outcome,
    Progress,
    TaskSnapshot,
    Transition,
    normalize_tags,
)
from chongming_task.policies import NO_RETRY, NO_TIMEOUT, RetryPolicy, Timeout
from chongming_task.runtime.executors.base import (
    AttemptEvents,
    AttemptHandle,
    AttemptResult,
    AttemptSpec,
    Executor,
    ResultKind,
    Submission,
)
from chongming_task.runtime.executors.thread import ThreadExecutor
from chongming_task.runtime.interruptible import wait_event
from chongming_task.runtime.signature import check_task_signature
from chongming_task.runtime.supervisor import Timer, Watchdog
from chongming_task.runtime.task_logs import LogSink
from chongming_task.states import TERMINAL_STATUSES, TRANSITIONS, TaskStatus

S = TaskStatus
# 每个任务都要走的路径（start、载体就位、结算）上用到的成员存成模块常量：读枚举类的属性在 3.11 上经一个慢钩子
# （约 170 ns，见 core/statuses.py 的说明）。其余代码照旧写 S.X。
_PENDING = S.PENDING
_QUEUED = S.QUEUED
_STARTING = S.STARTING
_RUNNING = S.RUNNING
_RETURNED = ResultKind.RETURNED
logger = logging.getLogger("chongming_task.runtime")

DEFAULT_PAUSE_TIMEOUT = 5.0
"""``pause()`` 等待"任务已在检查点挂起"确认的默认窗口（秒）。"""

DEFAULT_EXECUTOR = ThreadExecutor()

_BASE_CHECK_SUBMITTABLE = Executor.check_submittable

_NOT_STARTED = frozenset({S.PENDING, S.BLOCKED, S.QUEUED, S.RETRY_WAIT})

# 超时失败的迁移记在哪个触发源下：历史里要看得出"这是哪一档超时"，而不是一次普通的 executor:failed。
_TIMEOUT_TRIGGERS: dict[FailureKind, str] = {
    FailureKind.TIMEOUT_START: TRIGGER_TIMEOUT_START,
    FailureKind.TIMEOUT_ATTEMPT: TRIGGER_TIMEOUT_ATTEMPT,
    FailureKind.TIMEOUT_IDLE: TRIGGER_TIMEOUT_IDLE,
}


_NO_TIMERS: dict[str, Timer] = {}
"""尝试一开始的定时器表：共用、**只读**（登记一律经 ``_Attempt.add_timer``，它换上本尝试自己的表）。"""


class _Attempt:
    """一次尝试的监督状态（只在 TaskRun 的锁下读写）。

    定时器表一开始是共用的空表 ``_NO_TIMERS``：绝大多数尝试一个定时器也不登记，不为它们每次造一个空字典
    （issue 17）。撤、取定时器对共用的空表什么也不做；登记经 ``add_timer``，第一次登记时换上自己的表。
    仍用 ``__slots__``、构造时写全每个字段：读槽是解释器特化的直接读取，而读类上的初值（TaskRun 的按需
    字段那样）每次约多 35 ns——一次尝试里这些字段还没写过就要读十来次，比构造时写一遍贵。"""

    __slots__ = (
        "_pause_signal",
        "attempt_deadline",
        "attempt_remaining",
        "cancel_reason",
        "handle",
        "killed",
        "number",
        "running",
        "settled",
        "stop_reason",
        "stop_requested",
        "synced_beat",
        "timeout_failure",
        "timers",
    )

    def __init__(self, number: int) -> None:
        self.number = number
        self.handle: AttemptHandle | None = None
        self.settled = False
        self.running = False
        self.stop_requested = False
        self.stop_reason: str | None = None
        self.timeout_failure: Failure | None = None
        self.killed = False
        self.cancel_reason: str | None = None
        self.timers: dict[str, Timer] = _NO_TIMERS
        self.attempt_deadline: float | None = None
        self.attempt_remaining: float | None = None
        self._pause_signal: threading.Event | None = None
        self.synced_beat: float | None = None

    def add_timer(self, name: str, timer: Timer) -> None:
        timers = self.timers
        if timers is _NO_TIMERS:
            self.timers = timers = {}
        timers[name] = timer

    def pause_signal(self, *, fresh: bool) -> threading.Event:
        """等暂停确认的信号（惰性创建：绝大多数尝试从不暂停）。在 TaskRun 的锁下调用。"""
        if fresh or self._pause_signal is None:
            self._pause_signal = threading.Event()
        return self._pause_signal

    def wake_pauser(self) -> None:
        """唤醒等暂停确认的一方（已挂起、已结束、被停止、被撤销……让它重新判定）。"""
        signal = self._pause_signal
        if signal is not None:
            signal.set()

    def cancel_timer(self, name: str) -> None:
        timer = self.timers.pop(name, None)
        if timer is not None:
            timer.cancel()

    def cancel_timers(self, *, keep: tuple[str, ...] = ()) -> None:
        for name in list(self.timers):
            if name not in keep:
                self.cancel_timer(name)


class _Events(AttemptEvents):
    """把载体的报告转给 TaskRun（每次尝试一个，迟到的报告因此能被认出并忽略）。"""

    __slots__ = ("_attempt", "_run")

    def __init__(self, run: TaskRun, attempt: _Attempt) -> None:
        self._run = run
        self._attempt = attempt

    def running(self, pid: int | None) -> None:
        self._run._on_running(self._attempt, pid)

    def progress(self, progress: Progress) -> None:
        self._run._on_progress(self._attempt, progress)

    def log(self, entry: LogEntry) -> None:
        sink = self._run._log_sink
        if sink is not None:  # 不拿任务锁：只往控制器的日志缓冲里追加一个元组
            sink.add(self._run.machine.task_id, entry)

    def parked(self) -> None:
        self._attempt.wake_pauser()

    def finished(self, result: AttemptResult) -> None:
        sink = self._run._log_sink
        if sink is not None and sink.has_unwritten():
            # 落终态之前、任务锁之外把这次尝试的日志写进存储：读者看到终态时日志已经全在（见 task_logs）。
            try:
                sink.flush()
            except Exception:  # 日志绝不能让任务落不了地
                logger.exception("写任务 %s 的日志时出错", self._run.machine.task_id)
        self._run._settle(self._attempt, result)


def _policy_defaults(
    spec: TaskSpec | None, retry: RetryPolicy | None, timeout: Timeout | None
) -> tuple[RetryPolicy, Timeout]:
    """retry / timeout 没给时的缺省：先取 ``@task`` 上的，再取"不重试 / 不限时"。``TaskRun(...)`` 与
    ``TaskRun._controlled`` 共用这一条规则。"""
    if retry is None:
        retry = spec.retry if spec and spec.retry else NO_RETRY
    if timeout is None:
        timeout = spec.timeout if spec and spec.timeout else NO_TIMEOUT
    return retry, timeout


def _number(name: str, value: object, *, allow_none: bool) -> float | None:
    """非负的有限秒数、不超过 10 年（core/numbers.py 的唯一数值检查点）：inf / NaN / 1e308 在这里就被拒绝，
    不会在 ``Event.wait`` 里变成 OverflowError，也不会让一个窗口永远不到期。"""
    # 快路径：控制器每次提交都传同样的合法秒数（NaN 不满足比较，落到下面的完整检查）。
    if isinstance(value, float) and value.__class__ is float and 0.0 <= value <= MAX_SECONDS:
        return value
    return check_seconds(
        name,
        value,
        low=0.0,
        low_open=False,
        hint="不想限制请传 None" if allow_none else "",
        allow_none=allow_none,
    )


class TaskRun:
    """一个受监督的任务执行。线程安全：各方法可从不同线程调用。

    ``start()`` 立即返回（InlineExecutor 除外：它在调用线程里跑完）；``wait()`` 等终态；
    ``stop()`` 不阻塞；``pause()`` 等确认并如实返回；``resume()`` 回到 running 或 queued（§4.3）。
    """

    # 按需才有的字段，初值放在类上：读到的总是本实例的值或这里的初值。每个任务都会先读后写的那几个由 _attach
    # 先写成实例字段（见那里的说明），其余的（重试、暂停之类才用到的）第一次赋值时才成为实例字段。
    # 日志缓冲与"已落终态"事件都按需创建：排队中的任务可能成千上万，每个省下的几个容器对象
    # 直接减轻循环 GC 的扫描量（在管任务越多越明显）。
    _logs: deque[LogEntry] | None = None
    _done_event: threading.Event | None = None
    _is_done = False
    _started = False
    _attempt: _Attempt | None = None
    _retry_timer: Timer | None = None
    _retry_deadline: float | None = None
    _retry_wake: threading.Event | None = None  # 只有 InlineExecutor 的重试等待用得到
    _start_timer: Timer | None = None  # start 超时的排队那一段（见 watch_start_timeout）

    def __init__(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        task_id: str | None = None,
        name: str | None = None,
        executor: Executor | None = None,
        retry: RetryPolicy | None = None,
        timeout: Timeout | None = None,
        graceful_stop: float = 5.0,
        artifact_dir: str | Path | None = None,
        clock: Clock | None = None,
        tags: object = (),
        label: str | None = None,
        priority: int = 0,
        description: str | None = None,
        upstream: Mapping[str, Any] | None = None,
        machine: StateMachine | None = None,
        on_requeue: Callable[[TaskRun], None] | None = None,
        on_transition: Callable[[TaskRun, TaskSnapshot, Transition], None] | None = None,
        pause_timeout: float = DEFAULT_PAUSE_TIMEOUT,
        artifact_hint: str | None = None,
        on_progress: Callable[[TaskSnapshot], None] | None = None,
        log_sink: LogSink | None = None,
    ) -> None:
        """``artifact_hint``：没配产物目录时告诉用户去哪儿配（Controller 传指向它自己参数的提示）。
        ``log_sink``：把 ``ctx.log`` 的行交给它持久化（Controller 的 ``persist_logs``）。"""
        if not callable(fn):
            raise ConfigurationError(f"TaskRun 的第一个参数必须是任务函数，收到 {fn!r}")
        spec = task_spec(fn)
        if not isinstance(args, (tuple, list)):
            raise ConfigurationError(f"args 必须是元组（位置参数），收到 {args!r}；单个参数请写成 (x,)")
        # 先认普通字典 / 默认执行器：对 Mapping、Executor 这两个 ABC 的 isinstance 要走一层 Python 写的
        # __instancecheck__（控制器每次提交都传一个普通字典、多半用默认执行器）。
        if kwargs is not None and kwargs.__class__ is not dict and not isinstance(kwargs, Mapping):
            raise ConfigurationError(f"kwargs 必须是字典，收到 {kwargs!r}")
        if executor is None:
            executor = DEFAULT_EXECUTOR
        elif not isinstance(executor, Executor):
            raise ConfigurationError(
                "executor 必须是 ThreadExecutor() / InlineExecutor() / ProcessExecutor() 之类的实例，"
                f"收到 {executor!r}"
            )
        retry, timeout = _policy_defaults(spec, retry, timeout)
        if not isinstance(retry, RetryPolicy):
            raise ConfigurationError(f"retry 必须是 RetryPolicy(...)，收到 {retry!r}")
        if not isinstance(timeout, Timeout):
            raise ConfigurationError(f"timeout 必须是 Timeout(start=, per_attempt=, idle=)，收到 {timeout!r}")
        if upstream is not None and upstream.__class__ is not dict and not isinstance(upstream, Mapping):
            raise ConfigurationError(f"upstream 必须是 {{节点 id: 返回值}} 字典，收到 {upstream!r}")
        if on_requeue is not None and not callable(on_requeue):
            raise ConfigurationError(f"on_requeue 必须是可调用对象，收到 {on_requeue!r}")
        if on_transition is not None and not callable(on_transition):
            raise ConfigurationError(f"on_transition 必须是可调用对象，收到 {on_transition!r}")
        self._assign(
            fn,
            tuple(args),
            dict(kwargs or {}),
            executor,
            retry,
            timeout,
            _number("graceful_stop", graceful_stop, allow_none=False) or 0.0,
            _number("pause_timeout", pause_timeout, allow_none=False) or 0.0,
            None if artifact_dir is None else Path(artifact_dir),
            dict(upstream or {}),
            artifact_hint,
        )
        if machine is None:
            check_int("priority", priority, low=MIN_PRIORITY, high=MAX_PRIORITY)
            resolved_name = name or (spec.name if spec else getattr(fn, "__name__", None) or "task")
            all_tags = normalize_tags(tags) | (spec.tags if spec else frozenset())
            clock = clock or SYSTEM_CLOCK
            machine = StateMachine.create(
                task_id or f"{resolved_name}-{uuid.uuid4().hex[:12]}",
                resolved_name,
                max_attempts=retry.max_attempts,
                clock=clock,
                label=label,
                tags=all_tags,
                priority=priority,
                description=description if description is not None else (spec.description if spec else None),
            )
        else:
            if not isinstance(machine, StateMachine):
                raise ConfigurationError(f"machine 必须是 StateMachine，收到 {machine!r}")
            if task_id is not None and task_id != machine.task_id:
                raise ConfigurationError(f"task_id {task_id!r} 与传入状态机的 {machine.task_id!r} 不一致")
            clock = clock or machine.clock
        self._attach(machine, clock, on_requeue, on_transition, on_progress, log_sink)

    @classmethod
    def _controlled(
        cls,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        machine: StateMachine,
        executor: Executor | None,
        retry: RetryPolicy | None,
        timeout: Timeout | None,
        graceful_stop: float,
        artifact_dir: Path | None,
        artifact_hint: str,
        clock: Clock,
        upstream: Mapping[str, Any] | None,
        on_requeue: Callable[[TaskRun], None],
        on_transition: Callable[[TaskRun, TaskSnapshot, Transition], None],
        on_progress: Callable[[TaskSnapshot], None],
        log_sink: LogSink | None,
    ) -> TaskRun:
        """Controller 给自己管的任务造句柄的入口（``Controller._make_run``）：与 ``TaskRun(...)`` 同样的字段、
        同样的每次提交检查（参数签名、执行器自己的提交检查），只是不再重查控制器构造 / 登记时已查过的东西——
        任务函数与它的 retry / timeout（``register`` 查过）、执行器（控制器构造时）、产物目录（已是 Path）、
        几个钩子（控制器自己的方法）、状态机（控制器刚造的）、pause_timeout（默认值）。每个提交省下十来次
        isinstance / callable 判断与一次数值检查（issue 17）。graceful_stop 是控制器的公开属性，照常检查。
        """
        if upstream is not None and upstream.__class__ is not dict and not isinstance(upstream, Mapping):
            raise ConfigurationError(f"upstream 必须是 {{节点 id: 返回值}} 字典，收到 {upstream!r}")
        run: TaskRun = cls.__new__(cls)
        if retry is None or timeout is None:  # 与 __init__ 同样的缺省（两者都给了时不去取 @task 的说明）
            retry, timeout = _policy_defaults(task_spec(fn), retry, timeout)
        run._assign(
            fn,
            tuple(args),  # 已是元组时不复制（同一个对象）
            dict(kwargs),
            DEFAULT_EXECUTOR if executor is None else executor,
            retry,
            timeout,
            _number("graceful_stop", graceful_stop, allow_none=False) or 0.0,
            DEFAULT_PAUSE_TIMEOUT,
            artifact_dir,
            dict(upstream or {}),
            artifact_hint,
        )
        run._attach(machine, clock, on_requeue, on_transition, on_progress, log_sink)
        return run

    def _assign(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        executor: Executor,
        retry: RetryPolicy,
        timeout: Timeout,
        graceful_stop: float,
        pause_timeout: float,
        artifact_dir: Path | None,
        upstream: dict[str, Any],
        artifact_hint: str | None,
    ) -> None:
        """（构造的前一半，参数都已查过、已是自己的副本）记下执行所需的字段，做每次提交都要的两项检查。"""
        self.fn = fn
        self.args: tuple[Any, ...] = args
        self.kwargs: dict[str, Any] = kwargs
        self.executor = executor
        self.retry = retry
        self.timeout = timeout
        self.graceful_stop = graceful_stop
        self.pause_timeout = pause_timeout
        self.artifact_dir = artifact_dir
        self.upstream: dict[str, Any] = upstream
        self.artifact_hint = artifact_hint
        # 忘了 ctx 在提交时就说清楚（run_task / TaskRun / Controller.submit 都经过这里）。
        check_task_signature(fn, args, kwargs)
        # 执行器没有自己的提交检查时（线程执行器）基类的检查只是"可调用"——上面已经查过：不为它造一个
        # Submission 与一个字典（每个提交都走这里，issue 17）。
        if type(executor).check_submittable is not _BASE_CHECK_SUBMITTABLE:
            executor.check_submittable(
                Submission(fn, args, kwargs, {"upstream": upstream, "retry": retry, "timeout": timeout})
            )

    def _attach(
        self,
        machine: StateMachine,
        clock: Clock,
        on_requeue: Callable[[TaskRun], None] | None,
        on_transition: Callable[[TaskRun, TaskSnapshot, Transition], None] | None,
        on_progress: Callable[[TaskSnapshot], None] | None,
        log_sink: LogSink | None,
    ) -> None:
        """（构造的后一半）接上状态机与几个钩子，登记本任务的迁移监听器。"""
        self.machine = machine
        # task_id 从不改变：存成普通属性，不经 TaskRun.task_id → StateMachine.task_id 两层属性调用（控制器
        # 每个任务要读它五六次，issue 17）。
        self.task_id: str = machine.task_id
        self.clock: Clock = clock
        self._lock = machine.lock
        self._on_requeue = on_requeue
        # 控制器的迁移处理（写穿、调度记账、事件）：在本任务每次迁移之后、TaskRun 自己的处理之前调用。经这个
        # 钩子而不是另挂一个监听器：每个任务的状态机只挂一个监听器（一个绑定方法），不再多一个监听器对象与
        # 装它们的列表（issue 17）。
        self._transition_hook = on_transition
        # 进度通知（控制器的事件钩子）：在本任务的锁内以更新后的快照调用，所以必须只做常数时间的事、
        # 不碰别的锁（控制器只把事件放进交付队列）。
        self._progress_hook = on_progress
        self._log_sink = log_sink
        # 按需字段的初值是类属性（见类体）。其中每个任务都会在写它之前读到的几个，在这里先写成实例字段：
        # 读类上的初值不能被解释器特化，每次约多 35 ns（3.11），而实例字段的值在造实例时就留好了位置，写一个
        # 只是一次特化的存储——每个任务在开始、三次迁移与落地里要读它们九次（issue 17）。写的都是初值本身。
        self._started = False
        self._is_done = machine.status in TERMINAL_STATUSES
        self._logs = None
        self._start_timer = None
        self._retry_timer = None
        self._retry_wake = None
        self._done_event = None
        # 经 add_owner_listener 而不是 add_listener(self._on_transition)：
        # 不为每个任务常驻一个绑定方法（issue 17）
        machine.add_owner_listener(self, TaskRun._on_transition)

    @property
    def _watchdog(self) -> Watchdog:
        # 用到定时器（超时、优雅窗口、重试等待）时才去取：绝大多数任务一个定时器也不登记。
        return Watchdog.for_clock(self.clock)

    # -- reading ------------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.machine.snapshot.name

    @property
    def status(self) -> TaskStatus:
        return self.machine.status

    @property
    def snapshot(self) -> TaskSnapshot:
        """当前快照（运行期可安全读取）。读取时顺带把任务的心跳同步进快照。"""
        attempt = self._attempt
        # 只在拿得到锁时顺手同步心跳：锁可能正被一次慢的写穿（存储卡住）占着，读快照绝不能因此阻塞——
        # 此时返回的快照心跳稍旧，但状态与版本是准确的。
        if (
            attempt is not None
            and attempt.running
            and not attempt.settled
            and self._lock.acquire(blocking=False)
        ):
            try:
                self._sync_heartbeat_locked(attempt)
            finally:
                self._lock.release()
        return self.machine.snapshot

    def sync_heartbeat(self) -> TaskSnapshot:
        """把任务线程记下的最近心跳写进快照（旁路字段，不递增版本号）。控制器按自己的节奏调用。"""
        return self.snapshot

    @property
    def transitions(self) -> tuple[Transition, ...]:
        return self.machine.transitions

    @property
    def done(self) -> bool:
        return self._is_done

    @property
    def done_event(self) -> threading.Event:
        """落终态时置位（在本任务的全部迁移监听器——包括控制器的写穿——都跑完之后）。"""
        # 不经 with：同 start()
        lock = self._lock
        lock.acquire()
        try:
            # 锁内读到的"已落地"意味着终态迁移连同它的监听器都已完成（监听器在同一把锁内运行）。
            if self._done_event is None:
                self._done_event = threading.Event()
                if self._is_done:
                    self._done_event.set()
            return self._done_event
        finally:
            lock.release()

    @property
    def started(self) -> bool:
        return self._started

    @property
    def outcome(self) -> Outcome | None:
        """已落终态时的结果对象，否则 None。"""
        snapshot = self.machine.snapshot
        return Outcome.from_snapshot(snapshot) if snapshot.is_terminal else None

    @property
    def logs(self) -> list[LogEntry]:
        """本任务（跨尝试）最近 200 条日志。"""
        return list(self._logs or ())

    def __repr__(self) -> str:
        snap = self.machine.snapshot
        attempts = f"{snap.attempt}/{snap.max_attempts}"
        return f"TaskRun({snap.task_id!r}, status={snap.status.value}, attempt={attempts})"

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> TaskRun:
        """启动受监督执行，立即返回（InlineExecutor 会在本线程里跑完）。

        重复调用报错。唯一的例外是任务处于 queued 时（控制器在重试到期或恢复后把它重新排了队），
        此时 ``start()`` 就是"把这个排队的任务派发出去"。
        """
        # 不经 with：每个任务都走这里（3.11 上 with 一把 RLock 约 540 ns，直接调用约 190 ns；
        # 见 core/state_machine.py 的模块说明）。_on_running、_settle 同。
        lock = self._lock
        lock.acquire()
        try:
            status = self.machine.status
            if self._started and status is not _QUEUED:
                raise ConfigurationError(
                    f"任务 {self.task_id!r} 已经 start() 过（当前 {status.value}）；"
                    "每个 TaskRun 只能启动一次，要再跑请新建一个 TaskRun（换一个 task_id）"
                )
            self._started = True
            if status is _PENDING:
                self.machine.mark_queued()
                status = _QUEUED
            if status is not _QUEUED:
                # 启动前已被停止（终态）、已在排队中暂停（恢复时回到 queued 再启动）、或在等上游（blocked）。
                if status.is_terminal or status in (S.PAUSED, S.BLOCKED):
                    return self
                raise InvalidTransition(status, S.STARTING, TRIGGER_START, TRANSITIONS[status])
            attempt = self._begin_attempt_locked()
        finally:
            lock.release()
        self._launch(attempt)
        return self

    def begin_started(self) -> Callable[[], None]:
        """认领时存储已把它写成 starting 的持久任务（``TaskStore.claim_queued(..., start=...)``）：不再
        ``mark_starting``（那一步已随认领落库，任务体可以开始），只准备这一次尝试；返回启动载体的函数。

        分两步是为了与 ``start()`` 同一个窗口：尝试在任务锁内准备好，控制器再把任务登记出去（从此 stop /
        pause 看得到它、看到的已是有尝试的 starting），最后在锁外启动载体。
        """
        with self._lock:
            if self._started or self.machine.status is not S.STARTING:
                raise ConfigurationError(
                    f"任务 {self.task_id!r} 不是刚由认领开始的（当前 {self.machine.status.value}）"
                )
            self._started = True
            attempt = self._begin_attempt_locked(started=True)
        return lambda: self._launch(attempt)

    def wait(self, timeout: float | None = None) -> Outcome:
        """等待终态并返回 Outcome。超时抛 TimeoutError，**不**改变任务状态（要停止请显式 stop()）。

        ``timeout`` 是调用方愿意等的真实秒数，与注入的 clock 无关。
        """
        _number("wait() 的 timeout", timeout, allow_none=True)
        if not wait_event(self.done_event.wait, timeout):  # 主线程按片等：Ctrl-C 立刻生效
            raise TimeoutError(
                f"等待任务 {self.task_id!r} 超时（{timeout} 秒）；任务状态未改变，"
                f"当前为 {self.machine.status.value}。要停止它请调用 stop()"
            )
        outcome = self.outcome
        assert outcome is not None
        return outcome

    def stop(self, reason: str | None = None, *, actor: str | None = None) -> bool:
        """请求停止，不阻塞。返回请求是否被受理（已落终态时为 False）。

        ``actor`` 记进迁移历史（谁按的停止），例如跨进程指令的发起者。

        没占执行槽的任务立即落 stopped；在跑的任务进入 stopping，在优雅窗口内响应 checkpoint() 则落
        stopped（正常返回则 succeeded），窗口用尽：线程记 lost，子进程被终止后记 stopped。
        """
        # 优雅窗口从"请求到达"这一刻算起，而不是从 stopping 写穿存储之后：负载下一次写可能要几百毫秒，
        # 不能让它叠加到窗口上（用户指南 §4.1 的超时上界只含收尾那一次写）。
        requested_at = self.clock.monotonic()
        with self._lock:
            machine = self.machine
            status = machine.status
            if status.is_terminal:
                return False
            if status is S.STOPPING:
                return True
            attempt = self._attempt
            active = attempt is not None and not attempt.settled
            if status in _NOT_STARTED or (status is S.PAUSED and not active):
                self._cancel_retry_locked()
                machine.mark_stopped(reason=reason, actor=actor, trigger=TRIGGER_STOP)
                return True
            assert attempt is not None
            if status is S.PAUSED:
                # paused 没有到 stopping 的边：先唤醒（回到 running），任务在检查点里立刻响应停止。
                machine.mark_running(
                    trigger=TRIGGER_STOP, actor=actor, reason="恢复被暂停的任务，让它在检查点里响应停止"
                )
            attempt.wake_pauser()
            machine.mark_stopping(reason=reason, actor=actor)
            self._request_stop_locked(attempt, reason, requested_at=requested_at)
            return True

    def cancel(self, reason: str | None = None) -> bool:
        """编排层级联取消（例如管道 fail_fast）：落 ``cancelled``，与人工停止（stopped）区分责任方。

        没占执行槽的任务立即落 cancelled；在跑的任务被请求停止（状态保持原样——没有"取消中"这个
        中间态），在检查点响应后落 cancelled，正常返回则 succeeded；优雅窗口用尽与 stop() 相同：
        线程记 lost，子进程被终止后记 cancelled。返回请求是否被受理。
        """
        with self._lock:
            machine = self.machine
            status = machine.status
            if status.is_terminal or status is S.STOPPING:
                return False
            attempt = self._attempt
            active = attempt is not None and not attempt.settled
            if status in _NOT_STARTED or (status is S.PAUSED and not active):
                self._cancel_retry_locked()
                machine.mark_cancelled(reason=reason)
                return True
            assert attempt is not None
            if attempt.cancel_reason is None:
                attempt.cancel_reason = reason or "已被编排层取消"
            if status is S.PAUSED:
                machine.mark_running(
                    trigger=TRIGGER_CANCEL, reason="恢复被暂停的任务，让它在检查点里响应取消"
                )
            elif status is S.PAUSING:
                machine.abort_pause(reason="任务被取消，暂停作废")
            attempt.wake_pauser()
            self._request_stop_locked(attempt, attempt.cancel_reason)
            return True

    def pause(self, timeout: float | None = None, *, actor: str | None = None) -> bool:
        """请求暂停并等待确认。True：任务确实在检查点挂起了（或它根本还没启动，直接记 paused）。

        False 不是错误，是"暂停没生效"：窗口内任务没到检查点，状态回滚为 running，并留下一条
        ``runtime:pause_aborted`` 记录。InlineExecutor 上的运行中任务无法暂停，如实返回 False。
        ``timeout`` 缺省为构造时的 ``pause_timeout``（按注入的 clock 计）。
        """
        window = (
            self.pause_timeout
            if timeout is None
            else _number("pause() 的 timeout", timeout, allow_none=False)
        )
        assert window is not None
        # 窗口从调用这一刻算起：pausing 的写穿（负载下可能几百毫秒）算在窗口里，不叠加在窗口之后。
        deadline = self.clock.monotonic() + window
        with self._lock:
            machine = self.machine
            status = machine.status
            if status is S.PAUSED:
                return True
            if status in (S.QUEUED, S.RETRY_WAIT):
                self._cancel_retry_locked()
                machine.mark_paused(trigger=TRIGGER_PAUSE, actor=actor, reason="未启动的任务直接暂停")
                return True
            attempt = self._attempt
            if status not in (S.STARTING, S.RUNNING, S.PAUSING) or attempt is None or attempt.settled:
                return False
            if not self.executor.supports_pause or attempt.stop_requested:
                return False
            assert attempt.handle is not None
            # starting 也经 pausing 缓冲（转移表有 starting → pausing）：载体就位之前暂停标志就已拨好，
            # 任务的第一个 checkpoint() 就挂起；窗口内没到检查点照样 pause_aborted 回滚。直接丢掉它的话，
            # 提交后紧接着的暂停（进程执行器的 starting 有 100 ms+）会被静默吞掉。
            if status is not S.PAUSING:
                signal = attempt.pause_signal(fresh=True)
                machine.mark_pausing(actor=actor)
                attempt.handle.request_pause()
            else:
                signal = attempt.pause_signal(fresh=False)
        self.clock.wait(signal, max(0.0, deadline - self.clock.monotonic()))
        with self._lock:
            machine = self.machine
            status = machine.status
            if status is S.PAUSED:
                return True
            if status is not S.PAUSING or attempt is not self._attempt:
                return False
            assert attempt.handle is not None
            if not attempt.stop_requested and attempt.handle.confirm_or_cancel_pause():
                machine.mark_paused()
                self._suspend_timers_locked(attempt)
                return True
            machine.abort_pause(reason=f"暂停窗口（{window:g} 秒）内任务没有到达检查点，状态回滚为 running")
            return False

    def resume(self, *, actor: str | None = None) -> bool:
        """撤销暂停。就地暂停的回到 running；排队/重试等待中暂停的回到 queued（§4.3）。"""
        relaunch: _Attempt | None = None
        with self._lock:
            machine = self.machine
            status = machine.status
            attempt = self._attempt
            active = attempt is not None and not attempt.settled
            if status is S.PAUSED and active:
                assert attempt is not None and attempt.handle is not None
                machine.mark_running(trigger=TRIGGER_RESUME, actor=actor)
                attempt.handle.request_resume()
                self._resume_timers_locked(attempt)
                return True
            if status is S.PAUSING and active:
                assert attempt is not None and attempt.handle is not None
                attempt.handle.request_resume()
                machine.mark_running(trigger=TRIGGER_RESUME, actor=actor, reason="暂停尚未生效即被撤销")
                attempt.wake_pauser()
                return True
            if status is not S.PAUSED:
                return False
            machine.mark_queued(trigger=TRIGGER_RESUME, actor=actor, reason="暂停时尚未启动，回到排队")
            if self._on_requeue is None and self._started:
                relaunch = self._begin_attempt_locked()
        if relaunch is not None:
            self._launch(relaunch)
        return True

    # -- lifecycle operations asked for by the controller / pipeline ---------------------------------
    #
    # 控制器与管道不自己调状态机、不自己挑 trigger：它们说出"要什么"（放行、依赖失败、重试到期、
    # start 超时），迁移连同它的守卫与触发源都在这里，和 TaskRun 自己的迁移放在一起。

    def release(self, upstream: Mapping[str, Any] | None = None) -> bool:
        """管道放行（blocked → queued）。``upstream`` 是放行那一刻的成功上游值，交给任务
        （TaskRun 在每次尝试开始时把它交给 ctx.input / ctx.upstream）。返回是否真的放行了。"""
        with self._lock:
            if upstream:
                self.upstream.update(upstream)
            if self.machine.status is not S.BLOCKED:
                return False  # 等上游期间已被停止：以停止为准
            self.machine.mark_queued(trigger=TRIGGER_RELEASED)
            return True

    def mark_dependency_failed(self, reason: str) -> bool:
        """上游失败、按汇合规则不再执行（blocked → skipped，失败类型 dependency_failed，不可重试）。"""
        with self._lock:
            if self.machine.status is not S.BLOCKED:
                return False
            failure = Failure(FailureKind.DEPENDENCY_FAILED, reason, retryable=False)
            self.machine.mark_skipped(failure=failure, reason=reason, trigger=TRIGGER_DEPENDENCY_FAILED)
            return True

    def retry_due(self) -> bool:
        """重试等待到期，回到 queued 重新排队等额度（控制器的 ``on_requeue`` 用它，不绕过并发上限）。"""
        with self._lock:
            if self.machine.status is not S.RETRY_WAIT:
                return False
            self.machine.mark_queued(trigger=TRIGGER_RETRY_DUE)
            return True

    def detach(self) -> None:
        """不再由本进程管（worker 停止时把还没开始的持久任务交还存储）：撤掉重试与 start 超时的计时器，
        之后它们不会再推进这台状态机。"""
        with self._lock:
            self._cancel_retry_locked()
            if self._start_timer is not None:
                self._start_timer.cancel()
                self._start_timer = None

    def release_controller(self) -> None:
        """控制器不再管这个已落地的句柄（``keep_finished`` / ``prune`` 清出内存、``close()`` 收尾）：
        撤掉控制器的两个钩子，状态机只弱引用本句柄。不能在控制器锁内调用（要拿本任务的锁）。

        为什么：句柄 → 钩子（控制器的绑定方法）→ 控制器 → 句柄表 → 句柄，句柄 ↔ 状态机（状态机的监听器）——
        两个环让每个落地的任务（句柄、状态机、锁、快照……）只能等循环 GC 的全量回收，关掉的控制器连同它的
        全部任务也是（issue 17，sq17 量的每 5,000 个任务约 2.5 万个循环垃圾）。拆掉之后没人引用的句柄由引用
        计数当场释放；调用方手里的句柄照常可读（状态、快照、历史、``wait()`` / ``outcome``），之后对它的
        迁移（没有哪个公开动作能让终态再迁移）也照样通知它，只是不再经过这个控制器。"""
        # 不经 with：同 start()
        lock = self._lock
        lock.acquire()
        try:
            self._transition_hook = None
            self._progress_hook = None
        finally:
            lock.release()
        self.machine.weaken_owner_listener()

    def watch_start_timeout(self) -> None:
        """从现在（提交入队）起计 start 超时的排队那一段：到点仍在排队、一次都没开始就落 stopped。

        start 超时从提交算起、覆盖"排队等额度"与"派发后迟迟没真正开始"两段。派发之后的那段在
        ``_begin_attempt_locked`` 里按剩余时长登记；排队那一段只有带调度器的调用方（控制器）才有，
        由它在入队时调这里。两段与 per_attempt / idle 一样登记在看门狗上。
        """
        limit = self.timeout.start
        if limit is None:
            return
        with self._lock:
            if self.machine.status is not S.QUEUED or self.machine.snapshot.attempt != 0:
                return
            if self._start_timer is not None:
                self._start_timer.cancel()
            self._start_timer = self._watchdog.schedule(limit, self._start_timed_out)

    def _start_timed_out(self) -> None:
        with self._lock:
            self._start_timer = None
            machine = self.machine
            if machine.status is not S.QUEUED or machine.snapshot.attempt != 0:
                return
            failure = Failure(
                FailureKind.TIMEOUT_START,
                f"提交后 {self.timeout.start} 秒内没有拿到执行槽（start 超时）",
                retryable=True,
            )
            machine.mark_stopped(failure=failure, trigger=TRIGGER_TIMEOUT_START, reason="start 超时")

    # -- attempts -----------------------------------------------------------------------------------

    def _begin_attempt_locked(self, *, started: bool = False) -> _Attempt:
        """``started``：状态机已在 starting（认领时由存储写下的），这次尝试就从它开始。"""
        machine = self.machine
        if self._start_timer is not None:  # 拿到了执行槽：排队那一段的 start 超时作废，剩余部分下面另计
            self._start_timer.cancel()
            self._start_timer = None
        # 在本任务的锁（就是状态机的锁）里：经已持锁的入口，不再重入地加一次锁（见 core/state_machine.py 的
        # 模块说明）。_on_running、_settle 同。
        snapshot = machine.snapshot if started else machine.mark_starting_locked(self.executor.name)
        attempt = _Attempt(snapshot.attempt)
        # 按位置传（与 AttemptSpec 的字段同序）：3.11 上以关键字参数调用一个类，参数要先装进一个字典再交给
        # __init__——这十二个关键字约多 1.5 µs，比造这个对象本身还贵。每次尝试都造一个（issue 17）。
        spec = AttemptSpec(
            self.fn,  # fn
            self.args,  # args
            self.kwargs,  # kwargs
            snapshot.task_id,  # task_id
            snapshot.name,  # name
            snapshot.attempt,  # attempt
            self.clock,  # clock
            self.retry,  # retry
            self.upstream,  # upstream
            self.artifact_dir,  # artifact_root
            self._log_buffer(),  # logs
            self.artifact_hint,  # artifact_hint
        )
        self._attempt = attempt
        attempt.handle = self.executor.prepare(spec, _Events(self, attempt))
        start_limit = self.timeout.start
        if start_limit is not None and snapshot.attempt == 1:
            # start 超时从提交（入队）算起；排队那一段由 watch_start_timeout 判定，这里只计剩下的部分。
            queued_at = snapshot.queued_at or snapshot.started_at
            waited = (
                (snapshot.started_at - queued_at).total_seconds()
                if queued_at and snapshot.started_at
                else 0.0
            )
            self._arm_timeout_locked(attempt, FailureKind.TIMEOUT_START, max(0.0, start_limit - waited))
        return attempt

    def _launch(self, attempt: _Attempt) -> None:
        """在锁外启动载体。InlineExecutor 在这里跑完任务体，并在本线程里完成重试等待。"""
        handle = attempt.handle
        if handle is None:  # 启动之前这次尝试已被结算、任务已落终态（见 _after_transition）：不再启动
            return
        try:
            handle.launch()
        except Exception as exc:  # 起不了线程/进程：这次尝试以异常失败（可重试）
            self._settle(
                attempt, AttemptResult(ResultKind.RAISED, failure=Failure.from_exception(exc, retryable=True))
            )
        if self.executor.blocking:
            self._inline_retry_loop()

    def _inline_retry_loop(self) -> None:
        while True:
            with self._lock:
                if self.machine.status is not S.RETRY_WAIT or self._retry_deadline is None:
                    return
                remaining = self._retry_deadline - self.clock.monotonic()
                next_attempt = None
                if remaining <= 0:
                    self._retry_deadline = None
                    next_attempt = self._begin_attempt_locked()
                elif self._retry_wake is None:
                    self._retry_wake = threading.Event()
                else:
                    self._retry_wake.clear()
                wake = self._retry_wake
            if next_attempt is not None:
                assert next_attempt.handle is not None
                try:
                    next_attempt.handle.launch()
                except Exception as exc:
                    failure = Failure.from_exception(exc, retryable=True)
                    self._settle(next_attempt, AttemptResult(ResultKind.RAISED, failure=failure))
            else:
                assert wake is not None
                self.clock.wait(wake, remaining)

    def _on_running(self, attempt: _Attempt, pid: int | None) -> None:
        # 不经 with：同 start()
        lock = self._lock
        lock.acquire()
        try:
            if attempt is not self._attempt or attempt.settled:
                return
            machine = self.machine
            if machine.status is _STARTING:
                machine.mark_running_locked(pid)
            elif pid is not None:
                machine.update_side(pid=pid)
            attempt.running = True
            if attempt.timers:  # 绝大多数尝试没登记任何定时器：不为查一个空字典去读枚举值、调方法
                attempt.cancel_timer(FailureKind.TIMEOUT_START.value)
            if attempt.stop_requested:
                return
            per_attempt = self.timeout.per_attempt
            if per_attempt is not None:
                attempt.attempt_deadline = self.clock.monotonic() + per_attempt
                self._arm_timeout_locked(attempt, FailureKind.TIMEOUT_ATTEMPT, per_attempt)
            if self.timeout.idle is not None:
                self._arm_timeout_locked(attempt, FailureKind.TIMEOUT_IDLE, self.timeout.idle)
        finally:
            lock.release()

    def _on_progress(self, attempt: _Attempt, progress: Progress) -> None:
        # 不经 with：同 start()
        lock = self._lock
        lock.acquire()
        try:
            if attempt is self._attempt and not attempt.settled:
                snapshot = self.machine.update_side(progress=progress)
                if self._progress_hook is not None:
                    self._progress_hook(snapshot)
        finally:
            lock.release()

    def _settle(self, attempt: _Attempt, result: AttemptResult) -> None:
        """一次尝试结束：决定终态、重试或继续等。迟到的结果（已放弃的线程）在这里被忽略。"""
        retry_due_now = False
        # 不经 with：同 start()
        lock = self._lock
        lock.acquire()
        try:
            if attempt is not self._attempt or attempt.settled:
                return
            beat_at = self._close_attempt_locked(attempt, note_beat=False)
            machine = self.machine
            status = machine.status
            kind = result.kind
            if status is _RUNNING and kind is _RETURNED and attempt.timeout_failure is None:
                # 最常见的结局：running 里正常返回、没有超时。最后一次心跳与 succeeded 并成一份快照（见
                # StateMachine.mark_succeeded_with_heartbeat），与下面"先记心跳、再 mark_succeeded"结果相同。
                if beat_at is None:
                    machine.mark_succeeded(outcome=result.value)
                else:
                    machine.mark_succeeded_with_heartbeat_locked(result.value, beat_at)
                if self._is_done and not self._logs:
                    self._logs = None  # 同下
                return
            if beat_at is not None:  # 其余结局照旧：先把心跳记进快照，再判定
                machine.note_heartbeat(beat_at)
            if status in TERMINAL_STATUSES:  # 控制器等外部写者已经给了终态
                return
            if status is S.PAUSED:
                machine.mark_running(trigger=TRIGGER_CARRIER_EXITED, reason="载体在暂停中结束")
            elif status is S.PAUSING:
                machine.abort_pause(reason="任务在到达检查点之前就结束了")
            elif status is S.STARTING and result.kind is ResultKind.RETURNED:
                machine.mark_running()
            status = machine.status
            failure = result.failure
            # 正常返回只有两种情形算成功：没有超时，或有人按了停止（stopping → succeeded，§4.4）。
            # 超时发出的停止请求被任务以 return 响应时，结果仍是 timeout_* 失败（§6）——否则超时等于没设。
            if kind is ResultKind.RETURNED and (attempt.timeout_failure is None or status is S.STOPPING):
                machine.mark_succeeded(outcome=result.value)
            elif status is S.STOPPING:
                if kind is ResultKind.CANCELLED:
                    machine.mark_stopped(reason=attempt.stop_reason)
                elif kind is ResultKind.CRASHED and attempt.killed:
                    detail = failure.message if failure is not None else "子进程已终止"
                    stopped = Failure(
                        FailureKind.CANCELLED,
                        f"优雅窗口（{self.graceful_stop:g} 秒）用尽，任务没有响应停止请求，"
                        f"子进程已被终止：{detail}",
                        retryable=False,
                    )
                    machine.mark_stopped(failure=stopped, reason=attempt.stop_reason)
                else:
                    assert failure is not None
                    machine.mark_failed(failure=failure)
            elif attempt.cancel_reason is not None and (
                kind is ResultKind.CANCELLED or (kind is ResultKind.CRASHED and attempt.killed)
            ):
                machine.mark_cancelled(reason=attempt.cancel_reason)
            elif attempt.timeout_failure is not None and kind is not ResultKind.INVALID:
                timeout_failure = attempt.timeout_failure
                if kind is ResultKind.CRASHED and attempt.killed and failure is not None:
                    timeout_failure = Failure(
                        timeout_failure.kind,
                        f"{timeout_failure.message}；任务没有在优雅窗口内响应，子进程已被终止（{failure.message}）",
                        retryable=timeout_failure.retryable,
                    )
                retry_due_now = self._fail_or_retry_locked(
                    timeout_failure, trigger=_TIMEOUT_TRIGGERS[timeout_failure.kind]
                )
            elif kind is ResultKind.CANCELLED:
                machine.mark_failed(
                    failure=Failure(
                        FailureKind.CANCELLED,
                        "任务体自己抛出了 TaskCancelled，但没有人请求停止"
                        "（不要手动抛它；要中止请 return 或抛业务异常）",
                        retryable=False,
                    )
                )
            else:
                assert failure is not None
                retry_due_now = self._fail_or_retry_locked(failure)
            if self._is_done and not self._logs:
                self._logs = None  # 任务体已返回、一行日志也没有：落地的句柄不必留着空缓冲
        finally:
            lock.release()
        if retry_due_now:
            self._on_retry_due(None)

    def _close_attempt_locked(self, attempt: _Attempt, *, note_beat: bool = True) -> datetime | None:
        """这次尝试到此为止（结果到了，或优雅窗口用尽放弃了它）：之后迟到的报告一律忽略。
        先把最后一次心跳记进快照，再叫醒等暂停确认的一方让它重新判定。

        ``note_beat=False``：心跳不在这里记，返回它（没有新心跳时返回 None），由调用方（``_settle``）在同一次
        持锁之内记下——最常见的结局里与终态迁移并成一份快照。被叫醒的一方要拿任务锁，看不到两步之间。"""
        attempt.settled = True
        if attempt.timers:  # 同上：没有定时器就没有要撤的（不为空字典拷一份键列表）
            attempt.cancel_timers()
        beat_at = self._heartbeat_locked(attempt) if attempt.running else None
        if note_beat and beat_at is not None:
            self.machine.note_heartbeat(beat_at)
            beat_at = None
        if attempt._pause_signal is not None:  # 同 wake_pauser()：绝大多数尝试从没人等暂停确认
            attempt.wake_pauser()
        return beat_at

    def _fail_or_retry_locked(self, failure: Failure, *, trigger: str | None = None) -> bool:
        """可重试且预算没用完 → retry_wait（返回"立即到期"与否）；否则 failed。

        ``trigger`` 给了就记在这次迁移上（超时失败记成对应的超时触发源），否则用状态机的默认值。
        """
        machine = self.machine
        snapshot = machine.snapshot
        triggered: dict[str, str] = {} if trigger is None else {"trigger": trigger}
        if not (failure.retryable and snapshot.attempt < snapshot.max_attempts):
            machine.mark_failed(failure=failure, **triggered)
            return False
        # 退避是纯值对象，可以算出 1e308 这种等待（或自定义 Backoff 返回 NaN）：在用的地方夹到 [0, 10 年]，
        # 否则 timedelta(seconds=...) 与看门狗的 Event.wait 会在这里抛 OverflowError，任务卡在半路。
        raw = float(self.retry.delay_for(snapshot.attempt))
        delay = min(max(0.0, raw), float(MAX_SECONDS)) if raw == raw else 0.0
        machine.mark_retry_wait(
            failure=failure, retry_at=self.clock.now() + timedelta(seconds=delay), **triggered
        )
        if self.executor.blocking:
            self._retry_deadline = self.clock.monotonic() + delay
            return False
        if delay <= 0:
            self._retry_timer = None
            return True
        timer_box: list[Timer] = []
        timer = self._watchdog.schedule(
            delay, lambda: self._on_retry_due(timer_box[0] if timer_box else None)
        )
        timer_box.append(timer)
        self._retry_timer = timer
        return False

    def _on_retry_due(self, timer: Timer | None) -> None:
        next_attempt: _Attempt | None = None
        with self._lock:
            if self.machine.status is not S.RETRY_WAIT or self._retry_timer is not timer:
                return
            self._retry_timer = None
            if self._on_requeue is None:
                next_attempt = self._begin_attempt_locked()
        if next_attempt is not None:
            self._launch(next_attempt)
        elif self._on_requeue is not None:
            self._on_requeue(self)

    def _cancel_retry_locked(self) -> None:
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
        self._retry_deadline = None
        if self._retry_wake is not None:
            self._retry_wake.set()

    # -- stop, timeouts, grace windows --------------------------------------------------------------

    def _request_stop_locked(
        self, attempt: _Attempt, reason: str | None, *, requested_at: float | None = None
    ) -> None:
        """``requested_at``：请求到达时的单调读数（缺省为现在）；优雅窗口从它起算。"""
        if attempt.stop_requested:
            return
        attempt.stop_requested = True
        attempt.stop_reason = reason
        assert attempt.handle is not None
        attempt.handle.request_stop(reason)
        attempt.cancel_timers()
        start = self.clock.monotonic() if requested_at is None else requested_at
        attempt.add_timer(
            "grace",
            self._watchdog.schedule_at(start + self.graceful_stop, lambda: self._grace_expired(attempt)),
        )

    def _grace_expired(self, attempt: _Attempt) -> None:
        with self._lock:
            if attempt is not self._attempt or attempt.settled:
                return
            assert attempt.handle is not None
            if attempt.handle.force_stop():
                attempt.killed = True  # 子进程会被终止，随后以 CRASHED 结果结算
                return
            self._close_attempt_locked(attempt)
            machine = self.machine
            if machine.status.is_terminal:
                return
            if machine.status is S.STOPPING:
                cause = "停止请求"
            elif attempt.cancel_reason is not None:
                cause = "取消请求"
            elif attempt.timeout_failure is not None:
                cause = f"{attempt.timeout_failure.kind.value} 超时后的停止请求"
            else:
                cause = "停止请求"
            failure = Failure(
                FailureKind.LOST,
                f"优雅窗口（{self.graceful_stop:g} 秒）用尽，任务没有在 checkpoint() 响应{cause}；"
                "线程无法被强制终止，已放弃等待——它可能仍在后台运行并产生副作用，结果未知",
                retryable=True,
            )
            machine.mark_lost(failure=failure, reason="优雅窗口用尽")

    def _arm_timeout_locked(self, attempt: _Attempt, kind: FailureKind, delay: float) -> None:
        attempt.cancel_timer(kind.value)
        attempt.add_timer(
            kind.value, self._watchdog.schedule(delay, lambda: self._timeout_due(attempt, kind))
        )

    def _timeout_due(self, attempt: _Attempt, kind: FailureKind) -> None:
        with self._lock:
            if attempt is not self._attempt or attempt.settled or attempt.stop_requested:
                return
            machine = self.machine
            if machine.status is S.PAUSED or machine.status.is_terminal:
                return  # 暂停期间不判超时（定时器已挂起；这是与挂起擦肩而过的那一次）
            attempt.timers.pop(kind.value, None)
            assert attempt.handle is not None
            if kind is FailureKind.TIMEOUT_IDLE:
                idle = self.timeout.idle
                assert idle is not None
                self._sync_heartbeat_locked(attempt)
                silent = self.clock.monotonic() - attempt.handle.last_beat()
                if silent < idle:
                    self._arm_timeout_locked(attempt, kind, idle - silent)
                    return
                message = f"idle 超时：已有 {silent:g} 秒没有调用 checkpoint()（阈值 {idle:g} 秒）"
            elif kind is FailureKind.TIMEOUT_ATTEMPT:
                message = f"per_attempt 超时：第 {attempt.number} 次尝试超过 {self.timeout.per_attempt:g} 秒"
            else:
                if attempt.running:
                    return
                message = f"start 超时：提交后 {self.timeout.start:g} 秒内没有真正开始执行"
            attempt.timeout_failure = Failure(kind, message, retryable=True)
            if machine.status is S.PAUSING:
                machine.abort_pause(reason="超时到期，暂停作废")
                attempt.wake_pauser()
            self._request_stop_locked(attempt, message)

    def _suspend_timers_locked(self, attempt: _Attempt) -> None:
        """进入 paused：per_attempt 记下剩余时长，idle 停表。暂停期间不判超时。"""
        if attempt.attempt_deadline is not None:
            attempt.attempt_remaining = max(0.0, attempt.attempt_deadline - self.clock.monotonic())
        attempt.cancel_timer(FailureKind.TIMEOUT_ATTEMPT.value)
        attempt.cancel_timer(FailureKind.TIMEOUT_IDLE.value)

    def _resume_timers_locked(self, attempt: _Attempt) -> None:
        if attempt.stop_requested:
            return
        if attempt.attempt_remaining is not None:
            remaining = attempt.attempt_remaining
            attempt.attempt_remaining = None
            attempt.attempt_deadline = self.clock.monotonic() + remaining
            self._arm_timeout_locked(attempt, FailureKind.TIMEOUT_ATTEMPT, remaining)
        if self.timeout.idle is not None:
            self._arm_timeout_locked(attempt, FailureKind.TIMEOUT_IDLE, self.timeout.idle)

    def _sync_heartbeat_locked(self, attempt: _Attempt) -> None:
        at = self._heartbeat_locked(attempt)
        if at is not None:
            self.machine.note_heartbeat(at)

    def _heartbeat_locked(self, attempt: _Attempt) -> datetime | None:
        """载体记下的最近一次心跳（换算成墙钟时间）；与上次记进快照的相同（或没有载体）时返回 None。
        返回了就算"已同步"：调用方必须在同一次持锁之内把它记进快照。"""
        handle = attempt.handle
        if handle is None:
            return None
        beat = handle.last_beat()
        if beat == attempt.synced_beat:
            return None
        attempt.synced_beat = beat
        clock = self.clock
        # timedelta(0, 秒)：位置参数、不经 max()——每次结算都算一次，关键字参数的解析（约 0.9 µs）比算术本身
        # 贵得多。NaN 同 max(0.0, NaN) 落成 0。
        ago = clock.monotonic() - beat
        return clock.now() - timedelta(0, ago if ago > 0.0 else 0.0)

    # -- state-machine listener ---------------------------------------------------------------------

    def _log_buffer(self) -> deque[LogEntry]:
        if self._logs is None:
            # 位置参数：每个任务一个，maxlen= 的关键字解析比建空 deque 还贵（约 290 → 140 ns）
            self._logs = deque((), MAX_LOGS)  # noqa: RUF037
        return self._logs

    def _on_transition(self, snapshot: TaskSnapshot, record: Transition) -> None:
        hook = self._transition_hook
        if record.to_status not in TERMINAL_STATUSES and not self._is_done:
            # 最常见（每个任务三次迁移里的两次）：不是终态、也不是复活——_after_transition 什么也不做，
            # 不去调它。
            if hook is not None:
                hook(self, snapshot, record)
            return
        if hook is None:
            self._after_transition(record)
            return
        try:
            hook(self, snapshot, record)
        finally:  # 钩子抛了什么（控制器自己只放过 BaseException）都照样记下本任务的终态 / 复活
            self._after_transition(record)

    def _after_transition(self, record: Transition) -> None:
        if record.to_status in TERMINAL_STATUSES:
            if self._start_timer is not None:
                self._start_timer.cancel()
                self._start_timer = None
            self._cancel_retry_locked()
            attempt = self._attempt
            if attempt is not None and attempt.settled:
                # 已结算的尝试（载体、上下文、规格、事件转发……）不再有用：落地的句柄可能要在内存里留很久，
                # 别让每个都拖着这一串对象（循环 GC 的代价随在管对象数增长）。迟到的报告照样因
                # "attempt is not self._attempt" 被忽略。
                self._attempt = None
                # 再拆掉 尝试 → 载体 → 事件转发 → 尝试 这个环：不拆的话每个任务留下七个只能靠循环 GC
                # 回收的对象（载体、上下文、规格、事件转发、锁、日志缓冲、尝试），它们活过年轻代、被晋升，
                # 把全量回收的次数与每次扫描的量一起抬高（issue 17：空任务吞吐里循环 GC 占每任务几十微秒）。
                # 拆了之后载体线程一放手，引用计数就把它们全部释放。此后没有代码再经 handle 找它：
                # 句柄上的一切控制都先查 "attempt is self._attempt"，_launch 见到 None 也不再启动。
                attempt.handle = None
            self._is_done = True
            if self._done_event is not None:
                self._done_event.set()
        elif self._is_done:  # retry() / reset() 把终态任务复活了
            self._is_done = False
            if self._done_event is not None:
                self._done_event.clear()


# 按需字段（类体里带初值的那几个）在模块导入时先在一个不用的实例上各写一次：让它们进入 TaskRun 实例共用的
# 属性键表。为什么：CPython 每造一个实例就把这张表的剩余空位减一（防止它无限长），之后第一次写进来的属性名
# 若已放不进表，写它的每一个实例都得另建一个真的 __dict__——多一个被循环 GC 追踪的对象与几百字节。这些字段
# 要等任务开始、被 wait()、进入重试才第一次写：一上来 submit_many 一大批（或排队的比槽位多几个）的进程里，
# 第一次写它们时表早已没有空位，此后进程里每个任务都多背一个字典（实测 2,000 个任务多 2,000 个 dict）。
# 在这里写一次，它们从第一个实例起就在表里，每个任务照旧一次也不用多写。
TASKRUN_LAZY_FIELDS = (
    "_logs",
    "_done_event",
    "_is_done",
    "_started",
    "_attempt",
    "_retry_timer",
    "_retry_deadline",
    "_retry_wake",
    "_start_timer",
)


def _reserve_lazy_fields() -> None:
    probe = object.__new__(TaskRun)
    for name in TASKRUN_LAZY_FIELDS:
        setattr(probe, name, getattr(TaskRun, name))


_reserve_lazy_fields()


def lost_failure(snapshot: TaskSnapshot) -> Failure:
    owner = snapshot.lease_owner or "（未知）"
    until = snapshot.lease_until.isoformat(timespec="seconds") if snapshot.lease_until else "（从未续租）"
    return Failure(
        FailureKind.LOST,
        f"监督者 {owner} 的租约已过期（lease_until={until}）：载体随进程消失，结果未知；"
        "副作用可能已部分发生，请核对后决定是否重新提交",
        retryable=True,
    )


def mark_lease_expired(snapshot: TaskSnapshot, *, clock: Clock, actor: str) -> StateMachine:
    """reconcile 的那一次写：租约过期、占着执行资源的任务判为 lost（``reconcile:lease_expired``）。

    被判定的任务不在本进程里（没有 TaskRun），所以从存储交回的快照临时重建一台状态机；返回它，
    调用方拿 ``machine.snapshot`` / ``machine.transitions`` 带版本条件写回存储。
    """
    machine = StateMachine(snapshot, (), clock=clock)
    machine.mark_lost(
        failure=lost_failure(snapshot), trigger=TRIGGER_RECONCILE, actor=actor, reason="租约过期，载体已消失"
    )
    return machine


def run_task(
    fn: Callable[..., Any],
    *args: Any,
    task_id: str | None = None,
    name: str | None = None,
    executor: Executor | None = None,
    retry: RetryPolicy | None = None,
    timeout: Timeout | None = None,
    artifact_dir: str | Path | None = None,
    clock: Clock | None = None,
    graceful_stop: float = 5.0,
    **kwargs: Any,
) -> Outcome:
    """一行版：启动并阻塞到终态，返回 ``Outcome(ok, status, value, failure, snapshot)``。

    保留的关键字参数（由 run_task 自己使用，不会传给任务）：``task_id``、``name``、``executor``、
    ``retry``、``timeout``、``artifact_dir``、``clock``、``graceful_stop``。其余位置参数与关键字参数
    原样传给任务（``ctx`` 由执行器注入，不要自己传）。任务本身需要这些名字的关键字参数时，改用
    ``TaskRun(fn, args, {"timeout": ...}, ...)``。

    需要中途干预（暂停、停止）时不要用它，用 TaskRun。等待期间收到 Ctrl-C 会先请求停止任务再抛出。
    """
    run = TaskRun(
        fn,
        args,
        kwargs,
        task_id=task_id,
        name=name,
        executor=executor,
        retry=retry,
        timeout=timeout,
        artifact_dir=artifact_dir,
        clock=clock,
        graceful_stop=graceful_stop,
    )
    try:
        run.start()
        return run.wait()
    except KeyboardInterrupt:
        run.stop(reason="调用方收到 KeyboardInterrupt")
        raise


RESERVED_RUN_TASK_KEYWORDS = frozenset(
    {"task_id", "name", "executor", "retry", "timeout", "artifact_dir", "clock", "graceful_stop"}
)
"""run_task 自己使用、不会传给任务的关键字参数名。"""


__all__ = [
    "DEFAULT_PAUSE_TIMEOUT",
    "RESERVED_RUN_TASK_KEYWORDS",
    "Outcome",
    "TaskRun",
    "lost_failure",
    "mark_lease_expired",
    "run_task",
]
