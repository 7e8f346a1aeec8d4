"""三档超时（用户指南 §6），全部用 FakeClock 驱动：每条用例在毫秒级跑完。

超时不是状态：到期后请求停止，结果记成 timeout_* 失败（默认可重试）。暂停期间不计时；idle 只在
本次尝试开始执行之后才计。
"""

from __future__ import annotations

import threading
import time

from chongming_runtime_test_support import wait_until

from chongming_task import (
    FailureKind,
    FixedBackoff,
    RetryPolicy,
    StateMachine,
    TaskContext,
    TaskStatus,
    Timeout,
)
from chongming_task.run import TaskRun
from chongming_task.runtime.executors.base import (
    AttemptEvents,
    AttemptHandle,
    AttemptResult,
    AttemptSpec,
    Executor,
    ResultKind,
)
from chongming_task.runtime.supervisor import Watchdog
from chongming_task.testing import FakeClock

S = TaskStatus


def statuses(run: TaskRun) -> list[str]:
    return [t.to_status.value for t in run.transitions]


def beating(ctx: TaskContext) -> None:
    """一直 checkpoint（心跳一直在刷新）。"""
    while True:
        ctx.checkpoint()
        time.sleep(0.001)


def silent_but_stoppable(ctx: TaskContext) -> None:
    """不调 checkpoint（心跳不动），但看到停止请求就去检查点里响应。"""
    while not ctx.is_stop_requested:
        time.sleep(0.001)
    ctx.checkpoint()


def settle_watchdog(clock: FakeClock) -> None:
    """等看门狗线程睡到 FakeClock 上，再推进时间（否则推进可能发生在它算好等待时长之前）。"""
    clock.wait_for_sleepers(1)


def test_per_attempt_timeout_is_a_failure_not_a_state() -> None:
    clock = FakeClock()
    run = TaskRun(beating, clock=clock, timeout=Timeout(per_attempt=600))
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    settle_watchdog(clock)
    clock.advance(599)
    time.sleep(0.02)
    assert run.status is S.RUNNING
    clock.advance(1)
    outcome = run.wait(5)
    assert outcome.status is S.FAILED
    assert outcome.failure is not None
    assert outcome.failure.kind is FailureKind.TIMEOUT_ATTEMPT
    assert outcome.failure.retryable is True
    assert "per_attempt" in outcome.failure.message
    # 没有"超时状态"，也没有 stopping（那是人工停止）：running → failed
    assert statuses(run)[-2:] == ["running", "failed"]


def test_each_attempt_keeps_its_timers_in_its_own_table() -> None:
    # 尝试的定时器表一开始是共用的空表（taskrun._NO_TIMERS）：登记定时器必须换上本尝试自己的表。两个同时在跑、
    # 各自登记了超时的任务互不相干，共用的那张表始终是空的。
    from chongming_task.runtime.taskrun import _NO_TIMERS

    clock = FakeClock()
    first = TaskRun(beating, clock=clock, timeout=Timeout(per_attempt=600, idle=300))
    second = TaskRun(beating, clock=clock, timeout=Timeout(per_attempt=900))
    first.start()
    second.start()
    wait_until(lambda: first.status is S.RUNNING and second.status is S.RUNNING)
    assert _NO_TIMERS == {}
    for run, armed in ((first, {"timeout_attempt", "timeout_idle"}), (second, {"timeout_attempt"})):
        with run._lock:  # 就位与登记定时器在同一次持锁之内：锁内看到的是登记完的
            assert run._attempt is not None
            assert set(run._attempt.timers) == armed
    second.stop()
    assert second.wait(5).status is S.STOPPED
    assert _NO_TIMERS == {}
    settle_watchdog(clock)
    clock.advance(600)
    assert first.wait(5).failure is not None
    assert _NO_TIMERS == {}


def test_per_attempt_timeout_is_retried() -> None:
    clock = FakeClock()
    attempts: list[int] = []

    def slow_then_fast(ctx: TaskContext) -> int:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            beating(ctx)
        return ctx.attempt

    run = TaskRun(
        slow_then_fast,
        clock=clock,
        timeout=Timeout(per_attempt=10),
        retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0)),
    )
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    settle_watchdog(clock)
    clock.advance(10)
    outcome = run.wait(5)
    assert outcome.value == 2 and attempts == [1, 2]
    retry_wait = [t for t in run.transitions if t.to_status is S.RETRY_WAIT]
    assert len(retry_wait) == 1
    assert statuses(run) == [
        "queued",
        "starting",
        "running",
        "retry_wait",
        "starting",
        "running",
        "succeeded",
    ]


def test_idle_timeout_fires_when_checkpoint_goes_silent() -> None:
    clock = FakeClock()
    run = TaskRun(silent_but_stoppable, clock=clock, timeout=Timeout(idle=60))
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    settle_watchdog(clock)
    clock.advance(60)
    outcome = run.wait(5)
    assert outcome.status is S.FAILED
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.TIMEOUT_IDLE
    assert "checkpoint()" in outcome.failure.message
    assert outcome.failure.retryable is True


def test_idle_timeout_does_not_fire_while_the_task_keeps_beating() -> None:
    clock = FakeClock()
    run = TaskRun(beating, clock=clock, timeout=Timeout(idle=10))
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    for _ in range(10):
        settle_watchdog(clock)
        clock.advance(6)
        # 任务在新的假时间上打了心跳之后再推进下一步
        wait_until(lambda: run.snapshot.last_heartbeat_at == clock.now())
    assert run.status is S.RUNNING
    run.stop()
    assert run.wait(5).status is S.STOPPED


def test_manual_heartbeat_keeps_a_long_computation_alive() -> None:
    clock = FakeClock()
    advanced = threading.Event()
    finish = threading.Event()

    def long_compute(ctx: TaskContext) -> str:
        advanced.wait(5)
        ctx.heartbeat.beat()  # 进入一段无法插入 checkpoint 的计算之前手动刷新
        finish.wait(5)
        return "computed"

    run = TaskRun(long_compute, clock=clock, timeout=Timeout(idle=10))
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    settle_watchdog(clock)
    clock.advance(8)
    advanced.set()
    time.sleep(0.02)
    clock.advance(8)  # 距上次心跳 8 秒 < 10：不判 idle
    time.sleep(0.02)
    assert run.status is S.RUNNING
    finish.set()
    assert run.wait(5).value == "computed"


def test_idle_does_not_count_time_spent_before_the_attempt_started() -> None:
    clock = FakeClock()
    machine = StateMachine.create("q", "job", clock=clock)
    machine.mark_queued()
    run = TaskRun(beating, machine=machine, timeout=Timeout(idle=5))
    clock.advance(1000)  # 在队列里等了很久
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    time.sleep(0.02)
    assert run.status is S.RUNNING
    run.stop()
    assert run.wait(5).status is S.STOPPED


def test_paused_time_is_excluded_from_timeouts() -> None:
    clock = FakeClock()
    run = TaskRun(beating, clock=clock, timeout=Timeout(per_attempt=10, idle=5))
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    settle_watchdog(clock)
    clock.advance(4)
    assert run.pause(timeout=5) is True
    clock.advance(1000)  # 暂停很久：per_attempt 与 idle 都不计
    time.sleep(0.02)
    assert run.status is S.PAUSED
    assert run.resume() is True
    settle_watchdog(clock)
    clock.advance(4)  # 本次尝试累计 8 秒
    time.sleep(0.02)
    assert run.status is S.RUNNING
    clock.advance(2)  # 累计 10 秒
    outcome = run.wait(5)
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.TIMEOUT_ATTEMPT


def test_timeout_on_a_thread_that_ignores_stop_ends_lost() -> None:
    clock = FakeClock()
    release = threading.Event()
    contexts: list[TaskContext] = []

    def ignores_stop(ctx: TaskContext) -> None:
        contexts.append(ctx)
        release.wait(10)

    run = TaskRun(ignores_stop, clock=clock, timeout=Timeout(per_attempt=10), graceful_stop=3)
    run.start()
    wait_until(lambda: run.status is S.RUNNING and bool(contexts))
    settle_watchdog(clock)
    clock.advance(10)
    wait_until(lambda: contexts[0].is_stop_requested)  # 超时已请求停止，优雅窗口开始
    assert run.status is S.RUNNING  # 超时不是人工停止：不进 stopping
    wait_until(lambda: Watchdog.for_clock(clock).pending == 1)
    settle_watchdog(clock)
    clock.advance(3)
    outcome = run.wait(5)
    assert outcome.status is S.LOST
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.LOST
    assert "timeout_attempt" in outcome.failure.message
    release.set()


def test_timeout_while_pausing_aborts_the_pause() -> None:
    clock = FakeClock()
    gate = threading.Event()

    def busy(ctx: TaskContext) -> None:
        gate.wait(10)
        ctx.checkpoint()

    run = TaskRun(busy, clock=clock, timeout=Timeout(per_attempt=10))
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    result: list[bool] = []
    pauser = threading.Thread(target=lambda: result.append(run.pause(timeout=100)))
    pauser.start()
    wait_until(lambda: run.status is S.PAUSING)
    clock.wait_for_sleepers(2)  # 看门狗 + 等暂停确认的线程
    clock.advance(10)
    pauser.join(5)
    assert result == [False]
    gate.set()
    outcome = run.wait(5)
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.TIMEOUT_ATTEMPT
    triggers = [t.trigger for t in run.transitions]
    assert "runtime:pause_aborted" in triggers


# -- start timeout: an executor whose carrier never comes up ---------------------------------------


class _NeverReady(AttemptHandle):
    """载体一直起不来；收到停止请求时以 CANCELLED 结束（配合的载体）。"""

    def __init__(self, events: AttemptEvents, ready: threading.Event) -> None:
        self._events = events
        self._ready = ready

    def launch(self) -> None:
        def wait_ready() -> None:
            if self._ready.wait(5):
                self._events.running(None)

        threading.Thread(target=wait_ready, daemon=True).start()

    def request_stop(self, reason: str | None) -> None:
        self._events.finished(AttemptResult(ResultKind.CANCELLED))

    def request_pause(self) -> None:
        raise AssertionError("不该在 starting 时暂停")

    def request_resume(self) -> None:
        raise AssertionError("不该在 starting 时恢复")

    def confirm_or_cancel_pause(self) -> bool:
        return False

    def last_beat(self) -> float:
        return 0.0


class _SlowStartExecutor(Executor):
    name = "slow-start"

    def __init__(self) -> None:
        self.ready = threading.Event()

    def prepare(self, spec: AttemptSpec, events: AttemptEvents) -> AttemptHandle:
        return _NeverReady(events, self.ready)


def test_start_timeout_fires_while_starting() -> None:
    clock = FakeClock()
    executor = _SlowStartExecutor()
    run = TaskRun(lambda ctx: None, clock=clock, executor=executor, timeout=Timeout(start=30))
    run.start()
    assert run.status is S.STARTING
    settle_watchdog(clock)
    clock.advance(30)
    outcome = run.wait(5)
    assert outcome.status is S.FAILED
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.TIMEOUT_START
    assert statuses(run) == ["queued", "starting", "failed"]


def test_start_timeout_counts_from_submission_and_is_void_once_running() -> None:
    clock = FakeClock()
    executor = _SlowStartExecutor()
    machine = StateMachine.create("s", "job", clock=clock)
    machine.mark_queued()
    run = TaskRun(beating, machine=machine, clock=clock, executor=executor, timeout=Timeout(start=30))
    clock.advance(20)  # 排队 20 秒：start 窗口只剩 10 秒
    run.start()
    settle_watchdog(clock)
    clock.advance(9)
    executor.ready.set()
    wait_until(lambda: run.status is S.RUNNING)
    clock.advance(100)  # 已经开始执行：start 超时失效
    time.sleep(0.02)
    assert run.status is S.RUNNING
    run.stop()
    assert run.wait(5).status is S.STOPPED
