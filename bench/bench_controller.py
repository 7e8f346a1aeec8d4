"""Controller 调度开销基准（同一次运行里测基线，打印比值）。

1. 吞吐：空任务经 Controller(max_parallel=2, store=InMemoryTaskStore()) 跑完，对照
   a) 裸的"每任务一线程、最多 2 个同时活着"，b) ThreadPoolExecutor(2)。
   目标（issue 17）：≥ 10,000 任务/秒，且 ≥ 1.0× 裸线程方案。
   （ThreadPoolExecutor 会复用线程，违背"被放弃的线程不复用"的规则，只作参照、不设目标。）
2. 调度代价不随队列增长：积压 1k / 10k / 50k 个任务时每任务耗时，目标彼此相差 ≤ 1.5×。

最后打印汇总表（我们、对照、比值、目标、是否达成）。
运行：python bench/bench_controller.py [--quick]
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import _peers

from chongming_task import Controller, InMemoryTaskStore

BARE = "裸线程（每任务一线程，最多 2 个同时活着）"
POOL = "ThreadPoolExecutor(2)（参照）"
GOALS = {BARE: _peers.Goal(BARE, 1.0)}
RATE_GOAL = 10_000


def noop_task(ctx: Any) -> None:
    return None


def noop() -> None:
    return None


def bare_threads(n: int, parallel: int = 2) -> float:
    slots = threading.Semaphore(parallel)

    def body() -> None:
        try:
            noop()
        finally:
            slots.release()

    threads = []
    started = time.perf_counter()
    for _ in range(n):
        slots.acquire()
        t = threading.Thread(target=body, daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return n / (time.perf_counter() - started)


def thread_pool(n: int) -> float:
    started = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(noop) for _ in range(n)]:
            future.result()
    return n / (time.perf_counter() - started)


def controller_rate(n: int, *, store: bool = True) -> float:
    c = Controller(max_parallel=2, store=InMemoryTaskStore() if store else None)
    c.register("noop", noop_task)
    started = time.perf_counter()
    for _ in range(n):
        c.submit("noop")
    c.wait_all(timeout=600)
    rate = n / (time.perf_counter() - started)
    c.close()
    return rate


def main() -> int:
    quick = "--quick" in sys.argv
    n = 2_000 if quick else 10_000
    bare = bare_threads(n)
    pool = thread_pool(n)
    ours = controller_rate(n)
    ours_no_store = controller_rate(n, store=False)
    print(f"吞吐（{n} 个空任务，最多 2 个并行）")
    print(f"  裸线程（每任务一线程）      {bare:10,.0f} 任务/秒")
    print(f"  ThreadPoolExecutor(2)       {pool:10,.0f} 任务/秒")
    ratio = ours / bare
    print(
        f"  Controller + InMemory 存储  {ours:10,.0f} 任务/秒   = 裸线程的 {ratio:.2f}×"
        f"（目标 ≥ 1.0× 且 ≥ {RATE_GOAL:,}/秒）"
    )
    ratio = ours_no_store / bare
    print(f"  Controller（无存储）        {ours_no_store:10,.0f} 任务/秒   = 裸线程的 {ratio:.2f}×")
    sizes = (1_000, 10_000) if quick else (1_000, 10_000, 50_000)
    per_task = {}
    for size in sizes:
        rate = controller_rate(size)
        per_task[size] = 1e6 / rate
    base = per_task[sizes[0]]
    print("调度代价与队列长度（每任务微秒，越平越好；目标彼此 ≤ 1.5×）")
    for size, cost in per_task.items():
        print(f"  积压 {size:>6,}：{cost:8.1f} µs/任务   = {cost / base:.2f}× 于 {sizes[0]:,}")
    flat = max(per_task.values()) / min(per_task.values())
    peers = [_peers.Peer(BARE, bare), _peers.Peer(POOL, pool)]
    extra = (
        (f"Controller + InMemory {ours:,.0f}/s", f"≥ {RATE_GOAL:,}/s", ours >= RATE_GOAL),
        (f"积压代价最大 / 最小 {flat:.2f}×", "≤ 1.5×", flat <= 1.5),
    )
    _peers.print_summary("InMemory", "Controller + InMemory", ours, peers, GOALS, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
