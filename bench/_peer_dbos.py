"""对照组：DBOS 持久队列（bench_sqlite.py / bench_postgres.py 在子进程里运行本脚本）。

用法：python bench/_peer_dbos.py <system_database_url> <n>
系统库用 SQLite 文件（sqlite:///...）或一次性的 Postgres 数据库。队列 worker_concurrency=2、
空工作流，结果照常保存在 DBOS 的系统库里；等全部 N 个句柄 get_result() 返回才停表。
DBOS 的队列靠轮询取活，这里把轮询间隔调到它允许的很小值（1 ms），给对照组最快的配置。
计时前先等队列线程起来并跑完一个预热工作流（DBOS 每秒才扫描一次新登记的队列）。
标准输出最后一行是速率（工作流/秒）。
"""

from __future__ import annotations

import sys
import threading
import time

from dbos import DBOS

POLL = 0.001


def main() -> None:
    url, n = sys.argv[1], int(sys.argv[2])
    DBOS(config={"name": "ct-bench", "system_database_url": url, "log_level": "WARNING"})

    @DBOS.workflow()
    def noop() -> None:
        return None

    DBOS.launch()
    try:
        queue = DBOS.register_queue("ct_bench", worker_concurrency=2, polling_interval_sec=POLL)
        deadline = time.monotonic() + 30
        while not any(t.name == "queue-worker-ct_bench" for t in threading.enumerate()):
            if time.monotonic() > deadline:
                raise SystemExit("DBOS 的队列线程 30 秒内没有启动")
            time.sleep(0.01)
        queue.enqueue(noop).get_result(polling_interval_sec=POLL)
        started = time.perf_counter()
        handles = [queue.enqueue(noop) for _ in range(n)]
        for handle in handles:
            handle.get_result(polling_interval_sec=POLL)
        rate = n / (time.perf_counter() - started)
    finally:
        DBOS.destroy()
    print(f"{rate:.1f}", flush=True)


if __name__ == "__main__":
    main()
