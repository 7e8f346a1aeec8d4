"""时钟：SystemClock 的基本承诺，FakeClock 的确定性等待与唤醒。

FakeClock 的用例都有真实时间的上限（join(timeout=...)），但不靠 sleep 凑时机：先用
wait_for_sleepers 确认被测线程已经睡下，再推进假时间。
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from chongming_task.clock import SYSTEM_CLOCK, Clock, SystemClock, utcnow
from chongming_task.errors import ConfigurationError
from chongming_task.testing import FakeClock

JOIN = 5.0  # 真实秒数：只作为挂死时的兜底，正常情况下远用不到


class Waiter(threading.Thread):
    """在后台线程里调用 clock 的某个阻塞方法，记下返回值与返回那一刻的假时间。"""

    def __init__(self, call: Any) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.result: Any = None
        self.done = threading.Event()

    def run(self) -> None:
        self.result = self.call()
        self.done.set()


# -- SystemClock ---------------------------------------------------------------------------------------


def test_system_clock_satisfies_the_protocol() -> None:
    assert isinstance(SYSTEM_CLOCK, Clock)
    assert isinstance(FakeClock(), Clock)
    now = SystemClock().now()
    assert now.tzinfo is not None and now.utcoffset() == timedelta(0)
    assert abs((utcnow() - now).total_seconds()) < 60
    first = SYSTEM_CLOCK.monotonic()
    assert SYSTEM_CLOCK.monotonic() >= first
    SYSTEM_CLOCK.sleep(0)
    SYSTEM_CLOCK.sleep(-1)  # 负数不睡，也不报错
    event = threading.Event()
    event.set()
    assert SYSTEM_CLOCK.wait(event, 10) is True
    assert SYSTEM_CLOCK.wait(threading.Event(), 0.001) is False
    assert repr(SYSTEM_CLOCK) == "SystemClock()"


# -- FakeClock: time only moves on advance ------------------------------------------------------------


def test_fake_clock_time_moves_only_on_advance() -> None:
    clock = FakeClock()
    start_wall, start_mono = clock.now(), clock.monotonic()
    assert start_wall == datetime(2026, 1, 1, tzinfo=UTC)
    assert clock.now() == start_wall and clock.monotonic() == start_mono
    clock.advance(1.5)
    assert clock.now() - start_wall == timedelta(seconds=1.5)
    assert clock.monotonic() - start_mono == 1.5
    assert clock.elapsed == 1.5
    clock.advance(0)
    assert clock.elapsed == 1.5


def test_fake_clock_custom_start() -> None:
    start = datetime(2030, 5, 6, 7, 8, 9, tzinfo=timezone(timedelta(hours=8)))
    clock = FakeClock(start, monotonic_start=5.0)
    assert clock.now() == start and clock.monotonic() == 5.0
    assert "2030-05-06" in repr(clock)
    with pytest.raises(ConfigurationError, match="时区"):
        FakeClock(datetime(2026, 1, 1))


@pytest.mark.parametrize("bad", [-1, -0.001, float("nan"), float("inf"), "1", None, True])
def test_advance_refuses_negative_and_non_finite(bad: Any) -> None:
    clock = FakeClock()
    with pytest.raises(ConfigurationError):
        clock.advance(bad)
    assert clock.elapsed == 0


def test_advance_negative_message() -> None:
    with pytest.raises(ConfigurationError, match="时间不能倒流"):
        FakeClock().advance(-5)


# -- FakeClock: waiting --------------------------------------------------------------------------------


def test_sleep_zero_and_expired_wait_return_immediately() -> None:
    clock = FakeClock()
    clock.sleep(0)
    assert clock.wait(threading.Event(), 0) is False
    assert clock.wait(threading.Event(), -3) is False
    event = threading.Event()
    event.set()
    assert clock.wait(event, 0) is True
    assert clock.wait(event, None) is True
    assert clock.sleepers == 0


def test_advance_wakes_a_sleeping_thread_exactly_at_its_deadline() -> None:
    clock = FakeClock()
    waiter = Waiter(lambda: (clock.sleep(10), clock.elapsed)[1])
    waiter.start()
    clock.wait_for_sleepers(1)
    clock.advance(9.999)
    # 还没到期：线程必须仍在睡（给它一点真实时间去"错误地"醒来）。
    assert not waiter.done.wait(0.05)
    assert clock.sleepers == 1
    clock.advance(0.001)
    assert waiter.done.wait(JOIN)
    waiter.join(JOIN)
    assert waiter.result == pytest.approx(10.0)
    assert clock.sleepers == 0


def test_advance_wakes_a_thread_blocked_in_wait_with_false() -> None:
    clock = FakeClock()
    event = threading.Event()
    waiter = Waiter(lambda: clock.wait(event, 30))
    waiter.start()
    clock.wait_for_sleepers(1)
    clock.advance(31)
    assert waiter.done.wait(JOIN)
    assert waiter.result is False


def test_wait_returns_true_as_soon_as_the_event_is_set() -> None:
    clock = FakeClock()
    event = threading.Event()
    waiter = Waiter(lambda: clock.wait(event, 3600))
    waiter.start()
    clock.wait_for_sleepers(1)
    event.set()  # 别的线程置位，没有推进任何假时间
    assert waiter.done.wait(JOIN)
    assert waiter.result is True
    assert clock.elapsed == 0


def test_wait_without_timeout_blocks_until_event_regardless_of_advance() -> None:
    clock = FakeClock()
    event = threading.Event()
    waiter = Waiter(lambda: clock.wait(event, None))
    waiter.start()
    clock.wait_for_sleepers(1)
    clock.advance(10**6)
    assert not waiter.done.wait(0.05)
    event.set()
    assert waiter.done.wait(JOIN)
    assert waiter.result is True


def test_one_advance_wakes_every_due_sleeper_and_only_those() -> None:
    clock = FakeClock()
    waiters = {delay: Waiter(lambda d=delay: clock.sleep(d)) for delay in (1, 2, 5)}
    for waiter in waiters.values():
        waiter.start()
    clock.wait_for_sleepers(3)
    clock.advance(2)
    assert waiters[1].done.wait(JOIN)
    assert waiters[2].done.wait(JOIN)
    assert not waiters[5].done.wait(0.05)
    clock.wait_for_sleepers(1)
    assert clock.sleepers == 1
    clock.advance(3)
    assert waiters[5].done.wait(JOIN)


def test_wait_for_sleepers_times_out_with_a_clear_message() -> None:
    clock = FakeClock()
    with pytest.raises(TimeoutError, match="FakeClock"):
        clock.wait_for_sleepers(1, timeout=0.05)


def test_deadline_is_relative_to_when_the_wait_started() -> None:
    clock = FakeClock()
    clock.advance(100)
    waiter = Waiter(lambda: clock.wait(threading.Event(), 5))
    waiter.start()
    clock.wait_for_sleepers(1)
    clock.advance(4)
    assert not waiter.done.wait(0.05)
    clock.advance(1)
    assert waiter.done.wait(JOIN)
    assert waiter.result is False
