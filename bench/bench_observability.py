"""可观测性的开销基准（issue 18：指标与日志都开着时，Controller + InMemory 的吞吐损失 ≤ 10 %）。

同一次运行里交替测两组（各跑 ROUNDS 轮取中位数，抵消机器噪声）：

* 基线：``Controller(max_parallel=2, store=InMemoryTaskStore(), persist_logs=False)``，没有监听器；
* 全开：同一个 Controller 配置，``persist_logs=True``（每个任务写一行 ``ctx.log``，落进存储），并
  ``instrument(controller, registry=CollectorRegistry())`` 挂上 Prometheus 指标（事件钩子因此启用）。

任务体只做一次 checkpoint 与一行日志：测的是框架自己的固定开销，不是任务本身。

运行：python bench/bench_observability.py [--quick]
"""

from __future__ import annotations

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


def rate(n: int, *, observed: bool) -> float:
    controller = Controller(max_parallel=2, store=InMemoryTaskStore(), persist_logs=observed)
    metrics = None
    if observed:
        from prometheus_client import CollectorRegistry

        from chongming_task.metrics import instrument

        metrics = instrument(controller, registry=CollectorRegistry())
    controller.register("work", logging_task)
    started = time.perf_counter()
    for i in range(n):
        controller.submit("work", i)
    controller.wait_all(timeout=600)
    if observed:
        controller.flush_events(timeout=60)  # 事件都送到了指标里才算跑完
    elapsed = time.perf_counter() - started
    if metrics is not None:
        metrics.close()
    controller.close()
    return n / elapsed


def main() -> int:
    quick = "--quick" in sys.argv
    n = 2_000 if quick else 10_000
    rounds = 3 if quick else 5
    rate(500, observed=True)  # 预热：导入、线程、首次分配
    base: list[float] = []
    full: list[float] = []
    for _ in range(rounds):
        base.append(rate(n, observed=False))
        full.append(rate(n, observed=True))
    b, f = statistics.median(base), statistics.median(full)
    loss = 1 - f / b
    print(f"可观测性开销（{n} 个任务、最多 2 个并行、每任务一行日志，{rounds} 轮中位数）")
    print(f"  基线（无指标、不落日志）          {b:10,.0f} 任务/秒")
    print(f"  全开（Prometheus 指标 + 日志落库） {f:10,.0f} 任务/秒   损失 {loss * 100:5.1f} %")
    verdict = "达成" if loss <= GOAL_MAX_LOSS else "未达成"
    print(f"  目标：损失 ≤ {GOAL_MAX_LOSS * 100:.0f} % —— {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
