"""PostgresTaskStore 的任务日志（issue 18；存储指南 §11）。

与 store.py 分开放（同 ``_archive``）：日志是独立的一类流量，不碰快照、版本号与历史。要点：

* ``task_logs`` 以 (task_id, seq) 为主键。seq 取"该任务已有的最大 seq + 1"，为此同一任务的写入者在
  事务级咨询锁下排队（按任务一把，不挡别的任务，也不挡 save——save 改的是 tasks 行，不拿这把锁）。
  任务行另加 ``FOR KEY SHARE``：并发的删除（prune / delete_archived）等本事务提交后再删，删时看得见
  刚写的行，不会留下孤儿。
* 一次 append_logs 是**一个事务**（管道里发送：每任务一次往返取锁、任务行、最大 seq 与水位线，最后插入、
  水位线、裁剪各一条语句，再 COMMIT）。连接是 autocommit 的：不显式开事务，咨询锁在它那条语句结束时就
  放掉了，两个写入者会算出同一个 seq 撞主键，插入与裁剪也不是原子的。"拿到锁之后的语句才取快照"是
  READ COMMITTED 的语义：事务显式设成这一级，服务器默认级别被改成 REPEATABLE READ 时也不会读到旧的最大 seq。
* 重试幂等：``task_log_writers`` 记着每任务每写入者已接受的最大 writer_seq（``values.unseen_log_lines``
  说明为什么是水位线而不是 task_logs 上的唯一约束）。写过的行在插入前滤掉，新水位线与行同一事务提交：
  COMMIT 的回执丢了、调用方重试同一批，读到的是已提交的水位线，一行也不会写第二遍，也不会被算成丢弃。
  水位线表对 tasks 有 ``ON DELETE CASCADE`` 外键：prune / delete_archived（以及旧包的删除）删任务时
  它跟着删，删除路径不必认识这张表。
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
from chongming_task.core.storage.values import MAX_LOG_LINES, LogLine, LogStats, unseen_log_lines
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
        self.writers_table = f"{s}.task_log_writers"
        self.marks = f"SELECT writer, writer_seq FROM {s}.task_log_writers WHERE task_id = %s"
        self.set_marks = (
            f"INSERT INTO {s}.task_log_writers (task_id, writer, writer_seq) "
            "SELECT * FROM unnest(%s::text[], %s::text[], %s::bigint[]) "
            "ON CONFLICT (task_id, writer) DO UPDATE SET writer_seq = excluded.writer_seq"
        )
        self.lock = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
        self.task = f"SELECT 1 FROM {s}.tasks WHERE task_id = %s FOR KEY SHARE"
        self.last = f"SELECT coalesce(max(seq), 0) FROM {s}.task_logs WHERE task_id = %s"
        # 一批行一条语句（按列传数组再 unnest）：管道里的 executemany 会在中途同步一次，一条语句则与水位线、
        # 裁剪、COMMIT 一起在最后一次往返里发出。
        self.insert = (
            f"INSERT INTO {s}.task_logs (task_id, seq, attempt, at, at_off, level, message, truncated) "
            "SELECT * FROM unnest(%s::text[], %s::bigint[], %s::bigint[], %s::timestamptz[], %s::bigint[], "
            "%s::text[], %s::text[], %s::boolean[])"
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
        # 重试幂等的水位线（每任务每写入者一行）。比 task_logs 晚加入：同样走"可写打开时补建"。
        f"""CREATE TABLE IF NOT EXISTS {quoted_schema}.task_log_writers (
    task_id text COLLATE "C" NOT NULL REFERENCES {quoted_schema}.tasks (task_id) ON DELETE CASCADE,
    writer text COLLATE "C" NOT NULL,
    writer_seq bigint NOT NULL,
    PRIMARY KEY (task_id, writer)
)""",
    ]


def has_table(conn: Any, sql: LogSql) -> bool:
    """有没有日志表 task_logs（删除路径据此决定要不要连日志一起删）。"""
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [sql.table]).fetchone()
    return bool(row and row[0])


def has_tables(conn: Any, sql: LogSql) -> bool:
    """日志的两张表是否都在（可写打开据此决定要不要补建）。"""
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT NULL", [sql.table, sql.writers_table]
    ).fetchone()
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
    with store._connection() as conn, conn.pipeline(), conn.transaction():
        rows: list[tuple[object, ...]] = []
        marks: list[tuple[str, str, int]] = []
        trims: list[tuple[str, int]] = []
        # 按 task_id 排序加锁：两个写入者的批次有交集时不会互相死锁。锁、任务行、最大 seq 与水位线在同一次
        # 往返里发出：服务器按顺序执行，后面的语句在拿到锁之后才取快照，看得见上一个持锁者提交的行。
        conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        for task_id in sorted(by_task):
            conn.execute(sql.lock, ["chongming_task.logs:" + store._schema + ":" + task_id])
            exists = conn.execute(sql.task, [task_id])
            last_row = conn.execute(sql.last, [task_id])
            seen = conn.execute(sql.marks, [task_id])
            if exists.fetchone() is None:
                continue  # 任务已不在：跳过（见契约）
            last = int(last_row.fetchone()[0])
            group, changed = unseen_log_lines(by_task[task_id], dict(seen.fetchall()))
            marks.extend((task_id, writer, n) for writer, n in changed.items())
            for i, line in enumerate(group, start=1):
                at, off = split_dt(line.at)
                rows.append(
                    (task_id, last + i, line.attempt, at, off, line.level, line.message, line.truncated)
                )
            newest = last + len(group)
            if group and newest > MAX_LOG_LINES:
                trims.append((task_id, newest - MAX_LOG_LINES))
        # 写入、水位线、裁剪各一条语句，不等各自的回复就发出，随后是事务结束时的 COMMIT：它们同一事务提交，
        # COMMIT 的回执丢了也是要么都已提交、要么都没有，重试时水位线认得出已提交的行。
        if rows:
            conn.execute(sql.insert, [list(column) for column in zip(*rows, strict=True)])
        if marks:
            conn.execute(sql.set_marks, [list(column) for column in zip(*marks, strict=True)])
        for task_id, upto in trims:
            conn.execute(sql.trim, [task_id, upto])


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


__all__ = ["LogSql", "append_logs", "ddl_statements", "has_table", "has_tables", "log_stats", "read_logs"]
