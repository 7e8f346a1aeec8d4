"""不可变的数据记录：快照、迁移记录、失败、进度、结果。

这些类型是存储与运行时之间的共同语言，所以 ``to_dict()`` / ``from_dict()`` 必须逐字段
精确往返（带时区的时间到微秒、枚举、frozenset、嵌套的 failure / progress）——每个存储后端
都依赖这一点。
"""

from __future__ import annotations

import enum
import math
import traceback as traceback_module
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, ClassVar

from chongming_task.core.statuses import TaskStatus
from chongming_task.core.storage.columns import OPTIONAL_TEXT_FIELDS, TIMESTAMP_FIELDS
from chongming_task.errors import ConfigurationError

_new_object = object.__new__

MAX_ID_LENGTH = 512
"""task_id / name 的长度上限：更长的标识符多半是把数据误当成了 id。"""


class FailureKind(enum.StrEnum):
    """失败分类（用户指南 §5.2）。"""

    EXCEPTION = "exception"
    NONZERO_EXIT = "nonzero_exit"
    TIMEOUT_START = "timeout_start"
    TIMEOUT_ATTEMPT = "timeout_attempt"
    TIMEOUT_IDLE = "timeout_idle"
    CANCELLED = "cancelled"
    LOST = "lost"
    DEPENDENCY_FAILED = "dependency_failed"
    CONDITION_FALSE = "condition_false"
    RESULT_INVALID = "result_invalid"

    def __str__(self) -> str:
        return self.value


TIMEOUT_KINDS = frozenset({FailureKind.TIMEOUT_START, FailureKind.TIMEOUT_ATTEMPT, FailureKind.TIMEOUT_IDLE})


def require_aware(name: str, value: object) -> None:
    """None 放行；否则必须是带时区、偏移为整秒的 datetime（快照与存储能精确往返的那种）。"""
    if value is None:
        return
    offset = value.utcoffset() if isinstance(value, datetime) else None
    if offset is None:
        raise ConfigurationError(
            f"{name} 必须是带时区的 datetime（例如 datetime.now(timezone.utc)），收到 {value!r}"
        )
    if offset.microseconds:
        # 现实中没有秒以下的 UTC 偏移；ISO-8601 文本也无法可靠往返它（3.11 的 fromisoformat 会把
        # +00:00:00.000001 读成 UTC）。存储要求逐字段精确往返，所以在入口处拒绝。
        raise ConfigurationError(f"{name} 的 UTC 偏移不能含秒以下部分，收到 {offset!r}")


def _dt_to_text(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="microseconds")


def _dt_from_text(value: object) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):  # 原生类型的后端（如 Postgres）可能直接交回 datetime
        return value
    if not isinstance(value, str):
        raise ConfigurationError(f"时间字段必须是 ISO-8601 文本（含时区），收到 {value!r}")
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise ConfigurationError(f"时间字段必须是 ISO-8601 文本（含时区），收到 {value!r}") from None


@dataclass(frozen=True)
class Failure:
    """一次失败的完整描述。失败原因是技术细节，不是生命周期，所以它不是状态。"""

    kind: FailureKind
    message: str
    retryable: bool = False
    exc_type: str | None = None
    traceback: str | None = None

    def __post_init__(self) -> None:
        # 字段注解是承诺，不是保证：存储与跨进程数据会带来字符串或别的类型，这里按 object 复查。
        kind: object = self.kind
        if not isinstance(kind, FailureKind):
            try:
                object.__setattr__(self, "kind", FailureKind(kind))  # type: ignore[arg-type]
            except ValueError:
                known = ", ".join(k.value for k in FailureKind)
                raise ConfigurationError(f"未知的失败类型 {kind!r}；可选：{known}") from None
        message: object = self.message
        if not isinstance(message, str):
            object.__setattr__(self, "message", str(message))
        retryable: object = self.retryable
        if not isinstance(retryable, bool):
            raise ConfigurationError(f"Failure.retryable 必须是 True 或 False，收到 {retryable!r}")
        for name in ("exc_type", "traceback"):
            text: object = getattr(self, name)
            if text is not None and not isinstance(text, str):
                raise ConfigurationError(f"Failure.{name} 必须是字符串或 None，收到 {text!r}")

    @classmethod
    def from_exception(
        cls, exc: BaseException, *, kind: FailureKind = FailureKind.EXCEPTION, retryable: bool = True
    ) -> Failure:
        """由异常构造：保留类型名、消息与完整 traceback 文本。"""
        exc_type = type(exc)
        qualified = exc_type.__qualname__
        if exc_type.__module__ not in ("builtins", "__main__"):
            qualified = f"{exc_type.__module__}.{qualified}"
        text = "".join(traceback_module.format_exception(exc))
        message = str(exc) or exc_type.__name__
        return cls(kind=kind, message=message, retryable=retryable, exc_type=qualified, traceback=text)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "message": self.message,
            "retryable": self.retryable,
            "exc_type": self.exc_type,
            "traceback": self.traceback,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Failure:
        return cls(
            kind=FailureKind(data["kind"]),
            message=data["message"],
            retryable=bool(data.get("retryable", False)),
            exc_type=data.get("exc_type"),
            traceback=data.get("traceback"),
        )


def _check_number(name: str, value: object, *, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"Progress.{name} 必须是数字，收到 {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ConfigurationError(f"Progress.{name} 必须是非负的有限数，收到 {value!r}")


@dataclass(frozen=True)
class Progress:
    """推进到哪了。与心跳无关：只报进度不干活的任务照样会被 idle 超时抓住。"""

    done: float
    total: float | None = None
    unit: str | None = None
    message: str | None = None

    def __post_init__(self) -> None:
        _check_number("done", self.done, allow_none=False)
        _check_number("total", self.total, allow_none=True)
        if self.unit is not None and not isinstance(self.unit, str):
            raise ConfigurationError(f"Progress.unit 必须是字符串，收到 {self.unit!r}")
        if self.message is not None and not isinstance(self.message, str):
            raise ConfigurationError(f"Progress.message 必须是字符串，收到 {self.message!r}")

    @property
    def fraction(self) -> float | None:
        if self.total is None or self.total == 0:
            return None
        return min(1.0, self.done / self.total)

    def describe(self) -> str:
        """``120/500 partitions`` 或 ``42 batch``：表格与 CLI 共用的写法。"""
        done = _format_amount(self.done)
        text = done if self.total is None else f"{done}/{_format_amount(self.total)}"
        return f"{text} {self.unit}" if self.unit else text

    def to_dict(self) -> dict[str, Any]:
        return {"done": self.done, "total": self.total, "unit": self.unit, "message": self.message}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Progress:
        return cls(
            done=data["done"], total=data.get("total"), unit=data.get("unit"), message=data.get("message")
        )


def _format_amount(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return f"{value:g}"


@dataclass(frozen=True)
class Transition:
    """一条状态迁移记录。``version`` 是迁移之后的 status_version，同一任务内从 1 起逐一递增。"""

    task_id: str
    from_status: TaskStatus
    to_status: TaskStatus
    trigger: str
    actor: str | None
    reason: str | None
    version: int
    at: datetime

    def __post_init__(self) -> None:
        validate_task_id(self.task_id)
        for name in ("from_status", "to_status"):
            value: object = getattr(self, name)
            if not isinstance(value, TaskStatus):
                try:
                    object.__setattr__(self, name, TaskStatus(value))  # type: ignore[arg-type]
                except ValueError:
                    raise ConfigurationError(f"Transition.{name} 是未知的任务状态 {value!r}") from None
        trigger: object = self.trigger
        if not isinstance(trigger, str) or not trigger:
            raise ConfigurationError(f"Transition.trigger 必须是非空字符串，收到 {trigger!r}")
        version: object = self.version
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ConfigurationError(f"Transition.version 必须是 >= 1 的整数，收到 {version!r}")
        for name in ("actor", "reason"):
            text: object = getattr(self, name)
            if text is not None and not isinstance(text, str):
                raise ConfigurationError(f"Transition.{name} 必须是字符串或 None，收到 {text!r}")
        if self.at is None:
            raise ConfigurationError("Transition.at 不能为空：每条迁移记录都必须带时间")
        require_aware("Transition.at", self.at)

    @classmethod
    def _trusted(
        cls,
        task_id: str,
        from_status: TaskStatus,
        to_status: TaskStatus,
        trigger: str,
        actor: str | None,
        reason: str | None,
        version: int,
        at: datetime,
    ) -> Transition:
        """状态机热路径专用：字段已由状态机保证合法，跳过逐字段 ``object.__setattr__`` 与校验。"""
        record: Transition = _new_object(cls)
        record.__dict__.update(
            task_id=task_id,
            from_status=from_status,
            to_status=to_status,
            trigger=trigger,
            actor=actor,
            reason=reason,
            version=version,
            at=at,
        )
        return record

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "from_status": self.from_status.value,
            "to_status": self.to_status.value,
            "trigger": self.trigger,
            "actor": self.actor,
            "reason": self.reason,
            "version": self.version,
            "at": _dt_to_text(self.at),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Transition:
        missing = [
            name
            for name in ("task_id", "from_status", "to_status", "trigger", "version", "at")
            if name not in data
        ]
        if missing:
            raise ConfigurationError(f"迁移记录字典缺少字段：{missing}")
        at = _dt_from_text(data["at"])
        if at is None:
            raise ConfigurationError("迁移记录的 at 不能为空")
        return cls(
            task_id=data["task_id"],
            from_status=TaskStatus(data["from_status"]),
            to_status=TaskStatus(data["to_status"]),
            trigger=data["trigger"],
            actor=data.get("actor"),
            reason=data.get("reason"),
            version=data["version"],
            at=at,
        )


def validate_task_id(task_id: object, *, what: str = "task_id") -> str:
    """task_id / name 的统一校验：非空字符串、无 NUL、长度有上限。"""
    if not isinstance(task_id, str) or not task_id:
        raise ConfigurationError(f"{what} 必须是非空字符串，收到 {task_id!r}")
    if "\x00" in task_id:
        raise ConfigurationError(f"{what} 不能包含 NUL 字符（\\x00）：多数存储无法保存它")
    if len(task_id) > MAX_ID_LENGTH:
        raise ConfigurationError(
            f"{what} 过长（{len(task_id)} 个字符，上限 {MAX_ID_LENGTH}）；请用短标识，把数据放进参数"
        )
    return task_id


def normalize_tags(tags: object) -> frozenset[str]:
    """标签的类型契约是 frozenset[str]：非字符串在入口处就拒绝，而不是等到存储层出错。"""
    if tags is None:
        return frozenset()
    if isinstance(tags, str):
        raise ConfigurationError(
            f"tags 必须是字符串的集合（如 {{'io'}} 或 ['io']），不能是单个字符串 {tags!r}"
        )
    try:
        items = list(tags)  # type: ignore[call-overload]
    except TypeError:
        raise ConfigurationError(f"tags 必须是字符串的集合，收到 {tags!r}") from None
    for item in items:
        if not isinstance(item, str) or not item:
            raise ConfigurationError(f"tags 里只能放非空字符串，收到 {item!r}（类型 {type(item).__name__}）")
        if "\x00" in item:
            raise ConfigurationError("标签不能包含 NUL 字符（\\x00）")
    return frozenset(items)


# 字段清单取自持久层的列表（唯一出处），模型层与各后端不再各抄一份。
_DATETIME_FIELDS = TIMESTAMP_FIELDS
_OPTIONAL_TEXT_FIELDS = OPTIONAL_TEXT_FIELDS


@dataclass(frozen=True)
class TaskSnapshot:
    """某一时刻任务的完整、不可变视图。运行期可从任意线程安全读取。

    status 只回答"处于哪个阶段"；尝试次数、进度、心跳、失败与结果是正交维度，各占一个字段。
    """

    task_id: str
    name: str
    created_at: datetime
    status: TaskStatus = TaskStatus.PENDING
    status_version: int = 0
    label: str | None = None
    attempt: int = 0
    max_attempts: int = 1
    queued_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    last_heartbeat_at: datetime | None = None
    progress: Progress | None = None
    failure: Failure | None = None
    outcome: Any = None
    tags: frozenset[str] = field(default_factory=frozenset)
    priority: int = 0
    bucket: int | None = None
    bucket_key: str | None = None
    executor: str | None = None
    pid: int | None = None
    owner: str | None = None
    lease_owner: str | None = None
    lease_until: datetime | None = None
    pipeline_id: str | None = None
    node_id: str | None = None
    retry_at: datetime | None = None
    description: str | None = None

    FIELD_NAMES: ClassVar[tuple[str, ...]]

    def __post_init__(self) -> None:
        validate_task_id(self.task_id)
        validate_task_id(self.name, what="name")
        status: object = self.status
        if not isinstance(status, TaskStatus):
            try:
                object.__setattr__(self, "status", TaskStatus(status))  # type: ignore[arg-type]
            except ValueError:
                raise ConfigurationError(f"未知的任务状态 {status!r}") from None
        # 总是走 normalize_tags：即便已经是 frozenset[str]，空串与 NUL 也要拒绝。
        object.__setattr__(self, "tags", normalize_tags(self.tags))
        progress: object = self.progress
        if progress is not None and not isinstance(progress, Progress):
            raise ConfigurationError(f"progress 必须是 Progress(...)，收到 {progress!r}")
        failure: object = self.failure
        if failure is not None and not isinstance(failure, Failure):
            raise ConfigurationError(f"failure 必须是 Failure(...)，收到 {failure!r}")
        for name in _DATETIME_FIELDS:
            require_aware(name, getattr(self, name))
        for name in ("status_version", "attempt", "max_attempts", "priority"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigurationError(f"{name} 必须是整数，收到 {value!r}")
        for name in ("bucket", "pid"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigurationError(f"{name} 必须是整数或 None，收到 {value!r}")
        if self.bucket is not None and self.bucket < 0:
            raise ConfigurationError(f"bucket 不能为负数，收到 {self.bucket}")
        for name in _OPTIONAL_TEXT_FIELDS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigurationError(f"{name} 必须是字符串或 None，收到 {value!r}")
        if self.status_version < 0 or self.attempt < 0:
            raise ConfigurationError("status_version 与 attempt 不能为负数")
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts 至少为 1（1 表示不重试），收到 {self.max_attempts}")

    @property
    def is_terminal(self) -> bool:
        return self.status.is_terminal

    @property
    def holds_slot(self) -> bool:
        """此刻是否真的占着执行槽。就地暂停（有 started_at）占槽；排队/重试等待中直接暂停的
        任务没有在跑的载体（状态机在那种暂停时清空 started_at），不占槽。"""
        status = self.status
        if status is TaskStatus.PAUSED:
            return self.started_at is not None
        return status.holds_slot

    def evolve(self, **changes: Any) -> TaskSnapshot:
        """不经校验的快速复制，供状态机与存储内部使用（调用方保证字段合法）。

        ``dataclasses.replace`` 要走一遍 ``__init__`` 与 ``__post_init__``；状态机每次迁移都要
        复制快照，这条热路径直接复制实例字典。
        """
        clone = object.__new__(TaskSnapshot)
        state = clone.__dict__
        state.update(self.__dict__)
        state.update(changes)
        return clone

    def to_dict(self) -> dict[str, Any]:
        """JSON 兼容的字典：时间为 ISO-8601（含时区、到微秒），标签为排序列表。"""
        return {
            "task_id": self.task_id,
            "name": self.name,
            "label": self.label,
            "status": self.status.value,
            "status_version": self.status_version,
            "attempt": self.attempt,
            "max_attempts": self.max_attempts,
            "created_at": _dt_to_text(self.created_at),
            "queued_at": _dt_to_text(self.queued_at),
            "started_at": _dt_to_text(self.started_at),
            "finished_at": _dt_to_text(self.finished_at),
            "last_heartbeat_at": _dt_to_text(self.last_heartbeat_at),
            "progress": None if self.progress is None else self.progress.to_dict(),
            "failure": None if self.failure is None else self.failure.to_dict(),
            "outcome": self.outcome,
            "tags": sorted(self.tags),
            "priority": self.priority,
            "bucket": self.bucket,
            "bucket_key": self.bucket_key,
            "executor": self.executor,
            "pid": self.pid,
            "owner": self.owner,
            "lease_owner": self.lease_owner,
            "lease_until": _dt_to_text(self.lease_until),
            "pipeline_id": self.pipeline_id,
            "node_id": self.node_id,
            "retry_at": _dt_to_text(self.retry_at),
            "description": self.description,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskSnapshot:
        unknown = set(data) - set(cls.FIELD_NAMES)
        if unknown:
            raise ConfigurationError(f"快照字典里有未知字段：{sorted(unknown)}")
        missing = [name for name in ("task_id", "name", "created_at") if data.get(name) is None]
        if missing:
            raise ConfigurationError(f"快照字典缺少必需字段：{missing}")
        values: dict[str, Any] = dict(data)
        for name in _DATETIME_FIELDS:
            if name in values:
                values[name] = _dt_from_text(values[name])
        if values.get("progress") is not None:
            values["progress"] = Progress.from_dict(values["progress"])
        if values.get("failure") is not None:
            values["failure"] = Failure.from_dict(values["failure"])
        if "status" in values:
            values["status"] = TaskStatus(values["status"])
        # 交给 __post_init__ 的 normalize_tags：非字符串标签得到 ConfigurationError，而不是 TypeError。
        values["tags"] = values.get("tags") or ()
        return cls(**values)


TaskSnapshot.FIELD_NAMES = tuple(f.name for f in fields(TaskSnapshot))


@dataclass(frozen=True)
class Outcome:
    """任务落终态后的结果对象（run_task / TaskRun.wait / Controller.wait 的返回值）。"""

    status: TaskStatus
    value: Any
    failure: Failure | None
    snapshot: TaskSnapshot

    @property
    def ok(self) -> bool:
        return self.status is TaskStatus.SUCCEEDED

    @classmethod
    def from_snapshot(cls, snapshot: TaskSnapshot) -> Outcome:
        value = snapshot.outcome if snapshot.status is TaskStatus.SUCCEEDED else None
        return cls(status=snapshot.status, value=value, failure=snapshot.failure, snapshot=snapshot)


__all__ = [
    "MAX_ID_LENGTH",
    "TIMEOUT_KINDS",
    "Failure",
    "FailureKind",
    "Outcome",
    "Progress",
    "TaskSnapshot",
    "Transition",
    "normalize_tags",
    "require_aware",
    "validate_task_id",
]
