"""进程执行器测试用的模块级任务函数（子进程按名字 import 它们）。"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any

from chongming_task import TaskContext, task


@task
def add(ctx: TaskContext, a: int, b: int = 0) -> dict[str, Any]:
    """两数相加，并报告自己的 pid。"""
    return {"sum": a + b, "pid": os.getpid()}


def cooperative_loop(ctx: TaskContext, interval: float = 0.001) -> str:
    """每 interval 秒 checkpoint 一次，永不主动结束。"""
    while True:
        ctx.checkpoint()
        time.sleep(interval)


def graceful_worker(ctx: TaskContext) -> int:
    """§4.5 第二行：看到停止请求后正常 return，返回已处理的批数。"""
    processed = 0
    while not ctx.is_stop_requested:
        ctx.checkpoint()
        processed += 1
        ctx.progress(processed, unit="batch")
        time.sleep(0.002)
    ctx.log(f"收到停止请求，本次共处理 {processed} 批")
    return processed


def stubborn(ctx: TaskContext, seconds: float = 60.0) -> str:
    """完全不调 checkpoint()。"""
    time.sleep(seconds)
    return "finished anyway"


def abort_now(ctx: TaskContext) -> None:
    os.abort()


def segfault(ctx: TaskContext) -> None:
    ctypes.string_at(0)


def exit_code(ctx: TaskContext, code: int) -> None:
    os._exit(code)


def raise_value_error(ctx: TaskContext) -> None:
    raise ValueError("坏数据：第 3 行")


def return_set(ctx: TaskContext) -> Any:
    return {1, 2, 3}


def report(ctx: TaskContext) -> str:
    ctx.progress(3, total=10, unit="rows", message="正在处理")
    ctx.log("开始处理")
    ctx.warning("分区为空，跳过")
    return ctx.input("up", "no-upstream")


def chatty(ctx: TaskContext, lines: int = 5, fail_first: bool = False) -> int:
    """记 lines 行编号日志（任务日志持久化的测试用）；fail_first 时第一次尝试记完后失败。"""
    for i in range(1, lines + 1):
        ctx.log(f"第 {i} 行（尝试 {ctx.attempt}）")
    if fail_first and ctx.attempt == 1:
        raise RuntimeError("第一次故意失败")
    return lines
