"""执行器协议：一次尝试怎么被启动、怎么被控制、怎么交回结果。

* ``Executor.check_submittable`` 在提交时（TaskRun 构造时）检查能不能交给这个执行器；
* ``Executor.prepare`` 在 TaskRun 的锁内造出一次尝试的把手（便宜，不启动载体）；
* ``AttemptHandle.launch`` 在锁外真正启动载体。除了 InlineExecutor（它就是为打破这条规则而存在的），
  launch 从不阻塞；
* 载体通过 ``AttemptEvents`` 报告：已就位（running）、进度、日志、挂起/解除挂起、结束（finished）。

状态迁移不在执行器里：执行器只报告事实，TaskRun 在自己的锁下让状态机迁移。
"""

from __future__ import annotations

import asyncio
import enum
import inspect
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from chongming_task.clock import Clock
from chongming_task.context import ContextEvents, ContextHandle, LogEntry, TaskContext
from chongming_task.core.json_depth import check_json_depth
from chongming_task.errors import ConfigurationError, TaskCancelled
from chongming_task.models import Failure, FailureKind
from chongming_task.policies import RetryPolicy
from chongming_task.storage import check_json_value


class ResultKind(enum.StrEnum):
    RETURNED = "returned"  # 正常返回，value 可 JSON 序列化
    INVALID = "invalid"  # 正常返回，但返回值不合规（failure.kind = result_invalid）
    RAISED = "raised"  # 抛出了异常（failure.kind = exception）
    CANCELLED = "cancelled"  # 抛出了 TaskCancelled（响应了停止请求）
    CRASHED = "crashed"  # 载体没交回任何结果就没了（子进程崩溃、非零退出、被杀）


@dataclass(frozen=True)
class AttemptResult:
    kind: ResultKind
    value: Any = None
    failure: Failure | None = None
    exit_code: int | None = None
    """CRASHED 时子进程的退出码（负数表示被信号终止）。"""


@dataclass
class AttemptSpec:
    """启动一次尝试所需的全部信息。

    TaskRun 每次尝试按位置造它（``TaskRun._begin_attempt_locked``，见那里为什么）：改字段顺序时一并改那里。"""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    task_id: str
    name: str
    attempt: int
    clock: Clock
    retry: RetryPolicy
    upstream: Mapping[str, Any]
    artifact_root: Path | None
    logs: deque[LogEntry]
    artifact_hint: str | None = None
    """没配产物目录时告诉用户去哪儿配（None：默认指向 TaskRun / run_task）。"""


class Submission(NamedTuple):
    """提交时交给 ``Executor.check_submittable`` 检查的东西（一个对象，而不是每个执行器各抄一遍四个参数）。"""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    extra: Mapping[str, Any]
    """其余提交参数（upstream / retry / timeout）。"""


class AttemptEvents(ContextEvents):
    """载体向 TaskRun 报告的事件（在载体的线程里调用，必须快、不抛异常）。"""

    def running(self, pid: int | None) -> None:
        """载体已就位，即将执行任务体。"""

    def beat(self, monotonic: float) -> None:
        """跨进程转发来的心跳（已换算到 TaskRun 的时钟上）。"""

    def finished(self, result: AttemptResult) -> None:
        """任务体结束（或载体消失）。每次尝试恰好一次。"""


class AttemptHandle(ABC):
    """一次尝试的控制把手。"""

    pid: int | None = None

    @abstractmethod
    def launch(self) -> None:
        """启动载体。在 TaskRun 的锁之外调用。"""

    @abstractmethod
    def request_stop(self, reason: str | None) -> None: ...

    @abstractmethod
    def request_pause(self) -> None: ...

    @abstractmethod
    def request_resume(self) -> None: ...

    @abstractmethod
    def confirm_or_cancel_pause(self) -> bool:
        """暂停窗口到期：已挂起 → True；否则撤销暂停请求并返回 False。"""

    @abstractmethod
    def last_beat(self) -> float:
        """最近一次心跳（TaskRun 时钟的单调读数）。"""

    def force_stop(self) -> bool:
        """优雅窗口用尽后的兜底。能真的终止载体（之后会收到 CRASHED 结果）返回 True；
        做不到（线程）返回 False，由 TaskRun 如实记 lost。"""
        return False


class Executor(ABC):
    """执行器：决定一次尝试跑在哪里。"""

    name: str = "executor"
    blocking: bool = False
    """launch() 是否在调用线程里把任务跑完（只有 InlineExecutor 是 True）。"""
    supports_pause: bool = True

    def check_submittable(self, job: Submission) -> None:
        """提交时检查（默认只要求任务可调用）。不合格时抛 ConfigurationError，说明怎么改。"""
        if not callable(job.fn):
            raise ConfigurationError(f"任务必须是可调用对象（函数），收到 {job.fn!r}")

    @abstractmethod
    def prepare(self, spec: AttemptSpec, events: AttemptEvents) -> AttemptHandle: ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def build_context(spec: AttemptSpec, events: ContextEvents) -> TaskContext:
    # 规格里的值都来自已校验的快照与任务句柄（见 TaskContext._trusted）：不再逐项校验。
    return TaskContext._trusted(
        spec.task_id,
        spec.name,
        spec.attempt,
        spec.clock,
        spec.upstream,
        spec.artifact_root,
        spec.logs,
        events,
        spec.artifact_hint,
    )


def execute_body(
    fn: Callable[..., Any],
    ctx: TaskContext,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    retry: RetryPolicy,
) -> AttemptResult:
    """在当前线程里跑任务体，把结局分类成 AttemptResult。线程、内联与子进程共用这一份语义。

    ``async def`` 任务：在本线程里用 ``asyncio.run`` 把协程跑完，``await ctx.acheckpoint()`` 照常响应。
    """
    if ctx.is_stop_requested:  # 还没开始就被停止：不执行任务体
        return AttemptResult(ResultKind.CANCELLED, failure=_cancelled_failure(ctx.stop_reason))
    try:
        # 没有参数时直接调用：fn(ctx, *(), **{}) 也要现造一个参数元组、过一遍空字典（约多 0.17 µs）。
        value = fn(ctx, *args, **kwargs) if args or kwargs else fn(ctx)
        if value is None:
            # 最常见的结局（没有返回值）：None 不是协程、总能存，不必再走协程判断、两道结果检查与一次
            # frozen dataclass 构造——共用同一个不可变的结果对象（空任务的吞吐里每任务都省这一段）。
            return _RETURNED_NONE
        if inspect.iscoroutine(value):
            value = asyncio.run(value)
    except TaskCancelled as exc:
        return AttemptResult(ResultKind.CANCELLED, failure=_cancelled_failure(exc.reason))
    except BaseException as exc:
        return AttemptResult(
            ResultKind.RAISED, failure=Failure.from_exception(exc, retryable=retry.is_retryable(exc))
        )
    try:
        # 先量深度（非递归）：过深的值会让编码器抛 RecursionError。
        check_json_depth(value, what="任务返回值")
        check_json_value(value, what="任务返回值")
    except Exception as exc:
        # 结果检查里的任何异常都必须落成 result_invalid：漏出去会让载体线程死掉，任务永远停在 running、
        # 槽位泄漏（issue 22.4）。
        detail = str(exc) if isinstance(exc, ConfigurationError) else f"检查返回值时出错：{exc!r}"
        message = f"{detail}；返回值会写入存储，大数据请返回指针（路径、对象存储 key）"
        failure = Failure(
            FailureKind.RESULT_INVALID, message, retryable=False, exc_type=type(value).__qualname__
        )
        return AttemptResult(ResultKind.INVALID, failure=failure)
    return AttemptResult(ResultKind.RETURNED, value=value)


_RETURNED_NONE = AttemptResult(ResultKind.RETURNED)
"""任务体返回 None 时的结果（frozen，所以可以共用）。"""


def _cancelled_failure(reason: str | None) -> Failure:
    return Failure(FailureKind.CANCELLED, reason or "任务响应停止请求而结束", retryable=False)


class LocalAttempt(ContextHandle, AttemptHandle):
    """在本进程里执行的尝试（线程与内联执行器共用）：控制就是直接拨上下文的标志。

    停止 / 暂停 / 恢复 / 确认暂停与 ``make_context`` 给任务作者的 ``ContextHandle`` 是同一件事，所以
    直接继承它（先于 AttemptHandle，满足那几个抽象方法），不再另写一份转发。
    """

    def __init__(self, spec: AttemptSpec, events: AttemptEvents) -> None:
        # 直接调 ContextHandle 的构造，不经 super()：每次尝试都走这里，super() 要现造一个代理对象。
        ContextHandle.__init__(self, build_context(spec, events))
        self.spec = spec
        self.events = events

    def run_here(self) -> None:
        """在当前线程里报告就位、执行任务体、报告结束。"""
        spec = self.spec
        self.events.running(None)
        result = execute_body(spec.fn, self._ctx, spec.args, spec.kwargs, spec.retry)
        self.events.finished(result)

    def last_beat(self) -> float:
        # 直接读上下文的字段（同 ``heartbeat``，不经 Read 描述符的一层 Python 调用）：每次结算都读一次。
        return self._ctx._beat


__all__ = [
    "AttemptEvents",
    "AttemptHandle",
    "AttemptResult",
    "AttemptSpec",
    "Executor",
    "LocalAttempt",
    "ResultKind",
    "Submission",
    "build_context",
    "execute_body",
]
