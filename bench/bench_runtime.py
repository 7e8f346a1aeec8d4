"""运行时基准：checkpoint() 开销、无操作任务的启动开销、停止延迟。

每一项都与同一次运行里测得的基线相比，打印比值与目标：

1. ``checkpoint()``（无请求）ns/次  vs  ``threading.Event.is_set()``；目标 ≤ 250 ns。
2. 无操作 ``run_task`` 在 ThreadExecutor 上  vs  裸 ``threading.Thread`` start+join；目标 ≤ 3×。
3. 无操作 ``run_task`` 在 ProcessExecutor 上  vs  同一启动方式的裸 ``multiprocessing.Process``；目标 ≤ 1.3×。
4. 停止延迟（stop() → 终态）p50，任务每 1 ms checkpoint 一次；目标 线程 ≤ 2 ms，进程 ≤ 30 ms。

用法：``python bench/bench_runtime.py [--quick]``。脚本有 ``if __name__ == "__main__":`` 守卫——
ProcessExecutor 的 spawn / forkserver 会重新 import 主模块。
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import threading
import time
import timeit
from collections.abc import Callable
from typing import Any

from chongming_task import TaskContext
from chongming_task.run import TaskRun, run_task
from chongming_task.runtime.executors import ProcessExecutor, ThreadExecutor
from chongming_task.states import TaskStatus
from chongming_task.testing import make_context


def noop_task(ctx: TaskContext) -> None:
    return None


def noop_target() -> None:
    return None


def checkpoint_every_ms(ctx: TaskContext) -> None:
    while True:
        ctx.checkpoint()
        time.sleep(0.001)


def _best_ns_per_call(stmt: Callable[[], Any], number: int, repeat: int = 5) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number * 1e9


def bench_checkpoint(quick: bool) -> None:
    number = 200_000 if quick else 1_000_000
    ctx = make_context("bench")
    event = threading.Event()
    checkpoint_ns = _best_ns_per_call(ctx.checkpoint, number)
    is_set_ns = _best_ns_per_call(event.is_set, number)
    empty_ns = _best_ns_per_call(noop_target, number)
    verdict = "OK" if checkpoint_ns <= 250 else "超出目标"
    print("1. checkpoint()（无请求）")
    print(f"   checkpoint()           {checkpoint_ns:7.1f} ns/次   目标 ≤ 250 ns  [{verdict}]")
    print(f"   Event.is_set()         {is_set_ns:7.1f} ns/次   比值 {checkpoint_ns / is_set_ns:.2f}×")
    print(f"   空函数调用（参考）     {empty_ns:7.1f} ns/次")


def _per_run_seconds(fn: Callable[[], Any], runs: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def bench_thread_launch(quick: bool) -> None:
    runs = 500 if quick else 3000
    executor = ThreadExecutor()

    def bare() -> None:
        thread = threading.Thread(target=noop_target, daemon=True)
        thread.start()
        thread.join()

    def ours() -> None:
        outcome = run_task(noop_task, executor=executor)
        assert outcome.ok

    bare_s = _per_run_seconds(bare, runs, 50)
    ours_s = _per_run_seconds(ours, runs, 50)
    ratio = ours_s / bare_s
    started = time.perf_counter()
    count = 0
    while time.perf_counter() - started < (0.5 if quick else 2.0):
        ours()
        count += 1
    throughput = count / (time.perf_counter() - started)
    print("2. 无操作任务：ThreadExecutor（中位数）")
    print(f"   裸 Thread start+join   {bare_s * 1e6:8.1f} µs")
    verdict = _ok(ratio <= 3)
    print(f"   run_task               {ours_s * 1e6:8.1f} µs   比值 {ratio:.2f}×  目标 ≤ 3×  [{verdict}]")
    print(f"   串行吞吐               {throughput:8.0f} 个/秒")


def bench_process_launch(quick: bool) -> None:
    runs = 10 if quick else 40
    executor = ProcessExecutor()
    mp = multiprocessing.get_context(executor.start_method)

    def bare() -> None:
        process = mp.Process(target=noop_target, daemon=True)
        process.start()
        process.join()

    def ours() -> None:
        outcome = run_task(noop_task, executor=executor)
        assert outcome.ok, outcome.failure

    # 交替测量，让两边承受同样的系统噪声
    bare_samples: list[float] = []
    our_samples: list[float] = []
    bare()
    ours()
    for _ in range(runs):
        for fn, bucket in ((bare, bare_samples), (ours, our_samples)):
            started = time.perf_counter()
            fn()
            bucket.append(time.perf_counter() - started)
    bare_s = statistics.median(bare_samples)
    ours_s = statistics.median(our_samples)
    ratio = ours_s / bare_s
    print(f"3. 无操作任务：ProcessExecutor（{executor.start_method}，中位数）")
    print(f"   裸 Process start+join  {bare_s * 1e3:8.2f} ms")
    verdict = _ok(ratio <= 1.3)
    print(f"   run_task               {ours_s * 1e3:8.2f} ms   比值 {ratio:.2f}×  目标 ≤ 1.3×  [{verdict}]")


def _stop_latency(executor: Any, rounds: int) -> list[float]:
    latencies = []
    for _ in range(rounds):
        run = TaskRun(checkpoint_every_ms, executor=executor, graceful_stop=5)
        run.start()
        deadline = time.monotonic() + 10
        while run.status is not TaskStatus.RUNNING and time.monotonic() < deadline:
            time.sleep(0.0005)
        time.sleep(0.01)
        started = time.perf_counter()
        run.stop()
        run.done_event.wait(10)
        latencies.append(time.perf_counter() - started)
        assert run.status is TaskStatus.STOPPED, run.status
    return latencies


def bench_stop_latency(quick: bool) -> None:
    thread = _stop_latency(ThreadExecutor(), 50 if quick else 200)
    process = _stop_latency(ProcessExecutor(), 8 if quick else 30)
    thread_p50 = statistics.median(thread) * 1e3
    process_p50 = statistics.median(process) * 1e3
    print("4. 停止延迟（stop() → 终态，任务每 1 ms checkpoint 一次）")
    print(f"   线程 p50               {thread_p50:8.3f} ms   目标 ≤ 2 ms   [{_ok(thread_p50 <= 2)}]")
    print(f"   进程 p50               {process_p50:8.3f} ms   目标 ≤ 30 ms  [{_ok(process_p50 <= 30)}]")


def _ok(passed: bool) -> str:
    return "OK" if passed else "超出目标"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="少跑几轮（冒烟用）")
    args = parser.parse_args()
    bench_checkpoint(args.quick)
    bench_thread_launch(args.quick)
    bench_process_launch(args.quick)
    bench_stop_latency(args.quick)


if __name__ == "__main__":
    main()
