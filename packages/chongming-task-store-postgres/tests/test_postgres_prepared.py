"""热路径的语句第一次执行就是服务器端预备语句（``store._execute_hot``，issue 19，dur17）。

psycopg 默认执行到第 5 次才 PREPARE，之前每次都让服务器重新解析、规划；持久任务的两条热语句（入队的建任务、
worker 的认领并开始）在每条新连接上因此多规划 5 次。这里用只有一条连接的池，在同一条连接上查
``pg_prepared_statements``：第一次执行之后它们已在里面。连接参数 ``prepare_threshold=None``（例如经事务模式的
pgbouncer 时）照旧一条也不预备——psycopg 对 ``prepare=True`` 也尊重这个设置。

组提交的批量语句（``write_many`` / ``save_many`` 合成的一条，``store._execute_batch``，issue 17，pg18）同理：
Controller 路径上每个任务约 0.8 条，项数不多的形状第一次执行就预备；项数多的罕见形状仍按 psycopg 的默认门槛，
不把常用的预备语句挤出 psycopg 每条连接的预备缓存。
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from chongming_task.core.storage.claiming import ClaimStart
from chongming_task.states import TaskStatus
from chongming_task.storage import SaveRequest
from chongming_task.stores.postgres import PostgresTaskStore
from chongming_task.stores.postgres.store import PREPARED_BATCH_ITEMS
from chongming_task.testing.contract.durable import durable
from chongming_task.testing.store_contract import snap, step

pytestmark = pytest.mark.postgres

LEASE = datetime(2026, 3, 1, 9, 0, 0, tzinfo=timezone(timedelta(hours=-5)))


def _prepared(store: PostgresTaskStore) -> list[str]:
    """池里唯一那条连接上的预备语句文本。"""
    with store.pool.connection() as conn:
        return [row[0] for row in conn.execute("SELECT statement FROM pg_prepared_statements")]


@pytest.fixture
def single(postgres_dsn: str, schema: str) -> Iterator[PostgresTaskStore]:
    opened = PostgresTaskStore(postgres_dsn, schema=schema, min_size=1, max_size=1)
    yield opened
    opened.close()


def test_enqueue_and_claim_start_are_prepared_on_their_first_execution(single: PostgresTaskStore) -> None:
    single.create(durable("first"))
    statements = _prepared(single)
    assert [s for s in statements if "INSERT INTO" in s and "pg_notify" in s], statements

    got = single.claim_queued(
        "worker-a", names=["contract-task"], limit=1, lease_until=LEASE, start=ClaimStart(at=LEASE)
    )
    assert [snapshot.task_id for snapshot in got] == ["first"]
    statements = _prepared(single)
    assert [s for s in statements if "FOR UPDATE SKIP LOCKED" in s], statements


def _mixed_batch(store: PostgresTaskStore, prefix: str, creates: int, saves: int) -> None:
    """一次 ``write_many``：``creates`` 个新任务 + ``saves`` 项 save（先建好、各推进一步），逐项都写成。"""
    bases = [snap(f"{prefix}-s{i}") for i in range(saves)]
    for base in bases:
        store.create(base)
    fresh = [step(snap(f"{prefix}-c{i}"), TaskStatus.QUEUED) for i in range(creates)]
    moved = [step(base, TaskStatus.QUEUED) for base in bases]
    created, saved = store.write_many(
        [(snapshot, [record]) for snapshot, record in fresh],
        [SaveRequest(snapshot, 0, [record]) for snapshot, record in moved],
    )
    assert created == [None] * creates and saved == [None] * saves
    assert [store.get(snapshot.task_id) for snapshot, _ in moved] == [snapshot for snapshot, _ in moved]


def _batches(statements: list[str]) -> list[str]:
    return [s for s in statements if s.startswith(("WITH c ", "WITH u "))]


def test_group_commit_batches_are_prepared_on_their_first_execution(single: PostgresTaskStore) -> None:
    _mixed_batch(single, "mixed", creates=1, saves=2)  # Controller 路径上最常见的一种形状
    assert len(_batches(_prepared(single))) == 1, _prepared(single)
    current = [single.get(f"mixed-s{i}") for i in range(2)]
    moved = [step(snapshot, TaskStatus.STARTING) for snapshot in current if snapshot is not None]
    saved = single.save_many([SaveRequest(snapshot, 1, [record]) for snapshot, record in moved])
    assert saved == [None, None]
    assert [single.get(snapshot.task_id) for snapshot, _ in moved] == [snapshot for snapshot, _ in moved]
    assert len(_batches(_prepared(single))) == 2, _prepared(single)  # save_many 合成的一条（save_batch）


def test_large_rare_batches_keep_psycopgs_threshold(single: PostgresTaskStore) -> None:
    _mixed_batch(single, "wide", creates=2, saves=PREPARED_BATCH_ITEMS)  # 项数超过上限：第一次不预备
    assert _batches(_prepared(single)) == []
    _mixed_batch(single, "small", creates=1, saves=1)
    assert len(_batches(_prepared(single))) == 1


def test_prepare_threshold_none_still_prepares_nothing(postgres_dsn: str, schema: str) -> None:
    store = PostgresTaskStore(
        postgres_dsn, schema=schema, min_size=1, max_size=1, connect_kwargs={"prepare_threshold": None}
    )
    try:
        for index in range(7):  # 多于 psycopg 默认的门槛（5 次）
            store.create(durable(f"t-{index}", seconds=index))
            _mixed_batch(store, f"b{index}", creates=1, saves=2)
        store.claim_queued(
            "worker-a", names=["contract-task"], limit=1, lease_until=LEASE, start=ClaimStart(at=LEASE)
        )
        assert _prepared(store) == []
    finally:
        store.close()
