"""主线程里的阻塞等待按短片等：Ctrl-C / SIGTERM 到达时立刻在等待处抛出，而不是等到超时或被通知。

为什么：Python 的信号处理函数只在主线程里、在两条字节码之间执行。进程收到的信号由内核交给**任意一个**没有
屏蔽它的线程；交给了别的线程（执行槽、组提交、事件交付……）时，C 层只记下"有信号待处理"，主线程若正阻塞在
``Event.wait`` / ``Condition.wait`` 里，那把锁不会被打断，要等通知或超时才醒、才轮到处理函数抛
``KeyboardInterrupt``。``wait_all()`` 没有超时时就是永远；命令行 ``run`` 收尾的 ``close()`` 要等满优雅窗口
（第二次 Ctrl-C "不再等"的承诺因此时灵时不灵）。按 ``MAIN_THREAD_WAIT_SLICE`` 秒一片地等，主线程每片醒一次，
待处理的信号最迟一片之后生效；等待的结果与语义不变（醒来只是再查一遍条件）。

只有主线程这样做：别的线程不执行信号处理函数，切片对它们只是白醒。
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

MAIN_THREAD_WAIT_SLICE = 0.1
"""主线程一次阻塞等待最长多少秒（信号最迟这么久之后生效；每秒多醒十次，代价可以忽略）。"""

_main_thread = threading.main_thread()


def wait_slice(remaining: float | None) -> float | None:
    """``Condition.wait`` 循环里这一次该等多久：主线程上不超过 ``MAIN_THREAD_WAIT_SLICE``，别的线程原样。"""
    if threading.current_thread() is not _main_thread:
        return remaining
    if remaining is None or remaining > MAIN_THREAD_WAIT_SLICE:
        return MAIN_THREAD_WAIT_SLICE
    return remaining


def wait_event(wait: Callable[[float | None], bool], timeout: float | None) -> bool:
    """``Event.wait(timeout)`` 的可被信号打断版本（``wait`` 就是那个绑定方法）：返回值相同——事件置位为真，
    等满 ``timeout`` 仍未置位为假。"""
    if threading.current_thread() is not _main_thread:
        return wait(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return wait(0)
        step = wait_slice(remaining)
        if wait(step):
            return True


def join_thread(thread: threading.Thread, timeout: float | None) -> None:
    """``thread.join(timeout)`` 的可被信号打断版本：``close()`` 等后台线程收尾时用。

    ``Thread.join`` 阻塞在线程状态锁上，和 ``Event.wait`` 一样不会被别的线程收到的信号打断；按片等的循环
    与 ``wait_event`` 是同一个（"等一片、线程已结束就算等到了"）。
    """

    def joined(step: float | None) -> bool:
        thread.join(step)
        return not thread.is_alive()

    wait_event(joined, timeout)


__all__ = ["MAIN_THREAD_WAIT_SLICE", "join_thread", "wait_event", "wait_slice"]
