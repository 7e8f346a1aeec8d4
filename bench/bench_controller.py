"""Controller 调度开销基准（同一次运行里测基线，打印比值）。

1. 吞吐：空任务经 Controller(max_parallel=2, store=InMemoryTaskStore()) 跑完，对照
   a) 裸的"每任务一线程、最多 2 个同时活着"，b) ThreadPoolExecutor(2)。三者交替各跑 ROUNDS 轮取中位数
   （机器是共享的，单次读数很吵），同时打印每任务的 CPU 时间（process_time，比墙钟稳）。
   目标（issue 17）：≥ 10,000 任务/秒，且 ≥ 1.0× 裸线程。
   （ThreadPoolExecutor 会复用线程，违背"被放弃的线程不复用"的规则，只作参照、不设目标。）
2. 调度代价不随队列增长：积压 1k / 10k / 50k 个任务时每任务耗时，目标彼此相差 ≤ 1.5×。
   "积压"是真的积压：两个闸门任务先占住 2 个执行槽，n 个空任务全部排进队列（打印的"队列长"就是 n），
   再放开闸门；计时覆盖提交 + 消化。边提交边跑的话队列最长只有几百个（提交线程与任务线程在 GIL 下交替），
   量不到积压的代价。三个规模轮流测 BACKLOG_ROUNDS 轮、每轮换一个先后顺序，每个规模取中位数再比：
   一个规模只测一次时，机器在几秒之间的快慢漂移（这台共享机器上常有 1.5× 以上）会被当成"积压代价"。

每次计时之前先 ``gc.collect()``：上一轮留下的循环垃圾不该记在这一轮头上（对每一组都一样）。
最后打印汇总表（我们、对照、比值、目标、是否达成）。

运行：python bench/bench_controller.py [--quick]
"""

from __future__ import annotations

import gc
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import _peers

from chongming_task import Controller, InMemoryTaskStore

BARE = "裸线程（每任务一线程，最多 2 个同时活着）"
POOL = "ThreadPoolExecutor(2)（参照）"
GOALS = {BARE: _peers.Goal(BARE, 1.0)}
RATE_GOAL = 10_000
BACKLOG_GOAL = 1.5
BACKLOG_ROUNDS = 5


def noop_task(ctx: Any) -> None:
    return None


def noop() -> None:
    return None


Measured = tuple[float, float]  # (任务/秒, 每任务 CPU 微秒)


def _timed(n: int, body: Callable[[], None]) -> Measured:
    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    body()
    elapsed, used = time.perf_counter() - started, time.process_time() - cpu
    return n / elapsed, used / n * 1e6


def bare_threads(n: int, parallel: int = 2) -> Measured:
    slots = threading.Semaphore(parallel)

    def body() -> None:
        try:
            noop()
        finally:
            slots.release()

    def run() -> None:
        threads = []
        for _ in range(n):
            slots.acquire()
            t = threading.Thread(target=body, daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join()

    return _timed(n, run)


def thread_pool(n: int) -> Measured:
    def run() -> None:
        with ThreadPoolExecutor(2) as pool:
            for future in [pool.submit(noop) for _ in range(n)]:
                future.result()

    return _timed(n, run)


def controller_rate(n: int, *, store: bool = True) -> Measured:
    c = Controller(max_parallel=2, store=InMemoryTaskStore() if store else None)
    c.register("noop", noop_task)

    def run() -> None:
        for _ in range(n):
            c.submit("noop")
        c.wait_all(timeout=600)

    measured = _timed(n, run)
    c.close()
    return measured


def gate_task(ctx: Any, gate: threading.Event) -> None:
    gate.wait()


def backlog_cost(n: int) -> tuple[float, float, int]:
    """积压 n 个任务时的每任务微秒（墙钟、CPU；提交 + 消化）与放开闸门那一刻的队列长度。"""
    gate = threading.Event()
    c = Controller(max_parallel=2, store=InMemoryTaskStore())
    c.register("noop", noop_task)
    c.register("gate", gate_task)
    for _ in range(2):  # 两个执行槽都被闸门任务占着：之后提交的全都排队
        c.submit("gate", gate=gate)
    while c.active_count < 2:
        time.sleep(0.001)
    gc.collect()
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        c.submit("noop")
    queued = c.queued_count
    gate.set()
    c.wait_all(timeout=600)
    elapsed, used = time.perf_counter() - started, time.process_time() - cpu
    c.close()
    return elapsed / n * 1e6, used / n * 1e6, queued


def _median(samples: list[Measured]) -> Measured:
    return statistics.median(r for r, _ in samples), statistics.median(u for _, u in samples)


def main() -> int:
    quick = "--quick" in sys.argv
    n = 2_000 if quick else 10_000
    rounds = 3
    controller_rate(500)  # 预热：导入、首批线程
    samples: dict[str, list[Measured]] = {"bare": [], "pool": [], "ours": [], "ours_no_store": []}
    for _ in range(rounds):  # 交替测，让机器噪声落在每一组上
        samples["bare"].append(bare_threads(n))
        samples["pool"].append(thread_pool(n))
        samples["ours"].append(controller_rate(n))
        samples["ours_no_store"].append(controller_rate(n, store=False))
    bare, pool, ours, no_store = (_median(samples[k]) for k in ("bare", "pool", "ours", "ours_no_store"))
    print(f"吞吐（{n} 个空任务，最多 2 个并行，{rounds} 轮中位数；括号里是每任务 CPU 时间）")
    print(f"  裸线程（每任务一线程）      {bare[0]:10,.0f} 任务/秒  （{bare[1]:6.1f} µs）")
    print(f"  ThreadPoolExecutor(2)       {pool[0]:10,.0f} 任务/秒  （{pool[1]:6.1f} µs）")
    ratio = ours[0] / bare[0]
    verdict = "达成" if ours[0] >= RATE_GOAL and ratio >= 1.0 else "未达成"
    print(
        f"  Controller + InMemory 存储  {ours[0]:10,.0f} 任务/秒  （{ours[1]:6.1f} µs）"
        f"= 裸线程的 {ratio:.2f}×（目标 ≥ {RATE_GOAL:,}/秒 且 ≥ 1.0×：{verdict}）"
    )
    ratio = no_store[0] / bare[0]
    print(
        f"  Controller（无存储）        {no_store[0]:10,.0f} 任务/秒  （{no_store[1]:6.1f} µs）"
        f"= 裸线程的 {ratio:.2f}×"
    )
    print(
        "  各轮（任务/秒）："
        + "；".join(f"{k} " + " / ".join(f"{r:,.0f}" for r, _ in v) for k, v in samples.items())
    )
    sizes = (1_000, 10_000) if quick else (1_000, 10_000, 50_000)
    backlog: dict[int, list[float]] = {size: [] for size in sizes}
    backlog_cpu: dict[int, list[float]] = {size: [] for size in sizes}
    depth: dict[int, int] = {}
    for turn in range(BACKLOG_ROUNDS):  # 每轮换一个先后顺序：漂移不会总落在同一个规模上
        shift = turn % len(sizes)
        for size in sizes[shift:] + sizes[:shift]:
            cost, cpu_cost, depth[size] = backlog_cost(size)
            backlog[size].append(cost)
            backlog_cpu[size].append(cpu_cost)
    per_task = {size: statistics.median(costs) for size, costs in backlog.items()}
    base = per_task[sizes[0]]
    print(
        f"调度代价与队列长度（每任务微秒 = 提交 + 消化，{BACKLOG_ROUNDS} 轮轮换先后取中位数；"
        f"越平越好，目标彼此 ≤ {BACKLOG_GOAL}×；括号里是每任务 CPU 时间的中位数，只作参照）"
    )
    for size, cost in per_task.items():
        rounds_text = " / ".join(f"{c:.1f}" for c in backlog[size])
        print(
            f"  积压 {size:>6,}（队列长 {depth[size]:,}）：{cost:8.1f} µs/任务"
            f"（CPU {statistics.median(backlog_cpu[size]):6.1f} µs）= {cost / base:.2f}× 于 "
            f"{sizes[0]:,}   各轮 {rounds_text}"
        )
    flat = max(per_task.values()) / min(per_task.values())
    peers = [_peers.Peer(BARE, bare[0]), _peers.Peer(POOL, pool[0])]
    extra = (
        (f"Controller + InMemory {ours[0]:,.0f}/s", f"≥ {RATE_GOAL:,}/s", ours[0] >= RATE_GOAL),
        (f"积压代价最大 / 最小 {flat:.2f}×", f"≤ {BACKLOG_GOAL}×", flat <= BACKLOG_GOAL),
    )
    _peers.print_summary("InMemory", "Controller + InMemory", ours[0], peers, GOALS, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
