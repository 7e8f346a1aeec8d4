"""写事务提交之前的回调：组提交（runtime/group_commit.py）在写者线程上登记，存储在 COMMIT 之前调用。

只给声明了 ``TaskStore.calls_before_commit`` 的存储用：它在本线程上的每个写事务里、发出 COMMIT 之前调用一次
:func:`before_commit`（撞锁重试时可能调用不止一次）。本线程上没有登记回调时它什么也不做。

为什么有这一步（SQLite，逐个 submit 的形状）：提交线程当写者时，一批里捎带的执行槽的 starting / 终态写完了，
执行槽要醒来接着跑——但提交线程此刻正持着 GIL，接下来一两百微秒都是 Python（返回 submit、下一个 submit 的
准备），执行槽醒来只能在 GIL 上再睡一次，等提交线程下一次放开 GIL：那是下一个事务的 ``BEGIN``，只放开
二三十微秒，执行槽却一口气跑完自己一两百微秒的 Python，提交线程在 BEGIN 后面干等。把这一下叫醒挪到下一个
事务的 COMMIT 之前，执行槽醒来正赶上提交线程在 COMMIT 里写 WAL（不持 GIL 的最长一段），两边重叠，执行槽也
少在 GIL 上睡一次。回调必须很快、不抛异常、不碰存储（它在写事务里、持着存储的写者队列）。
"""

from __future__ import annotations

import threading
from collections.abc import Callable

_local = threading.local()


def before_commit() -> None:
    """（存储在写事务的 COMMIT 之前调用）执行本线程上登记的回调；没有就什么也不做。"""
    hook = getattr(_local, "hook", None)
    if hook is not None:
        hook()


def install(hook: Callable[[], None] | None) -> Callable[[], None] | None:
    """在本线程上登记回调（None：撤销），返回原来登记的那个（调用方用完放回去）。"""
    previous: Callable[[], None] | None = getattr(_local, "hook", None)
    _local.hook = hook
    return previous


__all__ = ["before_commit", "install"]
