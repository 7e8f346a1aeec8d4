"""SqliteTaskStore 特有的行为：表结构版本、坏文件、WAL、连接串、怪字符串、锁等待与重试、索引。

通用语义由 tests-contract/ 里的 StoreContract 覆盖；这里只测 SQLite 后端自己的承诺。
"""

from __future__ import annotations

import io
import sqlite3
import threading
import time
import unittest
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chongming_task.errors import ConcurrencyConflict, ConfigurationError, StoreError
from chongming_task.models import Failure, FailureKind, Progress, TaskSnapshot, Transition
from chongming_task.states import NON_TERMINAL_STATUSES, TaskStatus
from chongming_task.storage import QueryOrder, SaveRequest, TaskQuery
from chongming_task.stores.sqlite import SqliteTaskStore, parse_url
from chongming_task.stores.sqlite import _schema as _schema_module
from chongming_task.stores.sqlite.codec import prefix_upper_bound
from chongming_task.stores.sqlite.schema import SCHEMA_VERSION
from chongming_task.testing import FakeClock

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


def snap(task_id: str, **fields: object) -> TaskSnapshot:
    values: dict[str, object] = {"name": "job", "created_at": T0}
    values.update(fields)
    return TaskSnapshot(task_id=task_id, **values)  # type: ignore[arg-type]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "tasks.db"


# -- schema ---------------------------------------------------------------------------------------


def test_schema_is_created_and_versioned(db: Path) -> None:
    SqliteTaskStore(db).close()
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    raw.close()
    assert {"schema_version", "tasks", "transitions", "task_tags", "commands"} <= tables


def _page_size(db: Path) -> int:
    raw = sqlite3.connect(db)
    try:
        return int(raw.execute("PRAGMA page_size").fetchone()[0])
    finally:
        raw.close()


def test_new_files_use_small_pages_and_existing_files_keep_theirs(db: Path, tmp_path: Path) -> None:
    """新文件按 NEW_FILE_PAGE_SIZE 建库（每次提交写进 WAL 的字节约减半，见 _schema）；已有的文件——本包以前建的
    4096 字节页的库、别的应用的库——保持原来的页大小照常读写，只读打开一个字节都不改。"""
    with SqliteTaskStore(db) as store:
        store.create(snap("new"))
    assert _page_size(db) == _schema_module.NEW_FILE_PAGE_SIZE == 2048
    # 以前建的文件：4096 字节的页（SQLite 的默认）。
    old = tmp_path / "old.db"
    raw = sqlite3.connect(old)
    raw.execute("PRAGMA page_size = 4096")
    raw.execute("PRAGMA auto_vacuum = INCREMENTAL")
    raw.executescript(SqliteTaskStore.schema_sql())
    raw.close()
    assert _page_size(old) == 4096
    with SqliteTaskStore(old, readonly=True) as readonly:
        assert readonly.query() == []
    with SqliteTaskStore(old) as store:
        store.create(snap("kept"))
        assert store.get("kept") is not None
    assert _page_size(old) == 4096
    # 别的应用的库（create_schema="always" 把表建进去）：它的页大小也不动。
    foreign = tmp_path / "foreign.db"
    raw = sqlite3.connect(foreign)
    raw.execute("PRAGMA page_size = 8192")
    raw.execute("CREATE TABLE theirs (x INTEGER)")
    raw.close()
    with SqliteTaskStore(foreign, create_schema="always") as store:
        store.create(snap("mixed"))
    assert _page_size(foreign) == 8192


def test_reopening_keeps_data_and_does_not_duplicate_version_row(db: Path) -> None:
    with SqliteTaskStore(db) as store:
        store.create(snap("kept"))
    with SqliteTaskStore(db) as store:
        assert store.get("kept") is not None
    raw = sqlite3.connect(db)
    try:
        assert raw.execute("SELECT count(*) FROM schema_version").fetchone() == (1,)
    finally:
        raw.close()


def _task_indexes(db: Path) -> dict[str, str]:
    raw = sqlite3.connect(db)
    try:
        rows = raw.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'tasks'")
        return {str(name): str(sql) for name, sql in rows.fetchall() if sql is not None}
    finally:
        raw.close()


def test_old_full_indexes_become_partial_on_writable_open_and_unused_ones_are_dropped(db: Path) -> None:
    with SqliteTaskStore(db) as store:
        store.create(snap("plain"))
        store.create(snap("bucketed", bucket=3, pipeline_id="p1"))
    assert "tasks_by_lease" not in _task_indexes(db)  # 新库不再建它（见 _schema._DROPPED_INDEXES）
    # 第 1 版最初的形状：桶号、流水线 id 上是全量索引，另有 finished_key、lease_key 上的索引。
    raw = sqlite3.connect(db)
    with raw:
        raw.execute("DROP INDEX tasks_by_bucket")
        raw.execute("DROP INDEX tasks_by_pipeline")
        raw.execute("CREATE INDEX tasks_by_bucket ON tasks (bucket, created_key, task_id)")
        raw.execute("CREATE INDEX tasks_by_pipeline ON tasks (pipeline_id, created_key, task_id)")
        raw.execute("CREATE INDEX tasks_by_finished ON tasks (finished_key)")
        raw.execute("CREATE INDEX tasks_by_lease ON tasks (lease_key)")
    raw.close()
    old = _task_indexes(db)
    with SqliteTaskStore(db, readonly=True) as readonly:  # 只读打开一个字节都不改，照常能查
        assert [s.task_id for s in readonly.query(TaskQuery(bucket=3))] == ["bucketed"]
        assert len(readonly.query(TaskQuery(lease_expired_before=T0 + timedelta(days=365)))) == 2
    assert _task_indexes(db) == old
    with SqliteTaskStore(db) as store:
        assert [s.task_id for s in store.query(TaskQuery(bucket=3))] == ["bucketed"]
        assert [s.task_id for s in store.query(TaskQuery(pipeline_id="p1"))] == ["bucketed"]
        assert store.bucket_counts() == {3: 1}
    upgraded = _task_indexes(db)
    assert "tasks_by_finished" not in upgraded
    assert "tasks_by_lease" not in upgraded
    assert "WHERE bucket IS NOT NULL" in upgraded["tasks_by_bucket"]
    assert "WHERE pipeline_id IS NOT NULL" in upgraded["tasks_by_pipeline"]
    raw = sqlite3.connect(db)
    try:
        assert raw.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
        assert raw.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        # 部分索引只收非 NULL 的行。
        assert raw.execute(
            "SELECT count(*) FROM tasks INDEXED BY tasks_by_bucket WHERE bucket = 3"
        ).fetchone() == (1,)
    finally:
        raw.close()
    # 再打开一次：已是新形状，不再改动。
    SqliteTaskStore(db).close()
    assert _task_indexes(db) == upgraded


def test_save_compares_exactly_the_columns_some_index_uses(db: Path) -> None:
    """save 只对被索引的列先比较再 SET（其余列照写）：这份清单必须与库里真实的索引一致，漏一列就会让
    每次 save 白白维护那个索引，多一列只是多比较一次。"""
    from chongming_task.stores.sqlite import _schema

    SqliteTaskStore(db).close()
    raw = sqlite3.connect(db)
    try:
        used: set[str] = set()
        for name, sql in raw.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'tasks'"
        ):
            used.update(str(row[2]) for row in raw.execute(f"PRAGMA index_info({name})"))
            where = str(sql).split(" WHERE ", 1)[1] if sql and " WHERE " in sql else ""
            used.update(
                c for c in _schema.SAVE_COLUMNS if c in where.replace("(", " ").replace(")", " ").split()
            )
    finally:
        raw.close()
    assert set(_schema.INDEXED_SAVE_COLUMNS) == used & set(_schema.SAVE_COLUMNS)
    assert set(_schema.PLAIN_SAVE_COLUMNS) == set(_schema.SAVE_COLUMNS) - used


def test_newer_schema_version_is_refused_with_upgrade_hint(db: Path) -> None:
    SqliteTaskStore(db).close()
    raw = sqlite3.connect(db)
    with raw:
        raw.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 7,))
    raw.close()
    with pytest.raises(StoreError) as caught:
        SqliteTaskStore(db)
    message = str(caught.value)
    assert str(SCHEMA_VERSION + 7) in message
    assert str(SCHEMA_VERSION) in message
    assert "升级" in message and "chongming-task-store-sqlite" in message


def test_file_that_is_not_a_database_gives_a_clear_error(db: Path) -> None:
    db.write_bytes(b"this is a text file, definitely not SQLite\n" * 200)
    with pytest.raises(StoreError) as caught:
        SqliteTaskStore(db)
    assert "不是 SQLite 数据库" in str(caught.value)
    assert str(db) in str(caught.value)
    assert isinstance(caught.value.__cause__, sqlite3.DatabaseError)


def test_missing_directory_gives_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError) as caught:
        SqliteTaskStore(tmp_path / "no" / "such" / "dir" / "tasks.db")
    assert "无法打开" in str(caught.value)


def test_wal_mode_is_on_for_files(db: Path) -> None:
    store = SqliteTaskStore(db)
    try:
        raw = sqlite3.connect(db)
        try:
            assert raw.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal"
        finally:
            raw.close()
    finally:
        store.close()


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), True, "30"])
def test_bad_busy_timeout_is_rejected(db: Path, bad: object) -> None:
    with pytest.raises(ConfigurationError, match="busy_timeout"):
        SqliteTaskStore(db, busy_timeout=bad)  # type: ignore[arg-type]


def test_synchronous_is_validated_and_applied(db: Path) -> None:
    with pytest.raises(ConfigurationError, match="synchronous"):
        SqliteTaskStore(db, synchronous="sometimes")
    store = SqliteTaskStore(db, synchronous="full")
    try:
        mode = store._run("probe", lambda conn: conn.execute("PRAGMA synchronous").fetchone()[0], "none")
        assert mode == 2  # FULL
    finally:
        store.close()


# -- from_url -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///abs/path/tasks.db", "/abs/path/tasks.db"),
        ("sqlite:relative.db", "relative.db"),
        ("sqlite:sub/dir/relative.db", "sub/dir/relative.db"),
        ("SQLite:///x.db", "/x.db"),
        ("sqlite:///:memory:", ":memory:"),
        ("sqlite://:memory:", ":memory:"),
        ("sqlite::memory:", ":memory:"),
    ],
)
def test_parse_url_forms(url: str, path: str) -> None:
    assert parse_url(url) == path


@pytest.mark.parametrize(
    "url", ["sqlite:", "sqlite:///", "sqlite://host/tasks.db", "postgresql://x/y", "tasks.db"]
)
def test_parse_url_rejects_unusable_forms(url: str) -> None:
    with pytest.raises(ConfigurationError, match="sqlite"):
        parse_url(url)


def test_from_url_opens_the_file_and_passes_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    clock = FakeClock()
    with SqliteTaskStore.from_url("sqlite:relative.db", clock=clock, busy_timeout=5) as store:
        assert isinstance(store, SqliteTaskStore)
        assert store.clock is clock
        store.create(snap("rel"))
    assert (tmp_path / "relative.db").exists()
    with SqliteTaskStore.from_url(f"sqlite://{tmp_path / 'relative.db'}") as store:
        assert store.get("rel") is not None


def test_from_url_rejects_unknown_options() -> None:
    with pytest.raises(ConfigurationError, match="busy_timeout"):
        SqliteTaskStore.from_url("sqlite:///:memory:", timeout=3)


def test_memory_urls_give_independent_stores() -> None:
    first = SqliteTaskStore.from_url("sqlite:///:memory:")
    second = SqliteTaskStore.from_url("sqlite://:memory:")
    try:
        first.create(snap("only-first"))
        assert second.get("only-first") is None
    finally:
        first.close()
        second.close()


def test_memory_store_is_shared_by_all_threads() -> None:
    store = SqliteTaskStore(":memory:")
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(50):
                store.create(snap(f"t{n}-{i}"))
        except BaseException as exc:  # pragma: no cover - 失败时带回主线程
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == []
        assert len(store.query()) == 200
    finally:
        store.close()


# -- odd strings and values -----------------------------------------------------------------------


ODD = "制表\t换行\n引号'\"反斜杠\\百分号%下划线_ emoji🚀 组合é 零宽\u200b RTL\u202e"


@pytest.mark.parametrize("path", [":memory:", "file"])
def test_odd_strings_round_trip_and_nul_is_refused(tmp_path: Path, path: str) -> None:
    """ODD 里的制表符、引号、通配符、emoji、零宽与 RTL 字符原样往返；NUL 与孤立代理项不行。

    以前 SQLite 能存 NUL，PostgreSQL 不能：同一个任务在一个后端存得下、在另一个后端永远写不进去。
    现在可存储性是所有后端共用的一条规则（用户指南 §13）：NUL 在快照构造时就被拒绝，绕过构造校验
    （``evolve``）的快照在写入时同样被拒绝；失败说明里的 NUL 被转义成可见的 ``\\x00``。
    """
    store = SqliteTaskStore(":memory:" if path == ":memory:" else tmp_path / "odd.db")
    try:
        failure = Failure(kind=FailureKind.EXCEPTION, message="坏\x00了", exc_type="X", traceback="tb\x00")
        assert failure.message == "坏\\x00了" and failure.traceback == "tb\\x00"
        snapshot = snap(
            ODD,
            name=ODD,
            label="标签中间没有 NUL",
            description=ODD,
            owner="o-wner",
            outcome={"文本": "a\tb", ODD: [ODD, None, 1.5, -(2**80)]},
            failure=failure,
            progress=Progress(done=1, unit="%", message=ODD),
            tags=frozenset({ODD, "%", "_", "\\"}),
        )
        store.create(snapshot)
        loaded = store.get(ODD)
        assert loaded == snapshot
        assert loaded is not None and loaded.failure == failure
        assert [s.task_id for s in store.query(TaskQuery(name_prefix=ODD[:5]))] == [ODD]
        assert [s.task_id for s in store.query(TaskQuery(tag=ODD))] == [ODD]
        assert store.query(TaskQuery(tag="%")) == [snapshot]
        assert store.query(TaskQuery(owner="o-wner")) == [snapshot]
        for field_name in ("label", "description", "owner"):
            with pytest.raises(ConfigurationError, match="NUL"):
                snap("nul", **{field_name: "a\x00b"})
            with pytest.raises(ConfigurationError, match="NUL"):
                store.create(snap("nul").evolve(**{field_name: "a\x00b"}))
        with pytest.raises(ConfigurationError, match="NUL"):
            Progress(done=1, unit="\x00")
        with pytest.raises(ConfigurationError, match="NUL"):
            store.create(snap("nul", outcome={"文本": "a\x00b"}))
        assert store.get("nul") is None
    finally:
        store.close()


def test_lone_surrogates_in_json_values_are_a_configuration_error() -> None:
    """以前 SQLite 把 JSON 里的孤立代理项转义存下、PostgreSQL 的 jsonb 拒绝：现在同一条规则，都拒绝。"""
    with SqliteTaskStore(":memory:") as store:
        with pytest.raises(ConfigurationError, match="代理项"):
            store.create(snap("sur", outcome={"x": "\ud800孤立代理项"}))
        with pytest.raises(ConfigurationError, match="代理项"):
            store.create(snap("sur", outcome={"\udfff": 1}))
        with pytest.raises(ConfigurationError, match="代理项"):
            Progress(done=1, message="\udfff")
        assert store.get("sur") is None


def test_lone_surrogates_in_plain_text_columns_are_a_configuration_error() -> None:
    with SqliteTaskStore(":memory:") as store:
        with pytest.raises(ConfigurationError, match="UTF-8"):
            store.create(snap("sur").evolve(label="\ud800"))
        with pytest.raises(ConfigurationError, match="UTF-8"):
            snap("sur", label="\ud800")
        assert store.get("sur") is None


def test_integer_overflow_is_a_configuration_error() -> None:
    """priority 的范围（±(2**53 - 1)）比 SQLite 的 64 位 INTEGER 还窄：在快照与写入检查处就被拒绝。"""
    with SqliteTaskStore(":memory:") as store:
        with pytest.raises(ConfigurationError, match="priority"):
            store.create(snap("big").evolve(priority=2**70))
        with pytest.raises(ConfigurationError, match="64 位"):
            store.create(snap("big", pid=2**70))
        assert store.get("big") is None


def test_timestamps_keep_offset_and_microseconds_and_sort_by_instant() -> None:
    odd = timezone(timedelta(hours=5, minutes=45, seconds=30))
    early = datetime(2026, 3, 1, 13, 0, 0, 1, tzinfo=odd)  # 比 T0 早约 45 分钟
    with SqliteTaskStore(":memory:") as store:
        store.create(snap("late", created_at=T0))
        store.create(snap("early", created_at=early, lease_until=datetime(9999, 12, 31, 23, 59, tzinfo=UTC)))
        store.create(snap("ancient", created_at=datetime(1, 1, 2, tzinfo=UTC)))
        loaded = store.get("early")
        assert loaded is not None
        assert loaded.created_at.utcoffset() == odd.utcoffset(None)
        assert loaded.created_at.isoformat() == early.isoformat()
        assert [s.task_id for s in store.query()] == ["late", "early", "ancient"]
        assert [s.task_id for s in store.query(TaskQuery(created_after=early))] == ["late"]
        assert [s.task_id for s in store.query(TaskQuery(lease_expired_before=T0))] == ["late", "ancient"]


# -- name prefix ----------------------------------------------------------------------------------


@settings(deadline=None)
@given(prefix=st.text(max_size=4), name=st.text(min_size=1, max_size=6))
def test_prefix_upper_bound_range_equals_startswith(prefix: str, name: str) -> None:
    upper = prefix_upper_bound(prefix)
    in_range = name >= prefix and (upper is None or name < upper)
    assert in_range == name.startswith(prefix)


def test_prefix_upper_bound_edges() -> None:
    assert prefix_upper_bound("") is None
    assert prefix_upper_bound("ab") == "ac"
    assert prefix_upper_bound("a\U0010ffff") == "b"
    assert prefix_upper_bound("\U0010ffff\U0010ffff") is None
    assert prefix_upper_bound("\ud7ff") == "\ue000"  # 跳过代理项区间：它们编不成 UTF-8


def test_name_prefix_matches_startswith_on_tricky_names() -> None:
    names = [
        "Job",
        "job",
        "jobs",
        "jo",
        "job_1",
        "job%1",
        "jobX",
        "job\U0010ffff",
        "jp",
        "k",
        "作业-1",
        "作业",
    ]
    prefixes = ["", "j", "job", "Job", "job_", "job%", "jo", "作业", "作", "job\U0010ffff", "z"]
    with SqliteTaskStore(":memory:") as store:
        for i, name in enumerate(names):
            store.create(snap(f"t{i:02d}", name=name))
        for prefix in prefixes:
            query = TaskQuery(name_prefix=prefix, order="oldest")
            expected = sorted(f"t{i:02d}" for i, n in enumerate(names) if n.startswith(prefix))
            assert [s.task_id for s in store.query(query)] == expected, prefix


# -- locking --------------------------------------------------------------------------------------


def _hold_write_lock(db: Path) -> sqlite3.Connection:
    raw = sqlite3.connect(db, isolation_level=None, timeout=0.01, check_same_thread=False)
    raw.execute("BEGIN IMMEDIATE")
    return raw


def test_lock_held_longer_than_busy_timeout_becomes_store_error(db: Path) -> None:
    store = SqliteTaskStore(db, busy_timeout=0.3)
    store.create(snap("locked"))
    raw = _hold_write_lock(db)
    try:
        started = time.monotonic()
        with pytest.raises(StoreError) as caught:
            store.touch("locked", progress=Progress(done=1))
        elapsed = time.monotonic() - started
        assert "锁定" in str(caught.value) and "busy_timeout" in str(caught.value)
        assert "database is locked" not in str(caught.value)
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        assert 0.25 <= elapsed < 5
        # 读不受写锁影响（WAL）。
        assert store.get("locked") is not None
    finally:
        raw.execute("ROLLBACK")
        raw.close()
        store.close()


def test_writer_waits_for_a_lock_released_within_the_timeout(db: Path) -> None:
    store = SqliteTaskStore(db, busy_timeout=10)
    base = snap("waits")
    store.create(base)
    raw = _hold_write_lock(db)
    releaser = threading.Timer(0.3, lambda: raw.execute("COMMIT"))
    releaser.start()
    try:
        nxt = base.evolve(status=TaskStatus.QUEUED, status_version=1)
        record = Transition("waits", TaskStatus.PENDING, TaskStatus.QUEUED, "submit", None, None, 1, T0)
        store.save(nxt, expect_version=0, transitions=[record])
        assert store.history("waits") == [record]
    finally:
        releaser.join()
        raw.close()
        store.close()


def test_busy_errors_raised_outside_the_busy_handler_are_retried(db: Path) -> None:
    """SQLITE_BUSY 也可能绕过 busy handler 直接返回（例如快照过期）：整事务重试，调用方无感。"""
    store = SqliteTaskStore(db, busy_timeout=5)
    store.create(snap("flaky"))
    calls = 0

    def flaky(conn: sqlite3.Connection) -> int:
        nonlocal calls
        calls += 1
        if calls < 4:
            raise sqlite3.OperationalError("database is locked")
        return int(conn.execute("SELECT count(*) FROM tasks").fetchone()[0])

    try:
        assert store._run("flaky", flaky) == 1
        assert calls == 4
    finally:
        store.close()


def test_other_sqlite_errors_are_wrapped_with_cause(db: Path) -> None:
    store = SqliteTaskStore(db)
    try:
        with pytest.raises(StoreError) as caught:
            store._run("bad sql", lambda conn: conn.execute("SELECT * FROM no_such_table").fetchall())
        assert "bad sql" in str(caught.value)
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
    finally:
        store.close()


def test_concurrent_threads_on_one_file_store(db: Path) -> None:
    """同一进程多个线程并发 save（乐观重试）与 touch：版本不丢，历史无空洞。"""
    store = SqliteTaskStore(db)
    store.create(snap("shared"))
    per_thread = 40
    errors: list[BaseException] = []

    def worker(name: str) -> None:
        try:
            done = 0
            while done < per_thread:
                current = store.get("shared")
                assert current is not None
                version = current.status_version + 1
                status = TaskStatus.RUNNING if version % 2 else TaskStatus.PAUSING
                record = Transition("shared", current.status, status, "flip", name, None, version, T0)
                try:
                    store.save(
                        current.evolve(status=status, status_version=version),
                        expect_version=version - 1,
                        transitions=[record],
                    )
                except ConcurrencyConflict:
                    continue
                done += 1
                store.touch("shared", progress=Progress(done=done), heartbeat_at=T0)
        except BaseException as exc:  # pragma: no cover - 失败时带回主线程
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"w{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == []
        history = store.history("shared")
        assert [t.version for t in history] == list(range(1, 4 * per_thread + 1))
        for n in range(4):
            assert sum(1 for t in history if t.actor == f"w{n}") == per_thread
    finally:
        store.close()


# -- commands -------------------------------------------------------------------------------------


def test_claim_without_returning_support_behaves_the_same(db: Path) -> None:
    """SQLite < 3.35 没有 RETURNING：退回 SELECT + UPDATE（同一写事务内），结果一致。"""
    clock = FakeClock(T0)
    store = SqliteTaskStore(db, clock=clock)
    store._returning = False
    try:
        store.create(snap("cmd", bucket=3))
        ids = [store.submit_command("cmd", "stop").command_id for _ in range(3)]
        first = store.claim_commands("a", lease=10, limit=2)
        assert [c.command_id for c in first] == ids[:2]
        assert all(c.claimant == "a" and c.deliveries == 1 for c in first)
        assert [c.command_id for c in store.claim_commands("b", lease=10, buckets=[3])] == ids[2:]
        assert store.claim_commands("c", lease=10) == []
        clock.advance(10)
        again = store.claim_commands("c", lease=10, task_ids=["cmd"])
        assert [c.command_id for c in again] == ids
        assert all(c.deliveries == 2 for c in again)
    finally:
        store.close()


def test_large_id_filters_use_a_single_json_parameter() -> None:
    with SqliteTaskStore(":memory:") as store:
        store.create(snap("needle", bucket=999))
        command = store.submit_command("needle", "pause")
        many_ids = [f"other-{i}" for i in range(2000)] + ["needle"]
        many_buckets = list(range(1000))
        claimed = store.claim_commands("x", lease=5, task_ids=many_ids, buckets=many_buckets)
        assert [c.command_id for c in claimed] == [command.command_id]
        assert [s.task_id for s in store.query(TaskQuery(buckets=frozenset(many_buckets)))] == ["needle"]


# -- indexes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "index"),
    [
        (TaskQuery(statuses=frozenset({TaskStatus.RUNNING}), limit=50), "tasks_by_status"),
        (TaskQuery(name_prefix="sync"), "tasks_by_name"),
        (TaskQuery(tag="io", limit=50), "SEARCH g USING PRIMARY KEY"),
        (TaskQuery(bucket=3), "tasks_by_bucket"),
        (TaskQuery(owner="worker-1"), "tasks_by_owner"),
        (TaskQuery(pipeline_id="p1"), "tasks_by_pipeline"),
        (TaskQuery(created_after=T0), "tasks_by_created"),
        # 租约条件在产品里总与状态一起出现（reconcile / check_cluster / worker）：见下一个用例。
        (TaskQuery(lease_expired_before=T0, statuses=frozenset({TaskStatus.RUNNING})), "tasks_by_status"),
        (TaskQuery(limit=50), "tasks_by_created"),
    ],
)
def test_every_query_filter_is_indexed(db: Path, query: TaskQuery, index: str) -> None:
    from chongming_task.stores.sqlite._sql import TASK_COLUMNS_T as _TASK_COLUMNS_T
    from chongming_task.stores.sqlite._sql import select_from as _select_from

    store = SqliteTaskStore(db)

    def plan(sql: str, params: list[object]) -> str:
        rows = store._run(
            "plan", lambda conn: conn.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall(), "none"
        )
        return " | ".join(str(row[-1]) for row in rows)

    try:
        source, params, alias = _select_from(query)
        unordered = f"SELECT {_TASK_COLUMNS_T}{source}"
        ordered = f"{unordered} ORDER BY {alias}.created_key DESC, {alias}.task_id DESC"
        if query.limit is not None:
            ordered += f" LIMIT {query.limit}"
        # 空表没有统计信息时，规划器可能宁可沿排序索引扫描（有 LIMIT 时这往往也对）；那就至少要证明
        # 过滤条件自己的索引可用：去掉排序再看一次。
        plans = [plan(ordered, params), plan(unordered, params)]
        assert any(index in p for p in plans), plans
        # 带排序的查询绝不做不走索引的全表扫描。
        assert "SCAN tasks" not in plans[0] or "USING" in plans[0], plans[0]
        if query.statuses is not None or query.bucket is not None or query.owner is not None or query.tag:
            # 看板最常用的"某状态 / 某桶 / 某节点最新 N 条"：沿索引有序读，不做临时排序。
            assert "TEMP B-TREE" not in plans[0], plans[0]
    finally:
        store.close()


def test_lease_filters_the_product_runs_use_the_status_index(db: Path) -> None:
    """lease_key 上没有索引（见 _schema._DROPPED_INDEXES）：产品发出的每个带租约条件的查询都同时按状态（或桶）
    过滤，沿那个索引读，不扫全表。有几百行、大半是终态时再看计划，免得空表上的计划碰巧也对。"""
    from chongming_task.stores.sqlite._sql import TASK_COLUMNS_T as _TASK_COLUMNS_T
    from chongming_task.stores.sqlite._sql import select_from as _select_from

    store = SqliteTaskStore(db)
    try:
        for i in range(300):
            at = T0 + timedelta(seconds=i)
            fields: dict[str, object] = {"status": TaskStatus.QUEUED, "created_at": at, "bucket": i % 4}
            if i % 3:
                fields.update(status=TaskStatus.SUCCEEDED, started_at=at, finished_at=at)
            store.create(snap(f"t{i:03d}", lease_owner="n", lease_until=at, **fields))
        now = T0 + timedelta(days=1)
        oldest = QueryOrder.OLDEST_FIRST
        product_queries = [
            # reconcile()（runtime/reconcile.py），带桶、只看持久任务两种变体
            TaskQuery(
                statuses=NON_TERMINAL_STATUSES, lease_expired_before=now, awaiting_claim=False, order=oldest
            ),
            TaskQuery(
                statuses=NON_TERMINAL_STATUSES,
                lease_expired_before=now,
                buckets=frozenset({1, 2}),
                durable=True,
                awaiting_claim=False,
                order=oldest,
            ),
            # check_cluster()（runtime/cluster.py）
            TaskQuery(statuses=NON_TERMINAL_STATUSES, lease_expired_before=now, order=oldest),
            # worker 找未复活的 lost（runtime/worker.py）
            TaskQuery(
                statuses=frozenset({TaskStatus.LOST}), durable=True, lease_expired_before=now, order=oldest
            ),
        ]
        for query in product_queries:
            source, params, alias = _select_from(query)
            sql = f"SELECT {_TASK_COLUMNS_T}{source} ORDER BY {alias}.created_key, {alias}.task_id"
            plan = " | ".join(
                str(row[-1])
                for row in store._run(
                    "plan",
                    lambda conn, s=sql, p=params: conn.execute(f"EXPLAIN QUERY PLAN {s}", p).fetchall(),
                    "none",
                )
            )
            assert "USING INDEX tasks_by_status" in plan or "USING INDEX tasks_by_bucket" in plan, plan
            assert "SCAN t" not in plan, plan
    finally:
        store.close()


def test_pool_reuses_connections_and_close_closes_them(db: Path) -> None:
    store = SqliteTaskStore(db)
    seen: set[int] = set()
    for _ in range(20):
        seen.add(store._run("probe", lambda conn: id(conn), "none"))
    assert len(seen) == 1
    store.close()
    assert store._pool._idle == []
    with pytest.raises(StoreError, match="已关闭"):
        store.get("x")
    assert "closed" in repr(store)


def test_writes_go_through_one_reused_cursor_per_pooled_connection(db: Path) -> None:
    """写事务的 BEGIN / COMMIT、create 的 INSERT、save 快速路径的 UPDATE 与迁移记录的 INSERT 都经连接上那一个
    复用的游标（``_Connection.writes``），不为每条语句现造游标；读照旧用各自的新游标，结果不受下一条写影响。"""
    store = SqliteTaskStore(db)
    try:
        with store._pool.connection() as conn:
            real = conn.writes
            routed: list[str] = []

            class Spy:
                def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
                    routed.append(sql.split()[0].upper())
                    return real.execute(sql, params)

            conn.writes = Spy()  # type: ignore[assignment]
        first = snap("a")
        store.create(first)
        record = Transition("a", TaskStatus.PENDING, TaskStatus.QUEUED, "submit", None, None, 1, T0)
        store.save(
            first.evolve(status_version=1, status=TaskStatus.QUEUED), expect_version=0, transitions=[record]
        )
        # create：BEGIN、INSERT 任务行、COMMIT；save：BEGIN、带前提的 UPDATE、迁移记录的 INSERT、COMMIT
        assert routed == ["BEGIN", "INSERT", "COMMIT", "BEGIN", "UPDATE", "INSERT", "COMMIT"]
        assert store.get("a") is not None and store.get("a").status is TaskStatus.QUEUED  # type: ignore[union-attr]
        assert routed[-1] == "COMMIT"  # 读不经复用的游标
        assert [t.version for t in store.history("a")] == [1]
    finally:
        store.close()


def test_tag_rows_follow_saves_that_change_tags_or_created_at() -> None:
    with SqliteTaskStore(":memory:") as store:
        first = snap("a", tags=frozenset({"io"}))
        store.create(first)
        store.create(snap("b", tags=frozenset({"io"}), created_at=T0 + timedelta(hours=1)))
        assert [s.task_id for s in store.query(TaskQuery(tag="io"))] == ["b", "a"]
        moved = first.evolve(status_version=1, status=TaskStatus.QUEUED, created_at=T0 + timedelta(hours=2))
        record = Transition("a", TaskStatus.PENDING, TaskStatus.QUEUED, "submit", None, None, 1, T0)
        store.save(moved, expect_version=0, transitions=[record])
        assert [s.task_id for s in store.query(TaskQuery(tag="io"))] == ["a", "b"]
        assert [
            s.task_id for s in store.query(TaskQuery(tag="io", created_after=T0 + timedelta(hours=1)))
        ] == ["a"]
        retagged = moved.evolve(status_version=2, status=TaskStatus.PAUSED, tags=frozenset({"cpu"}))
        record = Transition("a", TaskStatus.QUEUED, TaskStatus.PAUSED, "pause", None, None, 2, T0)
        store.save(retagged, expect_version=1, transitions=[record])
        assert [s.task_id for s in store.query(TaskQuery(tag="io"))] == ["b"]
        assert [s.task_id for s in store.query(TaskQuery(tag="cpu"))] == ["a"]
        assert store.stats(TaskQuery(tag="cpu"))[TaskStatus.PAUSED] == 1
        assert store.bucket_counts(TaskQuery(tag="cpu")) == {}


# -- save 的快速路径：一条带前提的 UPDATE，改到 0 行才先读再写 -------------------------------------------


def _statements_of(store: SqliteTaskStore, action: Callable[[], object]) -> list[str]:
    """``action`` 期间（内存库只有一条连接）执行的语句的第一个词。"""
    seen: list[str] = []
    with store._pool.connection() as conn:
        conn.set_trace_callback(lambda sql: seen.append(sql.split()[0].upper()))
    try:
        action()
    finally:
        with store._pool.connection() as conn:
            conn.set_trace_callback(None)
    return seen


def test_a_plain_transition_save_does_not_read_first() -> None:
    """常见的 save（状态随一条迁移记录前进，被索引的列与标签都没变）是 BEGIN、一条 UPDATE、迁移记录、
    COMMIT——不先 SELECT；改了被索引的列时才多读一次（慢路径），结果照样正确。"""
    with SqliteTaskStore(":memory:") as store:
        base = snap("fast", tags=frozenset({"io"}), owner="node-a")
        store.create(base)
        queued = base.evolve(status=TaskStatus.QUEUED, status_version=1)
        record = Transition("fast", TaskStatus.PENDING, TaskStatus.QUEUED, "submit", None, None, 1, T0)
        seen = _statements_of(store, lambda: store.save(queued, expect_version=0, transitions=[record]))
        assert seen == ["BEGIN", "UPDATE", "INSERT", "COMMIT"]
        moved = queued.evolve(status=TaskStatus.STARTING, status_version=2, owner="node-b")
        record = Transition("fast", TaskStatus.QUEUED, TaskStatus.STARTING, "start", None, None, 2, T0)
        seen = _statements_of(store, lambda: store.save(moved, expect_version=1, transitions=[record]))
        assert seen == ["BEGIN", "UPDATE", "SELECT", "UPDATE", "INSERT", "COMMIT"]
        assert [s.task_id for s in store.query(TaskQuery(owner="node-b"))] == ["fast"]


def test_every_write_transaction_calls_the_commit_hook_right_before_commit() -> None:
    """``calls_before_commit``：每个写事务在 COMMIT 之前、本线程上调用一次 ``commit_hooks.before_commit()``
    （组提交在那一刻叫醒上一批的调用方）；读不调用，本线程上没有登记回调时什么也不调用。"""
    from chongming_task.core.storage import commit_hooks

    assert SqliteTaskStore.calls_before_commit
    with SqliteTaskStore(":memory:") as store:
        events: list[str] = []
        with store._pool.connection() as conn:  # 内存库只有一条连接：语句与回调按先后记进同一个列表
            conn.set_trace_callback(lambda sql: events.append(sql.split()[0].upper()))
        base = snap("hooked")
        queued = base.evolve(status=TaskStatus.QUEUED, status_version=1)
        record = Transition("hooked", TaskStatus.PENDING, TaskStatus.QUEUED, "submit", None, None, 1, T0)
        previous = commit_hooks.install(lambda: events.append("HOOK"))
        try:
            store.create(base)
            store.save_many([SaveRequest(queued, 0, [record])])
            store.get("hooked")
            store.history("hooked")
        finally:
            commit_hooks.install(previous)
        store.create(snap("unhooked"))  # 回调已撤销：照常提交，不调用
    assert events == [
        *["BEGIN", "INSERT", "HOOK", "COMMIT"],
        *["BEGIN", "UPDATE", "INSERT", "HOOK", "COMMIT"],
        *["SELECT", "SELECT"],
        *["BEGIN", "INSERT", "COMMIT"],
    ], events


def _queued_and_started(task_id: str, reason: str | None = None) -> SaveRequest:
    base = snap(task_id)
    started = base.evolve(status=TaskStatus.STARTING, status_version=2)
    return SaveRequest(
        started,
        0,
        [
            Transition(task_id, TaskStatus.PENDING, TaskStatus.QUEUED, "submit", None, None, 1, T0),
            Transition(task_id, TaskStatus.QUEUED, TaskStatus.STARTING, "start", None, reason, 2, T0),
        ],
    )


def test_a_save_many_batch_writes_its_transitions_in_one_insert() -> None:
    """组提交的一批：各项的 UPDATE 照旧逐条，迁移记录攒到最后合成一条多行 INSERT（同一种 NULL 形状）；
    版本冲突的那一项什么也没写（它的记录不在里面），其余项的历史完整。"""
    with SqliteTaskStore(":memory:") as store:
        for task_id in ("a", "b", "c"):
            store.create(snap(task_id))
        stale = _queued_and_started("b")
        requests = [
            _queued_and_started("a"),
            SaveRequest(stale.snapshot, 1, stale.transitions[1:]),  # 存储里是第 0 版：冲突
            _queued_and_started("c"),
        ]
        results: list[Any] = []
        seen = _statements_of(store, lambda: results.extend(store.save_many(requests)))
        assert seen == ["BEGIN", "UPDATE", "UPDATE", "SELECT", "UPDATE", "INSERT", "COMMIT"]
        assert results[0] is None and results[2] is None
        assert isinstance(results[1], ConcurrencyConflict)
        for task_id in ("a", "c"):
            assert [t.version for t in store.history(task_id)] == [1, 2]
            assert store.get(task_id).status is TaskStatus.STARTING  # type: ignore[union-attr]
        assert store.history("b") == []
        assert store.get("b").status_version == 0  # type: ignore[union-attr]


def test_a_save_many_batch_groups_rows_by_null_shape_and_chunks_long_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NULL 形状不同的记录各成一条 INSERT（NULL 写成字面量），超过 ROWS_PER_INSERT 行的分几条；
    每一行都原样落库。"""
    from chongming_task.stores.sqlite import _sql

    monkeypatch.setattr(_sql, "ROWS_PER_INSERT", 2)
    with SqliteTaskStore(":memory:") as store:
        ids = ["p", "q", "r", "s"]
        for task_id in ids:
            store.create(snap(task_id))
        requests = [
            _queued_and_started(task_id, reason="手动" if task_id == "r" else None) for task_id in ids
        ]
        seen = _statements_of(store, lambda: store.save_many(requests))
        # 7 行不带 reason（分成 2 + 2 + 2 + 1）、1 行带 reason。
        assert seen.count("INSERT") == 5
        for request in requests:
            assert store.history(request.snapshot.task_id) == list(request.transitions)
        assert store.history("r")[1].reason == "手动"


@pytest.fixture
def fresh_save_sql() -> Iterator[None]:
    """快速路径的语句文本有缓存：变种改了生成它的东西，前后都要清掉缓存。"""
    from chongming_task.stores.sqlite import _sql

    cached = _sql._guarded_update_sql  # 拆除时变种可能还挂在模块上：清的是真的那一个
    cached.cache_clear()
    yield
    cached.cache_clear()


def _failing_contract_cases(*names: str) -> set[str]:
    """对内存 SQLite 库跑指定的几条契约用例，返回失败或出错的用例名。"""
    from chongming_task.testing.store_contract import StoreContract

    def make_store(self: StoreContract) -> SqliteTaskStore:
        return SqliteTaskStore(":memory:")

    # 动态子类只活在这个函数里，pytest 的收集看不到它。
    case_cls = type("SqliteContractCases", (StoreContract,), {"make_store": make_store})
    suite = unittest.TestSuite(case_cls(name) for name in names)
    result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
    return {case.id().rsplit(".", 1)[-1] for case, _ in [*result.failures, *result.errors]}


_REWRITES = "test_save_rewrites_indexed_fields_and_tags_that_changed"
_CONFLICT = "test_save_version_mismatch_writes_nothing"


def test_fast_save_path_cases_pass_unbroken(fresh_save_sql: None) -> None:
    assert _failing_contract_cases(_REWRITES, _CONFLICT) == set()


@pytest.mark.parametrize("dropped", [*_schema_module.INDEXED_SAVE_COLUMNS, "tags"])
def test_contract_catches_a_fast_save_path_missing_a_guard(
    dropped: str, monkeypatch: pytest.MonkeyPatch, fresh_save_sql: None
) -> None:
    """变种：快速路径的前提漏了一列（假定它没变却不核对）——那一列变了的 save 会留下旧值或旧标签行。"""
    from chongming_task.stores.sqlite import _sql

    guarded = {
        key: tuple(c for c in columns if c != dropped) for key, columns in _sql._GUARDED_COLUMNS.items()
    }
    monkeypatch.setattr(_sql, "_GUARDED_COLUMNS", guarded)
    assert _failing_contract_cases(_REWRITES) == {_REWRITES}


def test_contract_catches_a_fast_save_path_without_the_version_check(
    monkeypatch: pytest.MonkeyPatch, fresh_save_sql: None
) -> None:
    """变种：快速路径的 WHERE 不核对版本（参数个数不变）——过时的写者会覆盖别人的写。"""
    from chongming_task.stores.sqlite import _sql

    unguarded = _sql._guarded_update_sql.__wrapped__

    def without_version(*args: Any) -> str:
        return unguarded(*args).replace(" AND status_version = ?", " AND ? IS NOT NULL")

    monkeypatch.setattr(_sql, "_guarded_update_sql", without_version)
    assert _failing_contract_cases(_CONFLICT) == {_CONFLICT}


# -- differential: SQL == TaskQuery.apply ---------------------------------------------------------

_OFFSETS = [UTC, timezone(timedelta(hours=8)), timezone(timedelta(hours=-3, minutes=-30))]
_instants = st.integers(min_value=0, max_value=40).map(lambda m: T0 + timedelta(minutes=m))
_aware_times = st.builds(lambda at, tz: at.astimezone(tz), _instants, st.sampled_from(_OFFSETS))
_names = st.sampled_from(["a", "A", "ab", "a_b", "a%b", "a\\b", "b", "作业", "作业2", "a\U0010ffff"])
_tags = st.frozensets(st.sampled_from(["io", "IO", "cpu", "i"]), max_size=3)

_snapshots = st.builds(
    lambda name, status, tags, bucket, owner, pipeline, created, lease: {
        "name": name,
        "status": status,
        "tags": tags,
        "bucket": bucket,
        "owner": owner,
        "pipeline_id": pipeline,
        "created_at": created,
        "lease_until": lease,
    },
    _names,
    st.sampled_from(list(TaskStatus)),
    _tags,
    st.none() | st.integers(0, 3),
    st.none() | st.sampled_from(["w1", "w2"]),
    st.none() | st.sampled_from(["p1", "p2"]),
    _aware_times,
    st.none() | _aware_times,
)

_queries = st.builds(
    TaskQuery,
    statuses=st.none() | st.frozensets(st.sampled_from(list(TaskStatus)), max_size=3),
    name_prefix=st.none() | st.sampled_from(["", "a", "A", "a_", "a%", "a\\", "作", "作业", "a\U0010ffff"]),
    tag=st.none() | st.sampled_from(["io", "IO", "i"]),
    bucket=st.none() | st.integers(0, 3),
    buckets=st.none() | st.frozensets(st.integers(0, 3), max_size=3),
    owner=st.none() | st.sampled_from(["w1", "w2"]),
    pipeline_id=st.none() | st.sampled_from(["p1", "p2"]),
    created_after=st.none() | _aware_times,
    created_before=st.none() | _aware_times,
    lease_expired_before=st.none() | _aware_times,
    limit=st.none() | st.integers(0, 6),
    order=st.sampled_from(["newest", "oldest"]),
)


@settings(deadline=None, max_examples=60)  # 每个例子建一个库；机器繁忙时别因耗时抖动误报
@given(rows=st.lists(_snapshots, max_size=14), queries=st.lists(_queries, min_size=1, max_size=5))
def test_sql_queries_agree_with_the_reference_semantics(
    rows: list[dict[str, object]], queries: list[TaskQuery]
) -> None:
    snapshots = [snap(f"t{i:02d}", **fields) for i, fields in enumerate(rows)]
    with SqliteTaskStore(":memory:") as store:
        for snapshot in snapshots:
            store.create(snapshot)
        for query in queries:
            expected = query.apply(snapshots)
            assert [s.task_id for s in store.query(query)] == [s.task_id for s in expected], query
            matching = [s for s in snapshots if query.matches(s)]
            counts = store.stats(query)
            for status in TaskStatus:
                assert counts[status] == sum(1 for s in matching if s.status is status)
            buckets: dict[int, int] = {}
            for s in matching:
                if s.bucket is not None:
                    buckets[s.bucket] = buckets.get(s.bucket, 0) + 1
            assert store.bucket_counts(query) == buckets


def test_broad_name_prefix_walks_the_time_index_with_the_same_results(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """前缀匹配的行多于 NAME_INDEX_ROWS 时不走 name 索引（百万行上 name=sync- 要排一秒多）：结果不变。"""
    import chongming_task.stores.sqlite.store as store_module

    store = SqliteTaskStore(db)
    base = datetime(2030, 1, 1, tzinfo=UTC)
    for i in range(40):
        status = TaskStatus.RUNNING if i % 3 == 0 else TaskStatus.SUCCEEDED
        store.create(
            snap(
                f"t{i:02d}", name=f"sync-{i % 7}", status=status, created_at=base + timedelta(seconds=i // 2)
            )
        )
    queries = [
        TaskQuery(name_prefix="sync-", limit=5),
        TaskQuery(name_prefix="sync-", limit=5, order=QueryOrder.OLDEST_FIRST),
        TaskQuery(name_prefix="sync-3", limit=3, statuses=frozenset({TaskStatus.RUNNING})),
        TaskQuery(name_prefix="sync", limit=4, created_before=base + timedelta(seconds=10)),
        TaskQuery(name_prefix="nomatch", limit=4),
    ]
    narrow = [[s.task_id for s in store.query(q)] for q in queries]
    monkeypatch.setattr(store_module, "NAME_INDEX_ROWS", 3)  # 让同样的查询都走"沿时间索引"那条路
    broad = [[s.task_id for s in store.query(q)] for q in queries]
    everything = store.query()
    expected = []
    for q in queries:
        rows = sorted((s for s in everything if q.matches(s)), key=lambda s: (s.created_at, s.task_id))
        if q.order is QueryOrder.NEWEST_FIRST:
            rows.reverse()
        expected.append([s.task_id for s in rows[: q.limit]])
    assert narrow == expected and broad == expected
    assert expected[0] and expected[3]
    store.close()


@given(
    st.datetimes(
        timezones=st.sampled_from(
            [UTC, timezone(timedelta(hours=8)), timezone(timedelta(hours=-3, minutes=-30, seconds=-15))]
        )
    )
)
@settings(max_examples=200, deadline=None)
def test_stored_time_text_always_has_six_digit_microseconds(value: datetime) -> None:
    """存下的时间文本与 ``isoformat(timespec="microseconds")`` 逐字相同（编码用更快的无参 isoformat，
    微秒为零时它会省掉小数部分）。"""
    from chongming_task.core.storage.columns import COLUMNS_BY_NAME
    from chongming_task.stores.sqlite._codec import DIALECT, dt_text

    created_at = COLUMNS_BY_NAME["created_at"]
    expected = value.isoformat(timespec="microseconds")
    assert dt_text(value) == expected
    assert dt_text(value.replace(microsecond=0)) == value.replace(microsecond=0).isoformat(
        timespec="microseconds"
    )
    assert DIALECT.encode_time(created_at, value)[0] == expected


@given(
    st.datetimes(
        timezones=st.sampled_from(
            [UTC, timezone(timedelta(hours=8)), timezone(timedelta(hours=-3, minutes=-30, seconds=-15))]
        )
    ),
    st.integers(min_value=-120_000_000, max_value=120_000_000),
)
@settings(max_examples=300, deadline=None)
def test_time_columns_encode_exactly_like_isoformat_and_dt_key(value: datetime, offset_us: int) -> None:
    """时间列的编码（UTC 时间走"记下最近一分钟"的快路径，别的时区照旧 isoformat）与
    ``isoformat(timespec="microseconds")`` / ``dt_key`` 逐字相同：同一分钟里、跨分钟、微秒为零都一样，
    经方言的钩子与编译好的整行编码都一样。"""
    from chongming_task.core.storage.columns import COLUMNS_BY_NAME
    from chongming_task.stores.sqlite._codec import DIALECT, SNAPSHOTS, dt_key

    created_at = COLUMNS_BY_NAME["created_at"]  # 带排序键的时间列
    started_at = COLUMNS_BY_NAME["started_at"]  # 不带排序键的时间列
    try:
        near = value + timedelta(microseconds=offset_us)
    except OverflowError:
        near = value
    for moment in (value, near, value.replace(microsecond=0), near.replace(second=0, microsecond=0), value):
        text = moment.isoformat(timespec="microseconds")
        assert DIALECT.encode_time(created_at, moment) == (text, dt_key(moment))
        assert DIALECT.encode_time(started_at, moment) == (text,)
    snapshot = TaskSnapshot(task_id="t", name="n", created_at=value, started_at=near)
    row = dict(zip(SNAPSHOTS.names, SNAPSHOTS.values(snapshot), strict=True))
    assert (row["created_at"], row["created_key"]) == (
        value.isoformat(timespec="microseconds"),
        dt_key(value),
    )
    assert row["started_at"] == near.isoformat(timespec="microseconds")


def test_utc_time_encoding_is_consistent_across_threads() -> None:
    """快路径记着"最近一分钟"（前缀与排序键一起整个换上）：几条线程同时编码不同分钟的时刻，每一个都与
    isoformat / dt_key 逐字相同（不会拼上别的线程那一分钟的前缀）。"""
    from chongming_task.core.storage.columns import COLUMNS_BY_NAME
    from chongming_task.stores.sqlite._codec import DIALECT, dt_key

    created_at = COLUMNS_BY_NAME["created_at"]
    base = datetime(2026, 12, 31, 23, 58, 59, 999_000, tzinfo=UTC)
    wrong: list[tuple[datetime, Any]] = []

    def encode(start: int) -> None:
        for index in range(4_000):
            moment = base + timedelta(seconds=(start * 37 + index * 13) % 180, microseconds=index)
            got = DIALECT.encode_time(created_at, moment)
            if got != (moment.isoformat(timespec="microseconds"), dt_key(moment)):
                wrong.append((moment, got))

    threads = [threading.Thread(target=encode, args=(start,)) for start in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


def test_utc_time_encoding_across_second_boundaries_and_the_ends_of_time() -> None:
    """快路径记着"最近一秒"（这一秒的开头与下一秒的开头）：紧贴秒的边界前后、往回走、跨日跨年、datetime 的
    最小与最大时刻（最后一秒没有"下一秒"），每一个都与 isoformat / dt_key 逐字相同。"""
    from chongming_task.core.storage.columns import COLUMNS_BY_NAME
    from chongming_task.stores.sqlite._codec import DIALECT, _text_and_key, dt_key

    created_at = COLUMNS_BY_NAME["created_at"]
    edge = datetime(2026, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
    last = datetime.max.replace(tzinfo=UTC)
    first = datetime.min.replace(tzinfo=UTC)
    moments = [
        edge,
        edge + timedelta(microseconds=1),  # 下一秒（也是下一年）的开头
        edge,  # 往回走一微秒
        edge - timedelta(microseconds=999_999),  # 这一秒的开头
        edge - timedelta(microseconds=1_000_000),  # 上一秒的最后一微秒
        last - timedelta(seconds=1),
        last - timedelta(microseconds=1),
        last,
        last,
        last - timedelta(microseconds=999_999),  # 最后一秒的开头
        first,
        first + timedelta(microseconds=999_999),
        first + timedelta(seconds=1),
        edge,
    ]
    for moment in moments:
        expected = (moment.isoformat(timespec="microseconds"), dt_key(moment))
        assert _text_and_key(moment) == expected, moment  # 不经按对象记的记忆表：每次都走快路径
        assert DIALECT.encode_time(created_at, moment) == expected, moment
