"""没有 DDL 权限的运维角色：表已存在就直接用；表不存在时报错说清缺哪项权限、该执行什么 SQL。"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from psycopg import sql

from chongming_task.core.storage.opening import SchemaPrivilegeError
from chongming_task.errors import StoreError
from chongming_task.states import TaskStatus
from chongming_task.stores.postgres import PostgresTaskStore
from chongming_task.testing.store_contract import snap, step

pytestmark = pytest.mark.postgres


def _grant(admin: Any, schema: str, role: str) -> None:
    for statement in PostgresTaskStore.grant_sql(schema, role).strip().splitlines():
        admin.execute(statement)


def test_role_without_ddl_rights_uses_existing_tables(
    postgres_dsn: str, schema: str, admin: Any, limited_role: tuple[str, str]
) -> None:
    role, role_dsn = limited_role
    PostgresTaskStore(postgres_dsn, schema=schema).close()  # 有权限的账号先建好表
    _grant(admin, schema, role)

    store = PostgresTaskStore(role_dsn, schema=schema)
    try:
        base = snap("ops-1", bucket=3)
        store.create(base)
        queued, record = step(base, TaskStatus.QUEUED)
        store.save(queued, expect_version=0, transitions=[record])
        assert store.touch("ops-1", lease_owner="node-a")
        command = store.submit_command("ops-1", "stop", issuer="ops", reason="只读账号也能下指令")
        (claimed,) = store.claim_commands("node-a", lease=30, buckets=[3])
        assert claimed.command_id == command.command_id
        assert store.complete_command(command.command_id, "node-a")
        assert store.history("ops-1") == [record]
        assert store.stats()[TaskStatus.QUEUED] == 1
        assert store.prune(keep_terminal=0) == 0
    finally:
        store.close()


def test_role_without_ddl_rights_on_empty_schema_gets_a_clear_error(
    postgres_dsn: str, schema: str, admin: Any, limited_role: tuple[str, str]
) -> None:
    role, role_dsn = limited_role
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    admin.execute(
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(schema), sql.Identifier(role))
    )

    with pytest.raises(StoreError) as caught:
        PostgresTaskStore(role_dsn, schema=schema)
    message = str(caught.value)
    assert role in message
    assert "CREATE" in message and "权限" in message
    assert f"schema {schema!r} 上的 CREATE 权限" in message
    assert f'GRANT CREATE ON SCHEMA "{schema}"' in message
    assert "PostgresTaskStore.schema_sql" in message
    # 16.7：建表 SQL 不塞进消息（原先是 4,784 个字符的一行），而在异常的 ddl 属性里；
    # 第一行短，说清缺什么、运行什么。
    assert "CREATE TABLE" not in message
    first = message.splitlines()[0]
    assert len(first) <= 300 and "chongming-task schema-sql" in first
    assert isinstance(caught.value, SchemaPrivilegeError)
    assert f'CREATE TABLE IF NOT EXISTS "{schema}".tasks' in caught.value.ddl, "建表 SQL 要能单独取到"
    assert caught.value.ddl == PostgresTaskStore.schema_sql(schema)
    assert "GRANT SELECT, INSERT, UPDATE, DELETE" in message
    # 失败的尝试不能留下半套表。
    leftover = admin.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = %s", [schema]
    ).fetchone()
    assert leftover == (0,)

    # 照报错里的 SQL 做（有权限的账号建表 + 授权），同一个角色随即就能用。
    admin.execute(PostgresTaskStore.schema_sql(schema))
    _grant(admin, schema, role)
    store = PostgresTaskStore(role_dsn, schema=schema)
    try:
        store.create(snap("after-grant"))
        assert store.get("after-grant") is not None
    finally:
        store.close()


def test_role_without_ddl_rights_and_no_schema_names_the_database_privilege(
    postgres_dsn: str, new_schema: Callable[[], str], limited_role: tuple[str, str]
) -> None:
    _, role_dsn = limited_role
    missing = new_schema()
    with pytest.raises(StoreError) as caught:
        PostgresTaskStore(role_dsn, schema=missing)
    message = str(caught.value)
    assert "数据库 " in message and "上的 CREATE 权限" in message
    assert "GRANT CREATE ON DATABASE" in message
    assert isinstance(caught.value, SchemaPrivilegeError)
    assert f'CREATE SCHEMA IF NOT EXISTS "{missing}"' in (caught.value.ddl or "")


def test_role_without_schema_usage_is_told_to_grant_usage(
    postgres_dsn: str, schema: str, limited_role: tuple[str, str]
) -> None:
    role, role_dsn = limited_role
    PostgresTaskStore(postgres_dsn, schema=schema).close()
    with pytest.raises(StoreError) as caught:
        PostgresTaskStore(role_dsn, schema=schema)
    message = str(caught.value)
    assert "USAGE" in message
    assert f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"' in message
    assert "建表" not in message, "表其实是在的：不能误报成缺建表权限"
