"""SqliteTaskStore 的归档与时间窗口保留（issue 20；存储指南 §9）。

与 store.py 分开放，是为了让这块维护流量的代码与热路径互不干扰（也便于合并）。要点：

* **导出**只读：迁移记录按 (task_id, version) 主键顺序键集分页（``WITHOUT ROWID`` 表本身就按主键存放，
  顺序扫描即可），"最长的旧前缀"规则由 core 的 ``archivable_prefix`` 判断——时间按"时刻"比较，
  与写法（时区偏移）无关，所以放在 Python 里做，而不是比较 ISO 文本。
* **删除**分成短事务：每个写事务最多 ``DELETE_CHUNK`` 行，事务之间把写锁让出来——正在写穿的监督
  进程最多等一个小批次（毫秒级），而不是等整个归档跑完。
* **回收空间**：新建的文件以 ``auto_vacuum = INCREMENTAL`` 建库（这个模式只能在建第一张表之前设定，
  或者事后用一次全库 ``VACUUM`` 改写）；删除之后 ``PRAGMA incremental_vacuum`` 按批把空闲页从文件尾
  截掉，文件随之变小。旧文件（``auto_vacuum = NONE``）不自动 VACUUM——那要以独占锁重写整个文件，
  正是我们要避免的长锁；空闲页会被新写入复用，文件不再增长。想让旧文件也能收缩，停机时执行一次
  ``sqlite3 文件 "PRAGMA auto_vacuum = INCREMENTAL; VACUUM;"``（存储指南 §9）。
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Literal, Protocol, TypeVar

from chongming_task.core.storage.checks import (
    check_aware,
    check_receipt,
    export_finished_args,
    export_transitions_args,
)
from chongming_task.core.storage.retention import archivable_prefix, version_runs
from chongming_task.core.storage.values import ArchiveDeleted, ArchivedTask, ArchiveReceipt
from chongming_task.models import Transition
from chongming_task.stores.sqlite import _codec as codec
from chongming_task.stores.sqlite import _logs, _sql
from chongming_task.stores.sqlite import _schema as schema

_T = TypeVar("_T")

_trusted_transition = codec.TRANSITIONS.trusted_from_row
"""导出只读本库自己写入（已校验）的行：解码不再逐字段校验（见 ``TransitionCodec.trusted_from_row``）。"""


class SqliteTaskStore(Protocol):
    """本模块只用到存储的这一个管道方法（写成协议而不是导入 store.py：两个模块之间不能有导入环）。"""

    def _run(
        self, what: str, fn: Callable[[sqlite3.Connection], _T], mode: Literal["write", "read", "none"] = ...
    ) -> _T: ...


_Item = TypeVar("_Item")

DELETE_CHUNK = 500
"""每个删除事务最多删多少行：几毫秒的写锁。"""

VACUUM_PAGES = 2000
"""每次 incremental_vacuum 最多截掉多少页（默认页大小下约 8 MB）。"""

_TRANSITION_SELECT = (
    f"SELECT {', '.join(schema.TRANSITION_COLUMNS)} FROM transitions "
    "WHERE (task_id, version) > (?, ?) ORDER BY task_id, version LIMIT ?"
)
_FINISHED_SELECT = (
    f"{_sql.TASK_SELECT} WHERE {_sql.TERMINAL_IN} AND coalesce(finished_key, created_key) < ? "
    "AND task_id > ? ORDER BY task_id LIMIT ?"
)
_HISTORY_SELECT = (
    f"SELECT {', '.join(schema.TRANSITION_COLUMNS)} FROM transitions WHERE task_id = ? ORDER BY version"
)
_COMMANDS_OF_TASK = f"{_sql.COMMAND_SELECT} WHERE task_id = ? ORDER BY seq"


def use_incremental_vacuum(conn: sqlite3.Connection) -> None:
    """新文件（``_schema.is_new_file``）以 auto_vacuum = INCREMENTAL 建库。必须在 WAL 与建表之前、事务之外
    执行。"""
    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")


def export_transitions(
    store: SqliteTaskStore, before: datetime, after: tuple[str, int] | None, limit: int
) -> list[Transition]:
    after = export_transitions_args(before, after, limit)

    def fetch(cursor: tuple[str, int], n: int) -> list[Transition]:
        rows = store._run(
            "export_transitions",
            lambda conn: conn.execute(_TRANSITION_SELECT, (*cursor, n)).fetchall(),
            "none",
        )
        return [_trusted_transition(r) for r in rows]

    return archivable_prefix(fetch, before, after, limit)


def export_finished(
    store: SqliteTaskStore, before: datetime, after: str | None, limit: int
) -> list[ArchivedTask]:
    after = export_finished_args(before, after, limit)
    key = codec.dt_key(before)

    def read(conn: sqlite3.Connection) -> list[ArchivedTask]:
        # 一个读事务：快照、历史、指令出自同一个一致的视图。
        found = conn.execute(_FINISHED_SELECT, (*_sql.TERMINAL_VALUES, key, after or "", limit)).fetchall()
        out: list[ArchivedTask] = []
        for row in found:
            snapshot = codec.snapshot_from_row(row)
            history = [_trusted_transition(r) for r in conn.execute(_HISTORY_SELECT, (snapshot.task_id,))]
            commands = [
                codec.command_from_row(r) for r in conn.execute(_COMMANDS_OF_TASK, (snapshot.task_id,))
            ]
            out.append(ArchivedTask(snapshot, tuple(history), tuple(commands)))
        return out

    return store._run("export_finished", read, "read")


def _chunks(items: Sequence[_Item], size: int) -> list[Sequence[_Item]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def delete_archived(store: SqliteTaskStore, receipt: ArchiveReceipt) -> ArchiveDeleted:
    receipt = check_receipt(receipt)
    total = ArchiveDeleted()
    for runs in version_runs(receipt.transitions, DELETE_CHUNK):

        def drop_transitions(conn: sqlite3.Connection, runs: Sequence[tuple[str, int, int]] = runs) -> int:
            cur = conn.executemany(
                "DELETE FROM transitions WHERE task_id = ? AND version >= ? AND version <= ?", runs
            )
            return cur.rowcount

        total += ArchiveDeleted(transitions=store._run("delete_archived", drop_transitions))
    # 已完成的指令不会再变，按 id 删；未完成的只随它的任务整体离开（下面）。
    for ids in _chunks(receipt.commands, DELETE_CHUNK):

        def drop_commands(conn: sqlite3.Connection, chunk: Sequence[str] = ids) -> int:
            cur = conn.executemany(
                "DELETE FROM commands WHERE command_id = ? AND completed_at IS NOT NULL",
                [(c,) for c in chunk],
            )
            return cur.rowcount

        total += ArchiveDeleted(commands=store._run("delete_archived", drop_commands))
    listed = frozenset(receipt.commands)
    for chunk in _chunks(receipt.tasks, DELETE_CHUNK // 5):

        def drop_tasks(conn: sqlite3.Connection, chunk: Sequence[tuple[str, int]] = chunk) -> ArchiveDeleted:
            tasks = commands = 0
            for task_id, version in chunk:
                found = conn.execute(
                    f"SELECT 1 FROM tasks WHERE task_id = ? AND status_version = ? AND {_sql.TERMINAL_IN}",
                    (task_id, version, *_sql.TERMINAL_VALUES),
                ).fetchone()
                if found is None:
                    continue  # 不在了（重放），或者导出之后又变了：快照留下
                if conn.execute("SELECT 1 FROM transitions WHERE task_id = ? LIMIT 1", (task_id,)).fetchone():
                    continue  # 还有没归档的历史：删快照会留下孤儿
                ids = [
                    r[0]
                    for r in conn.execute("SELECT command_id FROM commands WHERE task_id = ?", (task_id,))
                ]
                if not listed.issuperset(ids):
                    continue  # 还有没归档的指令
                commands += conn.execute("DELETE FROM commands WHERE task_id = ?", (task_id,)).rowcount
                conn.execute("DELETE FROM task_tags WHERE task_id = ?", (task_id,))
                _logs.delete_for(conn, [(task_id,)])  # 日志不归档，随任务删
                tasks += conn.execute("DELETE FROM tasks WHERE task_id = ?", (task_id,)).rowcount
            return ArchiveDeleted(tasks=tasks, commands=commands)

        total += store._run("delete_archived", drop_tasks)
    if total.total:
        incremental_vacuum(store)
    return total


def incremental_vacuum(store: SqliteTaskStore) -> None:
    """把空闲页从文件尾截掉，每次最多 ``VACUUM_PAGES`` 页、各自一个短事务；auto_vacuum 不是
    INCREMENTAL 的文件上这是空操作（见模块说明）。

    用 executescript：``PRAGMA incremental_vacuum(N)`` 每截一页返回一行"零列"的结果，``execute`` 只
    执行第一步（只截一页），``executescript`` 会把语句执行完。
    """

    def step(conn: sqlite3.Connection) -> bool:
        if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
            return False
        if conn.execute("PRAGMA freelist_count").fetchone()[0] == 0:
            return False
        conn.executescript(f"PRAGMA incremental_vacuum({VACUUM_PAGES});")
        return True

    for _ in range(10_000):
        if not store._run("incremental_vacuum", step, "none"):
            return


def purge_commands(store: SqliteTaskStore, completed_before: datetime) -> int:
    check_aware("completed_before", completed_before, required=True)
    # completed_at 存的是 ISO 原文（没有 UTC 键列）：取出来按时刻比较，再按 id 分批删。
    rows = store._run(
        "purge_commands",
        lambda conn: conn.execute(
            "SELECT command_id, completed_at FROM commands WHERE completed_at IS NOT NULL"
        ).fetchall(),
        "none",
    )
    doomed: list[tuple[str]] = [
        (r[0],) for r in rows if (codec.dt_parse(r[1]) or completed_before) < completed_before
    ]
    deleted = 0
    for rows_chunk in _chunks(doomed, DELETE_CHUNK):

        def drop(conn: sqlite3.Connection, chunk: Sequence[tuple[str]] = rows_chunk) -> int:
            return conn.executemany(
                "DELETE FROM commands WHERE command_id = ? AND completed_at IS NOT NULL", chunk
            ).rowcount

        deleted += store._run("purge_commands", drop)
    return deleted


__all__ = [
    "DELETE_CHUNK",
    "VACUUM_PAGES",
    "delete_archived",
    "export_finished",
    "export_transitions",
    "incremental_vacuum",
    "purge_commands",
    "use_incremental_vacuum",
]
