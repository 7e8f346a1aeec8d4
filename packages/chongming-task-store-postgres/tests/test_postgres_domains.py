"""状态与版本列的域类型（issue 17 / 19，pg16）：新库的形状、错误的状态照样被拒绝（同一个 SQLSTATE、同一种
中文报错）、域之前建的库在可写打开时原地换（不重写表、数据与历史不动）、没有属主权限时什么也不改。

为什么是域而不是表上的 CHECK：见 ``_codec.PostgresDialect``；换法见 ``_schema.domain_upgrade_statements``。
"""

from __future__ import annotations

import enum
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg import errors as pg_errors

from chongming_task.errors import StoreError
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.states import TaskStatus as S
from chongming_task.stores.postgres import PostgresTaskStore, _partitions, _schema

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DAY = timedelta(days=1)
STATUSES = ", ".join(f"'{status.value}'" for status in S)


_OURS = "(c.relname = 'tasks' OR c.relname LIKE 'transitions%%')"
_INSERT_TRANSITION = (
    "INSERT INTO {s}.transitions (task_id, version, from_status, to_status, trigger, at, at_off) "
)


class _Bogus(enum.Enum):
    """不是 TaskStatus 的"状态"：编码器只取 ``_value_``，于是它能一路走到数据库，由约束拦下。"""

    WRONG = "bogus"


def _table_checks(admin: Any, schema: str) -> list[tuple[str, str]]:
    """tasks、transitions 及其全部分区上的表级 CHECK 约束（表名, 约束名）。"""
    rows = admin.execute(
        "SELECT c.relname, k.conname FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        f"WHERE n.nspname = %s AND k.contype = 'c' AND {_OURS} ORDER BY 1, 2",
        [schema],
    ).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def _filenodes(admin: Any, schema: str) -> dict[str, int]:
    """有存储的表（tasks 与每个迁移记录分区）的 relfilenode：重写过的表会换一个新的。"""
    rows = admin.execute(
        "SELECT c.relname, c.relfilenode FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        f"WHERE n.nspname = %s AND c.relkind = 'r' AND {_OURS}",
        [schema],
    ).fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


def _history(task_id: str, n: int, start: datetime) -> tuple[TaskSnapshot, list[Transition]]:
    records = [Transition(task_id, S.PENDING, S.QUEUED, "test:queued", "test", None, 1, start)]
    status = S.QUEUED
    for version in range(2, n + 1):
        target = S.RUNNING if status is not S.RUNNING else S.PAUSED
        records.append(
            Transition(task_id, status, target, "test:cycle", "test", None, version, start + version * DAY)
        )
        status = target
    snapshot = TaskSnapshot(task_id=task_id, name="t", created_at=start, status=status, status_version=n)
    return snapshot, records


def _pre_domain(admin: Any, schema: str) -> None:
    """把一个新建的库改回域之前的第 2 版：四列是 text / bigint 加表上的 CHECK（名字与当时的建表语句相同），
    没有域。"""
    s = f'"{schema}"'
    admin.execute(
        f"ALTER TABLE {s}.tasks ALTER COLUMN status TYPE text, ALTER COLUMN status_version TYPE bigint, "
        f"ADD CONSTRAINT tasks_status_check CHECK (status IN ({STATUSES})), "
        "ADD CONSTRAINT tasks_status_version_check CHECK (status_version >= 0)"
    )
    admin.execute(
        f"ALTER TABLE {s}.transitions ALTER COLUMN from_status TYPE text, ALTER COLUMN to_status TYPE text, "
        f"ADD CONSTRAINT transitions_from_status_check CHECK (from_status IN ({STATUSES})), "
        f"ADD CONSTRAINT transitions_to_status_check CHECK (to_status IN ({STATUSES}))"
    )
    admin.execute(f"DROP DOMAIN {s}.task_status, {s}.nonnegative_bigint")


def _assert_refused_by_sql(admin: Any, schema: str) -> None:
    """绕过存储直接写（别的程序、手写 SQL）：四列的错误值都被拒绝，SQLSTATE 23514 check_violation。"""
    s = f'"{schema}"'
    for statement in (
        f"UPDATE {s}.tasks SET status = 'bogus'",
        f"UPDATE {s}.tasks SET status_version = -1",
        f"UPDATE {s}.transitions SET from_status = 'Queued'",
        f"UPDATE {s}.transitions SET to_status = ''",
        _INSERT_TRANSITION.format(s=s) + "VALUES ('x', 1, 'pending', 'nope', 't', '2026-01-05', 0)",
    ):
        with pytest.raises(pg_errors.CheckViolation):
            admin.execute(statement)


def _assert_refused_by_store(store: PostgresTaskStore, task_id: str, existing: str) -> None:
    """经存储写一个错误的状态：与换域之前一样是 StoreError（"PostgreSQL 操作失败……"），原因是
    CheckViolation——调用方看到的异常类型、中文前缀与 SQLSTATE 都不变，只有 PostgreSQL 的原文从
    "new row for relation ... violates check constraint" 变成
    "value for domain ... violates check constraint"。"""
    snapshot = TaskSnapshot(task_id=task_id, name="t", created_at=T0)
    object.__setattr__(snapshot, "status", _Bogus.WRONG)
    with pytest.raises(StoreError, match=r"^PostgreSQL 操作失败（.*task_status_check") as caught:
        store.create(snapshot)
    assert isinstance(caught.value.__cause__, pg_errors.CheckViolation)
    assert store.get(task_id) is None, "整条语句回滚，什么也没写"
    before = store.history(existing)
    record = Transition(existing, S.PENDING, S.QUEUED, "t", None, None, len(before) + 1, T0)
    object.__setattr__(record, "to_status", _Bogus.WRONG)
    with pytest.raises(StoreError, match=r"^PostgreSQL 操作失败（.*task_status_check") as caught:
        store.append([record])
    assert isinstance(caught.value.__cause__, pg_errors.CheckViolation)
    assert store.history(existing) == before


def test_new_schema_types_the_status_columns_with_domains(postgres_dsn: str, schema: str, admin: Any) -> None:
    store = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        with store.pool.connection() as conn:
            assert _schema.untyped_columns(conn, schema) == []
        assert _table_checks(admin, schema) == [], "四列的约束都在域上，tasks / transitions 没有表级 CHECK"
        snapshot, records = _history("ok", 4, T0)
        store.create(snapshot, records)
        _assert_refused_by_sql(admin, schema)
        _assert_refused_by_store(store, "wrong", "ok")
        # 之后按需建的月分区（CREATE TABLE ... PARTITION OF / LIKE ... 再 ATTACH）继承同样的域类型。
        with store.pool.connection() as conn:
            _partitions.ensure_months(conn, schema, T0 + 400 * DAY, T0 + 400 * DAY)
            assert _schema.untyped_columns(conn, schema) == []
        with pytest.raises(pg_errors.CheckViolation):
            admin.execute(
                _INSERT_TRANSITION.format(s=f'"{schema}"') + "VALUES ('x', 1, 'pending', 'nope', 't', %s, 0)",
                [T0 + 400 * DAY],
            )
        assert store.history("ok") == records
    finally:
        store.close()


def test_schema_sql_stays_idempotent(postgres_dsn: str, schema: str, admin: Any) -> None:
    """CREATE DOMAIN 没有 IF NOT EXISTS：DO 块让整个建表脚本照旧可以重复执行。"""
    admin.execute(PostgresTaskStore.schema_sql(schema))
    admin.execute(PostgresTaskStore.schema_sql(schema))
    with PostgresTaskStore(postgres_dsn, schema=schema) as store:
        store.create(TaskSnapshot(task_id="by-hand", name="t", created_at=T0))
        assert store.get("by-hand") is not None


def test_pre_domain_schema_is_converted_in_place_without_rewriting(
    postgres_dsn: str, schema: str, admin: Any
) -> None:
    store = PostgresTaskStore(postgres_dsn, schema=schema)
    expected: dict[str, list[Transition]] = {}
    try:
        with store.pool.connection() as conn:
            _partitions.ensure_months(conn, schema, T0, T0 + 40 * DAY)
        for i in range(6):  # 每个任务 30 条历史，跨 1、2 月分区与 DEFAULT 之外的月份
            snapshot, records = _history(f"old-{i}", 30, T0 + i * DAY)
            store.create(snapshot, records)
            expected[snapshot.task_id] = records
        snapshots = {task_id: store.get(task_id) for task_id in expected}
    finally:
        store.close()
    _pre_domain(admin, schema)
    assert len(_table_checks(admin, schema)) > 4, "旧形状：tasks 两个、transitions 与每个分区各两个"
    before = _filenodes(admin, schema)
    assert {"tasks", "transitions_default", "transitions_p202601", "transitions_p202602"} <= set(before)

    store = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        with store.pool.connection() as conn:
            assert _schema.untyped_columns(conn, schema) == []
        assert _table_checks(admin, schema) == []
        assert _filenodes(admin, schema) == before, "换成无约束的域再加约束：不重写任何表"
        invalid = admin.execute(
            "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND NOT i.indisvalid",
            [schema],
        ).fetchone()[0]
        assert invalid == 0
        for task_id, records in expected.items():
            assert store.history(task_id) == records
            assert store.get(task_id) == snapshots[task_id]
        snapshot, records = _history("new", 3, T0 + 50 * DAY)
        store.create(snapshot, records)
        assert store.history("new") == records
        _assert_refused_by_sql(admin, schema)
        _assert_refused_by_store(store, "wrong", "new")
    finally:
        store.close()
    PostgresTaskStore(postgres_dsn, schema=schema).close()  # 再次打开：已是域，什么也不做
    assert _filenodes(admin, schema) == before


def test_role_without_owner_rights_keeps_the_checks(
    postgres_dsn: str,
    schema: str,
    admin: Any,
    limited_role: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    role, role_dsn = limited_role
    PostgresTaskStore(postgres_dsn, schema=schema).close()
    _pre_domain(admin, schema)
    for statement in PostgresTaskStore.grant_sql(schema, role).strip().splitlines():
        admin.execute(statement)
    checks = _table_checks(admin, schema)
    with caplog.at_level(logging.WARNING, logger="chongming_task.stores.postgres"):
        store = PostgresTaskStore(role_dsn, schema=schema)
    try:
        assert any(
            "换不了域类型" in r.getMessage() and "CREATE DOMAIN" in r.getMessage() for r in caplog.records
        )
        assert _table_checks(admin, schema) == checks, "不是属主：什么也没改，旧的 CHECK 照样保护"
        snapshot, records = _history("ops", 3, T0)
        store.create(snapshot, records)
        assert store.history("ops") == records
        _assert_refused_by_sql(admin, schema)
    finally:
        store.close()
    # 属主执行告警里的语句（或下次以属主打开）之后换好。
    with admin.transaction():
        for statement in _schema.domain_upgrade_statements(schema):
            admin.execute(statement)
    assert _table_checks(admin, schema) == []
    with PostgresTaskStore(role_dsn, schema=schema) as store:
        assert store.history("ops") == records


def test_a_running_store_recovers_when_another_process_converts(
    postgres_dsn: str, schema: str, admin: Any, limited_role: tuple[str, str]
) -> None:
    """一个不是属主的进程开着（没换、告警），之后属主打开把列换成域：前者连接上已预备的读语句结果类型变了。
    它最多失败一次（StoreError，原因是 FeatureNotSupported），连接被丢掉，下一次就好——不会在同一条连接上
    一直失败到连接到龄（psycopg 不把失败的预备语句移出缓存，见 store._discard_if_stale_plans）。"""
    role, role_dsn = limited_role
    PostgresTaskStore(postgres_dsn, schema=schema).close()
    _pre_domain(admin, schema)
    for statement in PostgresTaskStore.grant_sql(schema, role).strip().splitlines():
        admin.execute(statement)
    running = PostgresTaskStore(role_dsn, schema=schema, min_size=1, max_size=1)
    try:
        snapshot, records = _history("live", 3, T0)
        running.create(snapshot, records)
        for _ in range(8):  # 超过 psycopg 的 prepare_threshold：读快照的语句在这条连接上预备好了
            assert running.get("live") == snapshot
        PostgresTaskStore(postgres_dsn, schema=schema).close()  # 属主打开：换成域
        assert _table_checks(admin, schema) == []
        with pytest.raises(StoreError, match="cached plan must not change result type") as caught:
            running.get("live")
        assert isinstance(caught.value.__cause__, pg_errors.FeatureNotSupported)
        assert running.get("live") == snapshot
        assert running.history("live") == records
    finally:
        running.close()


def test_live_old_version_nodes_postpone_the_conversion(
    postgres_dsn: str, schema: str, admin: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """滚动升级：还有没写 feature_level（旧代码）的活节点时，新进程的可写打开不换域类型（换了它们已预备的
    读语句会全部失败），告警点名；它们心跳过期之后，下一次打开再换。新代码的节点与早已过期的记录不拦。"""
    from chongming_task.core.storage.values import NodeRecord
    from chongming_task.core.version import NODE_FEATURE_LEVEL

    now = datetime.now(UTC)

    def node(owner: str, expires: datetime, **info: Any) -> NodeRecord:
        beat = min(now, expires - timedelta(seconds=30))  # 过期的记录：心跳在更早
        return NodeRecord(owner, None, 64, beat, expires, {"hostname": "h", "pid": 1, **info})

    with PostgresTaskStore(postgres_dsn, schema=schema) as store:
        store.publish_node(node("old-a", now + timedelta(hours=1), version="0.1.0"))
        store.publish_node(node("old-b", now + timedelta(hours=1), feature_level="1"))  # 不是数字：不算
        store.publish_node(node("new", now + timedelta(hours=1), feature_level=NODE_FEATURE_LEVEL))
        store.publish_node(node("gone", now - timedelta(minutes=1)))
    _pre_domain(admin, schema)

    with caplog.at_level(logging.WARNING, logger="chongming_task"):
        PostgresTaskStore(postgres_dsn, schema=schema).close()
    untyped = _schema.untyped_columns(admin, schema)
    assert len(untyped) == len(_schema.TYPED_COLUMNS), "有旧节点活着：一列也不换"
    warned = [r.getMessage() for r in caplog.records if "旧版本的节点活着" in r.getMessage()]
    assert len(warned) == 1 and "（old-a, old-b）" in warned[0], warned
    assert "ALTER TABLE" in warned[0]

    with PostgresTaskStore(postgres_dsn, schema=schema) as store:
        for owner in ("old-a", "old-b"):  # 旧进程停掉：心跳不再续，记录过期
            store.publish_node(node(owner, now - timedelta(seconds=1)))
    with PostgresTaskStore(postgres_dsn, schema=schema) as store, store.pool.connection() as conn:
        assert _schema.untyped_columns(conn, schema) == []
