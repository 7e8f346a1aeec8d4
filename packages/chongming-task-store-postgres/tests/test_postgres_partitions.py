"""迁移记录的月度分区（issue 20；存储指南 §9）：新库的布局、整块归档过期分区（DETACH + DROP）、
时钟偏差的行留在线上、第 1 版旧库的原地升级、没有属主权限时的报错与退回逐行删除。"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from chongming_task.core.archive import Archiver, merged_history, verify_archive
from chongming_task.core.storage.opening import SchemaPrivilegeError
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.states import TaskStatus as S
from chongming_task.stores.postgres import PostgresTaskStore, _partitions, _schema

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DAY = timedelta(days=1)
FEB = datetime(2026, 2, 1, tzinfo=UTC)


def _long_lived(task_id: str, times: list[datetime]) -> tuple[TaskSnapshot, list[Transition]]:
    records = [Transition(task_id, S.PENDING, S.QUEUED, "test:queued", "test", None, 1, times[0])]
    status = S.QUEUED
    for version, at in enumerate(times[1:], start=2):
        target = S.RUNNING if status is not S.RUNNING else S.PAUSED
        records.append(Transition(task_id, status, target, "test:cycle", "test", None, version, at))
        status = target
    snapshot = TaskSnapshot(
        task_id=task_id, name="long", created_at=times[0], status=status, status_version=len(records)
    )
    return snapshot, records


def _partition_names(admin: Any, schema: str) -> set[str]:
    rows = admin.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass(%s)",
        [f'"{schema}".transitions'],
    ).fetchall()
    return {r[0] for r in rows}


def _relkind(admin: Any, schema: str, table: str) -> str | None:
    row = admin.execute(
        "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s",
        [schema, table],
    ).fetchone()
    return None if row is None else str(row[0])


def _add_months(store: PostgresTaskStore, first: datetime, last: datetime) -> None:
    with store._connection() as conn:
        _partitions.ensure_months(conn, store.schema, first, last)


def test_new_schema_is_partitioned_by_month_with_a_default(
    postgres_dsn: str, schema: str, admin: Any
) -> None:
    PostgresTaskStore(postgres_dsn, schema=schema).close()
    assert _relkind(admin, schema, "transitions") == "p", "迁移记录表是分区表"
    names = _partition_names(admin, schema)
    now = admin.execute("SELECT now()").fetchone()[0]
    month = _partitions.month_start(now)
    expected = {_partitions.month_name(_partitions.add_months(month, n)) for n in range(3)}
    assert {"transitions_default"} | expected <= names, names
    version = admin.execute(f'SELECT version FROM "{schema}".schema_version').fetchone()[0]
    assert version == 2


def test_expired_partition_is_archived_then_dropped_and_skewed_rows_stay_online(
    postgres_dsn: str, schema: str, admin: Any, tmp_path: Path
) -> None:
    store = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        _add_months(store, T0, T0 + 70 * DAY)
        expected: dict[str, list[Transition]] = {}
        for i in range(12):  # 每天一条，跨 1、2、3 月
            snap, records = _long_lived(f"live-{i:02d}", [T0 + (d + 0.5) * DAY for d in range(60)])
            store.create(snap, records)
            expected[snap.task_id] = records
        # 时钟偏差：v4 落在 2 月（窗口内），v5 却落回 1 月——v5 不属于可归档前缀，必须留在线上。
        skew = [T0 + 3 * DAY, T0 + 4 * DAY, T0 + 5 * DAY, FEB + 4 * DAY, T0 + 20 * DAY, FEB + 9 * DAY]
        snap, records = _long_lived("skewed", skew)
        store.create(snap, records)
        expected["skewed"] = records
        assert store.expired_partitions(FEB) == ["transitions_p202601"]
        # 3 月 1 日为截止：1、2 月两个分区都过期，按从旧到新的顺序整块处理。
        cutoff = datetime(2026, 3, 1, tzinfo=UTC)
        summary = Archiver(store, tmp_path, batch_size=100).run(cutoff)
        assert summary.partitions_dropped == 2
        names = _partition_names(admin, schema)
        assert "transitions_p202601" not in names and "transitions_p202602" not in names
        assert _relkind(admin, schema, "transitions_p202601") is None, "DROP 掉了，不是只 DETACH"
        verify_archive(tmp_path)
        for task_id, records in expected.items():
            assert merged_history(store, task_id, tmp_path) == records, task_id
        assert all(r.at >= cutoff for r in store.history("live-00"))
        # skewed 的全部记录都早于 3 月 1 日：v1..v6 都在前缀里，全部归档。
        assert store.history("skewed") == []
        assert store.export_transitions(cutoff) == []
    finally:
        store.close()


def test_rows_out_of_prefix_are_moved_back_before_the_drop(
    postgres_dsn: str, schema: str, tmp_path: Path
) -> None:
    store = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        _add_months(store, T0, T0 + 40 * DAY)
        skew = [T0 + 3 * DAY, T0 + 4 * DAY, T0 + 5 * DAY, FEB + 4 * DAY, T0 + 20 * DAY, FEB + 9 * DAY]
        snap, records = _long_lived("skewed", skew)
        store.create(snap, records)
        summary = Archiver(store, tmp_path, batch_size=2).run(FEB)
        assert summary.partitions_dropped == 1 and summary.transitions == 3
        online = store.history("skewed")
        assert [r.version for r in online] == [4, 5, 6], "v5 的时间早于截止时刻，但前缀在 v4 断了"
        assert merged_history(store, "skewed", tmp_path) == records
        assert store.export_transitions(FEB) == []
    finally:
        store.close()


_V1_TRANSITIONS = """CREATE TABLE {s}.transitions (
    task_id text COLLATE "C" NOT NULL,
    version bigint NOT NULL,
    from_status text NOT NULL CHECK (from_status IN ({statuses})),
    to_status text NOT NULL CHECK (to_status IN ({statuses})),
    trigger text NOT NULL,
    actor text,
    reason text,
    at timestamptz NOT NULL,
    at_off bigint NOT NULL,
    PRIMARY KEY (task_id, version)
)"""


def pre_domain_tasks(admin: Any, schema: str) -> None:
    """把 tasks 的状态与版本列改回域之前（第 1 版起直到第十六轮）的样子：text / bigint 加表上的 CHECK，
    名字是当时自动得到的 tasks_status_check / tasks_status_version_check。"""
    s = f'"{schema}"'
    statuses = ", ".join(f"'{status.value}'" for status in S)
    admin.execute(
        f"ALTER TABLE {s}.tasks ALTER COLUMN status TYPE text, ALTER COLUMN status_version TYPE bigint, "
        f"ADD CONSTRAINT tasks_status_check CHECK (status IN ({statuses})), "
        "ADD CONSTRAINT tasks_status_version_check CHECK (status_version >= 0)"
    )


def drop_domains(admin: Any, schema: str) -> None:
    admin.execute(f'DROP DOMAIN "{schema}".task_status, "{schema}".nonnegative_bigint')


def _make_v1(admin: Any, postgres_dsn: str, schema: str) -> dict[str, list[Transition]]:
    """按第 1 版的布局（迁移记录是普通表，状态列是带 CHECK 的 text、没有域）造一个带数据的旧库。"""
    store = PostgresTaskStore(postgres_dsn, schema=schema)
    expected: dict[str, list[Transition]] = {}
    try:
        for i in range(5):
            snap, records = _long_lived(f"old-{i}", [T0 + d * DAY for d in range(30)])
            store.create(snap, records)
            expected[snap.task_id] = records
    finally:
        store.close()
    s = f'"{schema}"'
    statuses = ", ".join(f"'{status.value}'" for status in S)
    admin.execute(f"CREATE TABLE {s}.saved AS SELECT * FROM {s}.transitions")
    admin.execute(f"DROP TABLE {s}.transitions")
    admin.execute(_V1_TRANSITIONS.format(s=s, statuses=statuses))
    admin.execute(f"INSERT INTO {s}.transitions SELECT * FROM {s}.saved")
    admin.execute(f"DROP TABLE {s}.saved")
    pre_domain_tasks(admin, schema)
    drop_domains(admin, schema)
    admin.execute(f"UPDATE {s}.schema_version SET version = 1")
    return expected


def test_version_1_schema_is_migrated_in_place_keeping_its_rows(
    postgres_dsn: str, schema: str, admin: Any, tmp_path: Path
) -> None:
    expected = _make_v1(admin, postgres_dsn, schema)
    assert _relkind(admin, schema, "transitions") == "r"
    store = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        assert _relkind(admin, schema, "transitions") == "p"
        assert "transitions_v1" in _partition_names(admin, schema), "旧表整张挂成一个分区"
        assert admin.execute(f'SELECT version FROM "{schema}".schema_version').fetchone()[0] == 2
        # 状态列在挂上之前换成了域（分区的列类型必须与分区表相同），旧表上的 CHECK 随之删掉。
        with store.pool.connection() as conn:
            assert _schema.untyped_columns(conn, schema) == []
        checks = admin.execute(
            "SELECT count(*) FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND k.contype = 'c' "
            "AND c.relname IN ('tasks', 'transitions', 'transitions_v1')",
            [schema],
        ).fetchone()[0]
        assert checks == 0
        assert [store.get(task_id).status_version for task_id in expected] == [30] * 5  # type: ignore[union-attr]
        for task_id, records in expected.items():
            assert store.history(task_id) == records
        with pytest.raises(psycopg.errors.CheckViolation):  # 挂上的旧分区照样拒绝错误的状态
            admin.execute(f'UPDATE "{schema}".transitions_v1 SET to_status = %s', ["bogus"])
        # 旧分区里的行照样能写、能按 (task_id, version) 幂等追加、能归档。
        store.append([expected["old-0"][0]])
        assert store.history("old-0") == expected["old-0"]
        Archiver(store, tmp_path, batch_size=40).run(T0 + 10 * DAY)
        for task_id, records in expected.items():
            assert merged_history(store, task_id, tmp_path) == records
            assert store.history(task_id)[0].version == 11
    finally:
        store.close()
    PostgresTaskStore(postgres_dsn, schema=schema).close()  # 再次打开：已是第 2 版，什么也不做


def _grant(admin: Any, schema: str, role: str) -> None:
    for statement in PostgresTaskStore.grant_sql(schema, role).strip().splitlines():
        admin.execute(statement)


def test_role_without_ddl_rights_on_a_version_1_schema_is_told_what_to_run(
    postgres_dsn: str, schema: str, admin: Any, limited_role: tuple[str, str]
) -> None:
    role, role_dsn = limited_role
    _make_v1(admin, postgres_dsn, schema)
    _grant(admin, schema, role)
    with pytest.raises(SchemaPrivilegeError) as caught:
        PostgresTaskStore(role_dsn, schema=schema)
    message = str(caught.value)
    assert "第 1 版" in message and "schema-sql --migrate-from 1" in message and role in message
    assert caught.value.ddl == PostgresTaskStore.migration_sql(schema, 1)
    assert _relkind(admin, schema, "transitions") == "r", "没有权限：什么也没改"
    # 只读打开照样能读第 1 版的库（读语句两版通用）。
    with PostgresTaskStore(role_dsn, schema=schema, readonly=True) as reader:
        assert len(reader.history("old-0")) == 30
    # 属主执行打印出来的 SQL 之后，运维角色就能正常打开。
    admin.execute(PostgresTaskStore.migration_sql(schema, 1))
    PostgresTaskStore(role_dsn, schema=schema).close()
    assert _relkind(admin, schema, "transitions") == "p"


def test_role_without_ddl_rights_archives_by_rows_instead_of_dropping(
    postgres_dsn: str, schema: str, admin: Any, limited_role: tuple[str, str], tmp_path: Path
) -> None:
    role, role_dsn = limited_role
    owner = PostgresTaskStore(postgres_dsn, schema=schema)
    _add_months(owner, T0, T0 + 40 * DAY)
    owner.close()
    _grant(admin, schema, role)
    store = PostgresTaskStore(role_dsn, schema=schema)
    try:
        snap, records = _long_lived("ops", [T0 + d * DAY for d in range(40)])
        store.create(snap, records)
        summary = Archiver(store, tmp_path, batch_size=7).run(FEB)
        assert summary.partitions_dropped == 0, "不是属主，不能 DETACH / DROP"
        assert "transitions_p202601" in _partition_names(admin, schema)
        assert store.history("ops")[0].version == 32
        assert merged_history(store, "ops", tmp_path) == records
        verify_archive(tmp_path)
    finally:
        store.close()
