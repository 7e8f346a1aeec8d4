"""TaskContext：任务作者面对的唯一对象（用户指南 §2、§2.5）。

上下文属于**某一次尝试**：执行器在启动那一刻为每次尝试新造一个，作为第一个位置参数注入。
任务不可能提前攥着一个上下文——停止指令只会发给正在执行的那一次。

快路径的约束（``checkpoint()`` 无请求时 ≤ 250 ns）决定了这里的写法：

* 停止/暂停请求是两个**普通属性**（``_stop`` / ``_pause``），快路径只读它们，不调
  ``Event.is_set()``，不碰锁，不碰快照；
* 心跳只是把单调时钟读数存进 ``_beat`` 这个普通属性。监督方按自己的节奏把它同步进快照
  （``StateMachine.update_side``），任务线程从不为心跳拿锁。

慢路径（确有请求时）才用锁：暂停"是否真的挂起"必须与监督方"窗口用尽、回滚暂停"的判定互斥，
否则会出现"报告没暂停、任务其实停在检查点里"的假话。

本模块只依赖 core：任务作者可以用 ``chongming_task.testing.make_context`` 在没有任何执行器的
情况下单测自己的任务。
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

from chongming_task.clock import SYSTEM_CLOCK, Clock, SystemClock
from chongming_task.core.readonly import Read
from chongming_task.errors import ConfigurationError, TaskCancelled
from chongming_task.models import Progress, validate_task_id

LOGGER_PREFIX = "chongming_task.task"
"""任务日志的 logger 名前缀：完整名字是 ``chongming_task.task.<task_id>``。"""

MAX_LOGS = 200
"""``ctx.logs`` 在内存里保留的条数。"""

DEFAULT_ARTIFACT_HINT = (
    "请给 TaskRun / run_task 传 artifact_dir=...（单测时给 make_context 传 artifact_dir=）"
)
"""没配产物目录时的默认提示；Controller 管的任务换成指向 ``Controller(artifact_dir=...)`` 的提示。"""


_MISSING: Any = object()

_NO_UPSTREAM: Mapping[str, Any] = MappingProxyType({})
"""没有上游值的上下文共用的只读空映射（每次尝试省一个字典加一个映射代理）。"""


@dataclass(frozen=True)
class LogEntry:
    """``ctx.logs`` 里的一条记录（内存中，进程退出即消失）。"""

    at: datetime
    level: int
    level_name: str
    message: str
    attempt: int


class ContextEvents:
    """上下文向监督方报告的事件。默认实现只记在本地，供 ``make_context`` 与单测使用。

    运行时（执行器）用子类把进度写进快照、把"已挂起"通知给等待 ``pause()`` 确认的一方，
    进程执行器的子进程则把它们转发到父进程。回调在任务线程里执行，必须快、不得抛异常。
    """

    def progress(self, progress: Progress) -> None:
        """``ctx.progress()`` 之后调用。"""

    def log(self, entry: LogEntry) -> None:
        """``ctx.log()`` 记下一条之后调用（此时日志已经交给标准库 logging）。"""

    def parked(self) -> None:
        """任务已在检查点里挂起（暂停确认生效）。"""

    def unparked(self) -> None:
        """任务离开挂起（恢复或被停止）。"""


class Heartbeat:
    """``ctx.heartbeat``：手动刷新心跳。

    进入一段确实无法插入 ``checkpoint()`` 的长计算之前调用 ``beat()``，避免被 idle 超时误判为卡死。
    """

    __slots__ = ("_ctx",)

    def __init__(self, ctx: TaskContext) -> None:
        self._ctx = ctx

    def beat(self) -> None:
        ctx = self._ctx
        ctx._beat = ctx._monotonic()

    last = Read[float]("_ctx._beat", doc="最近一次心跳的单调时钟读数（与注入的 clock 同一时间轴）。")


def _artifact_component(task_id: str) -> str:
    # task_id 里可能有 "/"、".." 之类的东西：它只能是一级目录名，绝不能逃出产物根目录。
    text = task_id.replace("%", "%25").replace("/", "%2F").replace("\\", "%5C")
    if text in (".", ".."):
        text = text.replace(".", "%2E")
    return text


class TaskContext:
    """一次尝试的执行期上下文（公开名 ``TaskContext``，``RuntimeContext`` 是同一个类）。

    任务里最常用的是 ``checkpoint()``：响应停止（抛 ``TaskCancelled``）与暂停（就地挂起），
    并刷新心跳。不调用它的任务既停不掉也暂停不了——Python 不能安全地终止线程。
    """

    __slots__ = (
        "__weakref__",
        "_artifact_dir",
        "_artifact_hint",
        "_artifact_root",
        "_async_waiters",
        "_attempt",
        "_beat",
        "_clock",
        "_control_lock",
        "_events",
        "_last_progress",
        "_logger_name",
        "_logs",
        "_monotonic",
        "_parked",
        "_parked_event",
        "_pause",
        "_stop",
        "_stop_reason",
        "_task_id",
        "_task_name",
        "_upstream",
        "_wake",
        "test_handle",
    )

    def __init__(
        self,
        task_id: str,
        *,
        name: str | None = None,
        attempt: int = 1,
        clock: Clock | None = None,
        upstream: Mapping[str, Any] | None = None,
        artifact_root: str | Path | None = None,
        logs: deque[LogEntry] | None = None,
        events: ContextEvents | None = None,
        artifact_hint: str | None = None,
    ) -> None:
        """``artifact_hint``：没配产物目录时告诉用户去哪儿配（谁在跑这个任务，就指向谁的 artifact_dir=）。"""
        validate_task_id(task_id)
        if name is not None:
            validate_task_id(name, what="name")
        if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise ConfigurationError(f"attempt 必须是 >= 1 的整数，收到 {attempt!r}")
        # 先认普通字典（执行器每次尝试都传一个）：对 Mapping 这个 ABC 的 isinstance
        # 要走一层 Python 写的 __instancecheck__。
        if upstream is not None and upstream.__class__ is not dict and not isinstance(upstream, Mapping):
            raise ConfigurationError(f"upstream 必须是 {{节点 id: 返回值}} 字典，收到 {upstream!r}")
        self._setup(task_id, name, attempt, clock, upstream, artifact_root, logs, events, artifact_hint)

    @classmethod
    def _trusted(
        cls,
        task_id: str,
        name: str | None,
        attempt: int,
        clock: Clock | None,
        upstream: Mapping[str, Any] | None,
        artifact_root: str | Path | None,
        logs: deque[LogEntry] | None,
        events: ContextEvents | None,
        artifact_hint: str | None,
    ) -> TaskContext:
        """执行器每次尝试造上下文的入口：参数都取自已校验过的快照与任务句柄（task_id、name 在提交时、
        attempt 由状态机、upstream 是任务句柄自己的字典），不再逐项校验一遍（每次尝试省两次 id 检查与
        几次类型判断，issue 17）。字段的设置与 ``__init__`` 是同一段代码（``_setup``）。"""
        ctx = cls.__new__(cls)
        ctx._setup(task_id, name, attempt, clock, upstream, artifact_root, logs, events, artifact_hint)
        return ctx

    def _setup(
        self,
        task_id: str,
        name: str | None,
        attempt: int,
        clock: Clock | None,
        upstream: Mapping[str, Any] | None,
        artifact_root: str | Path | None,
        logs: deque[LogEntry] | None,
        events: ContextEvents | None,
        artifact_hint: str | None,
    ) -> None:
        self._task_id = task_id
        self._task_name = name or task_id
        self._attempt = attempt
        self._clock: Clock = clock or SYSTEM_CLOCK
        # 快路径每次都要读时钟：真实时钟直接用 C 实现的 time.monotonic，省掉一层 Python 方法调用。
        self._monotonic: Callable[[], float] = (
            time.monotonic if type(self._clock) is SystemClock else self._clock.monotonic
        )
        self._upstream: Mapping[str, Any] = MappingProxyType(dict(upstream)) if upstream else _NO_UPSTREAM
        self._artifact_root = None if artifact_root is None else Path(artifact_root)
        self._artifact_dir: Path | None = None
        self._artifact_hint = artifact_hint or DEFAULT_ARTIFACT_HINT
        self._logs: deque[LogEntry] = logs if logs is not None else deque(maxlen=MAX_LOGS)
        self._events = events or ContextEvents()
        self._logger_name = f"{LOGGER_PREFIX}.{task_id}"
        self._last_progress: Progress | None = None
        # 控制标志：快路径无锁读取；写入与"是否挂起"的判定在 _control_lock 下进行。
        self._stop = False
        self._pause = False
        self._stop_reason: str | None = None
        self._parked = False
        self._control_lock = threading.Lock()
        # 两个 Event 只在真的挂起（或测试在等挂起）时才造：每次尝试都建一个上下文，省下的是启动开销。
        self._wake: threading.Event | None = None
        self._parked_event: threading.Event | None = None
        # 只有 async 任务在检查点挂起时才有等待者：列表按需创建（每次尝试都建一个上下文）。
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] | None = None
        self._beat = self._monotonic()
        self.test_handle: ContextHandle | None = None

    @property
    def heartbeat(self) -> Heartbeat:
        """``ctx.heartbeat.beat()``：手动刷新心跳（见 :class:`Heartbeat`）。按需造一个小把手，不常驻在
        上下文上（常驻的话上下文与它互相引用，每次尝试都多一个只能靠循环 GC 回收的环）。"""
        return Heartbeat(self)

    # -- the cooperative points ---------------------------------------------------------------------

    def checkpoint(self) -> None:
        """协作点：停止 → 抛 TaskCancelled；暂停 → 在此挂起直到恢复或停止；最后刷新心跳。

        不要在 except / finally 里调用它（它可能阻塞或抛出）；清理逻辑里请读 ``is_stop_requested``。
        """
        if self._stop or self._pause:
            self._slow_checkpoint()
        self._beat = self._monotonic()

    async def acheckpoint(self) -> None:
        """``checkpoint()`` 的异步版本：挂起期间不阻塞事件循环，而是 await 一个恢复信号。"""
        if self._stop or self._pause:
            await self._slow_acheckpoint()
        self._beat = self._monotonic()

    def _slow_checkpoint(self) -> None:
        if not self._enter_park():
            return
        try:
            wake = self._wake
            assert wake is not None
            while True:
                wake.wait()
                if self._leave_park_if_released():
                    return
                # 被叫醒却仍要挂起：恢复之后紧接着又来了暂停请求，调用栈一直没离开这里。再报一次
                # "已挂起"，新的暂停请求立刻得到确认，而不是等满整个暂停窗口才发现任务早就挂着。
                self._events.parked()
        finally:
            self._events.unparked()

    async def _slow_acheckpoint(self) -> None:
        if not self._enter_park():
            return
        loop = asyncio.get_running_loop()
        try:
            while True:
                future: asyncio.Future[None] = loop.create_future()
                with self._control_lock:
                    if self._wake is not None and self._wake.is_set():
                        future.set_result(None)
                    else:
                        if self._async_waiters is None:
                            self._async_waiters = []
                        self._async_waiters.append((loop, future))
                await future
                if self._leave_park_if_released():
                    return
                self._events.parked()  # 同 _slow_checkpoint：恢复后紧接着的再次暂停立刻得到确认
        finally:
            self._events.unparked()

    def _enter_park(self) -> bool:
        """确有请求时进入慢路径：停止则抛出；暂停则登记"已挂起"并返回 True；请求已撤销返回 False。"""
        with self._control_lock:
            if self._stop:
                raise TaskCancelled(self._stop_reason)
            if not self._pause:
                return False
            self._parked = True
            if self._wake is None:
                self._wake = threading.Event()
            else:
                self._wake.clear()
            if self._parked_event is not None:
                self._parked_event.set()
        self._events.parked()
        return True

    def _leave_park_if_released(self) -> bool:
        with self._control_lock:
            if self._stop or not self._pause:
                self._parked = False
                if self._parked_event is not None:
                    self._parked_event.clear()
                if self._stop:
                    raise TaskCancelled(self._stop_reason)
                return True
            if self._wake is not None:
                self._wake.clear()
            return False

    # -- the control side (used by executors and by the test handle) -------------------------------

    def _wake_all_locked(self) -> None:
        if self._wake is not None:
            self._wake.set()
        waiters, self._async_waiters = self._async_waiters, None
        for loop, future in waiters or ():
            loop.call_soon_threadsafe(_resolve, future)

    def _request_stop(self, reason: str | None = None) -> None:
        with self._control_lock:
            if not self._stop:
                self._stop_reason = reason
                self._stop = True
            self._wake_all_locked()

    def _request_pause(self) -> None:
        with self._control_lock:
            self._pause = True

    def _request_resume(self) -> None:
        with self._control_lock:
            self._pause = False
            self._wake_all_locked()

    def _confirm_or_cancel_pause(self) -> bool:
        """监督方的暂停窗口到期时调用：已挂起 → True（确认）；否则撤销请求并返回 False。

        与 ``_enter_park`` 在同一把锁下互斥，所以不存在"判定没挂起之后任务又挂起"的窗口。
        """
        with self._control_lock:
            if self._parked:
                return True
            self._pause = False
            self._wake_all_locked()
            return False

    # -- read-only probes ---------------------------------------------------------------------------

    is_stop_requested = Read[bool](
        "_stop", doc="只读探测：已请求停止？清理代码（except / finally）里用它代替 ``checkpoint()``。"
    )
    is_pause_requested = Read[bool]("_pause")
    stop_reason = Read[str | None]("_stop_reason")
    task_id = Read[str]("_task_id")
    task_name = Read[str]("_task_name")
    attempt = Read[int]("_attempt", doc="本次尝试的序号（从 1 起）。")
    clock = Read[Clock]("_clock")
    last_heartbeat = Read[float]("_beat", doc="最近一次心跳的单调时钟读数。")

    # -- progress and logs --------------------------------------------------------------------------

    def progress(
        self,
        done: float,
        *,
        total: float | None = None,
        unit: str | None = None,
        message: str | None = None,
    ) -> None:
        """上报进度。刻意**不**刷新心跳：只报进度不干活的任务照样会被 idle 超时抓住。"""
        value = Progress(done=done, total=total, unit=unit, message=message)
        self._last_progress = value
        self._events.progress(value)

    last_progress = Read[Progress | None]("_last_progress")
    logger_name = Read[str]("_logger_name")

    def log(self, message: object, *, level: int = logging.INFO) -> None:
        """记日志：走标准库 logging（logger ``chongming_task.task.<task_id>``，extra 带
        task_id / task_name / attempt），同时留在 ``ctx.logs``（最近 200 条）。"""
        self._log(message, level)

    def warning(self, message: object) -> None:
        self._log(message, logging.WARNING)

    def error(self, message: object) -> None:
        self._log(message, logging.ERROR)

    def _log(self, message: object, level: int) -> None:
        if isinstance(level, bool) or not isinstance(level, int):
            raise ConfigurationError(f"level 必须是 logging 的整数级别（如 logging.INFO），收到 {level!r}")
        text = str(message)
        entry = LogEntry(self._clock.now(), level, logging.getLevelName(level), text, self._attempt)
        self._logs.append(entry)
        # stacklevel：让 LogRecord 指向调用 ctx.log / warning / error 的那一行，而不是本文件。
        emit_task_log(
            self._logger_name, level, text, self._task_id, self._task_name, self._attempt, stacklevel=3
        )
        self._events.log(entry)

    @property
    def logs(self) -> list[LogEntry]:
        """本任务最近 200 条日志（内存中）。"""
        return list(self._logs)

    # -- upstream data and artifacts ----------------------------------------------------------------

    upstream = Read[Mapping[str, Any]](
        "_upstream", doc="成功的上游节点 → 返回值。失败或跳过的上游不在这里（没有值可传，不塞 None）。"
    )

    def input(self, node_id: str, default: Any = _MISSING) -> Any:
        """取上游节点 ``node_id`` 的返回值；没有这个（成功的）上游时返回 ``default``。"""
        if node_id in self._upstream:
            return self._upstream[node_id]
        if default is _MISSING:
            known = ", ".join(sorted(self._upstream)) or "无"
            raise KeyError(
                f"没有成功的上游节点 {node_id!r}（当前可用：{known}）；上游失败或被跳过时没有值，"
                f"可以传默认值：ctx.input({node_id!r}, 默认值)"
            )
        return default

    @property
    def artifact_dir(self) -> Path:
        """本次尝试的产物目录 ``<root>/<task_id>/attempt-<n>/``，首次访问时创建。"""
        if self._artifact_dir is None:
            if self._artifact_root is None:
                raise ConfigurationError(f"没有配置产物目录：{self._artifact_hint}")
            path = self._artifact_root / _artifact_component(self._task_id) / f"attempt-{self._attempt}"
            path.mkdir(parents=True, exist_ok=True)
            self._artifact_dir = path
        return self._artifact_dir

    def __repr__(self) -> str:
        flags = [name for name, on in (("stop", self._stop), ("pause", self._pause)) if on]
        return f"TaskContext({self._task_id!r}, attempt={self._attempt}, requested={flags or 'none'})"


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def emit_task_log(
    logger_name: str,
    level: int,
    message: str,
    task_id: str,
    task_name: str,
    attempt: int,
    *,
    stacklevel: int = 1,
) -> None:
    """按任务的 logger 名发一条日志，extra 带 task_id / task_name / attempt。

    每个任务一个 ``logging.getLogger(...)`` 会在 logging 的全局字典里永久留下一个 Logger
    （长期运行的控制器会因此无界增长）。所以：若用户已经为这个任务名配置过 logger，就用它；
    否则借父 logger ``chongming_task.task`` 做级别判定与分发，记录的 ``name`` 仍是完整的任务 logger 名。
    """
    existing = logging.Logger.manager.loggerDict.get(logger_name)
    logger = existing if isinstance(existing, logging.Logger) else logging.getLogger(LOGGER_PREFIX)
    if not logger.isEnabledFor(level):
        return
    try:
        path, lineno, func, _ = logger.findCaller(False, stacklevel + 1)
    except ValueError:
        path, lineno, func = "(unknown file)", 0, "(unknown function)"
    extra = {"task_id": task_id, "task_name": task_name, "attempt": attempt}
    record = logger.makeRecord(logger_name, level, path, lineno, message, (), None, func, extra)
    logger.handle(record)


class ContextHandle:
    """控制一侧的把手：请求停止 / 暂停 / 恢复，观察是否已挂起、心跳与进度。

    ``make_context`` 造出的上下文把它挂在 ``ctx.test_handle`` 上，让任务作者不借助任何执行器
    就能验证"停止能停下来、暂停真的挂起"。
    """

    __slots__ = ("_ctx",)

    def __init__(self, ctx: TaskContext) -> None:
        self._ctx = ctx

    context = Read[TaskContext]("_ctx")

    def request_stop(self, reason: str | None = None) -> None:
        """下一次 ``checkpoint()`` 抛 TaskCancelled；已挂起的检查点立即被唤醒并抛出。"""
        self._ctx._request_stop(reason)

    def request_pause(self) -> None:
        """下一次 ``checkpoint()`` 在此挂起，直到 ``request_resume()`` 或 ``request_stop()``。"""
        self._ctx._request_pause()

    def request_resume(self) -> None:
        self._ctx._request_resume()

    def confirm_or_cancel_pause(self) -> bool:
        """已挂起 → True；否则撤销暂停请求并返回 False（与挂起判定互斥，不会说假话）。"""
        return self._ctx._confirm_or_cancel_pause()

    is_parked = Read[bool]("_ctx._parked")

    def wait_parked(self, timeout: float | None = None) -> bool:
        """（真实时间）等到任务在检查点里挂起；返回是否已挂起。"""
        ctx = self._ctx
        with ctx._control_lock:
            if ctx._parked:
                return True
            if ctx._parked_event is None:
                ctx._parked_event = threading.Event()
            event = ctx._parked_event
        return event.wait(timeout)

    heartbeat = Read[float]("_ctx._beat", doc="最近一次心跳的单调时钟读数（与上下文的 clock 同一时间轴）。")
    progress = Read[Progress | None]("_ctx._last_progress")
    logs = Read[list[LogEntry]]("_ctx.logs")


RuntimeContext = TaskContext
"""与 TaskContext 是同一个类（内部叫法）。"""


__all__ = [
    "DEFAULT_ARTIFACT_HINT",
    "LOGGER_PREFIX",
    "MAX_LOGS",
    "ContextEvents",
    "ContextHandle",
    "Heartbeat",
    "LogEntry",
    "RuntimeContext",
    "TaskContext",
    "emit_task_log",
]
