"""公开路径 ``chongming_task.tracing``：OpenTelemetry 追踪（用户指南 §15.3）。

``instrument(controller, tracer_provider=...)`` 给每次尝试一个 span，挂在提交时的当前 span 下面；需要可选依赖
``pip install 'chongming-task-runtime[otel]'``（只要 opentelemetry-api）。实现在
``chongming_task.runtime.tracing``；这里只做转出。
"""

from __future__ import annotations

from chongming_task.runtime.tracing import INSTALL_HINT, TRACER_NAME, ControllerTracing, instrument

__all__ = ["INSTALL_HINT", "TRACER_NAME", "ControllerTracing", "instrument"]
