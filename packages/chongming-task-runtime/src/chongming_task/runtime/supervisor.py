"""共享的看门狗：每个时钟一条线程、一个截止时间堆。

超时（start / per_attempt / idle）、优雅停止窗口、暂停窗口之外的各种"到点做事"、重试等待，
全都登记成这里的定时器。不给每个任务起一条监督线程：控制器要在 2 核上每秒推过几千个任务，
每个任务多一条线程就是多一次创建、一次调度、一次 join。

等待一律经由 ``clock.wait(event, timeout)``：注入 ``FakeClock`` 后，测试推进假时间就能在毫秒内
触发超时，而不必真的等。定时器回调在看门狗线程里执行，必须短（拿一下任务的锁、做一次迁移）。
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import weakref
from collections.abc import Callable
from typing import ClassVar

from chongming_task.clock import Clock

logger = logging.getLogger("chongming_task.runtime")

_IDLE_EXIT_SECONDS = 5.0
"""堆空了之后线程再（按真实时间）等这么久，仍没有新定时器就退出；下次有定时器时再起。"""


class Timer:
    """一个已登记的定时器。``cancel()`` 是惰性删除：到点时跳过，不在堆里做 O(n) 查找。"""

    __slots__ = ("_callback", "cancelled", "deadline")

    def __init__(self, deadline: float, callback: Callable[[], None]) -> None:
        self.deadline = deadline
        self._callback: Callable[[], None] | None = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
        self._callback = None  # 断开对任务的引用，被取消的定时器不延长任务的生命

    def _fire(self) -> None:
        callback = self._callback
        self._callback = None
        if callback is not None and not self.cancelled:
            callback()


class Watchdog:
    """按时钟共享的定时器线程。用 :meth:`for_clock` 取得实例。"""

    _instances: ClassVar[weakref.WeakKeyDictionary[Clock, Watchdog]] = weakref.WeakKeyDictionary()
    _instances_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, clock: Clock) -> None:
        self._clock_ref = weakref.ref(clock)
        self._heap: list[tuple[float, int, Timer]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition(threading.Lock())
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def for_clock(cls, clock: Clock) -> Watchdog:
        with cls._instances_lock:
            watchdog = cls._instances.get(clock)
            if watchdog is None:
                watchdog = cls(clock)
                cls._instances[clock] = watchdog
            return watchdog

    def schedule(self, delay: float, callback: Callable[[], None]) -> Timer:
        """``delay`` 秒（按本时钟）之后在看门狗线程里调用 ``callback``。"""
        clock = self._clock_ref()
        if clock is None:  # pragma: no cover - 时钟已被回收，说明没有任何任务还在用它
            raise RuntimeError("时钟已被回收")
        return self.schedule_at(clock.monotonic() + max(0.0, delay), callback)

    def schedule_at(self, deadline: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(deadline, callback)
        with self._cond:
            earliest = self._heap[0][0] if self._heap else None
            heapq.heappush(self._heap, (deadline, next(self._seq), timer))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="chongming-task-watchdog", daemon=True
                )
                self._thread.start()
            elif earliest is None or deadline < earliest:
                self._wake.set()
            self._cond.notify()
        return timer

    @property
    def pending(self) -> int:
        """堆里尚未到点、也未取消的定时器数（测试与诊断用）。"""
        with self._cond:
            return sum(1 for _, _, timer in self._heap if not timer.cancelled)

    def _loop(self) -> None:
        while True:
            clock = self._clock_ref()
            if clock is None:  # pragma: no cover
                return
            due: list[Timer] = []
            with self._cond:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                if not self._heap:
                    # 没有定时器：按真实时间等一会儿；仍然没有就退出线程，不让空闲的看门狗常驻。
                    self._cond.wait(_IDLE_EXIT_SECONDS)
                    while self._heap and self._heap[0][2].cancelled:
                        heapq.heappop(self._heap)
                    if not self._heap:
                        self._thread = None
                        return
                    continue
                now = clock.monotonic()
                while self._heap and self._heap[0][0] <= now:
                    timer = heapq.heappop(self._heap)[2]
                    if not timer.cancelled:
                        due.append(timer)
                timeout = None if due or not self._heap else self._heap[0][0] - now
                if not due:
                    self._wake.clear()
            for timer in due:
                try:
                    timer._fire()
                except Exception:  # 一个任务的回调出错不能拖垮所有任务的定时器
                    logger.exception("看门狗定时器回调出错")
            if timeout is not None:
                clock.wait(self._wake, timeout)
            del clock


__all__ = ["Timer", "Watchdog"]
