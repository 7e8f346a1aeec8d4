"""make demo：在一个 SQLite 文件上跑一遍主流程。

场景：夜间 ETL 管道（抽取 → 三路转换 → 装载 → 审计）加一个常驻同步 worker。
1. 本进程作为工作节点提交它们，边跑边打印实时任务表；
2. 另起一个 OS 进程作为"运维控制台"，通过同一个 SQLite 文件暂停、恢复、停止 worker；
3. 最后从文件里读回任务表与 worker 的完整状态历史。

运行：python examples/demo.py [数据库文件，默认 demo.db]
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chongming_task import (
    AggregationPolicy,
    Controller,
    JoinMode,
    Pipeline,
    SqliteTaskStore,
    TaskStatus,
    render_table,
)


def extract(ctx: Any, day: str) -> dict[str, Any]:
    """抽取一天的订单。"""
    for part in range(1, 6):
        ctx.checkpoint()
        ctx.progress(part, total=5, unit="分区")
        time.sleep(0.05)
    return {"day": day, "rows": 300}


def transform(ctx: Any, shard: int) -> int:
    """按分片转换。"""
    rows = int(ctx.input("extract", {}).get("rows", 0)) // 3
    for done in range(0, rows + 1, 20):
        ctx.checkpoint()
        ctx.progress(done, total=rows, unit="行")
        time.sleep(0.01)
    return rows + shard


def load(ctx: Any) -> int:
    """装载到数仓。"""
    ctx.checkpoint()
    return sum(ctx.upstream.values())


def audit(ctx: Any) -> list[str]:
    """不论成败都要跑的审计。"""
    return sorted(ctx.upstream)


def worker(ctx: Any, source: str) -> int:
    """常驻同步 worker：收到停止请求后优雅收尾，返回已处理批数。"""
    processed = 0
    while not ctx.is_stop_requested:
        ctx.checkpoint()
        processed += 1
        ctx.progress(processed, unit="batch")
        time.sleep(0.02)
    ctx.log(f"收到停止请求，本次共处理 {processed} 批")
    return processed


def console(db: str) -> int:
    """第二个进程：只查询与控制，不持有任何任务。"""
    ops = Controller(store=SqliteTaskStore(db), owner="ops-console")

    def wait_status(status: TaskStatus) -> None:
        deadline = time.monotonic() + 10
        while (snap := ops.get("orders-worker")) is None or snap.status is not status:
            if time.monotonic() > deadline:
                raise SystemExit(f"等不到 orders-worker 进入 {status.value}")
            time.sleep(0.05)

    wait_status(TaskStatus.RUNNING)
    print(f"[控制台 pid={__import__('os').getpid()}] 看到的任务：")
    print(render_table(ops.list_tasks()))
    confirmed = ops.pause("orders-worker")
    print(f"[控制台] pause → {confirmed}（跨进程没有回执，False 表示“未确认”，接着轮询状态）")
    wait_status(TaskStatus.PAUSED)
    print("[控制台] 轮询到 orders-worker 已 paused")
    print(f"[控制台] resume → {ops.resume('orders-worker')}（请求已受理）")
    wait_status(TaskStatus.RUNNING)
    print(f"[控制台] stop → {ops.stop('orders-worker', reason='发布窗口')}（请求已受理）")
    ops.close(close_store=True)
    return 0


def main(db: str) -> int:
    for suffix in ("", "-wal", "-shm"):
        Path(db + suffix).unlink(missing_ok=True)
    store = SqliteTaskStore(db)
    node = Controller(store=store, max_parallel=3, owner="demo-node", command_poll_interval=0.05)
    for fn in (extract, transform, load, audit, worker):
        node.register(fn.__name__, fn)

    pipeline = Pipeline("nightly-etl", aggregation=AggregationPolicy.all_settled())
    fetched = pipeline.node("extract", "2026-11-30", node_id="extract")
    shards = [pipeline.node("transform", i, node_id=f"shard{i}", depends_on=[fetched]) for i in range(3)]
    loaded = pipeline.node("load", node_id="load", depends_on=shards)
    pipeline.node("audit", node_id="audit", depends_on=[loaded], join=JoinMode.ALL_SETTLED)
    etl = node.submit_pipeline(pipeline)
    node.submit("worker", "kafka://orders", task_id="orders-worker", label="订单同步")

    print("== 实时任务表（本进程，工作节点）==")
    for _ in range(3):
        time.sleep(0.25)
        print(render_table(node.list_tasks()))
        print()
    etl_outcome = etl.wait(timeout=30)
    loaded_rows = etl_outcome.nodes["load"].value
    print(f"== 管道 {etl.pipeline_id} 结束：{etl_outcome.status.value}，装载 {loaded_rows} 行 ==\n")

    print("== 另一个进程（运维控制台）通过同一个 SQLite 文件控制 worker ==")
    subprocess.run([sys.executable, __file__, "--console", db], check=True)
    outcome = node.wait("orders-worker", timeout=30)
    print(f"\n== worker 落终态：{outcome.status.value}，返回值（已处理批数）= {outcome.value} ==\n")
    node.close(close_store=True)

    reader = SqliteTaskStore(db)
    print(f"== 从 {db} 读回的任务表 ==")
    print(render_table(reader.query()))
    print("\n== orders-worker 的状态历史 ==")
    for record in reader.history("orders-worker"):
        print(
            f"v{record.version:<2} {record.from_status.value:>8} -> {record.to_status.value:<9}"
            f" {record.trigger:<24} {record.actor or '-':<12} {record.reason or ''}"
        )
    reader.close()
    return 0 if outcome.ok and etl_outcome.ok else 1


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--console":
        sys.exit(console(sys.argv[2]))
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "demo.db"))
