"""跨机器的形态：两个节点（两个 OS 进程、两个 owner、互不相交的桶）共用一个 PostgreSQL。

只换存储，owner / owned_buckets / reconcile() / 跨节点控制全部照旧。需要真实数据库
（CHONGMING_TEST_POSTGRES），CI 上跳过即失败。
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from chongming_task import BucketPolicy, Controller, FailureKind, TaskStatus, open_store

pytestmark = pytest.mark.postgres
S = TaskStatus
NUM_BUCKETS = 8


@pytest.fixture
def pg_url(postgres_dsn: str) -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg", reason="需要 psycopg 才能连 PostgreSQL")
    schema = f"ct_it_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    separator = "&" if "?" in postgres_dsn else "?"
    yield f"{postgres_dsn}{separator}schema={schema}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def key_in(low: int, high: int, salt: str = "") -> str:
    policy = BucketPolicy(NUM_BUCKETS)
    return next(k for k in (f"{salt}tenant-{i}" for i in range(1000)) if low <= policy.bucket_for(k) <= high)


def test_two_nodes_disjoint_buckets_see_and_stop_each_other(
    pg_url: str, spawn_worker: Any, wait_until: Any
) -> None:
    # 节点 B 在另一个 OS 进程里，负责桶 4-7，跑一个常驻任务。
    worker = spawn_worker(
        pg_url,
        "node-b",
        "b-resident",
        "resident",
        "--owned",
        "4-7",
        "--num-buckets",
        str(NUM_BUCKETS),
        "--bucket-key",
        key_in(4, 7),
    )
    node_a = Controller(
        store=open_store(pg_url), owner="node-a", owned_buckets=range(4), num_buckets=NUM_BUCKETS
    )
    gate = threading.Event()

    def hold(ctx: Any) -> str:
        while not gate.wait(0.005):
            ctx.checkpoint()
        return "a-done"

    node_a.register("hold", hold)
    mine = node_a.submit("hold", task_id="a-hold", bucket_key=key_in(0, 3))
    with pytest.raises(Exception, match="不属于本节点"):
        node_a.submit("hold", bucket_key=key_in(4, 7, "x"))
    # 各自只跑自己的任务，但看得到对方的。
    wait_until(lambda: node_a.get("b-resident") and node_a.get("b-resident").status is S.RUNNING)
    assert node_a.get("b-resident").owner == "node-b"
    assert {s.task_id for s in node_a.list_tasks()} == {"a-hold", "b-resident"}
    # A 停 B 的任务：写成指令，B 经 LISTEN/NOTIFY 立即取走。
    started = time.monotonic()
    assert node_a.stop("b-resident", reason="跨节点停止") is True
    status, value = worker.final(timeout=30)
    latency = time.monotonic() - started
    assert status == "succeeded" and value > 0
    assert latency < 10
    assert mine.status is S.RUNNING  # A 的任务不受影响
    gate.set()
    assert node_a.wait("a-hold", timeout=10).value == "a-done"
    node_a.close(close_store=True)


def test_reconcile_after_kill_nine_marks_only_dead_nodes_tasks(
    pg_url: str, spawn_worker: Any, wait_until: Any
) -> None:
    worker = spawn_worker(
        pg_url,
        "node-dead",
        "dead-task",
        "stubborn",
        "--lease-ttl",
        "1.5",
        "--owned",
        "0-3",
        "--num-buckets",
        str(NUM_BUCKETS),
        "--bucket-key",
        key_in(0, 3),
    )
    live = Controller(
        store=open_store(pg_url),
        owner="node-live",
        owned_buckets=range(4, 8),
        num_buckets=NUM_BUCKETS,
        lease_ttl=1.5,
        side_channel_interval=0.1,
    )
    gate = threading.Event()

    def hold(ctx: Any) -> None:
        while not gate.wait(0.005):
            ctx.checkpoint()

    live.register("hold", hold)
    live.submit("hold", task_id="live-task", bucket_key=key_in(4, 7))
    wait_until(lambda: live.get("dead-task") and live.get("dead-task").status is S.RUNNING)
    worker.kill()
    time.sleep(1.8)
    # 接替的节点负责死掉节点的桶。
    heir = Controller(
        store=open_store(pg_url), owner="node-heir", owned_buckets=range(4), num_buckets=NUM_BUCKETS
    )
    report = heir.reconcile()
    assert [s.task_id for s in report.lost] == ["dead-task"]
    lost = heir.get("dead-task")
    assert (
        lost.status is S.LOST
        and lost.failure.kind is FailureKind.LOST
        and "node-dead" in lost.failure.message
    )
    assert heir.get("live-task").status is S.RUNNING
    # 活节点自己的 reconcile 也不会碰自己的任务（租约在续）。
    assert live.reconcile().lost == []
    gate.set()
    live.wait("live-task", timeout=10)
    heir.close(close_store=True)
    live.close(close_store=True)


def test_backend_connections_killed_mid_run_task_survives_and_store_converges(
    pg_url: str, postgres_dsn: str, wait_until: Any
) -> None:
    psycopg = pytest.importorskip("psycopg")
    store = open_store(pg_url, pool_timeout=2.0)
    c = Controller(store=store, owner="flaky-node", side_channel_interval=0.05)
    gate = threading.Event()

    def work(ctx: Any) -> str:
        while not gate.wait(0.005):
            ctx.checkpoint()
            ctx.progress(1)
        return "finished"

    c.register("work", work)
    run = c.submit("work", task_id="survivor")
    wait_until(lambda: run.status is S.RUNNING)
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        # 把这个库上除自己以外的连接全部断掉（模拟数据库重启/网络闪断）。
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name <> 'psql'"
        )
    gate.set()
    outcome = run.wait(timeout=10)
    assert outcome.ok and outcome.value == "finished"  # 任务不因存储故障失败
    # 连接池换掉断开的连接之后，存储追平到终态。
    wait_until(
        lambda: store.get("survivor") is not None and store.get("survivor").status is S.SUCCEEDED, timeout=20
    )
    assert store.history("survivor") == list(run.transitions)
    c.close(close_store=True)


def test_locked_task_table_never_hangs_stop_or_get(pg_url: str, postgres_dsn: str, wait_until: Any) -> None:
    """任务表被锁住（或服务器挂住）时：写穿受 statement_timeout 约束，stop()/get() 有界返回，事后存储追平。"""
    psycopg = pytest.importorskip("psycopg")
    store = open_store(pg_url, statement_timeout=1.0)
    c = Controller(store=store, owner="probe", side_channel_interval=0.05)
    stopped = threading.Event()

    def work(ctx: Any) -> None:
        while True:
            ctx.checkpoint()
            time.sleep(0.005)

    c.register("w", work)
    run = c.submit("w", task_id="t1")
    wait_until(lambda: run.status is S.RUNNING)
    schema = pg_url.rsplit("schema=", 1)[1]
    admin = psycopg.connect(postgres_dsn)
    try:
        admin.execute(f'LOCK TABLE "{schema}".tasks IN ACCESS EXCLUSIVE MODE')
        started = time.monotonic()
        threading.Thread(
            target=lambda: (c.stop("t1", reason="锁表期间停止"), stopped.set()), daemon=True
        ).start()
        assert stopped.wait(10), "stop() 在表被锁时卡住了"
        snapshot = c.get("t1")
        assert snapshot is not None
        assert time.monotonic() - started < 10
        wait_until(lambda: run.status is S.STOPPED, timeout=15)
        assert c.persist_failures  # 写不进去的那几次如实记下
    finally:
        admin.rollback()
        admin.close()
    wait_until(lambda: store.get("t1") is not None and store.get("t1").status is S.STOPPED, timeout=20)
    assert store.history("t1") == list(run.transitions)
    c.close(close_store=True)
