"""长跑：20,000 个任务经 Controller + SQLite，随机的结局、暂停、停止与重试。

按 1,000 个一批提交；每批等全部落终态、核对这一批的账、抽查存储与内存一致，然后 prune。
判据：

* 每批结束时 active_count == queued_count == 0（每个槽位都还回来了），存储里没有非终态任务；
* 账对得上：failed 恰好等于"必然失败"的任务数；会重试的任务全部在第 2 次成功；可停的任务要么
  stopped 要么 succeeded；succeeded + failed + stopped == 提交数；
* 内存平稳：第 2 批之后（预热完成）量一次 RSS（/proc/self/statm），最后一批 prune 之后再量一次，
  增长 < 20 MB。
"""

from __future__ import annotations

import collections
import gc
import random
import time
from pathlib import Path
from typing import Any

import pytest
from reliability_support import report, rss_bytes

from chongming_task import Controller, FixedBackoff, RetryPolicy, SqliteTaskStore, TaskStatus
from chongming_task.states import NON_TERMINAL_STATUSES
from chongming_task.storage import TaskQuery

S = TaskStatus
TOTAL = 20_000
BATCH = 1_000
KEEP = 200
RSS_LIMIT = 20 * 1024 * 1024


def ok(ctx: Any, n: int) -> int:
    ctx.checkpoint()
    return n


def fail(ctx: Any) -> None:
    ctx.checkpoint()
    raise ValueError("注定失败")


def flaky(ctx: Any) -> str:
    ctx.checkpoint()
    if ctx.attempt < 2:
        raise RuntimeError("第一次总是失败")
    return "第二次成功"


def hold(ctx: Any, n: int) -> int:
    """可被暂停/停止的任务：checkpoint 约 20 次，每次 1 毫秒。"""
    for i in range(20):
        ctx.checkpoint()
        ctx.progress(i + 1, total=20)
        time.sleep(0.001)
    return n


@pytest.mark.slow
def test_soak_20k_tasks_controller_sqlite(tmp_path: Path, figures_dir: Path) -> None:
    rng = random.Random(20_000)
    store = SqliteTaskStore(tmp_path / "soak.db")
    controller = Controller(store=store, max_parallel=8, owner="soak", side_channel_interval=0.5)
    controller.register("ok", ok)
    controller.register("fail", fail)
    controller.register("flaky", flaky, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0)))
    controller.register("hold", hold)
    kinds = ["ok"] * 6 + ["fail", "flaky"] + ["hold"] * 2
    expected = collections.Counter[str]()
    final = collections.Counter[str]()
    control = collections.Counter[str]()
    started = time.monotonic()
    baseline_rss = 0
    peak_rss = 0
    counter = 0
    try:
        for batch in range(TOTAL // BATCH):
            runs = []
            for _ in range(BATCH):
                counter += 1
                kind = rng.choice(kinds)
                args = (counter,) if kind in ("ok", "hold") else ()
                runs.append(controller.submit(kind, *args, task_id=f"soak-{counter:05d}"))
                expected[kind] += 1
                if kind == "hold" and rng.random() < 0.5:
                    target = runs[-1].task_id
                    if rng.random() < 0.5:
                        controller.stop(target, reason="长跑中停止")
                        control["stop"] += 1
                    else:
                        control["pause_confirmed"] += controller.pause(target, timeout=0.05)
                        control["pause"] += 1
                        controller.resume(target)
            controller.wait_all(timeout=120)
            assert controller.active_count == 0 and controller.queued_count == 0, "槽位没有全部归还"
            assert store.stats(TaskQuery(statuses=NON_TERMINAL_STATUSES)).total == 0
            batch_counts = collections.Counter(r.status.value for r in runs)
            final.update(batch_counts)
            for run in rng.sample(runs, 25):
                stored = store.get(run.task_id)
                assert stored is not None and stored.status_version == run.snapshot.status_version
                assert store.history(run.task_id) == list(run.transitions)
            assert controller.persist_failures == []
            controller.prune(keep_terminal=KEEP)
            assert len(controller.runs()) <= KEEP and store.stats().total <= KEEP
            gc.collect()
            rss = rss_bytes()
            peak_rss = max(peak_rss, rss)
            if batch == 1:
                baseline_rss = rss
        end_rss = rss_bytes()
    finally:
        controller.close(close_store=True)
    elapsed = time.monotonic() - started
    assert sum(final.values()) == TOTAL
    assert final["failed"] == expected["fail"], (final, expected)
    assert set(final) <= {"succeeded", "failed", "stopped"}, final
    assert final["stopped"] <= control["stop"]
    assert final["succeeded"] == expected["ok"] + expected["flaky"] + expected["hold"] - final["stopped"]
    growth = end_rss - baseline_rss
    figures = {
        "tasks": TOTAL,
        "seconds": round(elapsed, 1),
        "tasks_per_second": round(TOTAL / elapsed),
        "final": dict(final),
        "kinds": dict(expected),
        "control": dict(control),
        "rss_baseline_mb": round(baseline_rss / 2**20, 1),
        "rss_end_mb": round(end_rss / 2**20, 1),
        "rss_peak_mb": round(peak_rss / 2**20, 1),
        "rss_growth_mb": round(growth / 2**20, 2),
    }
    report(figures_dir, "soak_sqlite", figures)
    assert growth < RSS_LIMIT, f"RSS 增长 {growth / 2**20:.1f} MB（上限 20 MB）"
