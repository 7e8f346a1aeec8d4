"""Controller + PostgresTaskStore 端到端基准（同一次运行、同一台本地 PostgreSQL 上测对照）。

1. 吞吐：空任务经 Controller(max_parallel=2) + PostgresTaskStore（完整历史），对照
   a) Procrastinate（defer N 个作业 + 一个 concurrency=2 的 worker 跑到队列空），
   b) DBOS 持久队列（系统库是一次性数据库，worker_concurrency=2，最多 1,000 个任务，见 _peer_dbos.py），
   c) PgQueuer（一次性数据库，max_concurrent_tasks=2，见 _peer_pgqueuer.py）。
   对照组只装在基准环境里（requirements-bench.txt）。
   目标（issue 17）：≥ 2.0× Procrastinate，且领先 DBOS 与 PgQueuer。
2. 跨进程停止时延（LISTEN/NOTIFY）：另一个进程 stop() → 任务在存储里落终态，p50 ≤ 50 ms。
3. reconcile()：10 万个任务（其中 1,000 个失去监督者的 running、1,000 个排队）≤ 2 s
   （与 bench_sqlite.py 同一目标）。
最后打印汇总表（每个对照一行：我们、对照、比值、目标、是否达成）。

需要 CHONGMING_TEST_POSTGRES（例如 postgresql://postgres@127.0.0.1:5432/test）。
我们与 Procrastinate 各用一个独立 schema，DBOS 与 PgQueuer 各用一个一次性数据库，结束后都删除。
Postgres 连不上时打印一行说明并跳过本基准（不影响 make bench 里的其他基准）。
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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _peers

from chongming_task import Controller, Submit, TaskSnapshot, TaskStatus, open_store
from chongming_task.stores.postgres._codec import task_params
from chongming_task.stores.postgres._sql import Sql, transition_params

S = TaskStatus
PROCRASTINATE = "Procrastinate（concurrency=2）"
DBOS = "DBOS 队列（Postgres，worker_concurrency=2）"
PGQUEUER = "PgQueuer（max_concurrent_tasks=2）"
GOALS = {
    PROCRASTINATE: _peers.Goal(PROCRASTINATE, 2.0),
    DBOS: _peers.Goal(DBOS, 1.0, ahead=True),
    PGQUEUER: _peers.Goal(PGQUEUER, 1.0, ahead=True),
}


def noop(ctx: Any) -> None:
    return None


OUR_CPU: list[tuple[float, float]] = []
"""逐轮（本进程每任务 CPU 微秒数，这一轮结束时的 1 分钟负载）：墙钟一轮之间差 ±20 % 时，用它分辨是我们自己
变慢了（CPU / 任务跟着涨）还是机器上的邻居抢了核（CPU / 任务不变，负载高）——见 bench/README.md pg18 一节。"""


def ours(url: str, n: int, *, many: bool = False) -> float:
    c = Controller(max_parallel=2, store=open_store(url))
    c.register("noop", noop)
    started = time.perf_counter()
    cpu = time.process_time()
    if many:  # 批量提交（用户指南 §9.8）：每 1000 个任务一个 create 事务
        c.submit_many([Submit("noop") for _ in range(n)])
    else:
        for _ in range(n):
            c.submit("noop")
    c.wait_all(timeout=900)
    rate = n / (time.perf_counter() - started)
    if not many:
        OUR_CPU.append(((time.process_time() - cpu) / n * 1e6, os.getloadavg()[0]))
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


def dbos_rate(dsn: str, n: int) -> float | None:
    try:
        import dbos  # noqa: F401
    except ImportError:
        return None
    with _peers.throwaway_database(dsn, "ct_bench_dbos") as url:
        return _peers.run_script("_peer_dbos.py", [url, str(n)], what="DBOS（Postgres）")


def pgqueuer_rate(dsn: str, n: int) -> float | None:
    try:
        import asyncpg  # noqa: F401
        import pgqueuer  # noqa: F401
    except ImportError:
        return None
    with _peers.throwaway_database(dsn, "ct_bench_pgqueuer") as url:
        return _peers.run_script("_peer_pgqueuer.py", [url, str(n)], what="PgQueuer")


def build_reconcile_schema(dsn: str, schema: str, rows: int, orphans: int, queued: int) -> None:
    """批量灌入（存储自己的 create 语句，一个事务）。

    orphans 个租约早已过期的 running、queued 个排队、其余终态。
    """
    import psycopg

    open_store(f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}").close()  # 建表
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    no_history = transition_params([])

    def params(index: int) -> dict[str, Any]:
        created = t0 + timedelta(seconds=index)
        status = S.RUNNING if index < orphans else S.QUEUED if index < orphans + queued else S.SUCCEEDED
        snapshot = TaskSnapshot(
            task_id=f"t{index:07d}",
            name="sync",
            created_at=created,
            status=status,
            owner="dead-node",
            lease_owner="dead-node",
            lease_until=t0,
            started_at=created if status is not S.QUEUED else None,
            finished_at=created if status.is_terminal else None,
        )
        return {**task_params(snapshot), **no_history}

    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        cur.executemany(Sql(schema).create, (params(index) for index in range(rows)))


def reconcile_seconds(dsn: str, schema: str, rows: int) -> tuple[float, int, int]:
    build_reconcile_schema(dsn, schema, rows, orphans=1_000, queued=1_000)
    c = Controller(store=open_store(f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"), owner="heir")
    started = time.perf_counter()
    report = c.reconcile()
    elapsed = time.perf_counter() - started
    c.close(close_store=True)
    return elapsed, len(report.lost), len(report.adoptable)


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

    if not _peers.postgres_reachable(dsn, "Postgres 基准"):
        return 0

    quick = "--quick" in sys.argv
    n = 500 if quick else 2_000
    schema = f"ct_bench_{os.getpid()}"
    url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            # 每轮我们用一个新 schema（不在上一轮留下的行上跑），Procrastinate 每轮也建新 schema 并删掉。
            our_rate, our_samples, peers = _peers.measure_alternating(
                _peers.ROUNDS,
                lambda r: ours(f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}_r{r}", n),
                [
                    (
                        PROCRASTINATE,
                        lambda r: procrastinate_rate(dsn, f"{schema}_procrastinate", n, workdir),
                        True,
                    ),
                    (PGQUEUER, lambda r: pgqueuer_rate(dsn, n), True),
                    (DBOS, lambda r: dbos_rate(dsn, min(n, _peers.DBOS_TASKS)), False),
                ],
            )
            print(f"吞吐（{n:,} 个空任务，2 个并行，完整历史）")
            print(f"  Controller + PostgresTaskStore：{our_rate:,.0f} 任务/秒")
            _peers.print_rounds("我们", our_samples, peers)
            print(
                "  我们每轮的客户端 CPU（µs / 任务，括号里是当时的 1 分钟负载）："
                + " / ".join(f"{cpu:,.0f}（{load:.1f}）" for cpu, load in OUR_CPU)
            )
            for peer in peers:
                _peers.print_peer_line(peer.label, peer, our_rate, GOALS[peer.label])
            many_rate = ours(url, n, many=True)
            print(f"  同上，submit_many 一次提交：{many_rate:,.0f} 任务/秒")
            latencies = stop_latencies(url, 5 if quick else 15, workdir)
            p50 = statistics.median(latencies) * 1000
            worst = max(latencies) * 1000
            stop_ok = p50 <= 50
            print(
                f"跨进程停止时延（NOTIFY）：p50 {p50:.0f} ms，最大 {worst:.0f} ms"
                f"（目标 p50 ≤ 50 ms，{_peers.verdict(stop_ok)}）"
            )
            rows = 20_000 if quick else 100_000
            reconcile_row: tuple[str, str, bool | None]
            try:
                elapsed, lost, adoptable = reconcile_seconds(dsn, f"{schema}_reconcile", rows)
            except psycopg.Error as exc:  # 共享服务器上的连接可能被别人断开：记一行，汇总照常打印
                reason = " ".join(str(exc).split())[:200]
                print(f"reconcile()：{rows:,} 个任务的测量失败，已跳过（{reason}）")
                reconcile_row = (f"reconcile() {rows:,} 个任务", "≤ 2 s", None)
            else:
                reconcile_ok = elapsed <= 2
                print(
                    f"reconcile()：{rows:,} 个任务（判 LOST {lost}、adoptable {adoptable}）"
                    f"用时 {elapsed:.2f} s（目标 ≤ 2 s，{_peers.verdict(reconcile_ok)}）"
                )
                reconcile_row = (f"reconcile() {rows:,} 个任务 {elapsed:.2f} s", "≤ 2 s", reconcile_ok)
            extra = ((f"跨进程停止（NOTIFY）p50 {p50:.0f} ms", "≤ 50 ms", stop_ok), reconcile_row)
            _peers.print_summary("Postgres", "Controller + PostgresTaskStore", our_rate, peers, GOALS, extra)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            rounds = [f"{schema}_r{r}" for r in range(_peers.ROUNDS)]
            for name in (schema, f"{schema}_reconcile", *rounds):
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    return 0


if __name__ == "__main__":
    sys.exit(main())
