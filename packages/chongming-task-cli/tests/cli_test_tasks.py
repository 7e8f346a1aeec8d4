"""CLI 测试用的任务模块（测试把本目录放进 PYTHONPATH / sys.path，按模块名 cli_test_tasks 导入）。"""

from __future__ import annotations

import time
from typing import Any

from chongming_task import RetryPolicy, Timeout, task
from chongming_task.policies import FixedBackoff


@task(tags={"demo"})
def count(ctx: Any, n: int = 3, delay: float = 0.01) -> int:
    """数到 n。"""
    for step in range(1, n + 1):
        ctx.checkpoint()
        time.sleep(delay)
        ctx.progress(step, total=n, unit="step", message=f"第 {step} 步")
    return n


@task
def resident(ctx: Any) -> int:
    """常驻：收到停止请求后优雅收尾，返回已处理批数（→ succeeded）。"""
    processed = 0
    while not ctx.is_stop_requested:
        ctx.checkpoint()
        processed += 1
        ctx.progress(processed, unit="batch")
        time.sleep(0.01)
    ctx.log(f"共处理 {processed} 批")
    return processed


@task
def spin(ctx: Any) -> None:
    """只 checkpoint、从不主动收尾：停止请求 → TaskCancelled → stopped。"""
    while True:
        ctx.checkpoint()
        time.sleep(0.01)


@task
def deaf(ctx: Any, seconds: float = 30) -> None:
    """从不 checkpoint：停不掉（优雅窗口用尽后只能报 lost）。"""
    time.sleep(seconds)


@task(retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0.01)), timeout=Timeout(per_attempt=30, idle=10))
def boom(ctx: Any) -> None:
    """总是失败。"""
    ctx.warning("马上要失败了")
    raise ValueError("故意失败")


@task(name="echo", description="原样返回参数")
def echo_args(ctx: Any, **kwargs: Any) -> dict[str, Any]:
    return dict(kwargs)


@task
def needs(ctx: Any, source: str, limit: int = 1) -> str:
    """带必需参数。"""
    return f"{source}:{limit}"


def register(controller: Any) -> None:
    controller.register_all(count, resident, spin, deaf, boom, echo_args, needs)
