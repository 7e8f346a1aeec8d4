"""批量提交基准（issue 17.3；用户指南 §9.8）：Controller.submit_many 把 N 个 create 按批写进一个事务。

1. 100,000 个任务 submit_many 进 SqliteTaskStore ≤ 5 s；对照：SqliteHuey 逐个 enqueue 同样多
   （huey 没有批量入队）。
2. 100,000 个任务 submit_many 进 PostgresTaskStore ≤ 10 s（需要 CHONGMING_TEST_POSTGRES）；对照：
   Procrastinate 的 ``batch_defer`` 同样多。
3. 排队中任务在 Controller 里的内存：10 万个排队任务（唯一的额度被一个挡路的任务占着，它们都不执行），
   tracemalloc 量出的每任务字节数 ≤ 2 KB（InMemory 存储之外：不带存储的 Controller）。
4. 作对照：同样 10 万个任务逐个 submit 进 SQLite 要多久（--quick 时 1 万个）。

运行：python bench/bench_submit_many.py [--quick] [--ours-only]

``--ours-only``：只测我们自己（不跑 Huey / Procrastinate、不测逐个 submit 的对照）——对照要几分钟，
调优时反复跑用它；报告里的比值必须来自不带它的同一次运行。
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

from chongming_task import Controller, SqliteTaskStore, Submit

GOAL_SQLITE = 5.0
GOAL_POSTGRES = 10.0
GOAL_BYTES = 2048


def noop(ctx: Any) -> None:
    return None


def blocker(ctx: Any, gate: threading.Event) -> None:
    gate.wait(600)


def queued_controller(store: Any) -> tuple[Controller, threading.Event]:
    """一个额度、被挡路任务占着：之后提交的任务全部停在 queued（只测提交本身）。"""
    c = Controller(max_parallel=1, store=store)
    c.register("noop", noop)
    c.register("blocker", blocker)
    gate = threading.Event()
    c.submit("blocker", gate)
    return c, gate


def finish(c: Controller, gate: threading.Event) -> None:
    c.stop_all(reason="基准结束")
    gate.set()
    c.close(close_store=True)


def submit_many_seconds(store: Any, n: int, *, teardown: bool = True) -> float:
    c, gate = queued_controller(store)
    specs = [Submit("noop") for _ in range(n)]
    started = time.perf_counter()
    c.submit_many(specs)
    elapsed = time.perf_counter() - started
    if teardown:
        finish(c, gate)
    return elapsed


OURS_PG_SCRIPT = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, sys.argv[3])
    from bench_submit_many import submit_many_seconds
    from chongming_task import open_store
    print(f"{submit_many_seconds(open_store(sys.argv[1]), int(sys.argv[2]), teardown=False):.3f}", flush=True)
    os._exit(0)  # 不逐个停掉十万个排队任务（那是十万次写）：父进程直接删掉整个 schema
    """
)


def submit_loop_seconds(store: Any, n: int) -> float:
    c, gate = queued_controller(store)
    started = time.perf_counter()
    for _ in range(n):
        c.submit("noop")
    elapsed = time.perf_counter() - started
    finish(c, gate)
    return elapsed


def bytes_per_queued_task(n: int) -> float:
    c, gate = queued_controller(None)
    specs = [Submit("noop") for _ in range(n)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    c.submit_many(specs)
    del specs
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    per_task = (after - before) / n
    finish(c, gate)
    return per_task


HUEY_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from huey import SqliteHuey
    huey = SqliteHuey(filename=sys.argv[1], results=False)

    @huey.task()
    def noop():
        return None

    n = int(sys.argv[2])
    started = time.perf_counter()
    for _ in range(n):
        noop()
    print(f"{time.perf_counter() - started:.3f}", flush=True)
    """
)

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
        for start in range(0, n, 1000):
            noop.batch_defer(*({} for _ in range(min(1000, n - start))))
        print(f"{time.perf_counter() - started:.3f}", flush=True)
    """
)


def peer_seconds(script_text: str, args: list[str], workdir: Path, name: str) -> float:
    script = workdir / f"{name}.py"
    script.write_text(script_text, encoding="utf-8")
    result = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=900)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0 or not lines:
        raise RuntimeError(f"{name} 基准失败：{result.stderr[-2000:]}")
    return float(lines[-1])


def huey_seconds(n: int, workdir: Path) -> float | None:
    try:
        import huey  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        return None
    return peer_seconds(HUEY_SCRIPT, [str(workdir / "huey.db"), str(n)], workdir, "huey_enqueue")


def procrastinate_seconds(dsn: str, schema: str, n: int, workdir: Path) -> float | None:
    try:
        import procrastinate  # noqa: F401
    except ImportError:
        return None
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    try:
        return peer_seconds(PROCRASTINATE_SCRIPT, [dsn, schema, str(n)], workdir, "procrastinate_defer")
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def line(label: str, ours: float, peer: float | None, peer_label: str, goal: float) -> None:
    verdict = "达标" if ours <= goal else "未达标"
    print(f"  {label:<34} {ours:7.2f} s（目标 ≤ {goal:g} s，{verdict}）")
    if peer is None:
        print(f"  {peer_label:<34} 未测（未安装，或带了 --ours-only），跳过对照")
    else:
        print(f"  {peer_label:<34} {peer:7.2f} s   比值（对照 / 我们）{peer / ours:.2f}×")


def main() -> int:
    quick = "--quick" in sys.argv
    peers = "--ours-only" not in sys.argv
    n = 20_000 if quick else 100_000
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        print(f"批量提交 {n:,} 个任务（都停在 queued：只测提交）")
        ours = submit_many_seconds(SqliteTaskStore(str(workdir / "many.db")), n)
        line(
            "submit_many → SqliteTaskStore",
            ours,
            huey_seconds(n, workdir) if peers else None,
            "SqliteHuey 逐个 enqueue",
            GOAL_SQLITE,
        )
        if peers:
            loop_n = n // 10
            loop = submit_loop_seconds(SqliteTaskStore(str(workdir / "loop.db")), loop_n)
            scaled = loop * 10
            print(
                f"  （对照：逐个 submit {loop_n:,} 个进 SQLite {loop:.2f} s，折合 {n:,} 个 {scaled:.1f} s）"
            )
        dsn = os.environ.get("CHONGMING_TEST_POSTGRES")
        if dsn:
            schema = f"ct_bench_many_{os.getpid()}"
            url = f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}"
            try:
                here = str(Path(__file__).resolve().parent)
                ours_pg = peer_seconds(OURS_PG_SCRIPT, [url, str(n), here], workdir, "ours_pg")
            finally:
                import psycopg

                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            theirs = procrastinate_seconds(dsn, f"{schema}_procrastinate", n, workdir) if peers else None
            line(
                "submit_many → PostgresTaskStore", ours_pg, theirs, "Procrastinate batch_defer", GOAL_POSTGRES
            )
        else:
            print("  需要 CHONGMING_TEST_POSTGRES 才测 Postgres，跳过")
        per_task = bytes_per_queued_task(n)
        verdict = "达标" if per_task <= GOAL_BYTES else "未达标"
        print(f"排队中任务的内存（tracemalloc，{n:,} 个）：每任务 {per_task:,.0f} 字节（≤ 2 KB，{verdict}）")
    return 0


if __name__ == "__main__":
    sys.exit(main())
