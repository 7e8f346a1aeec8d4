"""公开路径 ``chongming_task.run``：TaskRun 与 run_task（用户指南 §3–§6 印出的导入路径，永久有效）。

实现在 ``chongming_task.runtime.taskrun``（运行时发行包的代码都在 ``chongming_task.runtime`` 下；
根命名空间属于 core，这里只留一个转出模块）。不在这里定义任何东西。
"""

from __future__ import annotations

from chongming_task.core.triggers import TRIGGER_CANCEL, TRIGGER_CARRIER_EXITED, TRIGGER_RESUME, TRIGGER_STOP
from chongming_task.runtime.taskrun import (
    DEFAULT_PAUSE_TIMEOUT,
    RESERVED_RUN_TASK_KEYWORDS,
    Outcome,
    TaskRun,
    lost_failure,
    mark_lease_expired,
    run_task,
)

__all__ = [
    "DEFAULT_PAUSE_TIMEOUT",
    "RESERVED_RUN_TASK_KEYWORDS",
    "TRIGGER_CANCEL",
    "TRIGGER_CARRIER_EXITED",
    "TRIGGER_RESUME",
    "TRIGGER_STOP",
    "Outcome",
    "TaskRun",
    "lost_failure",
    "mark_lease_expired",
    "run_task",
]
