"""认领待执行的持久任务（issue 19）：``TaskStore.claim_queued`` 的入参、判据与顺序，只写这一份。

可认领 = ``queued``、带配方（``recipe``）、无人持有（``owner`` 为空）、名字在认领者登记的名字里、桶在它负责的
桶里（``buckets`` 为 None 表示不限，这时没有桶的任务也可认领；给了桶集合时只认领落在这些桶里的）。顺序：
priority 大的先，同优先级按创建先后（``created_at``，再按 ``task_id``）。认领把 ``owner`` 与租约
（``lease_owner`` / ``lease_until``）写成认领者，不改状态、不改版本号：认领者随后以状态机把任务推进
（queued → starting，带版本条件写回），与它并发的任何写都会被版本条件拦下。

原子性是契约的核心：同一个任务无论多少认领者同时来取，只被一个取走（SQL 后端：PostgreSQL 用
``FOR UPDATE SKIP LOCKED``，SQLite 用 ``BEGIN IMMEDIATE`` 写事务）。
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from chongming_task.core.storage._base_checks import check_aware, check_claimant, id_set
from chongming_task.core.storage.values import awaits_claim
from chongming_task.errors import ConfigurationError
from chongming_task.models import TaskSnapshot

MAX_CLAIM = 1000
"""一次最多认领多少个：worker 按空闲槽位认领（不囤积），一千个槽已是极端配置。"""


@dataclass(frozen=True)
class QueuedClaim:
    """检查过的认领参数。``names`` 为空时什么也认领不到（后端可以直接返回空列表）。"""

    holder: str
    names: frozenset[str]
    buckets: frozenset[int] | None
    limit: int
    lease_until: datetime

    @property
    def empty(self) -> bool:
        return self.limit == 0 or not self.names or self.buckets == frozenset()


def check_claim(
    holder: object, names: Iterable[Any], buckets: Iterable[Any] | None, limit: object, lease_until: object
) -> QueuedClaim:
    check_claimant(holder)
    if names is None or isinstance(names, str):
        raise ConfigurationError(f"names 必须是任务名的集合（例如 ['etl']），收到 {names!r}")
    wanted = id_set("names", names, str)
    assert wanted is not None
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_CLAIM:
        raise ConfigurationError(f"limit 必须是 0..{MAX_CLAIM} 的整数（本轮空闲的槽位数），收到 {limit!r}")
    check_aware("lease_until", lease_until, required=True)
    assert isinstance(holder, str) and isinstance(lease_until, datetime)
    return QueuedClaim(holder, wanted, id_set("buckets", buckets, int), limit, lease_until)


def claimable(snapshot: TaskSnapshot, request: QueuedClaim) -> bool:
    """一个快照是否可被这次认领取走（内存与第三方后端用；SQL 后端写成 WHERE）。"""
    if not awaits_claim(snapshot):
        return False
    if snapshot.name not in request.names:
        return False
    buckets = request.buckets
    return buckets is None or (snapshot.bucket is not None and snapshot.bucket in buckets)


def claim_order(snapshot: TaskSnapshot) -> tuple[int, datetime, str]:
    """认领顺序：priority 大的先，再按创建先后、task_id。"""
    return (-snapshot.priority, snapshot.created_at, snapshot.task_id)


def claimed(snapshot: TaskSnapshot, request: QueuedClaim) -> TaskSnapshot:
    """认领之后的快照：持有者与租约换成认领者，别的不变（版本号也不变）。"""
    return snapshot.evolve(owner=request.holder, lease_owner=request.holder, lease_until=request.lease_until)


__all__ = ["MAX_CLAIM", "QueuedClaim", "awaits_claim", "check_claim", "claim_order", "claimable", "claimed"]
