"""ProcessExecutor（用户指南 §7.3）：真的停得住、崩溃隔离、提交时拒绝不可 pickle 的东西。

任务函数来自 ``chongming_runtime_test_tasks``（模块级，子进程能按名字 import；见 conftest.py）。
"""

from __future__ import annotations

import logging
import os
import pathlib
import subprocess
import sys
import threading
from collections.abc import Callable

import chongming_runtime_test_tasks as tasks
import pytest
from chongming_runtime_test_support import wait_until

from chongming_task import ConfigurationError, FailureKind, TaskContext, TaskStatus, Timeout
from chongming_task.run import TaskRun, run_task
from chongming_task.runtime.executors import ProcessExecutor

S = TaskStatus

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="这些用例按 POSIX 信号语义断言")


@pytest.fixture(scope="module")
def executor() -> ProcessExecutor:
    return ProcessExecutor()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def statuses(run: TaskRun) -> list[str]:
    return [t.to_status.value for t in run.transitions]


def test_runs_in_a_child_process_and_records_its_pid(executor: ProcessExecutor) -> None:
    outcome = run_task(tasks.add, 2, b=3, executor=executor)
    assert outcome.ok
    assert outcome.value["sum"] == 5
    child = outcome.value["pid"]
    assert child != os.getpid()
    assert outcome.snapshot.pid == child
    assert outcome.snapshot.executor == "process"
    assert not pid_alive(child)


def test_default_start_method_is_never_fork(executor: ProcessExecutor) -> None:
    assert executor.start_method in ("forkserver", "spawn")
    with pytest.raises(ConfigurationError, match="fork"):
        ProcessExecutor(start_method="fork")


def test_cooperative_task_is_stopped(executor: ProcessExecutor) -> None:
    run = TaskRun(tasks.cooperative_loop, executor=executor)
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    pid = run.snapshot.pid
    assert pid is not None and pid != os.getpid()
    run.stop(reason="发布窗口")
    outcome = run.wait(10)
    assert outcome.status is S.STOPPED
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.CANCELLED
    assert statuses(run)[-2:] == ["stopping", "stopped"]
    assert not pid_alive(pid)


def test_graceful_return_is_succeeded_with_value_and_progress_logs_are_forwarded(
    executor: ProcessExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="chongming_task.task"):
        run = TaskRun(tasks.graceful_worker, task_id="proc-worker", executor=executor)
        run.start()
        wait_until(lambda: run.snapshot.progress is not None)
        run.stop()
        outcome = run.wait(10)
    assert outcome.ok and isinstance(outcome.value, int) and outcome.value >= 1
    assert statuses(run)[-2:] == ["stopping", "succeeded"]
    assert outcome.snapshot.progress is not None and outcome.snapshot.progress.unit == "batch"
    records = [r for r in caplog.records if r.name == "chongming_task.task.proc-worker"]
    assert len(records) == 1 and "收到停止请求" in records[0].getMessage()
    assert (records[0].__dict__["task_id"], records[0].__dict__["attempt"]) == ("proc-worker", 1)
    assert [e.message for e in run.logs] == [records[0].getMessage()]


def test_non_cooperative_process_is_killed_and_recorded_stopped(executor: ProcessExecutor) -> None:
    run = TaskRun(tasks.stubborn, executor=executor, graceful_stop=0.2)
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    pid = run.snapshot.pid
    assert pid is not None
    run.stop(reason="发布窗口")
    outcome = run.wait(10)
    assert outcome.status is S.STOPPED  # 不是 lost：子进程真的被终止了
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.CANCELLED
    assert "SIGTERM" in outcome.failure.message
    assert outcome.snapshot.pid == pid
    assert not pid_alive(pid)


def test_timeout_kills_a_non_cooperative_child_and_records_timeout(executor: ProcessExecutor) -> None:
    outcome = run_task(tasks.stubborn, executor=executor, timeout=Timeout(per_attempt=0.3), graceful_stop=0.1)
    assert outcome.status is S.FAILED
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.TIMEOUT_ATTEMPT
    assert "子进程已被终止" in outcome.failure.message


@pytest.mark.parametrize(
    ("fn", "args", "kind", "fragment"),
    [
        (tasks.abort_now, (), FailureKind.EXCEPTION, "SIGABRT"),
        (tasks.segfault, (), FailureKind.EXCEPTION, "SIGSEGV"),
        (tasks.exit_code, (3,), FailureKind.NONZERO_EXIT, "退出码 3"),
    ],
)
def test_crashes_are_isolated_and_reported(
    executor: ProcessExecutor,
    fn: Callable[..., object],
    args: tuple[object, ...],
    kind: FailureKind,
    fragment: str,
) -> None:
    outcome = run_task(fn, *args, executor=executor)
    assert outcome.status is S.FAILED
    assert outcome.failure is not None
    assert outcome.failure.kind is kind
    assert fragment in outcome.failure.message
    # 监督进程毫发无损：还能接着跑任务
    assert run_task(tasks.add, 1, executor=executor).value["sum"] == 1


def test_exceptions_and_invalid_results_cross_the_boundary(executor: ProcessExecutor) -> None:
    raised = run_task(tasks.raise_value_error, executor=executor)
    assert raised.failure is not None
    assert raised.failure.kind is FailureKind.EXCEPTION
    assert raised.failure.exc_type == "ValueError"
    assert "坏数据" in raised.failure.message
    assert raised.failure.traceback is not None and "raise_value_error" in raised.failure.traceback

    invalid = run_task(tasks.return_set, executor=executor)
    assert invalid.failure is not None and invalid.failure.kind is FailureKind.RESULT_INVALID


def test_pause_and_resume_cross_the_process_boundary(executor: ProcessExecutor) -> None:
    run = TaskRun(tasks.cooperative_loop, executor=executor)
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    assert run.pause(timeout=5) is True
    assert run.status is S.PAUSED
    assert run.resume() is True
    run.stop()
    assert run.wait(10).status is S.STOPPED
    assert statuses(run)[3:] == ["pausing", "paused", "running", "stopping", "stopped"]


def test_pause_of_a_child_that_never_checkpoints_is_rolled_back(executor: ProcessExecutor) -> None:
    run = TaskRun(tasks.stubborn, executor=executor, graceful_stop=0.1)
    run.start()
    wait_until(lambda: run.status is S.RUNNING)
    assert run.pause(timeout=0.1) is False
    assert run.status is S.RUNNING
    assert run.transitions[-1].trigger == "runtime:pause_aborted"
    run.stop()
    assert run.wait(10).status is S.STOPPED


def test_upstream_reaches_the_child(executor: ProcessExecutor) -> None:
    run = TaskRun(tasks.report, executor=executor, upstream={"up": "从上游来"})
    run.start()
    outcome = run.wait(10)
    assert outcome.value == "从上游来"
    assert outcome.snapshot.progress is not None and outcome.snapshot.progress.describe() == "3/10 rows"
    assert [e.level_name for e in run.logs] == ["INFO", "WARNING"]


def test_unpicklable_callables_and_arguments_are_refused_at_submit(executor: ProcessExecutor) -> None:
    with pytest.raises(ConfigurationError, match="模块级函数"):
        TaskRun(lambda ctx: None, executor=executor)

    def local_task(ctx: TaskContext) -> None: ...

    with pytest.raises(ConfigurationError, match="__main__"):
        TaskRun(local_task, executor=executor)
    with pytest.raises(ConfigurationError, match="pickle"):
        TaskRun(tasks.add, (threading.Lock(),), executor=executor)
    with pytest.raises(ConfigurationError, match="pickle"):
        TaskRun(tasks.report, executor=executor, upstream={"up": threading.Lock()})


MAIN_GUARD_SCRIPT = """
import sys

from chongming_task import ConfigurationError, ProcessExecutor, run_task, task


@task
def top_level(ctx, n: int) -> int:
    return n * 2


if {guard}:

    @task
    def inside_guard(ctx, n: int) -> int:
        return n + 1

    fn = inside_guard if sys.argv[1] == "inside" else top_level
    try:
        outcome = run_task(fn, 20, executor=ProcessExecutor())
    except ConfigurationError as exc:
        print("REFUSED", exc)
        raise SystemExit(2)
    print("OUTCOME", outcome.status.value, outcome.value)
"""


@pytest.mark.parametrize("guard", ['__name__ == "__main__"', "'__main__' == __name__"])
def test_a_function_defined_under_the_main_guard_is_refused_at_submit(
    guard: str, tmp_path: pathlib.Path
) -> None:
    """用户指南 §7.3 约束 2：守卫里定义的函数子进程找不到——提交时就说清楚，而不是一次 nonzero_exit。"""
    script = tmp_path / "my_script.py"
    script.write_text(MAIN_GUARD_SCRIPT.format(guard=guard), encoding="utf-8")

    def run(which: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), which], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )

    refused = run("inside")
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert "REFUSED" in refused.stdout and "inside_guard" in refused.stdout
    assert "my_script.py" in refused.stdout and "守卫之外" in refused.stdout
    assert "Traceback" not in refused.stderr, (
        refused.stderr
    )  # 没有启动子进程，也就没有 multiprocessing 的堆栈
    # 守卫之外的模块级函数照常在子进程里跑
    fine = run("top")
    assert fine.returncode == 0, (fine.stdout, fine.stderr)
    assert "OUTCOME succeeded 40" in fine.stdout


def test_a_function_from_a_main_module_without_a_file_is_refused(tmp_path: pathlib.Path) -> None:
    code = (
        "from chongming_task import ConfigurationError, ProcessExecutor, run_task\n"
        "def job(ctx):\n    return 1\n"
        "try:\n    run_task(job, executor=ProcessExecutor())\n"
        "except ConfigurationError as exc:\n    print('REFUSED', exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert "REFUSED" in result.stdout and ".py 模块" in result.stdout, (result.stdout, result.stderr)


def test_idle_shorter_than_the_heartbeat_forwarding_allows_is_refused_at_submit(
    executor: ProcessExecutor,
) -> None:
    """issue 22.10：心跳每 0.2 秒转发一次，idle=0.1 曾让 10/10 个健康任务判 idle 超时。提交时就拒绝。"""
    from chongming_task import Controller
    from chongming_task.runtime.executors.process import MIN_IDLE_TIMEOUT

    assert MIN_IDLE_TIMEOUT == 1.0
    for idle in (0.05, 0.1, 0.2, 0.99):
        with pytest.raises(ConfigurationError, match="idle 超时至少 1 秒"):
            TaskRun(tasks.cooperative_loop, executor=executor, timeout=Timeout(idle=idle))
    # 线程执行器的心跳不过进程边界，不受这条限制
    TaskRun(tasks.cooperative_loop, timeout=Timeout(idle=0.1))
    # Controller 提交（登记时带的超时）同样在提交那一刻拒绝
    with Controller(executor=executor) as controller:
        controller.register("loop", tasks.cooperative_loop, timeout=Timeout(idle=0.1))
        with pytest.raises(ConfigurationError, match="ThreadExecutor"):
            controller.submit("loop")


def test_the_minimum_idle_keeps_healthy_children_alive_and_still_catches_silent_ones(
    executor: ProcessExecutor,
) -> None:
    from chongming_task.runtime.executors.process import MIN_IDLE_TIMEOUT

    healthy = [
        TaskRun(
            tasks.cooperative_loop,
            (0.01,),
            executor=executor,
            timeout=Timeout(idle=MIN_IDLE_TIMEOUT, per_attempt=2.5),
            graceful_stop=0.5,
        )
        for _ in range(4)
    ]
    silent = TaskRun(
        tasks.stubborn, executor=executor, timeout=Timeout(idle=MIN_IDLE_TIMEOUT), graceful_stop=0.1
    )
    for run in [*healthy, silent]:
        run.start()
    for run in healthy:  # 跑满 per_attempt 才结束：idle 从未误判
        outcome = run.wait(timeout=30)
        assert outcome.failure is not None and outcome.failure.kind is FailureKind.TIMEOUT_ATTEMPT, outcome
    outcome = silent.wait(timeout=30)
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.TIMEOUT_IDLE
