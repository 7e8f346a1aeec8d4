"""``make_context``：不借助任何执行器，单测自己的任务（用户指南 §14.1）。

返回一个**真正的** TaskContext（与执行器注入的同一个类），外加挂在 ``ctx.test_handle`` 上的
控制把手，可以请求停止 / 暂停 / 恢复，并观察进度、日志与心跳::

    from chongming_task.testing import FakeClock, make_context

    ctx = make_context(task_id="t1", clock=FakeClock())
    ctx.test_handle.request_stop("测试")
    with pytest.raises(TaskCancelled):
        my_task(ctx, "s3://bucket/x")
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from chongming_task.clock import Clock
from chongming_task.context import ContextEvents, ContextHandle, TaskContext
from chongming_task.models import Progress


class RecordingEvents(ContextEvents):
    """把上下文报告的事件记下来，供断言。"""

    def __init__(self) -> None:
        self.progress_history: list[Progress] = []
        self.parked_count = 0
        self.unparked_count = 0

    def progress(self, progress: Progress) -> None:
        self.progress_history.append(progress)

    def parked(self) -> None:
        self.parked_count += 1

    def unparked(self) -> None:
        self.unparked_count += 1


class TestHandle(ContextHandle):
    """``ctx.test_handle``：ContextHandle 加上事件记录。"""

    __test__ = False  # 名字以 Test 开头，别让 pytest 把它当成测试类收集
    __slots__ = ("events",)

    def __init__(self, ctx: TaskContext, events: RecordingEvents) -> None:
        super().__init__(ctx)
        self.events = events

    @property
    def progress_history(self) -> list[Progress]:
        return list(self.events.progress_history)


def make_context(
    task_id: str = "test-task",
    *,
    name: str | None = None,
    attempt: int = 1,
    upstream: Mapping[str, Any] | None = None,
    clock: Clock | None = None,
    artifact_dir: str | Path | None = None,
) -> TaskContext:
    """造一个用于单测的 TaskContext；控制把手在 ``ctx.test_handle``（类型 :class:`TestHandle`）。

    ``artifact_dir`` 是产物**根**目录：``ctx.artifact_dir`` 为 ``<root>/<task_id>/attempt-<n>/``，
    与执行器里的行为一致。
    """
    events = RecordingEvents()
    ctx = TaskContext(
        task_id,
        name=name,
        attempt=attempt,
        clock=clock,
        upstream=upstream,
        artifact_root=artifact_dir,
        events=events,
    )
    ctx.test_handle = TestHandle(ctx, events)
    return ctx


__all__ = ["RecordingEvents", "TestHandle", "make_context"]
