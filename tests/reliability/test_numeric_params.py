"""每个公开 API 的数字参数都在边界上检查（issue 22 第 7、8 项）。

修之前：``Controller(lease_ttl=nan|inf|1e308)`` 构造时被接受、提交时才抛 ``ValueError`` / ``OverflowError``；
``pause(timeout=inf)`` 抛 ``OverflowError``；``wait(timeout=nan)`` 被接受；``list_tasks(status="bogus")`` 抛
``ValueError``；``bucket_key="\\ud800"`` 抛 ``UnicodeEncodeError``；``command_poll_interval=nan`` 让跨进程停止
永远送不到，``side_channel_interval=nan`` 让后台循环空转占满 CPU。

现在每个数字参数都经 ``chongming_task.core.numbers`` 这唯一的检查点：NaN、±inf、1e308、负数、bool、字符串、
存储放不下的 2**70 一律是一行中文的 ConfigurationError，并说明允许的范围。
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from chongming_task import (
    BucketPolicy,
    ConcurrencyPolicy,
    ConfigurationError,
    Controller,
    ExponentialBackoff,
    FixedBackoff,
    Progress,
    RetryPolicy,
    SqliteTaskStore,
    TaskContext,
    TaskStatus,
    Timeout,
)
from chongming_task.core.numbers import MAX_SECONDS
from chongming_task.core.records import MAX_PRIORITY, MIN_PRIORITY
from chongming_task.run import TaskRun, run_task

NAN = math.nan
INF = math.inf
BAD_SECONDS: list[object] = [NAN, INF, -INF, 1e308, MAX_SECONDS * 2, -1, True, "1", 10**400]
BAD_INTS: list[object] = [NAN, INF, 1.5, True, "3", 2**70, -(2**70)]


def _noop(ctx: TaskContext) -> str:
    return "ok"


def _spin(ctx: TaskContext) -> None:
    while True:
        ctx.checkpoint()
        time.sleep(0.005)


def _assert_clear(call: Callable[[], object], *needles: str) -> str:
    with pytest.raises(ConfigurationError) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and len(message) <= 300, message
    for needle in needles:
        assert needle in message, message
    return message


@pytest.fixture
def controller() -> Any:
    c = Controller(max_parallel=2)
    c.register("noop", _noop)
    c.register("spin", _spin)
    yield c
    c.close(timeout=5)


# -- Controller 构造 --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["lease_ttl", "graceful_stop", "command_poll_interval", "side_channel_interval"]
)
@pytest.mark.parametrize("bad", BAD_SECONDS, ids=repr)
def test_controller_seconds_refused_at_construction(name: str, bad: object) -> None:
    message = _assert_clear(lambda: Controller(**{name: bad}), name, "秒")
    assert str(MAX_SECONDS) in message  # 说出了允许的范围（含上限）


@pytest.mark.parametrize("name", ["command_poll_interval", "side_channel_interval"])
def test_intervals_below_floor_refused(name: str) -> None:
    _assert_clear(lambda: Controller(**{name: 0.0001}), name, "0.01")


@pytest.mark.parametrize("name", ["max_parallel", "max_parallel_per_bucket", "keep_finished", "num_buckets"])
@pytest.mark.parametrize("bad", [*BAD_INTS, -1], ids=repr)
def test_controller_ints_refused(name: str, bad: object) -> None:
    _assert_clear(lambda: Controller(**{name: bad}), name)


def test_lease_ttl_huge_refused_with_a_store(tmp_path: Path) -> None:
    """修之前：构造时接受，第一次 submit 时 timedelta(seconds=1e308) 抛 OverflowError。"""
    store = SqliteTaskStore(tmp_path / "t.db")
    for bad in (NAN, INF, 1e308):
        _assert_clear(lambda bad=bad: Controller(store=store, lease_ttl=bad), "lease_ttl")
    store.close()


# -- submit / 控制 / 查询 -----------------------------------------------------------------------------


def test_submit_parameters(controller: Controller) -> None:
    for bad in BAD_INTS:
        _assert_clear(lambda bad=bad: controller.submit("noop", priority=bad), "priority")
    _assert_clear(lambda: controller.submit("noop", bucket_key="\ud800"), "bucket_key")
    assert controller.submit("noop", priority=MAX_PRIORITY).wait(timeout=10).ok


@pytest.mark.parametrize("bad", [b for b in BAD_SECONDS if b != -1], ids=repr)
def test_control_timeouts_refused(controller: Controller, bad: object) -> None:
    run = controller.submit("spin")
    _assert_clear(lambda: controller.pause(run.task_id, timeout=bad), "timeout")  # type: ignore[arg-type]
    _assert_clear(lambda: controller.wait(run.task_id, timeout=bad), "timeout")  # type: ignore[arg-type]
    _assert_clear(lambda: controller.wait_all(timeout=bad), "timeout")  # type: ignore[arg-type]
    _assert_clear(lambda: run.pause(timeout=bad), "timeout")  # type: ignore[arg-type]
    _assert_clear(lambda: run.wait(timeout=bad), "timeout")  # type: ignore[arg-type]
    _assert_clear(lambda: controller.close(timeout=bad), "timeout")  # type: ignore[arg-type]
    assert not controller.closed
    controller.stop(run.task_id)
    assert run.wait(timeout=10).status is TaskStatus.STOPPED


def test_negative_wait_refused_but_zero_allowed(controller: Controller) -> None:
    run = controller.submit("spin")
    _assert_clear(lambda: run.wait(timeout=-1), "timeout")
    with pytest.raises(TimeoutError):
        run.wait(timeout=0)
    controller.stop(run.task_id)
    run.wait(timeout=10)


def test_list_tasks_unknown_status(controller: Controller) -> None:
    _assert_clear(lambda: controller.list_tasks(status="bogus"), "bogus", "queued")
    _assert_clear(lambda: controller.list_tasks(status=["running", "bogus"]), "bogus")
    _assert_clear(lambda: controller.prune(-1), "keep_terminal")
    _assert_clear(lambda: controller.prune(2**70), "keep_terminal")


# -- TaskRun / run_task -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", BAD_SECONDS, ids=repr)
def test_taskrun_seconds(bad: object) -> None:
    _assert_clear(lambda: TaskRun(_noop, graceful_stop=bad), "graceful_stop")  # type: ignore[arg-type]
    _assert_clear(lambda: TaskRun(_noop, pause_timeout=bad), "pause_timeout")  # type: ignore[arg-type]
    _assert_clear(lambda: run_task(_noop, graceful_stop=bad), "graceful_stop")  # type: ignore[arg-type]


def test_taskrun_priority() -> None:
    for bad in BAD_INTS:
        _assert_clear(lambda bad=bad: TaskRun(_noop, priority=bad), "priority")  # type: ignore[arg-type]


# -- 策略 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", BAD_SECONDS, ids=repr)
def test_policy_seconds(bad: object) -> None:
    for field in ("start", "per_attempt", "idle"):
        _assert_clear(lambda field=field: Timeout(**{field: bad}), f"Timeout.{field}")
    if bad in (1e308, MAX_SECONDS * 2):
        # 退避是纯值对象：算出的等待由运行时夹到 10 年以内（见 test_huge_backoff_is_clamped），所以照样接受
        assert FixedBackoff(bad).delay(1) == bad  # type: ignore[arg-type]
        return
    _assert_clear(lambda: FixedBackoff(bad), "FixedBackoff.delay")  # type: ignore[arg-type]
    _assert_clear(lambda: ExponentialBackoff(base=bad), "ExponentialBackoff.base")  # type: ignore[arg-type]
    _assert_clear(lambda: ExponentialBackoff(max_delay=bad), "max_delay")  # type: ignore[arg-type]


def test_huge_backoff_is_clamped() -> None:
    """修之前：重试等待 1e308 秒在 timedelta(seconds=...) 里抛 OverflowError，任务卡在 running。"""

    def flaky(ctx: TaskContext) -> None:
        raise RuntimeError("boom")

    run = TaskRun(flaky, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(1e308)))
    run.start()
    deadline = time.monotonic() + 10
    while run.status is not TaskStatus.RETRY_WAIT and time.monotonic() < deadline:
        time.sleep(0.01)
    assert run.status is TaskStatus.RETRY_WAIT
    retry_at = run.snapshot.retry_at
    assert retry_at is not None and retry_at.year >= 2030
    assert run.stop()
    assert run.wait(timeout=5).status is TaskStatus.STOPPED


@pytest.mark.parametrize("bad", [*BAD_INTS, 0, -1], ids=repr)
def test_policy_ints(bad: object) -> None:
    _assert_clear(lambda: RetryPolicy(max_attempts=bad), "max_attempts")  # type: ignore[arg-type]
    _assert_clear(lambda: ConcurrencyPolicy(max_parallel=bad), "max_parallel")  # type: ignore[arg-type]
    _assert_clear(lambda: ConcurrencyPolicy(limits={"gpu": bad}), "gpu")  # type: ignore[dict-item]
    _assert_clear(lambda: BucketPolicy(bad), "num_buckets")  # type: ignore[arg-type]


def test_policy_other_numbers() -> None:
    for bad in (NAN, INF, 0.5, True):
        _assert_clear(lambda bad=bad: ExponentialBackoff(factor=bad), "factor")
    for bad in (NAN, INF, 1.5, 2**70, True):
        _assert_clear(lambda bad=bad: ConcurrencyPolicy(priority=bad), "priority")
    for bad in (NAN, INF, -1, True):
        _assert_clear(lambda bad=bad: Progress(done=bad), "Progress.done")
    _assert_clear(lambda: BucketPolicy().bucket_for("\ud800"), "bucket_key")
    # 边界上的合法值照常接受
    assert Timeout(per_attempt=MAX_SECONDS).per_attempt == MAX_SECONDS
    assert FixedBackoff(0).delay(1) == 0.0
    assert ConcurrencyPolicy(priority=MIN_PRIORITY).priority == MIN_PRIORITY


# -- 22.8：NaN 间隔的实际症状 -------------------------------------------------------------------------


def test_valid_intervals_keep_the_background_loop_idle(tmp_path: Path) -> None:
    """修之前 side_channel_interval=nan 让后台循环空转（100 % CPU）；现在 NaN 在构造时就被拒绝。

    这里量合法的最小间隔下后台循环的 CPU 占用：它必须睡着，而不是空转。
    """
    store = SqliteTaskStore(tmp_path / "t.db")
    for name in ("side_channel_interval", "command_poll_interval"):
        _assert_clear(lambda name=name: Controller(store=store, **{name: NAN}), name)
    c = Controller(store=store, side_channel_interval=0.05, command_poll_interval=0.05)
    c.register("spin", _spin)
    try:
        run = c.submit("spin")
        loop = next(t for t in threading.enumerate() if t.name.startswith("chongming-controller["))
        assert loop.ident is not None
        clock_id = time.pthread_getcpuclockid(loop.ident)  # 要的是 pthread_t（ident），不是内核 tid
        cpu_before = time.clock_gettime(clock_id)
        time.sleep(1.0)
        cpu_used = time.clock_gettime(clock_id) - cpu_before
        assert cpu_used < 0.5, f"后台循环 1 秒里用了 {cpu_used:.2f} 秒 CPU（空转）"
        # 跨进程停止照常送达（指令轮询在转）
        other = Controller(store=store)
        assert other.stop(run.task_id)
        assert run.wait(timeout=10).status is TaskStatus.STOPPED
        other.close(timeout=2)
    finally:
        c.close(timeout=5)
        store.close()
    assert os.getpid() > 0
