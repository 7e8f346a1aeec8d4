"""快照、迁移记录、指令与 SQLite 行之间的转换：``SqlDialect`` 的 SQLite 钩子。

列清单与"记录 ↔ 行"的推导在 ``chongming_task.core.storage.sql``（由列表 ``columns`` 推导）；这里只说
SQLite 怎么存：时间存 ISO 原文保偏移，另存 UTC 微秒整数作排序键（``Column.sort_key``）；JSON 值经
``check_json_value`` 校验后存为 TEXT（JSON null 也存成文本 ``null``，所以 JSON 列 NOT NULL）；集合存成升序的
JSON 数组。保真要求（每个后端都一样）：带时区的时间到微秒、原始时区偏移、枚举、标签集合、嵌套的
failure / progress、任意 JSON outcome 都要逐字段往返。
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from chongming_task.core.records import PackedTransition
from chongming_task.core.storage.checks import check_json_value, check_transitions
from chongming_task.core.storage.columns import Column, Kind
from chongming_task.core.storage.sql import (
    CommandCodec,
    NodeCodec,
    SnapshotCodec,
    SqlDialect,
    TransitionCodec,
)
from chongming_task.core.storage.values import NodeRecord
from chongming_task.models import Progress, TaskSnapshot, Transition

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

_TIME_MEMO: dict[int, tuple[datetime, tuple[str], tuple[str, int]]] = {}
"""``encode_time`` 的结果，按时间对象的 id（见那里）：(对象, 单列的编码, 带排序键的两列编码)，两种形状都
现成，命中时不再造元组。满了整个清空：只为相邻几次 save 复用，不求命中率。"""
_TIME_MEMO_SIZE = 64
"""记忆表至多几项。为什么这么小：每一项是三个元组，它们活到下一次清空——在循环 GC 的账上这是"活下来的新
容器"，第 0 代每攒 700 个就回收一次。原来的 4,096 项让写穿每个任务多留下十几个这样的元组（每任务五个新
时刻），逐个 submit 的基准里第 0 代回收多出约一半（每千个任务 29.6 → 18–21 次，bench/README.md 第十九轮
sq19）。要复用的时间都在同一个任务相邻的几次编码之间（create 的快照与它的迁移记录、save 的快照与它的
迁移记录；更早的时间由 save 行的提示照抄，见 store._RowHints）：64 项时回放里每任务的重新编码只从 5.000
次变成 5.044 次。"""

_SECOND = timedelta(seconds=1)
_LAST_UTC = datetime.max.replace(tzinfo=UTC)
_LAST_SECOND = _LAST_UTC - _SECOND
_DIGITS3 = tuple(f"{number:03d}" for number in range(1000))
_utc_second: tuple[datetime, datetime, str, int] = (_EPOCH, _EPOCH, "", 0)
"""最近一次编码的 UTC 时间所在的那一秒：(这一秒的开头, 下一秒的开头, ``YYYY-MM-DDTHH:MM:SS.`` 前缀,
这一秒开头的排序键)。整个元组一次换上（见 ``_text_and_key``），别的线程读到的总是同一秒的四项。初值的区间
是空的。"""

_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)


def _iso(value: datetime) -> str:
    # 不带参数的 isoformat() 比带 timespec 的快一倍（每个新时间省约 1 µs：十万个任务的 submit_many 里每任务
    # 至少一个）。两者只在微秒为零时不同（前者省掉小数部分），那时才指定 timespec：存下的文本总带六位微秒。
    return value.isoformat() if value.microsecond else value.isoformat(timespec="microseconds")


def _text_and_key(value: datetime) -> tuple[str, int]:
    """时间 → (``_iso`` 的原文, ``dt_key`` 的排序键)，两者逐字相同，只是 UTC 时间（本库时钟给的都是）更省。

    为什么不直接 ``isoformat()``：带时区的 ``isoformat`` 在 3.11 里每次约 1.2 万条指令（callgrind，比不带
    时区的多一半：偏移另要格式化、拼接），排序键的时间差整除又是几千条；写穿每个任务要编四五个新时刻（创建、
    开始、running 与结束的时间），是存储一侧编码里最贵的一项。UTC 时间的原文就是
    ``YYYY-MM-DDTHH:MM:SS.ffffff+00:00``：前面到秒的一段同一秒里的时刻都一样。记下最近的那一秒（它的开头与
    下一秒的开头），落在这一秒里的时刻只比两次大小（C 里逐字节比）、读一次微秒、查两次三位数字的表（不经
    格式说明 ``06d`` 的解析）、拼一次；排序键是这一秒开头的键加微秒。每次约 3.3k 条指令。第二十一轮之前
    记的是最近一分钟，每次还要读时、分、秒与 ``toordinal``，再做几次大整数运算与一次格式说明，约 7.0k
    （callgrind，bench/README.md 第二十一轮 sq21）。逐个 submit 时一秒里有上千次编码，换秒的那一次多花
    约 2k。别的时区、datetime 的子类照旧走 ``isoformat``（原文保留原始偏移）。测试逐字对照两种写法。"""
    if value.__class__ is datetime and value.tzinfo is UTC:
        global _utc_second
        cached = _utc_second
        if not cached[0] <= value < cached[1]:
            start = value.replace(microsecond=0)
            # 最后一秒（9999-12-31T23:59:59）之后没有"下一秒"：区间到 datetime.max 为止（那一刻本身每次重算）
            end = start + _SECOND if start < _LAST_SECOND else _LAST_UTC
            prefix = (
                f"{start.year:04d}-{start.month:02d}-{start.day:02d}T"
                f"{start.hour:02d}:{start.minute:02d}:{start.second:02d}."
            )
            cached = (start, end, prefix, (start - _EPOCH) // _MICROSECOND)
            _utc_second = cached  # 整个元组一次换上：并发的读者看不到半新半旧的四项
        micro = value.microsecond
        # 微秒的六位数字拆成两段查表（不经 ``:06d`` 的格式说明解析）
        return f"{cached[2]}{_DIGITS3[micro // 1000]}{_DIGITS3[micro % 1000]}+00:00", cached[3] + micro
    return _iso(value), (value - _EPOCH) // _MICROSECOND


def dt_text(value: datetime | None) -> str | None:
    return None if value is None else _iso(value)


def dt_parse(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def dt_key(value: datetime | None) -> int | None:
    """UTC 微秒整数：按时刻排序（不同偏移的同一时刻 key 相同），且在 64 位整数范围内（公元 1–9999 年）。"""
    return None if value is None else (value - _EPOCH) // _MICROSECOND


def json_text(value: Any, *, what: str) -> str:
    """严格 JSON 文本。含孤立代理项（无法编成 UTF-8）时退回 ASCII 转义写法，解析结果不变。"""
    text = check_json_value(value, what=what)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text


def prefix_upper_bound(prefix: str) -> str | None:
    """大于所有以 ``prefix`` 开头的字符串的最小字符串（码点序，也就是 UTF-8 字节序）。

    ``name >= prefix AND name < bound`` 恰好等价于 ``name.startswith(prefix)``，并且能走普通
    BINARY 索引——而 SQLite 的 LIKE 默认对 ASCII 不分大小写，与 ``str.startswith`` 不一致。
    前缀全由最大码点组成时没有上界，返回 None。
    """
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if code in _SURROGATES:
            code = _SURROGATES.stop
        if code <= _MAX_CODE_POINT:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


def _time_entry(value: datetime) -> tuple[datetime, tuple[str], tuple[str, int]]:
    """``value`` 在记忆表里的那一项（没有就编一次、记下）。

    同一个任务的相邻几次 save 带的是同一批时间对象（created_at、queued_at、started_at 在状态机里原样传下去），
    每次都重新格式化是一次 save 编码里最贵的一项。按对象身份记住结果：记录里存着对象本身，它活着 id 就不会
    被复用；不按值查，因为偏移不同的同一时刻相等，原文却不同。"""
    found = _TIME_MEMO.get(id(value))
    if found is None or found[0] is not value:
        if len(_TIME_MEMO) >= _TIME_MEMO_SIZE:
            _TIME_MEMO.clear()
        text, key = _text_and_key(value)
        found = (value, (text,), (text, key))
        _TIME_MEMO[id(value)] = found
    return found


_NO_TIME: tuple[None] = (None,)
_NO_KEYED_TIME: tuple[None, None] = (None, None)


def _encode_time(value: datetime | None) -> tuple[Any, ...]:
    """没有排序键的时间列：``(原文,)``。"""
    return _NO_TIME if value is None else _time_entry(value)[1]


def _encode_keyed_time(value: datetime | None) -> tuple[Any, ...]:
    """带排序键的时间列：``(原文, UTC 微秒键)``。"""
    return _NO_KEYED_TIME if value is None else _time_entry(value)[2]


class SqliteDialect(SqlDialect):
    """SQLite 的存法（见模块说明）。"""

    def time_columns(self, column: Column) -> tuple[str, ...]:
        return (column.name,) if column.sort_key is None else (column.name, column.sort_key)

    def encode_time(self, column: Column, value: datetime | None) -> tuple[Any, ...]:
        return _encode_time(value) if column.sort_key is None else _encode_keyed_time(value)

    def encoder(self, column: Column, label: str, json_label: str) -> Callable[[Any], tuple[Any, ...]]:
        # 时间列直接用下面两个模块级函数（与 encode_time 同一结果）：每次写入要编八九个时间字段，基类的
        # ``lambda value: self.encode_time(column, value)`` 每次多一层 Python 调用与一次属性读。
        if column.kind is Kind.TIMESTAMP:
            return _encode_time if column.sort_key is None else _encode_keyed_time
        return super().encoder(column, label, json_label)

    def decode_time(self, values: Sequence[Any]) -> datetime | None:
        return dt_parse(values[0])

    def encode_json(self, value: Any, what: str) -> Any:
        return json_text(value, what=what)

    def decode_json(self, raw: Any) -> Any:
        return None if raw == "null" else json.loads(raw)

    def encode_tags(self, tags: list[str]) -> Any:
        return json_text(tags, what="tags") if tags else "[]"  # 绝大多数任务没有标签

    def decode_tags(self, raw: Any) -> frozenset[str]:
        return frozenset(json.loads(raw)) if raw != "[]" else frozenset()

    def encode_buckets(self, buckets: list[int] | None) -> Any:
        return None if buckets is None else json.dumps(buckets, separators=(",", ":"))

    def decode_buckets(self, raw: Any) -> frozenset[int] | None:
        return None if raw is None else frozenset(json.loads(raw))

    def sql_type(self, column: Column) -> str:
        return "INTEGER" if column.kind is Kind.INT else "TEXT"

    def sql_nullable(self, column: Column) -> bool:
        # JSON null 存成文本 'null'：列本身永不为 NULL（读回时据此区分"没有"与"JSON null"不必猜）。
        return column.nullable and column.kind is not Kind.JSON

    def extra_ddl(self, column: Column) -> list[str]:
        if column.kind is not Kind.TIMESTAMP or column.sort_key is None:
            return []
        return [self.format_column(column.sort_key, "INTEGER" + ("" if column.nullable else " NOT NULL"))]

    def format_column(self, name: str, definition: str) -> str:
        # 与第 1 版发布时手写的建表语句逐字一致（sqlite_master 里存的就是这段文本）。
        return f"        {name.ljust(17)} {definition}"


DIALECT = SqliteDialect()
SNAPSHOTS = SnapshotCodec(DIALECT)
TRANSITIONS = TransitionCodec(DIALECT)
COMMANDS = CommandCodec(DIALECT)
NODES = NodeCodec(DIALECT)


def snapshot_row(snapshot: TaskSnapshot) -> dict[str, Any]:
    """快照 → 全部列（命名参数）。JSON 值在这里校验，坏值在动数据库之前就被拒绝。"""
    return SNAPSHOTS.params(snapshot)


def save_row(snapshot: TaskSnapshot) -> dict[str, Any]:
    """快照 → save 写的那些列（``SAVE_COLUMNS``），校验同 ``snapshot_row``。"""
    return SNAPSHOTS.save_params(snapshot)


snapshot_from_row = SNAPSHOTS.from_row


def progress_text(progress: Progress | None) -> str | None:
    return None if progress is None else json_text(progress.to_dict(), what="progress")


def tags_text(tags: frozenset[str]) -> str:
    return DIALECT.encode_tags(sorted(tags))  # type: ignore[no-any-return]


def transition_row(record: Transition) -> tuple[Any, ...]:
    """迁移记录 → ``TRANSITION_COLUMNS`` 顺序的一行（编译好的 ``values``，不经中间的字典）。"""
    return TRANSITIONS.values(record)


transition_from_row = TRANSITIONS.from_row


def packed_transition_row(task_id: str, packed: PackedTransition) -> tuple[Any, ...]:
    """紧凑形式的迁移记录（``StateMachine.packed_transitions`` 的一项，不带 task_id）→ ``TRANSITION_COLUMNS``
    顺序的一行：与 ``transition_row(unpack_transition(task_id, packed))`` 逐列相同（测试对照），只是不先现造
    Transition（写穿每个 create 一条）。紧凑形式里的状态本来就是值字符串。"""
    from_value, to_value, trigger, actor, reason, version, at = packed
    return (task_id, version, from_value, to_value, trigger, actor, reason, _encode_time(at)[0])


if TRANSITIONS.names != (
    "task_id",
    "version",
    "from_status",
    "to_status",
    "trigger",
    "actor",
    "reason",
    "at",
):
    raise AssertionError(
        f"packed_transition_row 的列序与迁移记录表不符：{TRANSITIONS.names}"
    )  # pragma: no cover


command_from_row = COMMANDS.from_row


def node_row(record: NodeRecord) -> tuple[Any, ...]:
    """节点记录 → ``NODE_COLUMNS`` 顺序的一行。buckets：升序 JSON 数组，None 存 NULL（与空数组不同）。"""
    params = NODES.params(record)
    return tuple(params[name] for name in NODES.names)


node_from_row = NODES.from_row


__all__ = [
    "COMMANDS",
    "DIALECT",
    "NODES",
    "SNAPSHOTS",
    "TRANSITIONS",
    "SqliteDialect",
    "check_transitions",
    "command_from_row",
    "dt_key",
    "dt_parse",
    "dt_text",
    "json_text",
    "node_from_row",
    "node_row",
    "packed_transition_row",
    "prefix_upper_bound",
    "progress_text",
    "save_row",
    "snapshot_from_row",
    "snapshot_row",
    "tags_text",
    "transition_from_row",
    "transition_row",
]
