"""09 常驻任务：启动、暂停、恢复、停止一个"永远跑下去"的 worker，以及停止请求的三种收尾方式。

演示并断言（全部在一个 Controller 里）：
* 启动 → 暂停（True：已确认挂起，仍占执行槽）→ 恢复 → 停止；
* 三种收尾，终态不同：
  1. 让 checkpoint() 抛 TaskCancelled（while True: ctx.checkpoint()）      → stopped，没有返回值；
  2. 看到停止请求后正常 return（"请收工"）                                   → succeeded，返回值保留
     （状态机允许 stopping → succeeded：停止是请求，不是判决）；
  3. 完全不调 checkpoint()                                                   → lost：优雅窗口用尽，
     线程无法强杀，只能如实报"结果未知"；
* stop 是终态：同一个 task_id 不能再提交（DuplicateTaskId），日常"先停一下"请用 pause / resume。

运行：python examples/09_long_running.py
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from chongming_task import (
    Controller,
    DuplicateTaskId,
    FailureKind,
    TaskCancelled,
    TaskContext,
    TaskStatus,
    render_table,
    task,
)

S = TaskStatus
release_stubborn = threading.Event()


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("条件在限定时间内没有成立")
        time.sleep(0.005)


@task
def abrupt_worker(ctx: TaskContext, source: str) -> None:
    """收尾方式 1：立刻中止。"""
    while True:
        ctx.checkpoint()  # 收到停止请求时在这里抛 TaskCancelled
        time.sleep(0.01)


@task
def graceful_worker(ctx: TaskContext, source: str) -> int:
    """收尾方式 2：把已经做完的结果留下来。"""
    processed = 0
    while not ctx.is_stop_requested:
        try:
            ctx.checkpoint()  # 暂停时在这里挂起；停止请求恰好落在这一刻时它会抛出……
        except TaskCancelled:
            break  # ……接住它，同样按"请收工"处理，不让结果丢失
        processed += 1
        ctx.progress(processed, unit="batch")
        time.sleep(0.01)
    ctx.log(f"收到停止请求，本次共处理 {processed} 批")
    return processed


@task
def stubborn_worker(ctx: TaskContext, source: str) -> None:
    """收尾方式 3：从不调 checkpoint()——停不掉。"""
    while not release_stubborn.is_set():
        time.sleep(0.01)


def main() -> None:
    controller = Controller(max_parallel=4, graceful_stop=0.3)
    controller.register_all(abrupt_worker, graceful_worker, stubborn_worker)

    controller.submit("graceful_worker", "kafka://orders", task_id="orders-worker")
    controller.submit("abrupt_worker", "kafka://clicks", task_id="clicks-worker")
    controller.submit("stubborn_worker", "kafka://legacy", task_id="legacy-worker")
    wait_until(lambda: controller.active_count == 3)
    wait_until(lambda: controller.get("orders-worker").progress is not None)  # type: ignore[union-attr]

    # 启动 → 暂停 → 恢复
    assert controller.pause("orders-worker", timeout=2) is True
    assert controller.get("orders-worker").status is S.PAUSED  # type: ignore[union-attr]
    assert controller.active_count == 3  # 暂停就地挂起：执行槽不释放
    done_at_pause = controller.get("orders-worker").progress.done  # type: ignore[union-attr]
    time.sleep(0.1)
    assert controller.get("orders-worker").progress.done == done_at_pause  # type: ignore[union-attr]
    assert controller.resume("orders-worker") is True
    wait_until(lambda: controller.get("orders-worker").progress.done > done_at_pause)  # type: ignore[union-attr]
    print(render_table(controller.list_tasks()))

    # 三种收尾
    for task_id in ("orders-worker", "clicks-worker", "legacy-worker"):
        assert controller.stop(task_id, reason="发布窗口") is True

    graceful = controller.wait("orders-worker", timeout=5)
    assert graceful.status is S.SUCCEEDED and isinstance(graceful.value, int) and graceful.value > 0
    orders_path = [
        t.to_status.value
        for t in next(r for r in controller.runs() if r.task_id == "orders-worker").transitions
    ]
    assert orders_path[-2:] == ["stopping", "succeeded"]
    print(f"orders-worker: succeeded，处理了 {graceful.value} 批")

    abrupt = controller.wait("clicks-worker", timeout=5)
    assert abrupt.status is S.STOPPED and abrupt.value is None
    assert abrupt.failure is not None and abrupt.failure.kind is FailureKind.CANCELLED
    print("clicks-worker: stopped")

    stubborn = controller.wait("legacy-worker", timeout=5)
    assert stubborn.status is S.LOST
    assert stubborn.failure is not None and stubborn.failure.kind is FailureKind.LOST
    assert stubborn.failure.retryable is True
    print("legacy-worker: lost（线程仍在后台运行）")
    release_stubborn.set()  # 真实场景里只能靠结束进程；这里放它走

    # stop 是终态：同一个 task_id 不能再提交
    try:
        controller.submit("graceful_worker", "kafka://orders", task_id="orders-worker")
    except DuplicateTaskId as exc:
        print("重新提交被拒绝：", exc)
    else:
        raise AssertionError("已存在的 task_id 应当被拒绝")
    run = controller.submit("graceful_worker", "kafka://orders", task_id="orders-worker-2")
    wait_until(lambda: run.status is S.RUNNING)

    controller.close(timeout=5)  # 停止一切并收尾
    assert run.status is S.SUCCEEDED  # graceful_worker 在收尾时把结果交了回来
    print("09_long_running: OK")


if __name__ == "__main__":
    main()
