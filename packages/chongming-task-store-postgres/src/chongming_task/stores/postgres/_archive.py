"""PostgresTaskStore 的归档与时间窗口保留（issue 20；存储指南 §9）。

与 store.py 分开放，让维护流量的代码不混进热路径（也便于合并）。要点：

* **导出**只读：迁移记录按主键 (task_id, version) 键集分页（``task_id`` 是 ``COLLATE "C"``，行值比较与
  Python 的 str 顺序一致），"最长的旧前缀"规则由 core 的 ``archivable_prefix`` 判断——与内存、SQLite
  后端是同一份算法，语义逐字一致。
* **删除**分成短事务，每个事务最多 ``DELETE_CHUNK`` 行：不长时间持有行锁，也不让一个巨大的事务拖住
  vacuum。整体删除任务时在一个事务里先 ``FOR UPDATE`` 锁住快照行、核对、再删：与之并发的 ``save`` 要么先
  提交（版本变了，我们不删），要么等我们提交之后得到 TaskNotFound。
* 迁移记录表按月分区（第 2 版，见 ``_partitions``）：整月过期的分区由归档器先调 ``archive_partition``
  整块导出再 ``DETACH`` + ``DROP``；其余（跨截止时刻的那个月、DEFAULT 分区、丢弃不成的分区）逐批删除。
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol, TypeVar

from chongming_task.core.storage.checks import (
    check_aware,
    check_receipt,
    export_finished_args,
    export_transitions_args,
)
from chongming_task.core.storage.retention import archivable_prefix, version_runs
from chongming_task.core.storage.values import (
    ArchiveDeleted,
    ArchivedTask,
    ArchiveReceipt,
    PartitionArchived,
)
from chongming_task.errors import ConfigurationError
from chongming_task.models import Transition
from chongming_task.states import TERMINAL_STATUSES
from chongming_task.stores.postgres import _logs, _partitions, _schema
from chongming_task.stores.postgres._codec import (
    COMMAND_COLUMNS,
    TRANSITION_COLUMNS,
    TRANSITIONS,
    command_from_row,
    snapshot_from_row,
)

_T = TypeVar("_T")

_trusted_transition = TRANSITIONS.trusted_from_row
"""导出只读本库自己写入（已校验）的行：解码不再逐字段校验（见 ``TransitionCodec.trusted_from_row``）。"""


class PostgresTaskStore(Protocol):
    """本模块用到的存储管道（写成协议而不是导入 store.py：两个模块之间不能有导入环）。"""

    _archive_sql: ArchiveSql
    _schema: str
    _readonly: bool
    _network_timeout: float | None

    def _read(self, fn: Callable[[Any], _T]) -> _T: ...

    def _connection(self) -> AbstractContextManager[Any]: ...

    def _maintenance_connection(self) -> Any: ...


DELETE_CHUNK = 5000
"""每个删除迁移记录的事务最多删多少行。归档的前缀行只追加、不改写，没有别人会去锁它们，所以事务可以大些：
每次提交都要服务端刷一次 WAL，共享机器上这一下就是几毫秒到几十毫秒。"""

TASK_CHUNK = 100
"""整体删除任务时每个事务最多处理多少个任务（每个都 ``FOR UPDATE`` 锁住快照行，这里保持小批）。"""

_TERMINAL = sorted(s.value for s in TERMINAL_STATUSES)


def _cols(names: Sequence[str]) -> str:
    return ", ".join(names)


class ArchiveSql:
    """一个 schema 下的归档语句（构造时渲染一次，schema 名已转义）。"""

    def __init__(self, schema: str, task_cols: str) -> None:
        s = _schema.quote_ident(schema)
        transition_cols = _cols(TRANSITION_COLUMNS)
        self.transitions_after = (
            f"SELECT {transition_cols} FROM {s}.transitions WHERE (task_id, version) > (%s, %s) "
            "ORDER BY task_id, version LIMIT %s"
        )
        self.finished = (
            f"SELECT {task_cols} FROM {s}.tasks WHERE status = ANY(%(terminal)s::text[]) "
            "AND coalesce(finished_at, created_at) < %(before)s AND task_id > %(after)s "
            "ORDER BY task_id LIMIT %(limit)s"
        )
        self.history = f"SELECT {transition_cols} FROM {s}.transitions WHERE task_id = %s ORDER BY version"
        self.commands_of = (
            f"SELECT {_cols(COMMAND_COLUMNS)} FROM {s}.commands WHERE task_id = %s "
            "ORDER BY enqueued_at, command_id"
        )
        # 按连续版本段删（``version_runs``）：一个任务的前缀一条范围条件，而不是每个键一次探查。
        self.drop_transitions = (
            f"DELETE FROM {s}.transitions t USING unnest(%s::text[], %s::bigint[], %s::bigint[]) "
            "AS r(task_id, lo, hi) WHERE t.task_id = r.task_id AND t.version >= r.lo AND t.version <= r.hi"
        )
        self.drop_completed = (
            f"DELETE FROM {s}.commands WHERE command_id = ANY(%s::text[]) AND completed_at IS NOT NULL"
        )
        self.lock_task = (
            f"SELECT 1 FROM {s}.tasks WHERE task_id = %s AND status_version = %s "
            "AND status = ANY(%s::text[]) FOR UPDATE"
        )
        self.has_history = f"SELECT EXISTS (SELECT 1 FROM {s}.transitions WHERE task_id = %s)"
        self.command_ids = f"SELECT command_id FROM {s}.commands WHERE task_id = %s"
        self.drop_task_commands = f"DELETE FROM {s}.commands WHERE task_id = %s"
        self.drop_task = f"DELETE FROM {s}.tasks WHERE task_id = %s"
        self.purge = (
            f"DELETE FROM {s}.commands WHERE ctid = ANY(ARRAY(SELECT ctid FROM {s}.commands "
            "WHERE completed_at IS NOT NULL AND completed_at < %s LIMIT %s))"
        )


def _sql(store: PostgresTaskStore) -> ArchiveSql:
    return store._archive_sql


def export_transitions(
    store: PostgresTaskStore, before: datetime, after: tuple[str, int] | None, limit: int
) -> list[Transition]:
    after = export_transitions_args(before, after, limit)
    sql = _sql(store)

    def fetch(cursor: tuple[str, int], n: int) -> list[Transition]:
        def run(conn: Any) -> list[Transition]:
            rows = conn.execute(sql.transitions_after, [cursor[0], cursor[1], n]).fetchall()
            return [_trusted_transition(row) for row in rows]

        return store._read(run)

    return archivable_prefix(fetch, before, after, limit)


def export_finished(
    store: PostgresTaskStore, before: datetime, after: str | None, limit: int
) -> list[ArchivedTask]:
    after = export_finished_args(before, after, limit)
    sql = _sql(store)
    params = {"terminal": _TERMINAL, "before": before, "after": after or "", "limit": limit}

    def run(conn: Any) -> list[ArchivedTask]:
        # 一个事务（REPEATABLE READ 不必：每个任务的快照、历史、指令在它自己被删之前不会被归档器之外的人删）。
        out: list[ArchivedTask] = []
        for row in conn.execute(sql.finished, params).fetchall():
            snapshot = snapshot_from_row(row)
            history = [
                _trusted_transition(r) for r in conn.execute(sql.history, [snapshot.task_id]).fetchall()
            ]
            commands = [
                command_from_row(r) for r in conn.execute(sql.commands_of, [snapshot.task_id]).fetchall()
            ]
            out.append(ArchivedTask(snapshot, tuple(history), tuple(commands)))
        return out

    return store._read(run)


def delete_archived(store: PostgresTaskStore, receipt: ArchiveReceipt) -> ArchiveDeleted:
    receipt = check_receipt(receipt)
    sql = _sql(store)
    total = ArchiveDeleted()
    for runs in version_runs(receipt.transitions, DELETE_CHUNK):
        with store._connection() as conn:
            cur = conn.execute(
                sql.drop_transitions, [[r[0] for r in runs], [r[1] for r in runs], [r[2] for r in runs]]
            )
            total += ArchiveDeleted(transitions=cur.rowcount)
    ids = receipt.commands
    for i in range(0, len(ids), DELETE_CHUNK):
        with store._connection() as conn:
            cur = conn.execute(sql.drop_completed, [list(ids[i : i + DELETE_CHUNK])])
            total += ArchiveDeleted(commands=cur.rowcount)
    listed = frozenset(ids)
    tasks = receipt.tasks
    step = TASK_CHUNK
    logs = _logs.LogSql(_schema.quote_ident(store._schema))
    for i in range(0, len(tasks), step):
        # 核对与删除必须是一个事务：连接池的连接是 autocommit，否则 FOR UPDATE 那条语句一结束锁就放了，
        # 并发的 save 可以在核对之后、删除之前提交一个新版本（一条新的迁移记录），随后任务被删，新版本成了
        # 没有任务的孤儿。事务里锁一直持有到提交：并发的 save 等我们提交之后看到任务已不在（TaskNotFound /
        # 版本冲突），什么也不写。空等与等锁的上限与整块归档相同（docs/distributed.md §7.5）。
        with store._connection() as conn, conn.transaction():
            _partitions.set_local_limits(conn, _partitions.idle_limit_ms(store))
            removed = commands = 0
            with_logs = _logs.has_table(conn, logs)  # 第 1 版旧 schema 可能还没有日志表
            for task_id, version in tasks[i : i + step]:
                if conn.execute(sql.lock_task, [task_id, version, _TERMINAL]).fetchone() is None:
                    continue  # 不在了（重放），或者导出之后又变了：快照留下
                found = conn.execute(sql.has_history, [task_id]).fetchone()
                if found is None or found[0]:
                    continue  # 还有没归档的历史
                if not listed.issuperset(r[0] for r in conn.execute(sql.command_ids, [task_id]).fetchall()):
                    continue  # 还有没归档的指令
                commands += conn.execute(sql.drop_task_commands, [task_id]).rowcount
                if with_logs:
                    conn.execute(logs.drop_task, [task_id])  # 日志不归档，随任务删
                removed += conn.execute(sql.drop_task, [task_id]).rowcount
            total += ArchiveDeleted(tasks=removed, commands=commands)
    return total


def purge_commands(store: PostgresTaskStore, completed_before: datetime) -> int:
    check_aware("completed_before", completed_before, required=True)
    sql = _sql(store)
    deleted = 0
    while True:
        with store._connection() as conn:
            count = int(conn.execute(sql.purge, [completed_before, DELETE_CHUNK]).rowcount)
        deleted += count
        if count < DELETE_CHUNK:
            return deleted


def expired_partitions(store: PostgresTaskStore, before: datetime) -> list[str]:
    """整月早于 ``before`` 的分区（顺带提前建好后面几个月的分区；没有属主权限只告警）。只读打开 → []。"""
    check_aware("before", before, required=True)
    if store._readonly:
        return []
    with store._connection() as conn:
        _partitions.ensure_ahead_or_warn(conn, store._schema)
        return _partitions.expired(conn, store._schema, before)


def archive_partition(
    store: PostgresTaskStore,
    name: str,
    before: datetime,
    write: Callable[[list[Transition]], None],
    batch: int,
) -> PartitionArchived:
    check_aware("before", before, required=True)
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"分区名必须是非空字符串，收到 {name!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 100_000:
        raise ConfigurationError(f"batch 必须是 1..100000 之间的整数，收到 {batch!r}")
    return _partitions.archive_partition(store, name, before, write, batch)


__all__ = [
    "DELETE_CHUNK",
    "TASK_CHUNK",
    "ArchiveSql",
    "archive_partition",
    "delete_archived",
    "expired_partitions",
    "export_finished",
    "export_transitions",
    "purge_commands",
]
