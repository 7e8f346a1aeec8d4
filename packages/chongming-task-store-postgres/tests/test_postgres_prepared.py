"""热路径的语句第一次执行就是服务器端预备语句（``store._execute_hot``，issue 19，dur17）。

psycopg 默认执行到第 5 次才 PREPARE，之前每次都让服务器重新解析、规划；持久任务的两条热语句（入队的建任务、
worker 的认领并开始）在每条新连接上因此多规划 5 次。这里用只有一条连接的池，在同一条连接上查
``pg_prepared_statements``：第一次执行之后它们已在里面。连接参数 ``prepare_threshold=None``（例如经事务模式的
pgbouncer 时）照旧一条也不预备——psycopg 对 ``prepare=True`` 也尊重这个设置。
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from chongming_task.core.storage.claiming import ClaimStart
from chongming_task.stores.postgres import PostgresTaskStore
from chongming_task.testing.contract.durable import durable

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


def test_prepare_threshold_none_still_prepares_nothing(postgres_dsn: str, schema: str) -> None:
    store = PostgresTaskStore(
        postgres_dsn, schema=schema, min_size=1, max_size=1, connect_kwargs={"prepare_threshold": None}
    )
    try:
        for index in range(7):  # 多于 psycopg 默认的门槛（5 次）
            store.create(durable(f"t-{index}", seconds=index))
        store.claim_queued(
            "worker-a", names=["contract-task"], limit=1, lease_until=LEASE, start=ClaimStart(at=LEASE)
        )
        assert _prepared(store) == []
    finally:
        store.close()
