"""任务日志表 task_logs 的建表细节：日志表加入之前建的旧 schema（第 1 版、没有 task_logs）。

契约语义（序号、上限、截断、随任务删除）由 tests-contract 的 StoreContract 覆盖；这里只测本后端独有的
"可写打开补建、只读打开绝不补建、缺表时 prune 照常"路径。
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from psycopg import sql

from chongming_task.states import TaskStatus as S
from chongming_task.storage import LogLine, LogStats
from chongming_task.stores.postgres import PostgresTaskStore
from chongming_task.testing.contract.logs import messages, numbered
from chongming_task.testing.store_contract import snap, walk

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 3, 1, 8, 0, 0, tzinfo=UTC)


def _make_old_schema(postgres_dsn: str, schema: str, admin: Any) -> None:
    store = PostgresTaskStore(postgres_dsn, schema=schema)
    done, records = walk(snap("old-task", finished_at=T0), S.QUEUED, S.RUNNING, S.SUCCEEDED)
    store.create(done, records)
    store.close()
    admin.execute(sql.SQL("DROP TABLE {}.task_logs").format(sql.Identifier(schema)))


def _has_logs(admin: Any, schema: str) -> bool:
    row = admin.execute("SELECT to_regclass(%s) IS NOT NULL", [f'"{schema}".task_logs']).fetchone()
    return bool(row and row[0])


def test_schema_sql_includes_the_logs_table() -> None:
    assert 'CREATE TABLE IF NOT EXISTS "ops".task_logs' in PostgresTaskStore.schema_sql("ops")


def test_readonly_open_of_old_schema_never_adds_the_table(postgres_dsn: str, schema: str, admin: Any) -> None:
    _make_old_schema(postgres_dsn, schema, admin)
    with PostgresTaskStore(postgres_dsn, schema=schema, readonly=True) as store:
        assert store.read_logs("old-task") == []
        assert store.log_stats("old-task") == LogStats()
    assert not _has_logs(admin, schema), "只读打开绝不迁移"
    with PostgresTaskStore(postgres_dsn, schema=schema, create_schema="never") as store:
        assert store.prune(keep_terminal=0) == 1, "缺日志表不能让 prune 失败"
    assert not _has_logs(admin, schema)


def test_writable_open_of_old_schema_adds_the_table(postgres_dsn: str, schema: str, admin: Any) -> None:
    _make_old_schema(postgres_dsn, schema, admin)
    with PostgresTaskStore(postgres_dsn, schema=schema) as store:
        assert _has_logs(admin, schema), "可写打开时补建日志表"
        store.append_logs([LogLine(task_id="old-task", attempt=1, at=T0, level="INFO", message="hi")])
        assert [line.message for line in store.read_logs("old-task")] == ["hi"]
        assert store.prune(keep_terminal=0) == 1
        assert store.read_logs("old-task") == []


def _has_watermarks(admin: Any, schema: str) -> bool:
    row = admin.execute("SELECT to_regclass(%s) IS NOT NULL", [f'"{schema}".task_log_writers']).fetchone()
    return bool(row and row[0])


def test_writable_open_of_a_schema_without_watermarks_adds_them(
    postgres_dsn: str, schema: str, admin: Any
) -> None:
    """幂等水位线表加入之前建的 schema（有 task_logs、没有 task_log_writers）：可写打开补建，旧行不动。"""
    with PostgresTaskStore(postgres_dsn, schema=schema) as store:
        store.create(snap("t"))
        store.append_logs([LogLine(task_id="t", attempt=1, at=T0, level="INFO", message="before")])
    admin.execute(sql.SQL("DROP TABLE {}.task_log_writers").format(sql.Identifier(schema)))
    with PostgresTaskStore(postgres_dsn, schema=schema, readonly=True) as store:
        assert [line.message for line in store.read_logs("t")] == ["before"]
    assert not _has_watermarks(admin, schema), "只读打开绝不迁移"
    with PostgresTaskStore(postgres_dsn, schema=schema) as store:
        assert _has_watermarks(admin, schema), "可写打开时补建水位线表"
        store.append_logs(numbered("t", "w", range(1, 3)))
        store.append_logs(numbered("t", "w", range(1, 3)))  # 重试：不写第二遍
        assert messages(store, "t") == [(1, "before"), (2, "w#1"), (3, "w#2")]
        done, records = walk(snap("done", finished_at=T0), S.QUEUED, S.RUNNING, S.SUCCEEDED)
        store.create(done, records)
        store.append_logs(
            [LogLine(task_id="done", attempt=1, at=T0, level="INFO", message="x", writer="w", writer_seq=3)]
        )
        assert store.prune(keep_terminal=0) == 1
    rows = admin.execute(
        sql.SQL("SELECT task_id FROM {}.task_log_writers ORDER BY task_id").format(sql.Identifier(schema))
    ).fetchall()
    assert rows == [("t",)], "水位线随任务删掉（外键级联）"
