"""pytest 插件（用户指南 §14.4）：经 ``pytest11`` 入口点自动加载，夹具在用户的测试里直接可用。

用 pytester 在临时目录里跑真正的 pytest 会话：那里没有本仓库的 conftest，用户看到的就是插件本身。
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

pytest_plugins = ["pytester"]

USES_EVERY_FIXTURE = """
import pytest

from chongming_task import StateMachine, TaskContext, TaskStatus
from chongming_task.testing import FakeClock
from chongming_task.stores.memory import InMemoryTaskStore

SEEN = []


def count(ctx: TaskContext, n: int) -> int:
    for i in range(n):
        ctx.checkpoint()
        ctx.progress(i + 1, total=n)
    return n


def test_fake_clock(fake_clock):
    assert isinstance(fake_clock, FakeClock)
    fake_clock.advance(600)
    assert fake_clock.elapsed == 600


def test_task_context(task_context):
    assert count(task_context, 3) == 3
    assert [p.done for p in task_context.test_handle.progress_history] == [1, 2, 3]
    assert task_context.artifact_dir.exists()


def test_memory_store(memory_store):
    assert isinstance(memory_store, InMemoryTaskStore)
    machine = StateMachine.create("t1", "job")
    machine.mark_queued()
    memory_store.create(machine.snapshot, machine.transitions)
    assert memory_store.get("t1").status is TaskStatus.QUEUED


def test_controller_runs_a_task(controller):
    SEEN.append(controller)
    controller.register("count", count)
    assert controller.store is None
    assert controller.submit("count", 2).wait(timeout=10).value == 2


def test_controller_was_closed_after_the_previous_test():
    assert len(SEEN) == 1 and SEEN[0].closed


def test_task_store(task_store):
    assert task_store.get("t1") is None  # 每个测试一个空存储
    machine = StateMachine.create("t1", "job")
    machine.mark_queued()
    task_store.create(machine.snapshot, machine.transitions)
    assert task_store.get("t1").status is TaskStatus.QUEUED
"""


def test_the_plugin_is_registered_through_pytest11() -> None:
    found = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert found.get("chongming_task") == "chongming_task.testing.pytest_plugin"


def test_every_fixture_works_in_a_fresh_pytest_session(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user_tasks=USES_EVERY_FIXTURE)
    result = pytester.runpytest("-v", "-rs", "-p", "no:cacheprovider")
    postgres = bool(os.environ.get("CHONGMING_TEST_POSTGRES", "").strip())
    # 6 个测试，task_store 按 memory / sqlite / postgres 参数化（三个后端在本仓库里都装了）
    result.assert_outcomes(passed=8 if postgres else 7, skipped=0 if postgres else 1)
    result.stdout.fnmatch_lines(
        [
            "*test_task_store?memory? PASSED*",
            "*test_task_store?sqlite? PASSED*",
            "*test_task_store?postgres? PASSED*" if postgres else "*test_task_store?postgres? SKIPPED*",
        ]
    )
    if not postgres:
        result.stdout.fnmatch_lines(["*CHONGMING_TEST_POSTGRES*"])


def test_controller_fixture_skips_with_the_pip_hint_without_the_runtime(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import sys

        import pytest


        @pytest.fixture(autouse=True)
        def no_runtime(monkeypatch):
            # 模拟只装了 chongming-task-core 的环境：运行时模块 import 不到
            monkeypatch.setitem(sys.modules, "chongming_task.controller", None)
        """
    )
    pytester.makepyfile("def test_needs_runtime(controller):\n    raise AssertionError('不该运行')\n")
    result = pytester.runpytest("-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*pip install chongming-task-runtime*"])


def test_a_project_fixture_with_the_same_name_wins(pytester: pytest.Pytester) -> None:
    """用户自己（或本仓库）的 conftest 里同名夹具优先：插件不会悄悄改掉已有的测试。"""
    pytester.makeconftest("import pytest\n\n@pytest.fixture\ndef controller():\n    return 'mine'\n")
    pytester.makepyfile("def test_own(controller):\n    assert controller == 'mine'\n")
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_importing_chongming_task_never_imports_pytest_or_the_plugin() -> None:
    code = (
        "import sys, chongming_task, chongming_task.testing\n"
        "assert 'pytest' not in sys.modules, 'pytest'\n"
        "assert 'chongming_task.testing.pytest_plugin' not in sys.modules\n"
        "assert 'chongming_task.controller' not in sys.modules\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
