"""可观测性的开销基准（issue 18：指标与日志都开着时，Controller + InMemory 的吞吐损失 ≤ 10 %）。

同一次运行里交替测两组（各跑 ROUNDS 轮取中位数，抵消机器噪声）：

* 基线：``Controller(max_parallel=2, store=InMemoryTaskStore(), persist_logs=False)``，没有监听器；
* 全开：同一个 Controller 配置，``persist_logs=True``（每个任务写一行 ``ctx.log``，落进存储），并
  ``instrument(controller, registry=CollectorRegistry())`` 挂上 Prometheus 指标（事件钩子因此启用）。

任务体只做一次 checkpoint 与一行日志：测的是框架自己的固定开销，不是任务本身。每次计时之前先
``gc.collect()``（上一轮留下的循环垃圾不记在这一轮头上），并同时打印每任务的 CPU 时间（比墙钟稳）。

运行：python bench/bench_observability.py [--quick]
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from typing import Any

from chongming_task import Controller, InMemoryTaskStore

GOAL_MAX_LOSS = 0.10


def logging_task(ctx: Any, n: int) -> int:
    ctx.checkpoint()
    ctx.log(f"第 {n} 行")
    return n


def rate(n: int, *, observed: bool) -> tuple[float, float]:
    """返回（任务/秒，每任务 CPU 微秒）。"""
    controller = Controller(max_parallel=2, store=InMemoryTaskStore(), persist_logs=observed)
    metrics = None
    if observed:
        from prometheus_client import CollectorRegistry

        from chongming_task.metrics import instrument

        metrics = instrument(controller, registry=CollectorRegistry())
    controller.register("work", logging_task)
    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    for i in range(n):
        controller.submit("work", i)
    controller.wait_all(timeout=600)
    if observed:
        controller.flush_events(timeout=60)  # 事件都送到了指标里才算跑完
    elapsed, used = time.perf_counter() - started, time.process_time() - cpu
    if metrics is not None:
        metrics.close()
    controller.close()
    return n / elapsed, used / n * 1e6


def main() -> int:
    quick = "--quick" in sys.argv
    n = 2_000 if quick else 10_000
    rounds = 3 if quick else 5
    rate(500, observed=True)  # 预热：导入、线程、首次分配
    base: list[tuple[float, float]] = []
    full: list[tuple[float, float]] = []
    for _ in range(rounds):
        base.append(rate(n, observed=False))
        full.append(rate(n, observed=True))
    b, f = statistics.median(r for r, _ in base), statistics.median(r for r, _ in full)
    b_cpu, f_cpu = statistics.median(u for _, u in base), statistics.median(u for _, u in full)
    loss = 1 - f / b
    print(
        f"可观测性开销（{n} 个任务、最多 2 个并行、每任务一行日志，{rounds} 轮中位数；"
        "括号里是每任务 CPU 时间）"
    )
    print(f"  基线（无指标、不落日志）          {b:10,.0f} 任务/秒  （{b_cpu:6.1f} µs）")
    print(
        f"  全开（Prometheus 指标 + 日志落库） {f:10,.0f} 任务/秒  （{f_cpu:6.1f} µs）"
        f"   损失 {loss * 100:5.1f} %"
    )
    print(
        "  各轮（任务/秒）：基线 "
        + " / ".join(f"{r:,.0f}" for r, _ in base)
        + "；全开 "
        + " / ".join(f"{r:,.0f}" for r, _ in full)
    )
    verdict = "达成" if loss <= GOAL_MAX_LOSS else "未达成"
    print(f"  目标：损失 ≤ {GOAL_MAX_LOSS * 100:.0f} % —— {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
