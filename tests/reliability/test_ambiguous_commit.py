"""回执丢失的提交（issue 22 第 1 条）：服务器已经提交，客户端却只看到"连接在语句中途断了"。

用真实的私有 PostgreSQL（另一个端口）+ 真实的 TCP 故障代理（pg_proxy.PgFaultProxy）：代理把匹配的
那一批写整批交给服务器，等服务器提交并回 ReadyForQuery 之后再切断连接，回执一个字节都不放回去。

判据（全部经公开 API：Controller + PostgresTaskStore）：

* save 的回执丢了：存储最终与进程的真相一致——快照（状态、版本）与整段历史逐条相等；
  之后同伴的 reconcile 不把已完成的任务判成 LOST。
* create 的回执丢了：不会永远 DuplicateTaskId、persist_failures 不会一直增长；存储追平。
* 崩溃矩阵的"丢回执"车道：大量任务、随机丢掉一成的写回执，收敛后 0 个存储落后、0 个已完成任务被判 LOST。
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from reliability_support import check_history, report, wait_until

from chongming_task import Controller, FixedBackoff, RetryPolicy, TaskStatus, open_store
from chongming_task.storage import TaskStore

pytestmark = pytest.mark.postgres

S = TaskStatus
LEASE_TTL = 1.0
# 经代理的存储：每个调用都有短的客户端上限，故障期间不会把测试挂住。
PROXIED_OPTIONS: dict[str, Any] = {"connect_timeout": 2.0, "pool_timeout": 2.0, "statement_timeout": 2.0}


def behind(controller: Controller, store: TaskStore) -> list[str]:
    """存储与进程不一致的任务（快照状态/版本或历史不同）。"""
    lagging = []
    for run in controller.runs():
        stored = store.get(run.task_id)
        if (
            stored is None
            or stored.status_version != run.snapshot.status_version
            or stored.status is not run.status
            or store.history(run.task_id) != list(run.transitions)
        ):
            lagging.append(run.task_id)
    return lagging


def gated_work(gate: threading.Event) -> Callable[..., dict[str, int]]:
    def work(ctx: Any, n: int) -> dict[str, int]:
        while not gate.wait(0.01):
            ctx.checkpoint()
        return {"n": n}

    return work


# 用迁移的触发源瞄准那次 save（它出现在 save 一并写入的迁移记录里）：进入 running 的是 executor:launched，
# 进入 succeeded 的是 executor:returned（core 的触发源表）。
LOST_SAVE_TRIGGER = {"running": "executor:launched", "succeeded": "executor:returned"}


@pytest.mark.parametrize(
    "lost_status",
    ["running", "succeeded"],
)
def test_save_whose_commit_reply_is_lost_converges_to_the_process_truth(
    proxied_schema: tuple[str, str], pg_proxy: Any, figures_dir: Path, lost_status: str
) -> None:
    proxied_url, direct_url = proxied_schema
    store = open_store(proxied_url, **PROXIED_OPTIONS)
    verify = open_store(direct_url)
    peer = Controller(store=open_store(direct_url), owner="peer-b", lease_ttl=LEASE_TTL)
    controller = Controller(store=store, owner="node-a", side_channel_interval=0.05, lease_ttl=LEASE_TTL)
    gate = threading.Event()
    controller.register("work", gated_work(gate))
    task_id = f"ambiguous-save-{lost_status}"
    try:
        # 瞄准"把这个任务写成 lost_status 的那次 save"：UPDATE 任务表、参数里有 task_id 与那条迁移的触发源。
        pg_proxy.lose_reply("UPDATE", ".tasks SET", task_id, LOST_SAVE_TRIGGER[lost_status])
        run = controller.submit("work", 1, task_id=task_id)
        assert wait_until(lambda: run.status is S.RUNNING, 10)
        gate.set()
        assert run.wait(timeout=10).status is S.SUCCEEDED
        assert wait_until(lambda: pg_proxy.lost_replies == 1, 5), "代理没有吞掉那次回执：故障没有注入"
        converged_in = time.monotonic()
        converged = wait_until(lambda: not behind(controller, verify), 5)
        converged_in = time.monotonic() - converged_in
        stored = verify.get(task_id)
        assert stored is not None
        failures = controller.persist_failures
        figures: dict[str, Any] = {
            "lost_status": lost_status,
            "process": f"{run.status}/v{run.snapshot.status_version}",
            "store": f"{stored.status}/v{stored.status_version}",
            "versions_behind": run.snapshot.status_version - stored.status_version,
            "persist_failures": len(failures),
            "failure_samples": [f"{f.operation}: {f.error[:120]}" for f in failures[-3:]],
            "seconds_to_converge": round(converged_in, 2),
        }
        # 租约过期之后，同伴的 reconcile 不许把一个已完成的任务判成 LOST。
        time.sleep(LEASE_TTL * 1.5)
        reconciled = peer.reconcile()
        figures["reported_lost_by_peer"] = sorted(s.task_id for s in reconciled.lost)
        report(figures_dir, f"ambiguous_save_{lost_status}", figures)
        assert converged, f"存储没有收敛到进程的真相：{figures}"
        check_history(verify, task_id)
        assert verify.history(task_id) == list(run.transitions)
        assert task_id not in figures["reported_lost_by_peer"], figures
        assert not any("ConcurrencyConflict" in f.error for f in failures), figures
    finally:
        gate.set()
        pg_proxy.heal()
        controller.close(timeout=10, close_store=True)
        peer.close(timeout=10, close_store=True)
        verify.close()


def test_create_whose_commit_reply_is_lost_does_not_end_in_duplicate_task_id(
    proxied_schema: tuple[str, str], pg_proxy: Any, figures_dir: Path
) -> None:
    proxied_url, direct_url = proxied_schema
    store = open_store(proxied_url, **PROXIED_OPTIONS)
    verify = open_store(direct_url)
    controller = Controller(store=store, owner="node-a", side_channel_interval=0.05, lease_ttl=LEASE_TTL)
    gate = threading.Event()
    controller.register("work", gated_work(gate))
    task_id = "ambiguous-create"
    try:
        pg_proxy.lose_reply("INSERT INTO", ".tasks", task_id)
        run = controller.submit("work", 1, task_id=task_id)  # 回执丢了：提交照常返回，任务照常运行
        assert wait_until(lambda: pg_proxy.lost_replies == 1, 5), "代理没有吞掉 create 的回执"
        assert wait_until(lambda: run.status is S.RUNNING, 10)
        time.sleep(0.5)  # 给写穿层足够多轮后台循环：旧实现在这里每一轮都撞 DuplicateTaskId
        gate.set()
        assert run.wait(timeout=10).status is S.SUCCEEDED
        converged = wait_until(lambda: not behind(controller, verify), 5)
        stored = verify.get(task_id)
        failures = controller.persist_failures
        figures = {
            "process": f"{run.status}/v{run.snapshot.status_version}",
            "store": None if stored is None else f"{stored.status}/v{stored.status_version}",
            "persist_failures": len(failures),
            "duplicate_task_id_failures": sum("DuplicateTaskId" in f.error for f in failures),
        }
        report(figures_dir, "ambiguous_create", figures)
        assert converged, f"create 的回执丢失后存储没有追平：{figures}"
        assert figures["duplicate_task_id_failures"] == 0, figures
        # 唯一一条失败记录是那次结果未知的 create 本身（如实记下），之后不再增长。
        assert len(failures) <= 1, figures
        check_history(verify, task_id)
    finally:
        gate.set()
        pg_proxy.heal()
        controller.close(timeout=10, close_store=True)
        verify.close()


@pytest.mark.slow
def test_crash_matrix_lost_acknowledgement_lane(
    proxied_schema: tuple[str, str], pg_proxy: Any, figures_dir: Path
) -> None:
    """崩溃矩阵的丢回执车道：每一次状态写都有一成概率"提交了但回执丢了"（create、save、续租都算）。"""
    proxied_url, direct_url = proxied_schema
    store = open_store(proxied_url, **PROXIED_OPTIONS)
    verify = open_store(direct_url)
    peer = Controller(store=open_store(direct_url), owner="peer-b", lease_ttl=LEASE_TTL)
    controller = Controller(
        max_parallel=8, store=store, owner="node-a", side_channel_interval=0.05, lease_ttl=LEASE_TTL
    )
    rng = random.Random(22)
    flaky: set[int] = set(rng.sample(range(60), 15))
    attempts: dict[int, int] = {}
    lock = threading.Lock()

    def work(ctx: Any, n: int) -> dict[str, int]:
        for i in range(5):
            ctx.checkpoint()
            ctx.progress(i + 1, total=5)
            time.sleep(rng.uniform(0.001, 0.01))
        with lock:
            attempts[n] = attempts.get(n, 0) + 1
            first = attempts[n] == 1
        if n in flaky and first:
            raise RuntimeError("第一次故意失败，走一次重试")
        return {"n": n}

    controller.register("work", work, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0.01)))
    tasks = 60
    try:
        pg_proxy.lose_reply("UPDATE", count=None, rate=0.1, seed=1)
        pg_proxy.lose_reply("INSERT INTO", count=None, rate=0.1, seed=2)
        runs = []
        for i in range(tasks):
            runs.append(controller.submit("work", i, task_id=f"ack-{i:03d}"))
            if i % 15 == 3:  # 几个刚提交（在跑或排队）就被停掉的：stopping/stopped 的写也在丢回执的范围里
                controller.stop(f"ack-{i:03d}", reason="矩阵")
        controller.wait_all(timeout=60)
        lost_replies = pg_proxy.lost_replies
        pg_proxy.heal()
        started = time.monotonic()
        converged = wait_until(lambda: not behind(controller, verify), 15)
        seconds = time.monotonic() - started
        lagging = behind(controller, verify)
        time.sleep(LEASE_TTL * 1.5)
        reconciled = peer.reconcile()
        finished = {r.task_id for r in runs if r.snapshot.is_terminal}
        figures = {
            "tasks": tasks,
            "lost_replies": lost_replies,
            "stores_behind_after_convergence": len(lagging),
            "behind_samples": lagging[:5],
            "finished_reported_lost": len(finished & {s.task_id for s in reconciled.lost}),
            "persist_failures": len(controller.persist_failures),
            "seconds_to_converge": round(seconds, 2),
            "statuses": sorted({str(r.status) for r in runs}),
        }
        report(figures_dir, "crash_matrix_lost_ack", figures)
        assert lost_replies >= 10, f"丢回执注入得太少，矩阵没有意义：{figures}"
        assert converged and not lagging, figures
        assert "stopped" in figures["statuses"] and "succeeded" in figures["statuses"], figures
        assert figures["finished_reported_lost"] == 0, figures
        for run in runs:
            check_history(verify, run.task_id)
    finally:
        pg_proxy.heal()
        controller.close(timeout=10, close_store=True)
        peer.close(timeout=10, close_store=True)
        verify.close()
