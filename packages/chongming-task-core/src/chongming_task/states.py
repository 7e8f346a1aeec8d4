"""公开路径 ``chongming_task.states``：任务状态与转移表（用户指南印出的导入路径，永久有效）。

实现在 ``chongming_task.core.statuses``（生命周期的规则都在 ``chongming_task.core`` 里并排放着：
状态与转移表、触发源 ``core.triggers``、状态机 ``core.state_machine``、记录 ``core.records``）。
这里只做转出，不定义任何东西。
"""

from __future__ import annotations

from chongming_task.core.statuses import (
    NON_TERMINAL_STATUSES,
    RESOURCE_HOLDING_STATUSES,
    RETRYABLE_FROM,
    SLOT_HOLDING_STATUSES,
    TERMINAL_STATUSES,
    TRANSITIONS,
    S,
    TaskStatus,
    allowed_targets,
    is_edge,
)

__all__ = [
    "NON_TERMINAL_STATUSES",
    "RESOURCE_HOLDING_STATUSES",
    "RETRYABLE_FROM",
    "SLOT_HOLDING_STATUSES",
    "TERMINAL_STATUSES",
    "TRANSITIONS",
    "S",
    "TaskStatus",
    "allowed_targets",
    "is_edge",
]
