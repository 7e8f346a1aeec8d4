"""TaskContext、@task 与 make_context：只用 core 就能单测任务（用户指南 §2、§2.4、§14.1）。"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from pathlib import Path

import pytest

import chongming_task
from chongming_task import ConfigurationError, RetryPolicy, TaskCancelled, Timeout, task
from chongming_task.context import MAX_LOGS, LogEntry, RuntimeContext, TaskContext
from chongming_task.decorators import TaskSpec, task_spec
from chongming_task.testing import FakeClock, TestHandle, make_context


def _handle(ctx: TaskContext) -> TestHandle:
    handle = ctx.test_handle
    assert isinstance(handle, TestHandle)
    return handle


def _in_thread(target: object) -> tuple[threading.Thread, list[BaseException | str]]:
    outcome: list[BaseException | str] = []

    def body() -> None:
        try:
            assert callable(target)
            outcome.append(str(target()))
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, outcome


# -- checkpoint: stop -------------------------------------------------------------------------------


def test_checkpoint_without_request_returns_and_refreshes_heartbeat() -> None:
    clock = FakeClock()
    ctx = make_context(clock=clock)
    before = _handle(ctx).heartbeat
    clock.advance(7)
    ctx.checkpoint()
    assert _handle(ctx).heartbeat == before + 7
    assert ctx.last_heartbeat == clock.monotonic()


def test_stop_request_raises_task_cancelled_with_reason() -> None:
    ctx = make_context()
    assert not ctx.is_stop_requested
    _handle(ctx).request_stop("发布窗口")
    assert ctx.is_stop_requested
    assert ctx.stop_reason == "发布窗口"
    with pytest.raises(TaskCancelled) as caught:
        ctx.checkpoint()
    assert caught.value.reason == "发布窗口"


def test_except_exception_cannot_swallow_a_stop() -> None:
    ctx = make_context()
    swallowed: list[Exception] = []

    def my_task(ctx: TaskContext) -> int:
        rounds = 0
        while True:
            try:
                ctx.checkpoint()
                rounds += 1
                if rounds == 3:
                    _handle(ctx).request_stop("停")
            except Exception as exc:  # 想捕获业务异常的常见写法
                swallowed.append(exc)

    with pytest.raises(TaskCancelled):
        my_task(ctx)
    assert swallowed == []
    assert not issubclass(TaskCancelled, Exception)


# -- checkpoint: pause ------------------------------------------------------------------------------


def test_pause_parks_in_checkpoint_until_resume() -> None:
    ctx = make_context()
    handle = _handle(ctx)
    handle.request_pause()
    assert ctx.is_pause_requested
    passed = threading.Event()

    def body() -> str:
        ctx.checkpoint()
        passed.set()
        return "resumed"

    thread, outcome = _in_thread(body)
    assert handle.wait_parked(2.0)
    assert handle.is_parked
    assert not passed.wait(0.05), "暂停中的检查点不应返回"
    assert handle.confirm_or_cancel_pause() is True
    handle.request_resume()
    thread.join(2.0)
    assert outcome == ["resumed"]
    assert not handle.is_parked
    assert handle.events.parked_count == 1
    assert handle.events.unparked_count == 1


def test_stop_wakes_a_parked_checkpoint() -> None:
    ctx = make_context()
    handle = _handle(ctx)
    handle.request_pause()
    thread, outcome = _in_thread(ctx.checkpoint)
    assert handle.wait_parked(2.0)
    handle.request_stop("停止覆盖暂停")
    thread.join(2.0)
    assert len(outcome) == 1 and isinstance(outcome[0], TaskCancelled)
    assert handle.events.unparked_count == 1


def test_unconfirmed_pause_is_withdrawn_and_does_not_park_later() -> None:
    ctx = make_context()
    handle = _handle(ctx)
    handle.request_pause()
    # 任务还没到检查点：窗口到期时判定"没挂起"，同时撤销请求
    assert handle.confirm_or_cancel_pause() is False
    assert not ctx.is_pause_requested
    ctx.checkpoint()  # 不会再挂起
    assert handle.events.parked_count == 0


def test_async_checkpoint_pause_resume_and_stop() -> None:
    ctx = make_context()
    handle = _handle(ctx)
    ticks: list[int] = []

    async def body() -> str:
        async def ticker() -> None:
            # 挂起期间事件循环没被阻塞：别的协程照常推进
            for index in range(1000):
                ticks.append(index)
                await asyncio.sleep(0.001)

        side = asyncio.create_task(ticker())
        handle.request_pause()
        await ctx.acheckpoint()
        side.cancel()
        while True:
            await ctx.acheckpoint()
            await asyncio.sleep(0.001)

    thread, outcome = _in_thread(lambda: asyncio.run(body()))
    assert handle.wait_parked(2.0)
    seen = len(ticks)
    time.sleep(0.05)
    assert len(ticks) > seen
    handle.request_resume()
    deadline = time.monotonic() + 2
    while handle.is_parked and time.monotonic() < deadline:
        time.sleep(0.001)
    handle.request_stop("异步停止")
    thread.join(2.0)
    assert len(outcome) == 1 and isinstance(outcome[0], TaskCancelled)


# -- heartbeat, progress, logs ----------------------------------------------------------------------


def test_progress_is_recorded_but_does_not_refresh_heartbeat() -> None:
    clock = FakeClock()
    ctx = make_context(clock=clock)
    beat = _handle(ctx).heartbeat
    clock.advance(30)
    ctx.progress(3, total=10, unit="rows", message="第 3 行")
    assert _handle(ctx).heartbeat == beat
    assert ctx.last_progress is not None and ctx.last_progress.describe() == "3/10 rows"
    assert [p.done for p in _handle(ctx).progress_history] == [3]
    ctx.heartbeat.beat()
    assert _handle(ctx).heartbeat == beat + 30 == ctx.heartbeat.last


def test_progress_rejects_bad_values() -> None:
    ctx = make_context()
    with pytest.raises(ConfigurationError):
        ctx.progress(-1)
    with pytest.raises(ConfigurationError):
        ctx.progress(1, total=float("nan"))


def test_log_goes_through_stdlib_logging_with_task_extras(caplog: pytest.LogCaptureFixture) -> None:
    ctx = make_context("job-7", name="抽取", attempt=2)
    with caplog.at_level(logging.DEBUG, logger="chongming_task.task"):
        ctx.log("开始处理")
        ctx.warning("分区为空，跳过")
        ctx.error("写入失败")
        ctx.log("细节", level=logging.DEBUG)
    records = [r for r in caplog.records if r.name == "chongming_task.task.job-7"]
    assert [r.getMessage() for r in records] == ["开始处理", "分区为空，跳过", "写入失败", "细节"]
    assert [r.levelno for r in records] == [logging.INFO, logging.WARNING, logging.ERROR, logging.DEBUG]
    for record in records:
        assert record.__dict__["task_id"] == "job-7"
        assert record.__dict__["task_name"] == "抽取"
        assert record.__dict__["attempt"] == 2
        assert record.pathname == __file__  # 指向调用 ctx.log 的那一行，而不是 context.py
    assert [e.message for e in ctx.logs] == ["开始处理", "分区为空，跳过", "写入失败", "细节"]
    assert ctx.logs[1].level_name == "WARNING"


def test_log_respects_a_logger_configured_for_that_task(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    parent = logging.getLogger("chongming_task.task")
    specific = logging.getLogger("chongming_task.task.loud-task")
    parent.setLevel(logging.WARNING)
    specific.setLevel(logging.DEBUG)
    try:
        make_context("loud-task").log("调试细节", level=logging.DEBUG)
        make_context("quiet-task").log("被父 logger 的级别挡掉", level=logging.DEBUG)
        assert [(r.name, r.getMessage()) for r in caplog.records] == [
            ("chongming_task.task.loud-task", "调试细节")
        ]
    finally:
        specific.setLevel(logging.NOTSET)
        parent.setLevel(logging.NOTSET)


def test_logs_keep_only_the_last_200() -> None:
    ctx = make_context()
    logging.getLogger("chongming_task.task").disabled = True
    try:
        for index in range(MAX_LOGS + 50):
            ctx.log(f"第 {index} 条")
    finally:
        logging.getLogger("chongming_task.task").disabled = False
    assert len(ctx.logs) == 200
    assert ctx.logs[0].message == "第 50 条"
    assert isinstance(ctx.logs[-1], LogEntry)


def test_log_rejects_non_integer_level() -> None:
    with pytest.raises(ConfigurationError):
        make_context().log("x", level="INFO")  # type: ignore[arg-type]


# -- upstream and artifacts -------------------------------------------------------------------------


def test_input_and_upstream() -> None:
    ctx = make_context(upstream={"extract": [1, 2, 3], "none-value": None})
    assert ctx.input("extract") == [1, 2, 3]
    assert ctx.input("none-value", "default") is None  # 上游真的返回了 None
    assert ctx.input("missing", []) == []
    with pytest.raises(KeyError, match="没有成功的上游节点"):
        ctx.input("missing")
    assert dict(ctx.upstream) == {"extract": [1, 2, 3], "none-value": None}
    with pytest.raises(TypeError):
        ctx.upstream["x"] = 1  # type: ignore[index]


def test_artifact_dir_is_per_attempt_and_created_on_demand(tmp_path: Path) -> None:
    first = make_context("job-1", artifact_dir=tmp_path)
    second = make_context("job-1", attempt=2, artifact_dir=tmp_path)
    assert not (tmp_path / "job-1").exists()
    assert first.artifact_dir == tmp_path / "job-1" / "attempt-1"
    assert second.artifact_dir == tmp_path / "job-1" / "attempt-2"
    assert first.artifact_dir.is_dir() and second.artifact_dir.is_dir()


def test_artifact_dir_cannot_escape_the_root(tmp_path: Path) -> None:
    for task_id in ("../evil", "..", "a/b", "a\\b"):
        path = make_context(task_id, artifact_dir=tmp_path).artifact_dir
        assert path.resolve().is_relative_to(tmp_path.resolve())
        assert path.parent.parent == tmp_path


def test_artifact_dir_without_root_says_what_to_do() -> None:
    with pytest.raises(ConfigurationError, match="artifact_dir"):
        _ = make_context().artifact_dir


def test_context_validates_its_inputs() -> None:
    with pytest.raises(ConfigurationError):
        TaskContext("")
    with pytest.raises(ConfigurationError):
        TaskContext("t", attempt=0)
    with pytest.raises(ConfigurationError):
        TaskContext("t", upstream=[1, 2])  # type: ignore[arg-type]


def test_context_shares_a_log_buffer_when_given_one() -> None:
    shared: deque[LogEntry] = deque(maxlen=5)
    first = TaskContext("t", attempt=1, logs=shared)
    second = TaskContext("t", attempt=2, logs=shared)
    first.log("一")
    second.log("二")
    assert [(e.attempt, e.message) for e in second.logs] == [(1, "一"), (2, "二")]


def test_runtime_context_is_the_same_class_and_facade_exports() -> None:
    assert RuntimeContext is TaskContext
    assert chongming_task.TaskContext is TaskContext
    assert chongming_task.RuntimeContext is TaskContext
    assert chongming_task.task is task


# -- @task --------------------------------------------------------------------------------------------


def test_bare_task_decorator_keeps_the_function_and_reads_the_docstring() -> None:
    def extract(ctx: TaskContext, source: str) -> str:
        """从 source 读取数据。

        更多细节。
        """
        return source

    decorated = task(extract)
    assert decorated is extract  # 不包装：模块级函数仍能按名字 pickle
    spec = task_spec(extract)
    assert spec == TaskSpec(name="extract", description="从 source 读取数据。")
    assert extract.__chongming_task__ is spec  # type: ignore[attr-defined]


def test_task_decorator_with_arguments() -> None:
    retry = RetryPolicy(max_attempts=3)
    timeout = Timeout(per_attempt=60)

    @task(name="抽取", tags={"io"}, retry=retry, timeout=timeout, description="自定义描述")
    def extract(ctx: TaskContext) -> None:
        """被覆盖的 docstring。"""

    spec = task_spec(extract)
    assert spec is not None
    assert (spec.name, spec.description, spec.tags, spec.retry, spec.timeout) == (
        "抽取",
        "自定义描述",
        frozenset({"io"}),
        retry,
        timeout,
    )


def test_task_decorator_rejects_bad_arguments() -> None:
    def f(ctx: TaskContext) -> None: ...

    with pytest.raises(ConfigurationError, match="RetryPolicy"):
        task(retry=3)(f)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="Timeout"):
        task(timeout=5)(f)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="tags"):
        task(tags="io")(f)
    with pytest.raises(ConfigurationError, match="tags"):
        task(tags=[1])(f)  # type: ignore[list-item]
    with pytest.raises(ConfigurationError):
        task(name="")(f)
    assert task_spec(f) is None  # 失败的装饰不留下半截规格


def test_task_decorator_refuses_to_decorate_twice() -> None:
    @task
    def f(ctx: TaskContext) -> None: ...

    with pytest.raises(ConfigurationError, match="已经用 @task 装饰过"):
        task(name="other")(f)


def test_task_decorator_has_no_global_registry() -> None:
    import chongming_task.decorators as decorators

    before = set(vars(decorators))

    @task
    def g(ctx: TaskContext) -> None: ...

    assert set(vars(decorators)) == before
    assert task_spec(object()) is None
    assert task_spec(print) is None


def test_make_context_lets_a_task_be_unit_tested_without_an_executor(tmp_path: Path) -> None:
    @task
    def write_parts(ctx: TaskContext, parts: int) -> list[str]:
        """写分区文件。"""
        written = []
        for index in range(parts):
            ctx.checkpoint()
            target = ctx.artifact_dir / f"part-{index}"
            target.write_text(str(ctx.input("seed", 0) + index))
            written.append(target.name)
            ctx.progress(index + 1, total=parts, unit="parts")
        return written

    ctx = make_context("job-9", upstream={"seed": 10}, clock=FakeClock(), artifact_dir=tmp_path)
    assert write_parts(ctx, 3) == ["part-0", "part-1", "part-2"]
    assert (tmp_path / "job-9" / "attempt-1" / "part-2").read_text() == "12"
    assert [p.done for p in _handle(ctx).progress_history] == [1, 2, 3]

    stopped = make_context("job-10", artifact_dir=tmp_path)
    _handle(stopped).request_stop()
    with pytest.raises(TaskCancelled):
        write_parts(stopped, 3)
