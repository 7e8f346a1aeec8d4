"""logs 命令测试用的任务模块（与 cli_test_tasks 分开：那边登记的任务名单被别的测试逐字断言）。"""

from __future__ import annotations

import time
from typing import Any

from chongming_task import task


@task
def narrate(ctx: Any, lines: int = 200, delay: float = 0.01) -> int:
    """记 lines 行编号日志，每行之间睡 delay 秒（logs --follow 的测试用）。"""
    for i in range(1, lines + 1):
        ctx.log(f"第 {i:03d} 行")
        time.sleep(delay)
    return lines


@task
def quiet(ctx: Any) -> int:
    return 0


def register(controller: Any) -> None:
    controller.register_all(narrate, quiet)
