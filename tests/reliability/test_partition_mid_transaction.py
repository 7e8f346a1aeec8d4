"""分区恰好落在 A 的事务中间：同伴 B 的 reconcile / stop / get 不能被 A 留在服务器上的行锁挂住。

test_split_brain.py 曾在负载下偶发失败：监督者 A 经一个挂住（不是拒绝）的 TCP 代理连库，挂住的那一刻
A 正在一个多语句事务里（旧实现的 ``touch_many``：BEGIN + 若干 UPDATE 先同步一次，再发 COMMIT）。
服务器执行完 UPDATE、拿着行锁、等 COMMIT；代理让服务器那一侧的 TCP 连接一直活着，服务器永远不知道
A 已经不在了（会话 "idle in transaction"，直到 TCP keepalive——几个小时）。B 的 reconcile 给 a-0
写 LOST 时排队等这把行锁，等到自己的 statement_timeout 报错：一个被隔离的节点挡住了所有同伴对它碰过的
任务的判定与控制。

这里把那一刻做成确定的：代理的 ``blackhole_after`` 让"A 给 a-0、a-1 续租"的那一批消息送到服务器，
紧接着整个代理挂住。两种情形：

* ``touch_many``：产品自己的续租写入。现在它是一条语句（服务器收到 Sync 就提交），服务器上不留锁；
* ``open_transaction``：A 的会话上任何一个显式事务（模拟以后的多语句写入）做完第一条语句就失联。
  B 的 reconcile 跳过被锁住的任务（报告为 skipped："这一轮不作判定"）而不是等锁；服务器在
  ``idle_in_transaction_session_timeout``（= A 的 network_timeout）之后结束 A 的会话、放掉锁，
  下一轮 reconcile 就把 a-0 判成 LOST。

真实的私有 PostgreSQL + 真实的 TCP 代理；B 直连。
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from reliability_support import check_history, report, server_sessions, wait_until

from chongming_task import Controller, TaskStatus, open_store

pytestmark = pytest.mark.postgres

S = TaskStatus
LEASE_TTL = 1.5
# A：network_timeout 5 秒，即服务器容忍 A 的会话"在事务里空等"的上限（idle_in_transaction_session_timeout）。
# 它比 CALL_BOUND 长得多：B 的调用若是在等 A 的锁、靠服务器结束 A 的会话才返回，就会超出 CALL_BOUND。
STORE_OPTIONS: dict[str, Any] = {
    "connect_timeout": 2.0,
    "pool_timeout": 1.0,
    "statement_timeout": 1.0,
    "network_timeout": 5.0,
}
CALL_BOUND = 1.5  # B 的每个控制调用（B 自己的 statement_timeout 是默认的 10 秒：等锁就会超出）
DECIDE_BOUND = 9.0  # A 失联后，B 最迟在这么久之内能把 a-0 判成 LOST（锁不会一直留着）


def timed(fn: Callable[[], Any], bound: float) -> tuple[float | None, str]:
    """在线程里调用 fn，最多等 bound 秒：返回 (用时或 None 表示仍挂着, 结果描述)。"""
    out: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            out["outcome"] = f"returned {fn()!r}"[:200]
        except Exception as exc:
            out["outcome"] = f"raised {type(exc).__name__}: {exc}"[:200]
        out["seconds"] = round(time.monotonic() - started, 2)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound)
    return out.get("seconds"), out.get("outcome", "blocked")


def verdicts(report: Any) -> dict[str, list[str]]:
    return {
        "lost": sorted(s.task_id for s in report.lost),
        "skipped": sorted(s.task_id for s in report.skipped),
    }


@pytest.mark.slow
@pytest.mark.parametrize("where", ["touch_many", "open_transaction"])
def test_peer_is_not_blocked_by_a_partitioned_transaction(
    where: str, proxied_schema: tuple[str, str], pg_proxy: Any, throwaway_pg: Any, figures_dir: Path
) -> None:
    proxied_url, direct_url = proxied_schema
    verify = open_store(direct_url)
    peer = Controller(store=open_store(direct_url), owner="peer-b", lease_ttl=LEASE_TTL)
    node_store = open_store(proxied_url, application_name="node-a", **STORE_OPTIONS)
    node = Controller(
        store=node_store, owner="node-a", side_channel_interval=0.05, lease_ttl=LEASE_TTL, graceful_stop=0.5
    )
    gate = threading.Event()

    def work(ctx: Any, n: int) -> dict[str, int]:
        while not gate.wait(0.01):
            ctx.checkpoint()
        return {"n": n}

    node.register("work", work)
    figures: dict[str, Any] = {"where": where}
    held: list[Any] = []
    try:
        runs = [node.submit("work", i, task_id=f"a-{i}") for i in range(2)]
        assert wait_until(
            lambda: all((s := verify.get(r.task_id)) is not None and s.status is S.RUNNING for r in runs), 10
        )
        if where == "touch_many":
            # A 的下一次续租（两个任务同一批）送到服务器之后，网络挂住。
            pg_proxy.blackhole_after("lease_until", "node-a", "a-0", "a-1")
        else:
            # A 的会话上一个显式事务：第一条 UPDATE 送到服务器（拿到 a-0 的行锁），之后网络挂住。
            conn = node_store.pool.getconn()  # type: ignore[attr-defined]
            held.append(conn)
            conn.execute("BEGIN")
            pg_proxy.blackhole_after("UPDATE", "a-0", "ct-open-transaction")
            statement = (
                f'UPDATE "{node_store.schema}".tasks SET name = name '  # type: ignore[attr-defined]
                "WHERE task_id = 'a-0' AND 'ct-open-transaction' IS NOT NULL"
            )

            def stuck_update() -> None:
                try:
                    conn.execute(statement)
                except Exception as exc:  # 愈合后服务器早已结束了这个会话
                    figures["open_transaction_error"] = f"{type(exc).__name__}: {exc}"[:200]

            threading.Thread(target=stuck_update, daemon=True).start()
        assert wait_until(lambda: pg_proxy.cut_after_hits == 1, 5), "A 的那一批消息没有出现"
        partitioned_at = time.monotonic()
        time.sleep(0.3)  # 让服务器执行完这一批
        figures["server_sessions_after_cut"] = server_sessions(throwaway_pg.dsn, "node-a")

        # A 的租约（存储里已提交的那一份）过期之后，B 才有东西可判。
        assert wait_until(
            lambda: (
                (s := verify.get("a-0")) is not None
                and s.lease_until is not None
                and s.lease_until.timestamp() < time.time() - 0.1
            ),
            LEASE_TTL + 3,
        )
        calls = {
            "reconcile": timed(lambda: verdicts(peer.reconcile()), CALL_BOUND + 10),
            "stop": timed(lambda: peer.stop("a-1", reason="分区期间从 B 停止"), CALL_BOUND + 10),
            "get": timed(lambda: peer.get("a-0"), CALL_BOUND + 10),
        }
        figures["peer_calls"] = calls

        rounds: list[str] = []

        def decide() -> bool:
            try:
                lost = {s.task_id for s in peer.reconcile().lost}
            except Exception as exc:
                rounds.append(f"raised {type(exc).__name__}")
                return False
            rounds.append("lost" if "a-0" in lost else "not decided")
            stored = verify.get("a-0")
            return stored is not None and stored.status is S.LOST

        decided = wait_until(decide, DECIDE_BOUND)
        figures["reconcile_rounds"] = f"{len(rounds)} rounds: {sorted(set(rounds))}"
        figures["a-0_decided_after"] = round(time.monotonic() - partitioned_at, 2)
        figures["server_sessions_after_decide"] = server_sessions(throwaway_pg.dsn, "node-a")
        stored = verify.get("a-0")
        figures["a-0_store"] = None if stored is None else f"{stored.status}/v{stored.status_version}"
        report(figures_dir, f"partition_mid_transaction_{where}", figures)

        for name, (seconds, result) in calls.items():
            assert seconds is not None and seconds <= CALL_BOUND, (name, result, figures)
            assert not result.startswith("raised"), (name, result, figures)
        if where == "touch_many":
            # 续租是一条语句：服务器收到 Sync 就提交了，没有会话拿着锁等一个永远不来的 COMMIT。
            assert "idle in transaction" not in figures["server_sessions_after_cut"], figures
            assert "'lost': ['a-0'" in calls["reconcile"][1], figures
        else:
            # 锁还在（服务器要等满 A 的 network_timeout 才结束那个会话）：这一轮不判，报告为 skipped。
            assert "'skipped': ['a-0']" in calls["reconcile"][1], figures
        assert decided, figures
        check_history(verify, "a-0")
    finally:
        gate.set()
        pg_proxy.heal()
        node.close(timeout=10, close_store=False)
        for conn in held:
            with suppress(Exception):
                node_store.pool.putconn(conn)  # type: ignore[attr-defined]
        node_store.close()
        peer.close(timeout=10, close_store=True)
        verify.close()
