"""SlotScheduler：额度账本与"扫描而不是取队首"的就绪队列（纯数据结构，确定性）。"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from chongming_task.runtime.scheduler import SlotScheduler


def test_global_slots_limit_and_fifo_within_priority() -> None:
    s = SlotScheduler(max_parallel=2)
    for i in range(5):
        s.enqueue(f"t{i}", priority=0, bucket=None, tags=())
    assert s.take_runnable() == ["t0", "t1"]
    assert s.take_runnable() == []
    assert (s.active_count, s.queued_count) == (2, 3)
    s.release("t0")
    assert s.take_runnable() == ["t2"]


def test_higher_priority_first_then_fifo() -> None:
    s = SlotScheduler(max_parallel=1)
    s.enqueue("low-1", priority=0, bucket=None, tags=())
    s.enqueue("high-1", priority=10, bucket=None, tags=())
    s.enqueue("low-2", priority=0, bucket=None, tags=())
    s.enqueue("high-2", priority=10, bucket=None, tags=())
    order = []
    for _ in range(4):
        started = s.take_runnable()
        order.extend(started)
        s.release(started[0])
    assert order == ["high-1", "high-2", "low-1", "low-2"]


def test_full_bucket_does_not_block_runnable_task_behind_it() -> None:
    s = SlotScheduler(max_parallel=10, per_bucket=1)
    s.enqueue("a0", priority=0, bucket=1, tags=())
    s.enqueue("a1", priority=0, bucket=1, tags=())  # 被桶 1 挡住
    s.enqueue("b0", priority=0, bucket=2, tags=())  # 排在后面，但属于空闲的桶 2
    assert s.take_runnable() == ["a0", "b0"]
    assert s.active_in_bucket(1) == 1
    s.release("a0")
    assert s.take_runnable() == ["a1"]


def test_named_limits_need_room_in_every_limited_tag() -> None:
    s = SlotScheduler(max_parallel=10, tag_limits={"db": 1, "gpu": 1})
    s.enqueue("db-1", priority=0, bucket=None, tags={"db"})
    s.enqueue("both", priority=0, bucket=None, tags={"db", "gpu"})
    s.enqueue("gpu-1", priority=0, bucket=None, tags={"gpu"})
    s.enqueue("free", priority=0, bucket=None, tags={"io"})  # 未列入 limits 的标签不受限
    assert s.take_runnable() == ["db-1", "gpu-1", "free"]
    s.release("gpu-1")
    assert s.take_runnable() == []  # both 还缺 db
    s.release("db-1")
    assert s.take_runnable() == ["both"]
    assert s.usage(("tag", "db")) == 1 and s.usage(("tag", "gpu")) == 1


def test_discarded_entries_never_start_and_leave_no_count() -> None:
    s = SlotScheduler(max_parallel=1)
    s.enqueue("a", priority=0, bucket=None, tags=())
    s.enqueue("b", priority=0, bucket=None, tags=())
    assert s.discard("a")
    assert s.queued_count == 1
    assert s.take_runnable() == ["b"]
    assert not s.release("a")


def test_requeue_after_discard_uses_fresh_entry() -> None:
    s = SlotScheduler(max_parallel=1, per_bucket=1)
    s.enqueue("x", priority=0, bucket=3, tags=())
    s.enqueue("y", priority=0, bucket=3, tags=())
    assert s.take_runnable() == ["x"]
    assert s.take_runnable() == []  # y 挂在桶 3 上
    s.discard("y")
    s.enqueue("y", priority=5, bucket=3, tags=())
    s.release("x")
    assert s.take_runnable() == ["y"]
    assert s.take_runnable() == []


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_workload_never_exceeds_any_limit_and_everything_runs(data: st.DataObject) -> None:
    max_parallel = data.draw(st.integers(1, 4))
    per_bucket = data.draw(st.one_of(st.none(), st.integers(1, 2)))
    limits = {"db": data.draw(st.integers(1, 2)), "gpu": 1}
    s = SlotScheduler(max_parallel=max_parallel, tag_limits=limits, per_bucket=per_bucket)
    n = data.draw(st.integers(1, 40))
    specs = {}
    for i in range(n):
        tags = data.draw(st.sets(st.sampled_from(["db", "gpu", "io"])))
        bucket = data.draw(st.one_of(st.none(), st.integers(0, 3)))
        priority = data.draw(st.integers(-1, 1))
        specs[f"t{i}"] = (bucket, tags)
        s.enqueue(f"t{i}", priority=priority, bucket=bucket, tags=tags)
    rng = random.Random(data.draw(st.integers(0, 10_000)))
    finished: set[str] = set()
    active: set[str] = set()
    while len(finished) < n:
        active.update(s.take_runnable())
        assert len(active) <= max_parallel
        for tag, cap in limits.items():
            assert sum(1 for t in active if tag in specs[t][1]) <= cap
        if per_bucket is not None:
            for b in range(4):
                assert sum(1 for t in active if specs[t][0] == b) <= per_bucket
                assert s.active_in_bucket(b) == sum(1 for t in active if specs[t][0] == b)
        assert active, "有任务排队却没有任何可运行的：调度器卡死"
        done = rng.choice(sorted(active))
        active.discard(done)
        assert s.release(done)
        finished.add(done)
    assert s.active_count == 0 and s.queued_count == 0


def test_dispatch_cost_does_not_depend_on_queue_length() -> None:
    """积压很多被满桶挡住的任务时，每次调度只做对数级的工作（不再逐个扫描整条队列）。"""
    s = SlotScheduler(max_parallel=100, per_bucket=1)
    for i in range(5000):
        s.enqueue(f"blocked-{i}", priority=0, bucket=0, tags=())
    assert s.take_runnable() == ["blocked-0"]
    # 之后每轮：释放一个、启动一个；被挡住的条目已挂到桶 0 的等待堆上，不再回到就绪堆被反复扫描。
    for i in range(1, 50):
        s.enqueue(f"free-{i}", priority=0, bucket=1 + i, tags=())
        started = s.take_runnable()
        assert started == [f"free-{i}"]
        assert len(s._ready) == 0  # 白盒：挡住的条目不在就绪堆里
