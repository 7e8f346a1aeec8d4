"""每个在管任务常驻多少个被循环 GC 追踪的对象（issue 17）。

为什么测它：全量回收每次都要把所有被追踪的对象扫一遍，积压十万个排队任务、或内存存储里留着成千上万个
已结束的任务时，GC 是每任务 CPU 里最大的一块，而它与每个任务常驻的对象个数成正比。这里数的是确定的个数
（``gc.get_objects()`` 的差，除以任务数），不是时间：谁给每个任务多挂一个容器、监听器或副本，这里就会失败。
测得的值见 bench/README.md；上限留了半个对象的余量（后台线程在测量期间可能造出零星几个对象）。
"""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from chongming_task import Controller, InMemoryTaskStore, Submit, TaskRun
from chongming_task.runtime.taskrun import TASKRUN_LAZY_FIELDS
from chongming_task.stores.sqlite import SqliteTaskStore

N = 2000


def noop(ctx: Any) -> None:
    return None


def blocker(ctx: Any, gate: threading.Event) -> None:
    gate.wait(60)


def _tracked() -> int:
    # 两遍：一个只装元组的元组，要等它装的元组先不被追踪之后（可能是同一遍里更晚、或下一遍）才会不被追踪——
    # 程序照常运行时，这发生在它进入最老一代之前的那次年轻代回收里。
    gc.collect()
    gc.collect()
    return len(gc.get_objects())


def _per_queued_task(controller: Controller, submit: Callable[[], Sequence[TaskRun]]) -> float:
    """一个闸门任务占住唯一的槽，``submit()`` 交上来的 N 个任务全在排队：每个常驻多少个被追踪的对象。"""
    controller.register("noop", noop)
    controller.register("blocker", blocker)
    gate = threading.Event()
    try:
        controller.submit("blocker", gate)
        controller.submit("noop")  # 先把惰性建起来的共用对象建好
        before = _tracked()
        runs = submit()
        after = _tracked()
        assert len(runs) == N and all(run.status.value == "queued" for run in runs)
        del runs
        return (after - before) / N
    finally:
        gate.set()
        controller.close(close_store=True)


def test_a_queued_task_keeps_at_most_four_tracked_objects() -> None:
    # TaskRun、状态机、它的锁与快照。快照的实例字典只装 str / int / None / datetime（status 与 tags 在槽里，
    # 见 records._SnapshotSlots），GC 从不追踪它。历史里的记录是紧凑的元组（records.PackedTransition），
    # 装它们的也是元组，GC 都不追踪；读 transitions 时才现造 Transition。状态机上的监听器是
    # (TaskRun, 函数) 两个槽位（add_owner_listener），不再是每个任务一个绑定方法。调度器的堆条目是只含
    # int / str 的元组，GC 不追踪。
    controller = Controller(max_parallel=1)
    per_task = _per_queued_task(
        controller, lambda: controller.submit_many([Submit("noop") for _ in range(N)])
    )
    assert per_task <= 4.5, f"每个排队任务常驻 {per_task:.2f} 个被追踪的对象"


def test_a_queued_task_with_the_memory_store_keeps_at_most_five_tracked_objects() -> None:
    # bench_controller 的积压那一行：上面的四个，加上存储里的行。行的历史就是状态机那个只装紧凑元组的
    # 元组，GC 不追踪；写穿的每任务记账平常只是一个 int，只有结果未知 / 被隔离 / 推迟写 running 时才是一个
    # _TaskState。
    controller = Controller(max_parallel=1, store=InMemoryTaskStore())
    per_task = _per_queued_task(controller, lambda: [controller.submit("noop") for _ in range(N)])
    assert per_task <= 5.5, f"每个排队任务常驻 {per_task:.2f} 个被追踪的对象"


def test_a_queued_task_with_the_memory_store_promotes_at_most_five_objects() -> None:
    # 上一条数的是全量回收之后还被追踪的；这一条数的是在那之前——年轻代回收之后仍被追踪、会晋升进最老一代的。
    # 两者的差是"被追踪、却只有全量回收才放掉"的字典：装过一个还被追踪的对象（枚举成员、frozenset、刚造的
    # 元组）的 dict 一直被追踪，直到某次全量回收复查它。全量回收的次数与每次的时间都跟着晋升的个数涨（积压
    # 5 万个任务时每任务约 20 µs，bench/README 第二十轮 bl20），所以这里也要是五个：快照的实例字典不装
    # status / tags（它们在槽里），存储行的历史是元组而不是 dict。
    controller = Controller(max_parallel=1, store=InMemoryTaskStore())
    controller.register("noop", noop)
    controller.register("blocker", blocker)
    gate = threading.Event()
    enabled = gc.isenabled()
    try:
        controller.submit("blocker", gate)
        controller.submit("noop")  # 先把惰性建起来的共用对象建好
        gc.collect()
        gc.collect(1)
        gc.disable()  # 只在测量期间：不让一次自动的全量回收替我们放掉那些字典
        before = len(gc.get_objects())
        runs = [controller.submit("noop") for _ in range(N)]
        # 同程序照常运行时一样先第 0 代、再第 1 代（第 1 代的幸存者才进最老一代）：只装元组的元组，要等它装的
        # 元组先不被追踪之后才会不被追踪（同 _tracked 的说明），第二遍还在年轻代里时就轮到它；dict 留着。
        gc.collect(0)
        gc.collect(1)
        after = len(gc.get_objects())
        assert len(runs) == N and all(run.status.value == "queued" for run in runs)
        per_task = (after - before) / N
        assert per_task <= 5.5, f"每个排队任务有 {per_task:.2f} 个熬过年轻代回收、仍被追踪的对象"
    finally:
        if enabled:
            gc.enable()
        gate.set()
        controller.close(close_store=True)


def test_a_finished_task_in_the_memory_store_keeps_at_most_five_tracked_objects() -> None:
    # 控制器里：TaskRun、状态机、锁与快照；存储里：行。两边的四条迁移记录都是紧凑元组，
    # 状态机装它们的元组与存储行的历史元组只装它们，GC 都不追踪；快照的实例字典只装原子值（结果是 None），
    # 也不被追踪；写穿的每任务记账是一个 int。
    # 终态那次 save 沿用存储自己的心跳时不再复制一份快照（读时才合成）。
    store = InMemoryTaskStore()
    controller = Controller(max_parallel=2, store=store)
    controller.register("noop", noop)
    try:
        for _ in range(50):  # 先把惰性建起来的共用对象（看门狗、缓存）建好
            controller.submit("noop")
        controller.wait_all()
        time.sleep(0.1)
        before = _tracked()
        for _ in range(N):
            controller.submit("noop")
        controller.wait_all()
        after = _tracked()
        per_task = (after - before) / N
        assert per_task <= 5.5, f"每个已结束的任务常驻 {per_task:.2f} 个被追踪的对象"
        # 合成出来的读数与存储的语义一致：终态、带着存储自己的租约与心跳（save 不改写旁路字段）。
        finished = store.query()
        assert len(finished) == N + 50
        assert all(snapshot.status.value == "succeeded" for snapshot in finished)
        # 紧凑存放的历史读回来与状态机里的一致（两边各自现造 Transition，按值相等）。
        run = controller.runs()[-1]
        history = store.history(run.task_id)
        assert history == list(run.transitions)
        assert [(r.from_status.value, r.to_status.value, r.version) for r in history] == [
            ("pending", "queued", 1),
            ("queued", "starting", 2),
            ("starting", "running", 3),
            ("running", "succeeded", 4),
        ]
        assert all(r.task_id == run.task_id and r.at.tzinfo is not None for r in history)
    finally:
        controller.close(close_store=True)


def test_a_finished_attempt_leaves_no_cyclic_garbage() -> None:
    # 一次跑完的尝试（线程载体、上下文、规格、事件转发、控制锁、日志缓冲、_Attempt）在载体线程放手之后由
    # 引用计数释放，不留给循环 GC：这些对象若只能靠循环 GC 回收，它们会活过年轻代、被晋升，每任务多出七个
    # 对象的扫描与更频繁的全量回收（issue 17）。回收期间把 GC 关掉、用 DEBUG_SAVEALL 数出不可达的对象。
    controller = Controller(max_parallel=2, store=InMemoryTaskStore())
    controller.register("noop", noop)
    was_enabled = gc.isenabled()
    try:
        for _ in range(20):
            controller.submit("noop")
        controller.wait_all()
        gc.collect()
        gc.disable()
        for _ in range(200):
            controller.submit("noop")
        outcomes = controller.wait_all()
        assert all(outcome.status.value == "succeeded" for outcome in outcomes)
        time.sleep(0.2)  # 让载体线程走完结算之后的收尾（放开最后一次尝试的引用）
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            leaked = sorted({type(obj).__qualname__ for obj in gc.garbage})
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert not [
            name for name in leaked if name in {"ThreadAttempt", "TaskContext", "_Attempt", "_Events"}
        ], f"跑完的尝试留下了只能靠循环 GC 回收的对象：{leaked}"
    finally:
        if was_enabled:
            gc.enable()
        controller.close(close_store=True)


_TASK_TYPES = frozenset({"TaskRun", "StateMachine", "TaskSnapshot"})


def _cyclic_task_garbage(task_ids: set[str]) -> list[str]:
    """一次全量回收找到的不可达对象里（DEBUG_SAVEALL：找到的都留在 gc.garbage 里，数完清掉），属于
    ``task_ids`` 的句柄、状态机与快照的类型名。

    为什么只数这些：全套测试里，同一进程中别的用例留下的控制器（后台线程还在收尾）可能恰好在这段时间里
    产生自己的循环垃圾；那不是这里要证明的事，也不该让这条用例时好时坏。"""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        found = []
        for obj in gc.garbage:
            name = type(obj).__qualname__
            if name in _TASK_TYPES:
                try:
                    task_id = obj.task_id
                except Exception:  # 半拆的对象：读不出 task_id 就照样算上（宁可报错，不漏）
                    task_id = None
                if task_id is None or task_id in task_ids:
                    found.append(name)
        return found
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_a_closed_controller_and_its_finished_tasks_are_freed_without_the_cycle_collector() -> None:
    # 关掉的控制器、它的句柄、状态机、锁、快照、内存存储里的行……调用方丢掉引用之后全部由引用计数释放：
    # 原来句柄 ↔ 状态机（监听器）、句柄 → 钩子 → 控制器 → 句柄表、控制器 → 存储链接 → 控制器的回调是几个环，
    # 每一轮关掉的控制器连同它的全部任务都要等全量回收（sq17：每 5,000 个任务约 2.5 万个对象，issue 17）。
    # 留在手里的那个句柄照常可读：状态、结果、历史、wait()。
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for store in (InMemoryTaskStore(), None):
            controller = Controller(max_parallel=2, store=store)
            controller.register("noop", noop)
            for _ in range(200):
                controller.submit("noop")
            controller.wait_all()
            kept = controller.runs()[0]
            ids = {run.task_id for run in controller.runs()}
            freed = weakref.ref(controller)
            controller.close()
            del controller
            time.sleep(0.1)  # 载体线程放开最后一次尝试；空闲的载体线程不引用它跑过的任务（gc13）
            # 只认本用例的控制器与任务：全套测试里别的用例留下的控制器（后台线程还在收尾）可能恰好在这段时间里
            # 产生自己的循环垃圾（bl21 在一次完整运行里见过一个 SQLite 控制器），那不是这里要证明的事。控制器
            # 在环里时，循环 GC 关着，弱引用就一直活着；它的任务按 task_id 数（同 _cyclic_task_garbage）。
            assert freed() is None, f"关掉的控制器没有被引用计数释放（还在某个环里，store={store}）"
            leaked = _cyclic_task_garbage(ids)
            assert not leaked, (
                f"关掉的控制器留下了只能靠循环 GC 回收的对象（store={store}）：{sorted(set(leaked))}"
            )
            assert kept.status.value == "succeeded" and kept.done
            assert kept.wait(timeout=1).ok and kept.outcome is not None and kept.outcome.ok
            assert [r.to_status.value for r in kept.transitions] == [
                "queued",
                "starting",
                "running",
                "succeeded",
            ]
            assert not kept.stop() and not kept.pause(timeout=0.1)  # 终态：什么也不改
            if store is not None:
                stored = store.get(kept.task_id)
                assert stored is not None and stored.status.value == "succeeded"
                assert store.history(kept.task_id) == list(kept.transitions)
                store.close()
    finally:
        if was_enabled:
            gc.enable()


def test_a_closed_sqlite_controller_and_its_store_are_freed_without_the_cycle_collector(
    tmp_path: Path,
) -> None:
    # 组提交（SQLite 的写穿走它）不在自己身上存一个引用自己的绑定方法：那样组提交与它引用的存储（连同连接）
    # 成了一个环，关掉的控制器丢下的存储要等一次全量回收才关掉文件。循环 GC 关着，两个弱引用都该当场失效。
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        store = SqliteTaskStore(str(tmp_path / "freed.db"))
        controller = Controller(max_parallel=2, store=store)
        controller.register("noop", noop)
        for _ in range(50):
            controller.submit("noop")
        assert all(outcome.ok for outcome in controller.wait_all(timeout=30))
        freed = weakref.ref(controller), weakref.ref(store)
        controller.close(close_store=True)
        del controller, store
        time.sleep(0.1)  # 载体线程放开最后一次尝试
        assert [ref() for ref in freed] == [None, None], "关掉的控制器或它的 SQLite 存储还在某个环里"
    finally:
        if was_enabled:
            gc.enable()


def test_a_handle_dropped_by_keep_finished_is_freed_by_reference_counting() -> None:
    # keep_finished 把最旧的已落地句柄清出内存：没人再引用它时当场释放（循环 GC 关着也一样），不再是一个
    # 等全量回收的 句柄 ↔ 状态机 的环。
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    controller = Controller(max_parallel=2, store=InMemoryTaskStore(), keep_finished=10)
    controller.register("noop", noop)
    try:
        runs = [controller.submit("noop") for _ in range(100)]
        controller.wait_all()
        deadline = time.monotonic() + 10
        while all(controller.local_run(run.task_id) for run in runs) and time.monotonic() < deadline:
            time.sleep(0.01)  # 清理由后台循环在锁外做
        # 清出的是最早落地的那些（落地的先后不一定是提交的先后）
        dropped = [run for run in runs if controller.local_run(run.task_id) is None]
        assert dropped, "keep_finished 没有把最旧的句柄清出内存"
        assert all(run.status.value == "succeeded" and run.outcome is not None for run in dropped)  # 照常可读
        handles = [weakref.ref(run) for run in dropped]
        ids = {run.task_id for run in runs}
        del runs, dropped
        time.sleep(0.1)
        alive = [ref for ref in handles if ref() is not None]
        assert not alive, f"{len(alive)} / {len(handles)} 个清出内存的句柄没有被引用计数释放（还在某个环里）"
        leaked = _cyclic_task_garbage(ids)
        assert not leaked, f"清出内存的任务留下了只能靠循环 GC 回收的对象：{sorted(set(leaked))}"
    finally:
        if was_enabled:
            gc.enable()
        controller.close(close_store=True)


_FAN_OUT_FIRST = """
import gc, sys, threading
from chongming_task import Controller, InMemoryTaskStore, Submit

def noop(ctx):
    return None

def blocker(ctx, gate):
    gate.wait(60)

# 进程里最先造出来的一批句柄全在排队（一上来 submit_many 一大批、槽位只有一个），它们一个也没开始就关掉。
first = Controller(max_parallel=1)
first.register("noop", noop)
first.register("blocker", blocker)
gate = threading.Event()
first.submit("blocker", gate)
first.submit_many([Submit("noop") for _ in range(50)])
gate.set()
first.close()

controller = Controller(max_parallel=2, store=InMemoryTaskStore())
controller.register("noop", noop)
for _ in range(50):
    controller.submit("noop")
controller.wait_all()
gc.collect(); gc.collect()
before = sum(1 for o in gc.get_objects() if type(o) is dict)
for _ in range(1000):
    controller.submit("noop")
controller.wait_all()
gc.collect(); gc.collect()
after = sum(1 for o in gc.get_objects() if type(o) is dict)
print((after - before) / 1000)
controller.close()
"""


def test_tasks_keep_no_extra_dict_after_the_process_began_with_a_fan_out() -> None:
    # 每个已结束的任务只有快照的实例字典这一个 dict。TaskRun 的按需字段若在进程里第一次被写时已放不进实例
    # 共用的属性键表（先造了一大批句柄、一个都还没开始），此后每个任务都会另建一个真的 __dict__（实测 2.0）。
    # 共用键表是每个进程一份的类级状态：在新解释器里跑，才不受本进程里先跑过的测试影响。
    done = subprocess.run(
        [sys.executable, "-c", _FAN_OUT_FIRST], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    per_task = float(done.stdout.strip())
    assert per_task <= 1.1, f"每个已结束的任务有 {per_task:.2f} 个 dict"


def test_every_lazy_taskrun_field_is_reserved_at_import() -> None:
    # 类体里带初值的按需字段都要列进 TASKRUN_LAZY_FIELDS：新加一个却忘了列，上面那种进程里它又会让每个
    # 任务多一个字典。
    lazy = {
        name
        for name, value in vars(TaskRun).items()
        if not name.startswith("__")
        and not callable(value)
        and not isinstance(value, (property, staticmethod, classmethod))
    }
    assert lazy == set(TASKRUN_LAZY_FIELDS)
