"""Controller + SqliteTaskStore 端到端基准（同一次运行里测对照，打印比值）。

1. 吞吐：空任务经 Controller(max_parallel=2) + SqliteTaskStore（完整历史、WAL、synchronous=NORMAL），
   对照 a) Huey 的 SqliteHuey + 2 个线程 worker，b) DBOS 持久队列（系统库是一次性 SQLite 文件，
   worker_concurrency=2，最多 1,000 个任务，见 _peer_dbos.py）。
   对照组只装在基准环境里（requirements-bench.txt）。两边都用各自的默认持久性：SqliteHuey 不给 fsync
   时不设 synchronous，WAL 下是 SQLite 的默认 FULL（每次提交 fsync WAL，断电也不丢）；它的
   fsync=False 是 synchronous=OFF（断电或系统崩溃可能丢提交、坏库），比我们的 NORMAL（进程崩溃不丢、
   断电可能丢最后几个事务）弱，没有与 NORMAL 对等的档，所以照它的默认测。fsync 贵的机器上这一点
   偏向我们，读比值时要记得。所以另外再测一组同等持久性的对照：我们的存储也开 synchronous=FULL（每次提交
   fsync WAL），与 SqliteHuey 交替 3 轮，打印比值、不判目标（只作参照）。
   目标（issue 17）：≥ 2.0× SqliteHuey（各自默认），且领先 DBOS。
2. reconcile()：10 万个任务（其中 1,000 个失去监督者的 running、1,000 个排队）≤ 2 s。
3. 跨进程停止时延：另一个进程 stop() → 任务在存储里落终态，p50 ≤ 300 ms。
（100 万行上的 list 查询见 bench_sqlite_store.py。）

最后打印汇总表（每个对照一行：我们、对照、比值、目标、是否达成）。
运行：python bench/bench_sqlite.py [--quick]
"""

from __future__ import annotations

import sqlite3
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

from chongming_task import Controller, SqliteTaskStore, Submit, TaskSnapshot, TaskStatus
from chongming_task.stores.sqlite import codec, schema

S = TaskStatus


HUEY = "SqliteHuey（2 线程 worker）"
DBOS = "DBOS 队列（SQLite，worker_concurrency=2）"
GOALS = {HUEY: _peers.Goal(HUEY, 2.0), DBOS: _peers.Goal(DBOS, 1.0, ahead=True)}


def noop(ctx: Any) -> None:
    return None


ROUND_COSTS: list[tuple[float, float | None]] = []
"""逐个 submit 的每一轮：(每任务的进程 CPU 微秒, 每任务的写事务数)。墙钟之外的两个读数：这一行在 GIL 下
墙钟约等于总 CPU（bench/README.md 第十七—十九轮），速率变了先看是 CPU 变了还是机器上的邻居变了；提交数
看组提交合并得怎样。写事务数取自写穿的组提交（内部属性，取不到时不打印）。"""


def ours(n: int, workdir: Path, *, many: bool = False, tag: str = "", synchronous: str = "NORMAL") -> float:
    name = f"ours_many{tag}.db" if many else f"ours_{synchronous.lower()}{tag}.db"
    store = SqliteTaskStore(str(workdir / name), synchronous=synchronous)
    c = Controller(max_parallel=2, store=store)
    c.register("noop", noop)
    commits = getattr(getattr(getattr(c, "_link", None), "_write", None), "commits", None)
    batches = getattr(commits, "batches", None)
    cpu = time.process_time()
    started = time.perf_counter()
    if many:  # 批量提交（用户指南 §9.8）：每 1000 个任务一个 create 事务
        c.submit_many([Submit("noop") for _ in range(n)])
    else:
        for _ in range(n):
            c.submit("noop")
    c.wait_all(timeout=600)
    rate = n / (time.perf_counter() - started)
    if not many and synchronous == "NORMAL":
        per_task = None if batches is None else (commits.batches - batches) / n
        ROUND_COSTS.append(((time.process_time() - cpu) / n * 1e6, per_task))
    c.close(close_store=True)
    return rate


HUEY_SCRIPT = textwrap.dedent(
    """
    import os, sys, threading, time
    from huey import SqliteHuey
    from huey.signals import SIGNAL_COMPLETE
    # 结果照常保存（空任务返回 None，store_none=True 让它也落进结果表）；
    # 计数挂在 SIGNAL_COMPLETE 上：Huey 先写结果再发这个信号。
    huey = SqliteHuey(filename=sys.argv[1], results=True, store_none=True)
    n = int(sys.argv[2])
    done = [0]
    lock = threading.Lock()

    @huey.task()
    def noop():
        return None

    @huey.signal(SIGNAL_COMPLETE)
    def completed(signal, task):
        with lock:
            done[0] += 1
            if done[0] == n:
                print(f"{n / (time.perf_counter() - started):.1f}", flush=True)
                os._exit(0)

    started = time.perf_counter()
    for _ in range(n):
        noop()
    consumer = huey.create_consumer(workers=2, worker_type="thread", periodic=False,
                                    initial_delay=0.001, max_delay=0.01, backoff=1.05)
    consumer.run()
    """
)


def huey_rate(n: int, workdir: Path, tag: str = "") -> float | None:
    try:
        import huey  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        return None
    script = workdir / "huey_bench.py"
    script.write_text(HUEY_SCRIPT, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script), str(workdir / f"huey{tag}.db"), str(n)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"Huey 基准失败：{result.stderr[-2000:]}")
    return float(lines[-1])


def dbos_rate(n: int, workdir: Path) -> float | None:
    try:
        import dbos  # noqa: F401
    except ImportError:
        return None
    url = f"sqlite:///{workdir / 'dbos_system.sqlite'}"
    return _peers.run_script("_peer_dbos.py", [url, str(n)], timeout=900, what="DBOS（SQLite）")


def build_reconcile_file(path: Path, rows: int, orphans: int, queued: int) -> None:
    """批量灌入：orphans 个租约早已过期的 running、queued 个排队、其余终态。"""
    SqliteTaskStore(str(path)).close()
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    template = codec.snapshot_row(TaskSnapshot(task_id="x", name="x", created_at=t0))
    columns = ", ".join(schema.TASK_COLUMNS)
    marks = ", ".join("?" for _ in schema.TASK_COLUMNS)
    insert = f"INSERT INTO tasks ({columns}) VALUES ({marks})"
    task_rows = []
    for index in range(rows):
        created = t0 + timedelta(seconds=index)
        status = S.RUNNING if index < orphans else S.QUEUED if index < orphans + queued else S.SUCCEEDED
        row = dict(template)
        row.update(
            task_id=f"t{index:07d}",
            name="sync",
            status=status.value,
            status_version=0,
            created_at=codec.dt_text(created),
            created_key=codec.dt_key(created),
            owner="dead-node",
            lease_owner="dead-node",
            lease_until=codec.dt_text(t0),
            lease_key=codec.dt_key(t0),
        )
        if status is S.RUNNING:
            row.update(started_at=codec.dt_text(created))
        if status.is_terminal:
            row.update(finished_at=codec.dt_text(created), finished_key=codec.dt_key(created))
        task_rows.append([row.get(c) for c in schema.TASK_COLUMNS])
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    conn.executemany(insert, task_rows)
    conn.execute("COMMIT")
    conn.close()


def reconcile_seconds(workdir: Path, rows: int) -> tuple[float, int, int]:
    path = workdir / "reconcile.db"
    build_reconcile_file(path, rows, orphans=1_000, queued=1_000)
    c = Controller(store=SqliteTaskStore(str(path)), owner="heir")
    started = time.perf_counter()
    report = c.reconcile()
    elapsed = time.perf_counter() - started
    c.close(close_store=True)
    return elapsed, len(report.lost), len(report.adoptable)


WORKER_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from chongming_task import Controller, SqliteTaskStore

    def resident(ctx):
        while True:
            ctx.checkpoint()
            time.sleep(0.005)

    c = Controller(store=SqliteTaskStore(sys.argv[1]), owner="bench-worker")
    c.register("resident", resident)
    runs = [c.submit("resident", task_id=f"r{i}") for i in range(int(sys.argv[2]))]
    print("READY", flush=True)
    for run in runs:
        run.wait(timeout=120)
    c.close(close_store=True)
    """
)


def stop_latencies(workdir: Path, trials: int) -> list[float]:
    db = workdir / "stop.db"
    script = workdir / "stop_worker.py"
    script.write_text(WORKER_SCRIPT, encoding="utf-8")
    worker = subprocess.Popen(
        [sys.executable, str(script), str(db), str(trials)], stdout=subprocess.PIPE, text=True
    )
    assert worker.stdout is not None and worker.stdout.readline().startswith("READY")
    console = Controller(store=SqliteTaskStore(str(db)), owner="bench-console")
    latencies = []
    for i in range(trials):
        task_id = f"r{i}"
        while (snap := console.get(task_id)) is None or snap.status is not S.RUNNING:
            time.sleep(0.005)
        started = time.perf_counter()
        console.stop(task_id, reason="bench")
        while not console.get(task_id).status.is_terminal:  # type: ignore[union-attr]
            time.sleep(0.002)
        latencies.append(time.perf_counter() - started)
    worker.wait(timeout=60)
    console.close(close_store=True)
    return latencies


def main() -> int:
    quick = "--quick" in sys.argv
    n = 1_000 if quick else 5_000
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        our_rate, our_samples, peers = _peers.measure_alternating(
            _peers.ROUNDS,
            lambda r: ours(n, workdir, tag=f"_{r}"),
            [
                (HUEY, lambda r: huey_rate(n, workdir, tag=f"_{r}"), True),
                (DBOS, lambda r: dbos_rate(min(n, _peers.DBOS_TASKS), workdir), False),
            ],
        )
        print(f"吞吐（{n:,} 个空任务，2 个并行，完整历史）")
        print(f"  Controller + SqliteTaskStore：{our_rate:,.0f} 任务/秒")
        _peers.print_rounds("我们", our_samples, peers)
        if ROUND_COSTS:
            costs = " / ".join(
                f"{cpu:,.0f} µs" + ("" if commits is None else f"（{commits:.2f} 次提交）")
                for cpu, commits in ROUND_COSTS
            )
            print(f"  我们每轮的每任务进程 CPU（每任务写事务数）：{costs}")
        for peer in peers:
            _peers.print_peer_line(peer.label, peer, our_rate, GOALS[peer.label])
        full_rate, full_samples, full_peers = _peers.measure_alternating(
            _peers.ROUNDS,
            lambda r: ours(n, workdir, tag=f"_{r}", synchronous="FULL"),
            [(HUEY, lambda r: huey_rate(n, workdir, tag=f"_full_{r}"), True)],
        )
        huey_full = full_peers[0]
        if huey_full.rate is not None:
            rounds = " / ".join(f"{rate:,.0f}" for rate in full_samples)
            peer_rounds = " / ".join(f"{rate:,.0f}" for rate in huey_full.samples)
            print(
                "  同等持久性（我们也 synchronous=FULL，每次提交 fsync，同 SqliteHuey 的默认；只作参照）："
                f"我们 {full_rate:,.0f} 任务/秒（{rounds}）"
                f"vs SqliteHuey {huey_full.rate:,.0f}（{peer_rounds}）= {full_rate / huey_full.rate:.2f}×"
            )
        many_rate = ours(n, workdir, many=True)
        print(f"  同上，submit_many 一次提交：{many_rate:,.0f} 任务/秒")
        rows = 20_000 if quick else 100_000
        elapsed, lost, adoptable = reconcile_seconds(workdir, rows)
        found = f"判 LOST {lost}、adoptable {adoptable}"
        reconcile_ok = elapsed <= 2
        print(
            f"reconcile()：{rows:,} 个任务（{found}）用时 {elapsed:.2f} s"
            f"（目标 ≤ 2 s，{_peers.verdict(reconcile_ok)}）"
        )
        latencies = stop_latencies(workdir, 5 if quick else 15)
        p50 = statistics.median(latencies) * 1000
        stop_ok = p50 <= 300
        worst = max(latencies) * 1000
        print(
            f"跨进程停止时延：p50 {p50:.0f} ms，最大 {worst:.0f} ms"
            f"（目标 p50 ≤ 300 ms，{_peers.verdict(stop_ok)}）"
        )
        extra = (
            (f"reconcile() {rows:,} 个任务 {elapsed:.2f} s", "≤ 2 s", reconcile_ok),
            (f"跨进程停止 p50 {p50:.0f} ms", "≤ 300 ms", stop_ok),
        )
        _peers.print_summary("SQLite", "Controller + SqliteTaskStore", our_rate, peers, GOALS, extra)
        if huey_full.rate is not None:
            cells = [
                "SQLite",
                f"Controller + SqliteTaskStore（synchronous=FULL）{full_rate:,.0f}/s",
                f"{HUEY}，同等持久性",
                f"{huey_full.rate:,.0f}/s",
                f"{full_rate / huey_full.rate:.2f}×",
                "—（参照）",
                "—",
            ]
            print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
