"""不可变的数据记录：快照、迁移记录、失败、进度、结果。

这些类型是存储与运行时之间的共同语言，所以 ``to_dict()`` / ``from_dict()`` 必须逐字段
精确往返（带时区的时间到微秒、枚举、frozenset、嵌套的 failure / progress）——每个存储后端
都依赖这一点。
"""

from __future__ import annotations

import enum
import operator
import traceback as traceback_module
from dataclasses import dataclass, field, fields
from datetime import datetime
from itertools import compress as _compress
from typing import Any, ClassVar

from chongming_task.core.numbers import check_number
from chongming_task.core.recipes import Recipe
from chongming_task.core.statuses import TaskStatus
from chongming_task.core.storage.columns import OPTIONAL_TEXT_FIELDS, TIMESTAMP_FIELDS
from chongming_task.errors import ConfigurationError

_new_object = object.__new__
_set_attribute = object.__setattr__


def copy_with(snapshot: TaskSnapshot, changes: dict[str, Any]) -> TaskSnapshot:
    """``TaskSnapshot.evolve`` 与状态机每次迁移的快照复制：复制实例字典、改几个键、整个换上，不经校验。

    为什么不是"新对象的 ``__dict__`` 上 update 两次"：那样新字典要从空的逐键长大（29 个字段，几次扩容），
    每份快照约 2.2 µs；``dict.copy()`` 一次按原样的大小复制，约 1.1 µs，占的内存相同。十万个任务的
    submit_many 每任务一份、每次状态迁移一份。

    ``status`` 与 ``tags`` 不在实例字典里，在槽里（见 ``_SnapshotSlots``）：照抄原来的，或换成 ``changes``
    里给的——给了它们时先从一份 ``changes`` 的拷贝里取走，绝不放进实例字典（放进去再删，字典也已被循环 GC
    追踪上了）。
    """
    state = snapshot.__dict__.copy()
    if "status" in changes or "tags" in changes:
        changes = dict(changes)
        status = changes.pop("status", snapshot.status)
        tags = changes.pop("tags", snapshot.tags)
    else:
        status, tags = snapshot.status, snapshot.tags
    state.update(changes)
    # 先造一个同样布局、不冻结的空壳，换上字典与两个槽，再换成 TaskSnapshot（见 _SnapshotShell）：frozen 的
    # __setattr__ 挡住了普通赋值，原来经 object.__setattr__(clone, "__dict__", state)——3.11 上那是一次经方法
    # 包装、现造参数元组的调用，比两次普通赋值还贵约 0.1 µs。每次状态迁移都复制一份快照（issue 17）。
    clone: Any = _SnapshotShell()
    clone.__dict__ = state
    clone.status = status
    clone.tags = tags
    clone.__class__ = TaskSnapshot
    return clone  # type: ignore[no-any-return]


class _SnapshotSlots:
    """TaskSnapshot 的基类：``status`` 与 ``tags`` 两个字段放在槽里，其余字段照旧在实例字典里。

    为什么：实例字典只要装着一个循环 GC 管的对象，CPython 就追踪这个字典（而且只在全量回收时才复查、放掉）。
    所有字段里只有这两个在每个快照上都是这种对象——``status`` 是枚举成员（3.11 上堆类型的实例都归 GC 管），
    ``tags`` 是 frozenset；其余多半是 str / int / None / datetime。把它们挪进槽里，普通任务的快照字典
    （没有 progress / failure / 容器 outcome / 配方时）从造出来起就不被追踪：积压 5 万个排队任务时每个任务
    少一个晋升进最老一代、每次全量回收都要遍历 29 个引用的对象（issue 17，bench/README 第二十轮 bl20）。
    槽的读写是 C 的成员描述符，比实例字典的查找还快；``dataclasses.fields``、相等、哈希、``repr``、
    ``replace``、``to_dict`` 都按属性读，看不出区别。pickle / ``copy`` 见 TaskSnapshot 的
    ``__getstate__`` / ``__setstate__``。

    ``__dict__`` 与 ``__weakref__`` 也在这里声明：子类（TaskSnapshot、``_SnapshotShell``）都不再加任何
    东西，两者布局相同，``__class__`` 才能互换。
    """

    __slots__ = ("__dict__", "__weakref__", "status", "tags")


class _SnapshotShell(_SnapshotSlots):
    """``copy_with`` 的构造中间体：与 TaskSnapshot 同样的布局（同一个基类、自己不加槽），没有 frozen 的
    ``__setattr__``。换上字典与两个槽后把 ``__class__`` 换成 TaskSnapshot（布局相同，CPython 允许）；
    从不外露。"""

    __slots__ = ()


def snapshot_from_state(state: dict[str, Any]) -> TaskSnapshot:
    """由一个逐字段齐全、已校验过的字典直接造快照（不经 ``__init__`` 与校验）：``status`` / ``tags`` 从字典里
    取走、放进槽（见 ``_SnapshotSlots``），其余的字典就是实例字典。给解码存储行的热路径用（``SqlCodec``
    的 ``trusted_from_row``）；``state`` 归快照所有，调用方之后不得再改它。"""
    clone: Any = _SnapshotShell()
    clone.status = state.pop("status")
    clone.tags = state.pop("tags")
    clone.__dict__ = state
    clone.__class__ = TaskSnapshot
    return clone  # type: ignore[no-any-return]


# ---- 可存储值的上限（用户指南 §13、持久层实现指南 §5.2）-----------------------------------------------
# 这些上限是**唯一**的一份：快照构造、提交入口、返回值检查与各后端的写入检查都调用下面的函数，
# 所以一个值要么在入口处被拒绝（ConfigurationError / failed/result_invalid），要么每个后端都存得下——
# 不会出现"任务照常运行、存储永远写不进去、写穿无限重试"（issue 22.5）。上限比任何后端的限制都严：
# PostgreSQL 的 btree 索引行不超过 2704 字节（task_id 与 created_at 同在一个索引里：512 个字符按 UTF-8
# 最多 2048 字节），GIN 索引项不超过 8191 字节（标签），jsonb 不超过 255 MiB，bigint 是 64 位；SQLite 的
# INTEGER 是 64 位、默认单值上限 1e9 字节。

MAX_ID_LENGTH = 512
"""task_id / name / pipeline_id / node_id / owner 的长度上限（字符）：更长的标识符多半是把数据误当成了 id。"""

MAX_LABEL_LENGTH = 512
"""label 的长度上限（字符）：它是给人看的一行字。"""

MAX_BUCKET_KEY_LENGTH = 512
"""bucket_key 的长度上限（字符）：租户 id、数据源名、日期分区之类。"""

MAX_TAG_LENGTH = 128
"""单个标签的长度上限（字符）：标签用来筛选，PostgreSQL 为它建 GIN 索引（索引项上限 8191 字节）。"""

MAX_TAGS = 64
"""一个任务最多带多少个标签（含 @task / register 声明的）：每个标签都是一条索引项。"""

MAX_DESCRIPTION_LENGTH = 4096
"""description 的长度上限（字符）：一段说明，不是文档。"""

MAX_TEXT_LENGTH = 4096
"""其余文本（执行器名、租约持有者、进度的 message）的长度上限（字符）。"""

MAX_PROGRESS_UNIT_LENGTH = 64
"""进度单位（``partitions``、``行``）的长度上限（字符）。"""

MIN_PRIORITY = -(2**53 - 1)
MAX_PRIORITY = 2**53 - 1
"""priority 的范围：±(2**53 - 1)。在每个后端的 64 位整数列里都放得下，而且经 JSON 交给浮点数解析的
消费者（浏览器里的控制台、jq）时仍然精确——用毫秒时间戳当优先级也绰绰有余。"""

MAX_JSON_BYTES = 16 * 1024 * 1024
"""任务返回值（以及指令 payload、节点 info）编码成 JSON 后的 UTF-8 字节上限：16 MiB。

为什么是 16 MiB：PostgreSQL 的 jsonb 上限约 255 MiB，SQLite 默认单值上限 1e9 字节，这里远低于两者；
结果随终态快照写穿、被每次 get / list 读回、经 ProcessExecutor 的管道传回，16 MiB 仍在毫秒到百毫秒级，
再大就该返回指针（文件路径、对象存储 key）而不是数据本身。"""

MAX_FAILURE_MESSAGE_LENGTH = 16 * 1024
MAX_TRACEBACK_LENGTH = 256 * 1024
"""失败说明与 traceback 超长时截断（保留 traceback 的结尾：最有用的是最后几帧）。失败来自异常，
不能拒绝，所以它们不是报错而是被整理成可存储的文本（NUL 与孤立代理项也被转义）。"""


def sanitize_reason(value: str | None) -> str | None:
    """迁移记录的 actor / reason（状态机的写路径用）：整理成可存储的文本而不是报错。

    它们常由运行时拼出（带着异常消息、用户给 stop() 的原因），在停止、超时的路径上抛错会比存一段
    转义过的文本糟糕得多。热路径：短的、无 NUL 的 ASCII 文本原样返回。
    """
    if value is None or (len(value) <= MAX_TEXT_LENGTH and value.isascii() and "\x00" not in value):
        return value
    return storable_failure_text(value, MAX_TEXT_LENGTH)


def _shown(value: str) -> str:
    """报错里引用用户的值：截短并转义（原值可能有 1 MB，或含终端控制字符）。"""
    return repr(value[:40] + "…" if len(value) > 40 else value)


def storable_text_problem(value: str) -> str | None:
    """文本为什么存不下（None 表示存得下）：NUL（PostgreSQL 的 text / jsonb 存不下）或孤立代理项
    （编码不成 UTF-8，任何后端都存不下）。纯 ASCII 文本只需查 NUL——热路径。"""
    if value.isascii():
        return "NUL 字符（\\x00）" if "\x00" in value else None
    if "\x00" in value:
        return "NUL 字符（\\x00）"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "孤立的代理项（如 \\ud800，无法用 UTF-8 表示）"
    return None


def check_storable_text(what: str, value: object, *, limit: int, optional: bool = True) -> str | None:
    """文本字段的统一检查：字符串、长度不超过 ``limit`` 个字符、没有 NUL 与孤立代理项。"""
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise ConfigurationError(f"{what} 必须是字符串{'或 None' if optional else ''}，收到 {value!r}")
    if len(value) > limit:
        raise ConfigurationError(
            f"{what} 过长（{len(value)} 个字符，上限 {limit}）：请缩短它，大段内容放进参数或返回值"
        )
    problem = storable_text_problem(value)
    if problem is not None:
        raise ConfigurationError(f"{what} 不能包含 {problem}：任何存储都无法原样保存它，收到 {_shown(value)}")
    return value


def check_priority(value: object) -> int:
    """priority：整数（bool 不算），范围见 ``MIN_PRIORITY`` / ``MAX_PRIORITY``。"""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"priority 必须是整数（越大越先执行），收到 {value!r}")
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ConfigurationError(
            f"priority 超出范围（{value}）：必须在 ±(2**53 - 1) 之内，常用的是 -100..100 这样的小整数"
        )
    return value


def storable_failure_text(value: str, limit: int, *, keep_tail: bool = False) -> str:
    """把失败说明 / traceback 整理成可存储的文本：转义 NUL 与孤立代理项，超长截断并注明。"""
    if storable_text_problem(value) is not None:
        value = value.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(value) > limit:
        marker = f"…（已截断，原长 {len(value)} 个字符）…"
        keep = limit - len(marker)
        value = marker + value[-keep:] if keep_tail else value[:keep] + marker
    return value


class FailureKind(enum.StrEnum):
    """失败分类（用户指南 §5.2；StrEnum 自带 str() 即值）。"""

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
            message = str(message)
        # 失败来自异常，不能拒绝：把说明整理成每个后端都存得下的文本（转义 NUL / 孤立代理项、截断），
        # 否则一个消息里带 NUL 的异常会让终态快照永远写不进 PostgreSQL（issue 22.5）。
        object.__setattr__(self, "message", storable_failure_text(message, MAX_FAILURE_MESSAGE_LENGTH))
        retryable: object = self.retryable
        if not isinstance(retryable, bool):
            raise ConfigurationError(f"Failure.retryable 必须是 True 或 False，收到 {retryable!r}")
        for name, limit in (("exc_type", MAX_TEXT_LENGTH), ("traceback", MAX_TRACEBACK_LENGTH)):
            text: object = getattr(self, name)
            if text is not None and not isinstance(text, str):
                raise ConfigurationError(f"Failure.{name} 必须是字符串或 None，收到 {text!r}")
            if text is not None:
                cleaned = storable_failure_text(text, limit, keep_tail=name == "traceback")
                object.__setattr__(self, name, cleaned)

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
    check_number(f"Progress.{name}", value, low=0, allow_none=allow_none)


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
        # 进度经旁路写进存储：存不下的文本在 ctx.progress(...) 处就报错，而不是让旁路写入一直失败。
        check_storable_text("Progress.unit", self.unit, limit=MAX_PROGRESS_UNIT_LENGTH)
        check_storable_text("Progress.message", self.message, limit=MAX_TEXT_LENGTH)

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


@dataclass(frozen=True, slots=True)
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
            check_storable_text(f"Transition.{name}", text, limit=MAX_TEXT_LENGTH)
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
        # __slots__：每条迁移记录一个对象（没有 __dict__）。每个任务至少四条、全都常驻内存，省下的字典
        # 直接减轻循环 GC 的全量扫描与内存（issue 17）。
        # 先按同样布局、不冻结的孪生类（_TransitionFields）造出来、逐个普通赋值（解释器特化成直接写槽），
        # 最后换上真正的类。为什么：frozen 的 __setattr__ 挡住了普通赋值，绕过它只能逐个调槽描述符的
        # __set__——在 3.11 上那是经方法包装、每次现造一个参数元组的调用，八个字段约 0.7 µs；这样约 0.3 µs。
        # 每个任务三四次迁移，每次都造一条（issue 17）。结果与 Transition(...) 逐字段相同、类型就是 cls。
        record: Any = _TransitionFields()  # 字段的类型由 Transition 的声明给出（见 _TransitionFields）
        record.task_id = task_id
        record.from_status = from_status
        record.to_status = to_status
        record.trigger = trigger
        record.actor = actor
        record.reason = reason
        record.version = version
        record.at = at
        record.__class__ = cls
        return record  # type: ignore[no-any-return]

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


class _TransitionFields:
    """``Transition._trusted`` 的构造中间体：与 Transition 同样的槽（同名、同序、同一个基类），没有 frozen 的
    ``__setattr__``。造好之后把 ``__class__`` 换成 Transition（布局相同，CPython 允许）；它自己从不外露。"""

    # 直接取 Transition 的槽（不另抄一份名单）：同名、同序，布局必然相同——换 __class__ 的前提，字段有增减时
    # 也跟着变。
    __slots__ = Transition.__slots__


PackedTransition = tuple[str, str, str, "str | None", "str | None", int, datetime]
"""一条迁移记录的紧凑形式：(起点状态值, 终点状态值, trigger, actor, reason, version, at)，不带 task_id。

为什么有它：状态机与内存存储给每个在管任务常驻整段历史（每个任务至少四条）。Transition 是被循环 GC 追踪的
对象，每条都要在每次全量回收时扫一遍；只含 str / int / None / datetime 的精确元组在第一次回收时就被 GC
不再追踪（状态存成值字符串而不是枚举成员，正为此）。于是常驻的只剩一个装它们的容器，读历史时才现造
Transition（``unpack_transition``；读历史远比写少）。issue 17。
"""

PACKED_TUPLE_MAX = 32
"""一段紧凑历史不超过这么多条时存成元组、每多一条换一个长一条的新元组（O(条数) 的复制），更长时状态机换成
列表原地追加、内存存储换成 version → 记录的 dict。状态机与内存存储共用这一个界：写穿落库新任务时内存存储
存下的正是状态机的那个元组，两边按同一个长度换形状。"""

STATUS_VALUE: dict[TaskStatus, str] = {status: status.value for status in TaskStatus}
"""状态 → 它的值字符串（紧凑形式里存的是值；状态机的 ``_apply`` 内联打包时也查这张表）。"""
_STATUS_OF: dict[str, TaskStatus] = {status.value: status for status in TaskStatus}
# wait_all 给每个任务造一个 Outcome（from_snapshot）：读枚举类属性的慢钩子见 core/statuses.py
_SUCCEEDED = TaskStatus.SUCCEEDED


def pack_transition(record: Transition) -> PackedTransition:
    """Transition → 紧凑形式（见 ``PackedTransition``）。"""
    return (
        STATUS_VALUE[record.from_status],
        STATUS_VALUE[record.to_status],
        record.trigger,
        record.actor,
        record.reason,
        record.version,
        record.at,
    )


def unpack_transition(task_id: str, packed: PackedTransition) -> Transition:
    """紧凑形式 → Transition（字段来自一条已校验过的记录，不再校验）。"""
    from_value, to_value, trigger, actor, reason, version, at = packed
    return Transition._trusted(
        task_id, _STATUS_OF[from_value], _STATUS_OF[to_value], trigger, actor, reason, version, at
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
    if not task_id.isascii() and storable_text_problem(task_id) is not None:
        raise ConfigurationError(
            f"{what} 不能包含无法用 UTF-8 表示的字符（孤立的代理项，如 \\ud800）：任何存储都无法保存它，"
            f"收到 {_shown(task_id)}"
        )
    return task_id


_NO_TAGS: frozenset[str] = frozenset()
NO_TAGS = _NO_TAGS
"""共用的空标签集合（解码没有标签的行时用它，不为每个快照新建一个）。"""
_PLAIN_COLLECTIONS = (frozenset, set, tuple, list)


def normalize_tags(tags: object) -> frozenset[str]:
    """标签的类型契约是 frozenset[str]：非字符串在入口处就拒绝，而不是等到存储层出错。"""
    if tags is None or (not tags and tags.__class__ in _PLAIN_COLLECTIONS):
        return _NO_TAGS  # 最常见：没有标签。共用一个空集合，不为每个快照新建一个（集合都被循环 GC 追踪）
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
            raise ConfigurationError(
                f"tags 里只能放非空字符串，收到 {_shown(item) if isinstance(item, str) else repr(item)[:80]}"
                f"（类型 {type(item).__name__}）"
            )
        if "\x00" in item:
            raise ConfigurationError("标签不能包含 NUL 字符（\\x00）")
        check_storable_text("标签", item, limit=MAX_TAG_LENGTH, optional=False)
    result = frozenset(items)
    check_tag_count(result)
    return result


def check_tag_count(tags: frozenset[str]) -> frozenset[str]:
    """标签个数上限（合并 @task / register 声明的与提交时给的之后再查一次）。"""
    if len(tags) > MAX_TAGS:
        raise ConfigurationError(f"标签太多（{len(tags)} 个，上限 {MAX_TAGS}）：标签用来筛选，数据请放进参数")
    return tags


# 字段清单取自持久层的列表（唯一出处），模型层与各后端不再各抄一份。
_DATETIME_FIELDS = TIMESTAMP_FIELDS
_OPTIONAL_TEXT_FIELDS = OPTIONAL_TEXT_FIELDS

_TEXT_LIMITS: dict[str, int] = {
    "label": MAX_LABEL_LENGTH,
    "bucket_key": MAX_BUCKET_KEY_LENGTH,
    "description": MAX_DESCRIPTION_LENGTH,
    "owner": MAX_ID_LENGTH,
    "pipeline_id": MAX_ID_LENGTH,
    "node_id": MAX_ID_LENGTH,
}
_TEXT_FIELD_LIMITS: tuple[tuple[str, int], ...] = tuple(
    (name, _TEXT_LIMITS.get(name, MAX_TEXT_LENGTH)) for name in OPTIONAL_TEXT_FIELDS
)


STORABLE_FIELDS = operator.itemgetter(*(name for name, _ in _TEXT_FIELD_LIMITS))
"""``check_storable_fields`` 检查的文本字段，按实例字典取成一个元组：``check_storable_changes`` 的快速判定——
两份快照的这个元组相等、priority 是同一个对象、标签是同一个集合时它什么也不查。热路径上的调用方（内存存储的
``_save_next``）先这样判一次、省一层调用。标签不在实例字典里（在槽里，见 ``_SnapshotSlots``），单独比。"""
_TEXT_INDEXES = range(len(_TEXT_FIELD_LIMITS))
_TEXT_LIMIT_AT = tuple(limit for _, limit in _TEXT_FIELD_LIMITS)


def check_storable_fields(snapshot: TaskSnapshot) -> None:
    """快照里除 outcome 以外的可存储性：文本字段（长度、NUL、孤立代理项）、priority 范围、标签个数。

    快照构造时调用它，各后端写入前（``checks.check_snapshot``）也调用它——同一个函数，所以绕过构造
    校验（``evolve``）的快照也逃不过写入检查。outcome 由 ``check_json_value`` 管（返回时与写入时）。
    每次 save 都会走一遍：纯 ASCII 的短文本只是几次 O(1) 判断。
    """
    # 读实例字典而不是 getattr、短的纯 ASCII 文本就地判定（不再调用 check_storable_text）：这个函数每个任务
    # 至少走两遍（构造一遍、create 一遍），逐字段的函数调用就是它的大头。
    state = snapshot.__dict__
    for name, limit in _TEXT_FIELD_LIMITS:
        value = state[name]
        if value is not None and not (
            value.__class__ is str and len(value) <= limit and value.isascii() and "\x00" not in value
        ):
            check_storable_text(name, value, limit=limit)
    priority = state["priority"]
    if not (priority.__class__ is int and MIN_PRIORITY <= priority <= MAX_PRIORITY):
        check_priority(priority)
    check_tag_count(snapshot.tags)


def check_storable_changes(previous: TaskSnapshot, snapshot: TaskSnapshot) -> None:
    """``check_storable_fields``，但只查 ``snapshot`` 里与 ``previous`` 不是同一个对象的字段。

    ``previous`` 必须是整份查过的快照（存储里的上一版）：字段值都不可变，同一个对象就是查过的值，再查一遍
    结果不会变。写穿每次迁移只改状态、版本与几个时间，文本字段都原样沿用——一次 save 省下十来次文本检查。
    读实例字典而不是 getattr：文本字段与 priority 全在实例字典里（构造、``evolve`` 与状态机都整份填它）。
    """
    old, new = previous.__dict__, snapshot.__dict__
    # 最常见：文本字段全都原样沿用——两个元组在 C 里逐项比较（同一个对象直接算相等），一次就判定完。
    # 与查过的文本相等的文本，可存储性也一样。priority 单独按"同一个对象"判定：5.0 与 True 都"等于"一个
    # 整数，却不是合法的 priority。
    new_values, old_values = STORABLE_FIELDS(new), STORABLE_FIELDS(old)
    if new_values == old_values:
        if new["priority"] is not old["priority"]:
            check_priority(new["priority"])
        if snapshot.tags is not previous.tags:
            check_tag_count(snapshot.tags)
        return
    check_storable_values(new_values, old_values, new, old, snapshot.tags, previous.tags)


def check_storable_values(
    new_values: tuple[Any, ...],
    old_values: tuple[Any, ...],
    new: dict[str, Any],
    old: dict[str, Any],
    new_tags: frozenset[str],
    old_tags: frozenset[str],
) -> None:
    """``check_storable_changes`` 的后一半：调用方已取好两份快照的 ``STORABLE_FIELDS``（``new_values`` /
    ``old_values``）、实例字典（``new`` / ``old``，``old`` 是查过的那一份）与标签，只查不是同一个对象的
    那几项、priority 与标签。为什么单列：热路径上的调用方（内存存储的 ``_save_next``）先用这两个元组做了
    快速判定，有变时（写穿每个任务一次：starting 记下执行器名）不必再取一遍。"""
    # 有变的（写穿时每个任务一次：starting 记下执行器名）：哪几项不是同一个对象由 compress /
    # map(is_not) 在 C 里挑出，只有它们进 Python 的循环体（通常一项；原来十几个字段逐个在 Python 里比，
    # issue 17）。短的纯 ASCII 文本就地判定——与 check_storable_fields 同一个判据，其余交给
    # check_storable_text。
    for index in _compress(_TEXT_INDEXES, map(operator.is_not, new_values, old_values)):
        value = new_values[index]
        if value is not None and not (
            value.__class__ is str
            and len(value) <= _TEXT_LIMIT_AT[index]
            and value.isascii()
            and "\x00" not in value
        ):
            name, limit = _TEXT_FIELD_LIMITS[index]
            check_storable_text(name, value, limit=limit)
    if new["priority"] is not old["priority"]:
        check_priority(new["priority"])
    if new_tags is not old_tags:
        check_tag_count(new_tags)


@dataclass(frozen=True)
class TaskSnapshot(_SnapshotSlots):
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
    recipe: Recipe | None = None
    """持久任务的配方（issue 19；``core/recipes.py``）：只由 create 写入，save 从不改写。None = 普通任务。"""

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
        recipe: object = self.recipe
        if recipe is not None and not isinstance(recipe, Recipe):
            raise ConfigurationError(f"recipe 必须是 Recipe(...) 或 None，收到 {recipe!r}")
        # 每次提交都走这里：读实例字典、None 与精确的 int 就地放行，只有要细查的值才调用检查函数。
        state = self.__dict__
        for name in _DATETIME_FIELDS:
            value = state[name]
            if value is not None:
                require_aware(name, value)
        for name in ("status_version", "attempt", "max_attempts", "priority"):
            value = state[name]
            if value.__class__ is not int and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigurationError(f"{name} 必须是整数，收到 {value!r}")
        for name in ("bucket", "pid"):
            value = state[name]
            if (
                value is not None
                and value.__class__ is not int
                and (isinstance(value, bool) or not isinstance(value, int))
            ):
                raise ConfigurationError(f"{name} 必须是整数或 None，收到 {value!r}")
        if self.bucket is not None and self.bucket < 0:
            raise ConfigurationError(f"bucket 不能为负数，收到 {self.bucket}")
        check_storable_fields(self)
        if self.status_version < 0 or self.attempt < 0:
            raise ConfigurationError("status_version 与 attempt 不能为负数")
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts 至少为 1（1 表示不重试），收到 {self.max_attempts}")

    @property
    def is_terminal(self) -> bool:
        return self.status.is_terminal

    @property
    def durable(self) -> bool:
        """是否持久任务（带配方：任何登记了同名任务的 worker 都能认领、重跑它）。"""
        return self.recipe is not None

    @property
    def holds_slot(self) -> bool:
        """此刻是否真的占着执行槽。就地暂停（有 started_at）占槽；排队/重试等待中直接暂停的
        任务没有在跑的载体（状态机在那种暂停时清空 started_at），不占槽。"""
        status = self.status
        if status is TaskStatus.PAUSED:
            return self.started_at is not None
        return status.holds_slot

    def __getstate__(self) -> dict[str, Any]:
        """pickle / ``copy`` 的状态：全部字段按声明顺序的一个字典——与 ``status`` / ``tags`` 还在实例字典里时
        交出的一样（见 ``_SnapshotSlots``），所以新旧版本之间互相读得懂对方的 pickle。"""
        return dict(zip(_SNAPSHOT_FIELDS, _snapshot_values(self), strict=True))

    def __setstate__(self, state: dict[str, Any]) -> None:
        """``__getstate__`` 的逆过程，也读得懂以前的 pickle（那时状态就是整个实例字典）。``status`` /
        ``tags`` 放进槽；其余的逐键放进一个新字典——不把这两个先放进去再删：字典一旦装过循环 GC 管的对象就
        被追踪上了（见 ``_SnapshotSlots``）。"""
        _set_attribute(self, "status", state.get("status", TaskStatus.PENDING))
        _set_attribute(self, "tags", state.get("tags", _NO_TAGS))
        _set_attribute(self, "__dict__", {k: v for k, v in state.items() if k not in _SLOT_FIELDS})

    def evolve(self, **changes: Any) -> TaskSnapshot:
        """不经校验的快速复制，供状态机与存储内部使用（调用方保证字段合法）。

        ``dataclasses.replace`` 要走一遍 ``__init__`` 与 ``__post_init__``；状态机每次迁移都要
        复制快照，这条热路径直接复制实例字典。
        """
        return copy_with(self, changes)

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
            "recipe": None if self.recipe is None else self.recipe.to_dict(),
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
        if values.get("recipe") is not None:
            values["recipe"] = Recipe.from_dict(values["recipe"])
        if "status" in values:
            values["status"] = TaskStatus(values["status"])
        # 交给 __post_init__ 的 normalize_tags：非字符串标签得到 ConfigurationError，而不是 TypeError。
        values["tags"] = values.get("tags") or ()
        return cls(**values)


TaskSnapshot.FIELD_NAMES = tuple(f.name for f in fields(TaskSnapshot))
_SNAPSHOT_FIELDS = TaskSnapshot.FIELD_NAMES
_snapshot_values = operator.attrgetter(*_SNAPSHOT_FIELDS)
_SLOT_FIELDS = frozenset(_SnapshotSlots.__slots__) - {"__dict__", "__weakref__"}
# dataclass 把 status 的缺省值留成了类属性：它会遮住基类里的槽描述符（读 snapshot.status 就先找到类上的
# PENDING）。缺省值 __init__ 自己记着（dataclasses 生成的 __init__ 不读类属性），fields() 也照样交出。
delattr(TaskSnapshot, "status")
# 布局相同是 copy_with 换 __class__ 的前提：子类都不该再加槽（否则导入即报错，而不是运行时才出怪事）。
# 不用 assert：python -O 会把它去掉。
if not TaskSnapshot.__basicsize__ == _SnapshotShell.__basicsize__ == _SnapshotSlots.__basicsize__:
    raise RuntimeError("TaskSnapshot 与 _SnapshotShell 布局不同：copy_with 不能换 __class__（子类别加槽）")


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
        status = snapshot.status
        value = snapshot.outcome if status is _SUCCEEDED else None
        # 热路径（wait_all 给每个在管任务造一个，issue 17）：字段全部取自一份已校验的快照，
        # 跳过 frozen dataclass 的 __init__（它经 __setattr__ 重载逐字段 object.__setattr__）。
        # Outcome 没有 __post_init__，结果与 cls(...) 按值相等。不用 ``__dict__.update``：读 __dict__
        # 会把实例的内联属性值物化成一个被循环 GC 追踪的字典，每个结果多一个对象（3.11 起）。
        outcome: Outcome = _new_object(cls)
        _set_attribute(outcome, "status", status)
        _set_attribute(outcome, "value", value)
        _set_attribute(outcome, "failure", snapshot.failure)
        _set_attribute(outcome, "snapshot", snapshot)
        return outcome


__all__ = [
    "MAX_BUCKET_KEY_LENGTH",
    "MAX_DESCRIPTION_LENGTH",
    "MAX_FAILURE_MESSAGE_LENGTH",
    "MAX_ID_LENGTH",
    "MAX_JSON_BYTES",
    "MAX_LABEL_LENGTH",
    "MAX_PRIORITY",
    "MAX_PROGRESS_UNIT_LENGTH",
    "MAX_TAGS",
    "MAX_TAG_LENGTH",
    "MAX_TEXT_LENGTH",
    "MAX_TRACEBACK_LENGTH",
    "MIN_PRIORITY",
    "NO_TAGS",
    "PACKED_TUPLE_MAX",
    "STATUS_VALUE",
    "STORABLE_FIELDS",
    "TIMEOUT_KINDS",
    "Failure",
    "FailureKind",
    "Outcome",
    "PackedTransition",
    "Progress",
    "TaskSnapshot",
    "Transition",
    "check_priority",
    "check_storable_changes",
    "check_storable_fields",
    "check_storable_text",
    "check_storable_values",
    "check_tag_count",
    "normalize_tags",
    "pack_transition",
    "require_aware",
    "sanitize_reason",
    "storable_failure_text",
    "storable_text_problem",
    "unpack_transition",
    "validate_task_id",
]
