"""存储的值类型：查询条件、统计、控制指令、节点成员记录。

它们是后端与调用方之间的共同语言：构造时就校验（无类型代码传来的 ``True``、``-1``、单个字符串当集合……
在这里被拒绝），所以后端拿到的值总是合法的。校验用的是 ``checks`` 里那一份，措辞与后端一致。
"""

from __future__ import annotations

import enum
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chongming_task.core.storage._base_checks import (
    check_aware,
    check_bucket,
    check_json_value,
    check_node_owner,
)
from chongming_task.core.storage.columns import SIDE_CHANNEL_FIELDS
from chongming_task.errors import ConfigurationError
from chongming_task.models import Progress, TaskSnapshot, Transition, normalize_tags
from chongming_task.states import NON_TERMINAL_STATUSES, TaskStatus


class QueryOrder(enum.StrEnum):
    """查询结果的顺序：按 (created_at, task_id) 排序。"""

    NEWEST_FIRST = "newest"
    OLDEST_FIRST = "oldest"


def awaits_claim(snapshot: TaskSnapshot) -> bool:
    """等 worker 认领的持久任务：queued、带配方、无人持有。它本来就没有持有者，不是"失去监督者"——
    reconcile 不报告它，doctor 也不把它算作孤儿（有没有 worker 服务它另有检查）。SQL 后端把同一判据写成
    ``TaskQuery.awaiting_claim`` 的 WHERE 条件。"""
    return snapshot.status is TaskStatus.QUEUED and snapshot.recipe is not None and snapshot.owner is None


@dataclass(frozen=True)
class TaskQuery:
    """查询条件。所有条件取交集；None 表示不限。

    * ``name_prefix`` 按字面、区分大小写匹配：``%`` ``_`` 与反斜杠都不是通配符（SQL 后端必须转义
      LIKE；SQLite 的 LIKE 默认不区分 ASCII 大小写，需另行处理）。
    * ``tag`` 是整个标签相等，不是子串。
    * ``bucket`` 与 ``buckets`` 同时给出时取交集。
    * ``created_after`` / ``created_before`` 是开区间：严格晚于 / 严格早于。时间一律按"时刻"比较，
      与写法（时区偏移）无关——按 ISO 文本比较的后端会在非 UTC 偏移上出错。
    * ``lease_expired_before``：租约为空或 ``lease_until`` 早于该时刻（reconcile 用）。
    * ``durable``：True 只要持久任务（带配方 ``recipe``），False 只要非持久的，None 不限。
    * ``awaiting_claim``：True 只要等 worker 认领的持久任务（queued、带配方、无人持有，即
      ``claiming.awaits_claim``），False 把它们排除在外，None 不限。reconcile 用 False：一个积压了
      十万个待认领任务的队列，每轮维护都把它们整个读进 Python 再逐个跳过，worker 在这期间什么也认领不了。
    * 顺序按 (created_at, task_id)，``order`` 决定新的在前还是旧的在前。
    """

    statuses: frozenset[TaskStatus] | None = None
    name_prefix: str | None = None
    tag: str | None = None
    bucket: int | None = None
    buckets: frozenset[int] | None = None
    owner: str | None = None
    pipeline_id: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    lease_expired_before: datetime | None = None
    durable: bool | None = None
    awaiting_claim: bool | None = None
    limit: int | None = None
    order: QueryOrder = QueryOrder.NEWEST_FIRST

    def __post_init__(self) -> None:
        if self.statuses is not None:
            if isinstance(self.statuses, (str, TaskStatus)):
                raise ConfigurationError(
                    "TaskQuery.statuses 必须是状态的集合，例如 frozenset({TaskStatus.RUNNING})"
                )
            if not isinstance(self.statuses, Iterable):
                raise ConfigurationError(
                    "TaskQuery.statuses 必须是状态的集合，例如 frozenset({TaskStatus.RUNNING})，"
                    f"收到 {self.statuses!r}"
                )
            try:
                statuses = frozenset(TaskStatus(s) for s in self.statuses)
            except ValueError as exc:
                known = ", ".join(s.value for s in TaskStatus)
                raise ConfigurationError(f"TaskQuery.statuses 里有未知状态（{exc}）；可选：{known}") from None
            object.__setattr__(self, "statuses", statuses)
        if self.buckets is not None:
            if isinstance(self.buckets, (int, str, bytes)) or not isinstance(self.buckets, Iterable):
                raise ConfigurationError(
                    f"TaskQuery.buckets 必须是桶号的集合（单个桶请用 bucket=），收到 {self.buckets!r}"
                )
            object.__setattr__(self, "buckets", frozenset(self.buckets))
            for bucket in self.buckets:
                check_bucket("TaskQuery.buckets", bucket)
        if self.bucket is not None and (
            isinstance(self.bucket, bool) or not isinstance(self.bucket, int) or self.bucket < 0
        ):
            raise ConfigurationError(f"TaskQuery.bucket 必须是非负整数，收到 {self.bucket!r}")
        for name in ("name_prefix", "tag", "owner", "pipeline_id"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigurationError(f"TaskQuery.{name} 必须是字符串，收到 {value!r}")
        if self.tag is not None:
            normalize_tags([self.tag])
        for name in ("durable", "awaiting_claim"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ConfigurationError(f"TaskQuery.{name} 只能是 True、False 或 None，收到 {value!r}")
        for name in ("created_after", "created_before", "lease_expired_before"):
            check_aware(f"TaskQuery.{name}", getattr(self, name))
        if self.limit is not None and (
            isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 0
        ):
            raise ConfigurationError(f"TaskQuery.limit 必须是非负整数或 None，收到 {self.limit!r}")
        if not isinstance(self.order, QueryOrder):
            try:
                object.__setattr__(self, "order", QueryOrder(self.order))
            except ValueError:
                raise ConfigurationError("TaskQuery.order 只能是 'newest' 或 'oldest'") from None

    def matches(self, snapshot: TaskSnapshot) -> bool:
        """参照语义：一个快照是否满足全部条件（不含 limit 与顺序）。SQL 后端须与之逐条一致。"""
        if self.statuses is not None and snapshot.status not in self.statuses:
            return False
        if self.name_prefix is not None and not snapshot.name.startswith(self.name_prefix):
            return False
        if self.tag is not None and self.tag not in snapshot.tags:
            return False
        if self.bucket is not None and snapshot.bucket != self.bucket:
            return False
        if self.buckets is not None and snapshot.bucket not in self.buckets:
            return False
        if self.owner is not None and snapshot.owner != self.owner:
            return False
        if self.pipeline_id is not None and snapshot.pipeline_id != self.pipeline_id:
            return False
        if self.created_after is not None and not snapshot.created_at > self.created_after:
            return False
        if self.durable is not None and (snapshot.recipe is not None) != self.durable:
            return False
        if self.awaiting_claim is not None and awaits_claim(snapshot) != self.awaiting_claim:
            return False
        if self.created_before is not None and not snapshot.created_at < self.created_before:
            return False
        return not (
            self.lease_expired_before is not None
            and snapshot.lease_until is not None
            and snapshot.lease_until >= self.lease_expired_before
        )

    def sort_key(self, snapshot: TaskSnapshot) -> tuple[datetime, str]:
        return (snapshot.created_at, snapshot.task_id)

    def apply(self, snapshots: Iterable[TaskSnapshot]) -> list[TaskSnapshot]:
        """对一组快照执行过滤、排序与 limit（内存后端与测试用的参照实现）。"""
        selected = [s for s in snapshots if self.matches(s)]
        selected.sort(key=self.sort_key, reverse=self.order is QueryOrder.NEWEST_FIRST)
        if self.limit is not None:
            selected = selected[: self.limit]
        return selected


def as_query(query: object) -> TaskQuery:
    """查询方法的参数：None 表示不限；别的类型（来自无类型代码、CLI、配置）给出清楚的 ConfigurationError，
    而不是在后端深处变成 AttributeError。"""
    if query is None:
        return TaskQuery()
    if not isinstance(query, TaskQuery):
        raise ConfigurationError(
            f"查询条件必须是 TaskQuery(...) 或 None，收到 {type(query).__name__}：{query!r}"
        )
    return query


class CommandAction(enum.StrEnum):
    """跨进程控制动作。"""

    STOP = "stop"
    PAUSE = "pause"
    RESUME = "resume"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Command:
    """一条控制指令。``claimant`` / ``lease_until`` 为空表示未被取走；``completed_at`` 非空表示已执行完。"""

    command_id: str
    task_id: str
    action: CommandAction
    issuer: str | None
    reason: str | None
    payload: Mapping[str, Any]
    created_at: datetime
    bucket: int | None = None
    claimant: str | None = None
    lease_until: datetime | None = None
    deliveries: int = 0
    completed_at: datetime | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Command:
        """``to_dict()`` 的逆运算（给以 JSON 保存指令的后端用）。"""

        def when(value: str | None) -> datetime | None:
            return None if value is None else datetime.fromisoformat(value)

        created_at = when(data["created_at"])
        assert created_at is not None
        return cls(
            command_id=data["command_id"],
            task_id=data["task_id"],
            action=CommandAction(data["action"]),
            issuer=data.get("issuer"),
            reason=data.get("reason"),
            payload=dict(data.get("payload") or {}),
            created_at=created_at,
            bucket=data.get("bucket"),
            claimant=data.get("claimant"),
            lease_until=when(data.get("lease_until")),
            deliveries=int(data.get("deliveries", 0)),
            completed_at=when(data.get("completed_at")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "command_id": self.command_id,
            "task_id": self.task_id,
            "action": self.action.value,
            "issuer": self.issuer,
            "reason": self.reason,
            "payload": dict(self.payload),
            "created_at": self.created_at.isoformat(timespec="microseconds"),
            "bucket": self.bucket,
            "claimant": self.claimant,
            "lease_until": None
            if self.lease_until is None
            else self.lease_until.isoformat(timespec="microseconds"),
            "deliveries": self.deliveries,
            "completed_at": None
            if self.completed_at is None
            else self.completed_at.isoformat(timespec="microseconds"),
        }


@dataclass(frozen=True)
class TouchUpdate:
    """一次 touch 的旁路字段（None 表示不改），由 ``checks.check_touch`` 检查。

    内置后端的 touch / touch_many 都只接收这一个值：签名与入参检查只在 ``TaskStore.touch`` 写一次
    （四个后端曾各抄一份签名、各自拆字典）。
    """

    task_id: str
    progress: Progress | None = None
    heartbeat_at: datetime | None = None
    lease_owner: str | None = None
    lease_until: datetime | None = None


# 下面三个与 TouchUpdate 同理：``TaskStore`` 的公开方法检查一次入参，把结果装进一个值交给后端的钩子
# （``_save`` / ``_submit_command`` / ``_claim_commands``）。字段都已检查、规范化过，后端直接用。


@dataclass(frozen=True)
class SaveRequest:
    """一次 save：快照、期望的版本、随附的迁移记录、可选的租约条件。

    两处用它：``TaskStore.save`` 检查过入参后交给后端钩子 ``_save``（此时 transitions 已确认正好接上版本）；
    ``TaskStore.save_many`` 的每一项（组提交把多个任务的迁移交给存储一次写完；各项由 save_many 自己检查）。
    """

    snapshot: TaskSnapshot
    expect_version: int
    transitions: Sequence[Transition] = ()
    lease_expired_before: datetime | None = None

    @classmethod
    def _write_through(
        cls, snapshot: TaskSnapshot, expect_version: int, transitions: Sequence[Transition]
    ) -> SaveRequest:
        """写穿热路径专用（不带租约条件）：与 ``SaveRequest(snapshot, expect_version, transitions)`` 相等的
        一项，只是不经冻结 dataclass 的 ``__init__``——它逐个字段调用 ``object.__setattr__``，约 700 ns；直接
        填实例字典约 220 ns。写穿每个任务造三个（推迟写的 running、starting、交出的终态）。字段照样只能读、
        不能改（冻结的 ``__setattr__`` 不变）；这里不做任何检查，``__init__`` 本来也不做。"""
        request: SaveRequest = _new_object(cls)
        fields = request.__dict__
        fields["snapshot"] = snapshot
        fields["expect_version"] = expect_version
        fields["transitions"] = transitions
        fields["lease_expired_before"] = None
        return request


_new_object = object.__new__


@dataclass(frozen=True)
class CommandSubmission:
    """一条待写入的指令：动作已规范化为 CommandAction，payload 是 dict（JSON 检查由后端按自己的规则做）。"""

    task_id: str
    action: CommandAction
    issuer: str | None
    reason: str | None
    payload: dict[str, Any]

    def written(
        self, command_id: str, created_at: datetime, bucket: int | None, payload: Mapping[str, Any]
    ) -> Command:
        """后端写下这条指令后交回的 Command（还没人认领）：``payload`` 是按存下的文本读回的那份。"""
        return Command(
            command_id, self.task_id, self.action, self.issuer, self.reason, payload, created_at, bucket
        )


@dataclass(frozen=True)
class ClaimRequest:
    """一次认领：认领者、租约秒数、最多几条，以及规范化后的过滤集合（None = 不限）。"""

    claimant: str
    lease: float
    limit: int
    task_ids: frozenset[str] | None = None
    buckets: frozenset[int] | None = None
    holder: str | None = None
    """只取"任务行当前的 owner 就是它"的任务的指令（None = 不限）。持有者按自己的名字认领，不必每次
    带上手里全部 task_id（十万个排队任务时每 0.1 秒一次 O(N) 的参数）；任务换了持有者（adopt）之后，
    它的指令随任务行归新持有者，旧持有者不再取到。"""


@dataclass(frozen=True)
class TaskStats:
    """各状态计数。``unfinished`` 是非终态数量（含排队与暂停）。"""

    counts: Mapping[TaskStatus, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        full = {status: int(self.counts.get(status, 0)) for status in TaskStatus}
        object.__setattr__(self, "counts", full)

    @classmethod
    def of(cls, snapshots: Iterable[TaskSnapshot]) -> TaskStats:
        """对一组快照按状态计数（内存后端与无存储的 Controller 共用的参照实现）。"""
        return cls(Counter(snapshot.status for snapshot in snapshots))

    def __getitem__(self, status: TaskStatus | str) -> int:
        return self.counts[TaskStatus(status)]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def unfinished(self) -> int:
        return sum(n for status, n in self.counts.items() if status in NON_TERMINAL_STATUSES)

    def to_dict(self) -> dict[str, int]:
        return {status.value: n for status, n in self.counts.items()}


@dataclass(frozen=True)
class NodeRecord:
    """一个节点的成员记录：谁、负责哪些桶、最近一次心跳、活到什么时候。

    * ``buckets`` 为 None 表示不限定桶（未划分，对应 ``Controller(owned_buckets=None)``）；空集合表示
      "一个桶也不负责"（例如正在下线），两者不同，后端必须原样区分。
    * ``num_buckets`` 是节点自己的桶数：它与检查者的桶数不同时，节点算出的桶号与别人的不可比。
    * ``expires_at`` 之前节点算活着（``alive(now)``）。记录过期后不会自动删除：``list_nodes`` 照样
      列出，运维检查据此报告"心跳已过期的节点"。
    * ``info`` 是任意 JSON 对象（主机名、pid、版本……）。构造时经一次 JSON 往返规范化（元组变列表、
      键变字符串），所以任何后端读回的都与这里相等。
    """

    owner: str
    buckets: frozenset[int] | None
    num_buckets: int
    heartbeat_at: datetime
    expires_at: datetime
    info: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        check_node_owner(self.owner)
        num_buckets: object = self.num_buckets
        if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets <= 0:
            raise ConfigurationError(f"NodeRecord.num_buckets 必须是正整数，收到 {num_buckets!r}")
        if self.buckets is not None:
            raw: object = self.buckets
            if isinstance(raw, (str, bytes, int)) or not isinstance(raw, Iterable):
                raise ConfigurationError(
                    f"NodeRecord.buckets 必须是桶号的集合（例如 range(0, 16)）或 None，收到 {raw!r}"
                )
            buckets = frozenset(raw)
            for bucket in buckets:
                if isinstance(bucket, bool) or not isinstance(bucket, int):
                    raise ConfigurationError(f"NodeRecord.buckets 里只能放整数桶号，收到 {bucket!r}")
                if not 0 <= bucket < num_buckets:
                    raise ConfigurationError(
                        f"节点 {self.owner!r} 声明的桶号 {bucket} 越界：桶数为 {num_buckets}，"
                        f"合法范围是 0..{num_buckets - 1}"
                    )
            object.__setattr__(self, "buckets", buckets)
        for name in ("heartbeat_at", "expires_at"):
            check_aware(f"NodeRecord.{name}", getattr(self, name), required=True)
        if not self.expires_at > self.heartbeat_at:
            raise ConfigurationError(
                f"NodeRecord.expires_at（{self.expires_at.isoformat()}）必须晚于 heartbeat_at"
                f"（{self.heartbeat_at.isoformat()}）：存活期限要在心跳之后"
            )
        if not isinstance(self.info, Mapping):
            raise ConfigurationError(
                f"NodeRecord.info 必须是 dict（JSON 对象），收到 {type(self.info).__name__}"
            )
        text = check_json_value(dict(self.info), what="NodeRecord.info")
        object.__setattr__(self, "info", json.loads(text))

    def alive(self, now: datetime) -> bool:
        """``now`` 时节点是否还活着：严格早于 ``expires_at``（与指令租约"到点即过期"一致）。"""
        check_aware("alive() 的 now", now, required=True)
        return now < self.expires_at

    @property
    def partitioned(self) -> bool:
        """是否声明了桶（``buckets`` 不是 None）。"""
        return self.buckets is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "buckets": None if self.buckets is None else sorted(self.buckets),
            "num_buckets": self.num_buckets,
            "heartbeat_at": self.heartbeat_at.isoformat(timespec="microseconds"),
            "expires_at": self.expires_at.isoformat(timespec="microseconds"),
            "info": json.loads(json.dumps(dict(self.info))),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeRecord:
        """``to_dict()`` 的逆运算（给以 JSON 保存节点记录的后端用）。"""
        buckets = data.get("buckets")
        return cls(
            owner=data["owner"],
            buckets=None if buckets is None else frozenset(buckets),
            num_buckets=data["num_buckets"],
            heartbeat_at=datetime.fromisoformat(data["heartbeat_at"]),
            expires_at=datetime.fromisoformat(data["expires_at"]),
            info=dict(data.get("info") or {}),
        )


def count_buckets(snapshots: Iterable[TaskSnapshot]) -> dict[int, int]:
    """对一组快照按桶计数；无桶任务不计（``TaskStore.bucket_counts`` 的参照实现）。"""
    return dict(Counter(snapshot.bucket for snapshot in snapshots if snapshot.bucket is not None))


# ============================================================================================

# 归档与时间窗口保留（issue 20；存储指南 §9）
# ===================================================================================================


@dataclass(frozen=True)
class ArchivedTask:
    """``export_finished`` 的一项：一个整体离开在线库的终态任务。

    ``history`` 是它**此刻仍在线上**的迁移记录（更早的前缀可能已由 ``export_transitions`` 归档过），
    ``commands`` 是它的全部指令（按提交先后）——任务删掉之后指令就是孤儿，所以一并归档、一并删除。
    """

    snapshot: TaskSnapshot
    history: tuple[Transition, ...] = ()
    commands: tuple[Command, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.snapshot, TaskSnapshot):
            raise ConfigurationError(f"ArchivedTask.snapshot 必须是 TaskSnapshot，收到 {self.snapshot!r}")
        object.__setattr__(self, "history", tuple(self.history))
        object.__setattr__(self, "commands", tuple(self.commands))


def _receipt_key(name: str, key: object) -> tuple[str, int]:
    if (
        not isinstance(key, tuple)
        or len(key) != 2
        or not isinstance(key[0], str)
        or not key[0]
        or isinstance(key[1], bool)
        or not isinstance(key[1], int)
        or key[1] < 0
    ):
        raise ConfigurationError(
            f"ArchiveReceipt.{name} 的每一项必须是 (task_id, 非负整数版本)，收到 {key!r}"
        )
    return key


@dataclass(frozen=True)
class ArchiveReceipt:
    """归档器交回给存储的"已经落盘的东西"：``delete_archived`` 只删这里列出的行，别的一概不碰。

    * ``transitions``：迁移记录的键 ``(task_id, version)``（迁移记录只追加、不改写，键即内容）；
    * ``tasks``：整体归档的任务 ``(task_id, status_version)``——存储里的版本已经前进（终态任务又被
      重试了）就不删快照，归档里那份只是它当时的样子；
    * ``commands``：指令 id。

    用 ``ArchiveReceipt.of(transitions, tasks)`` 从导出的对象构造，不必手工拼键。
    """

    transitions: tuple[tuple[str, int], ...] = ()
    tasks: tuple[tuple[str, int], ...] = ()
    commands: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("transitions", "tasks"):
            value: object = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
                raise ConfigurationError(
                    f"ArchiveReceipt.{name} 必须是 (task_id, 版本) 的序列，收到 {value!r}"
                )
            object.__setattr__(self, name, tuple(_receipt_key(name, key) for key in value))
        commands: object = self.commands
        if isinstance(commands, (str, bytes)) or not isinstance(commands, Iterable):
            raise ConfigurationError(f"ArchiveReceipt.commands 必须是指令 id 的序列，收到 {commands!r}")
        ids = tuple(commands)
        for command_id in ids:
            if not isinstance(command_id, str) or not command_id:
                raise ConfigurationError(
                    f"ArchiveReceipt.commands 的每一项必须是非空字符串，收到 {command_id!r}"
                )
        object.__setattr__(self, "commands", ids)

    @classmethod
    def of(cls, transitions: Iterable[Transition] = (), tasks: Iterable[ArchivedTask] = ()) -> ArchiveReceipt:
        keys = [(record.task_id, record.version) for record in transitions]
        task_keys: list[tuple[str, int]] = []
        command_ids: list[str] = []
        for item in tasks:
            keys.extend((record.task_id, record.version) for record in item.history)
            task_keys.append((item.snapshot.task_id, item.snapshot.status_version))
            command_ids.extend(command.command_id for command in item.commands)
        return cls(transitions=tuple(keys), tasks=tuple(task_keys), commands=tuple(command_ids))

    def __bool__(self) -> bool:
        return bool(self.transitions or self.tasks or self.commands)


@dataclass(frozen=True)
class ArchiveDeleted:
    """``delete_archived`` 实际删掉的行数（回执里已经不在的行不计：重放是空操作）。"""

    transitions: int = 0
    tasks: int = 0
    commands: int = 0

    def __add__(self, other: ArchiveDeleted) -> ArchiveDeleted:
        return ArchiveDeleted(
            self.transitions + other.transitions, self.tasks + other.tasks, self.commands + other.commands
        )

    @property
    def total(self) -> int:
        return self.transitions + self.tasks + self.commands


def lease_is_held(lease_until: datetime | None, lease_expired_before: datetime | None) -> bool:
    """``save(lease_expired_before=...)`` 的条件不成立：存储里的租约在那一刻仍有效（有人在管它）。

    与 ``TaskQuery.lease_expired_before`` 同一判据：lease_until 为空或早于给定时刻才算过期。
    """
    return (
        lease_expired_before is not None and lease_until is not None and lease_until >= lease_expired_before
    )


def lease_held_message(task_id: str, lease_until: datetime | None) -> str:
    until = lease_until.isoformat(timespec="seconds") if lease_until is not None else "?"
    return (
        f"任务 {task_id!r} 的租约仍有效（lease_until={until}）：持有者刚续上了租约，"
        "它还在管这个任务，不能把它判为丢失"
    )


# -- 任务日志（issue 18；存储指南 §11）-------------------------------------------------------------

MAX_LOG_LINES = 1000
"""每个任务最多保留多少行日志：超出时丢最旧的（计数可由 ``log_stats`` 读出）。日志是排障辅助，不是审计
轨迹：一个刷屏的任务不能把存储撑爆，也不能让 ``logs`` 一次读出几百万行。"""

MAX_LOG_MESSAGE_BYTES = 4096
"""一行日志正文的上限（UTF-8 字节，含截断标记）。"""

LOG_TRUNCATED_MARKER = "…[已截断]"
"""超长正文被截断时追加在末尾的标记（``truncated`` 同时为 True，读者不必解析文本）。"""


def bound_log_message(message: str) -> tuple[str, bool]:
    """把正文限制在 ``MAX_LOG_MESSAGE_BYTES`` 字节内：(正文, 是否截断)。按字符截，不会切坏多字节字符。"""
    encoded = message.encode("utf-8", "surrogatepass")
    if len(encoded) <= MAX_LOG_MESSAGE_BYTES:
        return message, False
    room = MAX_LOG_MESSAGE_BYTES - len(LOG_TRUNCATED_MARKER.encode("utf-8"))
    # errors="ignore" 丢掉被切断的半个多字节字符，保证结果仍是合法 UTF-8 且不超限。
    head = encoded[:room].decode("utf-8", "ignore")
    return head + LOG_TRUNCATED_MARKER, True


MAX_LOG_WRITER_CHARS = 64
"""``LogLine.writer`` 最多多少个字符（可打印 ASCII）。运行时用的是 32 位十六进制的 uuid。"""


def check_log_writer(writer: object, writer_seq: int) -> None:
    """幂等身份要么整个没有（``""`` 与 0），要么两半都在：1..64 个可打印 ASCII 字符、行号 ≥ 1。"""
    if writer == "" and writer_seq == 0:
        return  # 最常见的情形（读回的行、不带身份的行）：一次比较
    if not isinstance(writer, str) or len(writer) > MAX_LOG_WRITER_CHARS:
        raise ConfigurationError(
            f"LogLine.writer 必须是不超过 {MAX_LOG_WRITER_CHARS} 个字符的字符串，收到 {writer!r}"
        )
    if writer and not (writer.isascii() and writer.isprintable()):
        raise ConfigurationError(f"LogLine.writer 只能含可打印的 ASCII 字符，收到 {writer!r}")
    if bool(writer) != (writer_seq > 0):
        raise ConfigurationError(
            "LogLine.writer 与 writer_seq 要么都给（writer 非空、writer_seq ≥ 1），要么都不给，"
            f"收到 writer={writer!r}、writer_seq={writer_seq!r}"
        )


def checked_log_line(
    task_id: str,
    attempt: int,
    at: datetime,
    level: str,
    message: str,
    seq: int,
    truncated: bool,
    writer: str,
    writer_seq: int,
) -> LogLine:
    """不再校验地造一行 ``LogLine``：给手里的每个值都已经按 ``__post_init__`` 的规则查过的调用方（运行时的日志
    缓冲刚查过的行、内存存储读回它存下时查过的值）。``LogLine(...)`` 每行要把九个字段逐个再查一遍，这两处
    每个写日志的任务都要走一次。值不合法时结果是一个坏的 LogLine：拿不准就用构造函数。"""
    line: LogLine = object.__new__(LogLine)
    line.__dict__.update(
        task_id=task_id,
        attempt=attempt,
        at=at,
        level=level,
        message=message,
        seq=seq,
        truncated=truncated,
        writer=writer,
        writer_seq=writer_seq,
    )
    return line


def unseen_log_lines(
    lines: Sequence[LogLine], seen: Mapping[str, int]
) -> tuple[list[LogLine], dict[str, int]]:
    """同一任务的一批行里存储还没有的那些（按原顺序），以及要记下的新水位线（只含变了的写入者）。

    ``seen`` 是存储为这个任务记下的"每个写入者已接受的最大 writer_seq"。一行的 writer_seq 不大于它写入者的
    水位线就是写过的（重试的那一批，或与上一批部分重叠的那几行），跳过：不分配 seq，也不算进 ``dropped``。

    为什么是"每写入者一条水位线"，而不是给每行一个唯一约束、``ON CONFLICT DO NOTHING``：存储每任务只留
    最新的 ``MAX_LOG_LINES`` 行，一批超过上限的行里最旧的那些在同一事务里就被删掉了，它们的身份也跟着没了；
    重试时这些行会被当成新行再插一遍、拿到更大的 seq，反把真正最新的行挤掉。水位线不随行删除，永远认得出。
    它要求同一写入者给同一任务的行号严格递增、按号的顺序写入——运行时的缓冲正是这样（串行 flush，失败的
    一批原样放回队首）。写入者标识在每个 Controller 的缓冲里随机生成：两个进程（同一任务的两次尝试、被别的
    持有者接手重跑）的行号各自独立，互不吞行。
    """
    marks = dict(seen)
    fresh = [line for line in lines if accept_log_line(line, marks)]
    changed = {writer: n for writer, n in marks.items() if seen.get(writer) != n}
    return fresh, changed


def accept_log_line(line: LogLine, marks: dict[str, int]) -> bool:
    """水位线规则的单行形式（``unseen_log_lines`` 就是逐行调用它）：这一行存储还没有吗？是的话就地把它写入者
    的水位线推到它的号。不带身份的行总是新的。给在一把锁里逐行写入的存储用（内存存储），免得为每批先按任务
    分组、再拷一份水位线。"""
    writer = line.writer
    if not writer:
        return True
    if line.writer_seq <= marks.get(writer, 0):
        return False
    marks[writer] = line.writer_seq
    return True


@dataclass(frozen=True)
class PartitionArchived:
    """``archive_partition`` 的结果：整块归档、丢弃一个过期分区（存储指南 §9）。

    * ``exported``：交给归档器写进段里的迁移记录条数；
    * ``kept``：分区里不属于"可归档前缀"的行（时钟偏差造成的乱序），丢弃分区之前已移回在线表；
    * ``dropped``：分区已经 DETACH + DROP。为 False 时什么也没删（事务已回滚），``reason`` 说明原因——
      没有属主权限、拿不到锁、导出期间分区被并发改动——这时归档器按段里的键逐行删除，结果一样，只是慢一些。
    """

    exported: int = 0
    kept: int = 0
    dropped: bool = False
    reason: str | None = None


@dataclass(frozen=True)
class LogLine:
    """任务的一行日志（``ctx.log`` 写出的那一行）。

    * ``seq`` 由存储按任务分配（从 1 起、严格递增、不复用），写入时传的值被忽略（习惯上传 0）：
      ``logs --follow`` 按 ``after_seq`` 续读，写入方有几个、换没换节点都不会重号或乱序。
    * ``attempt`` 是写这行时的第几次尝试（重试后仍可按尝试读取）。
    * 构造时就把正文限制在 4 KB（``bound_log_message``）：每个后端存下的都是同一份文本。
    * ``level`` 是 stdlib logging 的级别名（``INFO``、``WARNING``……），非空、不超过 16 个字符。
    * ``writer`` / ``writer_seq`` 是这一行的**幂等身份**（只在写入时有意义，读回的行里是 ``""`` / 0）：
      写入方的标识加上它自己给的、严格递增的行号（见 ``unseen_log_lines``）。结果未知的一批被重试时，存储
      凭它认出已经写过的行，不会写第二遍。不带身份（``writer=""``）的行每次都追加。
    """

    task_id: str
    attempt: int
    at: datetime
    level: str
    message: str
    seq: int = 0
    truncated: bool = False
    writer: str = ""
    writer_seq: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.task_id, str) or not self.task_id:
            raise ConfigurationError(f"LogLine.task_id 必须是非空字符串，收到 {self.task_id!r}")
        for name in ("attempt", "seq", "writer_seq"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
                raise ConfigurationError(f"LogLine.{name} 必须是非负整数，收到 {value!r}")
        check_aware("LogLine.at", self.at, required=True)
        if not isinstance(self.level, str) or not 0 < len(self.level) <= 16:
            raise ConfigurationError(
                f"LogLine.level 必须是 1..16 个字符的级别名（如 INFO），收到 {self.level!r}"
            )
        if not isinstance(self.message, str):
            raise ConfigurationError(f"LogLine.message 必须是字符串，收到 {type(self.message).__name__}")
        if not isinstance(self.truncated, bool):
            raise ConfigurationError(f"LogLine.truncated 必须是 bool，收到 {self.truncated!r}")
        check_log_writer(self.writer, self.writer_seq)
        message, cut = bound_log_message(self.message)
        if cut:
            object.__setattr__(self, "message", message)
            object.__setattr__(self, "truncated", True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "attempt": self.attempt,
            "seq": self.seq,
            "at": self.at.isoformat(timespec="microseconds"),
            "level": self.level,
            "message": self.message,
            "truncated": self.truncated,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LogLine:
        """``to_dict()`` 的逆运算（给以 JSON 保存日志的后端用）。"""
        return cls(
            task_id=data["task_id"],
            attempt=int(data["attempt"]),
            seq=int(data["seq"]),
            at=datetime.fromisoformat(data["at"]),
            level=data["level"],
            message=data["message"],
            truncated=bool(data.get("truncated", False)),
        )


@dataclass(frozen=True)
class LogStats:
    """某任务的日志计数：``kept`` 仍保存的行数、``dropped`` 因超出上限被丢掉的最旧行数、``last_seq``
    最后分配的序号（没有日志为 0）。序号连续且只丢最旧的，所以 ``dropped == last_seq - kept``。"""

    kept: int = 0
    dropped: int = 0
    last_seq: int = 0


__all__ = [
    "LOG_TRUNCATED_MARKER",
    "MAX_LOG_LINES",
    "MAX_LOG_MESSAGE_BYTES",
    "MAX_LOG_WRITER_CHARS",
    "SIDE_CHANNEL_FIELDS",
    "ArchiveDeleted",
    "ArchiveReceipt",
    "ArchivedTask",
    "ClaimRequest",
    "Command",
    "CommandAction",
    "CommandSubmission",
    "LogLine",
    "LogStats",
    "NodeRecord",
    "PartitionArchived",
    "QueryOrder",
    "SaveRequest",
    "TaskQuery",
    "TaskStats",
    "accept_log_line",
    "as_query",
    "awaits_claim",
    "bound_log_message",
    "check_log_writer",
    "checked_log_line",
    "count_buckets",
    "lease_held_message",
    "lease_is_held",
    "unseen_log_lines",
]
