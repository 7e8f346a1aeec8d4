"""CLI 持久任务测试用的任务模块（按模块名 cli_durable_tasks 导入）。"""

from __future__ import annotations

import sys
import time
from typing import Any

from chongming_task import task


@task(durable=True)
def add(ctx: Any, a: int, b: int = 0) -> int:
    """持久任务：返回 a + b。"""
    return a + b


@task(durable=True)
def spin_durable(ctx: Any) -> None:
    """持久任务：一直 checkpoint，直到被停止（→ stopped）。"""
    while True:
        ctx.checkpoint()
        time.sleep(0.01)


@task(durable=True)
def deaf_durable(ctx: Any) -> None:
    """持久任务：不 checkpoint、不看停止请求，睡满 60 秒（停不下来的任务）。"""
    time.sleep(60)


@task
def plain(ctx: Any) -> str:
    """普通任务（不落配方）。"""
    return "ok"


def register(controller: Any) -> None:
    controller.register_module(sys.modules[__name__])
