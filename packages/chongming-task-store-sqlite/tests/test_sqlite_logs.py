"""任务日志表 task_logs 的建表细节：日志表加入之前建的文件（表都在、唯独没有 task_logs）。

契约语义（序号、上限、截断、随任务删除）由 tests-contract 的 StoreContract 覆盖；这里只测本后端独有的
"可写打开补建、只读打开绝不补建"路径。
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from chongming_task.states import TaskStatus as S
from chongming_task.storage import LogLine, LogStats
from chongming_task.stores.sqlite import SqliteTaskStore
from chongming_task.testing.contract.logs import messages, numbered
from chongming_task.testing.store_contract import snap, walk

T0 = datetime(2026, 3, 1, 8, 0, 0, tzinfo=UTC)


def _old_file(path: Path) -> None:
    """一份日志表加入之前的文件：第 1 版、已有一个终态任务、没有 task_logs 表。"""
    store = SqliteTaskStore(path)
    done, records = walk(snap("old-task", finished_at=T0), S.QUEUED, S.RUNNING, S.SUCCEEDED)
    store.create(done, records)
    store.close()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DROP TABLE task_logs")
    conn.close()


def _tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()


def test_readonly_open_of_old_file_never_adds_the_table_and_reads_no_logs(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _old_file(path)
    with SqliteTaskStore(path, readonly=True) as store:
        assert store.read_logs("old-task") == []
        assert store.log_stats("old-task") == LogStats()
        assert store.get("old-task") is not None
    assert "task_logs" not in _tables(path), "只读打开绝不迁移"


def test_never_create_open_of_old_file_still_prunes(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _old_file(path)
    with SqliteTaskStore(path, create_schema="never") as store:
        assert store.prune(keep_terminal=0) == 1, "缺日志表不能让 prune 失败"
    assert "task_logs" not in _tables(path)


def test_writable_open_of_old_file_adds_the_table_without_a_version_bump(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _old_file(path)
    with SqliteTaskStore(path) as store:
        assert "task_logs" in _tables(path), "可写打开时补建日志表"
        store.append_logs([LogLine(task_id="old-task", attempt=1, at=T0, level="INFO", message="hi")])
        assert [line.message for line in store.read_logs("old-task")] == ["hi"]
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(1,)], "不升版本号"
    finally:
        conn.close()


def _file_without_watermarks(path: Path) -> None:
    """幂等水位线表加入之前的文件：已有 task_logs 与一行日志，没有 task_log_writers。"""
    store = SqliteTaskStore(path)
    store.create(snap("t"))
    store.append_logs([LogLine(task_id="t", attempt=1, at=T0, level="INFO", message="before")])
    store.close()
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DROP TABLE task_log_writers")
    conn.close()


def test_writable_open_adds_the_watermark_table_and_keeps_existing_lines(tmp_path: Path) -> None:
    path = tmp_path / "v1-logs.db"
    _file_without_watermarks(path)
    with SqliteTaskStore(path, readonly=True) as store:
        assert [line.message for line in store.read_logs("t")] == ["before"]
    assert "task_log_writers" not in _tables(path), "只读打开绝不迁移"
    with SqliteTaskStore(path) as store:
        assert "task_log_writers" in _tables(path), "可写打开时补建水位线表"
        store.append_logs(numbered("t", "w", range(1, 3)))
        store.append_logs(numbered("t", "w", range(1, 3)))  # 重试：不写第二遍
        assert messages(store, "t") == [(1, "before"), (2, "w#1"), (3, "w#2")]


def test_never_create_open_without_the_watermark_table_still_prunes(tmp_path: Path) -> None:
    path = tmp_path / "v1-logs.db"
    _file_without_watermarks(path)
    with SqliteTaskStore(path) as store:
        done, records = walk(snap("done", finished_at=T0), S.QUEUED, S.RUNNING, S.SUCCEEDED)
        store.create(done, records)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DROP TABLE task_log_writers")
    conn.close()
    with SqliteTaskStore(path, create_schema="never") as store:
        assert store.prune(keep_terminal=0) == 1, "缺水位线表不能让 prune 失败"
    assert "task_log_writers" not in _tables(path)
