"""SqliteTaskStore 的任务日志（issue 18；存储指南 §11）。

与 store.py 分开放（同 ``_archive``）：日志是独立的一类流量，不碰快照、版本号与历史。要点：

* ``task_logs`` 以 (task_id, seq) 为主键（``WITHOUT ROWID``，按任务聚簇）：按任务续读沿主键顺序走。
* seq 在写事务里取"该任务已有的最大 seq + 1"：SQLite 同一时刻只有一个写事务，不会重号；newest 行
  永远不会被上限删掉，所以最大 seq 就是最后分配的序号，丢掉的行数 = 最大 seq − 现存行数，不必另记。
* 上限在同一个事务里执行：插入之后删掉 seq <= 最大 seq − MAX_LOG_LINES 的行。
* 重试幂等：``task_log_writers`` 记着每任务每写入者已接受的最大 writer_seq，写入前按它滤掉写过的行
  （``values.unseen_log_lines``），新水位线与行在同一个事务里落库——要么都在，要么都不在。重复的行不
  分配 seq，所以不会被算成"丢掉的行"。
* 只读打开不建表：第 1 版旧文件里可能还没有 ``task_logs``（见 ``_schema``），读方法把"没有这张表"
  当作"没有日志"。
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Literal, Protocol, TypeVar

from chongming_task.core.storage import checks
from chongming_task.core.storage.values import MAX_LOG_LINES, LogLine, LogStats, unseen_log_lines

_T = TypeVar("_T")


class SqliteTaskStore(Protocol):
    """本模块只用到存储的这一个管道方法（写成协议而不是导入 store.py：两个模块之间不能有导入环）。"""

    def _run(
        self, what: str, fn: Callable[[sqlite3.Connection], _T], mode: Literal["write", "read", "none"] = ...
    ) -> _T: ...


_INSERT = (
    "INSERT INTO task_logs (task_id, seq, attempt, at, level, message, truncated) "
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_SELECT = "SELECT task_id, seq, attempt, at, level, message, truncated FROM task_logs WHERE task_id = ?"
_MARKS = "SELECT writer, writer_seq FROM task_log_writers WHERE task_id = ?"
_SET_MARK = (
    "INSERT INTO task_log_writers (task_id, writer, writer_seq) VALUES (?, ?, ?) "
    "ON CONFLICT (task_id, writer) DO UPDATE SET writer_seq = excluded.writer_seq"
)


def _missing_table(exc: sqlite3.OperationalError) -> bool:
    return "no such table" in str(exc) and "task_log" in str(exc)


def delete_for(conn: sqlite3.Connection, task_ids: Sequence[tuple[str]]) -> None:
    """删掉这些任务的日志（prune / delete_archived 在它们自己的写事务里调用）。

    不许建表（``create_schema="never"``）打开的旧文件可能没有日志表：那就没有要删的，prune 照常进行。
    """
    for table in ("task_logs", "task_log_writers"):
        try:
            conn.executemany(f"DELETE FROM {table} WHERE task_id = ?", task_ids)
        except sqlite3.OperationalError as exc:
            if not _missing_table(exc):
                raise


def append_logs(store: SqliteTaskStore, lines: Sequence[LogLine]) -> None:
    batch = checks.append_logs_args(lines)
    by_task: dict[str, list[LogLine]] = {}
    for line in batch:
        by_task.setdefault(line.task_id, []).append(line)

    def tx(conn: sqlite3.Connection) -> None:
        for task_id, group in by_task.items():
            if conn.execute("SELECT 1 FROM tasks WHERE task_id = ?", (task_id,)).fetchone() is None:
                continue  # 任务已不在：跳过（见契约）
            if any(line.writer for line in group):
                seen = dict(conn.execute(_MARKS, (task_id,)).fetchall())
                group, marks = unseen_log_lines(group, seen)
                conn.executemany(_SET_MARK, [(task_id, w, n) for w, n in marks.items()])
                if not group:
                    continue  # 整批都写过（重试）
            last = conn.execute(
                "SELECT coalesce(max(seq), 0) FROM task_logs WHERE task_id = ?", (task_id,)
            ).fetchone()[0]
            rows = [
                (
                    task_id,
                    last + i,
                    line.attempt,
                    line.at.isoformat(timespec="microseconds"),
                    line.level,
                    line.message,
                    int(line.truncated),
                )
                for i, line in enumerate(group, start=1)
            ]
            conn.executemany(_INSERT, rows)
            newest = last + len(group)
            if newest > MAX_LOG_LINES:
                conn.execute(
                    "DELETE FROM task_logs WHERE task_id = ? AND seq <= ?", (task_id, newest - MAX_LOG_LINES)
                )

    if by_task:
        store._run("append_logs", tx)


def _line(row: tuple[object, ...]) -> LogLine:
    task_id, seq, attempt, at, level, message, truncated = row
    return LogLine(
        task_id=str(task_id),
        seq=int(seq),  # type: ignore[call-overload]
        attempt=int(attempt),  # type: ignore[call-overload]
        at=datetime.fromisoformat(str(at)),
        level=str(level),
        message=str(message),
        truncated=bool(truncated),
    )


def read_logs(
    store: SqliteTaskStore, task_id: str, attempt: int | None, after_seq: int | None, limit: int
) -> list[LogLine]:
    checks.read_logs_args(task_id, attempt, after_seq, limit)
    sql = _SELECT + " AND seq > ?"
    params: list[object] = [task_id, after_seq or 0]
    if attempt is not None:
        sql += " AND attempt = ?"
        params.append(attempt)
    sql += " ORDER BY seq LIMIT ?"
    params.append(limit)

    def read(conn: sqlite3.Connection) -> list[tuple[object, ...]]:
        try:
            return conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as exc:
            if _missing_table(exc):
                return []  # 只读打开的旧文件：还没有日志表，也就没有日志
            raise

    return [_line(row) for row in store._run("read_logs", read, "none")]


def log_stats(store: SqliteTaskStore, task_id: str) -> LogStats:
    checks.check_key("task_id", task_id)

    def read(conn: sqlite3.Connection) -> tuple[int, int]:
        try:
            row = conn.execute(
                "SELECT count(*), coalesce(max(seq), 0) FROM task_logs WHERE task_id = ?", (task_id,)
            ).fetchone()
        except sqlite3.OperationalError as exc:
            if _missing_table(exc):
                return 0, 0
            raise
        return int(row[0]), int(row[1])

    kept, last = store._run("log_stats", read, "none")
    return LogStats(kept=kept, dropped=last - kept, last_seq=last)


__all__ = ["append_logs", "log_stats", "read_logs"]
