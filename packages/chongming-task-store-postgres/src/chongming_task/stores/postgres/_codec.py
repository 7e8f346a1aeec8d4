"""快照 / 迁移记录 / 指令与 SQL 参数、结果行之间的转换：``SqlDialect`` 的 PostgreSQL 钩子。

列清单与"记录 ↔ 行"的推导在 ``chongming_task.core.storage.sql``（由列表 ``columns`` 推导）；这里只说
PostgreSQL 怎么存：时间是 timestamptz，旁边一个 ``*_off`` 列记下原始 UTC 偏移（微秒）；JSON 值是 jsonb
（None 存 SQL NULL）；标签是 ``text[]``，桶号集合是 ``bigint[]``。

PostgreSQL 存不下、而 Python 里合法的输入（text 里的 NUL、jsonb 里的 ``\\u0000``、超出 bigint 的整数）
在这里或在执行时被转换成 ConfigurationError：宁可明确拒绝，也不写入一行被改写过的数据。
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from decimal import Decimal
from typing import Any

from chongming_task.core.storage.checks import check_json_value
from chongming_task.core.storage.columns import Column, Kind
from chongming_task.core.storage.sql import (
    CommandCodec,
    NodeCodec,
    SnapshotCodec,
    SqlDialect,
    TransitionCodec,
)
from chongming_task.core.storage.values import NodeRecord
from chongming_task.errors import ConfigurationError
from chongming_task.models import TaskSnapshot
from chongming_task.states import TaskStatus

_MICROSECOND = timedelta(microseconds=1)

# json.dumps 把 NUL 写成 \u0000；字面的反斜杠写成 \\。所以只有前面是偶数个反斜杠的 \u0000 才是 NUL。
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

_TZ_CACHE: dict[int, tzinfo] = {0: UTC}


def split_dt(value: datetime | None) -> tuple[datetime | None, int | None]:
    """(时刻, 原始 UTC 偏移的微秒数)。timestamptz 只存时刻，偏移单独存一列以便逐字往返。"""
    if value is None:
        return None, None
    offset = value.utcoffset()
    if offset is None:  # 模型层已拒绝 naive 时间；这里再挡一次，免得数据库按会话时区猜
        raise ConfigurationError(f"时间必须带时区，收到 {value!r}")
    return value, offset // _MICROSECOND


def join_dt(value: datetime | None, offset_us: int | None) -> datetime | None:
    if value is None:
        return None
    offset = offset_us or 0
    tz = _TZ_CACHE.get(offset)
    if tz is None:
        tz = timezone(timedelta(microseconds=offset))
        _TZ_CACHE[offset] = tz
    return value.astimezone(tz)


def check_text(value: str | None, what: str) -> str | None:
    if value is not None and "\x00" in value:
        raise ConfigurationError(f"{what} 不能包含 NUL 字符（\\x00）：PostgreSQL 的 text 无法保存它")
    return value


def json_text(value: Any, what: str) -> str:
    """严格 JSON 文本；含 NUL 的字符串被拒绝（jsonb 不接受 \\u0000）。"""
    text = check_json_value(value, what=what)
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise ConfigurationError(
            f"{what} 里的字符串不能包含 NUL 字符（\\x00）：PostgreSQL 的 jsonb 无法保存它，请先去掉或转义"
        )
    if _EXPONENT.search(text) is not None and _has_exponent_float(value):
        return _plain_json(value)
    return text


_EXPONENT = re.compile(r"[0-9][eE][-+]?[0-9]")
"""编码器写出的带指数的浮点数（``repr``：``1e+17``、``1.5e-07``）在文本里必有"数字 e 可选符号 数字"。
文本里没有这样的片段，值里就没有带指数的浮点数，不必再遍历一遍值（``_has_exponent_float``）。原来只看
文本里有没有字母 e——配方的键（"name"、"kwargs"……）里总有，enqueue() 的每个任务都白白遍历一遍配方。
片段出现在字符串里（"1e5"）时照旧遍历值确认，所以判定与原来相同。"""


def _has_exponent_float(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if "e" in repr(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def _plain_json(value: Any) -> str:
    """与 json.dumps 相同，只是浮点数一律写成带小数点的定点形式。

    为什么：jsonb 把数字存成 numeric，``1e+17`` 读回来是整数 100000000000000000，
    ``1.0629773069210299e+17`` 读回来是与原浮点数不相等的整数——类型与值都变了。定点写法
    （``106297730692102990.0``）带着小数点，numeric 保留它，读回时 json.loads 给出的正是原来的浮点数
    （repr 是最短的可往返十进制串，它的定点展开表示同一个值）。
    """
    if isinstance(value, float):
        plain = format(Decimal(repr(value)), "f")
        return plain if "." in plain else plain + ".0"
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            # 非字符串键按 json.dumps 的规则变成字符串（1.5 → "1.5"、True → "true"）。
            key_text = key if isinstance(key, str) else json.dumps({key: None})[2:-8]
            items.append(json.dumps(key_text, ensure_ascii=False) + ":" + _plain_json(item))
        return "{" + ",".join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_plain_json(item) for item in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def optional_json(value: Any, what: str) -> str | None:
    return None if value is None else json_text(value, what)


_JSON_KINDS = frozenset({Kind.JSON, Kind.PROGRESS, Kind.FAILURE, Kind.RECIPE})
_TYPES = {
    Kind.TEXT: "text",
    Kind.STATUS: "text",
    Kind.ACTION: "text",
    Kind.TIMESTAMP: "timestamptz",
    Kind.JSON: "jsonb",
    Kind.PROGRESS: "jsonb",
    Kind.FAILURE: "jsonb",
    Kind.RECIPE: "jsonb",
    Kind.TAGS: "text[]",
    Kind.BUCKETS: "bigint[]",
}


def _in_list(values: list[str]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


STATUS_DOMAIN = "task_status"
"""状态列（tasks.status、transitions.from_status / to_status）的域类型：text 加 ``VALUE IN (15 个状态)``。"""

NONNEGATIVE_DOMAIN = "nonnegative_bigint"
"""下限为 0 的整数列（tasks.status_version）的域类型：bigint 加 ``VALUE >= 0``。"""


class PostgresDialect(SqlDialect):
    """PostgreSQL 的存法（见模块说明）。

    ``domain_schema``（已加引号的 schema 名）：只给建表用的实例。有它时状态列与下限为 0 的整数列写成
    这个 schema 里的域类型（``_schema.domain_ddl_statements``），而不是带 CHECK 约束的 text / bigint。

    为什么用域（issue 17 / 19，bench/README.md 第十六轮 pg16）：表上的 CHECK 约束在每条写这张表的语句里
    都要从目录文本重新解析、化简、编译一遍（``ExecRelCheck`` 的约束表达式不跨语句缓存，预备语句也一样），
    tasks 的两个约束每条 INSERT / UPDATE 约 15 µs 服务器 CPU——连只改租约的 UPDATE 也付。域的约束在
    typcache 里编译好、跨语句复用，而且只在这一列被赋值时才检查；保护完全一样（同样的值集合、同样的
    SQLSTATE 23514 check_violation）。

    没有 ``domain_schema`` 的实例（全局的 ``DIALECT``，编码与 unnest 的数组类型用它）给的是线上传输的基础
    类型（text / bigint）；万一用它写建表语句，退回行内 CHECK，保护不会悄悄丢掉。
    """

    def __init__(self, domain_schema: str | None = None) -> None:
        self._domain_schema = domain_schema

    def _domain(self, column: Column) -> str | None:
        """这一列在建表语句里用的域类型（已按 schema 限定）；不用域时 None。"""
        if self._domain_schema is None:
            return None
        if column.kind is Kind.STATUS:
            return f"{self._domain_schema}.{STATUS_DOMAIN}"
        if column.kind is Kind.INT and column.minimum == 0 and not column.int32:
            return f"{self._domain_schema}.{NONNEGATIVE_DOMAIN}"
        return None

    def time_columns(self, column: Column) -> tuple[str, ...]:
        return column.name, column.name + "_off"

    def encode_time(self, column: Column, value: datetime | None) -> tuple[Any, ...]:
        return split_dt(value)

    def decode_time(self, values: Sequence[Any]) -> datetime | None:
        return join_dt(values[0], values[1])

    def encode_json(self, value: Any, what: str) -> Any:
        return optional_json(value, what)

    def decode_json(self, raw: Any) -> Any:
        return raw  # psycopg 已把 jsonb 解析成新的 Python 对象

    def encode_tags(self, tags: list[str]) -> Any:
        return tags

    def decode_tags(self, raw: Any) -> frozenset[str]:
        return frozenset(raw)

    def encode_buckets(self, buckets: list[int] | None) -> Any:
        return buckets

    def decode_buckets(self, raw: Any) -> frozenset[int] | None:
        return None if raw is None else frozenset(int(b) for b in raw)

    def sql_type(self, column: Column) -> str:
        if (domain := self._domain(column)) is not None:
            return domain
        if column.kind is Kind.INT:
            return "integer" if column.int32 else "bigint"
        return _TYPES[column.kind]

    def column_constraints(self, column: Column) -> str:
        # 除了域类型代替的两个 CHECK，与第 1 版发布时手写的建表语句逐字一致（schema_sql 交给运维的就是它）。
        text = ' COLLATE "C"' if column.binary_order else ""
        if column.primary_key:
            return text + " PRIMARY KEY"
        if not column.nullable:
            text += " NOT NULL"
        if self._domain(column) is not None:
            pass  # 约束在域上
        elif column.kind is Kind.STATUS:
            text += f" CHECK ({column.name} IN ({_in_list([s.value for s in TaskStatus])}))"
        elif column.minimum is not None:
            text += f" CHECK ({column.name} >= {column.minimum})"
        if column.default is not None:
            text += f" DEFAULT {column.default}"
        return text

    def extra_ddl(self, column: Column) -> list[str]:
        if column.kind is not Kind.TIMESTAMP:
            return []
        return [self.format_column(column.name + "_off", "bigint" + ("" if column.nullable else " NOT NULL"))]

    def format_column(self, name: str, definition: str) -> str:
        return f"    {name} {definition}"

    def check_text(self, value: str | None, what: str) -> str | None:
        return check_text(value, what)

    def value_expr(self, column: Column, name: str) -> str:
        """INSERT / UPDATE 里一个物理列的占位符（jsonb 与数组列显式转换类型）。"""
        if column.kind in _JSON_KINDS:
            return f"%({name})s::jsonb"
        if column.kind is Kind.BUCKETS:
            return f"%({name})s::bigint[]"
        return f"%({name})s"

    def array_type(self, column: Column, name: str) -> str:
        """``unnest`` 一次插入多行时，一个物理列的数组类型（基础类型的数组：赋给域类型的列时由赋值转换
        检查域的约束）。"""
        return "bigint[]" if name.endswith("_off") else self.sql_type(column) + "[]"


def unnest_element(column: Column, name: str) -> tuple[str, str]:
    """按行 unnest 一个物理列时：(数组的元素类型, 把元素转成列类型的表达式模板)。

    jsonb 列传 JSON 文本、标签传数组字面量文本（见 ``tags_literal``）：多维数组不能按行 unnest。"""
    if column.kind in _JSON_KINDS:
        return "text", "{}::jsonb"
    if column.kind is Kind.TAGS:
        return "text", "{}::text[]"
    if column.kind is Kind.BUCKETS:
        return "text", "{}::bigint[]"
    return DIALECT.array_type(column, name).removesuffix("[]"), "{}"


def array_literal(values: Sequence[Any] | None) -> str | None:
    """一维数组的 PostgreSQL 文本字面量（每个元素加引号、转义反斜杠与双引号）：``'{"a","b"}'``。"""
    if values is None:
        return None
    quoted = (str(value).replace("\\", "\\\\").replace('"', '\\"') for value in values)
    return "{" + ",".join(f'"{value}"' for value in quoted) + "}"


DIALECT = PostgresDialect()
SNAPSHOTS = SnapshotCodec(DIALECT)
TRANSITIONS = TransitionCodec(DIALECT)
COMMANDS = CommandCodec(DIALECT)
NODES = NodeCodec(DIALECT)

TASK_COLUMNS = SNAPSHOTS.names
SAVE_COLUMNS = SNAPSHOTS.save_columns
SIDE_CHANNEL_COLUMNS = SNAPSHOTS.side_channel
"""save 从不改写的列（SIDE_CHANNEL_FIELDS 及其偏移列）：它们只由 create 与 touch 写入。"""
TRANSITION_COLUMNS = TRANSITIONS.names
COMMAND_COLUMNS = COMMANDS.names
NODE_COLUMNS = NODES.names
JSONB_COLUMNS = frozenset(c.name for c in SNAPSHOTS.logical if c.kind in _JSON_KINDS)


def task_params(snapshot: TaskSnapshot) -> dict[str, Any]:
    """一个快照对应的全部列值（jsonb 列是 JSON 文本，SQL 里再 ::jsonb）。"""
    return SNAPSHOTS.params(snapshot)


snapshot_from_row = SNAPSHOTS.from_row
trusted_snapshot_from_row = SNAPSHOTS.trusted_from_row


transition_from_row = TRANSITIONS.from_row


command_from_row = COMMANDS.from_row


def node_params(record: NodeRecord) -> dict[str, Any]:
    """节点记录 → 列值。buckets 升序的 bigint[]；None 存 NULL（与空数组 '{}' 不同）。"""
    return NODES.params(record)


node_from_row = NODES.from_row


__all__ = [
    "COMMANDS",
    "COMMAND_COLUMNS",
    "DIALECT",
    "JSONB_COLUMNS",
    "NODES",
    "NODE_COLUMNS",
    "NONNEGATIVE_DOMAIN",
    "SAVE_COLUMNS",
    "SNAPSHOTS",
    "STATUS_DOMAIN",
    "TASK_COLUMNS",
    "TRANSITIONS",
    "TRANSITION_COLUMNS",
    "PostgresDialect",
    "array_literal",
    "check_text",
    "command_from_row",
    "join_dt",
    "json_text",
    "node_from_row",
    "node_params",
    "optional_json",
    "snapshot_from_row",
    "split_dt",
    "task_params",
    "transition_from_row",
    "trusted_snapshot_from_row",
    "unnest_element",
]
