"""任务生命周期状态与转移表。

转移表在这里**只声明一次**（``TRANSITIONS``），状态机、调度器、存储与测试都查它，
任何地方都不重新编码这张表。终态映射到显式的空集：没有出边是声明出来的，不是漏写的。
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType


class TaskStatus(enum.StrEnum):
    """任务所处的生命周期阶段（15 个，值为小写英文；StrEnum 自带 str() 即值）。"""

    PENDING = "pending"
    BLOCKED = "blocked"
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    RETRY_WAIT = "retry_wait"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"
    LOST = "lost"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES

    @property
    def holds_slot(self) -> bool:
        """按状态粗判是否占用执行槽。paused 算占槽（就地暂停不释放槽位）——但排队/重试等待中
        被暂停的任务从未占槽，只看状态分不出来；要精确判断用 ``TaskSnapshot.holds_slot``。"""
        return self in SLOT_HOLDING_STATUSES


S = TaskStatus
# 性能注记（issue 17）：3.11 的 ``enum.EnumType`` 定义了 ``__getattr__``（3.12 才去掉），于是读枚举类的属性
# （``S.RUNNING``、``ResultKind.RETURNED``……）每次都经 ``slot_tp_getattr_hook``：先经一个包装对象调一次
# ``type.__getattribute__``，解释器也不能把这次读取特化——约 170 ns，读一个模块全局约 16 ns。读成员自己的
# 属性（``status.value`` 是 Python 写的 property，约 250 ns）也不便宜。每个任务都要走的函数（状态机的几个
# 常用动作、TaskRun 的开始与结算、控制器的记账）因此把要用的成员存成模块常量（``_RUNNING = S.RUNNING``），
# 值按成员查表（``STATUS_VALUE``）；其余代码照旧写 ``S.X``，读起来更直白。

TRANSITIONS: Mapping[TaskStatus, frozenset[TaskStatus]] = MappingProxyType(
    {
        S.PENDING: frozenset({S.BLOCKED, S.QUEUED, S.SKIPPED, S.CANCELLED, S.STOPPED}),
        S.BLOCKED: frozenset({S.QUEUED, S.SKIPPED, S.CANCELLED, S.STOPPED}),
        S.QUEUED: frozenset({S.STARTING, S.PAUSED, S.SKIPPED, S.STOPPED, S.CANCELLED}),
        S.STARTING: frozenset(
            {S.RUNNING, S.RETRY_WAIT, S.PAUSING, S.STOPPING, S.FAILED, S.CANCELLED, S.LOST}
        ),
        S.RUNNING: frozenset(
            {S.SUCCEEDED, S.FAILED, S.RETRY_WAIT, S.PAUSING, S.STOPPING, S.CANCELLED, S.LOST}
        ),
        S.PAUSING: frozenset({S.PAUSED, S.RUNNING, S.STOPPING, S.FAILED, S.CANCELLED, S.LOST}),
        S.PAUSED: frozenset({S.QUEUED, S.RUNNING, S.STOPPED, S.CANCELLED}),
        S.RETRY_WAIT: frozenset({S.STARTING, S.QUEUED, S.PAUSED, S.STOPPED, S.FAILED, S.CANCELLED}),
        S.STOPPING: frozenset({S.STOPPED, S.SUCCEEDED, S.FAILED, S.LOST}),
        S.SUCCEEDED: frozenset(),
        S.FAILED: frozenset(),
        S.STOPPED: frozenset(),
        S.CANCELLED: frozenset(),
        S.SKIPPED: frozenset(),
        S.LOST: frozenset(),
    }
)
"""完整转移表：状态 → 允许到达的状态集合。终态映射到空集。"""

TERMINAL_STATUSES: frozenset[TaskStatus] = frozenset(s for s, targets in TRANSITIONS.items() if not targets)
"""六个终态：没有出边的状态。由转移表推导，不另行维护。"""

NON_TERMINAL_STATUSES: frozenset[TaskStatus] = frozenset(TaskStatus) - TERMINAL_STATUSES

SLOT_HOLDING_STATUSES: frozenset[TaskStatus] = frozenset(
    {S.STARTING, S.RUNNING, S.PAUSING, S.PAUSED, S.STOPPING}
)
"""占用执行槽的状态。paused 在内：暂停是就地挂起，调用栈还在，槽位不释放。"""

RESOURCE_HOLDING_STATUSES: frozenset[TaskStatus] = frozenset({S.STARTING, S.RUNNING, S.PAUSING, S.STOPPING})
"""载体（线程/进程）正在执行的状态：控制动作要经中间态缓冲；reconcile 时租约过期即判 LOST。"""

ADOPTABLE_STATUSES: frozenset[TaskStatus] = frozenset({S.QUEUED, S.PAUSED, S.RETRY_WAIT})
"""持有者失联（租约过期）的持久任务能被活着的 worker 接手的状态：不占执行资源的非终态（用户指南 §9.9）。
接手记一条起止相同、触发源 ``cluster:adopted`` 的迁移记录（``StateMachine.adopt``），状态不变、只换持有者。"""

RETRYABLE_FROM: frozenset[TaskStatus] = frozenset({S.FAILED, S.STOPPED, S.CANCELLED, S.LOST})
"""``retry()`` 允许复活的终态。"""


def allowed_targets(status: TaskStatus) -> frozenset[TaskStatus]:
    return TRANSITIONS[status]


def is_edge(source: TaskStatus, target: TaskStatus) -> bool:
    return target in TRANSITIONS[source]


assert len(TRANSITIONS) == len(TaskStatus), "转移表必须覆盖全部状态"
assert len(TERMINAL_STATUSES) == 6


__all__ = [
    "ADOPTABLE_STATUSES",
    "NON_TERMINAL_STATUSES",
    "RESOURCE_HOLDING_STATUSES",
    "RETRYABLE_FROM",
    "SLOT_HOLDING_STATUSES",
    "TERMINAL_STATUSES",
    "TRANSITIONS",
    "TaskStatus",
    "allowed_targets",
    "is_edge",
]
