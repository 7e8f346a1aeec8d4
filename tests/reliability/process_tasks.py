"""ProcessExecutor 测试用的任务，放在按名字可导入的模块里（测试模块以 importlib 模式加载，子进程找不到）。

conftest 把本目录放进 sys.path，spawn / forkserver 子进程沿用父进程的 sys.path，能 ``import process_tasks``。
"""

from __future__ import annotations

import time
from typing import Any

from chongming_task import TaskContext


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def deep_result(ctx: TaskContext, depth: int = 2000) -> Any:
    """返回 ``depth`` 层嵌套的列表（issue 22.4）。"""
    return nested(depth)


def beating(ctx: TaskContext, seconds: float) -> int:
    """健康的任务：每 10 ms 调一次 checkpoint()，跑满 ``seconds`` 秒。"""
    deadline = time.monotonic() + seconds
    beats = 0
    while time.monotonic() < deadline:
        ctx.checkpoint()
        beats += 1
        time.sleep(0.01)
    return beats


def forever(ctx: TaskContext) -> None:
    """永不结束、不响应停止的任务（监督进程被杀之后它该跟着退出，issue 22.3）。"""
    while True:
        time.sleep(0.05)


def gil_hog(ctx: TaskContext) -> int:
    """一直握着 GIL 的 C 循环：子进程里的监听线程得不到运行机会，只有 PR_SET_PDEATHSIG 能让它跟着退出。"""
    return sum(range(10**15))
