"""每任务的写事务数与 CPU（bench/README.md "running 推迟写" 一节的测法；不是 make bench 直接运行的基准）。

写事务 = 存储方法的调用次数（create / save / save_many / write_many / claim_queued 各自一个事务；续租的 touch
不计）；
CPU = 本进程的 ``time.process_time()`` 与本次一次性数据库上全部服务器后端进程的 utime + stime（/proc）；
上下文切换 = 本进程全部线程的自愿 + 非自愿切换（``getrusage``）。
两种路径：``controller``（Controller(max_parallel=2) 逐个 submit 空任务，wait_all）与 ``worker``（先 enqueue
N 个持久任务，再由一个 2 槽的 serve() 跑完；只计 serve 这一段）。

用法：CHONGMING_TEST_POSTGRES=postgresql://postgres@127.0.0.1:5432/test \
    python bench/_count_writes.py {controller,worker} 500
"""

from __future__ import annotations

import collections
import os
import resource
import sys
import threading
import time
from typing import Any

import psycopg

from chongming_task import Controller, TaskStatus, open_store
from chongming_task.stores.postgres import PostgresTaskStore

COUNTED = ("create", "create_many", "save", "save_many", "write_many", "claim_queued")


def count_calls() -> collections.Counter[str]:
    calls: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    for name in COUNTED:
        original = getattr(PostgresTaskStore, name, None)
        if original is None:  # 旧版本没有这个方法（对照新旧两版时用同一份脚本）
            continue

        def counted(
            self: Any, *args: Any, _original: Any = original, _name: str = name, **kwargs: Any
        ) -> Any:
            with lock:
                calls[_name] += 1
            return _original(self, *args, **kwargs)

        setattr(PostgresTaskStore, name, counted)
    return calls


def server_cpu(dsn: str, database: str) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", [database]).fetchall()
    ticks = 0
    for (pid,) in rows:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def switches() -> int:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


def noop(ctx: Any, *args: Any) -> None:
    return None


def main() -> int:
    mode, n = sys.argv[1], int(sys.argv[2])
    dsn = os.environ["CHONGMING_TEST_POSTGRES"]
    database = f"ct_bench_count_{os.getpid()}"
    calls = count_calls()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}"')
    url = f"{dsn.rsplit('/', 1)[0]}/{database}?schema=count"  # 同一台服务器上的一次性数据库
    try:
        if mode == "controller":
            controller = Controller(max_parallel=2, store=open_store(url))
            controller.register("noop", noop)
            calls.clear()
            server0, cpu0, wall0 = server_cpu(dsn, database), time.process_time(), time.perf_counter()
            cs0 = switches()
            for _ in range(n):
                controller.submit("noop")
            controller.wait_all(timeout=900)
            wall1, cpu1, cs1 = time.perf_counter(), time.process_time(), switches()
            server1 = server_cpu(dsn, database)
            controller.close(close_store=True)
        else:
            submitter = Controller(store=open_store(url), owner="submitter")
            submitter.register("noop", noop, durable=True)
            for i in range(n):
                submitter.enqueue("noop", i)
            worker = Controller(2, store=open_store(url), owner="worker")
            worker.register("noop", noop)
            probe = open_store(url)
            calls.clear()
            server0, cpu0, wall0 = server_cpu(dsn, database), time.process_time(), time.perf_counter()
            cs0 = switches()
            stop = threading.Event()
            serving = threading.Thread(target=worker.serve, args=(stop,))
            serving.start()
            while probe.stats().counts[TaskStatus.SUCCEEDED] < n:
                time.sleep(0.25)  # 探针本身的 stats() 也计入本进程与服务器的 CPU：少看几次
            wall1, cpu1, cs1 = time.perf_counter(), time.process_time(), switches()
            server1 = server_cpu(dsn, database)
            stop.set()
            serving.join()
            probe.close()
            worker.close(close_store=True)
            submitter.close(close_store=True)
        per_task = {name: round(count / n, 2) for name, count in calls.items()}
        print(
            f"{mode}：每任务写事务 {sum(per_task.values()):.2f} {per_task}，客户端 CPU "
            f"{(cpu1 - cpu0) / n * 1e3:.2f} ms/任务，服务器 CPU {(server1 - server0) / n * 1e3:.2f} ms/任务，"
            f"上下文切换 {(cs1 - cs0) / n:.1f} 次/任务，墙钟 {n / (wall1 - wall0):.0f} 任务/秒"
        )
        # 存储都已关闭（后端退出时写出统计）：tasks 表上的更新有几次是 HOT 的、每个索引有多少项。
        with psycopg.connect(url.split("?", 1)[0], autocommit=True) as conn:
            row = conn.execute(
                "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                "WHERE schemaname = 'count' AND relname = 'tasks'"
            ).fetchone()
            indexes = conn.execute(
                "SELECT count(*) FROM pg_indexes WHERE schemaname = 'count' AND tablename = 'tasks'"
            ).fetchone()
        if row is not None and indexes is not None:
            print(f"tasks 表：插入 {row[0]}、更新 {row[1]}（其中 HOT {row[2]}），{indexes[0]} 个索引")
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main())
