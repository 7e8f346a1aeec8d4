"""网络分区后的脑裂（issue 22 第 2 条）：监督者 A 与数据库之间的连接挂住（不是被拒绝），超过了租约；
同伴 B 的 reconcile 把 A 在跑的任务判成 LOST；A 的任务随后在本地跑完。分区愈合之后：

* 存储里不能出现与 A 在同一版本上相互矛盾的内容（旧实现：存储 ``lost/v4``、A 报告 ``succeeded/v4``）：
  A 对外报告的（``get`` / ``list_tasks``）与存储逐个任务一致；
  A 的本地句柄（TaskRun）仍记着本进程实际跑出的结果；
* A 必须知道自己被隔离（fenced）了：``persist_failures`` 里有 operation 为 ``"fenced"`` 的记录，
  说明本地的结果与存储里的结论（docs/distributed.md 写明运维看到什么）；
* 分区期间 ``submit``、``list_tasks``、``stop()`` 在有文档的时限内返回或抛错，而不是一直挂着。

真实的私有 PostgreSQL + 真实的 TCP 代理（pg_proxy）：A 经代理连库，B 直连。
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from reliability_support import check_history, report, wait_until

from chongming_task import Controller, TaskStatus, open_store

pytestmark = pytest.mark.postgres

S = TaskStatus
LEASE_TTL = 1.5
# A 的存储：连接 2 秒、借连接 1 秒、单条语句 1 秒。文档给出的上界（docs/distributed.md）：
# 一次存储调用 ≤ pool_timeout + statement_timeout + 网络读余量（1 秒），这里即 ≤ 3 秒；测试留出调度余量。
STORE_OPTIONS: dict[str, Any] = {"connect_timeout": 2.0, "pool_timeout": 1.0, "statement_timeout": 1.0}
CALL_BOUND = 5.0
WINDOW = 6.0  # 分区期间等每个控制调用最多这么久（旧实现里它们会一直挂到分区愈合）


class TimedCall:
    """在线程里发起一次控制调用，记下它返回（或抛错）用了多久。"""

    def __init__(self, name: str, fn: Callable[[], Any]) -> None:
        self.name = name
        self.seconds: float | None = None
        self.outcome = "blocked"
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, args=(fn,), name=f"call-{name}", daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], Any]) -> None:
        try:
            fn()
            self.outcome = "returned"
        except Exception as exc:  # 抛错也算"有界"：调用方拿到了一个明确的失败
            self.outcome = f"raised {type(exc).__name__}"
        self.seconds = round(time.monotonic() - self._started, 2)

    def join(self, until: float) -> None:
        self._thread.join(max(0.0, until - time.monotonic()))


def contradictions(controller: Controller, verify: Any) -> list[str]:
    """愈合并收敛之后，A 对外报告的（get / list_tasks）必须与存储一致：要么存储追上了 A（A 仍持有租约），
    要么 A 认了存储的结论（A 被隔离）。同一版本上内容不同、或 A 报告的版本与存储分叉，都是矛盾。"""
    found = []
    listed = {s.task_id: s for s in controller.list_tasks()}
    for run in controller.runs():
        stored = verify.get(run.task_id)
        if stored is None:
            found.append(f"{run.task_id}: 存储里没有")
            continue
        for how, reported in (("get", controller.get(run.task_id)), ("list_tasks", listed.get(run.task_id))):
            assert reported is not None, f"{how}({run.task_id}) 没有返回"
            mine = (reported.status, reported.status_version, reported.failure and reported.failure.kind)
            theirs = (stored.status, stored.status_version, stored.failure and stored.failure.kind)
            if mine != theirs:
                found.append(f"{run.task_id}: {how} 报告 {mine}，存储为 {theirs}")
    return found


@pytest.mark.slow
def test_partitioned_supervisor_is_fenced_and_control_calls_are_bounded(
    proxied_schema: tuple[str, str], pg_proxy: Any, figures_dir: Path
) -> None:
    proxied_url, direct_url = proxied_schema
    verify = open_store(direct_url)
    peer = Controller(store=open_store(direct_url), owner="peer-b", lease_ttl=LEASE_TTL)
    node = Controller(
        store=open_store(proxied_url, **STORE_OPTIONS),
        owner="node-a",
        side_channel_interval=0.05,
        lease_ttl=LEASE_TTL,
        graceful_stop=0.5,
    )
    gate = threading.Event()

    def work(ctx: Any, n: int) -> dict[str, int]:
        while not gate.wait(0.01):
            ctx.checkpoint()
        return {"n": n}

    node.register("work", work)
    figures: dict[str, Any] = {}
    calls: list[TimedCall] = []
    try:
        runs = [node.submit("work", i, task_id=f"a-{i}") for i in range(2)]
        assert wait_until(lambda: all(r.status is S.RUNNING for r in runs), 10)
        assert wait_until(
            lambda: all((s := verify.get(r.task_id)) is not None and s.status is S.RUNNING for r in runs), 10
        )

        pg_proxy.blackhole()  # 分区：A 的连接挂住，不是被拒绝
        partitioned_at = time.monotonic()
        calls = [
            TimedCall("submit", lambda: node.submit("work", 9, task_id="during-0")),
            TimedCall("list_tasks", node.list_tasks),
            TimedCall("stop", lambda: node.stop("a-1", reason="分区期间停止")),
        ]
        for call in calls:
            call.join(partitioned_at + WINDOW)
        figures["calls_during_partition"] = {c.name: (c.seconds, c.outcome) for c in calls}

        # A 的租约早已过期（它续不上）；同伴 B 接管判定：在跑的任务被判 LOST。
        assert wait_until(lambda: time.monotonic() > partitioned_at + LEASE_TTL + 0.3, 10)
        reconciled = peer.reconcile()
        figures["peer_marked_lost"] = sorted(s.task_id for s in reconciled.lost)
        assert "a-0" in figures["peer_marked_lost"], figures

        gate.set()  # A 的任务在本地跑完（A 还不知道存储里已经判了 LOST）
        runs[0].done_event.wait(3)
        pg_proxy.heal()
        healed_at = time.monotonic()
        for call in calls:
            call.join(healed_at + 10)
        assert runs[0].wait(timeout=10).status is not None
        node.wait_all(timeout=10)
        # 愈合后给 A 的写穿层几轮后台循环去发现自己被隔离、如实记下。
        wait_until(lambda: not contradictions(node, verify), 5)
        found = contradictions(node, verify)
        fenced = [f for f in node.persist_failures if f.operation == "fenced"]
        stored = verify.get("a-0")
        figures.update(
            {
                "a-0_process": f"{node.get('a-0').status}/v{node.get('a-0').status_version}",  # type: ignore[union-attr]
                "a-0_store": None if stored is None else f"{stored.status}/v{stored.status_version}",
                "contradictions": found,
                "fenced_records": [f"{f.task_id}: {f.error[:160]}" for f in fenced],
            }
        )
        report(figures_dir, "split_brain", figures)
        for call in calls:
            assert call.seconds is not None and call.seconds <= CALL_BOUND, figures["calls_during_partition"]
        assert not found, figures
        assert any(f.task_id == "a-0" for f in fenced), figures
        assert runs[0].status is S.SUCCEEDED  # 本地句柄如实记着本进程跑出的结果
        assert "succeeded" in next(f.error for f in fenced if f.task_id == "a-0")  # 隔离记录里写着本地真相
        for task_id in ("a-0", "a-1"):
            check_history(verify, task_id)
    finally:
        gate.set()
        pg_proxy.heal()
        node.close(timeout=10, close_store=True)
        peer.close(timeout=10, close_store=True)
        verify.close()
