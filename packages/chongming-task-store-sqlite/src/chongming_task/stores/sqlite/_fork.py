"""fork 的代数：子进程里它加一，存储的各部分据此发现"我在 fork 出来的子进程里"。

为什么不每次比 ``os.getpid()``：连接池、写者队列与检查点计数每个写事务各查一次进程号，每次都是一次系统调用
（strace：每个任务约三次），而 fork 极少发生。``os.register_at_fork`` 的钩子在子进程里、fork 返回之前运行
（``os.fork`` 与 multiprocessing 的 fork 启动方式都走它），之后每次检查只是读一个整数属性。不经
``os.fork`` 的 fork（C 扩展直接调系统调用）不在保证之内——CPython 本身的锁在那种子进程里也不可靠。
"""

from __future__ import annotations

import os


class _Forks:
    generation = 0
    """本进程是第几代：每次 fork，子进程里加一（父进程不变）。"""


FORKS = _Forks()


def _in_child() -> None:
    FORKS.generation += 1


if hasattr(os, "register_at_fork"):  # Windows 没有 fork，也没有这个函数
    os.register_at_fork(after_in_child=_in_child)


__all__ = ["FORKS"]
