"""命令行控制台（docs/cli.md）用的任务模块。

CLI 只运行模块 ``register(controller)`` 登记过的名字（用户指南 §8.1）：把这个文件所在目录放进
PYTHONPATH，然后

    chongming-task --db tasks.db tasks --tasks cli_tasks
    chongming-task --db tasks.db run --tasks cli_tasks count --arg n=3 --task-id demo-1
    chongming-task --db tasks.db --num-buckets 64 --owned-buckets 0-15 \\
        run --tasks cli_tasks worker --arg source=kafka://orders --task-id orders-worker --bucket-key orders

直接 ``python examples/cli_tasks.py`` 会在临时 SQLite 文件上把 count 跑一遍并以 0 退出。
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from chongming_task import Controller, RetryPolicy, SqliteTaskStore, Timeout, task
from chongming_task.policies import FixedBackoff


@task(tags={"demo"})
def count(ctx: Any, n: int = 3, delay: float = 0.2) -> int:
    """数到 n，每步报一次进度。"""
    for step in range(1, n + 1):
        ctx.checkpoint()
        time.sleep(delay)
        ctx.progress(step, total=n, unit="step")
    return n


@task(tags={"io"})
def worker(ctx: Any, source: str) -> int:
    """常驻消费者：一直处理到收到停止请求，然后交出已处理的批数。"""
    processed = 0
    while not ctx.is_stop_requested:  # 优雅收尾：停止请求到达后正常返回 → succeeded，返回值保留
        ctx.checkpoint()  # 不调它就停不掉
        processed += 1
        ctx.progress(processed, unit="batch", message=source)
        time.sleep(0.05)
    ctx.log(f"收到停止请求，本次共处理 {processed} 批")
    return processed


@task
def hold(ctx: Any, seconds: float = 3600) -> None:
    """占着执行槽等待，只响应停止（演示 Ctrl-C → stopped）。"""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ctx.checkpoint()  # 停止请求在这里变成 TaskCancelled → stopped
        time.sleep(0.05)


@task(retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0.1)), timeout=Timeout(per_attempt=30))
def flaky(ctx: Any, fail_times: int = 5) -> str:
    """前 fail_times 次尝试失败（演示重试与退出码 3）。"""
    if ctx.attempt <= fail_times:
        raise RuntimeError(f"第 {ctx.attempt} 次尝试故意失败")
    return "ok"


def register(controller: Controller) -> None:
    """CLI 调用的登记入口：只有这里登记的名字能被 run。"""
    controller.register_all(count, worker, hold, flaky)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        controller = Controller(store=SqliteTaskStore(Path(tmp) / "tasks.db"), owner="example")
        register(controller)
        outcome = controller.submit("count", n=3, delay=0.01, task_id="demo-1").wait(timeout=10)
        controller.close(close_store=True)
        print(outcome.status.value, outcome.value)
        return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
