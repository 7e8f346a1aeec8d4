"""test_guide_deviations.py 里进程执行器用的模块级任务函数（子进程按名字 import 它们）。"""

from __future__ import annotations

import time

from chongming_task import TaskContext


def checkpoint_loop(ctx: TaskContext) -> None:
    """每毫秒 checkpoint 一次，永不主动结束（停止时在检查点里抛 TaskCancelled）。"""
    while True:
        ctx.checkpoint()
        time.sleep(0.001)
