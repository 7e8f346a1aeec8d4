"""集成测试用的工作节点：在独立的 OS 进程里跑一个持久化 Controller。

用法：python node_worker.py <store-url> <owner> <task_id> <task> [--lease-ttl S] [--owned a-b]
      [--bucket-key K]

启动后提交一个任务，打印 ``READY`` 行，然后等它落终态，最后打印 ``FINAL <status> <value-json>``。
测试进程从另一端（同一个 SQLite 文件 / 同一个 Postgres 库）查询与控制它。
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from chongming_task import Controller, open_store


def resident(ctx: Any) -> int:
    """常驻任务：每轮 checkpoint、报进度；收到停止请求后优雅收尾并返回已处理批数。"""
    processed = 0
    while not ctx.is_stop_requested:
        ctx.checkpoint()
        processed += 1
        ctx.progress(processed, unit="batch")
        time.sleep(0.01)
    return processed


def stubborn(ctx: Any) -> int:
    """只 checkpoint，从不主动收尾：停止请求 → TaskCancelled → stopped。"""
    while True:
        ctx.checkpoint()
        time.sleep(0.01)


def parse_buckets(text: str) -> list[int]:
    result: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        result.extend(range(int(low), int(high or low) + 1))
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("owner")
    parser.add_argument("task_id")
    parser.add_argument("task", choices=["resident", "stubborn"])
    parser.add_argument("--lease-ttl", type=float, default=30.0)
    parser.add_argument("--owned")
    parser.add_argument("--bucket-key")
    parser.add_argument("--num-buckets", type=int, default=64)
    args = parser.parse_args()
    store = open_store(args.store)
    controller = Controller(
        store=store,
        owner=args.owner,
        lease_ttl=args.lease_ttl,
        owned_buckets=parse_buckets(args.owned) if args.owned else None,
        num_buckets=args.num_buckets,
        command_poll_interval=0.05,
        side_channel_interval=0.2,
    )
    controller.register("resident", resident)
    controller.register("stubborn", stubborn)
    run = controller.submit(args.task, task_id=args.task_id, bucket_key=args.bucket_key)
    print("READY", run.snapshot.pid or "", flush=True)
    outcome = run.wait(timeout=120)
    print("FINAL", outcome.status.value, json.dumps(outcome.value), flush=True)
    controller.close(close_store=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
