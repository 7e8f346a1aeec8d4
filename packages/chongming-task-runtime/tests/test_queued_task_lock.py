"""排队中的任务不带锁，第一次有人要加锁时才建（issue 17，bench/README 第二十一轮 bl21）。

建锁可能同时来自三处：派发它的线程（开始）、别的线程的 stop / pause / resume、写穿。这里让它们真的
撞在一起：闸门一开，两个执行槽开始消化积压，同时四个线程对同一批排队任务乱序地停止、暂停、恢复。
每个任务的锁只能有一把：否则两个线程各持一把"它的锁"同时写状态机，历史会断（版本重号、起点对不上上一条
的终点）或与存储里的不一致。结束后逐个核对：都落了终态、历史经 ``StateMachine`` 的构造检查（连续、首尾
相接）、存储里的历史与状态机的一致、TaskRun 存下的锁就是状态机的锁。
"""

from __future__ import annotations

import random
import threading
from typing import Any

from chongming_task import Controller, InMemoryTaskStore
from chongming_task.core.state_machine import StateMachine

N = 400


def noop(ctx: Any) -> None:
    return None


def blocker(ctx: Any, gate: threading.Event) -> None:
    gate.wait(60)


def test_queued_tasks_locked_first_from_many_threads_keep_one_lock_each() -> None:
    store = InMemoryTaskStore()
    controller = Controller(max_parallel=2, store=store)
    controller.register("noop", noop)
    controller.register("blocker", blocker)
    gate = threading.Event()
    try:
        gates = [controller.submit("blocker", gate) for _ in range(2)]
        runs = [controller.submit("noop") for _ in range(N)]
        # 排队中：谁也没加过它的锁（第一个是这一形状的头一个，经 mark_queued 入队时已建锁；其余照模板复制）
        assert all(run.machine._lock is None for run in runs[1:])
        ids = [run.task_id for run in runs]
        barrier = threading.Barrier(5)

        def meddle(seed: int) -> None:
            rng = random.Random(seed)
            order = ids[:]
            rng.shuffle(order)
            barrier.wait()
            for task_id in order:
                action = rng.randrange(4)
                if action == 0:
                    controller.stop(task_id, reason="测试")
                elif action == 1:
                    controller.pause(task_id, timeout=0)
                else:
                    controller.resume(task_id)

        threads = [threading.Thread(target=meddle, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        barrier.wait()
        gate.set()
        for thread in threads:
            thread.join(60)
        for run in runs:  # 还停在 paused 的放回队列，让每个任务都能落地
            controller.resume(run.task_id)
        controller.wait_all(timeout=60)
        for run in runs + gates:
            assert run.done
            lock = run.machine.lock
            assert run._lock is None or run._lock is lock
            history = run.transitions
            StateMachine(run.snapshot, history)  # 历史连续、首尾相接、与快照一致，否则抛错
            assert store.history(run.task_id) == list(history)
            assert store.get(run.task_id).status is run.status  # type: ignore[union-attr]
        statuses = {run.status.value for run in runs}
        assert statuses <= {"succeeded", "stopped"}
    finally:
        gate.set()
        controller.close(close_store=True)
