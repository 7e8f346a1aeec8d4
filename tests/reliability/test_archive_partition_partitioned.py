"""归档器在 DETACH 之后失联：其他节点写历史的 save 不能被它留在服务器上的 ACCESS EXCLUSIVE 锁挂住几个小时。

``archive_partition`` 在一个事务里导出、``DETACH``（拿到 ``transitions`` 的 ACCESS EXCLUSIVE 锁），
再核对、移回、``DROP``，最后 COMMIT。维护连接不是池里的会话，原先没有服务器端的空等上限：网络恰好在
DETACH 送到之后挂住（不是断开），服务器上的会话拿着这把锁停在 "idle in transaction"，直到 TCP
keepalive——其间每个节点的 save（要往 ``transitions`` 插行）都排队等锁，等到自己的 statement_timeout
报错（docs/distributed.md §7.5）。

这里用代理的 ``blackhole_after`` 把那一刻做成确定的：DETACH 那一批消息送到服务器，紧接着整个代理挂住。
同伴直连的 save 应在归档器的 ``network_timeout``（DETACH 之后的空等上限）之后不久完成，而不是等满自己的
statement_timeout 报错；服务器回滚了归档器的事务，分区仍挂着、历史一条不少。

真实的私有 PostgreSQL + 真实的 TCP 代理。
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from reliability_support import report, server_sessions, wait_until

from chongming_task import open_store
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.states import TaskStatus as S
from chongming_task.stores.postgres import _partitions

pytestmark = pytest.mark.postgres

JAN = datetime(2026, 1, 1, tzinfo=UTC)
FEB = datetime(2026, 2, 1, tzinfo=UTC)
ARCHIVER_NETWORK_TIMEOUT = 2.0  # 归档器 DETACH 之后在事务里空等的上限（= 它的 network_timeout）
PEER_STATEMENT_TIMEOUT = 8.0  # 同伴等锁最多这么久就报错：修复之前 save 正是这样失败的
SAVE_BOUND = ARCHIVER_NETWORK_TIMEOUT + 3.0


def _history(task_id: str, start: datetime, n: int) -> tuple[TaskSnapshot, list[Transition]]:
    records = [Transition(task_id, S.PENDING, S.QUEUED, "test:queued", "test", None, 1, start)]
    status = S.QUEUED
    for version in range(2, n + 1):
        target = S.RUNNING if status is not S.RUNNING else S.PAUSED
        at = start + timedelta(hours=version)
        records.append(Transition(task_id, status, target, "test:cycle", "test", None, version, at))
        status = target
    snapshot = TaskSnapshot(task_id=task_id, name="t", created_at=start, status=status, status_version=n)
    return snapshot, records


@pytest.mark.slow
def test_peer_save_is_not_blocked_by_an_archiver_partitioned_after_detach(
    proxied_schema: tuple[str, str], pg_proxy: Any, throwaway_pg: Any, figures_dir: Path
) -> None:
    proxied_url, direct_url = proxied_schema
    peer = open_store(direct_url, statement_timeout=PEER_STATEMENT_TIMEOUT)
    archiver = open_store(
        proxied_url,
        application_name="archiver-a",
        connect_timeout=2.0,
        pool_timeout=1.0,
        statement_timeout=1.0,
        network_timeout=ARCHIVER_NETWORK_TIMEOUT,
    )
    figures: dict[str, Any] = {}
    outcome: dict[str, str] = {}
    try:
        with peer._connection() as conn:  # type: ignore[attr-defined]
            _partitions.ensure_months(conn, peer.schema, JAN, JAN)  # type: ignore[attr-defined]
        old = {}
        for i in range(5):
            snap, records = _history(f"old-{i}", JAN + timedelta(days=i), 6)
            peer.create(snap, records)
            old[snap.task_id] = records
        now = datetime.now(UTC)
        live, live_records = _history("live", now, 1)
        peer.create(live, live_records)

        exported: list[Transition] = []

        def run_archive() -> None:
            try:
                result = archiver.archive_partition("transitions_p202601", FEB, exported.extend, batch=100)
                outcome["archive"] = f"returned {result!r}"[:300]
            except Exception as exc:  # 愈合之后：服务器早已结束了这个会话
                outcome["archive"] = f"raised {type(exc).__name__}: {exc}"[:300]

        pg_proxy.blackhole_after("DETACH PARTITION")
        thread = threading.Thread(target=run_archive, daemon=True)
        thread.start()
        assert wait_until(lambda: pg_proxy.cut_after_hits == 1, 10), "归档器的 DETACH 没有出现"
        cut_at = time.monotonic()
        time.sleep(0.3)  # 让服务器执行完 DETACH
        figures["archiver_sessions_after_cut"] = server_sessions(throwaway_pg.dsn, "archiver-a")
        figures["exported_before_cut"] = len(exported)

        saved = replace(live, status=S.RUNNING, status_version=2)
        step = Transition("live", S.QUEUED, S.RUNNING, "test:cycle", "peer", None, 2, datetime.now(UTC))
        started = time.monotonic()
        try:
            peer.save(saved, expect_version=1, transitions=[step])
            figures["peer_save"] = "returned"
        except Exception as exc:
            figures["peer_save"] = f"raised {type(exc).__name__}: {exc}"[:300]
        figures["peer_save_seconds"] = round(time.monotonic() - started, 2)
        figures["peer_save_after_cut_seconds"] = round(time.monotonic() - cut_at, 2)
        figures["archiver_sessions_after_save"] = server_sessions(throwaway_pg.dsn, "archiver-a")

        pg_proxy.heal()
        thread.join(10)
        figures["archive"] = outcome.get("archive", "still blocked")
        report(figures_dir, "archive_partition_partitioned_after_detach", figures)

        assert "idle in transaction" in figures["archiver_sessions_after_cut"], figures
        assert figures["peer_save"] == "returned", figures
        assert figures["peer_save_seconds"] <= SAVE_BOUND, figures
        assert "idle in transaction" not in figures["archiver_sessions_after_save"], figures
        # 服务器回滚了归档器的事务：DETACH 一并撤销，分区仍挂着，历史一条不少。
        assert not outcome.get("archive", "").startswith("returned"), figures
        with peer._connection() as conn:  # type: ignore[attr-defined]
            assert "transitions_p202601" in _partitions.expired(conn, peer.schema, FEB)  # type: ignore[attr-defined]
        for task_id, records in old.items():
            assert peer.history(task_id) == records, task_id
        assert [t.version for t in peer.history("live")] == [1, 2]
    finally:
        pg_proxy.heal()
        archiver.close()
        peer.close()
