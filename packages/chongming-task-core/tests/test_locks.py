"""``YieldingLock``：互斥、接口语义同 ``threading.Lock``，拿不到时先让出 GIL 再阻塞（core/locks.py）。"""

from __future__ import annotations

import threading
import time

import pytest

from chongming_task.core import locks
from chongming_task.core.locks import SPINS, YieldingLock


def test_mutual_exclusion_under_threads() -> None:
    """四个线程各加一万次锁改同一个计数：读改写之间让出 GIL，锁不互斥就会丢更新。"""
    lock = YieldingLock()
    counter = [0]

    def bump() -> None:
        for _ in range(10_000):
            with lock:
                value = counter[0]
                if value % 97 == 0:
                    time.sleep(0)  # 读改写之间让出 GIL：别的线程此时来抢锁
                counter[0] = value + 1

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert counter[0] == 40_000
    assert not lock.locked()


def test_nonblocking_and_locked() -> None:
    lock = YieldingLock()
    assert lock.acquire(blocking=False)
    assert lock.locked()
    assert not lock.acquire(blocking=False)
    lock.release()
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        lock.release()  # 和 threading.Lock 一样：没加锁就放锁是错


def test_timeout_returns_false_and_keeps_the_holder() -> None:
    lock = YieldingLock()
    lock.acquire()
    started = time.monotonic()
    assert lock.acquire(timeout=0.05) is False
    assert 0.05 <= time.monotonic() - started < 5
    assert lock.acquire(timeout=0) is False
    assert lock.locked()
    lock.release()
    assert lock.acquire(timeout=0.05) is True
    lock.release()


def test_contended_acquire_yields_the_gil_before_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    """拿不到锁时先 ``sleep(0)``（让持有者跑完临界区）：持有者在第三次让出时放锁，加锁就在那之后拿到，
    不进内核等待。普通锁在这里会一直阻塞（同一线程持有、没有别人放）。"""
    lock = YieldingLock()
    lock.acquire()
    yields: list[float] = []

    def fake_sleep(seconds: float) -> None:
        yields.append(seconds)
        if len(yields) == 3:
            lock.release()  # 这一刻"持有者"跑完了临界区

    monkeypatch.setattr(locks, "_sleep", fake_sleep)
    got: list[bool] = []
    worker = threading.Thread(target=lambda: got.append(lock.acquire()), daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert got == [True]
    assert yields == [0, 0, 0]
    lock.release()


def test_with_statement_yields_too(monkeypatch: pytest.MonkeyPatch) -> None:
    lock = YieldingLock()
    lock.acquire()
    yields: list[float] = []

    def fake_sleep(seconds: float) -> None:
        yields.append(seconds)
        lock.release()

    def enter() -> None:
        with lock:
            inside.append(lock.locked())

    monkeypatch.setattr(locks, "_sleep", fake_sleep)
    inside: list[bool] = []
    worker = threading.Thread(target=enter, daemon=True)
    worker.start()
    worker.join(timeout=10)
    assert inside == [True]
    assert yields == [0]
    assert not lock.locked()


def test_after_spins_it_blocks_until_released(monkeypatch: pytest.MonkeyPatch) -> None:
    """让出 SPINS 次仍拿不到就在内核里等（不是一直转）；之后一放锁就拿到。"""
    lock = YieldingLock()
    lock.acquire()
    yields = [0]
    monkeypatch.setattr(locks, "_sleep", lambda seconds: yields.__setitem__(0, yields[0] + 1))
    got: list[bool] = []
    worker = threading.Thread(target=lambda: got.append(lock.acquire()), daemon=True)
    worker.start()
    deadline = time.monotonic() + 10
    while yields[0] < SPINS and time.monotonic() < deadline:
        time.sleep(0.001)
    worker.join(timeout=0.05)
    assert worker.is_alive() and got == []  # 转满了，在等
    assert yields[0] == SPINS
    lock.release()
    worker.join(timeout=10)
    assert got == [True]
    lock.release()


def test_works_under_a_condition() -> None:
    """``threading.Condition(YieldingLock())``：wait 放锁、被 notify 后重新拿锁。"""
    lock = YieldingLock()
    cond = threading.Condition(lock)
    box: list[int] = []

    def producer() -> None:
        with cond:
            box.append(1)
            cond.notify_all()

    with cond:
        threading.Thread(target=producer, daemon=True).start()
        assert cond.wait_for(lambda: box, timeout=10)
        assert lock.locked()
    assert not lock.locked()
    with pytest.raises(RuntimeError):
        cond.notify()  # 没拿锁就 notify：Condition 用 acquire(False) 看出锁不在手里
