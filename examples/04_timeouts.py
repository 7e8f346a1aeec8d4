"""04 超时：三档超时（start / per_attempt / idle），用 FakeClock 在毫秒内跑完。

演示并断言：
* 超时不是状态：到期后请求停止，结果记成 failed + failure.kind=timeout_*（默认可重试）；
* per_attempt 限制单次尝试总时长，可以与重试配合（超时的那次之后再试一次）；
* idle 衡量的是 checkpoint() 的间隔：只报进度、不调 checkpoint() 照样算静默；
* 暂停期间不判超时：暂停了"很久"也不会被判 idle；
* start 从提交算起：排队拿不到执行槽的任务被 start 超时拦下，任务体从未执行（这一种落 stopped，
  failure.kind=timeout_start——排队中的任务在转移表里没有到 failed 的边）。

FakeClock 的用法：把它注入 TaskRun / Controller（clock=...），先 ``clock.wait_for_sleepers()`` 确认
看门狗已经睡在假时钟上，再 ``clock.advance(秒)`` 推进时间——不用真的等 10 分钟。

运行：python examples/04_timeouts.py
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from chongming_task import (
    Controller,
    FailureKind,
    FixedBackoff,
    RetryPolicy,
    TaskContext,
    TaskStatus,
    Timeout,
)
from chongming_task.run import TaskRun
from chongming_task.testing import FakeClock

S = TaskStatus


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("条件在限定时间内没有成立")
        time.sleep(0.002)


def busy(ctx: TaskContext) -> str:
    """一直在干活、一直在 checkpoint()：心跳一直新鲜。"""
    while True:
        ctx.checkpoint()
        time.sleep(0.002)


def slow_first_attempt(ctx: TaskContext) -> int:
    if ctx.attempt == 1:
        busy(ctx)  # 第一次尝试永远跑不完，只能被 per_attempt 超时拦下
    return ctx.attempt


def progress_only(ctx: TaskContext) -> None:
    """只报进度、不调 checkpoint()——进度不刷新心跳，所以这是"静默"。只在收到停止请求后才响应。"""
    n = 0
    while not ctx.is_stop_requested:
        n += 1
        ctx.progress(n)
        time.sleep(0.002)
    ctx.checkpoint()


def main() -> None:
    # 1) per_attempt：第一次尝试超过 600 秒 → timeout_attempt，可重试；第二次成功
    clock = FakeClock()
    run = TaskRun(
        slow_first_attempt,
        clock=clock,
        timeout=Timeout(per_attempt=600),
        retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0)),
    )
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    clock.wait_for_sleepers(1)
    clock.advance(599)
    time.sleep(0.05)
    assert run.status is S.RUNNING  # 599 秒：还没到
    clock.advance(1)
    outcome = run.wait(timeout=5)
    retry_wait = next(t for t in run.transitions if t.to_status is S.RETRY_WAIT)
    print("per_attempt:", " -> ".join(t.to_status.value for t in run.transitions))
    assert outcome.ok and outcome.value == 2
    assert retry_wait.from_status is S.RUNNING  # 没有"超时状态"，也没经过 stopping
    assert "timeout" not in {s.value for s in S}

    # 2) idle：只报进度不调 checkpoint() → timeout_idle（默认可重试；max_attempts=1 所以直接 failed）
    clock = FakeClock()
    run = TaskRun(progress_only, clock=clock, timeout=Timeout(idle=60))
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    clock.wait_for_sleepers(1)
    clock.advance(60)
    outcome = run.wait(timeout=5)
    assert outcome.status is S.FAILED
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.TIMEOUT_IDLE
    assert outcome.failure.retryable is True
    print("idle:", outcome.failure.message)

    # 3) 暂停期间不判超时：暂停"一小时"之后恢复，任务照常在跑
    clock = FakeClock()
    run = TaskRun(busy, clock=clock, timeout=Timeout(per_attempt=600, idle=60))
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    paused: list[bool] = []
    pauser = threading.Thread(target=lambda: paused.append(run.pause(timeout=5)))
    pauser.start()
    # pause() 在假时钟上等待确认窗口；任务在检查点挂起后立刻得到确认
    wait_until(lambda: run.status is S.PAUSED)
    pauser.join(5)
    assert paused == [True]
    clock.advance(3600)  # 一小时：远超 idle 与 per_attempt
    time.sleep(0.05)
    assert run.status is S.PAUSED
    run.resume()
    time.sleep(0.05)
    assert run.status is S.RUNNING  # 没被判超时
    run.stop()
    assert run.wait(timeout=5).status is S.STOPPED

    # 4) start：排队 30 秒还没拿到执行槽 → 任务体从未执行，记 timeout_start
    clock = FakeClock()
    controller = Controller(max_parallel=1, clock=clock)
    controller.register("busy", busy)
    controller.register("report", busy, timeout=Timeout(start=30))
    controller.submit("busy", task_id="blocker")  # 占住唯一的执行槽
    controller.submit("report", task_id="late")
    wait_until(
        lambda: controller.get("blocker") is not None and controller.get("blocker").status is S.RUNNING
    )
    clock.advance(31)
    outcome = controller.wait("late", timeout=5)
    print("start:", outcome.status.value, outcome.failure.kind.value if outcome.failure else None)
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.TIMEOUT_START
    assert outcome.snapshot.attempt == 0  # 一次都没执行过
    # 排队中的任务没有到 failed 的边（见转移表），所以它落的是 stopped，由 runtime:timeout_start 触发——
    # 看 failure.kind 与 trigger 区分它和人工停止（人工停止的 failure.kind 是 cancelled）。
    assert outcome.status is S.STOPPED
    late_run = next(r for r in controller.runs() if r.task_id == "late")
    assert late_run.transitions[-1].trigger == "runtime:timeout_start"
    controller.close(timeout=5)

    print("04_timeouts: OK")


if __name__ == "__main__":
    main()
