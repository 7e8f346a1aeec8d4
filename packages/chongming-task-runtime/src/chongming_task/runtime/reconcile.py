"""重启恢复：把失去监督者的任务如实标记出来。

判据是"还有人在管它吗"（租约 lease_owner / lease_until），不是"它还在推进吗"（心跳）。心跳由
任务自己的 checkpoint() 驱动，一个长时间纯计算的健康任务心跳同样停滞——拿心跳判存活会把正常
任务判成 LOST。所以租约与心跳是两个字段，这里只看租约。

| 情况                                   | 处置                          |
| 租约未过期                             | 有人在管，不动                 |
| 租约过期 + 占着执行资源                 | 载体已消失 → LOST              |
| 租约过期 + 不占资源（排队/暂停/重试等待）| 不改状态，报告为 adoptable      |
| 写入时版本冲突（原监督者活过来抢先写了）  | 放手，报告为 skipped           |
| 行正被别的会话锁着（PostgreSQL）         | 不等锁，报告为 skipped，下轮再判 |

最后一行见 docs/distributed.md §7.5：一个失联节点可能把事务留在服务器上、锁要很久才放，判定不能排队等它。

reconcile 不会重新执行任务：存储里记的是状态，不是配方（函数与参数从未落库）。持久任务（带配方）的接手与
``on_lost`` 重跑由 worker 在 reconcile 之后做（``runtime/worker.py``），这里只如实标记。
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from chongming_task.clock import Clock
from chongming_task.core.storage.claiming import awaits_claim
from chongming_task.core.triggers import TRIGGER_RECONCILE
from chongming_task.errors import ConcurrencyConflict
from chongming_task.models import TaskSnapshot
from chongming_task.runtime.group_commit import save_many_checked
from chongming_task.runtime.signature import accepts_keyword
from chongming_task.runtime.taskrun import lost_failure, mark_lease_expired
from chongming_task.states import NON_TERMINAL_STATUSES, RESOURCE_HOLDING_STATUSES
from chongming_task.storage import QueryOrder, SaveRequest, TaskQuery, TaskStore


@dataclass
class ReconcileReport:
    """``lost``：会被（dry_run 时）或已被判为丢失的；``adoptable``：需要调用方重新提交的；
    ``skipped``：写入时发现有人正在写、于是放手的（版本冲突、租约刚被续上，或行正被别的会话锁着）——
    这一轮不作判定，下一轮再看。"""

    lost: list[TaskSnapshot] = field(default_factory=list)
    adoptable: list[TaskSnapshot] = field(default_factory=list)
    skipped: list[TaskSnapshot] = field(default_factory=list)
    dry_run: bool = False

    @property
    def total(self) -> int:
        return len(self.lost) + len(self.adoptable) + len(self.skipped)


def reconcile_store(
    store: TaskStore,
    *,
    clock: Clock,
    actor: str,
    buckets: Collection[int] | None,
    live_task_ids: Collection[str],
    dry_run: bool,
    durable_only: bool = False,
) -> ReconcileReport:
    """扫描租约已过期的非终态任务并按规则处置。``buckets`` 非 None 时只看这些桶。

    ``durable_only``：只看持久任务（worker 的自动维护用它：普通任务何时被判 lost 仍由调用方的
    reconcile() 决定，行为与没有 worker 时一样）。
    """
    report = ReconcileReport(dry_run=dry_run)
    now = clock.now()
    query = TaskQuery(
        statuses=NON_TERMINAL_STATUSES,
        lease_expired_before=now,
        buckets=frozenset(buckets) if buckets is not None else None,
        durable=True if durable_only else None,
        # 等 worker 认领的持久任务本来就没有持有者，不是失去监督者：在存储里就排除，不读进来再逐个跳过
        # （积压十万个待认领任务时，worker 的每轮维护原本要把它们全读一遍，期间什么也认领不了）。
        awaiting_claim=False,
        order=QueryOrder.OLDEST_FIRST,
    )
    # 以"租约此刻仍已过期"为条件（docs/distributed.md §7.3）：续租不改版本号，持有者若恰好在我们读与写之间
    # 续上了租约，这次写就被拒绝（报告为 skipped），而不是把一个有人在管的任务判成 LOST。
    fence = now if _accepts_lease_fence(store) else None  # None：还没跟上契约的第三方后端，只有版本条件
    pending: list[tuple[TaskSnapshot, SaveRequest]] = []
    for snapshot in store.query(query):
        if snapshot.task_id in live_task_ids or (durable_only and snapshot.recipe is None):
            continue  # 本进程正在管它（续租只是还没写到）；或只看持久任务时的普通任务
        if awaits_claim(snapshot):
            continue  # 查询已排除；还没跟上 awaiting_claim 的第三方后端会交回它们，这里再挡一次
        if snapshot.status not in RESOURCE_HOLDING_STATUSES:
            report.adoptable.append(snapshot)
            continue
        machine = mark_lease_expired(snapshot, clock=clock, actor=actor)
        if dry_run:
            report.lost.append(machine.snapshot)
            continue
        request = SaveRequest(machine.snapshot, snapshot.status_version, machine.transitions, fence)
        pending.append((snapshot, request))
        if len(pending) >= SAVE_BATCH:
            _mark_lost(store, pending, report)
            pending = []
    _mark_lost(store, pending, report)
    return report


SAVE_BATCH = 500
"""判 LOST 的写每多少个任务合成一次 ``save_many``（一个事务）。逐个提交时 10 万个任务里判 1,000 个 LOST
要 1,000 次提交（PostgreSQL 上 8 s 多）；批也不能太大：一个事务持写锁（SQLite）/ 行锁（PostgreSQL）越久，
别的写者等得越久。"""


def _mark_lost(
    store: TaskStore, pending: Sequence[tuple[TaskSnapshot, SaveRequest]], report: ReconcileReport
) -> None:
    """一批判 LOST 的写：逐项结果与逐个 ``save`` 完全相同——版本冲突、租约刚被续上、行正被别的会话锁着
    （PostgreSQL 的 SKIP LOCKED）都是 ConcurrencyConflict，只影响那一项（报告为 skipped，下一轮再判），
    同批其余照常提交。别的逐项错误（任务不见了等）与逐个 save 时一样抛出（同批其余已提交的照常记为 lost
    之后才抛）；整批事务失败（StoreError）直接抛出。"""
    if not pending:
        return
    results = save_many_checked(store, [request for _, request in pending])
    failure: BaseException | None = None
    for (snapshot, request), error in zip(pending, results, strict=True):
        if error is None:
            report.lost.append(request.snapshot)
        elif isinstance(error, ConcurrencyConflict):
            report.skipped.append(snapshot)
        elif failure is None:
            failure = error
    if failure is not None:
        raise failure


def _accepts_lease_fence(store: TaskStore) -> bool:
    """后端的 save 是否接受 ``lease_expired_before``（契约后来加的条件；老的第三方后端没有）。"""
    cls = type(store)
    cached = _LEASE_FENCE.get(cls)
    if cached is None:
        cached = accepts_keyword(store.save, "lease_expired_before")
        _LEASE_FENCE[cls] = cached
    return cached


_LEASE_FENCE: dict[type, bool] = {}


__all__ = ["TRIGGER_RECONCILE", "ReconcileReport", "lost_failure", "reconcile_store"]
