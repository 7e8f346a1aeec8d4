"""状态机的锁按需出生（issue 17，bench/README 第二十一轮 bl21）。

排队中的任务在开始之前谁也不加它的锁，于是状态机在第一次有人要加锁时才建一把、以一次槽写发布。这里守着
三件事：建出来的锁是唯一的（多个线程同时来也只发布一把），不给锁的状态机在要用之前确实不带锁，给了锁的
照旧用给的那把。
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from chongming_task.core import state_machine as sm
from chongming_task.core.records import TaskSnapshot
from chongming_task.core.state_machine import StateMachine


def test_racing_threads_all_get_the_one_lock_that_was_published(monkeypatch: pytest.MonkeyPatch) -> None:
    # 每个线程先在出生锁之外造好自己的那把（这里故意造得慢，让八个线程都读到"还没出生"、都去造），
    # 然后只有一把被发布：所有线程拿到的、之后再读到的，都是同一把。没有出生锁的"查空、写入"会让后写的
    # 覆盖先写的，先拿到锁的线程手里就是一把别人看不见的锁。
    real = sm._new_rlock

    def slow_rlock() -> Any:
        lock = real()
        time.sleep(0.01)
        return lock

    monkeypatch.setattr(sm, "_new_rlock", slow_rlock)
    for _ in range(5):
        machine = StateMachine.create("t-1", "job")
        barrier = threading.Barrier(8)
        seen: list[object] = []

        def take(m: StateMachine = machine, b: threading.Barrier = barrier, out: list[object] = seen) -> None:
            b.wait()
            lock = m.lock
            with lock:
                out.append(lock)

        threads = [threading.Thread(target=take) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert len(seen) == 8
        assert all(lock is machine.lock for lock in seen)


def test_a_machine_built_without_a_lock_has_none_until_someone_locks_it() -> None:
    machine = StateMachine.create("t-1", "job")
    calls: list[str] = []
    machine.add_owner_listener(calls, lambda owner, snapshot, record: owner.append(record.trigger))
    history = machine.packed_transitions()  # 写穿落库新任务时读它：元组，不加锁
    assert history == ()
    assert machine._lock is None  # 登记监听器、读紧凑历史都没有建锁
    machine.mark_queued()  # 第一次写：建锁
    lock = machine.lock
    assert lock is machine.lock
    assert len(calls) == 1  # 登记时还没有锁的监听器，照常收到建锁之后的这次迁移
    sibling = machine.sibling("t-2")
    assert sibling._lock is None and sibling.status.value == "queued"
    assert sibling.lock is not lock  # 每台状态机各自一把


def test_a_lock_given_at_construction_is_the_one_used() -> None:
    given = threading.RLock()
    machine = StateMachine.create("t-1", "job", lock=given)
    assert machine.lock is given
    snapshot = TaskSnapshot(task_id="t-2", name="job", created_at=machine.snapshot.created_at)
    assert StateMachine(snapshot, (), lock=given).lock is given
    assert machine.transitions == ()


def test_a_long_history_is_copied_under_the_lock() -> None:
    # 超过 PACKED_TUPLE_MAX 条之后历史是原地追加的列表：读它要持锁复制，交出去的仍是元组。
    machine = StateMachine.create("t-1", "job", max_attempts=100)
    machine.mark_queued()
    for _ in range(sm.PACKED_TUPLE_MAX):
        machine.mark_paused()
        machine.mark_queued()
    packed = machine.packed_transitions()
    assert packed.__class__ is tuple
    assert len(packed) == 1 + 2 * sm.PACKED_TUPLE_MAX
    assert [record[5] for record in packed] == list(range(1, len(packed) + 1))
