"""02 停止与暂停：协作式控制的每一种结局，以及它们在轨迹里留下的记录。

演示并断言：
* pause() 返回 True = 任务确实在 checkpoint() 里挂起了；resume() 回到 running；
* stop() 不阻塞：running → stopping → stopped，failure.kind=cancelled，不可重试；
* 用 ``except Exception`` 包住循环也吞不掉停止信号（TaskCancelled 继承 BaseException）；
* 暂停窗口内任务没到检查点 → pause() 返回 False，状态回滚为 running，留下 runtime:pause_aborted；
* 任务不调 checkpoint()：优雅窗口用尽后如实记 lost（结果未知，可重试），而不是 stopped；
* 还没启动（排队中）的任务，停止立即生效，不经过 stopping。

运行：python examples/02_stop_and_pause.py
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from chongming_task import FailureKind, TaskContext, TaskStatus
from chongming_task.run import TaskRun

S = TaskStatus


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("条件在限定时间内没有成立")
        time.sleep(0.005)


def path_of(run: TaskRun) -> list[str]:
    return [t.to_status.value for t in run.transitions]


def cooperative(ctx: TaskContext) -> int:
    done = 0
    while True:
        ctx.checkpoint()  # 停止 → 抛 TaskCancelled；暂停 → 在这里挂起
        done += 1
        time.sleep(0.005)


def swallows_exceptions(ctx: TaskContext) -> None:
    while True:
        try:
            ctx.checkpoint()
            time.sleep(0.005)
        except Exception as exc:  # 想只捕获业务异常——停止信号不会被它吃掉
            print("不会走到这里：", exc)


def slow_steps(ctx: TaskContext, release: threading.Event) -> str:
    release.wait(5)  # 一段不调 checkpoint() 的阻塞调用
    ctx.checkpoint()
    return "done"


def never_checks(ctx: TaskContext, release: threading.Event) -> None:
    release.wait(10)  # 完全不调 checkpoint()：停不掉


def main() -> None:
    # 1) 暂停 → 恢复 → 停止
    run = TaskRun(cooperative, task_id="loop")
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    assert run.pause(timeout=2) is True
    assert run.status is S.PAUSED
    assert run.resume() is True and run.status is S.RUNNING
    assert run.stop(reason="发布窗口") is True  # 不阻塞
    outcome = run.wait(timeout=5)
    print("loop:", " -> ".join(path_of(run)))
    assert outcome.status is S.STOPPED
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.CANCELLED
    assert outcome.failure.retryable is False
    assert path_of(run) == [
        "queued",
        "starting",
        "running",
        "pausing",
        "paused",
        "running",
        "stopping",
        "stopped",
    ]
    stop_record = next(t for t in run.transitions if t.to_status is S.STOPPING)
    assert stop_record.reason == "发布窗口" and stop_record.trigger == "control:stop"
    assert run.stop() is False  # 已落终态：请求不再被受理

    # 2) except Exception 吞不掉停止信号
    run = TaskRun(swallows_exceptions)
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    run.stop()
    assert run.wait(timeout=5).status is S.STOPPED

    # 3) 暂停没生效：窗口内没到检查点 → False，状态回滚，轨迹里如实记录
    release = threading.Event()
    run = TaskRun(slow_steps, (release,))
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    assert run.pause(timeout=0.2) is False
    assert run.status is S.RUNNING
    aborted = [t for t in run.transitions if t.trigger == "runtime:pause_aborted"]
    assert len(aborted) == 1 and aborted[0].from_status is S.PAUSING and aborted[0].to_status is S.RUNNING
    release.set()
    assert run.wait(timeout=5).value == "done"
    print("slow_steps:", " -> ".join(path_of(run)))

    # 4) 不调 checkpoint()：窗口用尽 → lost（线程无法强杀，结果未知）
    release = threading.Event()
    run = TaskRun(never_checks, (release,), graceful_stop=0.2)
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    run.stop(reason="想停掉它")
    outcome = run.wait(timeout=5)
    print("never_checks:", " -> ".join(path_of(run)), "|", outcome.failure.message if outcome.failure else "")
    assert outcome.status is S.LOST
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.LOST
    assert outcome.failure.retryable is True
    release.set()  # 线程其实还在后台跑：放它走，免得示例退出前还挂着

    # 5) 没占执行槽的任务：停止立即生效，不经过 stopping
    run = TaskRun(cooperative)  # 只构造、不 start：pending
    assert run.stop(reason="不用跑了") is True
    assert run.status is S.STOPPED and path_of(run) == ["stopped"]

    print("02_stop_and_pause: OK")


if __name__ == "__main__":
    main()
