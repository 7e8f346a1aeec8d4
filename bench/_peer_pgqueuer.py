"""对照组：PgQueuer（bench_postgres.py 在子进程里运行本脚本）。

用法：python bench/_peer_pgqueuer.py <postgres_url> <n>
在给定的（一次性）数据库里装好 PgQueuer 的表，逐个 enqueue N 个空作业，再用一个
QueueManager 以 max_concurrent_tasks=2（batch_size=1，它要求上限 ≥ 2 × batch_size）跑到队列空
（drain 模式）。完成记录照常写进 pgqueuer_log。驱动用 asyncpg——PgQueuer 文档首推的驱动；
psycopg 异步驱动在同一连接上既 LISTEN 又查询，实测会卡住不动。
标准输出最后一行是速率（作业/秒）。
"""

from __future__ import annotations

import asyncio
import sys
import time

import asyncpg
from pgqueuer.models import Job
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode


async def main(url: str, n: int) -> float:
    conn = await asyncpg.connect(url)
    try:
        qm = QueueManager(Queries.from_asyncpg_connection(conn))
        await qm.queries.install()

        @qm.entrypoint("ct_bench_noop")
        async def noop(job: Job) -> None:
            return None

        started = time.perf_counter()
        for _ in range(n):
            await qm.queries.enqueue("ct_bench_noop", None)
        await qm.run(mode=QueueExecutionMode.drain, batch_size=1, max_concurrent_tasks=2)
        rate = n / (time.perf_counter() - started)
        done = await conn.fetchval("SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")
        if done != n:
            raise SystemExit(f"PgQueuer 只记下 {done}/{n} 个成功作业")
        return rate
    finally:
        await conn.close()


if __name__ == "__main__":
    print(f"{asyncio.run(main(sys.argv[1], int(sys.argv[2]))):.1f}", flush=True)
