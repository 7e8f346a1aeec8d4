"""TaskRun / run_task 在线程与内联执行器上的行为（用户指南 §3、§4、§5）。

断言迁移轨迹，而不只是终态：中间态才是这个项目的价值所在。
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from chongming_runtime_test_support import wait_until

from chongming_task import (
    ConfigurationError,
    FailureKind,
    FixedBackoff,
    RetryPolicy,
    StateMachine,
    TaskCancelled,
    TaskContext,
    TaskStatus,
    task,
)
from chongming_task.run import RESERVED_RUN_TASK_KEYWORDS, Outcome, TaskRun, run_task
from chongming_task.runtime.executors.inline import InlineExecutor
from chongming_task.runtime.executors.thread import ThreadExecutor
from chongming_task.testing import FakeClock

S = TaskStatus


def path(run: TaskRun) -> list[tuple[str, str, str]]:
    return [(t.from_status.value, t.to_status.value, t.trigger) for t in run.transitions]


def statuses(run: TaskRun) -> list[str]:
    return [t.to_status.value for t in run.transitions]


def loop_forever(ctx: TaskContext) -> None:
    while True:
        ctx.checkpoint()
        time.sleep(0.001)


# -- basics -----------------------------------------------------------------------------------------


def test_run_task_returns_the_value_and_the_full_trajectory() -> None:
    outcome = run_task(lambda ctx, a, *, b: {"sum": a + b}, 1, b=2, task_id="job-1", name="加法")
    assert isinstance(outcome, Outcome)
    assert outcome.ok and outcome.status is S.SUCCEEDED
    assert outcome.value == {"sum": 3}
    assert outcome.failure is None
    snap = outcome.snapshot
    assert (snap.task_id, snap.name, snap.attempt, snap.executor) == ("job-1", "加法", 1, "thread")
    assert snap.finished_at is not None and snap.started_at is not None
    assert snap.last_heartbeat_at is not None


def test_transitions_of_a_plain_run() -> None:
    run = TaskRun(lambda ctx: "ok", task_id="t")
    assert run.status is S.PENDING
    run.start()
    assert run.wait(5).value == "ok"
    assert path(run) == [
        ("pending", "queued", "scheduler:queued"),
        ("queued", "starting", "scheduler:dispatched"),
        ("starting", "running", "executor:launched"),
        ("running", "succeeded", "executor:returned"),
    ]
    assert [t.version for t in run.transitions] == [1, 2, 3, 4]
    assert run.done and run.done_event.is_set()


def test_exception_is_recorded_with_type_message_and_traceback() -> None:
    def broken(ctx: TaskContext) -> None:
        raise KeyError("缺少字段 id")

    outcome = run_task(broken)
    assert outcome.status is S.FAILED and not outcome.ok and outcome.value is None
    failure = outcome.failure
    assert failure is not None
    assert failure.kind is FailureKind.EXCEPTION
    assert failure.exc_type == "KeyError"
    assert "缺少字段 id" in failure.message
    assert failure.traceback is not None and "broken" in failure.traceback and "KeyError" in failure.traceback


def test_result_must_be_json_serialisable() -> None:
    outcome = run_task(lambda ctx: {1, 2, 3})
    assert outcome.status is S.FAILED
    assert outcome.failure is not None
    assert outcome.failure.kind is FailureKind.RESULT_INVALID
    assert "JSON" in outcome.failure.message and "set" in outcome.failure.message
    assert outcome.failure.retryable is False
    nan = run_task(lambda ctx: float("nan"))
    assert nan.failure is not None and nan.failure.kind is FailureKind.RESULT_INVALID


def test_start_twice_is_an_error_and_wait_timeout_leaves_state_alone() -> None:
    gate = threading.Event()
    run = TaskRun(lambda ctx: gate.wait(5) and "done", task_id="slow")
    run.start()
    with pytest.raises(ConfigurationError, match="只能启动一次"):
        run.start()
    wait_until(lambda: run.status is S.RUNNING)
    version = run.snapshot.status_version
    with pytest.raises(TimeoutError, match="任务状态未改变"):
        run.wait(timeout=0.01)
    assert run.status is S.RUNNING and run.snapshot.status_version == version
    gate.set()
    assert run.wait(5).value == "done"


def test_run_task_reserved_keywords_and_task_kwargs() -> None:
    assert {
        "task_id",
        "name",
        "executor",
        "retry",
        "timeout",
        "artifact_dir",
        "clock",
        "graceful_stop",
    } == set(RESERVED_RUN_TASK_KEYWORDS)
    outcome = run_task(lambda ctx, *, batch_size: batch_size, batch_size=500)
    assert outcome.value == 500
    run = TaskRun(lambda ctx, *, timeout: timeout, kwargs={"timeout": 7})
    run.start()
    assert run.wait(5).value == 7


def test_bad_configuration_is_refused_with_a_message() -> None:
    with pytest.raises(ConfigurationError, match="任务函数"):
        TaskRun("not callable")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="args"):
        TaskRun(lambda ctx: None, "abc")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="executor"):
        TaskRun(lambda ctx: None, executor="thread")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="RetryPolicy"):
        TaskRun(lambda ctx: None, retry=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="graceful_stop"):
        TaskRun(lambda ctx: None, graceful_stop=-1)
    with pytest.raises(ConfigurationError, match="tags"):
        TaskRun(lambda ctx: None, tags="io")


def test_task_decorator_supplies_defaults() -> None:
    calls: list[int] = []

    @task(name="抽取", tags={"io"}, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0)))
    def extract(ctx: TaskContext) -> int:
        """从源读取。"""
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ConnectionError("暂时失败")
        return ctx.attempt

    run = TaskRun(extract, tags=["nightly"])
    snap = run.snapshot
    assert (snap.name, snap.description, snap.tags, snap.max_attempts) == (
        "抽取",
        "从源读取。",
        {"io", "nightly"},
        2,
    )
    assert snap.task_id.startswith("抽取-")
    run.start()
    assert run.wait(5).value == 2
    assert calls == [1, 2]


def test_upstream_values_reach_the_context() -> None:
    outcome = run_task_with_upstream({"extract": [1, 2]})
    assert outcome.value == [1, 2, "fallback"]


def run_task_with_upstream(upstream: dict[str, Any]) -> Outcome:
    run = TaskRun(lambda ctx: [*ctx.input("extract"), ctx.input("other", "fallback")], upstream=upstream)
    run.start()
    return run.wait(5)


# -- §4.1 / §4.5: the stop table --------------------------------------------------------------------


def test_cooperative_task_is_stopped() -> None:
    run = TaskRun(loop_forever, task_id="coop")
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    assert run.stop(reason="发布窗口") is True
    outcome = run.wait(5)
    assert outcome.status is S.STOPPED and outcome.value is None
    assert outcome.failure is not None
    assert outcome.failure.kind is FailureKind.CANCELLED and outcome.failure.retryable is False
    assert path(run)[-2:] == [
        ("running", "stopping", "control:stop"),
        ("stopping", "stopped", "runtime:stopped"),
    ]
    assert run.transitions[-2].reason == "发布窗口"
    assert run.stop() is False  # 已落终态


def test_graceful_return_after_stop_is_succeeded_with_value() -> None:
    @task
    def worker(ctx: TaskContext, source: str) -> int:
        processed = 0
        while not ctx.is_stop_requested:
            ctx.checkpoint()
            processed += 1
            ctx.progress(processed, unit="batch")
            time.sleep(0.001)
        ctx.log(f"收到停止请求，本次共处理 {processed} 批")
        return processed

    run = TaskRun(worker, ("kafka://orders",), task_id="orders-worker")
    run.start()
    wait_until(lambda: (run.snapshot.progress or None) is not None)
    run.stop(reason="发布窗口")
    outcome = run.wait(5)
    assert outcome.ok and outcome.status is S.SUCCEEDED
    assert isinstance(outcome.value, int) and outcome.value >= 1
    assert statuses(run)[-2:] == ["stopping", "succeeded"]
    assert any("收到停止请求" in entry.message for entry in run.logs)


def test_non_cooperative_thread_is_lost_after_the_graceful_window() -> None:
    clock = FakeClock()
    release = threading.Event()
    finished = threading.Event()

    def stubborn(ctx: TaskContext) -> str:
        release.wait(10)
        finished.set()
        return "late"

    run = TaskRun(stubborn, task_id="stubborn", clock=clock, graceful_stop=5)
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    run.stop(reason="发布窗口")
    assert run.status is S.STOPPING
    clock.wait_for_sleepers(1)  # 看门狗已经在等优雅窗口
    clock.advance(4.9)
    time.sleep(0.02)
    assert run.status is S.STOPPING
    clock.advance(0.1)
    outcome = run.wait(5)
    assert outcome.status is S.LOST
    assert outcome.failure is not None
    assert outcome.failure.kind is FailureKind.LOST and outcome.failure.retryable is True
    assert "优雅窗口" in outcome.failure.message and "仍在后台运行" in outcome.failure.message
    assert statuses(run)[-2:] == ["stopping", "lost"]
    # 被放弃的线程后来跑完了：迟到的结果被忽略，不会把 lost 改写成 succeeded
    release.set()
    assert finished.wait(5)
    time.sleep(0.02)
    assert run.status is S.LOST and len(run.transitions) == len(path(run))


def test_except_exception_around_checkpoint_cannot_swallow_a_stop() -> None:
    swallowed: list[BaseException] = []

    def careless(ctx: TaskContext) -> None:
        while True:
            try:
                ctx.checkpoint()
                time.sleep(0.001)
            except Exception as exc:
                swallowed.append(exc)

    run = TaskRun(careless)
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    run.stop()
    assert run.wait(5).status is S.STOPPED
    assert swallowed == []


def test_stop_before_start_takes_effect_at_once() -> None:
    run = TaskRun(loop_forever)
    assert run.stop(reason="不跑了") is True
    assert run.status is S.STOPPED
    assert statuses(run) == ["stopped"]  # pending → stopped，没有 stopping
    run.start()  # 已经终态：start 不再启动任何东西
    assert run.wait(1).status is S.STOPPED


def test_stop_a_queued_run_built_by_a_controller() -> None:
    machine = StateMachine.create("queued-1", "job")
    machine.mark_queued()
    run = TaskRun(loop_forever, machine=machine)
    assert run.machine is machine and run.task_id == "queued-1"
    assert run.stop() is True
    assert statuses(run) == ["queued", "stopped"]


def test_a_task_raising_task_cancelled_by_itself_is_failed_not_stopped() -> None:
    def rogue(ctx: TaskContext) -> None:
        raise TaskCancelled("我自己抛的")

    outcome = run_task(rogue, retry=RetryPolicy(max_attempts=3, backoff=FixedBackoff(0)))
    assert outcome.status is S.FAILED
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.CANCELLED
    assert outcome.snapshot.attempt == 1  # 取消永不重试


def test_cancel_is_recorded_as_cancelled() -> None:
    run = TaskRun(loop_forever)
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    assert run.cancel(reason="兄弟节点失败") is True
    assert run.wait(5).status is S.CANCELLED
    assert statuses(run)[-2:] == ["running", "cancelled"]
    queued = TaskRun(loop_forever)
    assert queued.cancel() is True and queued.status is S.CANCELLED


# -- pause / resume ---------------------------------------------------------------------------------


def test_pause_and_resume_in_place() -> None:
    run = TaskRun(loop_forever, task_id="p")
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    assert run.pause(timeout=5) is True
    assert run.status is S.PAUSED
    assert run.pause() is True  # 已经暂停
    assert run.resume() is True
    assert run.status is S.RUNNING
    assert run.resume() is False
    run.stop()
    assert run.wait(5).status is S.STOPPED
    assert path(run)[3:] == [
        ("running", "pausing", "control:pause"),
        ("pausing", "paused", "runtime:paused"),
        ("paused", "running", "control:resume"),
        ("running", "stopping", "control:stop"),
        ("stopping", "stopped", "runtime:stopped"),
    ]


def test_pause_that_never_reaches_a_checkpoint_is_rolled_back() -> None:
    gate = threading.Event()

    def busy(ctx: TaskContext) -> str:
        gate.wait(10)
        ctx.checkpoint()
        return "done"

    run = TaskRun(busy)
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    assert run.pause(timeout=0.05) is False
    assert run.status is S.RUNNING
    assert path(run)[-2:] == [
        ("running", "pausing", "control:pause"),
        ("pausing", "running", "runtime:pause_aborted"),
    ]
    # 回滚之后不会"晚一步"挂起：检查点照常通过
    gate.set()
    assert run.wait(5).value == "done"


def test_pause_rollback_with_fake_clock() -> None:
    clock = FakeClock()
    gate = threading.Event()
    run = TaskRun(lambda ctx: gate.wait(10), clock=clock)
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    result: list[bool] = []
    pauser = threading.Thread(target=lambda: result.append(run.pause(timeout=30)))
    pauser.start()
    clock.wait_for_sleepers(1)
    assert run.status is S.PAUSING
    clock.advance(30)
    pauser.join(5)
    assert result == [False] and run.status is S.RUNNING
    assert run.transitions[-1].trigger == "runtime:pause_aborted"
    gate.set()
    run.wait(5)


def test_stop_a_paused_task() -> None:
    run = TaskRun(loop_forever)
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    assert run.pause(timeout=5)
    run.stop(reason="停掉暂停中的任务")
    assert run.wait(5).status is S.STOPPED
    assert statuses(run)[-4:] == ["paused", "running", "stopping", "stopped"]


def test_resume_while_pausing_withdraws_the_pause() -> None:
    gate = threading.Event()
    run = TaskRun(lambda ctx: (gate.wait(10), ctx.checkpoint(), "done")[2])
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    result: list[bool] = []
    pauser = threading.Thread(target=lambda: result.append(run.pause(timeout=10)))
    pauser.start()
    wait_until(lambda: run.status is S.PAUSING)
    assert run.resume() is True
    pauser.join(5)
    assert result == [False]
    gate.set()
    assert run.wait(5).value == "done"
    assert path(run)[3:5] == [
        ("running", "pausing", "control:pause"),
        ("pausing", "running", "control:resume"),
    ]


def test_pause_before_start_then_resume_goes_back_to_queued_and_runs() -> None:
    machine = StateMachine.create("pq", "job")
    machine.mark_queued()
    run = TaskRun(lambda ctx: "ran", machine=machine)
    assert run.pause() is True and run.status is S.PAUSED
    run.start()  # 暂停中：不启动
    assert run.status is S.PAUSED
    assert run.resume() is True
    assert run.wait(5).value == "ran"
    assert statuses(run) == ["queued", "paused", "queued", "starting", "running", "succeeded"]


def test_inline_executor_runs_in_the_caller_thread_and_cannot_pause() -> None:
    caller = threading.get_ident()
    seen: list[int] = []
    paused: list[bool] = []
    holder: list[TaskRun] = []

    def body(ctx: TaskContext) -> str:
        seen.append(threading.get_ident())
        checker = threading.Thread(target=lambda: paused.append(holder[0].pause(timeout=1)))
        checker.start()
        checker.join()
        ctx.checkpoint()
        return "inline"

    run = TaskRun(body, executor=InlineExecutor())
    holder.append(run)
    run.start()  # 同步跑完
    assert run.done and seen == [caller]
    assert paused == [False]
    assert run.wait(0).value == "inline"
    assert "pausing" not in statuses(run)  # 没有假装进入暂停流程


def test_inline_executor_still_honours_stop() -> None:
    holder: list[TaskRun] = []

    def body(ctx: TaskContext) -> None:
        threading.Thread(target=lambda: holder[0].stop(reason="另一个线程")).start()
        while True:
            ctx.checkpoint()
            time.sleep(0.001)

    run = TaskRun(body, executor=InlineExecutor())
    holder.append(run)
    run.start()
    assert run.status is S.STOPPED


# -- async ------------------------------------------------------------------------------------------


def test_async_task_runs_to_completion() -> None:
    import asyncio

    async def fetch(ctx: TaskContext, n: int) -> int:
        total = 0
        for index in range(n):
            await ctx.acheckpoint()
            await asyncio.sleep(0)
            total += index
        return total

    assert run_task(fetch, 5).value == 10
    assert run_task(fetch, 3, executor=InlineExecutor()).value == 3


def test_async_task_honours_stop_and_pause() -> None:
    import asyncio

    async def forever(ctx: TaskContext) -> None:
        while True:
            await ctx.acheckpoint()
            await asyncio.sleep(0.001)

    run = TaskRun(forever, executor=ThreadExecutor())
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    assert run.pause(timeout=5) is True
    assert run.resume() is True
    run.stop()
    assert run.wait(5).status is S.STOPPED


# -- retries ----------------------------------------------------------------------------------------


def test_retries_keep_the_attempt_history() -> None:
    def flaky(ctx: TaskContext) -> int:
        if ctx.attempt < 3:
            raise ConnectionError(f"第 {ctx.attempt} 次失败")
        return ctx.attempt

    run = TaskRun(flaky, retry=RetryPolicy(max_attempts=3, backoff=FixedBackoff(0)))
    run.start()
    outcome = run.wait(5)
    assert outcome.value == 3 and outcome.snapshot.attempt == 3
    assert statuses(run) == [
        "queued",
        "starting",
        "running",
        "retry_wait",
        "starting",
        "running",
        "retry_wait",
        "starting",
        "running",
        "succeeded",
    ]
    failures = [t for t in run.transitions if t.to_status is S.RETRY_WAIT]
    assert [t.trigger for t in failures] == ["runtime:retry_scheduled"] * 2


def test_retries_exhausted_and_give_up_on() -> None:
    def always(ctx: TaskContext) -> None:
        raise ConnectionError("网络断了")

    outcome = run_task(always, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0)))
    assert outcome.status is S.FAILED and outcome.snapshot.attempt == 2
    assert outcome.failure is not None and outcome.failure.exc_type == "ConnectionError"

    def bad_input(ctx: TaskContext) -> None:
        raise ValueError("坏数据")

    policy = RetryPolicy(max_attempts=5, backoff=FixedBackoff(0), give_up_on=(ValueError,))
    given_up = run_task(bad_input, retry=policy)
    assert given_up.status is S.FAILED and given_up.snapshot.attempt == 1
    assert given_up.failure is not None and given_up.failure.retryable is False


def test_retry_wait_has_retry_at_and_waits_on_the_clock() -> None:
    clock = FakeClock()
    attempts: list[int] = []

    def flaky(ctx: TaskContext) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ConnectionError("暂时失败")
        return "ok"

    run = TaskRun(flaky, clock=clock, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(30)))
    run.start()
    wait_until(lambda: run.status is S.RETRY_WAIT)
    snap = run.snapshot
    assert snap.retry_at is not None and (snap.retry_at - clock.now()).total_seconds() == 30
    assert snap.failure is not None and "暂时失败" in snap.failure.message
    clock.wait_for_sleepers(1)
    clock.advance(29)
    time.sleep(0.02)
    assert run.status is S.RETRY_WAIT and attempts == [1]
    clock.advance(1)
    assert run.wait(5).value == "ok"
    assert attempts == [1, 2]
    assert run.snapshot.retry_at is None


def test_stop_during_retry_wait_is_immediate() -> None:
    clock = FakeClock()
    run = TaskRun(lambda ctx: 1 / 0, clock=clock, retry=RetryPolicy(max_attempts=3, backoff=FixedBackoff(60)))
    run.start()
    wait_until(lambda: run.status is S.RETRY_WAIT)
    assert run.stop(reason="不等了") is True
    assert run.status is S.STOPPED
    assert statuses(run)[-2:] == ["retry_wait", "stopped"]


def test_pause_during_retry_wait_resumes_to_queued_and_restarts() -> None:
    clock = FakeClock()

    def flaky(ctx: TaskContext) -> int:
        if ctx.attempt == 1:
            raise ConnectionError("暂时失败")
        return ctx.attempt

    run = TaskRun(flaky, clock=clock, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(60)))
    run.start()
    wait_until(lambda: run.status is S.RETRY_WAIT)
    assert run.pause() is True
    assert run.status is S.PAUSED
    clock.advance(120)  # 暂停期间重试定时器已撤销：不会自己跑起来
    time.sleep(0.02)
    assert run.status is S.PAUSED
    assert run.resume() is True
    assert run.wait(5).value == 2
    assert statuses(run)[3:] == ["retry_wait", "paused", "queued", "starting", "running", "succeeded"]
    assert run.transitions[5].trigger == "control:resume"


def test_on_requeue_hands_a_due_retry_to_the_controller() -> None:
    requeued: list[TaskRun] = []
    run = TaskRun(
        lambda ctx: ctx.attempt if ctx.attempt > 1 else 1 / 0,
        retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0)),
        on_requeue=requeued.append,
    )
    run.start()
    wait_until(lambda: bool(requeued))
    assert requeued == [run] and run.status is S.RETRY_WAIT
    run.machine.mark_queued(trigger="runtime:retry_due")  # 控制器这样把它放回队列
    run.start()  # 额度到了：queued 的任务可以再次 start()
    assert run.wait(5).value == 2


def test_inline_executor_retries_in_the_caller_thread() -> None:
    threads: set[int] = set()

    def flaky(ctx: TaskContext) -> int:
        threads.add(threading.get_ident())
        if ctx.attempt < 3:
            raise ConnectionError("暂时失败")
        return ctx.attempt

    outcome = run_task(
        flaky, executor=InlineExecutor(), retry=RetryPolicy(max_attempts=3, backoff=FixedBackoff(0))
    )
    assert outcome.value == 3
    assert threads == {threading.get_ident()}


def test_artifact_dirs_differ_per_attempt(tmp_path: Path) -> None:
    def writer(ctx: TaskContext) -> str:
        (ctx.artifact_dir / "part-0.txt").write_text(f"attempt {ctx.attempt}")
        if ctx.attempt == 1:
            raise OSError("写到一半失败")
        return str(ctx.artifact_dir)

    outcome = run_task(
        writer,
        task_id="job-1",
        artifact_dir=tmp_path,
        retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0)),
    )
    assert outcome.value == str(tmp_path / "job-1" / "attempt-2")
    assert (tmp_path / "job-1" / "attempt-1" / "part-0.txt").read_text() == "attempt 1"
    assert (tmp_path / "job-1" / "attempt-2" / "part-0.txt").read_text() == "attempt 2"


# -- observability ----------------------------------------------------------------------------------


def test_log_records_carry_task_extras(caplog: pytest.LogCaptureFixture) -> None:
    def chatty(ctx: TaskContext) -> None:
        ctx.log("开始处理")
        ctx.warning("分区为空，跳过")
        if ctx.attempt == 1:
            raise ConnectionError("重试一次")

    with caplog.at_level(logging.INFO, logger="chongming_task.task"):
        run = TaskRun(
            chatty, task_id="log-job", name="抽取", retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0))
        )
        run.start()
        run.wait(5)
    records = [r for r in caplog.records if r.name == "chongming_task.task.log-job"]
    assert [(r.getMessage(), r.__dict__["attempt"]) for r in records] == [
        ("开始处理", 1),
        ("分区为空，跳过", 1),
        ("开始处理", 2),
        ("分区为空，跳过", 2),
    ]
    assert {(r.__dict__["task_id"], r.__dict__["task_name"]) for r in records} == {("log-job", "抽取")}
    assert [(e.attempt, e.message) for e in run.logs] == [
        (1, "开始处理"),
        (1, "分区为空，跳过"),
        (2, "开始处理"),
        (2, "分区为空，跳过"),
    ]


def test_progress_and_heartbeat_are_side_fields() -> None:
    clock = FakeClock()
    step = threading.Event()
    proceed = threading.Event()

    def reporter(ctx: TaskContext) -> str:
        ctx.progress(1, total=4, unit="parts")
        step.set()
        proceed.wait(5)
        ctx.checkpoint()
        ctx.progress(4, total=4, unit="parts")
        return "ok"

    run = TaskRun(reporter, clock=clock)
    run.start()
    assert step.wait(5)
    snap = run.snapshot
    version = snap.status_version
    assert snap.progress is not None and snap.progress.describe() == "1/4 parts"
    clock.advance(10)
    proceed.set()
    outcome = run.wait(5)
    assert outcome.snapshot.progress is not None and outcome.snapshot.progress.done == 4
    # 进度与心跳不递增版本号：只多了一次 running → succeeded
    assert outcome.snapshot.status_version == version + 1
    assert outcome.snapshot.last_heartbeat_at == clock.now()


def test_concurrent_control_calls_keep_history_consistent() -> None:
    for round_index in range(10):
        run = TaskRun(loop_forever, task_id=f"race-{round_index}", graceful_stop=5)
        run.start()
        wait_until(lambda: run.status is S.RUNNING)  # noqa: B023 - 在本轮循环内立即调用
        barrier = threading.Barrier(6)

        def hammer(action: str, run: TaskRun = run, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            for _ in range(5):
                if action == "pause":
                    run.pause(timeout=0.05)
                elif action == "resume":
                    run.resume()
                elif action == "read":
                    _ = run.snapshot, run.status
            if action == "stop":
                run.stop(reason="并发停止")

        workers = [
            threading.Thread(target=hammer, args=(a,))
            for a in ("pause", "pause", "resume", "resume", "read", "stop")
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(10)
        outcome = run.wait(10)
        assert outcome.status is S.STOPPED
        versions = [t.version for t in run.transitions]
        assert versions == list(range(1, len(versions) + 1))
        for before, after in zip(run.transitions, run.transitions[1:], strict=False):
            assert before.to_status is after.from_status
