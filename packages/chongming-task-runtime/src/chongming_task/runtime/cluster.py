"""集群运维检查：权威的桶声明、桶重复 / 空洞、孤儿任务（分布式设计说明 §5）。

每个节点定期把"我是谁、负责哪些桶、活到什么时候"写进存储（``TaskStore.publish_node``，记录由
``node_record`` 生成）。存储里的这份成员表就是桶归属的**权威声明**：各节点本地的 owned_buckets
配置只有自己知道，拼起来对不对，只能在一个所有节点都写得到的地方核对。

``check_cluster`` 读成员表与任务，给出一份 ``ClusterReport``：

* **重复**：同一个桶被两个以上存活节点声明。两个节点都会 reconcile 它、都会认领它的指令。
* **空洞**：没有任何存活节点声明的桶。落在里面的任务永远排队，而且没有任何报错。
* **孤儿任务**：未结束、却没有节点负责的任务——它的桶是空洞，或者它的租约已过期而租约持有者
  不是存活节点（节点崩溃后还没有人 reconcile 它）。

这里全是纯函数：不起线程、不写存储（``node_record`` 只生成记录，发布由调用方决定节奏）。
"现在"一律取自传入的 clock，测试注入 FakeClock 即可确定性地让节点过期。
"""

from __future__ import annotations

import os
import socket
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from chongming_task.clock import SYSTEM_CLOCK, Clock
from chongming_task.core.numbers import check_int, check_seconds
from chongming_task.core.storage.claiming import awaits_claim
from chongming_task.core.version import NODE_FEATURE_LEVEL, __version__
from chongming_task.errors import ConfigurationError
from chongming_task.models import TaskSnapshot
from chongming_task.policies import DEFAULT_NUM_BUCKETS, BucketPolicy
from chongming_task.states import NON_TERMINAL_STATUSES
from chongming_task.storage import NodeRecord, QueryOrder, TaskQuery, TaskStore, check_node_owner

DEFAULT_ORPHAN_LIMIT = 1000
"""check_cluster 最多带回多少个孤儿任务的快照（总数另计在 ``orphan_count`` 里）。"""

_ORPHAN_LINES = 10
"""problems() 里逐个列出的孤儿任务数；更多的只给总数。"""


def format_buckets(buckets: Iterable[int]) -> str:
    """把桶号压成区间写法：``[0, 1, 2, 3, 7, 9, 10]`` → ``"0–3、7、9–10"``。"""
    ordered = sorted(set(buckets))
    if not ordered:
        return "（无）"
    parts: list[str] = []
    start = prev = ordered[0]
    for bucket in ordered[1:]:
        if bucket == prev + 1:
            prev = bucket
            continue
        parts.append(str(start) if start == prev else f"{start}–{prev}")
        start = prev = bucket
    parts.append(str(start) if start == prev else f"{start}–{prev}")
    return "、".join(parts)


def _ago(now: datetime, then: datetime) -> str:
    seconds = max(0.0, (now - then).total_seconds())
    if seconds < 120:
        return f"{seconds:.0f} 秒"
    if seconds < 7200:
        return f"{seconds / 60:.0f} 分钟"
    return f"{seconds / 3600:.1f} 小时"


@dataclass(frozen=True)
class ClusterReport:
    """一次集群检查的结果（不可变）。

    * ``nodes``：存活的节点记录（``expires_at`` 晚于 ``checked_at``），按 owner 排序。
    * ``stale_nodes``：已过期、但还留在存储里的记录（节点崩溃或没有正常退出）。
    * ``unpartitioned``：存活且不限定桶（``buckets is None``）的节点。
    * ``mismatched``：存活、但桶数与检查用的 ``num_buckets`` 不同的节点。它们的桶号与别人的不可比，
      不计入重复 / 空洞的计算。
    * ``duplicates``：桶号 → 声明它的节点（两个以上，按名字排序）。
    * ``holes``：没有存活节点声明的桶（升序）。只要有一个存活的划分节点就按声明计算；只有不限定桶
      的节点时没有空洞（它们什么桶的任务都跑）；一个存活节点都没有时，全部桶都是空洞。
    * ``orphans``：孤儿任务（最多 ``orphan_limit`` 个，按创建时间从旧到新）；``orphan_count`` 是总数。
    """

    checked_at: datetime
    num_buckets: int
    nodes: tuple[NodeRecord, ...]
    stale_nodes: tuple[NodeRecord, ...]
    unpartitioned: tuple[NodeRecord, ...]
    mismatched: tuple[NodeRecord, ...]
    duplicates: Mapping[int, tuple[str, ...]] = field(hash=False)
    holes: tuple[int, ...]
    orphans: tuple[TaskSnapshot, ...]
    orphan_count: int
    unserved: tuple[TaskSnapshot, ...] = ()
    """等 worker 认领、却没有任何存活 worker 登记它的名字（且负责它的桶）的持久任务
    （最多 orphan_limit 个）。"""
    unserved_count: int = 0

    @property
    def healthy(self) -> bool:
        """没有重复、没有空洞、没有桶数不一致的节点、没有孤儿任务、没有无人服务的持久任务。"""
        return not (
            self.duplicates or self.holes or self.mismatched or self.orphan_count or self.unserved_count
        )

    @property
    def orphans_truncated(self) -> bool:
        """孤儿任务多于带回的快照数（只列出了前 ``len(orphans)`` 个）。"""
        return self.orphan_count > len(self.orphans)

    @property
    def alive_owners(self) -> frozenset[str]:
        return frozenset(record.owner for record in self.nodes)

    def owners_of(self, bucket: int) -> tuple[str, ...]:
        """声明了某个桶的存活节点（含不限定桶的节点），按名字排序。"""
        return tuple(
            sorted(
                record.owner
                for record in self.nodes
                if record not in self.mismatched and (record.buckets is None or bucket in record.buckets)
            )
        )

    def orphan_reason(self, snapshot: TaskSnapshot) -> str:
        """一个孤儿任务为什么没人管（中文短句）。"""
        if snapshot.bucket is not None and snapshot.bucket in self.holes:
            return f"桶 {snapshot.bucket} 无人认领"
        holder = snapshot.lease_owner
        if holder is None:
            return "没有任何节点持有它的租约"
        if snapshot.lease_until is None:
            return f"监督者 {holder} 不是存活节点，且从未续租"
        until = snapshot.lease_until.isoformat(timespec="seconds")
        return f"监督者 {holder} 不是存活节点，租约已于 {until} 过期"

    def problems(self) -> list[str]:
        """使集群不健康的每一项发现，一条一行（中文）。健康时为空列表。"""
        lines: list[str] = []
        if self.holes:
            if not self.nodes:
                lines.append(
                    f"没有任何存活的节点：全部 {self.num_buckets} 个桶都无人负责，"
                    "新提交的任务不会被执行（节点都停了，或者它们没有发布成员记录）"
                )
            else:
                lines.append(
                    f"桶 {format_buckets(self.holes)} 无人认领（共 {len(self.holes)} 个）："
                    "落在这些桶里的任务会永远排队且没有报错；请把它们分给某个节点"
                )
        grouped: dict[tuple[str, ...], list[int]] = {}
        for bucket, owners in sorted(self.duplicates.items()):
            grouped.setdefault(owners, []).append(bucket)
        for owners, buckets in grouped.items():
            lines.append(
                f"桶 {format_buckets(buckets)} 被 {len(owners)} 个节点重复认领：{'、'.join(owners)}；"
                "它们会同时 reconcile 这些桶、抢同一批指令——请让每个桶只归一个节点"
            )
        for record in self.mismatched:
            lines.append(
                f"节点 {record.owner} 的桶数是 {record.num_buckets}，与检查用的 {self.num_buckets} 不同："
                "同一个 bucket_key 在它那里落到别的桶号；全体节点必须用同一个 num_buckets"
            )
        if self.orphan_count:
            lines.append(
                f"{self.orphan_count} 个未结束的任务没有节点负责"
                + (f"（下面列出最旧的 {min(len(self.orphans), _ORPHAN_LINES)} 个）" if self.orphans else "")
            )
            for snapshot in self.orphans[:_ORPHAN_LINES]:
                lines.append(
                    f"孤儿任务 {snapshot.task_id}（{snapshot.name}，{snapshot.status.value}）："
                    f"{self.orphan_reason(snapshot)}"
                )
            hidden = self.orphan_count - min(len(self.orphans), _ORPHAN_LINES)
            if hidden > 0:
                lines.append(f"……另有 {hidden} 个孤儿任务未列出")
        if self.unserved_count:
            names = sorted({snapshot.name for snapshot in self.unserved})
            lines.append(
                f"{self.unserved_count} 个持久任务在排队等认领，但没有存活的 worker 登记这些名字"
                f"（并负责它们的桶）：{'、'.join(names)}；它们会一直排队——"
                "请启动登记了它们的 worker（chongming-task worker --tasks ...）"
            )
        return lines

    def warnings(self) -> list[str]:
        """不影响健康判断、但值得运维知道的情况（过期的节点记录、划分与不限定混用）。"""
        lines: list[str] = []
        for record in self.stale_nodes:
            lines.append(
                f"节点 {record.owner} 的心跳已过期 {_ago(self.checked_at, record.expires_at)}"
                f"（最后心跳 {record.heartbeat_at.isoformat(timespec='seconds')}）：进程可能已崩溃；"
                "确认它不会再回来后，可以用 store.remove_node() 清掉这条记录"
            )
        partitioned = any(record.buckets is not None for record in self.nodes)
        if partitioned:
            for record in self.unpartitioned:
                lines.append(
                    f"节点 {record.owner} 没有限定桶（owned_buckets=None），而集群里有划分了桶的节点："
                    "它会 reconcile 所有桶里租约过期的任务、认领任何桶的指令"
                )
        if self.orphans_truncated:
            lines.append(f"孤儿任务只带回了 {len(self.orphans)} 个（共 {self.orphan_count} 个）")
        return lines

    def to_dict(self) -> dict[str, Any]:
        """纯 JSON 的表示（给 ``doctor --json`` 之类的机器读取用）。"""
        return {
            "checked_at": self.checked_at.isoformat(timespec="microseconds"),
            "num_buckets": self.num_buckets,
            "healthy": self.healthy,
            "nodes": [record.to_dict() for record in self.nodes],
            "stale_nodes": [record.to_dict() for record in self.stale_nodes],
            "unpartitioned": [record.owner for record in self.unpartitioned],
            "mismatched": [record.owner for record in self.mismatched],
            "duplicates": {str(bucket): list(owners) for bucket, owners in sorted(self.duplicates.items())},
            "holes": list(self.holes),
            "orphan_count": self.orphan_count,
            "unserved_count": self.unserved_count,
            "unserved": [{"task_id": s.task_id, "name": s.name, "bucket": s.bucket} for s in self.unserved],
            "orphans": [
                {
                    "task_id": s.task_id,
                    "name": s.name,
                    "status": s.status.value,
                    "bucket": s.bucket,
                    "lease_owner": s.lease_owner,
                    "reason": self.orphan_reason(s),
                }
                for s in self.orphans
            ],
            "problems": self.problems(),
            "warnings": self.warnings(),
        }


def _check_limit(orphan_limit: object) -> int:
    return check_int("orphan_limit", orphan_limit, low=0)


def _infer_num_buckets(alive: Sequence[NodeRecord]) -> int:
    """检查者没给桶数时，取存活节点里最多的那个（并列取较小的，结果确定）；没有存活节点用默认值。"""
    if not alive:
        return DEFAULT_NUM_BUCKETS
    counts = Counter(record.num_buckets for record in alive)
    return min(counts, key=lambda n: (-counts[n], n))


def check_cluster(
    store: TaskStore,
    *,
    num_buckets: int | None = None,
    clock: Clock = SYSTEM_CLOCK,
    orphan_limit: int = DEFAULT_ORPHAN_LIMIT,
) -> ClusterReport:
    """读成员表与未结束的任务，检查桶重复 / 空洞与孤儿任务。只读，不改动存储。

    ``num_buckets`` 是全集群应当一致的桶数（与各节点的 ``Controller(num_buckets=...)`` 相同）；
    不给时取存活节点里最常见的值。``clock`` 决定"现在"：节点的 ``expires_at`` 不晚于它即视为已过期，
    任务的 ``lease_until`` 早于它即视为租约已过期。
    """
    if not isinstance(store, TaskStore):
        raise ConfigurationError(f"check_cluster 需要一个 TaskStore，收到 {type(store).__name__}")
    limit = _check_limit(orphan_limit)
    now = clock.now()
    records = store.list_nodes()
    alive = tuple(record for record in records if record.alive(now))
    stale = tuple(record for record in records if not record.alive(now))
    if num_buckets is None:
        num_buckets = _infer_num_buckets(alive)
    num_buckets = BucketPolicy(num_buckets).num_buckets  # 复用同一份校验与报错
    mismatched = tuple(record for record in alive if record.num_buckets != num_buckets)
    unpartitioned = tuple(record for record in alive if record.buckets is None)
    partitioned = [r for r in alive if r.buckets is not None and r.num_buckets == num_buckets]

    claims: dict[int, list[str]] = {}
    for record in partitioned:
        assert record.buckets is not None
        for bucket in record.buckets:
            claims.setdefault(bucket, []).append(record.owner)
    duplicates = {
        bucket: tuple(sorted(owners)) for bucket, owners in sorted(claims.items()) if len(owners) > 1
    }
    if partitioned:
        holes = tuple(bucket for bucket in range(num_buckets) if bucket not in claims)
    elif unpartitioned:
        holes = ()  # 只有不限定桶的节点：谁都可以跑任何桶的任务，没有"无人负责"的桶
    else:
        holes = tuple(range(num_buckets))  # 没有（桶数一致的）存活节点：没有任何桶有人负责

    orphans, orphan_count, waiting = _find_orphans(
        store, now, holes, frozenset(r.owner for r in alive), limit
    )
    unserved = [s for s in waiting if not _served(s, alive, num_buckets)]
    return ClusterReport(
        checked_at=now,
        num_buckets=num_buckets,
        nodes=alive,
        stale_nodes=stale,
        unpartitioned=unpartitioned,
        mismatched=mismatched,
        duplicates=duplicates,
        holes=holes,
        orphans=orphans,
        orphan_count=orphan_count,
        unserved=tuple(unserved[:limit]),
        unserved_count=len(unserved),
    )


def _served(snapshot: TaskSnapshot, alive: Sequence[NodeRecord], num_buckets: int) -> bool:
    """有没有存活的 worker 登记了这个持久任务的名字、并负责它的桶（worker 在节点记录的 info.serves
    里发布）。"""
    for record in alive:
        serves = record.info.get("serves")
        if not isinstance(serves, list) or snapshot.name not in serves or record.num_buckets != num_buckets:
            continue
        if record.buckets is None or (snapshot.bucket is not None and snapshot.bucket in record.buckets):
            return True
    return False


def _find_orphans(
    store: TaskStore, now: datetime, holes: tuple[int, ...], alive_owners: frozenset[str], limit: int
) -> tuple[tuple[TaskSnapshot, ...], int, list[TaskSnapshot]]:
    """(孤儿任务前 limit 个, 孤儿总数, 等 worker 认领的持久任务)。等认领的持久任务（queued、无人持有）不是
    孤儿——它们本来就没有持有者，有没有人服务另由 ``_served`` 判断。"""
    unfinished = frozenset(NON_TERMINAL_STATUSES)
    hole_set = frozenset(holes)
    in_holes: list[TaskSnapshot] = []
    hole_count = 0
    if hole_set:
        where = TaskQuery(statuses=unfinished, buckets=hole_set)
        hole_count = store.stats(where).total  # 精确总数；快照只取前 limit 个
        if limit:
            in_holes = store.query(
                TaskQuery(statuses=unfinished, buckets=hole_set, order=QueryOrder.OLDEST_FIRST, limit=limit)
            )
    # 租约过期的未结束任务不设 limit：要先剔除存活节点名下的（例如节点刚重启、还没 reconcile），
    # 剔除之后才知道够不够 limit 个。健康的集群里这一类几乎为零，规模由"崩溃节点留下的任务"决定。
    expired = store.query(
        TaskQuery(statuses=unfinished, lease_expired_before=now, order=QueryOrder.OLDEST_FIRST)
    )
    waiting = [s for s in expired if awaits_claim(s)]
    unsupervised = [
        s
        for s in expired
        if s.lease_owner not in alive_owners
        and (s.bucket is None or s.bucket not in hole_set)
        and not awaits_claim(s)
    ]
    merged = sorted([*in_holes, *unsupervised], key=lambda s: (s.created_at, s.task_id))
    return tuple(merged[:limit]), hole_count + len(unsupervised), waiting


def default_node_info() -> dict[str, Any]:
    """节点记录里默认的 info：主机名、pid、chongming-task 版本、这份代码承受得了的原地升级等级
    （``feature_level``，见 ``core.version.NODE_FEATURE_LEVEL``）。"""
    return {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "version": __version__,
        "feature_level": NODE_FEATURE_LEVEL,
    }


def node_record(
    owner: str,
    owned_buckets: Iterable[int] | None,
    *,
    num_buckets: int,
    ttl: float,
    clock: Clock = SYSTEM_CLOCK,
    info: Mapping[str, Any] | None = None,
) -> NodeRecord:
    """生成一条"现在"的节点记录：心跳为 ``clock.now()``，``ttl`` 秒后过期。

    ``owned_buckets`` 为 None 表示不限定桶。桶号按 ``num_buckets`` 校验（越界立刻报错）。``info`` 与
    默认的主机名 / pid / 版本合并（同名键以 ``info`` 为准）。``ttl`` 应当是发布间隔的好几倍（例如
    按租约节奏 lease_ttl/3 发布、ttl 取 lease_ttl），偶尔慢一拍的心跳才不会让节点"假死"。
    """
    check_node_owner(owner)
    check_seconds("节点记录的 ttl", ttl)
    policy = BucketPolicy(num_buckets)
    if owned_buckets is not None and isinstance(owned_buckets, (int, str)):
        raise ConfigurationError(
            f"owned_buckets 必须是桶号的集合（例如 range(0, 16)）或 None，收到 {owned_buckets!r}"
        )
    buckets = None if owned_buckets is None else policy.validate_buckets(owned_buckets)
    if info is not None and not isinstance(info, Mapping):
        raise ConfigurationError(f"info 必须是 dict（JSON 对象），收到 {type(info).__name__}")
    now = clock.now()
    return NodeRecord(
        owner=owner,
        buckets=buckets,
        num_buckets=policy.num_buckets,
        heartbeat_at=now,
        expires_at=now + timedelta(seconds=ttl),
        info={**default_node_info(), **(info or {})},
    )


__all__ = [
    "DEFAULT_ORPHAN_LIMIT",
    "ClusterReport",
    "check_cluster",
    "default_node_info",
    "format_buckets",
    "node_record",
]
