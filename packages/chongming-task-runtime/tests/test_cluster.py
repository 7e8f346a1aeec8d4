"""集群运维检查（check_cluster / node_record / ClusterReport）：每一类发现各一个用例，外加健康的
4 节点 × 64 桶划分，以及两个进程在同一个 SQLite 文件上发布、第三方检查。

全部用 FakeClock：节点过期与租约过期都靠 ``clock.advance``，不睡眠。
"""

from __future__ import annotations

import json
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from prefork import python_run

from chongming_task.errors import ConfigurationError
from chongming_task.models import TaskSnapshot
from chongming_task.runtime.cluster import (
    DEFAULT_ORPHAN_LIMIT,
    ClusterReport,
    check_cluster,
    format_buckets,
    node_record,
)
from chongming_task.states import TaskStatus
from chongming_task.storage import NodeRecord, TaskStore
from chongming_task.stores.memory import InMemoryTaskStore
from chongming_task.stores.sqlite import SqliteTaskStore
from chongming_task.testing import FakeClock

S = TaskStatus
T0 = datetime(2026, 3, 1, 8, 0, 0, tzinfo=UTC)
TTL = 30.0
N = 64


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=T0)


@pytest.fixture
def store(clock: FakeClock) -> Any:
    store = InMemoryTaskStore(clock=clock)
    yield store
    store.close()


def publish(
    store: TaskStore, clock: FakeClock, owner: str, buckets: Any, *, num_buckets: int = N
) -> NodeRecord:
    record = node_record(owner, buckets, num_buckets=num_buckets, ttl=TTL, clock=clock)
    store.publish_node(record)
    return record


def task(
    store: TaskStore,
    clock: FakeClock,
    task_id: str,
    *,
    bucket: int | None,
    status: TaskStatus = S.QUEUED,
    lease_owner: str | None = None,
    lease_for: float = TTL,
) -> TaskSnapshot:
    """一个任务：默认排队中，租约由 lease_owner 持有、从现在起 lease_for 秒。"""
    now = clock.now()
    snapshot = TaskSnapshot(
        task_id=task_id,
        name="sync",
        created_at=now,
        status=status,
        bucket=bucket,
        lease_owner=lease_owner,
        lease_until=None if lease_owner is None else now + timedelta(seconds=lease_for),
    )
    store.create(snapshot)
    clock.advance(0.001)  # 创建时间各不相同：孤儿按创建先后排序
    return snapshot


def four_nodes(store: TaskStore, clock: FakeClock) -> list[str]:
    owners = [f"node-{i}" for i in range(4)]
    for i, owner in enumerate(owners):
        publish(store, clock, owner, range(i * 16, (i + 1) * 16))
    return owners


# -- healthy -------------------------------------------------------------------------------------------


def test_healthy_four_node_partition_of_64_buckets(store: TaskStore, clock: FakeClock) -> None:
    owners = four_nodes(store, clock)
    for bucket in range(0, N, 3):
        owner = owners[bucket // 16]
        task(store, clock, f"t-{bucket}", bucket=bucket, status=S.RUNNING, lease_owner=owner)
    task(store, clock, "done", bucket=5, status=S.SUCCEEDED)  # 终态任务无所谓有没有人管
    report = check_cluster(store, num_buckets=N, clock=clock)
    assert report.healthy
    assert report.problems() == []
    assert report.warnings() == []
    assert [r.owner for r in report.nodes] == owners
    assert report.duplicates == {} and report.holes == () and report.orphans == ()
    assert report.orphan_count == 0
    assert report.stale_nodes == () and report.unpartitioned == () and report.mismatched == ()
    assert report.num_buckets == N and report.checked_at == clock.now()
    assert report.owners_of(17) == ("node-1",)
    assert json.loads(json.dumps(report.to_dict()))["healthy"] is True


def test_node_record_fills_heartbeat_ttl_and_default_info(clock: FakeClock) -> None:
    record = node_record(
        "node-a", range(4), num_buckets=8, ttl=12.5, clock=clock, info={"role": "etl", "pid": 7}
    )
    assert record.buckets == frozenset({0, 1, 2, 3})
    assert record.heartbeat_at == T0 and record.expires_at == T0 + timedelta(seconds=12.5)
    assert record.info["role"] == "etl" and record.info["pid"] == 7, "调用方给的 info 优先"
    assert {"hostname", "version"} <= set(record.info)
    assert record.alive(T0 + timedelta(seconds=12)) and not record.alive(T0 + timedelta(seconds=12.5))
    unlimited = node_record("node-b", None, num_buckets=8, ttl=1, clock=clock)
    assert unlimited.buckets is None and not unlimited.partitioned


# -- duplicates ----------------------------------------------------------------------------------------


def test_duplicate_claims_are_reported_grouped_by_owners(store: TaskStore, clock: FakeClock) -> None:
    publish(store, clock, "node-a", range(32))
    publish(store, clock, "node-b", range(24, 64))
    publish(store, clock, "node-c", {40})
    report = check_cluster(store, num_buckets=N, clock=clock)
    assert not report.healthy
    assert report.holes == ()
    assert set(report.duplicates) == set(range(24, 32)) | {40}
    assert report.duplicates[24] == ("node-a", "node-b")
    assert report.duplicates[40] == ("node-b", "node-c")
    problems = report.problems()
    assert len(problems) == 2, problems
    assert "桶 24–31 被 2 个节点重复认领：node-a、node-b" in problems[0]
    assert "桶 40 被 2 个节点重复认领：node-b、node-c" in problems[1]


# -- holes ---------------------------------------------------------------------------------------------


def test_holes_and_the_tasks_stranded_in_them(store: TaskStore, clock: FakeClock) -> None:
    publish(store, clock, "node-a", range(16))
    publish(store, clock, "node-b", range(16, 32))
    stranded = task(store, clock, "stranded", bucket=40, lease_owner="node-a")  # 租约有效也没用：桶无人负责
    task(store, clock, "finished", bucket=41, status=S.FAILED)
    task(store, clock, "fine", bucket=3, lease_owner="node-a")
    report = check_cluster(store, num_buckets=N, clock=clock)
    assert report.holes == tuple(range(32, 64))
    assert [s.task_id for s in report.orphans] == ["stranded"]
    assert report.orphan_count == 1
    assert report.orphan_reason(report.orphans[0]) == "桶 40 无人认领"
    problems = report.problems()
    assert problems[0].startswith("桶 32–63 无人认领（共 32 个）")
    assert any(stranded.task_id in line and "桶 40 无人认领" in line for line in problems)


def test_no_alive_node_means_every_bucket_is_a_hole(store: TaskStore, clock: FakeClock) -> None:
    task(store, clock, "t-1", bucket=7)
    task(store, clock, "t-2", bucket=None)  # 无桶、没有租约：同样没人管
    report = check_cluster(store, num_buckets=8, clock=clock)
    assert report.nodes == ()
    assert report.holes == tuple(range(8))
    assert [s.task_id for s in report.orphans] == ["t-1", "t-2"]
    assert report.orphan_reason(report.orphans[1]) == "没有任何节点持有它的租约"
    assert report.problems()[0].startswith("没有任何存活的节点：全部 8 个桶都无人负责")


def test_only_unpartitioned_nodes_have_no_holes(store: TaskStore, clock: FakeClock) -> None:
    publish(store, clock, "solo", None)
    task(store, clock, "t-1", bucket=9, lease_owner="solo")
    report = check_cluster(store, num_buckets=N, clock=clock)
    assert report.healthy, report.problems()
    assert report.holes == ()
    assert [r.owner for r in report.unpartitioned] == ["solo"]
    assert report.owners_of(9) == ("solo",)


def test_unpartitioned_node_among_partitioned_ones_is_a_warning(store: TaskStore, clock: FakeClock) -> None:
    four_nodes(store, clock)
    publish(store, clock, "ops-console", None)
    report = check_cluster(store, num_buckets=N, clock=clock)
    assert report.healthy
    (warning,) = report.warnings()
    assert "ops-console" in warning and "owned_buckets=None" in warning


# -- node expiry ---------------------------------------------------------------------------------------


def test_expired_node_turns_its_buckets_into_holes_until_it_heartbeats_again(
    store: TaskStore, clock: FakeClock
) -> None:
    owners = four_nodes(store, clock)
    task(store, clock, "on-node-3", bucket=50, status=S.RUNNING, lease_owner="node-3", lease_for=3600)
    clock.advance(TTL / 2)
    for owner in owners[:3]:  # node-3 不再心跳
        publish(store, clock, owner, range(owners.index(owner) * 16, (owners.index(owner) + 1) * 16))
    clock.advance(TTL / 2)
    report = check_cluster(store, num_buckets=N, clock=clock)
    assert [r.owner for r in report.stale_nodes] == ["node-3"]
    assert report.holes == tuple(range(48, 64))
    assert [s.task_id for s in report.orphans] == ["on-node-3"]
    (warning,) = report.warnings()
    assert "node-3 的心跳已过期 0 秒" in warning and "remove_node" in warning

    publish(store, clock, "node-3", range(48, 64))  # 节点回来了
    again = check_cluster(store, num_buckets=N, clock=clock)
    assert again.healthy and again.stale_nodes == ()


# -- mismatched ----------------------------------------------------------------------------------------


def test_node_with_a_different_bucket_count_is_mismatched(store: TaskStore, clock: FakeClock) -> None:
    publish(store, clock, "node-a", range(32))
    publish(store, clock, "node-b", range(32), num_buckets=32)  # 配错了桶数：它的 0..31 不是我们的 0..31
    report = check_cluster(store, num_buckets=N, clock=clock)
    assert [r.owner for r in report.mismatched] == ["node-b"]
    assert report.duplicates == {}, "桶数不同的节点不参与重复计算"
    assert report.holes == tuple(range(32, 64))
    assert any("node-b 的桶数是 32，与检查用的 64 不同" in line for line in report.problems())
    assert not report.healthy


def test_num_buckets_is_inferred_from_alive_nodes(store: TaskStore, clock: FakeClock) -> None:
    publish(store, clock, "a", range(8), num_buckets=16)
    publish(store, clock, "b", range(8, 16), num_buckets=16)
    publish(store, clock, "c", range(4), num_buckets=8)
    report = check_cluster(store, clock=clock)
    assert report.num_buckets == 16
    assert [r.owner for r in report.mismatched] == ["c"]
    assert report.holes == ()
    assert check_cluster(InMemoryTaskStore(clock=clock), clock=clock).num_buckets == 64


# -- orphans by lease ----------------------------------------------------------------------------------


def test_orphans_by_expired_lease_of_a_node_that_is_gone(store: TaskStore, clock: FakeClock) -> None:
    four_nodes(store, clock)
    task(store, clock, "crashed-1", bucket=2, status=S.RUNNING, lease_owner="node-old", lease_for=5)
    task(store, clock, "crashed-2", bucket=None, status=S.PAUSED, lease_owner="node-old", lease_for=5)
    task(store, clock, "renewing", bucket=3, status=S.RUNNING, lease_owner="node-unknown", lease_for=600)
    task(store, clock, "mine-late", bucket=4, status=S.QUEUED, lease_owner="node-0", lease_for=5)
    task(store, clock, "over", bucket=2, status=S.LOST, lease_owner="node-old", lease_for=5)
    before = check_cluster(store, num_buckets=N, clock=clock)
    assert before.healthy, "租约都还有效：没有孤儿"
    clock.advance(10)
    for i in range(4):
        publish(store, clock, f"node-{i}", range(i * 16, (i + 1) * 16))
    report = check_cluster(store, num_buckets=N, clock=clock)
    # renewing：租约有效（有人在续）；mine-late：持有者是存活节点；over：已是终态。
    assert [s.task_id for s in report.orphans] == ["crashed-1", "crashed-2"]
    reason = report.orphan_reason(report.orphans[0])
    assert reason.startswith("监督者 node-old 不是存活节点，租约已于 ") and "过期" in reason
    assert report.holes == ()
    lines = report.problems()
    assert lines[0] == "2 个未结束的任务没有节点负责（下面列出最旧的 2 个）"
    assert lines[1].startswith("孤儿任务 crashed-1（sync，running）：监督者 node-old")


def test_orphan_limit_truncates_snapshots_but_not_the_count(store: TaskStore, clock: FakeClock) -> None:
    publish(store, clock, "node-a", range(32))
    for i in range(18):
        task(store, clock, f"hole-{i:02d}", bucket=32 + i)
    for i in range(12):
        task(store, clock, f"dead-{i:02d}", bucket=i, lease_owner="gone", lease_for=1)
    clock.advance(5)
    publish(store, clock, "node-a", range(32))
    report = check_cluster(store, num_buckets=N, clock=clock, orphan_limit=5)
    assert report.orphan_count == 30
    assert [s.task_id for s in report.orphans] == [f"hole-{i:02d}" for i in range(5)], "最旧的在前"
    assert report.orphans_truncated
    lines = report.problems()
    assert "30 个未结束的任务没有节点负责（下面列出最旧的 5 个）" in lines
    assert lines[-1] == "……另有 25 个孤儿任务未列出"
    assert any("只带回了 5 个（共 30 个）" in w for w in report.warnings())
    none = check_cluster(store, num_buckets=N, clock=clock, orphan_limit=0)
    assert none.orphans == () and none.orphan_count == 30
    assert none.problems()[-1] == "……另有 30 个孤儿任务未列出"
    full = check_cluster(store, num_buckets=N, clock=clock)
    assert len(full.orphans) == 30 and not full.orphans_truncated
    assert DEFAULT_ORPHAN_LIMIT == 1000


# -- validation ----------------------------------------------------------------------------------------


def test_bad_arguments_get_chinese_errors(store: TaskStore, clock: FakeClock) -> None:
    cases: list[tuple[Any, str]] = [
        (lambda: check_cluster(store, num_buckets=0, clock=clock), "num_buckets"),
        (lambda: check_cluster(store, num_buckets=N, clock=clock, orphan_limit=-1), "orphan_limit"),
        (lambda: check_cluster(store, num_buckets=N, clock=clock, orphan_limit=True), "orphan_limit"),
        (lambda: check_cluster("tasks.db", num_buckets=N, clock=clock), "TaskStore"),  # type: ignore[arg-type]
        (lambda: node_record("", range(4), num_buckets=N, ttl=1, clock=clock), "owner"),
        (lambda: node_record("a", range(4), num_buckets=N, ttl=0, clock=clock), "ttl"),
        (lambda: node_record("a", range(4), num_buckets=N, ttl=float("inf"), clock=clock), "ttl"),
        (lambda: node_record("a", [64], num_buckets=N, ttl=1, clock=clock), "越界"),
        (lambda: node_record("a", 3, num_buckets=N, ttl=1, clock=clock), "集合"),  # type: ignore[arg-type]
        (lambda: node_record("a", None, num_buckets=N, ttl=1, clock=clock, info=[1]), "info"),  # type: ignore[arg-type]
    ]
    for call, needle in cases:
        with pytest.raises(ConfigurationError, match=needle):
            call()


def test_format_buckets_compresses_runs() -> None:
    assert format_buckets([9, 0, 1, 2, 3, 7, 10, 3]) == "0–3、7、9–10"
    assert format_buckets([5]) == "5"
    assert format_buckets([]) == "（无）"


def test_report_is_frozen_and_json_serializable(store: TaskStore, clock: FakeClock) -> None:
    publish(store, clock, "node-a", range(40))
    publish(store, clock, "node-b", range(32, 48))
    task(store, clock, "stranded", bucket=60)
    report = check_cluster(store, num_buckets=N, clock=clock)
    assert isinstance(report, ClusterReport)
    with pytest.raises(AttributeError):
        report.holes = ()  # type: ignore[misc]
    data = json.loads(json.dumps(report.to_dict(), ensure_ascii=False))
    assert data["healthy"] is False
    assert data["duplicates"]["32"] == ["node-a", "node-b"]
    assert data["holes"] == list(range(48, 64))
    assert data["orphans"] == [
        {
            "task_id": "stranded",
            "name": "sync",
            "status": "queued",
            "bucket": 60,
            "lease_owner": None,
            "reason": "桶 60 无人认领",
        }
    ]
    assert data["problems"] == report.problems()


# -- SQLite: two processes publish into one file, a third store checks -------------------------------------

_CHILD = textwrap.dedent(
    """
    import sys
    from datetime import datetime, timedelta
    from chongming_task.models import TaskSnapshot
    from chongming_task.runtime.cluster import node_record
    from chongming_task.stores.sqlite import SqliteTaskStore
    from chongming_task.testing import FakeClock

    path, start = sys.argv[1], datetime.fromisoformat(sys.argv[2])
    clock = FakeClock(start=start)
    store = SqliteTaskStore(path, clock=clock)
    store.publish_node(node_record("node-b", range(24, 64), num_buckets=64, ttl=30, clock=clock,
                                   info={"来自": "子进程"}))
    store.create(TaskSnapshot(task_id="left-behind", name="sync", created_at=start, bucket=20,
                              lease_owner="node-x", lease_until=start + timedelta(seconds=1)))
    store.close()
    """
)


def test_two_processes_on_one_sqlite_file(tmp_path: Path, clock: FakeClock) -> None:
    path = tmp_path / "cluster.db"
    node_a = SqliteTaskStore(path, clock=clock)
    try:
        node_a.publish_node(node_record("node-a", range(32), num_buckets=N, ttl=TTL, clock=clock))
        # 经预导入的模板进程 fork（tests/support/prefork.py），省掉解释器启动与导入。
        done = python_run(
            ["-c", _CHILD, str(path), clock.now().isoformat()],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        clock.advance(5)
        checker = SqliteTaskStore(path)  # 第三个连接：运维的检查端
        try:
            report = check_cluster(checker, num_buckets=N, clock=clock)
        finally:
            checker.close()
    finally:
        node_a.close()
    assert [r.owner for r in report.nodes] == ["node-a", "node-b"]
    assert report.nodes[1].info["来自"] == "子进程"
    assert set(report.duplicates) == set(range(24, 32))
    assert report.holes == ()
    assert [s.task_id for s in report.orphans] == ["left-behind"]
    assert "node-x" in report.orphan_reason(report.orphans[0])
    clock.advance(TTL)  # 两个节点都不再心跳
    reopened = SqliteTaskStore(path)
    try:
        later = check_cluster(reopened, num_buckets=N, clock=clock)
    finally:
        reopened.close()
    assert later.nodes == () and [r.owner for r in later.stale_nodes] == ["node-a", "node-b"]
    assert later.holes == tuple(range(N))


# -- Postgres: two stores (two pools) on one schema --------------------------------------------------------


@pytest.mark.postgres
def test_two_nodes_on_postgres(postgres_dsn: str, clock: FakeClock) -> None:
    pytest.importorskip("psycopg", reason='需要 psycopg 3（pip install "chongming-task[postgres]"）')
    import secrets

    import psycopg

    from chongming_task.stores.postgres import PostgresTaskStore

    schema = f"ct_cluster_{secrets.token_hex(4)}"
    stores = [PostgresTaskStore(postgres_dsn, schema=schema, max_size=2, clock=clock) for _ in range(2)]
    try:
        for i, store in enumerate(stores):
            store.publish_node(
                node_record(f"node-{i}", range(i * 32, (i + 1) * 32), num_buckets=N, ttl=TTL, clock=clock)
            )
        task(stores[0], clock, "crashed", bucket=40, status=S.RUNNING, lease_owner="node-9", lease_for=1)
        task(stores[1], clock, "alive", bucket=41, status=S.RUNNING, lease_owner="node-1", lease_for=600)
        clock.advance(2)
        report = check_cluster(stores[1], num_buckets=N, clock=clock)
        assert [r.owner for r in report.nodes] == ["node-0", "node-1"]
        assert report.duplicates == {} and report.holes == ()
        assert [s.task_id for s in report.orphans] == ["crashed"]
        assert stores[0].remove_node("node-1") is True
        after = check_cluster(stores[0], num_buckets=N, clock=clock)
        assert after.holes == tuple(range(32, 64))
        assert [s.task_id for s in after.orphans] == ["crashed", "alive"]
    finally:
        for store in stores:
            store.close()
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
