"""OpenTelemetry 追踪（用户指南 §15.3）：SDK 的内存导出器检查父子关系、属性、事件与 ERROR 状态。"""

from __future__ import annotations

import sys
import threading
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from chongming_task import ConfigurationError, Controller, FixedBackoff, RetryPolicy, TaskStatus
from chongming_task.tracing import instrument


@pytest.fixture
def otel() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()  # 不设成全局：instrument 显式拿它
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def add(ctx: Any, a: int, b: int) -> int:
    return a + b


def boom(ctx: Any) -> None:
    raise ValueError("坏输入")


def test_one_span_per_attempt_parented_on_the_span_current_at_submit(
    otel: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = otel
    tracer = provider.get_tracer("etl")
    with Controller(num_buckets=16) as controller:
        instrument(controller, tracer_provider=provider)
        controller.register("add", add)
        controller.register("boom", boom, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0.01)))
        with tracer.start_as_current_span("etl-run") as parent:
            ok = controller.submit("add", 1, 2, task_id="t-ok", bucket_key="orders")
            bad = controller.submit("boom", task_id="t-bad")
        outside = controller.submit("add", 3, 4, task_id="t-orphan")  # 提交时没有当前 span
        for run in (ok, bad, outside):
            run.wait(timeout=10)
        controller.flush_events(timeout=5)
    spans = {(s.attributes["messaging.message.id"], s.attributes["chongming_task.attempt"]): s
             for s in exporter.get_finished_spans() if s.name.startswith("process ")}  # fmt: skip
    assert set(spans) == {("t-ok", 1), ("t-bad", 1), ("t-bad", 2), ("t-orphan", 1)}
    parent_ctx = parent.get_span_context()
    for key in [("t-ok", 1), ("t-bad", 1), ("t-bad", 2)]:
        span = spans[key]
        assert span.parent is not None and span.parent.span_id == parent_ctx.span_id, key
        assert span.context.trace_id == parent_ctx.trace_id
        assert span.kind is SpanKind.CONSUMER
    assert spans[("t-orphan", 1)].parent is None
    good = spans[("t-ok", 1)]
    assert good.name == "process add"
    attrs = dict(good.attributes)
    assert attrs["messaging.operation.type"] == "process"
    assert attrs["chongming_task.name"] == "add"
    assert attrs["chongming_task.status"] == "succeeded"
    assert attrs["chongming_task.bucket"] == ok.snapshot.bucket
    assert "chongming_task.failure_kind" not in attrs
    assert good.status.status_code is StatusCode.UNSET
    for attempt, status in ((1, "retry_wait"), (2, "failed")):
        span = spans[("t-bad", attempt)]
        assert span.attributes["chongming_task.status"] == status
        assert span.attributes["chongming_task.failure_kind"] == "exception"
        assert span.status.status_code is StatusCode.ERROR
        assert "坏输入" in (span.status.description or "")


def test_pause_resume_stop_are_span_events(otel: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = otel

    def looping(ctx: Any) -> None:
        while True:
            ctx.checkpoint()
            threading.Event().wait(0.002)

    with Controller() as controller:
        instrument(controller, tracer_provider=provider)
        controller.register("looping", looping)
        run = controller.submit("looping", task_id="t-loop")
        for _ in range(500):
            if run.status is TaskStatus.RUNNING:
                break
            threading.Event().wait(0.01)
        assert controller.pause("t-loop", timeout=5)
        assert controller.resume("t-loop")
        controller.stop("t-loop", reason="下班")
        assert run.wait(timeout=10).status is TaskStatus.STOPPED
        controller.flush_events(timeout=5)
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "process looping"]
    assert [e.name for e in span.events] == ["pause", "resume", "stop"]
    assert span.events[2].attributes["chongming_task.reason"] == "下班"
    assert span.attributes["chongming_task.status"] == "stopped"
    assert span.status.status_code is not StatusCode.ERROR  # 被要求停下不是失败


def test_missing_opentelemetry_says_which_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.trace", None)
    with (
        Controller() as controller,
        pytest.raises(ConfigurationError, match=r"chongming-task-runtime\[otel\]"),
    ):
        instrument(controller)
