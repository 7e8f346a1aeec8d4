"""快照的列表：每个 ``TaskSnapshot`` 字段一行，是全部持久化知识的唯一出处。

SQLite 与 PostgreSQL 的 ``CREATE TABLE tasks``、两个 codec 的"快照 → 行参数 / 行 → 快照"、SELECT /
INSERT / UPDATE 的列清单、save 永不改写的旁路列，都由这张表推导（见 ``core/storage/sql.py`` 与各后端的
``_codec.py``）。于是给快照加一个字段 = dataclass 加字段 + 这里加一行 + 一次迁移，不必再去七处抄名字。

为什么是一张"声明式"的表而不是每个后端各写一份：两份手写的列清单迟早漂移——漏了一列，save 就悄悄
不写它，读回来是 None，而且没有任何测试会在写的那一刻报错。``tests/test_columns.py`` 断言这张表与
``dataclasses.fields(TaskSnapshot)`` 完全一致，并且两个方言的 DDL 包含表里的每一列。

本模块不导入任何 chongming_task 模块（``models`` 从这里取字段清单，反向导入会成环）。
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Kind(enum.StrEnum):
    """列的逻辑类型。各方言把它映射成自己的物理类型与编码（见 ``SqlDialect``）。"""

    TEXT = "text"
    INT = "int"
    STATUS = "status"
    """``TaskStatus``：存它的 value 文本。"""
    TIMESTAMP = "timestamp"
    """带时区的 datetime：必须连同原始偏移、逐微秒往返。"""
    JSON = "json"
    """任意 JSON 值（None 也是一个值：JSON null）。"""
    PROGRESS = "progress"
    """``Progress`` 记录（to_dict / from_dict），None 表示没有。"""
    FAILURE = "failure"
    """``Failure`` 记录（to_dict / from_dict），None 表示没有。"""
    TAGS = "tags"
    """标签集合：按升序存，读回 frozenset。"""
    ACTION = "action"
    """``CommandAction``：存它的 value 文本（指令表）。"""
    BUCKETS = "buckets"
    """桶号集合或 None（节点表）：None 与空集合不同，必须原样区分。"""
    RECIPE = "recipe"
    """``Recipe`` 记录（to_dict / from_dict，存成 JSON），None 表示普通任务（issue 19）。"""


@dataclass(frozen=True)
class Column:
    """一个快照字段的持久化声明。

    * ``nullable``：字段可以是 None（DDL 里不加 NOT NULL；JSON 列例外，见方言）。
    * ``side_channel``：只由 create（初值）与 touch 写入，save 从不改写（见 ``TaskStore`` 五类流量）。
    * ``primary_key``：主键（只有 task_id）。
    * ``binary_order``：排序与前缀匹配按码点（与 Python 的 str 比较一致）；PostgreSQL 据此加 ``COLLATE "C"``。
    * ``sort_key``：按"时刻"过滤 / 排序的时间列。把时间存成文本的方言另存一列 UTC 微秒整数，列名即此值。
    * ``int32``：整数列的范围是 32 位（桶号）；其余整数列是 64 位。
    * ``minimum``：整数列的下限约束（有 CHECK 的方言写进 DDL）。
    * ``default``：服务器端默认值（SQL 字面量）。codec 总是写全部列，它只让手写的 INSERT 也得到合法行。
    * ``create_only``：只由 create 写入，之后谁也不改（save 不写它，touch 也不写）——配方。
    * ``added_later``：第 1 版发布之后才加的列：不在第 1 版的 ``CREATE TABLE`` 里（已发布的建表语句逐字
      不变），由 ``ALTER TABLE ... ADD COLUMN`` 补上——新库建表后立即补，旧库在下一次可写打开时补。
    """

    name: str
    kind: Kind
    nullable: bool = True
    side_channel: bool = False
    primary_key: bool = False
    binary_order: bool = False
    sort_key: str | None = None
    int32: bool = False
    minimum: int | None = None
    default: str | None = None
    create_only: bool = False
    added_later: bool = False


T, N, S, TS, J = Kind.TEXT, Kind.INT, Kind.STATUS, Kind.TIMESTAMP, Kind.JSON

# 顺序就是表里的列序（与第 1 版已发布的表结构一致：改顺序不影响读写，但新旧库的 DDL 会不同）。
TASK_COLUMNS: tuple[Column, ...] = (
    Column("task_id", T, nullable=False, primary_key=True, binary_order=True),
    Column("name", T, nullable=False, binary_order=True),
    Column("label", T),
    Column("status", S, nullable=False),
    Column("status_version", N, nullable=False, minimum=0),
    Column("attempt", N, nullable=False),
    Column("max_attempts", N, nullable=False),
    Column("created_at", TS, nullable=False, sort_key="created_key"),
    Column("queued_at", TS),
    Column("started_at", TS),
    Column("finished_at", TS, sort_key="finished_key"),
    Column("last_heartbeat_at", TS, side_channel=True),
    Column("progress", Kind.PROGRESS, side_channel=True),
    Column("failure", Kind.FAILURE),
    Column("outcome", J),
    Column("tags", Kind.TAGS, nullable=False, default="'{}'"),
    Column("priority", N, nullable=False, default="0"),
    Column("bucket", N, int32=True),
    Column("bucket_key", T),
    Column("executor", T),
    Column("pid", N),
    Column("owner", T),
    Column("lease_owner", T, side_channel=True),
    Column("lease_until", TS, side_channel=True, sort_key="lease_key"),
    Column("pipeline_id", T),
    Column("node_id", T),
    Column("retry_at", TS),
    Column("description", T),
    Column("recipe", Kind.RECIPE, create_only=True, added_later=True),
)
"""快照的全部列。加字段：在这里加一行（再加 dataclass 字段与一次表结构迁移）。"""

# 迁移记录、指令与节点记录的列（读回时的列序）。它们的表结构与查询形状因方言而异（指令的顺序号、
# 认领的部分索引……），DDL 由各后端手写；这里只统一"行 ↔ 记录"的编解码，两个 codec 不再各写一份。
TRANSITION_COLUMNS: tuple[Column, ...] = (
    Column("task_id", T, nullable=False, binary_order=True),
    Column("version", N, nullable=False),
    Column("from_status", S, nullable=False),
    Column("to_status", S, nullable=False),
    Column("trigger", T, nullable=False),
    Column("actor", T),
    Column("reason", T),
    Column("at", TS, nullable=False),
)

COMMAND_COLUMNS: tuple[Column, ...] = (
    Column("command_id", T, nullable=False, primary_key=True, binary_order=True),
    Column("task_id", T, nullable=False, binary_order=True),
    Column("action", Kind.ACTION, nullable=False),
    Column("issuer", T),
    Column("reason", T),
    Column("payload", J, nullable=False),
    Column("created_at", TS, nullable=False),
    Column("bucket", N, int32=True),
    Column("claimant", T),
    Column("lease_until", TS),
    Column("deliveries", N, nullable=False),
    Column("completed_at", TS),
)

NODE_COLUMNS: tuple[Column, ...] = (
    Column("owner", T, nullable=False, primary_key=True, binary_order=True),
    Column("buckets", Kind.BUCKETS),
    Column("num_buckets", N, nullable=False),
    Column("heartbeat_at", TS, nullable=False),
    Column("expires_at", TS, nullable=False),
    Column("info", J, nullable=False),
)

del T, N, S, TS, J

COLUMNS_BY_NAME: dict[str, Column] = {column.name: column for column in TASK_COLUMNS}

FIELD_NAMES: tuple[str, ...] = tuple(column.name for column in TASK_COLUMNS)

SIDE_CHANNEL_FIELDS: frozenset[str] = frozenset(c.name for c in TASK_COLUMNS if c.side_channel)
"""只由 touch（及 create 的初值）写入的字段；save 从不改写它们。"""

CREATE_ONLY_FIELDS: frozenset[str] = frozenset(c.name for c in TASK_COLUMNS if c.create_only)
"""只由 create 写入、之后谁也不改的字段（配方）：save 沿用存储里的值。"""

LATER_COLUMNS: tuple[Column, ...] = tuple(c for c in TASK_COLUMNS if c.added_later)
"""第 1 版之后补进 tasks 表的列（``ALTER TABLE ... ADD COLUMN``，见各后端的 ``_schema``）。"""

TIMESTAMP_FIELDS: tuple[str, ...] = tuple(c.name for c in TASK_COLUMNS if c.kind is Kind.TIMESTAMP)
"""带时区的时间字段（模型层拒绝 naive datetime 的清单）。"""

OPTIONAL_TEXT_FIELDS: tuple[str, ...] = tuple(
    c.name for c in TASK_COLUMNS if c.kind is Kind.TEXT and c.nullable
)
"""可为 None 的文本字段（模型层校验类型、PostgreSQL 拒绝 NUL 的清单）。"""


__all__ = [
    "COLUMNS_BY_NAME",
    "COMMAND_COLUMNS",
    "CREATE_ONLY_FIELDS",
    "FIELD_NAMES",
    "LATER_COLUMNS",
    "NODE_COLUMNS",
    "OPTIONAL_TEXT_FIELDS",
    "SIDE_CHANNEL_FIELDS",
    "TASK_COLUMNS",
    "TIMESTAMP_FIELDS",
    "TRANSITION_COLUMNS",
    "Column",
    "Kind",
]
