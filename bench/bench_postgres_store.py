"""PostgresTaskStore 基准：save 的往返时延与吞吐、指令认领吞吐、NOTIFY 唤醒时延。

    CHONGMING_TEST_POSTGRES=postgresql://postgres@127.0.0.1:5432/test python bench/bench_postgres_store.py

同一次运行里量基线再量我们，打印比值：

* 往返基线：``SELECT 1``（一次网络往返的下限）。单语句 save 应接近它。
* 写法基线：同样的写入用"朴素"的多语句事务（BEGIN / 带版本校验的 UPDATE / 逐条 INSERT 迁移记录 /
  COMMIT）完成。这正是 save 用一条 CTE 语句想省掉的往返。

* 列表查询（issue 17 / 19，pg14）：1,000,000 行的 tasks 上几种常见的 ``query(...)``（与
  bench_sqlite_store.py 的大文件同一分布），目标 ``query(statuses={RUNNING}, limit=50)`` ≤ 20 ms（中位数）；
  另打印每条查询的执行计划用了哪些索引。``--big`` 只跑这一部分。

每次运行用一个临时 schema，结束时删除。只打印数字，不判对错（列表查询打印是否达成目标）。
"""

from __future__ import annotations

import math
import os
import secrets
import statistics
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import _peers
import psycopg
from psycopg import sql

from chongming_task.core.recipes import Recipe
from chongming_task.core.storage.values import QueryOrder, TaskQuery
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.states import NON_TERMINAL_STATUSES, TaskStatus
from chongming_task.stores.postgres import PostgresTaskStore
from chongming_task.stores.postgres._codec import task_params
from chongming_task.stores.postgres._sql import transition_params as _transition_params
from chongming_task.stores.postgres._sql import transitions_insert as _transitions_insert

S = TaskStatus
T0 = datetime(2026, 1, 1, tzinfo=UTC)
LIFECYCLE = [S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED]


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _step(snapshot: TaskSnapshot, status: TaskStatus) -> tuple[TaskSnapshot, Transition]:
    version = snapshot.status_version + 1
    at = T0 + timedelta(seconds=version)
    record = Transition(
        snapshot.task_id, snapshot.status, status, f"bench:{status.value}", "bench", None, version, at
    )
    return snapshot.evolve(status=status, status_version=version), record


def bench_latency(store: PostgresTaskStore, dsn: str, schema: str) -> None:
    """四种写法轮流各做一次、重复 n 轮：共享机器上的噪声对它们一视同仁。"""
    n = 300
    ours_task = TaskSnapshot(task_id="lat", name="bench", created_at=T0, status=S.RUNNING)
    naive_task = TaskSnapshot(task_id="naive", name="bench", created_at=T0, status=S.RUNNING)
    store.create(ours_task)
    store.create(naive_task)
    # 朴素写法：与 save 完全相同的 UPDATE（全部列、jsonb、版本校验）与迁移记录 INSERT，但分成
    # BEGIN / UPDATE / INSERT / COMMIT 四次往返。直接借用存储内部渲染好的语句，保证写入内容一致。
    update_sql = store._sql.save_no_history
    insert_sql = _transitions_insert(store._sql.s, "")
    bump = sql.SQL("UPDATE {}.tasks SET attempt = attempt + 1 WHERE task_id = 'naive'").format(
        sql.Identifier(schema)
    )
    samples: dict[str, list[float]] = {k: [] for k in ("select1", "durable", "naive", "ours", "get")}
    state = {"ours": ours_task, "naive": naive_task}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(n):
            started = time.perf_counter()
            conn.execute("SELECT 1").fetchone()
            samples["select1"].append(time.perf_counter() - started)

            started = time.perf_counter()
            conn.execute(bump)
            samples["durable"].append(time.perf_counter() - started)

            nxt, record = _step(state["naive"], S.RUNNING)
            started = time.perf_counter()
            params = task_params(nxt)
            params["expect_version"] = state["naive"].status_version
            with conn.transaction():
                row = conn.execute(update_sql, params).fetchone()
                assert row is not None and row[0] == 1
                conn.execute(insert_sql, _transition_params([record]))
            samples["naive"].append(time.perf_counter() - started)
            state["naive"] = nxt

            nxt, record = _step(state["ours"], S.RUNNING)
            started = time.perf_counter()
            store.save(nxt, expect_version=state["ours"].status_version, transitions=[record])
            samples["ours"].append(time.perf_counter() - started)
            state["ours"] = nxt

            started = time.perf_counter()
            store.get("lat")
            samples["get"].append(time.perf_counter() - started)

    p = {k: _percentiles(v) for k, v in samples.items()}
    print("== 单次 save 时延（带 1 条迁移记录），毫秒；四种写法逐轮交替测量 ==")
    labels = {
        "select1": "SELECT 1（一次往返）  ",
        "durable": "单行 UPDATE 自动提交  ",
        "naive": "同样写入·多语句事务  ",
        "ours": "PostgresTaskStore.save",
        "get": "PostgresTaskStore.get ",
    }
    for key, label in labels.items():
        p50, p99 = p[key]
        print(f"  {label} p50 {p50 * 1e3:6.3f}  p99 {p99 * 1e3:7.3f}")
    ours50, naive50, dur50 = p["ours"][0], p["naive"][0], p["durable"][0]
    print(f"  多语句事务 / save = {naive50 / ours50:.2f}x（越大越好：一条语句省下的往返）")
    print(f"  save / 最小持久写 = {ours50 / dur50:.2f}x（越接近 1 越好：提交时的 WAL fsync 是下限）")


def bench_throughput(store: PostgresTaskStore, threads: int, tasks_per_thread: int) -> float:
    """每个任务：create + 4 次 save（排队→启动→运行→成功，各带一条迁移记录）。"""
    barrier = threading.Barrier(threads + 1)

    def run(worker: int) -> None:
        barrier.wait()
        for i in range(tasks_per_thread):
            current = TaskSnapshot(task_id=f"tp-{threads}-{worker}-{i}", name="bench", created_at=T0)
            store.create(current)
            for status in LIFECYCLE:
                nxt, record = _step(current, status)
                store.save(nxt, expect_version=current.status_version, transitions=[record])
                current = nxt

    pool = [threading.Thread(target=run, args=(w,)) for w in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - started
    return threads * tasks_per_thread / elapsed


def bench_claims(store: PostgresTaskStore, threads: int, commands: int) -> float:
    target = f"claim-target-{threads}"
    store.create(TaskSnapshot(task_id=target, name="bench", created_at=T0))
    for _ in range(commands):
        store.submit_command(target, "stop")
    barrier = threading.Barrier(threads + 1)
    taken: list[int] = []
    lock = threading.Lock()

    def run(worker: int) -> None:
        barrier.wait()
        count = 0
        while batch := store.claim_commands(f"c{worker}", lease=60, limit=10):
            for command in batch:
                store.complete_command(command.command_id, f"c{worker}")
            count += len(batch)
        with lock:
            taken.append(count)

    pool = [threading.Thread(target=run, args=(w,)) for w in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - started
    assert sum(taken) == commands, (sum(taken), commands)
    return commands / elapsed


def bench_notify(dsn: str, schema: str, rounds: int = 30) -> list[float]:
    holder = PostgresTaskStore(dsn, schema=schema)
    console = PostgresTaskStore(dsn, schema=schema)
    try:
        holder.create(TaskSnapshot(task_id="notify", name="bench", created_at=T0))
        holder.wait_for_commands(0)
        woke = threading.Event()
        stamp: list[float] = []

        def on_notice(_: object) -> None:
            stamp.append(time.perf_counter())
            woke.set()

        holder.listen(on_notice)
        latencies = []
        for _ in range(rounds):
            woke.clear()
            stamp.clear()
            sent = time.perf_counter()
            console.submit_command("notify", "stop")
            if not woke.wait(5):
                raise RuntimeError("通知 5 秒没到")
            latencies.append(stamp[0] - sent)
            time.sleep(0.01)
        return latencies
    finally:
        console.close()
        holder.close()


BIG_ROWS = 1_000_000
LIST_GOAL_MS = 20.0


def build_big_table(store: PostgresTaskStore, dsn: str, schema: str, rows: int) -> None:
    """与 bench_sqlite_store.py 的大文件同一分布：2% running（一半租约已过期）、3% queued、其余四种终态
    轮流；64 个桶、8 个 owner、100 个任务名、每 10 行一个 io 标签、每 20 行一个持久任务（带配方）。
    一条 INSERT … SELECT generate_series 灌入（索引随插随建，与线上逐行写入时的形状相同），再 ANALYZE。"""
    store.create(
        TaskSnapshot(task_id="template", name="t", created_at=T0, recipe=Recipe("sync", args=(), kwargs={}))
    )
    s = sql.Identifier(schema)
    statement = sql.SQL(
        """INSERT INTO {s}.tasks (task_id, name, status, status_version, attempt, max_attempts, created_at,
    created_at_off, started_at, started_at_off, finished_at, finished_at_off, tags, bucket, owner,
    lease_owner, lease_until, lease_until_off, recipe)
SELECT 'task-' || lpad(i::text, 8, '0'), 'sync-' || (i %% 100), st, 3, 1, 1,
    %(t0)s + i * interval '1 second', 0,
    %(t0)s + i * interval '1 second', 0,
    CASE WHEN st IN ('running', 'queued') THEN NULL ELSE %(t0)s + (i + 5) * interval '1 second' END,
    CASE WHEN st IN ('running', 'queued') THEN NULL ELSE 0 END,
    CASE WHEN i %% 10 = 0 THEN ARRAY['io'] ELSE '{{}}'::text[] END, i %% 64,
    'worker-' || (i %% 8), 'worker-' || (i %% 8),
    CASE WHEN st = 'running' AND i %% 2 = 0 THEN now() + interval '1 hour'
         ELSE %(t0)s + (i + 30) * interval '1 second' END, 0,
    CASE WHEN i %% 20 = 0 THEN (SELECT recipe FROM {s}.tasks WHERE task_id = 'template') END
FROM (SELECT i, CASE WHEN i %% 50 = 7 THEN 'running' WHEN i %% 33 = 5 THEN 'queued'
    ELSE (ARRAY['succeeded', 'failed', 'stopped', 'cancelled'])[i %% 4 + 1] END AS st
    FROM generate_series(0, %(last)s) AS i) AS g"""
    ).format(s=s)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DELETE FROM {}.tasks").format(s))
        conn.execute(statement, {"t0": T0, "last": rows - 1})
        conn.execute(sql.SQL("VACUUM ANALYZE {}.tasks").format(s))


def _plan_indexes(dsn: str, store: PostgresTaskStore, query: TaskQuery) -> str:
    """``store.query(query)`` 那条语句的执行计划里出现的索引名（没有就是顺序扫描）。"""
    text, params = store._sql.query(query)
    with psycopg.connect(dsn, autocommit=True) as conn:
        plan = conn.execute(f"EXPLAIN (FORMAT JSON) {text}", params).fetchone()[0]
    names: list[str] = []

    def walk(node: dict[str, object]) -> None:
        if "Index Name" in node:
            names.append(str(node["Index Name"]))
        elif str(node.get("Node Type")) == "Seq Scan":
            names.append("Seq Scan")
        for child in node.get("Plans", []):  # type: ignore[union-attr]
            walk(child)

    walk(plan[0]["Plan"])
    return "+".join(names)


def bench_big_queries(dsn: str, schema: str) -> bool:
    print(f"== 列表查询：{BIG_ROWS:,} 行的 tasks（目标 running 最新 50 条中位 ≤ {LIST_GOAL_MS:.0f} ms） ==")
    store = PostgresTaskStore(dsn, schema=schema)
    try:
        started = time.perf_counter()
        build_big_table(store, dsn, schema, BIG_ROWS)
        print(f"  灌入并 ANALYZE 用时 {time.perf_counter() - started:.1f} s")
        now = datetime.now(UTC)
        newest = QueryOrder.NEWEST_FIRST
        oldest = QueryOrder.OLDEST_FIRST
        queries = {
            "running 最新 50": TaskQuery(statuses=frozenset({S.RUNNING}), limit=50, order=newest),
            "最新 50": TaskQuery(limit=50, order=newest),
            "failed 最新 50": TaskQuery(statuses=frozenset({S.FAILED}), limit=50, order=newest),
            "succeeded 最新 50": TaskQuery(statuses=frozenset({S.SUCCEEDED}), limit=50, order=newest),
            "failed+queued 最新 50": TaskQuery(
                statuses=frozenset({S.FAILED, S.QUEUED}), limit=50, order=newest
            ),
            "标签 io 最新 50": TaskQuery(tag="io", limit=50, order=newest),
            "桶 7 最新 50": TaskQuery(bucket=7, limit=50, order=newest),
            "名字前缀 sync-7 最新 50": TaskQuery(name_prefix="sync-7", limit=50, order=newest),
            "持久 最新 50": TaskQuery(durable=True, limit=50, order=newest),
            "reconcile（非终态、租约过期）": TaskQuery(
                statuses=NON_TERMINAL_STATUSES, lease_expired_before=now, awaiting_claim=False, order=oldest
            ),
            "lost 持久（worker 维护）": TaskQuery(
                statuses=frozenset({S.LOST}), durable=True, lease_expired_before=now, order=oldest
            ),
        }
        goal_ms = math.inf
        for label, query in queries.items():
            store.query(query)  # 预热
            samples = [timed(lambda q=query: store.query(q)) * 1000 for _ in range(15)]
            p50 = statistics.median(samples)
            if label == "running 最新 50":
                goal_ms = p50
            print(f"  {label:<28} 中位 {p50:8.2f} ms  [{_plan_indexes(dsn, store, query)}]")
    finally:
        store.close()
    ok = goal_ms <= LIST_GOAL_MS
    print(
        f"  running 最新 50 中位 {goal_ms:.2f} ms"
        f"（目标 ≤ {LIST_GOAL_MS:.0f} ms，{'达成' if ok else '未达成'}）"
    )
    return ok


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    args = [arg for arg in sys.argv[1:] if not arg.startswith("--")]
    dsn = args[0] if args else os.environ.get("CHONGMING_TEST_POSTGRES", "")
    if not dsn:
        print("需要 DSN（参数或环境变量 CHONGMING_TEST_POSTGRES），跳过 Postgres 存储基准")
        return
    if not _peers.postgres_reachable(dsn, "Postgres 存储基准"):
        return
    schema = f"ct_bench_{secrets.token_hex(4)}"
    try:
        if "--big" in sys.argv[1:]:
            bench_big_queries(dsn, f"{schema}_big")
            return
        run_all(dsn, schema)
    finally:  # 中途失败也不在共享的数据库里留下基准的 schema
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name in (schema, f"{schema}_big"):
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def run_all(dsn: str, schema: str) -> None:
    store = PostgresTaskStore(dsn, schema=schema, max_size=8)
    try:
        bench_latency(store, dsn, schema)
        print("== 吞吐：每个任务 create + 4 次 save（全历史） ==")
        single = bench_throughput(store, 1, 300)
        print(f"  1 线程  {single:8.0f} 任务/秒  ({single * 5:8.0f} 次写/秒)")
        for threads in (4, 8):
            rate = bench_throughput(store, threads, 150)
            print(f"  {threads} 线程  {rate:8.0f} 任务/秒  ({rate * 5:8.0f} 次写/秒)", end="")
            print(f"  相对 1 线程 {rate / single:.2f}x")
        print("== 指令认领：claim(limit=10) + complete，SKIP LOCKED ==")
        one = bench_claims(store, 1, 300)
        print(f"  1 认领者  {one:8.0f} 条/秒")
        four = bench_claims(store, 4, 600)
        print(f"  4 认领者  {four:8.0f} 条/秒  相对 1 认领者 {four / one:.2f}x")
    finally:
        store.close()
    latencies = bench_notify(dsn, schema)
    p50, p99 = _percentiles(latencies)
    print("== NOTIFY：另一个存储实例 submit_command → 监听回调 ==")
    print(f"  p50 {p50 * 1e3:.2f} ms   p99 {p99 * 1e3:.2f} ms", end="")
    verdict = "达成" if p50 <= 0.050 else "未达成"
    print(f"   （目标 p50 ≤ 50 ms，{verdict}；对比：1 秒轮询的平均等待 500 ms）")
    bench_big_queries(dsn, f"{schema}_big")


if __name__ == "__main__":
    main()
