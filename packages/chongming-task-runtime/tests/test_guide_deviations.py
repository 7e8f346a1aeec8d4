"""新用户照着用户指南写代码时撞上的偏差（issue 16 的 1、2、3、8、9、13），全部经公开 API 复现。

* 超时从不被报成成功（用户指南 §6）；人工停止后正常返回仍是 ``stopping → succeeded``（§4.4）；
* ``starting`` 中的 ``pause()`` 经 ``pausing`` 缓冲，在第一个检查点确认，窗口用尽则
  ``runtime:pause_aborted`` 回滚（§4.2、§11.2）；
* 恢复之后立刻再暂停，及时确认，而不是等满整个暂停窗口；
* 忘写 ``ctx`` 在 register / submit / run_task 时就报 ConfigurationError（§2.1）；
* 任务体里抛出的 ConfigurationError 不重试；Controller 下产物目录的提示指向 ``Controller(artifact_dir=)``；
* 重复 task_id 的提示按已有任务的真实状态给建议。
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from chongming_guide_deviation_tasks import checkpoint_loop
from chongming_runtime_test_support import wait_until

from chongming_task import (
    ConfigurationError,
    Controller,
    DuplicateTaskId,
    FailureKind,
    FixedBackoff,
    RetryPolicy,
    SqliteTaskStore,
    TaskCancelled,
    TaskContext,
    TaskStatus,
    Timeout,
    run_task,
    task,
)
from chongming_task.core.triggers import (
    TRIGGER_PAUSE_ABORTED,
    TRIGGER_STOPPING,
    TRIGGER_SUCCEEDED,
    TRIGGER_TIMEOUT_ATTEMPT,
    TRIGGER_TIMEOUT_IDLE,
)
from chongming_task.run import TaskRun
from chongming_task.runtime.executors.base import AttemptEvents, AttemptSpec
from chongming_task.runtime.executors.process import ProcessExecutor
from chongming_task.runtime.executors.thread import ThreadAttempt, ThreadExecutor
from chongming_task.testing import FakeClock

S = TaskStatus


def edges(transitions: Any) -> list[tuple[str, str]]:
    return [(t.from_status.value, t.to_status.value) for t in transitions]


def graceful_worker(ctx: TaskContext) -> int:
    """§4.5 推荐的"请收工"写法：看到停止请求就正常 return 已处理的批数。"""
    processed = 0
    while not ctx.is_stop_requested:
        try:
            ctx.checkpoint()
        except TaskCancelled:
            break
        processed += 1
        time.sleep(0.001)
    return processed


def silent_graceful_worker(ctx: TaskContext) -> int:
    """不调 checkpoint（心跳不动，idle 会到期），看到停止请求就正常 return。"""
    rounds = 0
    while not ctx.is_stop_requested:
        rounds += 1
        time.sleep(0.001)
    return rounds


# -- 16.1 超时从不被报成成功 -----------------------------------------------------------------------


def _expire(clock: FakeClock, run: TaskRun, seconds: float) -> None:
    wait_until(lambda: run.status is S.RUNNING)
    clock.wait_for_sleepers(1)  # 看门狗已经睡在假时钟上
    clock.advance(seconds)


def test_per_attempt_timeout_answered_by_return_is_a_timeout_failure() -> None:
    clock = FakeClock()
    run = TaskRun(graceful_worker, clock=clock, timeout=Timeout(per_attempt=60))
    run.start()
    _expire(clock, run, 60)
    outcome = run.wait(timeout=10)
    assert outcome.status is S.FAILED
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.TIMEOUT_ATTEMPT
    assert outcome.failure.retryable is True  # 默认可重试，只是预算（1 次）用完了
    last = run.transitions[-1]
    assert (last.from_status, last.to_status) == (S.RUNNING, S.FAILED)
    assert last.trigger == TRIGGER_TIMEOUT_ATTEMPT  # 历史点名是哪一档超时
    assert S.SUCCEEDED not in {t.to_status for t in run.transitions}


def test_idle_timeout_answered_by_return_is_a_timeout_failure() -> None:
    clock = FakeClock()
    run = TaskRun(silent_graceful_worker, clock=clock, timeout=Timeout(idle=30))
    run.start()
    _expire(clock, run, 30)
    outcome = run.wait(timeout=10)
    assert outcome.status is S.FAILED
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.TIMEOUT_IDLE
    assert run.transitions[-1].trigger == TRIGGER_TIMEOUT_IDLE


def test_timeout_answered_by_return_retries_per_policy() -> None:
    clock = FakeClock()
    run = TaskRun(
        graceful_worker,
        clock=clock,
        timeout=Timeout(per_attempt=60),
        retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0)),
    )
    run.start()
    _expire(clock, run, 60)
    wait_until(lambda: run.snapshot.attempt == 2 and run.status is S.RUNNING)
    clock.wait_for_sleepers(1)
    clock.advance(60)
    outcome = run.wait(timeout=10)
    assert outcome.status is S.FAILED and outcome.snapshot.attempt == 2
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.TIMEOUT_ATTEMPT
    assert edges(run.transitions) == [
        ("pending", "queued"),
        ("queued", "starting"),
        ("starting", "running"),
        ("running", "retry_wait"),
        ("retry_wait", "starting"),
        ("starting", "running"),
        ("running", "failed"),
    ]
    retry_record = run.transitions[3]
    assert retry_record.trigger == TRIGGER_TIMEOUT_ATTEMPT
    assert run.transitions[-1].trigger == TRIGGER_TIMEOUT_ATTEMPT


def test_timeout_answered_by_return_under_controller_is_a_timeout_failure() -> None:
    clock = FakeClock()
    controller = Controller(clock=clock)
    try:
        controller.register("worker", graceful_worker, timeout=Timeout(per_attempt=60))
        run = controller.submit("worker", task_id="w")
        _expire(clock, run, 60)
        outcome = controller.wait("w", timeout=10)
        assert outcome.status is S.FAILED
        assert outcome.failure is not None and outcome.failure.kind is FailureKind.TIMEOUT_ATTEMPT
    finally:
        controller.close()


def test_person_stop_answered_by_return_stays_a_success() -> None:
    """§4.4：人工停止是请求不是判决——任务收工返回就是 stopping → succeeded，返回值保留。"""
    clock = FakeClock()
    run = TaskRun(graceful_worker, clock=clock, timeout=Timeout(per_attempt=600))
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    assert run.stop(reason="发布窗口") is True
    outcome = run.wait(timeout=10)
    assert outcome.status is S.SUCCEEDED and outcome.failure is None
    assert isinstance(outcome.value, int)
    assert edges(run.transitions)[-2:] == [("running", "stopping"), ("stopping", "succeeded")]
    assert [t.trigger for t in run.transitions[-2:]] == [TRIGGER_STOPPING, TRIGGER_SUCCEEDED]


# -- 16.2 starting 中的 pause() 被缓冲 ----------------------------------------------------------------


class GatedThreadExecutor(ThreadExecutor):
    """载体就位之前要等一道闸：把 ``starting`` 拉长到测试想要的长度（像进程执行器的 100 ms+ 启动）。"""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def prepare(self, spec: AttemptSpec, events: AttemptEvents) -> ThreadAttempt:
        gate = self.gate

        class GatedAttempt(ThreadAttempt):
            def launch(self) -> None:
                def delayed() -> None:
                    gate.wait(30)
                    ThreadAttempt.launch(self)

                threading.Thread(target=delayed, daemon=True).start()

        return GatedAttempt(spec, events)


def loop(ctx: TaskContext) -> None:
    while True:
        ctx.checkpoint()
        time.sleep(0.001)


def _pause_in_background(pause: Callable[[], bool]) -> tuple[threading.Thread, list[bool]]:
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(pause()), daemon=True)
    thread.start()
    return thread, result


def test_pause_during_starting_is_buffered_and_confirmed_at_first_checkpoint() -> None:
    executor = GatedThreadExecutor()
    run = TaskRun(loop, executor=executor)
    run.start()
    assert run.status is S.STARTING
    thread, result = _pause_in_background(lambda: run.pause(timeout=10))
    wait_until(lambda: run.status is S.PAUSING)
    executor.gate.set()  # 载体就位，任务的第一个 checkpoint() 就挂起
    thread.join(10)
    assert result == [True] and run.status is S.PAUSED
    assert edges(run.transitions)[-3:] == [
        ("queued", "starting"),
        ("starting", "pausing"),
        ("pausing", "paused"),
    ]
    assert run.resume() is True and run.status is S.RUNNING
    run.stop()
    assert run.wait(timeout=10).status is S.STOPPED


def test_pause_during_starting_rolls_back_when_the_window_expires() -> None:
    executor = GatedThreadExecutor()
    run = TaskRun(loop, executor=executor)
    run.start()
    assert run.pause(timeout=0.2) is False  # 载体 0.2 秒内没就位：暂停没生效
    assert run.status is S.RUNNING
    assert edges(run.transitions)[-2:] == [("starting", "pausing"), ("pausing", "running")]
    assert run.transitions[-1].trigger == TRIGGER_PAUSE_ABORTED
    executor.gate.set()
    wait_until(lambda: run.snapshot.last_heartbeat_at is not None or run.snapshot.pid is None)
    run.stop()
    assert run.wait(timeout=10).status is S.STOPPED


def test_pause_right_after_start_with_process_executor() -> None:
    run = TaskRun(checkpoint_loop, executor=ProcessExecutor())
    run.start()
    # 子进程要 100 ms+ 才就位；这一刻任务必在 starting，pause 必须被缓冲而不是丢掉。
    assert run.pause(timeout=20) is True and run.status is S.PAUSED
    assert ("starting", "pausing") in edges(run.transitions)
    assert run.resume() is True
    run.stop()
    assert run.wait(timeout=20).status is S.STOPPED


def test_controller_pause_during_starting_is_buffered() -> None:
    executor = GatedThreadExecutor()
    controller = Controller(executor=executor)
    try:
        controller.register("loop", loop)
        controller.submit("loop", task_id="t")
        assert controller.get("t").status is S.STARTING  # type: ignore[union-attr]
        thread, result = _pause_in_background(lambda: controller.pause("t", timeout=10))
        wait_until(lambda: controller.get("t").status is S.PAUSING)  # type: ignore[union-attr]
        executor.gate.set()
        thread.join(10)
        assert result == [True]
        assert controller.get("t").status is S.PAUSED  # type: ignore[union-attr]
        (run,) = controller.runs()
        assert ("starting", "pausing") in edges(run.transitions)
    finally:
        controller.close(timeout=10)


def test_remote_pause_command_during_starting_is_buffered(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    executor = GatedThreadExecutor()
    owner = Controller(store=SqliteTaskStore(path), owner="node-a", executor=executor)
    console = Controller(store=SqliteTaskStore(path), owner="console")
    try:
        owner.register("loop", loop)
        owner.submit("loop", task_id="t")
        assert console.get("t").status is S.STARTING  # type: ignore[union-attr]
        assert console.pause("t", timeout=10) is False  # 跨进程没有回执：如实报"未确认"
        wait_until(lambda: console.get("t").status is S.PAUSING)  # type: ignore[union-attr]
        executor.gate.set()
        wait_until(lambda: console.get("t").status is S.PAUSED)  # type: ignore[union-attr]
        assert console.store is not None
        history = console.store.history("t")
        assert ("starting", "pausing") in edges(history)
        pausing = next(t for t in history if t.to_status is S.PAUSING)
        assert pausing.actor == "console"  # 谁按的暂停记进历史
    finally:
        console.close(close_store=True)
        owner.close(timeout=10, close_store=True)


# -- 16.3 恢复之后立刻再暂停，及时确认 --------------------------------------------------------------


def _repause_latencies(run: TaskRun, rounds: int) -> list[float]:
    latencies: list[float] = []
    for _ in range(rounds):
        assert run.pause() is True
        assert run.resume() is True
        started = time.monotonic()
        assert run.pause() is True  # 默认 5 秒窗口
        latencies.append(time.monotonic() - started)
        assert run.resume() is True
    return latencies


def test_repause_right_after_resume_confirms_promptly_thread() -> None:
    run = TaskRun(loop)
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    try:
        latencies = _repause_latencies(run, 5)
        # 任务每毫秒 checkpoint 一次：确认应在 ~100 ms 内（给机器负载留余量，但远小于 5 秒窗口）。
        assert max(latencies) < 0.5, latencies
    finally:
        run.stop()
        run.wait(timeout=10)


def test_repause_right_after_resume_confirms_promptly_process() -> None:
    run = TaskRun(checkpoint_loop, executor=ProcessExecutor())
    run.start()
    wait_until(lambda: run.status is S.RUNNING, timeout=20)
    try:
        latencies = _repause_latencies(run, 3)
        assert max(latencies) < 1.0, latencies
    finally:
        run.stop()
        run.wait(timeout=20)


# -- 16.8 忘写 ctx ----------------------------------------------------------------------------------


def fetch(url: str) -> str:  # 忘了 ctx：第一个位置参数会收到上下文
    return url


def no_params() -> str:
    return "x"


def fetch_ok(ctx: TaskContext, url: str) -> str:
    return url


def test_register_refuses_a_function_that_cannot_take_ctx() -> None:
    controller = Controller()
    try:
        with pytest.raises(ConfigurationError, match="第一个位置参数") as info:
            controller.register("no_params", no_params)
        assert "ctx" in str(info.value) and "no_params" in str(info.value)
        with pytest.raises(ConfigurationError, match="第一个位置参数"):
            controller.register("fetch", fetch)  # url: str 不可能是上下文
    finally:
        controller.close()


def test_submit_and_run_task_catch_a_forgotten_ctx() -> None:
    def fetch_untyped(url):  # type: ignore[no-untyped-def]
        return url

    controller = Controller()
    try:
        controller.register("fetch_untyped", fetch_untyped)  # 单看签名分不出来：留给 submit 判
        with pytest.raises(ConfigurationError, match="第一个位置参数") as info:
            controller.submit("fetch_untyped", "https://example.com")
        assert "def fetch_untyped(ctx" in str(info.value)
        with pytest.raises(ConfigurationError, match="第一个位置参数"):
            controller.submit("fetch_untyped", url="https://example.com")
        assert controller.list_tasks() == []  # 被拒绝的提交不留任何记录
    finally:
        controller.close()
    with pytest.raises(ConfigurationError, match="第一个位置参数"):
        run_task(fetch_untyped, "https://example.com")
    with pytest.raises(ConfigurationError, match="第一个位置参数"):
        TaskRun(fetch_untyped, ("https://example.com",))


@task
def decorated_fetch(ctx: TaskContext, url: str) -> str:
    return url


async def async_fetch(ctx: TaskContext, url: str) -> str:
    await ctx.acheckpoint()
    return url


def star_args(*args: Any) -> int:
    return len(args)


def ctx_and_star(ctx: TaskContext, *args: Any, **kwargs: Any) -> int:
    return len(args) + len(kwargs)


class Fetcher:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def fetch(self, ctx: TaskContext, path: str) -> str:
        return self.prefix + path

    def __call__(self, ctx: TaskContext, path: str) -> str:
        return self.prefix + path


def with_positional_only(ctx: TaskContext, /, url: str) -> str:
    return url


def wrapping(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


@pytest.mark.parametrize(
    ("fn", "args", "kwargs", "expected"),
    [
        (fetch_ok, ("u",), {}, "u"),
        (decorated_fetch, ("u",), {}, "u"),
        (async_fetch, ("u",), {}, "u"),
        (functools.partial(fetch_ok, url="u"), (), {}, "u"),
        (functools.partial(Fetcher("p/").fetch, path="u"), (), {}, "p/u"),
        (Fetcher("p/").fetch, ("u",), {}, "p/u"),
        (Fetcher("p/"), ("u",), {}, "p/u"),
        (star_args, ("a", "b"), {}, 3),
        (ctx_and_star, ("a",), {"b": 1}, 2),
        (with_positional_only, (), {"url": "u"}, "u"),
        (wrapping(fetch_ok), ("u",), {}, "u"),
    ],
    ids=[
        "plain",
        "task-decorated",
        "async",
        "partial",
        "partial-of-bound-method",
        "bound-method",
        "callable-object",
        "star-args",
        "ctx-and-star",
        "positional-only-ctx",
        "functools-wraps",
    ],
)
def test_valid_task_signatures_are_accepted_everywhere(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], expected: Any
) -> None:
    assert run_task(fn, *args, **kwargs).value == expected
    controller = Controller()
    try:
        controller.register("t", fn)
        assert controller.submit("t", *args, **kwargs).wait(timeout=10).value == expected
    finally:
        controller.close()


# -- 16.9 任务体里的 ConfigurationError -----------------------------------------------------------


def needs_artifacts(ctx: TaskContext) -> str:
    return str(ctx.artifact_dir)


def test_configuration_error_inside_a_task_is_not_retried() -> None:
    outcome = run_task(needs_artifacts, retry=RetryPolicy(max_attempts=3, backoff=FixedBackoff(0)))
    assert outcome.status is S.FAILED
    assert outcome.snapshot.attempt == 1  # 配置不会在两次尝试之间自己变好
    assert outcome.failure is not None and outcome.failure.retryable is False
    assert "TaskRun / run_task" in outcome.failure.message and "artifact_dir=" in outcome.failure.message


def test_configuration_error_explicitly_listed_in_retry_on_is_still_honoured() -> None:
    policy = RetryPolicy(max_attempts=3, retry_on=(ConfigurationError,))
    assert policy.is_retryable(ConfigurationError("x"))


def test_artifact_dir_hint_under_controller_names_the_controller() -> None:
    controller = Controller()
    try:
        controller.register(
            "needs", needs_artifacts, retry=RetryPolicy(max_attempts=3, backoff=FixedBackoff(0))
        )
        outcome = controller.submit("needs").wait(timeout=10)
        assert outcome.status is S.FAILED and outcome.snapshot.attempt == 1
        assert outcome.failure is not None
        assert "Controller(artifact_dir=" in outcome.failure.message
        assert "TaskRun" not in outcome.failure.message
    finally:
        controller.close()


def test_artifact_dir_under_controller_works_when_configured(tmp_path: Path) -> None:
    controller = Controller(artifact_dir=tmp_path)
    try:
        controller.register("needs", needs_artifacts)
        value = controller.submit("needs", task_id="a1").wait(timeout=10).value
        assert value == str(tmp_path / "a1" / "attempt-1")
    finally:
        controller.close()


# -- 16.13 重复 task_id：按已有任务的真实状态给建议 --------------------------------------------------


@pytest.fixture()
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def wait_gate(ctx: TaskContext, gate: threading.Event) -> str:
    while not gate.is_set():
        ctx.checkpoint()
        time.sleep(0.001)
    return "done"


def test_duplicate_task_id_message_tells_what_is_true(gate: threading.Event) -> None:
    controller = Controller()
    try:
        controller.register("g", wait_gate)
        controller.submit("g", gate, task_id="running-one")
        with pytest.raises(DuplicateTaskId) as info:
            controller.submit("g", gate, task_id="running-one")
        text = str(info.value)
        assert "停止过" not in text and "running" in text and "仍在" in text

        done = threading.Event()
        done.set()
        controller.submit("g", done, task_id="done-one").wait(timeout=10)
        with pytest.raises(DuplicateTaskId) as info:
            controller.submit("g", done, task_id="done-one")
        text = str(info.value)
        assert "停止过" not in text and "succeeded" in text and "换一个 task_id" in text

        controller.submit("g", gate, task_id="stopped-one")
        controller.stop("stopped-one")
        controller.wait("stopped-one", timeout=10)
        with pytest.raises(DuplicateTaskId) as info:
            controller.submit("g", gate, task_id="stopped-one")
        text = str(info.value)
        assert "停止过" not in text and "stopped" in text and "换一个 task_id" in text
    finally:
        gate.set()
        controller.close()


def test_duplicate_task_id_in_store_tells_what_is_true(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    first = Controller(store=SqliteTaskStore(path), owner="a")
    try:
        first.register("ok", lambda ctx: "ok")
        first.submit("ok", task_id="report-1").wait(timeout=10)
    finally:
        first.close(close_store=True)
    second = Controller(store=SqliteTaskStore(path), owner="b")
    try:
        second.register("ok", lambda ctx: "ok")
        with pytest.raises(DuplicateTaskId) as info:
            second.submit("ok", task_id="report-1")
        text = str(info.value)
        assert "停止过" not in text and "succeeded" in text and "存储" in text
    finally:
        second.close(close_store=True)


def test_result_invalid_message_has_no_stray_space() -> None:
    outcome = run_task(lambda ctx: object())
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.RESULT_INVALID
    message = outcome.failure.message
    assert message.startswith("任务返回值必须可 JSON 序列化"), message
    assert " 必须" not in message


# -- 16.14 close()：排队中的任务直接落 stopped（用户指南 §8.3） ------------------------------------


def test_close_sends_queued_tasks_straight_to_stopped(gate: threading.Event) -> None:
    controller = Controller(max_parallel=1, graceful_stop=1.0)
    controller.register("g", wait_gate)
    running = controller.submit("g", gate, task_id="running")
    queued = controller.submit("g", gate, task_id="queued")
    wait_until(lambda: running.status is S.RUNNING)
    controller.close(reason="下班")
    assert queued.status is S.STOPPED
    assert edges(queued.transitions) == [("pending", "queued"), ("queued", "stopped")]  # 没有先 starting
    assert queued.snapshot.attempt == 0  # 任务体一行都没执行
    assert running.status is S.STOPPED
