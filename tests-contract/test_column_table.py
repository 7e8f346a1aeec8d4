"""列表 ``chongming_task.core.storage.columns`` 是快照持久化的唯一出处：证明它与模型、两个 SQL 方言一致。

* 列表与 ``dataclasses.fields(TaskSnapshot)`` 恰好是同一组字段（不多、不少、不重复）；
* SQLite 与 PostgreSQL 的 tasks 建表语句包含列表的每一列（及方言附加的排序键 / 偏移列）；
* 由列表推导出的建表语句与第 1 版发布时手写的逐字相同——已有的数据库照常打开；
* 旁路字段、save 写的列都由列表推导，save 的列清单里没有任何旁路列。
"""

from __future__ import annotations

import dataclasses
import os
import re
from datetime import UTC, datetime, timedelta

import pytest

from chongming_task.core.storage.columns import SIDE_CHANNEL_FIELDS, TASK_COLUMNS, Kind
from chongming_task.models import Failure, Progress, TaskSnapshot, Transition
from chongming_task.states import TaskStatus
from chongming_task.storage import SIDE_CHANNEL_FIELDS as LEGACY_SIDE_CHANNEL_FIELDS
from chongming_task.stores.sqlite import _codec as sqlite_codec
from chongming_task.stores.sqlite import _schema as sqlite_schema


def test_column_table_matches_the_snapshot_dataclass_exactly() -> None:
    names = [column.name for column in TASK_COLUMNS]
    assert len(names) == len(set(names)), "列表里有重复的列"
    assert set(names) == {f.name for f in dataclasses.fields(TaskSnapshot)}
    assert (
        LEGACY_SIDE_CHANNEL_FIELDS
        == SIDE_CHANNEL_FIELDS
        == {
            "progress",
            "last_heartbeat_at",
            "lease_owner",
            "lease_until",
        }
    )


def _ddl_columns(ddl: str, later: list[str] | tuple[str, ...] = ()) -> list[str]:
    """建表语句里的列，再加上后补列的 ``ALTER TABLE ... ADD COLUMN [IF NOT EXISTS] <列>``（按执行顺序）。"""
    body = ddl[ddl.index("(") + 1 : ddl.rindex(")")]
    columns = [line.split()[0] for line in body.strip().splitlines()]
    for statement in later:
        if statement.startswith("ALTER TABLE") and " ADD COLUMN " in statement:
            columns.append(statement.split(" ADD COLUMN ", 1)[1].removeprefix("IF NOT EXISTS ").split()[0])
    return columns


def test_later_columns_are_not_in_the_released_create_table() -> None:
    # 后补的列（配方）不进第 1 版的 CREATE TABLE：已发布的建表语句逐字不变，列由 ALTER TABLE 补。
    later = [c.name for c in TASK_COLUMNS if c.added_later]
    assert later == ["recipe"]
    assert list(sqlite_schema.LATER_TASK_COLUMNS) == later


def test_sqlite_ddl_contains_every_column() -> None:
    (ddl,) = [s for s in sqlite_schema._DDL_V1 if "CREATE TABLE IF NOT EXISTS tasks" in s]
    columns = _ddl_columns(ddl, sqlite_schema._ADD_LATER_COLUMNS)
    for column in TASK_COLUMNS:
        assert column.name in columns, f"SQLite 的 tasks 表缺列 {column.name}"
        if column.kind is Kind.TIMESTAMP and column.sort_key:
            assert column.sort_key in columns
    assert tuple(columns) == sqlite_schema.TASK_COLUMNS
    assert not set(sqlite_schema.SAVE_COLUMNS) & sqlite_schema.SIDE_CHANNEL_COLUMNS


def test_sqlite_ddl_is_byte_identical_to_the_released_schema() -> None:
    # 第 1 版发布时手写的建表语句（sqlite_master 里存的就是它）：推导结果必须逐字相同。
    released = [
        ("task_id", "TEXT PRIMARY KEY NOT NULL"), ("name", "TEXT NOT NULL"), ("label", "TEXT"),
        ("status", "TEXT NOT NULL"), ("status_version", "INTEGER NOT NULL"), ("attempt", "INTEGER NOT NULL"),
        ("max_attempts", "INTEGER NOT NULL"), ("created_at", "TEXT NOT NULL"),
        ("created_key", "INTEGER NOT NULL"), ("queued_at", "TEXT"), ("started_at", "TEXT"),
        ("finished_at", "TEXT"), ("finished_key", "INTEGER"), ("last_heartbeat_at", "TEXT"),
        ("progress", "TEXT"), ("failure", "TEXT"), ("outcome", "TEXT NOT NULL"), ("tags", "TEXT NOT NULL"),
        ("priority", "INTEGER NOT NULL"), ("bucket", "INTEGER"), ("bucket_key", "TEXT"), ("executor", "TEXT"),
        ("pid", "INTEGER"), ("owner", "TEXT"), ("lease_owner", "TEXT"), ("lease_until", "TEXT"),
        ("lease_key", "INTEGER"), ("pipeline_id", "TEXT"), ("node_id", "TEXT"), ("retry_at", "TEXT"),
        ("description", "TEXT"),
    ]  # fmt: skip
    body = ",\n".join(f"        {name.ljust(17)} {kind}" for name, kind in released)
    expected = f"\n    CREATE TABLE IF NOT EXISTS tasks (\n{body}\n    )\n    "
    assert expected in sqlite_schema._DDL_V1
    assert sqlite_codec.SNAPSHOTS.names == (
        *(name for name, _ in released),
        *sqlite_schema.LATER_TASK_COLUMNS,
    )


postgres = pytest.importorskip("chongming_task.stores.postgres._schema", reason="没有安装 psycopg")


def test_postgres_ddl_contains_every_column() -> None:
    from chongming_task.stores.postgres import _codec as pg_codec

    statements = postgres.ddl_statements("s")
    (ddl,) = [s for s in statements if 'CREATE TABLE IF NOT EXISTS "s".tasks' in s]
    columns = _ddl_columns(ddl, statements)
    for column in TASK_COLUMNS:
        assert column.name in columns, f"PostgreSQL 的 tasks 表缺列 {column.name}"
        if column.kind is Kind.TIMESTAMP:
            assert column.name + "_off" in columns
    assert tuple(columns) == pg_codec.TASK_COLUMNS
    assert not set(pg_codec.SAVE_COLUMNS) & pg_codec.SIDE_CHANNEL_COLUMNS
    assert re.search(r'task_id text COLLATE "C" PRIMARY KEY', ddl)
    # 状态与版本列是 schema 里带约束的域（约束在域上，不在表上：见 _codec.PostgresDialect）。
    assert 'status "s".task_status NOT NULL,' in ddl
    assert 'status_version "s".nonnegative_bigint NOT NULL,' in ddl
    assert "CHECK" not in ddl, "tasks 上不再有表级 CHECK 约束"
    assert "tags text[] NOT NULL DEFAULT '{}'" in ddl
    assert "bucket integer," in ddl


@pytest.mark.skipif(not os.environ.get("CHONGMING_TEST_POSTGRES"), reason="需要 CHONGMING_TEST_POSTGRES")
def test_postgres_table_has_exactly_the_derived_columns(tmp_path: object) -> None:
    import uuid

    from chongming_task.stores.postgres import PostgresTaskStore
    from chongming_task.stores.postgres import _codec as pg_codec

    schema = "cols_" + uuid.uuid4().hex[:12]
    store = PostgresTaskStore(os.environ["CHONGMING_TEST_POSTGRES"], schema=schema)
    try:
        with store.pool.connection() as conn:
            rows = conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = %s AND table_name = 'tasks' ORDER BY ordinal_position",
                [schema],
            ).fetchall()
            assert tuple(r[0] for r in rows) == pg_codec.TASK_COLUMNS
    finally:
        with store.pool.connection() as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        store.close()


def _sample_records() -> tuple[datetime, TaskSnapshot, TaskSnapshot, Transition]:
    """两个用例共用的样本：一个全默认的快照、一个每个可选字段都有值的快照、一条迁移记录。"""
    at = datetime(2026, 12, 1, 8, 30, 15, 123456, tzinfo=UTC)
    plain = TaskSnapshot(task_id="p-1", name="plain", created_at=at)
    rich = dataclasses.replace(
        plain,
        task_id="p-2",
        status=TaskStatus.FAILED,
        status_version=3,
        tags=frozenset({"b", "a"}),
        bucket=7,
        owner="node-a",
        lease_owner="node-a",
        lease_until=at + timedelta(seconds=30),
        finished_at=at + timedelta(seconds=5),
        progress=Progress(done=3, total=10, unit="行"),
        failure=Failure.from_exception(ValueError("坏了")),
        outcome={"n": [1, 2]},
    )
    record = Transition(
        task_id="p-2",
        from_status=TaskStatus.RUNNING,
        to_status=TaskStatus.FAILED,
        trigger="t",
        actor=None,
        reason="r",
        version=3,
        at=at,
    )
    return at, plain, rich, record


def test_compiled_row_params_match_the_plan_for_every_codec() -> None:
    """``RowCodec.params`` 是由编码计划编译出的函数：对每个后端的每张表，它与逐列解释执行的参照版逐键、
    按序相同——无论列值是 None（走预先算好的常量）、有值、还是多物理列（时间戳的两列）。"""
    from chongming_task.stores.postgres import _codec as pg_codec

    _, plain, rich, record = _sample_records()
    for module in (sqlite_codec, pg_codec):
        for codec, values in ((module.SNAPSHOTS, (plain, rich)), (module.TRANSITIONS, (record,))):
            for value in values:
                compiled, reference = codec.params(value), codec.params_by_plan(value)
                assert list(compiled.items()) == list(reference.items()), (module.__name__, value)
                assert tuple(compiled) == codec.names, "键序即列序：SQLite 的 INSERT 按位置绑定 values()"


def test_compiled_save_params_match_the_plan_for_every_backend() -> None:
    """``SnapshotCodec.save_params``（save 写的那些列）同样由计划编译：与解释执行的参照版逐键、按序相同，
    键正好是 ``save_columns``（旁路列与配方不在里面）。"""
    from chongming_task.stores.postgres import _codec as pg_codec

    _, plain, rich, _ = _sample_records()
    for module in (sqlite_codec, pg_codec):
        codec = module.SNAPSHOTS
        for value in (plain, rich):
            compiled, reference = codec.save_params(value), codec.save_params_by_plan(value)
            assert list(compiled.items()) == list(reference.items()), (module.__name__, value)
            assert tuple(compiled) == codec.save_columns, module.__name__


def test_values_like_matches_params_whatever_the_previous_record() -> None:
    """``RowCodec.values_like``（create_many 照抄上一行里同一对象字段的编码）与
    ``tuple(params(记录).values())`` 逐项相同：上一条与这一条共用一部分字段对象、全不共用、互为 None 与有值，
    时间戳的两列各自照抄或重算——每个后端的快照表与迁移表都对照。"""
    from chongming_task.stores.postgres import _codec as pg_codec

    at, plain, rich, first = _sample_records()
    sibling = dataclasses.replace(plain, task_id="p-3", created_at=at + timedelta(seconds=1))
    rich_sibling = dataclasses.replace(rich, task_id="p-4", lease_until=None, outcome=None)
    second = dataclasses.replace(first, task_id="p-4", actor="node-b", at=at + timedelta(seconds=2))
    for module in (sqlite_codec, pg_codec):
        for codec, values in (
            (module.SNAPSHOTS, (plain, sibling, rich, rich_sibling, plain)),
            (module.TRANSITIONS, (first, second, first)),
        ):
            for previous in values:
                previous_row = tuple(codec.params(previous).values())
                for value in values:
                    expected = tuple(codec.params(value).values())
                    assert codec.values_like(value, previous, previous_row) == expected, (
                        module.__name__,
                        previous,
                        value,
                    )


def test_values_and_save_values_are_the_params_without_the_dict() -> None:
    """``RowCodec.values`` / ``SnapshotCodec.save_values``（按位置的一行，不经字典）与
    ``tuple(params(...).values())`` / ``tuple(save_params(...).values())`` 逐项相同；``save_from_row`` 从整行
    取出的正是 save 的那一行（新任务第一次 save 的提示由 create 的行得来）。每个后端都对照。"""
    from chongming_task.stores.postgres import _codec as pg_codec

    _, plain, rich, record = _sample_records()
    for module in (sqlite_codec, pg_codec):
        snapshots = module.SNAPSHOTS
        for value in (plain, rich):
            assert snapshots.values(value) == tuple(snapshots.params(value).values()), module.__name__
            assert snapshots.save_values(value) == tuple(snapshots.save_params(value).values())
            assert snapshots.save_from_row(snapshots.values(value)) == snapshots.save_values(value)
        transitions = module.TRANSITIONS
        assert transitions.values(record) == tuple(transitions.params(record).values()), module.__name__


def test_save_values_since_matches_save_params_whatever_the_previous_record() -> None:
    """``save_values_since``（跨调用的提示，见 SQLite 存储的 ``_RowHints``）与整份编码逐项相同：上一版与
    这一版共用一部分字段对象、全不共用、互为 None 与有值——每个后端都对照。"""
    from chongming_task.stores.postgres import _codec as pg_codec

    at, plain, rich, _ = _sample_records()
    sibling = dataclasses.replace(plain, task_id="p-3", created_at=at + timedelta(seconds=1))
    rich_next = rich.evolve(status=TaskStatus.RUNNING, status_version=4, executor="thread", outcome=None)
    for module in (sqlite_codec, pg_codec):
        snapshots = module.SNAPSHOTS
        values = (plain, sibling, rich, rich_next, plain)
        for previous in values:
            save_row = snapshots.save_values(previous)
            for value in values:
                assert snapshots.save_values_since(value, previous, save_row) == snapshots.save_values(value)


def test_save_values_since_reencodes_values_mutated_in_place() -> None:
    """跨调用的提示只照抄不可变的值：同一个 outcome 字典、同一个可变的标签集合在两次写之间被就地改过，
    ``save_values_since`` 照样重新编码（结果是改过之后的值），也照样重新检查（改成存不下的值就报
    ConfigurationError）。``values_like``（只用于同一次调用里的一批）则照抄——这正是两者的分工。"""
    from chongming_task.errors import ConfigurationError
    from chongming_task.stores.postgres import _codec as pg_codec

    _, plain, _, _ = _sample_records()
    for module in (sqlite_codec, pg_codec):
        snapshots = module.SNAPSHOTS
        outcome: dict[str, object] = {"n": 1}
        tags = {"a"}
        snapshot = plain.evolve(outcome=outcome, tags=tags)  # evolve 不校验：可变的 set 也进得来
        row, save_row = snapshots.values(snapshot), snapshots.save_values(snapshot)
        outcome["n"] = 2
        tags.add("b")
        fresh = snapshots.save_values(snapshot)
        assert fresh != save_row
        assert snapshots.save_values_since(snapshot, snapshot, save_row) == fresh, "改过的值不能照抄旧编码"
        assert snapshots.values_like(snapshot, snapshot, row) == row  # 同一批里的照抄（对照）
        outcome["bad"] = float("nan")
        with pytest.raises(ConfigurationError):
            snapshots.save_values_since(snapshot, snapshot, save_row)
