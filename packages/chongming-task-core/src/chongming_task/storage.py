"""持久层契约的公开入口（旧路径，保留）：``TaskStore``、``TaskQuery``、``Command``、``TaskStats``、``NodeRecord``。

实现已按职责拆进 ``chongming_task.core.storage``（``contract`` 抽象基类、``values`` 值类型、``checks``
入参校验、``columns`` 列表、``sql`` SQL 辅助）。这里只重新导出，``from chongming_task.storage import ...``
永远有效。
"""

from __future__ import annotations

from chongming_task.core.storage.checks import (
    MAX_LEASE_SECONDS,
    check_json_value,
    check_node_owner,
    check_node_record,
    validate_lease,
    validate_save,
)
from chongming_task.core.storage.contract import TaskStore
from chongming_task.core.storage.sql import escape_like
from chongming_task.core.storage.values import (
    SIDE_CHANNEL_FIELDS,
    Command,
    CommandAction,
    NodeRecord,
    QueryOrder,
    TaskQuery,
    TaskStats,
    as_query,
    count_buckets,
)

__all__ = [
    "MAX_LEASE_SECONDS",
    "SIDE_CHANNEL_FIELDS",
    "Command",
    "CommandAction",
    "NodeRecord",
    "QueryOrder",
    "TaskQuery",
    "TaskStats",
    "TaskStore",
    "as_query",
    "check_json_value",
    "check_node_owner",
    "check_node_record",
    "count_buckets",
    "escape_like",
    "validate_lease",
    "validate_save",
]
