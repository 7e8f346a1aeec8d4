"""多进程持久任务测试的任务模块与提交者入口（tests/integration/test_durable_processes.py）。

每次执行任务体先写一行副作用（``effects`` 表：task_id、第几次尝试、哪个 worker），再睡一会儿：被 kill -9 的
worker 上正在跑的任务留下了它的那一行，据此数出每个任务真正执行了几次。副作用库由环境变量
``CHONGMING_EFFECTS`` 给出：``sqlite:<路径>`` 或 ``postgresql://...#<schema>``。

提交者：``python durable_proc_tasks.py submit <存储连接串> <个数> <桶数>``。
"""

from __future__ import annotations

import os
import sqlite3
import sys
import threading
import time
from typing import Any

from chongming_task import Controller, RetryPolicy, open_store, task
from chongming_task.policies import FixedBackoff

_local = threading.local()
WORKER = os.environ.get("CHONGMING_TASK_OWNER", f"pid-{os.getpid()}")


def _effects() -> Any:
    conn = getattr(_local, "conn", None)
    if conn is not None:
        return conn
    target = os.environ["CHONGMING_EFFECTS"]
    if target.startswith("sqlite:"):
        conn = sqlite3.connect(target.removeprefix("sqlite:"), timeout=60, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
    else:
        import psycopg

        dsn, _, schema = target.partition("#")
        conn = psycopg.connect(dsn, autocommit=True)
        conn.execute(f'SET search_path TO "{schema}"')
    _local.conn = conn
    return conn


def create_effects_table() -> None:
    _effects().execute(
        "CREATE TABLE IF NOT EXISTS effects (task_id TEXT NOT NULL, attempt INTEGER, worker TEXT)"
    )


def _record(ctx: Any) -> None:
    marker = "?" if os.environ["CHONGMING_EFFECTS"].startswith("sqlite:") else "%s"
    _effects().execute(
        f"INSERT INTO effects (task_id, attempt, worker) VALUES ({marker}, {marker}, {marker})",
        (ctx.task_id, ctx.attempt, WORKER),
    )


_RETRY = RetryPolicy(max_attempts=2, backoff=FixedBackoff(0.0))


@task(durable=True, on_lost="retry", retry=_RETRY)
def work_retry(ctx: Any, n: int, pause: float = 0.0) -> int:
    _record(ctx)
    time.sleep(pause)
    return n


@task(durable=True, on_lost="fail", retry=_RETRY)
def work_fail(ctx: Any, n: int, pause: float = 0.0) -> int:
    _record(ctx)
    time.sleep(pause)
    return n


def register(controller: Any) -> None:
    controller.register_all(work_retry, work_fail)


def submit(url: str, count: int, num_buckets: int, pause: float) -> None:
    with Controller(store=open_store(url), owner="submitter", num_buckets=num_buckets) as controller:
        register(controller)  # 策略（重试次数、on_lost）取自登记的定义，和 CLI 的 submit --tasks 一样
        for index in range(count):
            name = "work_retry" if index % 2 == 0 else "work_fail"
            controller.enqueue(name, index, pause=pause, task_id=f"t{index:05d}", bucket_key=f"key-{index}")
    print("SUBMITTED", count, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "submit":
        submit(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
