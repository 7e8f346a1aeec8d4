"""异常层级（用户指南 §12）。

``TaskCancelled`` 刻意继承 ``BaseException`` 而不是 ``TaskError``：它可能从用户代码的任何
一行冒出来，而 ``except Exception:`` 的写法极其常见——若继承 Exception，停止信号会被吞掉，
任务将永远停不下来。这与 ``asyncio.CancelledError`` 的选择相同。
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chongming_task.core.statuses import TaskStatus


class TaskError(Exception):
    """本库所有业务异常的基类（不含 TaskCancelled）。"""


class InvalidTransition(TaskError):
    """非法状态转移（含守卫不通过）。"""

    def __init__(
        self,
        from_status: TaskStatus,
        to_status: TaskStatus | None,
        action: str,
        allowed: Iterable[TaskStatus],
        detail: str | None = None,
    ) -> None:
        self.from_status = from_status
        self.to_status = to_status
        self.action = action
        self.allowed: frozenset[TaskStatus] = frozenset(allowed)
        self.detail = detail
        # 按状态的声明顺序（生命周期顺序）列出，而不是集合的随机顺序：同一个错误每次读起来都一样。
        ordered = [s.value for s in type(from_status) if s in self.allowed]
        allowed_text = ", ".join(ordered) if ordered else "无（终态）"
        target = to_status.value if to_status is not None else "?"
        message = f"非法状态转移：{from_status.value} -> {target}；动作 '{action}'；当前允许：{allowed_text}"
        if detail:
            message += f"；{detail}"
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        # 默认的异常 pickle 只带 args=(message,)，用它重建会缺参数；进程执行器要跨进程传异常。
        return (type(self), (self.from_status, self.to_status, self.action, self.allowed, self.detail))


class DependencyFailed(TaskError):
    """上游未成功。"""


class CircularDependency(TaskError):
    """依赖成环。``cycle`` 是环上的节点 id 序列（首尾相同）。"""

    def __init__(self, cycle: Iterable[str]) -> None:
        self.cycle: tuple[str, ...] = tuple(cycle)
        super().__init__("依赖成环：" + " -> ".join(self.cycle))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.cycle,))


class TaskTimeout(TaskError):
    """超时。"""


class TaskExecutionError(TaskError):
    """用户代码异常的统一包装；原异常保留在 ``__cause__``。"""


class AttemptsExhausted(TaskError):
    """重试预算耗尽：再启动一次会超过 max_attempts。"""


class ConcurrencyConflict(TaskError):
    """乐观并发写冲突：期望的 status_version 与存储中的不一致。"""


class StoreError(TaskError):
    """存储层故障（连接失败、磁盘只读、数据损坏等）。"""


class ConfigurationError(TaskError, ValueError):
    """配置错误：参数非法、名字未登记、重复注册等。消息说明该怎么改。

    同时是 ValueError：调用方按标准库习惯捕获参数错误也能接住它。
    """


class TaskNotFound(StoreError, LookupError):
    """存储里没有这个 task_id（StoreError 的子类，同时是 LookupError）。"""


class DuplicateTaskId(ConfigurationError):
    """task_id 已存在：存储拒绝重复创建（停止过的任务想再跑，请换一个 task_id 提交）。"""


class TaskCancelled(BaseException):
    """停止信号。继承 BaseException，``except Exception`` 吞不掉它。"""

    def __init__(self, reason: str | None = None) -> None:
        self.reason = reason
        super().__init__(reason or "任务已被请求停止")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason,))


__all__ = [
    "AttemptsExhausted",
    "CircularDependency",
    "ConcurrencyConflict",
    "ConfigurationError",
    "DependencyFailed",
    "DuplicateTaskId",
    "InvalidTransition",
    "StoreError",
    "TaskCancelled",
    "TaskError",
    "TaskExecutionError",
    "TaskNotFound",
    "TaskTimeout",
]
