"""确定性时钟：时间只在测试调用 ``advance()`` 时前进。"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

from chongming_task.core.numbers import check_seconds
from chongming_task.errors import ConfigurationError

_DEFAULT_START = datetime(2026, 1, 1, tzinfo=UTC)

# 等待者既要被 advance() 唤醒，也要被别的线程 set() 的 Event 唤醒；后者不会通知本时钟的条件
# 变量，所以等待者以这个真实间隔复查 Event。它只影响"Event 被置位"被察觉的速度，不影响假时间。
_EVENT_POLL_SECONDS = 0.002


class FakeClock:
    """测试用时钟。``advance(seconds)`` 推进时间并唤醒所有到期的等待者。

    ``sleep`` / ``wait`` 会阻塞到假时间走到期限（或 Event 被置位），因此必须由另一个线程
    （通常是测试本身）调用 ``advance``。``wait_for_sleepers(n)`` 让测试先确认被测线程已经
    睡下，再推进时间，避免竞态。
    """

    def __init__(self, start: datetime = _DEFAULT_START, *, monotonic_start: float = 1000.0) -> None:
        if start.utcoffset() is None:
            raise ConfigurationError(
                "FakeClock 的 start 必须带时区，例如 datetime(2026, 1, 1, tzinfo=timezone.utc)"
            )
        self._start_wall = start
        self._monotonic = monotonic_start
        self._offset = 0.0
        self._cond = threading.Condition()
        self._sleepers = 0

    def monotonic(self) -> float:
        return self._monotonic + self._offset

    def now(self) -> datetime:
        return self._start_wall + timedelta(seconds=self._offset)

    @property
    def elapsed(self) -> float:
        """自创建以来推进过的总秒数。"""
        return self._offset

    @property
    def sleepers(self) -> int:
        """当前阻塞在本时钟上的线程数。"""
        with self._cond:
            return self._sleepers

    def advance(self, seconds: float) -> None:
        value: object = seconds
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise ConfigurationError("时间不能倒流：advance() 的参数必须 >= 0")
        check_seconds("advance() 的参数", value, low=0.0, low_open=False)
        with self._cond:
            self._offset += seconds
            self._cond.notify_all()

    def sleep(self, seconds: float) -> None:
        self.wait(threading.Event(), seconds)

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        with self._cond:
            deadline = None if timeout is None else self._offset + max(0.0, timeout)
            self._sleepers += 1
            self._cond.notify_all()
            try:
                while not event.is_set():
                    if deadline is not None and self._offset >= deadline:
                        return False
                    self._cond.wait(_EVENT_POLL_SECONDS)
                return True
            finally:
                self._sleepers -= 1
                self._cond.notify_all()

    def wait_for_sleepers(self, count: int = 1, *, timeout: float = 5.0) -> None:
        """阻塞到至少 ``count`` 个线程睡在本时钟上（真实时间最多等 ``timeout`` 秒）。"""
        limit = time.monotonic() + timeout
        with self._cond:
            while self._sleepers < count:
                remaining = limit - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"等了 {timeout} 秒，睡在 FakeClock 上的线程只有 {self._sleepers} 个（期望 {count}）"
                    )
                self._cond.wait(min(remaining, 0.05))

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now().isoformat()})"


__all__ = ["FakeClock"]
