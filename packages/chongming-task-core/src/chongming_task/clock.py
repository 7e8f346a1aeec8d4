"""时钟：单调时间（判超时）、墙上时间（写进快照）、可被唤醒的等待。

运行时里所有"等一会儿"都经由 ``Clock.wait``，从不直接 ``time.sleep``：这样测试注入
``FakeClock`` 后，超时、退避与租约都能在毫秒内确定性地验证。
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """运行时依赖的全部时间能力。"""

    def monotonic(self) -> float:
        """单调秒数，只用于计算间隔。"""
        ...

    def now(self) -> datetime:
        """带时区（UTC）的墙上时间，写进快照与迁移记录。"""
        ...

    def sleep(self, seconds: float) -> None:
        """睡 ``seconds`` 秒（按本时钟计）。"""
        ...

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        """等到 ``event`` 被置位或超时（按本时钟计）；返回 event 是否已置位。"""
        ...


class SystemClock:
    """真实时钟。

    ``monotonic`` 与 ``now`` 直接是 C 实现的可调用对象（``time.monotonic``、``partial(datetime.now, UTC)``；
    两者都不是描述符，经实例取到的就是它们本身）：每次读时钟不多进一层 Python 帧，结果与写成方法相同。每个
    任务的状态迁移、提交与结算要读六七次墙上时间（issue 17）。
    """

    monotonic: Callable[[], float] = time.monotonic
    now: Callable[[], datetime] = partial(datetime.now, UTC)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        return event.wait(timeout)

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()
"""进程内共享的真实时钟实例（无状态，可共享）。"""


def utcnow() -> datetime:
    return datetime.now(UTC)


__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock", "utcnow"]
