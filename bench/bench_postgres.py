"""Controller + PostgresTaskStore 端到端基准（同一次运行、同一台本地 PostgreSQL 上测对照）。

1. 吞吐：空任务经 Controller(max_parallel=2) + PostgresTaskStore（完整历史），对照 Procrastinate
   （defer N 个作业 + 一个 concurrency=2 的 worker 跑到队列空；procrastinate 只装在基准环境里）。目标 ≥ 1.5×。
2. 跨进程停止时延（LISTEN/NOTIFY）：另一个进程 stop() → 任务在存储里落终态，p50 ≤ 50 ms。

需要 CHONGMING_TEST_POSTGRES（例如 postgresql://postgres@127.0.0.1:5432/test）。
每次运行用独立 schema，结束后删除。
运行：python bench/bench_postgres.py [--quick]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from chongming_task import Controller, Submit, TaskStatus, open_store

S = TaskStatus


def noop(ctx: Any) -> None:
    return None


def ours(url: str, n: int, *, many: bool = False) -> float:
    c = Controller(max_parallel=2, store=open_store(url))
    c.register("noop", noop)
    started = time.perf_counter()
    if many:  # 批量提交（用户指南 §9.8）：每 1000 个任务一个 create 事务
        c.submit_many([Submit("noop") for _ in range(n)])
    else:
        for _ in range(n):
            c.submit("noop")
    c.wait_all(timeout=900)
    rate = n / (time.perf_counter() - started)
    c.close(close_store=True)
    return rate


PROCRASTINATE_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import procrastinate
    conninfo, schema, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(
        conninfo=conninfo, kwargs={"options": f"-c search_path={schema}"}))

    @app.task(queue="bench")
    def noop():
        return None

    with app.open():
        app.schema_manager.apply_schema()
        started = time.perf_counter()
        for _ in range(n):
            noop.defer()
        app.run_worker(queues=["bench"], concurrency=2, wait=False, install_signal_handlers=False)
        print(f"{n / (time.perf_counter() - started):.1f}", flush=True)
    """
)


def procrastinate_rate(dsn: str, schema: str, n: int, workdir: Path) -> float | None:
    try:
        import procrastinate  # noqa: F401
    except ImportError:
        return None
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    script = workdir / "procrastinate_bench.py"
    script.write_text(PROCRASTINATE_SCRIPT, encoding="utf-8")
    try:
        result = subprocess.run(
            [sys.executable, str(script), dsn, schema, str(n)], capture_output=True, text=True, timeout=900
        )
        lines = [line for line in result.stdout.splitlines() if line.strip()]
        if result.returncode != 0 or not lines:
            raise RuntimeError(f"Procrastinate 基准失败：{result.stderr[-2000:]}")
        return float(lines[-1])
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


WORKER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from chongming_task import Controller, open_store

    def resident(ctx):
        while True:
            ctx.checkpoint()
            time.sleep(0.002)

    # 轮询间隔故意调长：测的是 NOTIFY 的即时性，而不是轮询。
    c = Controller(store=open_store(sys.argv[1]), owner="bench-worker", command_poll_interval=5.0)
    c.register("resident", resident)
    runs = [c.submit("resident", task_id=f"r{i}") for i in range(int(sys.argv[2]))]
    print("READY", flush=True)
    for run in runs:
        run.wait(timeout=120)
    c.close(close_store=True)
    """
)


def stop_latencies(url: str, trials: int, workdir: Path) -> list[float]:
    script = workdir / "stop_worker.py"
    script.write_text(WORKER_SCRIPT, encoding="utf-8")
    worker = subprocess.Popen(
        [sys.executable, str(script), url, str(trials)], stdout=subprocess.PIPE, text=True
    )
    assert worker.stdout is not None and worker.stdout.readline().startswith("READY")
    console = Controller(store=open_store(url), owner="bench-console")
    latencies = []
    for i in range(trials):
        task_id = f"r{i}"
        while (snap := console.get(task_id)) is None or snap.status is not S.RUNNING:
            time.sleep(0.005)
        started = time.perf_counter()
        console.stop(task_id, reason="bench")
        while not console.get(task_id).status.is_terminal:  # type: ignore[union-attr]
            time.sleep(0.001)
        latencies.append(time.perf_counter() - started)
    worker.wait(timeout=60)
    console.close(close_store=True)
    return latencies


def main() -> int:
    dsn = os.environ.get("CHONGMING_TEST_POSTGRES", "").strip()
    if not dsn:
        print("需要 CHONGMING_TEST_POSTGRES=postgresql://user@host:5432/db，跳过 Postgres 基准")
        return 0
    import psycopg

    quick = "--quick" in sys.argv
    n = 500 if quick else 2_000
    schema = f"ct_bench_{os.getpid()}"
    url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            our_rate = ours(url, n)
            theirs = procrastinate_rate(dsn, f"{schema}_procrastinate", n, workdir)
            print(f"吞吐（{n:,} 个空任务，2 个并行，完整历史）")
            print(f"  Controller + PostgresTaskStore   {our_rate:8,.0f} 任务/秒")
            many_rate = ours(url, n, many=True)
            print(f"  同上，submit_many 一次提交       {many_rate:8,.0f} 任务/秒")
            if theirs is None:
                print("  Procrastinate（concurrency=2）   未安装 procrastinate，跳过对照")
            else:
                ratio = our_rate / theirs
                label = "  Procrastinate（concurrency=2）"
                print(f"{label}   {theirs:8,.0f} 作业/秒   比值 {ratio:.2f}×（目标 ≥ 1.5×）")
            latencies = stop_latencies(url, 5 if quick else 15, workdir)
            p50 = statistics.median(latencies) * 1000
            worst = max(latencies) * 1000
            print(f"跨进程停止时延（NOTIFY）：p50 {p50:.0f} ms，最大 {worst:.0f} ms（目标 p50 ≤ 50 ms）")
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return 0


if __name__ == "__main__":
    sys.exit(main())
