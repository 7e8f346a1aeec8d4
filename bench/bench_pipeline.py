"""管道调度开销：10,000 个节点的长链与宽扇出，对照同样数量的独立提交（同一次运行里测基线）。

目标：每节点的调度开销 ≤ 独立提交的 1.5×（放行只看直接下游，O(节点 + 边)）。

运行：python bench/bench_pipeline.py [--quick]
"""

from __future__ import annotations

import sys
import time
from typing import Any

from chongming_task import AggregationPolicy, Controller, Pipeline


def noop(ctx: Any, value: int = 0) -> int:
    return value


def independent(n: int) -> float:
    c = Controller(max_parallel=2)
    c.register("noop", noop)
    started = time.perf_counter()
    for i in range(n):
        c.submit("noop", i)
    c.wait_all(timeout=600)
    elapsed = time.perf_counter() - started
    c.close()
    return elapsed


def chain(n: int) -> float:
    c = Controller(max_parallel=2)
    c.register("noop", noop)
    p = Pipeline("chain")
    previous = None
    for i in range(n):
        previous = p.node("noop", i, node_id=f"n{i}", depends_on=[previous] if previous else [])
    started = time.perf_counter()
    outcome = c.submit_pipeline(p).wait(timeout=600)
    elapsed = time.perf_counter() - started
    assert outcome.ok, outcome.status
    c.close()
    return elapsed


def fan_out(n: int) -> float:
    c = Controller(max_parallel=2)
    c.register("noop", noop)
    p = Pipeline("fan", aggregation=AggregationPolicy.all_settled())
    root = p.node("noop", node_id="root")
    leaves = [p.node("noop", i, node_id=f"leaf{i}", depends_on=[root]) for i in range(n - 2)]
    p.node("noop", node_id="sink", depends_on=leaves)
    started = time.perf_counter()
    outcome = c.submit_pipeline(p).wait(timeout=600)
    elapsed = time.perf_counter() - started
    assert outcome.ok, outcome.status
    c.close()
    return elapsed


def main() -> int:
    n = 2_000 if "--quick" in sys.argv else 10_000
    base = independent(n)
    print(f"{n:,} 个空任务，max_parallel=2")
    print(f"  独立提交        {1e6 * base / n:8.1f} µs/任务（基线）")
    for label, fn in (("长链（串行依赖）", chain), ("宽扇出（1→N→1）", fan_out)):
        elapsed = fn(n)
        print(
            f"  {label:<12} {1e6 * elapsed / n:8.1f} µs/节点   = 基线的 {elapsed / base:.2f}×（目标 ≤ 1.5×）"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
