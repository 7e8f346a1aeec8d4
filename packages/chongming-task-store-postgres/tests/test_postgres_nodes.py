"""节点成员表 nodes 的建表细节：节点表加入之前建的旧 schema（第 1 版、没有 nodes）照样能用。

契约语义（往返、覆盖、排序、并发发布）由 tests-contract 的 StoreContract 覆盖；这里只测本后端
独有的建表与权限路径。
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg import sql

from chongming_task.errors import StoreError
from chongming_task.storage import NodeRecord
from chongming_task.stores.postgres import PostgresTaskStore
from chongming_task.testing.store_contract import snap

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 3, 1, 8, 0, 0, tzinfo=UTC)


def _record(owner: str) -> NodeRecord:
    return NodeRecord(
        owner=owner,
        buckets=frozenset(range(8)),
        num_buckets=64,
        heartbeat_at=T0,
        expires_at=T0 + timedelta(seconds=30),
        info={"hostname": "机器-1"},
    )


def _make_old_schema(postgres_dsn: str, schema: str, admin: Any) -> None:
    """建一套完整的表，再删掉 nodes：等同于节点表加入之前建的第 1 版 schema（里面已有任务）。"""
    store = PostgresTaskStore(postgres_dsn, schema=schema)
    store.create(snap("old-task", bucket=3))
    store.close()
    admin.execute(sql.SQL("DROP TABLE {}.nodes").format(sql.Identifier(schema)))


def _has_nodes(admin: Any, schema: str) -> bool:
    row = admin.execute("SELECT to_regclass(%s) IS NOT NULL", [f'"{schema}".nodes']).fetchone()
    return bool(row and row[0])


def test_schema_sql_includes_the_nodes_table() -> None:
    text = PostgresTaskStore.schema_sql("ops")
    assert 'CREATE TABLE IF NOT EXISTS "ops".nodes' in text
    assert 'owner text COLLATE "C" PRIMARY KEY' in text


def test_old_schema_without_nodes_table_gets_it_on_open(postgres_dsn: str, schema: str, admin: Any) -> None:
    _make_old_schema(postgres_dsn, schema, admin)
    assert not _has_nodes(admin, schema)
    store = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        assert _has_nodes(admin, schema), "打开旧 schema 时要补建节点表"
        assert store.get("old-task") is not None, "补建节点表不能动已有的任务"
        store.publish_node(_record("node-a"))
        assert [record.owner for record in store.list_nodes()] == ["node-a"]
    finally:
        store.close()


def test_two_stores_opening_an_old_schema_at_once(postgres_dsn: str, schema: str, admin: Any) -> None:
    """两个节点同时打开旧 schema：补建在咨询锁下进行，谁都不会因并发的 CREATE TABLE 撞车。"""
    import threading

    _make_old_schema(postgres_dsn, schema, admin)
    stores: list[PostgresTaskStore] = []
    errors: list[BaseException] = []
    gate = threading.Barrier(3)

    def open_one() -> None:
        try:
            gate.wait()
            stores.append(PostgresTaskStore(postgres_dsn, schema=schema, max_size=1))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        assert errors == []
        assert len(stores) == 3
        for i, store in enumerate(stores):
            store.publish_node(_record(f"node-{i}"))
        assert [record.owner for record in stores[0].list_nodes()] == ["node-0", "node-1", "node-2"]
    finally:
        for store in stores:
            store.close()


def test_role_without_ddl_on_old_schema_still_runs_tasks_and_explains_membership(
    postgres_dsn: str, schema: str, admin: Any, limited_role: tuple[str, str]
) -> None:
    role, role_dsn = limited_role
    _make_old_schema(postgres_dsn, schema, admin)
    for statement in PostgresTaskStore.grant_sql(schema, role).strip().splitlines():
        admin.execute(statement)

    store = PostgresTaskStore(role_dsn, schema=schema)  # 不能因为补建不了节点表就拒绝连接
    try:
        assert not _has_nodes(admin, schema)
        store.create(snap("new-task"))
        assert store.get("old-task") is not None
        with pytest.raises(StoreError) as caught:
            store.publish_node(_record("node-a"))
        message = str(caught.value)
        assert "nodes" in message and "CREATE TABLE IF NOT EXISTS" in message
        assert "GRANT SELECT, INSERT, UPDATE, DELETE" in message
        with pytest.raises(StoreError, match="nodes"):
            store.list_nodes()
        with pytest.raises(StoreError, match="nodes"):
            store.remove_node("node-a")
    finally:
        store.close()

    # 照报错里的 SQL 补建并授权之后，同一个角色的成员方法就能用了。
    for statement in PostgresTaskStore.schema_sql(schema).split(";\n\n"):
        if "nodes" in statement:
            admin.execute(statement)
    admin.execute(
        sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {}.nodes TO {}").format(
            sql.Identifier(schema), sql.Identifier(role)
        )
    )
    store = PostgresTaskStore(role_dsn, schema=schema)
    try:
        store.publish_node(_record("node-a"))
        assert store.remove_node("node-a") is True
    finally:
        store.close()
