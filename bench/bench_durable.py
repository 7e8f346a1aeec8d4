"""持久任务基准（issue 19，同一次运行、同一台本地 PostgreSQL 上测对照）。

1. 先入队、再执行的吞吐：提交者 ``enqueue()`` N 个空的持久任务，一个 worker（``serve()``，2 个槽位）
   跑到全部落终态，计总时长；对照 Procrastinate：``defer()`` N 个作业 +
   ``run_worker(concurrency=2, wait=False)`` 跑到队列空（procrastinate 只装在基准环境里）。目标 ≥ 2×。
2. 入队 → 开始的时延 p50：worker 空闲等待时提交一个任务，量"enqueue() 返回之前"到"任务体开始"的时间。
   PostgreSQL 上靠 NOTIFY 叫醒（目标 ≤ 50 ms），SQLite 上靠轮询（默认每 0.2 秒，目标 ≤ 300 ms）。

多进程 kill -9 场景的完整规模（5,000 / 10,000 个任务）也从这里跑：``--full-scenarios`` 以
``CHONGMING_DURABLE_FULL=1`` 运行 tests/integration/test_durable_processes.py
（``make test`` 里用的是缩小的规模）。

需要 CHONGMING_TEST_POSTGRES（例如 postgresql://postgres@127.0.0.1:5432/test）；没有时只跑 SQLite 的时延。
每次运行用独立 schema，结束后删除。运行：python bench/bench_durable.py [--quick] [--full-scenarios]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from chongming_task import Controller, TaskStatus, open_store

S = TaskStatus
ROOT = Path(__file__).resolve().parents[1]


def noop(ctx: Any, i: int) -> int:
    return i


def _wait_until_succeeded(probe: Any, n: int) -> None:
    """轮询存储，直到 ``n`` 个任务在库里落了 succeeded（终点以存储为准，不信进程内的事件）。

    为什么不是固定每 10 ms 查一次：``stats()`` 是一次全表计数，和 worker 抢同一台机器的两个核（服务器一侧）
    和同一把 GIL（探针与提交者、worker 同在这个进程）。dur17 量过，每 10 ms 一次的探针占了服务器 CPU 的
    约 17 %——对照组 Procrastinate 跑到队列空（``wait=False``）就返回，没有这笔账。按目前的速率估计还要多久，
    睡剩余时间的一半再查（最短 10 ms、最长 0.5 s）：一轮只查十几次，终点的误差仍不超过 10 ms。速率从开始
    轮询（worker 刚开始 serve）算起，不含入队那段，估计才不偏长。
    """
    polling = time.perf_counter()
    while True:
        done = probe.stats().counts[S.SUCCEEDED]
        if done >= n:
            return
        elapsed = time.perf_counter() - polling
        pause = 0.5 * (n - done) * elapsed / done if done else 0.05
        time.sleep(min(max(pause, 0.01), 0.5))


def our_throughput(url: str, n: int) -> float:
    submitter = Controller(store=open_store(url), owner="bench-submitter")
    submitter.register("noop", noop, durable=True)
    worker = Controller(2, store=open_store(url), owner="bench-worker")
    worker.register("noop", noop)
    probe = open_store(url)
    started = time.perf_counter()
    for i in range(n):
        submitter.enqueue("noop", i)
    stop = threading.Event()
    serving = threading.Thread(target=worker.serve, args=(stop,))
    serving.start()
    _wait_until_succeeded(probe, n)
    rate = n / (time.perf_counter() - started)
    stop.set()
    serving.join()
    for closing in (worker, submitter):
        closing.close(close_store=True)
    probe.close()
    return rate


# Procrastinate 的对照（defer N 个空作业 + run_worker(concurrency=2, wait=False) 跑到队列空）与
# bench_postgres.py 用同一段代码：两个基准的对照组一模一样，比值才可比。
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_postgres import procrastinate_rate as procrastinate_throughput  # noqa: E402


def start_latencies(url: str, trials: int) -> list[float]:
    """worker 空闲时入队一个任务，量到任务体开始（同一进程里两个 Controller、两个存储连接，
    走真实的通知 / 轮询）。"""
    began: dict[int, float] = {}
    arrived = threading.Condition()

    def mark(ctx: Any, i: int) -> None:
        with arrived:
            began[i] = time.perf_counter()
            arrived.notify_all()

    submitter = Controller(store=open_store(url), owner="latency-submitter")
    submitter.register("mark", mark, durable=True)
    worker = Controller(2, store=open_store(url), owner="latency-worker")
    worker.register("mark", mark)
    stop = threading.Event()
    serving = threading.Thread(target=worker.serve, args=(stop,))
    serving.start()
    time.sleep(0.5)  # worker 已在空闲等待
    latencies = []
    for i in range(trials):
        before = time.perf_counter()
        submitter.enqueue("mark", i)
        with arrived:
            arrived.wait_for(lambda i=i: i in began, timeout=30)
        latencies.append(began[i] - before)
        time.sleep(0.05)  # 下一个任务到来时 worker 又在等
    stop.set()
    serving.join()
    for closing in (worker, submitter):
        closing.close(close_store=True)
    return latencies


ROUNDS = 3
"""两边各跑几轮（交替）。比值取两边各自的中位数之比：共享机器上一轮撞上别人的负载高峰就会偏很多，
三轮的中位数不受一轮离群值左右；两轮的平均做不到。"""
PER_ROUND = 1_000
"""每轮的任务数，两边一样（Procrastinate 的表越满越慢：每轮用新 schema、同样大小，两边待遇相同）。"""


def _rates(values: list[float]) -> str:
    return " / ".join(f"{value:,.0f}" for value in values)


def p50_ms(values: list[float]) -> float:
    return statistics.median(values) * 1000


def p95_ms(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1] * 1000


def main() -> int:
    quick = "--quick" in sys.argv
    per_round = 250 if quick else PER_ROUND
    trials = 10 if quick else 30
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        sqlite_url = f"sqlite:///{workdir / 'durable.db'}"
        sqlite_lat = start_latencies(sqlite_url, trials)
        dsn = os.environ.get("CHONGMING_TEST_POSTGRES", "").strip()
        if not dsn:
            print("需要 CHONGMING_TEST_POSTGRES=postgresql://user@host:5432/db 才能跑 Postgres 吞吐与时延")
        else:
            import psycopg

            schema = f"ct_bench_durable_{os.getpid()}"
            # 两边交替各跑 ROUNDS 轮，先后次序每轮对调（我们、对照；对照、我们；……）：共享机器的负载一直在变，
            # 总是同一方先跑，它吃到的负载就总与另一方不同，比值会偏向一边。比值 = 两边各轮速率的中位数之比。
            ours_runs: list[float] = []
            theirs_runs: list[float | None] = []
            for round_no in range(ROUNDS):
                ours_schema = f"{schema}_{round_no}"
                url = f"{dsn}{'&' if '?' in dsn else '?'}schema={ours_schema}"
                theirs_schema = f"{schema}_procrastinate_{round_no}"
                try:
                    for side in ("ours", "theirs") if round_no % 2 == 0 else ("theirs", "ours"):
                        if side == "ours":
                            ours_runs.append(our_throughput(url, per_round))
                        else:
                            theirs_runs.append(
                                procrastinate_throughput(dsn, theirs_schema, per_round, workdir)
                            )
                finally:
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        conn.execute(f'DROP SCHEMA IF EXISTS "{ours_schema}" CASCADE')
            print(
                f"先入队再执行的吞吐（每轮 {per_round:,} 个空任务，交替 {ROUNDS} 轮，1 个 worker × 2 个槽位，"
                "PostgreSQL）"
            )
            print(f"  enqueue + serve()                  {_rates(ours_runs)} 任务/秒")
            if any(theirs is None for theirs in theirs_runs):
                print("  Procrastinate（concurrency=2）     未安装 procrastinate，跳过对照")
            else:
                theirs_all = [theirs for theirs in theirs_runs if theirs is not None]
                ratio = statistics.median(ours_runs) / statistics.median(theirs_all)
                label = "  Procrastinate defer + worker(2)  "
                print(f"{label}{_rates(theirs_all)} 作业/秒   比值（中位数之比）{ratio:.2f}×（目标 ≥ 2×）")
            schema_lat = f"{schema}_lat"
            lat_url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema_lat}"
            try:
                pg_lat = start_latencies(lat_url, trials)
            finally:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema_lat}" CASCADE')
            print(
                f"入队 → 开始时延（PostgreSQL，NOTIFY）：p50 {p50_ms(pg_lat):.0f} ms，"
                f"p95 {p95_ms(pg_lat):.0f} ms，最大 {max(pg_lat) * 1000:.0f} ms（目标 p50 ≤ 50 ms）"
            )
        print(
            f"入队 → 开始时延（SQLite，轮询 0.2 秒）：p50 {p50_ms(sqlite_lat):.0f} ms，"
            f"p95 {p95_ms(sqlite_lat):.0f} ms，最大 {max(sqlite_lat) * 1000:.0f} ms（目标 p50 ≤ 300 ms）"
        )
    if "--full-scenarios" in sys.argv:
        env = {**os.environ, "CHONGMING_DURABLE_FULL": "1"}
        test = ROOT / "tests" / "integration" / "test_durable_processes.py"
        started = time.perf_counter()
        code = subprocess.call([sys.executable, "-m", "pytest", "-q", str(test)], env=env, cwd=ROOT)
        spent = time.perf_counter() - started
        print(f"完整规模的多进程场景（5,000 / 10,000 个任务）：退出码 {code}，用时 {spent:.0f} 秒")
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
