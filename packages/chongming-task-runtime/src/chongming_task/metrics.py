"""公开路径 ``chongming_task.metrics``：Prometheus 指标（用户指南 §15.2）。

``instrument(controller, registry=...)`` 注册 ``chongming_task_*`` 指标；需要可选依赖
``pip install 'chongming-task-runtime[metrics]'``（没装时 ``instrument()`` 会这样告诉你；
导入本模块不需要它）。
实现在 ``chongming_task.runtime.metrics``；这里只做转出。
"""

from __future__ import annotations

from chongming_task.runtime.metrics import (
    DURATION_BUCKETS,
    INSTALL_HINT,
    METRIC_NAMES,
    ControllerMetrics,
    instrument,
)

__all__ = ["DURATION_BUCKETS", "INSTALL_HINT", "METRIC_NAMES", "ControllerMetrics", "instrument"]
