"""过深的 JSON 值（issue 22.4）：标准库的 json / pickle 是递归实现，嵌套到上千层就抛 RecursionError。

* 任务返回 2,000 层嵌套的值：曾让执行任务的线程死掉、任务永远 ``running``、槽位泄漏；现在落
  ``failed/result_invalid``，Controller 的槽位回到 0。
* 命令行 ``--arg`` 带 20,000 层的 JSON：曾是 RecursionError 的"内部错误"；现在一行中文、退出码 1、什么也没跑。
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from prefork import python_run
from process_tasks import deep_result, nested

from chongming_task import Controller, FailureKind, ProcessExecutor, TaskStatus, run_task
from chongming_task.core.json_depth import MAX_JSON_DEPTH, check_json_depth, json_depth_exceeds, loads_bounded
from chongming_task.errors import ConfigurationError
from chongming_task.runtime.executors.inline import InlineExecutor
from chongming_task.runtime.executors.thread import ThreadExecutor


def test_depth_measure_is_exact_and_not_recursive() -> None:
    assert not json_depth_exceeds(nested(MAX_JSON_DEPTH))
    assert json_depth_exceeds(nested(MAX_JSON_DEPTH + 1))
    assert not json_depth_exceeds({"a": [1, {"b": None}]}, limit=3)
    assert json_depth_exceeds({"a": [1, {"b": []}]}, limit=3)
    assert not json_depth_exceeds("标量", limit=0)
    # 100,000 层也只是一次循环，不碰解释器的递归上限
    assert json_depth_exceeds(nested(100_000))
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    assert json_depth_exceeds(cyclic)  # 自引用也会停下
    with pytest.raises(ConfigurationError, match="嵌套太深"):
        check_json_depth(nested(MAX_JSON_DEPTH + 1), what="x")
    with pytest.raises(ConfigurationError, match="嵌套太深"):
        loads_bounded("[" * 20_000 + "]" * 20_000, what="x")
    assert loads_bounded("[[1]]", what="x") == [[1]]
    with pytest.raises(ValueError):
        loads_bounded("不是 JSON", what="x")


def test_depth_measure_agrees_with_the_recursive_definition() -> None:
    """量深度的循环只把容器入栈（标量在父容器里就地略过）：对随机的嵌套值、各个上限，结论与按定义
    递归算出的深度（标量 0 层，容器 = 1 + 子项的最大深度）逐一相同。"""
    import random

    def depth(value: Any) -> int:
        if isinstance(value, dict):
            return 1 + max((depth(child) for child in value.values()), default=0)
        if isinstance(value, (list, tuple)):
            return 1 + max((depth(child) for child in value), default=0)
        return 0

    rng = random.Random(11)

    def build(level: int) -> Any:
        roll = rng.random()
        if level > 7 or roll < 0.35:
            return rng.choice([1, "s", None, 2.5, True])
        if roll < 0.65:
            return [build(level + 1) for _ in range(rng.randint(0, 4))]
        if roll < 0.8:
            return tuple(build(level + 1) for _ in range(rng.randint(0, 3)))
        return {str(index): build(level + 1) for index in range(rng.randint(0, 4))}

    for _ in range(3000):
        value = build(0)
        measured = depth(value)
        for limit in range(10):
            assert json_depth_exceeds(value, limit) == (measured > limit), (value, limit)


@pytest.mark.parametrize("executor", [InlineExecutor(), ThreadExecutor(), ProcessExecutor()], ids=repr)
def test_a_2000_deep_result_is_result_invalid_not_a_dead_worker(executor: Any) -> None:
    outcome = run_task(deep_result, executor=executor)
    assert outcome.status is TaskStatus.FAILED
    assert outcome.failure is not None
    assert outcome.failure.kind is FailureKind.RESULT_INVALID
    assert "嵌套太深" in outcome.failure.message and outcome.failure.retryable is False
    assert "RecursionError" not in outcome.failure.message


def test_an_unexpected_error_in_the_result_check_is_result_invalid() -> None:
    class Hostile(dict[str, int]):
        def items(self) -> Any:  # 编码器遍历时抛出既不是 TypeError 也不是 ValueError 的异常
            raise RuntimeError("遍历时爆炸")

    outcome = run_task(lambda ctx: Hostile(a=1), executor=InlineExecutor())
    assert outcome.status is TaskStatus.FAILED
    assert outcome.failure is not None and outcome.failure.kind is FailureKind.RESULT_INVALID


def test_controller_slot_comes_back_after_a_deep_result() -> None:
    with Controller(max_parallel=1) as controller:
        controller.register("deep_result", deep_result)
        first = controller.submit("deep_result")
        second = controller.submit("deep_result", depth=3)
        assert first.wait(timeout=30).failure.kind is FailureKind.RESULT_INVALID  # type: ignore[union-attr]
        # 只有一个槽位：第一个任务的槽位若泄漏，第二个永远排队
        assert second.wait(timeout=30).status is TaskStatus.SUCCEEDED
        assert controller.active_count == 0


def test_cli_arg_with_20000_deep_json_is_one_clear_line(tmp_path: Path) -> None:
    (tmp_path / "deep_tasks.py").write_text(
        "from chongming_task import TaskContext\n\n\n"
        "def echo(ctx: TaskContext, data: object) -> str:\n"
        "    open('ran.txt', 'w').write('ran')\n"
        "    return 'ok'\n\n\n"
        "def register(controller):\n"
        "    controller.register(echo)\n",
        encoding="utf-8",
    )
    exe = shutil.which("chongming-task", path=os.path.dirname(sys.executable)) or "chongming-task"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_TASK_")}
    env["PYTHONPATH"] = str(tmp_path)
    deep = "[" * 20_000 + "]" * 20_000
    # 控制台脚本经预导入的模板进程 fork 着跑（tests/support/prefork.py）。
    result = python_run(
        [exe, "--store", "memory://", "run", "--tasks", "deep_tasks", "echo", "--arg", f"data={deep}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "RecursionError" not in result.stderr, result.stderr[-2000:]
    assert any("嵌套太深" in line for line in lines), result.stderr[-2000:]
    assert not (tmp_path / "ran.txt").exists()
