"""OpenTelemetry 追踪：``instrument(controller, tracer_provider=...)``（用户指南 §15.3）。

每次尝试一个 span（从 starting 到这次尝试结束），父 span 是 ``submit()`` 那一刻提交者线程里的当前 span——
上下文在提交时随第一条迁移事件拷贝下来（``TransitionEvent.submit_context``），不用任何全局表。属性按
OpenTelemetry 消息语义约定的精神：``messaging.operation.type=process``、``messaging.message.id``=task_id，
外加 ``chongming_task.*``（name、attempt、bucket、status、failure_kind）；暂停、恢复、停止记成 span 事件；
尝试失败时 span 状态为 ERROR。

和指标一样只建立在公开事件钩子上（交付线程里运行，不在任务的锁里）。只依赖 ``opentelemetry-api``
（可选 extra ``chongming-task-runtime[otel]``）；SDK 与导出器由应用自己选。
"""

from __future__ import annotations

import importlib
from datetime import datetime
from typing import Any

from chongming_task.errors import ConfigurationError
from chongming_task.runtime.controller import Controller
from chongming_task.runtime.events import Event, TransitionEvent
from chongming_task.states import TaskStatus

S = TaskStatus

INSTALL_HINT = (
    "OpenTelemetry 追踪需要 opentelemetry-api：请 pip install 'chongming-task-runtime[otel]'"
    "（或 pip install 'chongming-task[otel]'），再配好你自己的 SDK 与导出器"
)

TRACER_NAME = "chongming_task"

# 一次尝试在这些迁移上结束（同 metrics.py 的口径）。
_ATTEMPT_ENDS = frozenset({S.SUCCEEDED, S.FAILED, S.RETRY_WAIT, S.STOPPED, S.CANCELLED, S.LOST})
# 落在这些状态上的尝试算失败（span 状态 ERROR）；stopped 只有带了非取消类失败（如超时）时才算。
_ERROR_ENDS = frozenset({S.FAILED, S.RETRY_WAIT, S.LOST})


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ConfigurationError(INSTALL_HINT) from None


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000_000)


class ControllerTracing:
    """一个控制器的追踪。它自己就是监听器（只在交付线程里被调用，账本不需要锁）。"""

    def __init__(self, controller: Controller, tracer_provider: Any = None) -> None:
        trace = _import("opentelemetry.trace")
        self._context_api = _import("opentelemetry.context")
        self._trace = trace
        self.controller = controller
        self.tracer = trace.get_tracer(TRACER_NAME, tracer_provider=tracer_provider)
        self._parents: dict[str, Any] = {}  # task_id → 提交时的 OTel 上下文
        self._spans: dict[str, Any] = {}  # task_id → 当前尝试的 span
        self._closed = False
        controller.add_listener(self)

    def __call__(self, event: Event) -> None:
        if not isinstance(event, TransitionEvent):
            return
        task_id, target = event.task_id, event.to_status
        if event.submit_context is not None:
            # 在提交者的 contextvars 里读 OTel 的当前上下文（OTel 的默认上下文就存在 contextvars 里）。
            self._parents[task_id] = event.submit_context.run(self._context_api.get_current)
        span = self._spans.get(task_id)
        if target is S.STARTING:
            if span is not None:  # 不应发生；防御：别让旧 span 永远不结束
                span.end(end_time=_ns(event.at))
            self._spans[task_id] = self._start(event)
        elif span is not None:
            if target is S.PAUSED:
                span.add_event("pause", self._why(event), timestamp=_ns(event.at))
            elif event.from_status is S.PAUSED and target is S.RUNNING:
                span.add_event("resume", self._why(event), timestamp=_ns(event.at))
            elif target is S.STOPPING:
                span.add_event("stop", self._why(event), timestamp=_ns(event.at))
            if target in _ATTEMPT_ENDS:
                self._end(span, event)
                del self._spans[task_id]
        if target.is_terminal:
            self._parents.pop(task_id, None)

    def _start(self, event: TransitionEvent) -> Any:
        snapshot = event.snapshot
        attributes: dict[str, Any] = {
            "messaging.system": "chongming_task",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.message.id": event.task_id,
            "chongming_task.name": event.name,
            "chongming_task.attempt": event.attempt,
        }
        if snapshot.bucket is not None:
            attributes["chongming_task.bucket"] = snapshot.bucket
        if snapshot.pipeline_id is not None:
            attributes["chongming_task.pipeline_id"] = snapshot.pipeline_id
        return self.tracer.start_span(
            f"process {event.name}",
            context=self._parents.get(event.task_id),
            kind=self._trace.SpanKind.CONSUMER,
            attributes=attributes,
            start_time=_ns(event.at),
        )

    @staticmethod
    def _why(event: TransitionEvent) -> dict[str, Any]:
        attributes: dict[str, Any] = {"chongming_task.trigger": event.trigger}
        if event.actor is not None:
            attributes["chongming_task.actor"] = event.actor
        if event.reason is not None:
            attributes["chongming_task.reason"] = event.reason
        return attributes

    def _end(self, span: Any, event: TransitionEvent) -> None:
        target, kind = event.to_status, event.failure_kind
        span.set_attribute("chongming_task.status", target.value)
        if kind is not None:
            span.set_attribute("chongming_task.failure_kind", kind.value)
        failed = target in _ERROR_ENDS or (kind is not None and kind.value != "cancelled")
        if failed:
            failure = event.snapshot.failure
            message = failure.message if failure is not None else target.value
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, message))
        span.end(end_time=_ns(event.at))

    def close(self) -> None:
        """摘掉监听器；还开着的 span（任务没跑完）就地结束。幂等。"""
        if self._closed:
            return
        self._closed = True
        self.controller.remove_listener(self)
        for span in self._spans.values():
            span.end()
        self._spans.clear()
        self._parents.clear()


def instrument(controller: Controller, *, tracer_provider: Any = None) -> ControllerTracing:
    """给控制器挂上 OpenTelemetry 追踪，返回 ``ControllerTracing``（``.close()`` 摘掉）。

    ``tracer_provider`` 默认用 OpenTelemetry 全局的 provider（应用配置的那个；没配时是空操作）。
    只追踪 instrument 之后提交的任务的父子关系；之前提交的任务的尝试 span 没有父 span。
    """
    _import("opentelemetry.trace")
    if not isinstance(controller, Controller):
        raise ConfigurationError(f"instrument() 的参数必须是 Controller，收到 {controller!r}")
    return ControllerTracing(controller, tracer_provider)


__all__ = ["INSTALL_HINT", "TRACER_NAME", "ControllerTracing", "instrument"]
