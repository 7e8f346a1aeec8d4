"""03 重试与退避：什么会被重试、等多久、什么永远不会被重试。

演示并断言：
* RetryPolicy(max_attempts=3)：总尝试次数含首次；失败的尝试之间经过 retry_wait；
* give_up_on 优先于 retry_on：命中即放弃，failure.retryable=False；
* ExponentialBackoff 的等待上限 min(max_delay, base * factor**(n-1))，默认 FULL 抖动在 [0, 上限) 内取值；
* 被停止的任务永远不会被重试（停止 ≠ 失败）；
* 终态任务可以用 StateMachine.retry() 显式复活，尝试历史保留。

运行：python examples/03_retry_and_backoff.py
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from chongming_task import (
    ExponentialBackoff,
    FailureKind,
    FixedBackoff,
    Jitter,
    RetryPolicy,
    StateMachine,
    TaskContext,
    TaskStatus,
)
from chongming_task.run import TaskRun, run_task

S = TaskStatus


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("条件在限定时间内没有成立")
        time.sleep(0.005)


def flaky(ctx: TaskContext) -> int:
    """前两次尝试失败，第三次成功。ctx.attempt 是本次尝试的序号（从 1 起）。"""
    if ctx.attempt < 3:
        raise ConnectionError(f"第 {ctx.attempt} 次：连接被重置")
    return ctx.attempt


def bad_input(ctx: TaskContext) -> None:
    raise ValueError("参数不合法：重试也没用")


def forever(ctx: TaskContext) -> None:
    while True:
        ctx.checkpoint()
        time.sleep(0.005)


def main() -> None:
    # 1) 暂时性故障：重试到第三次成功（FixedBackoff(0) 去掉等待，适合演示与测试）
    policy = RetryPolicy(max_attempts=3, backoff=FixedBackoff(0), give_up_on=(ValueError, KeyError))
    run = TaskRun(flaky, retry=policy, task_id="flaky")
    outcome = run.start().wait(timeout=5)
    path = [t.to_status.value for t in run.transitions]
    print("flaky:", " -> ".join(path))
    assert outcome.ok and outcome.value == 3 and outcome.snapshot.attempt == 3
    assert path.count("retry_wait") == 2 and path.count("starting") == 3
    # 每次失败的原因都在 retry_wait 那一刻的快照里：failure 是正交维度，不是状态

    # 2) give_up_on 命中：只跑一次，立刻 failed
    outcome = run_task(bad_input, retry=policy)
    assert outcome.status is S.FAILED and outcome.snapshot.attempt == 1
    assert outcome.failure is not None and outcome.failure.retryable is False
    assert outcome.failure.exc_type == "ValueError"

    # 3) 重试耗尽：max_attempts 次之后 failed，最后一次的失败原因保留
    always = RetryPolicy(max_attempts=2, backoff=FixedBackoff(0))
    outcome = run_task(bad_input, retry=always)  # 这次没有 give_up_on：ValueError 也会被重试
    assert outcome.status is S.FAILED and outcome.snapshot.attempt == 2

    # 4) 指数退避：上限按次数翻倍、封顶；FULL 抖动在 [0, 上限) 里均匀取值，避免整批任务同一刻重试
    backoff = ExponentialBackoff(base=1, factor=2, max_delay=30)
    ceilings = [backoff.ceiling(n) for n in range(1, 8)]
    print("ExponentialBackoff 上限:", ceilings)
    assert ceilings == [1, 2, 4, 8, 16, 30, 30]
    rng = random.Random(7)
    for n in range(1, 8):
        assert 0 <= backoff.delay(n, rng) < backoff.ceiling(n)
    assert ExponentialBackoff(base=1, factor=2, max_delay=30, jitter=Jitter.NONE).delay(3) == 4

    # 5) 停止永远不会被重试：哪怕策略允许重试 5 次
    run = TaskRun(forever, retry=RetryPolicy(max_attempts=5, backoff=FixedBackoff(0)))
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    run.stop(reason="人工停止")
    outcome = run.wait(timeout=5)
    assert outcome.status is S.STOPPED and outcome.snapshot.attempt == 1
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.CANCELLED
    assert outcome.failure.retryable is False

    # 6) 显式复活：retry() 从 failed / stopped / cancelled / lost 回到 queued，历史与尝试计数保留
    machine = StateMachine.create("manual", "手工任务", max_attempts=1)
    machine.mark_queued()
    machine.mark_starting()
    machine.mark_running()
    machine.mark_lost(reason="节点宕机")
    assert machine.can_retry
    machine.retry(actor="ops", reason="核对过副作用，重跑")
    assert machine.status is S.QUEUED and machine.snapshot.attempt == 1
    assert machine.snapshot.max_attempts == 2  # 预算已用完时额外再给一次
    assert machine.transitions[-1].trigger == "control:retry"

    print("03_retry_and_backoff: OK")


if __name__ == "__main__":
    main()
