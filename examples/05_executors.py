"""05 执行器：内联、线程（默认）、进程，各自能做什么、不能做什么。

演示并断言：
* InlineExecutor 在调用线程里同步跑完（适合纯计算小步骤与确定性测试），无法暂停——pause() 如实返回 False；
  Controller 拒绝使用它；
* ThreadExecutor（默认）每次尝试一条守护线程；``async def`` 任务照样能跑，``await ctx.acheckpoint()``
  响应停止；
* ProcessExecutor 把任务放进子进程：snapshot.pid 是子进程的 pid；不响应停止的任务在优雅窗口用尽后被
  真正终止，落 stopped 而不是 lost；lambda / 局部函数在提交那一刻就被拒绝（ConfigurationError）；
  暂停同样能跨进程生效。

注意：用 ProcessExecutor 的脚本必须有 ``if __name__ == "__main__":`` 守卫，任务函数必须是模块级函数。

运行：python examples/05_executors.py
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable

from chongming_task import (
    ConfigurationError,
    Controller,
    FailureKind,
    InlineExecutor,
    ProcessExecutor,
    TaskContext,
    TaskStatus,
    ThreadExecutor,
    task,
)
from chongming_task.run import TaskRun, run_task

S = TaskStatus


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("条件在限定时间内没有成立")
        time.sleep(0.005)


def which_thread(ctx: TaskContext) -> int:
    return threading.get_ident()


def inline_loop(ctx: TaskContext, rounds: int) -> int:
    for _ in range(rounds):
        ctx.checkpoint()
        time.sleep(0.005)
    return rounds


async def async_poller(ctx: TaskContext) -> int:
    polls = 0
    while True:
        await ctx.acheckpoint()  # 异步版检查点：挂起时不阻塞事件循环
        polls += 1
        await asyncio.sleep(0.005)


@task
def child_pid(ctx: TaskContext) -> int:
    """模块级函数 + 可 pickle 的参数：进程执行器能在子进程里找到它。"""
    return os.getpid()


@task
def stubborn(ctx: TaskContext) -> None:
    """从不调 checkpoint()：线程执行器只能报 lost，进程执行器能真的停掉它。"""
    while True:
        time.sleep(0.01)


@task
def cooperative(ctx: TaskContext) -> None:
    while True:
        ctx.checkpoint()
        time.sleep(0.01)


def main() -> None:
    # 1) InlineExecutor：在本线程里跑完
    outcome = run_task(which_thread, executor=InlineExecutor())
    assert outcome.value == threading.get_ident()

    run = TaskRun(inline_loop, (40,), executor=InlineExecutor())
    answers: list[bool] = []

    def try_pause() -> None:
        wait_until(lambda: run.status is S.RUNNING)
        answers.append(run.pause(timeout=0.1))  # 内联执行器无法暂停：如实返回 False

    helper = threading.Thread(target=try_pause)
    helper.start()
    run.start()  # 阻塞到任务结束
    helper.join(5)
    assert answers == [False] and run.status is S.SUCCEEDED

    try:
        Controller(executor=InlineExecutor())
    except ConfigurationError as exc:
        print("Controller 拒绝 InlineExecutor：", exc)
    else:
        raise AssertionError("Controller 应当拒绝 InlineExecutor")

    # 2) ThreadExecutor（默认）：async def 任务
    run = TaskRun(async_poller, executor=ThreadExecutor())
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    time.sleep(0.05)
    run.stop(reason="够了")
    assert run.wait(timeout=5).status is S.STOPPED

    # 3) ProcessExecutor：子进程
    process = ProcessExecutor()
    outcome = run_task(child_pid, executor=process)
    print("子进程 pid:", outcome.value, "监督进程 pid:", os.getpid())
    assert outcome.ok and outcome.value != os.getpid()
    assert outcome.snapshot.pid == outcome.value and outcome.snapshot.executor == "process"

    # 不响应停止 → 优雅窗口用尽后 terminate()/kill()，如实落 stopped（不是 lost）
    run = TaskRun(stubborn, executor=process, graceful_stop=0.3)
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    run.stop(reason="必须停下")
    outcome = run.wait(timeout=10)
    print("stubborn:", outcome.status.value, "|", outcome.failure.message if outcome.failure else "")
    assert outcome.status is S.STOPPED
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.CANCELLED

    # 暂停跨进程同样生效（信号要过进程边界，约 20ms 量级的延迟）
    run = TaskRun(cooperative, executor=process)
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    assert run.pause(timeout=5) is True
    assert run.resume() is True
    run.stop()
    assert run.wait(timeout=10).status is S.STOPPED

    # lambda / 局部函数：提交那一刻就被拒绝，并告诉你怎么改
    try:
        TaskRun(lambda ctx: 1, executor=process)
    except ConfigurationError as exc:
        assert "模块级函数" in str(exc)
    else:
        raise AssertionError("lambda 应当被 ProcessExecutor 拒绝")

    print("05_executors: OK")


if __name__ == "__main__":
    main()
