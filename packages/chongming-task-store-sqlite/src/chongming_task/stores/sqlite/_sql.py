"""SqliteTaskStore 的 SQL 文本：由列清单推导的语句，以及 TaskQuery → WHERE 的翻译。"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from itertools import chain, compress, repeat
from operator import is_not, itemgetter
from typing import Any

from chongming_task.core.storage.values import TaskQuery
from chongming_task.states import TERMINAL_STATUSES, TaskStatus
from chongming_task.stores.sqlite import _codec as codec
from chongming_task.stores.sqlite import _schema as schema

# 集合参数少时展开成占位符（规划器能据此估算选择度）；多时整包成一个 JSON 参数，避开变量个数上限。
_MAX_INLINE_PARAMS = 256

TASK_SELECT = f"SELECT {', '.join(schema.TASK_COLUMNS)} FROM tasks"
TASK_COLUMNS_T = ", ".join(f"t.{c}" for c in schema.TASK_COLUMNS)
INSERT_TAG = "INSERT OR IGNORE INTO task_tags (tag, created_key, task_id) VALUES (?, ?, ?)"
# create_many：一批 id（JSON 数组参数，避开变量个数上限）里已经存在的那些。
EXISTING_TASK_IDS = "SELECT task_id FROM tasks WHERE task_id IN (SELECT value FROM json_each(?))"
# renew_leases：一批任务写同一组租约字段（id 是 JSON 数组参数）。
RENEW_LEASES = (
    "UPDATE tasks SET lease_owner = ?, lease_until = ?, lease_key = ? "
    "WHERE task_id IN (SELECT value FROM json_each(?))"
)
# save 先读版本、标签与被索引的列（见 schema.INDEXED_SAVE_COLUMNS），只为真正变了的被索引列 SET；
# 没有索引用到的列每次都 SET（整行本来就要重写），不必读出来比较。
SAVE_SELECT = (
    f"SELECT status_version, tags, {', '.join(schema.INDEXED_SAVE_COLUMNS)} FROM tasks WHERE task_id = ?"
)
SAVE_VERSION_INDEX = 0
SAVE_TAGS_INDEX = 1
SAVE_INDEXED_OFFSET = 2
SAVE_CREATED_INDEX = SAVE_INDEXED_OFFSET + schema.INDEXED_SAVE_COLUMNS.index("created_key")
# 按位置绑定：一行是 ``tuple(codec.snapshot_row(s).values())``（键序即 TASK_COLUMNS 的顺序），VALUES 由
# insert_without_nulls / grouped_without_nulls 按哪些值是 None 补上。
INSERT_TASK_HEAD = f"INSERT INTO tasks ({', '.join(schema.TASK_COLUMNS)})"
INSERT_TRANSITION_HEAD = f"INSERT OR IGNORE INTO transitions ({', '.join(schema.TRANSITION_COLUMNS)})"


# 热路径上的 NULL 写成字面量，不作为参数绑定：Python 的 sqlite3 给 None 参数找适配器时要走两次失败的属性
# 查找（int / float / str 有捷径，None 没有），每个约 3,000 条指令；一个空任务的 create 与三次 save 带
# 约 50 个 None 参数，占了存储一侧指令数的一成（callgrind）。语句文本按"哪些列不是 NULL"（``keep``）缓存，
# 种类很少。``keep`` 由 ``map(is_not, ...)`` 算、参数由 ``compress`` 取（都是 C 实现）：逐列跑 Python 的
# 生成器表达式，一行 32 列要几微秒，每个任务好几行。
@functools.lru_cache(maxsize=1024)
def _values_sql(head: str, keep: tuple[bool, ...]) -> str:
    return f"{head} VALUES ({', '.join('?' if kept else 'NULL' for kept in keep)})"


def _kept(values: Sequence[Any]) -> tuple[bool, ...]:
    """每个值是不是"不是 None"（``keep`` 掩码）。"""
    return tuple(map(is_not, values, repeat(None)))


def insert_without_nulls(head: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
    """``head``（``INSERT ... (列...)``）+ 一行值 → (语句, 参数)：值为 None 的列写成字面量 NULL。"""
    keep = _kept(values)
    return _values_sql(head, keep), list(compress(values, keep))


ROWS_PER_INSERT = 64
"""一条多行 INSERT 至多带几行（参数个数远在 SQLite 的上限之内；语句文本按行数缓存，行数也别太分散）。"""


@functools.lru_cache(maxsize=1024)
def _rows_sql(head: str, keep: tuple[bool, ...], count: int) -> str:
    one = f"({', '.join('?' if kept else 'NULL' for kept in keep)})"
    return f"{head} VALUES {', '.join(repeat(one, count))}"


def insert_rows_without_nulls(head: str, rows: Sequence[Sequence[Any]]) -> list[tuple[str, list[Any]]]:
    """多行版的 ``insert_without_nulls``：同一种 NULL 形状的行合成一条多行 INSERT（每条至多
    ``ROWS_PER_INSERT`` 行）。为什么：Python 的 sqlite3 每执行一条语句都放开、再抢回一次 GIL——写事务里
    每多一条语句，持着进程内写者队列的线程就多一次在 GIL 上排队（另一条线程此刻多半正要 GIL），排在它
    后面的写者跟着多等。一次 save 的迁移记录通常有一两行，组提交的一批有三四行：合成一条，少几次交接。
    行的先后不影响结果（迁移记录按主键存放；``INSERT OR IGNORE`` 逐行判定）。"""
    if len(rows) == 1:
        return [insert_without_nulls(head, rows[0])]
    statements: list[tuple[str, list[Any]]] = []
    for keep, group in _by_null_shape(rows).items():
        for start in range(0, len(group), ROWS_PER_INSERT):
            chunk = group[start : start + ROWS_PER_INSERT]
            statements.append((_rows_sql(head, keep, len(chunk)), list(chain.from_iterable(chunk))))
    return statements


# 迁移记录行（``TRANSITION_COLUMNS`` 顺序）里只有 actor、reason 可以是 None；写穿的记录几乎总是两者都没有。
_TRANSITION_ACTOR_REASON = itemgetter(
    schema.TRANSITION_COLUMNS.index("actor"), schema.TRANSITION_COLUMNS.index("reason")
)
_TRANSITION_WITHOUT_ACTOR_REASON = itemgetter(
    *(i for i, c in enumerate(schema.TRANSITION_COLUMNS) if c not in ("actor", "reason"))
)
_TRANSITION_PLAIN_KEEP = tuple(c not in ("actor", "reason") for c in schema.TRANSITION_COLUMNS)
_NO_ACTOR_REASON = (None, None)


def transition_inserts(rows: Sequence[Sequence[Any]]) -> list[tuple[str, list[Any]]]:
    """``insert_rows_without_nulls(INSERT_TRANSITION_HEAD, rows)``，结果逐字相同；最常见的形状（每行的 actor
    与 reason 都是 None、不超过 ``ROWS_PER_INSERT`` 行）在 C 里一次判定、一次取值：不逐行算"哪些列是 NULL"
    （``_by_null_shape`` 每行约 50 条字节码，组提交每个任务两三行）。"""
    if (
        len(rows) <= ROWS_PER_INSERT
        and rows
        and all(map(_NO_ACTOR_REASON.__eq__, map(_TRANSITION_ACTOR_REASON, rows)))
    ):
        return [
            (
                _rows_sql(INSERT_TRANSITION_HEAD, _TRANSITION_PLAIN_KEEP, len(rows)),
                list(chain.from_iterable(map(_TRANSITION_WITHOUT_ACTOR_REASON, rows))),
            )
        ]
    return insert_rows_without_nulls(INSERT_TRANSITION_HEAD, rows)


def grouped_without_nulls(
    head: str, rows: Iterable[Sequence[Any]]
) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """批量版的 ``insert_without_nulls``（``create_many`` 的 ``executemany``）：按"哪些列是 NULL"把行分组，
    每组一条语句、NULL 写成字面量。一批里的任务几乎都是同一种形状（十万个 submit_many 通常只有一两组）；
    按位置绑定时每行约 17 个 None 参数，单是给它们找适配器就是每行 2–3 µs。分组用 ``map`` / ``compress``
    （C 实现），不逐列跑 Python 的比较。"""
    return [(_values_sql(head, keep), group) for keep, group in _by_null_shape(rows).items()]


def _by_null_shape(rows: Iterable[Sequence[Any]]) -> dict[tuple[bool, ...], list[tuple[Any, ...]]]:
    """按"哪些列不是 NULL"（``keep``）把行分组，每行只留不是 None 的值（组内保持给出的先后）。"""
    groups: dict[tuple[bool, ...], list[tuple[Any, ...]]] = {}
    nones: tuple[None, ...] = ()
    for row in rows:
        if len(nones) != len(row):
            nones = (None,) * len(row)
        keep = tuple(map(is_not, row, nones))
        group = groups.get(keep)
        if group is None:
            groups[keep] = group = []
        group.append(tuple(compress(row, keep)))
    return groups


def _plain_assignments(keep: tuple[bool, ...]) -> list[str]:
    """save 每次都写的无索引列（``PLAIN_SAVE_COLUMNS`` 顺序）的 SET 子句：是 None 的写成字面量 NULL。"""
    return [
        f"{column} = ?" if kept else f"{column} = NULL"
        for column, kept in zip(schema.PLAIN_SAVE_COLUMNS, keep, strict=True)
    ]


@functools.lru_cache(maxsize=1024)
def _save_update_sql(keep: tuple[bool, ...], changed: tuple[str, ...]) -> str:
    assignments = _plain_assignments(keep)
    assignments.extend(f"{column} = ?" for column in changed)
    return f"UPDATE tasks SET {', '.join(assignments)} WHERE task_id = ?"


def save_update(
    plain: Sequence[Any], changed: Sequence[tuple[str, Any]], task_id: str
) -> tuple[str, list[Any]]:
    """save 的 UPDATE：没有索引的列（``PLAIN_SAVE_COLUMNS`` 顺序的 ``plain``）每次都写，None 写成字面量；
    再加上真的变了的被索引列。语句文本按"哪些列是 NULL、哪些被索引的列变了"缓存。"""
    keep = _kept(plain)
    params = list(compress(plain, keep))
    params.extend(value for _, value in changed)
    params.append(task_id)
    return _save_update_sql(keep, tuple(column for column, _ in changed)), params


# save 的快速路径（见 store._save_tx）：不先 SELECT，直接一条带前提的 UPDATE，看它改了几行。前提是
# "版本是期望的版本，且被索引的列（status 变了时除外）与 tags 都已经是新快照里的值"——满足时只 SET 没有
# 索引的列（与 status），与先读再比较、只 SET 变了的被索引列的结果逐列相同，标签旁表也不必重写；不满足
# （0 行：任务不存在、版本冲突，或者被索引的列 / 标签真的变了）时什么也没写，回到先读再写的慢路径。
_GUARDED_COLUMNS = {
    set_status: (*(c for c in schema.INDEXED_SAVE_COLUMNS if not (set_status and c == "status")), "tags")
    for set_status in (False, True)
}


@functools.lru_cache(maxsize=1024)
def _guarded_update_sql(plain_keep: tuple[bool, ...], set_status: bool, guard_keep: tuple[bool, ...]) -> str:
    assignments = _plain_assignments(plain_keep)
    if set_status:
        assignments.append("status = ?")
    # 前提列前面加一元 ``+``：不许规划器拿这些列的索引去找行（tasks_by_owner 的 (owner, created_key,
    # task_id) 三列都是等值条件，统计信息一变规划器就可能挑它）；找行永远走 task_id 主键。
    guards = [
        f"+{column} IS ?" if kept else f"+{column} IS NULL"
        for column, kept in zip(_GUARDED_COLUMNS[set_status], guard_keep, strict=True)
    ]
    return (
        f"UPDATE tasks SET {', '.join(assignments)} "
        f"WHERE task_id = ? AND status_version = ? AND {' AND '.join(guards)}"
    )


# save 的一行是 ``SAVE_COLUMNS`` 顺序的元组（``codec.SNAPSHOTS.save_values``）：按位置取列，取一组列用
# itemgetter（C 实现，一次调用得到元组），不为每次 save 造一个 {列名: 值} 的字典再逐个按名字查。
_SAVE_AT = {column: index for index, column in enumerate(schema.SAVE_COLUMNS)}
SAVE_ROW_STATUS = _SAVE_AT["status"]
SAVE_ROW_TAGS = _SAVE_AT["tags"]
SAVE_ROW_CREATED_KEY = _SAVE_AT["created_key"]
save_plain = itemgetter(*(_SAVE_AT[column] for column in schema.PLAIN_SAVE_COLUMNS))
"""save 的一行 → 其中没有索引的列（``PLAIN_SAVE_COLUMNS`` 顺序的元组）。"""
save_indexed = itemgetter(*(_SAVE_AT[column] for column in schema.INDEXED_SAVE_COLUMNS))
"""save 的一行 → 其中被索引的列（``INDEXED_SAVE_COLUMNS`` 顺序的元组）。"""
_GUARD_VALUES = {
    set_status: itemgetter(*(_SAVE_AT[column] for column in columns))
    for set_status, columns in _GUARDED_COLUMNS.items()
}


def guarded_save_update(
    row: Sequence[Any], plain: Sequence[Any], old_status: str, task_id: str, expect_version: int
) -> tuple[str, list[Any]]:
    """快速路径的 UPDATE（见上）。``row`` 是新快照 save 写的列（``SAVE_COLUMNS`` 顺序，
    ``codec.SNAPSHOTS.save_values``），``plain`` 是其中没有索引的列（``save_plain(row)``）；``old_status``
    是调用方认为存储里此刻的状态（随附迁移记录的第一条的起点；没有迁移记录就是新状态）：与新状态不同才
    SET status，相同则 status 也是前提。"""
    status = row[SAVE_ROW_STATUS]
    set_status = old_status != status
    guard_values = _GUARD_VALUES[set_status](row)
    plain_keep = _kept(plain)
    guard_keep = _kept(guard_values)
    params = list(compress(plain, plain_keep))
    if set_status:
        params.append(status)
    params.append(task_id)
    params.append(expect_version)
    params.extend(compress(guard_values, guard_keep))
    return _guarded_update_sql(plain_keep, set_status, guard_keep), params


# save(lease_expired_before=...)：租约仍有效（lease_key 不早于给定时刻）就返回一行（与查询的判据相同）。
SAVE_LEASE_HELD = (
    "SELECT lease_until FROM tasks WHERE task_id = ? AND lease_key IS NOT NULL AND lease_key >= ?"
)
INSERT_TRANSITION = (
    f"INSERT OR IGNORE INTO transitions ({', '.join(schema.TRANSITION_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in schema.TRANSITION_COLUMNS)})"
)
COMMAND_SELECT = f"SELECT {', '.join(schema.COMMAND_COLUMNS)} FROM commands"
# 整行覆盖（last writer wins）。INSERT OR REPLACE 而不是 UPSERT：节点表没有外键与触发器，"先删后插"与
# 原地更新结果相同，而且不挑 SQLite 版本（UPSERT 要 3.24+）。
UPSERT_NODE = (
    f"INSERT OR REPLACE INTO nodes ({', '.join(schema.NODE_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in schema.NODE_COLUMNS)})"
)
SELECT_NODES = f"SELECT {', '.join(schema.NODE_COLUMNS)} FROM nodes ORDER BY owner"
TERMINAL_VALUES = tuple(sorted(s.value for s in TERMINAL_STATUSES))
TERMINAL_IN = f"status IN ({', '.join('?' for _ in TERMINAL_VALUES)})"


def in_clause(column: str, values: frozenset[Any], params: list[Any]) -> str:
    """``values`` 是已校验的标量集合（状态、任务名、task_id、桶号：只有 str / int）。"""
    if len(values) <= _MAX_INLINE_PARAMS:
        ordered = sorted(values)
        params.extend(ordered)
        return f"{column} IN ({', '.join('?' for _ in ordered)})"
    # 大集合（指令轮询时本节点在管的全部任务，可能是 10 万个 id，每个轮询间隔一次）：直接编码成 JSON 数组，
    # 不排序、不走 JSON 值的通用检查（嵌套深度、大小）——扁平的标量数组不需要，而那一遍检查在 10 万个
    # 元素上要几十毫秒。文本里孤立的代理项照样在绑定参数时被拒绝（_run 报 ConfigurationError）。
    params.append(json.dumps(list(values), ensure_ascii=False, separators=(",", ":")))
    return f"{column} IN (SELECT value FROM json_each(?))"


def select_from(query: TaskQuery, *extra: str, name_index: bool = True) -> tuple[str, list[Any], str]:
    """TaskQuery → (``FROM ... WHERE ...``, 参数, 排序键所在的表别名)。逐条对应 ``TaskQuery.matches``。

    任务表的别名总是 ``t``。给了 tag 时从标签旁表 ``g`` 出发联到 ``t``，并按 ``g`` 上的排序键排序
    （与 t 上的值相同），这样带 LIMIT 的标签查询沿旁表主键有序读取。
    ``name_index=False`` 时任务名前缀写成 ``+t.name``（不许用 name 索引，见 ``store.query``）。
    """
    clauses: list[str] = list(extra)
    params: list[Any] = []
    source = "tasks AS t"
    order_alias = "t"
    if query.tag is not None:
        source = "task_tags AS g JOIN tasks AS t ON t.task_id = g.task_id"
        order_alias = "g"
        clauses.append("g.tag = ?")
        params.append(query.tag)
    if query.statuses is not None:
        if not query.statuses:
            return " FROM tasks AS t WHERE 0", [], "t"
        clauses.append(in_clause("t.status", frozenset(s.value for s in query.statuses), params))
    if query.name_prefix:
        # 区间比较而不是 LIKE：LIKE 对 ASCII 不分大小写，而 startswith 区分；区间还能走索引。
        name = "t.name" if name_index else "+t.name"
        clauses.append(f"{name} >= ?")
        params.append(query.name_prefix)
        upper = codec.prefix_upper_bound(query.name_prefix)
        if upper is not None:
            clauses.append(f"{name} < ?")
            params.append(upper)
    if query.bucket is not None:
        clauses.append("t.bucket = ?")
        params.append(query.bucket)
    if query.buckets is not None:
        if not query.buckets:
            return " FROM tasks AS t WHERE 0", [], "t"
        clauses.append(in_clause("t.bucket", query.buckets, params))
    if query.owner is not None:
        clauses.append("t.owner = ?")
        params.append(query.owner)
    if query.pipeline_id is not None:
        clauses.append("t.pipeline_id = ?")
        params.append(query.pipeline_id)
    if query.durable is not None:
        clauses.append("t.recipe IS NOT NULL" if query.durable else "t.recipe IS NULL")
    if query.awaiting_claim is not None:
        # 与 values.awaits_claim 同一判据；三项都不会是 NULL，NOT 取反没有三值逻辑的坑。
        awaiting = "(t.status = ? AND t.recipe IS NOT NULL AND t.owner IS NULL)"
        clauses.append(awaiting if query.awaiting_claim else f"NOT {awaiting}")
        params.append(TaskStatus.QUEUED.value)
    if query.created_after is not None:
        clauses.append(f"{order_alias}.created_key > ?")
        params.append(codec.dt_key(query.created_after))
    if query.created_before is not None:
        clauses.append(f"{order_alias}.created_key < ?")
        params.append(codec.dt_key(query.created_before))
    if query.lease_expired_before is not None:
        clauses.append("(t.lease_key IS NULL OR t.lease_key < ?)")
        params.append(codec.dt_key(query.lease_expired_before))
    where = " WHERE " + " AND ".join(clauses) if clauses else ""
    return f" FROM {source}{where}", params, order_alias


__all__ = [
    "COMMAND_SELECT",
    "EXISTING_TASK_IDS",
    "INSERT_TAG",
    "INSERT_TASK_HEAD",
    "INSERT_TRANSITION",
    "INSERT_TRANSITION_HEAD",
    "RENEW_LEASES",
    "ROWS_PER_INSERT",
    "SAVE_CREATED_INDEX",
    "SAVE_INDEXED_OFFSET",
    "SAVE_LEASE_HELD",
    "SAVE_ROW_CREATED_KEY",
    "SAVE_ROW_STATUS",
    "SAVE_ROW_TAGS",
    "SAVE_SELECT",
    "SAVE_TAGS_INDEX",
    "SAVE_VERSION_INDEX",
    "SELECT_NODES",
    "TASK_COLUMNS_T",
    "TASK_SELECT",
    "TERMINAL_IN",
    "TERMINAL_VALUES",
    "UPSERT_NODE",
    "grouped_without_nulls",
    "guarded_save_update",
    "in_clause",
    "insert_rows_without_nulls",
    "insert_without_nulls",
    "save_indexed",
    "save_plain",
    "save_update",
    "select_from",
    "transition_inserts",
]
