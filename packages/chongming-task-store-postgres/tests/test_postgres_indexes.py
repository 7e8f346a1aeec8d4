"""tasks 上的索引（issue 17 / 19，pg14）：每个行版本只进"有查询要找它"的索引，而产品发出的查询仍各走一个索引。

* 计划：在有统计信息、分布接近线上（绝大多数成功、少数在管 / 失败 / 失联、少数带标签）的表上对
  ``store.query`` 真正执行的语句做 ``EXPLAIN (FORMAT JSON)``（与 SQLite 后端的 "EXPLAIN QUERY PLAN" 用例同一
  思路）：reconcile、check_cluster、worker 找未复活的 lost、看板按状态 / 标签筛选都走索引，不顺序扫描整张表。
* 形状：没有索引引用续租与 touch 改写的列（续租是 HOT 更新）；旧形状的库可写打开时换成新形状，只读、
  ``create_schema="never"`` 与不是属主的角色不动它（后者告警、照常读写）。
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg import sql

from chongming_task.core.recipes import Recipe
from chongming_task.models import TaskSnapshot
from chongming_task.states import NON_TERMINAL_STATUSES
from chongming_task.states import TaskStatus as S
from chongming_task.storage import QueryOrder, TaskQuery
from chongming_task.stores.postgres import PostgresTaskStore
from chongming_task.stores.postgres._schema import DROPPED_INDEXES, SLIM_INDEXES

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ROWS = 20_000

_FILL = """INSERT INTO {s}.tasks (task_id, name, status, status_version, attempt, max_attempts, created_at,
    created_at_off, finished_at, finished_at_off, tags, bucket, owner, lease_owner, lease_until,
    lease_until_off, recipe)
SELECT 'task-' || lpad(i::text, 6, '0'), 'sync-' || (i %% 50), st, 3, 1, 1,
    %(t0)s + i * interval '1 second', 0,
    CASE WHEN st IN ('running', 'queued', 'paused') THEN NULL ELSE %(t0)s + i * interval '1 second' END,
    CASE WHEN st IN ('running', 'queued', 'paused') THEN NULL ELSE 0 END,
    CASE WHEN i %% 100 = 6 THEN ARRAY['io'] ELSE '{{}}'::text[] END, i %% 64,
    CASE WHEN st = 'queued' THEN NULL ELSE 'worker-' || (i %% 8) END,
    CASE WHEN st = 'queued' THEN NULL ELSE 'worker-' || (i %% 8) END,
    CASE WHEN st = 'queued' THEN NULL WHEN i %% 200 = 1 THEN now() + interval '1 hour'
         ELSE %(t0)s + i * interval '1 second' END,
    CASE WHEN st = 'queued' THEN NULL ELSE 0 END,
    CASE WHEN st IN ('queued', 'lost') THEN (SELECT recipe FROM {s}.tasks WHERE task_id = 'template') END
FROM (SELECT i, CASE i %% 100 WHEN 1 THEN 'running' WHEN 2 THEN 'queued' WHEN 3 THEN 'failed'
    WHEN 4 THEN 'lost' WHEN 5 THEN 'paused' ELSE 'succeeded' END AS st
    FROM generate_series(1, %(rows)s) AS i) AS g"""
"""ROWS 行：1% running（一半租约已过期）、1% 待认领的持久任务、1% failed、1% 持久的 lost、1% paused、
其余成功；1% 带 io 标签，64 个桶，8 个持有者。"""


@pytest.fixture(scope="module")
def big(postgres_dsn: str) -> Any:
    """一张 ROWS 行、ANALYZE 过的表（整个模块共用，只读）。"""
    import secrets

    import psycopg

    schema = f"ct_pg_idx_{secrets.token_hex(4)}"
    store = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        recipe = Recipe("sync", args=(), kwargs={})
        store.create(
            TaskSnapshot(task_id="template", name="t", created_at=T0, status=S.SUCCEEDED, recipe=recipe)
        )
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            s = sql.Identifier(schema)
            conn.execute(sql.SQL(_FILL).format(s=s), {"t0": T0, "rows": ROWS})
            conn.execute(sql.SQL("ANALYZE {}.tasks").format(s))
        yield store
    finally:
        store.close()
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _scans(store: PostgresTaskStore, query: TaskQuery) -> list[str]:
    """``store.query(query)`` 执行的那条语句（与参数）的计划里，对 tasks 的每个扫描：索引名或 "Seq Scan"。"""
    text, params = store._sql.query(query)
    with store._pool.connection() as conn:
        plan = conn.execute(f"EXPLAIN (FORMAT JSON) {text}", params).fetchone()[0]
    found: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        if "Index Name" in node:
            found.append(str(node["Index Name"]))
        elif node.get("Node Type") == "Seq Scan":
            found.append("Seq Scan")
        for child in node.get("Plans", []):
            walk(child)

    walk(plan[0]["Plan"])
    return found


NOW = datetime.now(UTC)
OLDEST = QueryOrder.OLDEST_FIRST
NEWEST = QueryOrder.NEWEST_FIRST


@pytest.mark.parametrize(
    ("query", "indexes"),
    [
        # reconcile()（runtime/reconcile.py），带桶、只看持久任务两种变体
        (
            TaskQuery(
                statuses=NON_TERMINAL_STATUSES, lease_expired_before=NOW, awaiting_claim=False, order=OLDEST
            ),
            {"tasks_unsucceeded_idx"},
        ),
        (
            TaskQuery(
                statuses=NON_TERMINAL_STATUSES,
                lease_expired_before=NOW,
                buckets=frozenset({1, 2}),
                durable=True,
                awaiting_claim=False,
                order=OLDEST,
            ),
            {"tasks_unsucceeded_idx", "tasks_bucket_idx", "tasks_durable_idx"},
        ),
        # check_cluster()（runtime/cluster.py）：租约过期的、孤儿桶里的未结束任务
        (
            TaskQuery(statuses=NON_TERMINAL_STATUSES, lease_expired_before=NOW, order=OLDEST),
            {"tasks_unsucceeded_idx"},
        ),
        (
            TaskQuery(statuses=NON_TERMINAL_STATUSES, buckets=frozenset({3}), order=OLDEST, limit=50),
            {"tasks_unsucceeded_idx", "tasks_bucket_idx"},
        ),
        # worker 找未复活的 lost（runtime/worker.py）
        (
            TaskQuery(statuses=frozenset({S.LOST}), durable=True, lease_expired_before=NOW, order=OLDEST),
            {"tasks_unsucceeded_idx", "tasks_durable_idx"},
        ),
        # 看板：按状态（终态、非终态、两者混合）、按标签
        (TaskQuery(statuses=frozenset({S.FAILED}), limit=50, order=NEWEST), {"tasks_unsucceeded_idx"}),
        (TaskQuery(statuses=frozenset({S.FAILED, S.PAUSED}), order=NEWEST), {"tasks_unsucceeded_idx"}),
        (TaskQuery(tag="io", order=NEWEST), {"tasks_tagged_idx"}),
        (TaskQuery(tag="io", statuses=frozenset({S.SUCCEEDED}), order=NEWEST), {"tasks_tagged_idx"}),
    ],
)
def test_product_queries_read_along_an_index(
    big: PostgresTaskStore, query: TaskQuery, indexes: set[str]
) -> None:
    scans = _scans(big, query)
    assert "Seq Scan" not in scans, scans
    assert indexes & set(scans), scans


def test_succeeded_rows_are_listed_along_the_time_index(big: PostgresTaskStore) -> None:
    """成功的行不进状态索引（它在那里毫无选择性）：按它筛选的看板沿时间索引倒着走，不顺序扫描。"""
    scans = _scans(big, TaskQuery(statuses=frozenset({S.SUCCEEDED}), limit=50, order=NEWEST))
    assert scans == ["tasks_created_idx"], scans
    got = big.query(TaskQuery(statuses=frozenset({S.SUCCEEDED}), limit=3, order=NEWEST))
    assert [s.task_id for s in got] == ["task-020000", "task-019999", "task-019998"]


def test_tag_query_results_are_unchanged_by_the_partial_index(big: PostgresTaskStore) -> None:
    tagged = big.query(TaskQuery(tag="io", order=OLDEST))
    assert len(tagged) == ROWS // 100
    assert all(snapshot.tags == frozenset({"io"}) for snapshot in tagged)
    assert big.query(TaskQuery(tag="cpu", order=OLDEST)) == []
    assert big.stats(TaskQuery(tag="io")).total == ROWS // 100


def _index_defs(admin: Any, schema: str) -> dict[str, str]:
    rows = admin.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s AND tablename = 'tasks'", [schema]
    ).fetchall()
    return {str(name): str(definition) for name, definition in rows}


def test_no_index_covers_what_lease_renewals_and_touches_write(
    postgres_dsn: str, schema: str, admin: Any
) -> None:
    """续租（renew_leases / touch 的租约）、心跳与进度只改不进任何索引的列：页内有空位时是 HOT 更新，
    不为在管的每个任务每次续租往每个索引各插一项。"""
    store = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        definitions = _index_defs(admin, schema)
        for column in ("lease_until", "lease_owner", "last_heartbeat_at", "progress"):
            assert not [name for name, text in definitions.items() if column in text], (column, definitions)
        running = TaskSnapshot(
            task_id="held",
            name="n",
            created_at=T0,
            status=S.RUNNING,
            owner="w",
            lease_owner="w",
            lease_until=T0,
        )
        store.create(running)
        for second in range(1, 6):
            store.touch("held", lease_owner="w", lease_until=T0 + timedelta(seconds=second))
    finally:
        store.close()  # 后端退出时把统计写进共享内存
    row = _updates_once_flushed(admin, schema, expected_updates=5)
    assert row == (5, 5), "一页里只有这一行，五次续租都应是 HOT 更新"


def _updates_once_flushed(admin: Any, schema: str, expected_updates: int) -> tuple[int, int] | None:
    """tasks 表的 (n_tup_upd, n_tup_hot_upd)，等到 expected_updates 次更新都已计入再读（至多 10 秒）。

    为什么要等：客户端关掉连接就返回了，服务器上那个后端进程退出时（PG 15 起在 before_shmem_exit 里）才把
    这些计数写进共享内存；机器很忙时统计视图可能在它退出之前被读到，读到的是 (0, 0) 或没有这一行。一个后端的
    两个计数是同一次写进去的，所以 n_tup_upd 到齐时 n_tup_hot_upd 也已到齐——之后的断言照旧比较两者。"""
    deadline = time.monotonic() + 10
    while True:
        row = admin.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE schemaname = %s AND relname = 'tasks'",
            [schema],
        ).fetchone()
        if (row is not None and row[0] >= expected_updates) or time.monotonic() > deadline:
            return None if row is None else (int(row[0]), int(row[1]))
        time.sleep(0.02)


_OLD_INDEXES = {
    "tasks_status_idx": "(status)",
    "tasks_tags_idx": "USING gin (tags)",
    "tasks_lease_idx": "(lease_until)",
    "tasks_finished_idx": "(finished_at) "
    "WHERE status IN ('cancelled', 'failed', 'lost', 'skipped', 'stopped', 'succeeded')",
}
"""pg14 之前建库时的四个索引（原样）。"""


def _make_old_shape(postgres_dsn: str, schema: str, admin: Any) -> None:
    PostgresTaskStore(postgres_dsn, schema=schema).close()
    s = sql.Identifier(schema)
    for name in SLIM_INDEXES:
        admin.execute(sql.SQL("DROP INDEX {}.{}").format(s, sql.Identifier(name)))
    for name, spec in _OLD_INDEXES.items():
        admin.execute(sql.SQL(f"CREATE INDEX {{}} ON {{}}.tasks {spec}").format(sql.Identifier(name), s))


def test_writable_open_replaces_the_old_indexes(postgres_dsn: str, schema: str, admin: Any) -> None:
    _make_old_shape(postgres_dsn, schema, admin)
    assert set(_OLD_INDEXES) <= set(_index_defs(admin, schema))
    with PostgresTaskStore(postgres_dsn, schema=schema) as store:
        names = set(_index_defs(admin, schema))
        assert set(SLIM_INDEXES) <= names and not set(DROPPED_INDEXES) & names, names
        store.create(TaskSnapshot(task_id="a", name="n", created_at=T0, tags=frozenset({"io"})))
        assert [s.task_id for s in store.query(TaskQuery(tag="io"))] == ["a"]
    fresh = _index_defs(admin, schema)
    PostgresTaskStore(postgres_dsn, schema=schema).close()  # 再次打开：已是新形状，什么也不做
    assert _index_defs(admin, schema) == fresh


def test_readonly_and_never_opens_leave_the_old_indexes(postgres_dsn: str, schema: str, admin: Any) -> None:
    _make_old_shape(postgres_dsn, schema, admin)
    before = _index_defs(admin, schema)
    with PostgresTaskStore(postgres_dsn, schema=schema, readonly=True) as reader:
        assert reader.query(TaskQuery(tag="io")) == []
    assert _index_defs(admin, schema) == before, "只读打开绝不改表结构"
    with PostgresTaskStore(postgres_dsn, schema=schema, create_schema="never") as store:
        store.create(TaskSnapshot(task_id="b", name="n", created_at=T0, tags=frozenset({"io"})))
        assert [s.task_id for s in store.query(TaskQuery(tag="io"))] == ["b"]
    assert _index_defs(admin, schema) == before, "create_schema='never' 不改表结构"


def test_role_that_does_not_own_the_table_keeps_the_old_indexes_and_runs(
    postgres_dsn: str,
    schema: str,
    admin: Any,
    limited_role: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    role, role_dsn = limited_role
    _make_old_shape(postgres_dsn, schema, admin)
    for statement in PostgresTaskStore.grant_sql(schema, role).strip().splitlines():
        admin.execute(statement)
    before = _index_defs(admin, schema)
    with caplog.at_level(logging.WARNING), PostgresTaskStore(role_dsn, schema=schema) as store:
        store.create(TaskSnapshot(task_id="c", name="n", created_at=T0, tags=frozenset({"io"})))
        assert [s.task_id for s in store.query(TaskQuery(tag="io"))] == ["c"]
    assert _index_defs(admin, schema) == before
    warned = [r.getMessage() for r in caplog.records if "旧的索引形状" in r.getMessage()]
    assert warned and role in warned[0] and "tasks_unsucceeded_idx" in warned[0], caplog.text
    # 属主照告警里的 SQL 执行之后就是新形状。
    for statement in warned[0].split("执行一次：", 1)[1].split(";\n"):
        admin.execute(statement)
    assert set(SLIM_INDEXES) <= set(_index_defs(admin, schema))
