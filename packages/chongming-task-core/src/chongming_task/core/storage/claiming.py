"""认领待执行的持久任务（issue 19）：``TaskStore.claim_queued`` 的入参、判据与顺序，只写这一份。

可认领 = ``queued``、带配方（``recipe``）、无人持有（``owner`` 为空）、名字在认领者登记的名字里、桶在它负责的
桶里（``buckets`` 为 None 表示不限，这时没有桶的任务也可认领；给了桶集合时只认领落在这些桶里的）。顺序：
priority 大的先，同优先级按创建先后（``created_at``，再按 ``task_id``）。认领把 ``owner`` 与租约
（``lease_owner`` / ``lease_until``）写成认领者，不改状态、不改版本号：认领者随后以状态机把任务推进
（queued → starting，带版本条件写回），与它并发的任何写都会被版本条件拦下。

给了 ``start`` 的认领是同一次认领再加一步：认领到的行在同一个事务里由状态机推进到 ``starting``（attempt + 1、
``started_at``、执行器名与 queued → starting 的迁移记录，与 worker 自己 ``mark_starting`` 写下的一模一样：
迁移规则只在 ``core/state_machine.py``，存储不另写一份——``start_claimed`` 就是用一台临时状态机算出来的；
唯一的例外是 PostgreSQL：为了一条语句、一次往返，它把 ``mark_starting`` 的改动逐列写进了 SQL，由它的专门用例
逐字段对照 ``start_claimed`` 的结果守着两边一致）。
为什么：worker 认领之后反正要写 starting（任务体开始之前它必须已落库），两次提交并成一次，每个任务少一次提交
与往返。状态机拒绝开始的行（尝试预算已用完）只认领、不开始，交给 worker 照旧处理。

``ClaimStart.save`` 再往前加一步：认领之前，同一个事务先写一次 save（worker 的执行槽上刚落终态的那个任务，
见 runtime/worker.py 的 ``_ClaimChain``）。为什么：空出的槽反正要认领下一个，终态那次提交与下一个任务的
"认领 + starting"并成一次，每个任务又少一次提交与往返（PostgreSQL 上是一条语句）。save 是前提：它写不成
（版本冲突、任务不存在、入参不合规）时整个调用什么也不写、抛出那次 save 会抛的异常；它写成了而认领取不到
任务时，save 照样提交、交回空列表。被写的任务本身绝不会被这次认领取走（它 save 之后不能是待认领的，
入参检查拒绝这样的 save）。

原子性是契约的核心：同一个任务无论多少认领者同时来取，只被一个取走（SQL 后端：PostgreSQL 用
``FOR UPDATE SKIP LOCKED``，SQLite 用 ``BEGIN IMMEDIATE`` 写事务）。
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from chongming_task.core.storage import checks
from chongming_task.core.storage._base_checks import check_aware, check_claimant, check_optional_text, id_set
from chongming_task.core.storage.values import SaveRequest, awaits_claim
from chongming_task.errors import ConfigurationError, TaskError
from chongming_task.models import TaskSnapshot, Transition

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


@dataclass(frozen=True)
class ClaimStart:
    """``claim_queued(..., start=...)`` 怎样开始认领到的任务：``at`` 是 starting 的时刻（认领者的时钟，
    写进 started_at 与迁移记录），``executor`` 是执行器名（与 worker 的 ``mark_starting(executor=...)``
    同一个值）。

    ``save``：认领之前在同一个事务里先写的一次 save（见模块说明）。worker 用它把刚空出的槽上那个任务的终态
    与下一个任务的认领 + starting 并成一次提交；检查与单独一次 ``save`` 相同，另加一条：save 之后的快照不能是
    待认领的（否则"它会不会被同一次认领取走"在各后端上说不清）。"""

    at: datetime
    executor: str | None = None
    save: SaveRequest | None = None


def check_claim_start(start: object) -> ClaimStart:
    if not isinstance(start, ClaimStart):
        raise ConfigurationError(f"start 必须是 ClaimStart(at=..., executor=...)，收到 {start!r}")
    check_aware("start.at", start.at, required=True)
    check_optional_text("start.executor", start.executor)
    if start.save is None:
        return start
    if not isinstance(start.save, SaveRequest):
        raise ConfigurationError(f"start.save 必须是 SaveRequest，收到 {start.save!r}")
    save = checks.check_save_request(start.save)
    if awaits_claim(save.snapshot):
        raise ConfigurationError(
            f"start.save 写下的任务 {save.snapshot.task_id!r} 是待认领的（queued、带配方、无人持有）："
            "认领之前的那次 save 只能写不会被这次认领取走的快照（通常是刚落终态的任务）"
        )
    return ClaimStart(start.at, start.executor, save)


class _At:
    """只会报 ``at`` 这一刻的时钟：状态机开始一次尝试时取 ``now()``，这里要的正是认领者给的那一刻。"""

    def __init__(self, at: datetime) -> None:
        self._at = at

    def now(self) -> datetime:
        return self._at

    def monotonic(self) -> float:  # pragma: no cover - 状态机开始一次尝试时不看单调时钟、不等
        return 0.0

    def sleep(self, seconds: float) -> None:  # pragma: no cover
        return None

    def wait(self, event: threading.Event, timeout: float | None) -> bool:  # pragma: no cover
        return event.is_set()


def start_claimed(
    snapshot: TaskSnapshot, start: ClaimStart
) -> tuple[TaskSnapshot, tuple[Transition, ...]] | None:
    """认领到的快照 → 开始之后的快照与随附的迁移记录（queued → starting 那一条）；状态机不让开始时返回 None。

    用一台临时状态机算：存储不自己拼 starting 的字段（迁移表与 attempt 的记账只有状态机那一份）。
    """
    from chongming_task.core.state_machine import StateMachine  # 状态机依赖记录类型，记录类型依赖本包的列定义

    machine = StateMachine(snapshot, (), clock=_At(start.at))
    try:
        machine.mark_starting(executor=start.executor)
    except TaskError:
        return None
    return machine.snapshot, machine.transitions_since(snapshot.status_version)


def start_record(started: TaskSnapshot) -> Transition:
    """认领时已开始的快照（``claim_queued(..., start=...)`` 交回的 starting）→ 那次开始的迁移记录，与存储随它
    写下的那一条相同。worker 有事件监听器时把它交给监听器：queued → starting 发生在存储里，本进程的状态机
    没有经历这次迁移。

    同样用临时状态机算（不另拼记录的字段）：记录只取决于 task_id、开始之后的版本与时刻（= started_at），
    所以在"开始之前"的样子（版本、attempt 各减一，queued）上重放一次 ``mark_starting`` 就得到它。
    """
    from chongming_task.states import TaskStatus

    assert started.started_at is not None, started
    before = started.evolve(
        status=TaskStatus.QUEUED,
        status_version=started.status_version - 1,
        attempt=started.attempt - 1,
        started_at=None,
    )
    begun = start_claimed(before, ClaimStart(at=started.started_at, executor=started.executor))
    assert begun is not None, started
    return begun[1][-1]


__all__ = [
    "MAX_CLAIM",
    "ClaimStart",
    "QueuedClaim",
    "awaits_claim",
    "check_claim",
    "check_claim_start",
    "claim_order",
    "claimable",
    "claimed",
    "start_claimed",
    "start_record",
]
