"""PostgresTaskStore 的任务日志（issue 18；存储指南 §11）。

与 store.py 分开放（同 ``_archive``）：日志是独立的一类流量，不碰快照、版本号与历史。要点：

* ``task_logs`` 以 (task_id, seq) 为主键。seq 取"该任务已有的最大 seq + 1"，为此同一任务的写入者在
  事务级咨询锁下排队（按任务一把，不挡别的任务，也不挡 save——save 改的是 tasks 行，不拿这把锁）。
  任务行另加 ``FOR KEY SHARE``：并发的删除（prune / delete_archived）等本事务提交后再删，删时看得见
  刚写的行，不会留下孤儿。
* 最新的行永远不会被上限删掉，所以最大 seq 就是最后分配的序号：丢掉的行数 = 最大 seq − 现存行数。
* 日志表是第 1 版之后补进来的（同节点表）：可写打开时补建，只读打开绝不补建；读方法把"没有这张表"
  当作"没有日志"，prune / delete_archived 在没有这张表时不删日志。
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from psycopg import errors as pg_errors

from chongming_task.core.storage import checks
from chongming_task.core.storage.values import MAX_LOG_LINES, LogLine, LogStats
from chongming_task.errors import StoreError
from chongming_task.stores.postgres._codec import join_dt, split_dt

_T = TypeVar("_T")


class PostgresTaskStore(Protocol):
    """本模块用到的存储管道（写成协议而不是导入 store.py：两个模块之间不能有导入环）。"""

    _schema: str

    def _check_open(self) -> None: ...

    def _read(self, fn: Callable[[Any], _T]) -> _T: ...

    def _connection(self) -> AbstractContextManager[Any]: ...


class LogSql:
    """日志的 SQL 文本（schema 名已加引号代入）。"""

    def __init__(self, s: str) -> None:
        self.table = f"{s}.task_logs"
        self.lock = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
        self.task = f"SELECT 1 FROM {s}.tasks WHERE task_id = %s FOR KEY SHARE"
        self.last = f"SELECT coalesce(max(seq), 0) FROM {s}.task_logs WHERE task_id = %s"
        self.insert = (
            f"INSERT INTO {s}.task_logs (task_id, seq, attempt, at, at_off, level, message, truncated) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
        )
        self.trim = f"DELETE FROM {s}.task_logs WHERE task_id = %s AND seq <= %s"
        self.select = (
            f"SELECT task_id, seq, attempt, at, at_off, level, message, truncated FROM {s}.task_logs "
            "WHERE task_id = %s AND seq > %s AND (%s::bigint IS NULL OR attempt = %s::bigint) "
            "ORDER BY seq LIMIT %s"
        )
        self.stats = f"SELECT count(*), coalesce(max(seq), 0) FROM {s}.task_logs WHERE task_id = %s"
        self.drop_task = f"DELETE FROM {s}.task_logs WHERE task_id = %s"


def ddl_statements(quoted_schema: str) -> list[str]:
    """日志表（幂等）。at 旁边的 at_off 记下原始 UTC 偏移（微秒），与别的时间列同一规则。"""
    return [
        f"""CREATE TABLE IF NOT EXISTS {quoted_schema}.task_logs (
    task_id text COLLATE "C" NOT NULL,
    seq bigint NOT NULL,
    attempt bigint NOT NULL,
    at timestamptz NOT NULL,
    at_off bigint NOT NULL,
    level text NOT NULL,
    message text NOT NULL,
    truncated boolean NOT NULL DEFAULT false,
    PRIMARY KEY (task_id, seq)
)""",
    ]


def has_table(conn: Any, sql: LogSql) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [sql.table]).fetchone()
    return bool(row and row[0])


def _missing_table(exc: StoreError) -> bool:
    return isinstance(exc.__cause__, pg_errors.UndefinedTable)


def append_logs(store: PostgresTaskStore, sql: LogSql, lines: Sequence[LogLine]) -> None:
    batch = checks.append_logs_args(lines)
    by_task: dict[str, list[LogLine]] = {}
    for line in batch:
        by_task.setdefault(line.task_id, []).append(line)
    if not by_task:
        store._check_open()  # 空批也要在关闭后报错，与别的方法一致
        return
    with store._connection() as conn:
        # 按 task_id 排序加锁：两个写入者的批次有交集时不会互相死锁。
        for task_id in sorted(by_task):
            group = by_task[task_id]
            conn.execute(sql.lock, ["chongming_task.logs:" + store._schema + ":" + task_id])
            if conn.execute(sql.task, [task_id]).fetchone() is None:
                continue  # 任务已不在：跳过（见契约）
            last = int(conn.execute(sql.last, [task_id]).fetchone()[0])
            rows = []
            for i, line in enumerate(group, start=1):
                at, off = split_dt(line.at)
                rows.append(
                    (task_id, last + i, line.attempt, at, off, line.level, line.message, line.truncated)
                )
            conn.cursor().executemany(sql.insert, rows)
            newest = last + len(group)
            if newest > MAX_LOG_LINES:
                conn.execute(sql.trim, [task_id, newest - MAX_LOG_LINES])


def read_logs(
    store: PostgresTaskStore,
    sql: LogSql,
    task_id: str,
    attempt: int | None,
    after_seq: int | None,
    limit: int,
) -> list[LogLine]:
    checks.read_logs_args(task_id, attempt, after_seq, limit)

    def run(conn: Any) -> list[LogLine]:
        rows = conn.execute(sql.select, [task_id, after_seq or 0, attempt, attempt, limit]).fetchall()
        return [
            LogLine(
                task_id=row[0],
                seq=int(row[1]),
                attempt=int(row[2]),
                at=join_dt(row[3], row[4]),  # type: ignore[arg-type]
                level=row[5],
                message=row[6],
                truncated=bool(row[7]),
            )
            for row in rows
        ]

    try:
        return store._read(run)
    except StoreError as exc:
        if _missing_table(exc):
            return []  # 只读打开的旧 schema：还没有日志表，也就没有日志
        raise


def log_stats(store: PostgresTaskStore, sql: LogSql, task_id: str) -> LogStats:
    checks.check_key("task_id", task_id)
    try:
        row = store._read(lambda conn: conn.execute(sql.stats, [task_id]).fetchone())
    except StoreError as exc:
        if _missing_table(exc):
            return LogStats()
        raise
    kept, last = int(row[0]), int(row[1])
    return LogStats(kept=kept, dropped=last - kept, last_seq=last)


__all__ = ["LogSql", "append_logs", "ddl_statements", "has_table", "log_stats", "read_logs"]
