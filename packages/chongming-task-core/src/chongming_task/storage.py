"""持久层契约：TaskStore、TaskQuery、Command、TaskStats、NodeRecord。

五类流量刻意分开，因为写入频次与一致性要求不同：

* 快照（create / save / get / query / stats / bucket_counts）：参与乐观并发（status_version）。
* 审计轨迹（append / history）：只追加，按 (task_id, version) 幂等。
* 高频旁路（touch）：进度、心跳、租约。不碰版本号，也不与 save 冲突——save 从不改写这四个
  字段，它们只由 create（初值）与 touch 写入。否则进度上报会与状态写入持续冲突。
* 控制指令（submit_command / claim_commands / complete_command / release_command）：跨进程控制的
  媒介。取走指令带租约：持有者崩溃后租约到期，指令可被重新取走。
* 节点成员（publish_node / list_nodes / remove_node）：每个节点定期发布"我是谁、负责哪些桶、
  活到什么时候"。它是运维检查（桶重复 / 空洞、孤儿任务）的权威来源，与任务数据互不影响。

每个后端都必须通过 ``chongming_task.testing.store_contract.StoreContract``。逐条语义见
docs/store-guide.md（持久层实现指南）。
"""

from __future__ import annotations

import enum
import json
import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any

from chongming_task.errors import ConfigurationError
from chongming_task.models import Progress, TaskSnapshot, Transition, normalize_tags
from chongming_task.states import NON_TERMINAL_STATUSES, TaskStatus

SIDE_CHANNEL_FIELDS = frozenset({"progress", "last_heartbeat_at", "lease_owner", "lease_until"})
"""只由 touch（及 create 的初值）写入的字段；save 从不改写它们。"""


class QueryOrder(enum.StrEnum):
    """查询结果的顺序：按 (created_at, task_id) 排序。"""

    NEWEST_FIRST = "newest"
    OLDEST_FIRST = "oldest"


def _aware(name: str, value: datetime | None) -> None:
    if value is not None and (not isinstance(value, datetime) or value.utcoffset() is None):
        raise ConfigurationError(f"TaskQuery.{name} 必须是带时区的 datetime，收到 {value!r}")


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
                if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 0:
                    raise ConfigurationError(f"TaskQuery.buckets 里只能放非负整数桶号，收到 {bucket!r}")
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
        for name in ("created_after", "created_before", "lease_expired_before"):
            _aware(name, getattr(self, name))
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


def escape_like(prefix: str, escape: str = "\\") -> str:
    """把前缀转成 LIKE 模式：``%`` ``_`` 与转义符本身按字面匹配，再在末尾加 ``%``。"""
    escaped = prefix.replace(escape, escape + escape).replace("%", escape + "%").replace("_", escape + "_")
    return escaped + "%"


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


# 非默认参数的 json.dumps 每次都要新建一个编码器；复用一个（JSONEncoder.encode 无状态，线程安全）。
_STRICT_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def check_node_owner(owner: object) -> str:
    """节点名：非空字符串、不含 NUL（PostgreSQL 的 text 存不下 NUL）。"""
    if not isinstance(owner, str) or not owner:
        raise ConfigurationError(f"节点名 owner 必须是非空字符串（例如 'node-a'），收到 {owner!r}")
    if "\x00" in owner:
        raise ConfigurationError("节点名 owner 不能包含 NUL 字符（\\x00）")
    return owner


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
            value = getattr(self, name)
            if not isinstance(value, datetime) or value.utcoffset() is None:
                raise ConfigurationError(f"NodeRecord.{name} 必须是带时区的 datetime，收到 {value!r}")
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
        if not isinstance(now, datetime) or now.utcoffset() is None:
            raise ConfigurationError(f"alive() 需要带时区的 datetime，收到 {now!r}")
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


def check_node_record(record: object) -> NodeRecord:
    """publish_node 的参数检查：只接受 NodeRecord（字段已在构造时校验过）。"""
    if not isinstance(record, NodeRecord):
        raise ConfigurationError(f"publish_node 只接受 NodeRecord，收到 {type(record).__name__}")
    return record


def count_buckets(snapshots: Iterable[TaskSnapshot]) -> dict[int, int]:
    """对一组快照按桶计数；无桶任务不计（``TaskStore.bucket_counts`` 的参照实现）。"""
    return dict(Counter(snapshot.bucket for snapshot in snapshots if snapshot.bucket is not None))


def check_json_value(value: Any, *, what: str = "outcome") -> str:
    """把值序列化为严格 JSON 文本；不可序列化（或含 NaN/inf）时抛 ConfigurationError 说明原因。"""
    if value is None:
        return "null"  # 最常见的返回值：不必为它走一遍编码器
    try:
        return _STRICT_JSON.encode(value)
    except (TypeError, ValueError) as exc:
        # 中文名词与"必须"之间不留空格；英文标识符（outcome、NodeRecord.info）后面照常空一格。
        gap = " " if what[-1:].isascii() else ""
        raise ConfigurationError(
            f"{what}{gap}必须可 JSON 序列化（dict / list / str / 数字 / bool / None）：{exc}"
        ) from None


def validate_save(snapshot: TaskSnapshot, expect_version: int, transitions: Sequence[Transition]) -> None:
    """save() 的参数一致性：迁移记录必须正好覆盖 expect_version+1 .. snapshot.status_version。

    各后端在写入之前调用它，保证历史不会因调用方的错误而出现空洞或重复。
    """
    if isinstance(expect_version, bool) or not isinstance(expect_version, int) or expect_version < 0:
        raise ConfigurationError(f"expect_version 必须是非负整数，收到 {expect_version!r}")
    if snapshot.status_version < expect_version:
        raise ConfigurationError(
            f"快照版本 {snapshot.status_version} 小于 expect_version {expect_version}：版本号只能前进"
        )
    if transitions:
        versions = [t.version for t in transitions]
        expected = list(range(expect_version + 1, snapshot.status_version + 1))
        if versions != expected:
            raise ConfigurationError(f"随 save 提交的迁移记录版本必须正好是 {expected}，收到 {versions}")
        for record in transitions:
            if record.task_id != snapshot.task_id:
                raise ConfigurationError(f"迁移记录属于任务 {record.task_id!r}，不属于 {snapshot.task_id!r}")
        if transitions[-1].to_status is not snapshot.status:
            raise ConfigurationError("最后一条迁移记录的目标状态必须等于快照状态")


MAX_LEASE_SECONDS = 10 * 365 * 24 * 3600


def validate_lease(lease: float) -> None:
    if (
        isinstance(lease, bool)
        or not isinstance(lease, (int, float))
        or not math.isfinite(lease)
        or lease <= 0
    ):
        raise ConfigurationError(f"指令租约必须是正的秒数，收到 {lease!r}")
    if lease > MAX_LEASE_SECONDS:
        # 否则 now + lease 越过 datetime 的上限，在后端深处变成 OverflowError。
        raise ConfigurationError(f"指令租约过长（{lease!r} 秒）：上限是 {MAX_LEASE_SECONDS} 秒（10 年）")


class TaskStore(ABC):
    """持久层契约（18 个抽象方法，五类流量）。实现必须线程安全；多进程共享同一存储时语义不变。"""

    # -- snapshots ----------------------------------------------------------------------------------

    @abstractmethod
    def create(self, snapshot: TaskSnapshot, transitions: Sequence[Transition] = ()) -> None:
        """写入新任务（连同已有的迁移记录）。task_id 已存在 → DuplicateTaskId，什么也不写。

        旁路字段（progress / last_heartbeat_at / lease_*）以快照里的值为初值。outcome 必须能通过
        ``check_json_value``，否则 ConfigurationError，什么也不写。
        """

    @abstractmethod
    def save(
        self, snapshot: TaskSnapshot, *, expect_version: int, transitions: Sequence[Transition] = ()
    ) -> None:
        """原子地写入快照与它新增的迁移记录。

        存储中的 status_version 不等于 expect_version → ConcurrencyConflict，什么也不写。
        任务不存在 → TaskNotFound。不改写旁路字段（progress / last_heartbeat_at / lease_*）。
        参数自相矛盾（``validate_save`` 不通过、outcome 不是 JSON）→ ConfigurationError，什么也不写。
        """

    @abstractmethod
    def get(self, task_id: str) -> TaskSnapshot | None:
        """单个快照；不存在返回 None。返回的对象与存储无共享可变状态（改返回的 outcome 不影响存储）。"""

    @abstractmethod
    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        """按条件查询，语义与 ``TaskQuery.apply`` 逐条一致。"""

    @abstractmethod
    def stats(self, query: TaskQuery | None = None) -> TaskStats:
        """满足条件（忽略 limit）的任务按状态计数。"""

    @abstractmethod
    def bucket_counts(self, query: TaskQuery | None = None) -> dict[int, int]:
        """满足条件（忽略 limit）的任务按桶计数；无桶任务不计。"""

    # -- history ------------------------------------------------------------------------------------

    @abstractmethod
    def append(self, transitions: Sequence[Transition]) -> None:
        """只追加；(task_id, version) 已存在的记录被忽略（幂等，先写者为准）。

        批中有存储里不存在的任务 → TaskNotFound，整批不写（否则会留下 prune 永远删不掉的孤儿历史）。
        """

    @abstractmethod
    def history(self, task_id: str) -> list[Transition]:
        """某任务的全部迁移记录，按版本升序。"""

    # -- side channel -------------------------------------------------------------------------------

    @abstractmethod
    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        """更新旁路字段（None 表示不改）。不递增 status_version，不与 save 冲突。任务不存在返回 False。"""

    def touch_many(self, updates: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """批量 touch：``[(task_id, {"progress": ..., ...}), ...]``。后端可覆盖为一次事务。"""
        for task_id, fields in updates:
            self.touch(task_id, **fields)

    # -- commands -----------------------------------------------------------------------------------

    @abstractmethod
    def submit_command(
        self,
        task_id: str,
        action: CommandAction | str,
        *,
        issuer: str | None = None,
        reason: str | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> Command:
        """写一条指令。任务不存在 → TaskNotFound。指令记下任务当时的桶号，供按桶认领。"""

    @abstractmethod
    def claim_commands(
        self,
        claimant: str,
        *,
        lease: float,
        limit: int = 100,
        task_ids: Iterable[str] | None = None,
        buckets: Iterable[int] | None = None,
    ) -> list[Command]:
        """取走未完成、且未被认领或租约已过期的指令（按提交先后），设租约 ``lease`` 秒。

        被取走的指令在租约内对任何认领者（包括持有者自己）不可见；``lease_until <= now`` 即过期，
        可被重新取走（deliveries 加一）。"先后"须由存储自己的顺序号决定：同一时刻提交的指令也要有序。
        ``now`` 取自存储注入的时钟（若有）。``task_ids`` / ``buckets`` 同时给出时取交集；桶为空的
        指令不会被按桶认领。``lease`` 不是正的有限秒数 → ConfigurationError。
        """

    @abstractmethod
    def complete_command(self, command_id: str, claimant: str) -> bool:
        """标记执行完毕。仅当指令由 ``claimant`` 持有（或已由它完成，幂等）时返回 True。

        租约过期但尚未被别人接手时，原持有者仍可完成；一旦被别人重新取走，原持有者得到 False。
        未知的 command_id → False。
        """

    @abstractmethod
    def release_command(self, command_id: str, claimant: str) -> bool:
        """交还指令：立即可被其他认领者取走。仅当由 ``claimant`` 持有且尚未完成时返回 True。

        取到不属于自己的指令时必须交还，而不是完成——完成会让真正的持有者永远收不到它。
        """

    # -- membership ---------------------------------------------------------------------------------

    @abstractmethod
    def publish_node(self, record: NodeRecord) -> None:
        """写入（或整体替换）``record.owner`` 的成员记录：按 owner 覆盖，后写者为准。

        节点按固定节奏调用它作为心跳。不是 NodeRecord → ConfigurationError，什么也不写。
        ``buckets`` 的 None 与空集合、时间的原始时区偏移与微秒、info 里的任意 JSON 都必须原样往返。
        """

    @abstractmethod
    def list_nodes(self) -> list[NodeRecord]:
        """全部成员记录（包括已过期的），按 owner 升序（码点序，与 Python 的 str 比较一致）。

        存储不判断死活、也不自动清理过期记录：那是检查者拿自己的"现在"去判断的事。
        """

    @abstractmethod
    def remove_node(self, owner: str) -> bool:
        """删除某节点的记录（节点正常退出时调用）。删掉了返回 True，本来就没有返回 False。

        owner 不是非空字符串 → ConfigurationError。
        """

    # -- upkeep -------------------------------------------------------------------------------------

    @abstractmethod
    def prune(self, keep_terminal: int) -> int:
        """删除最旧的终态任务（按 finished_at；缺 finished_at 的视为最旧）及其历史与指令，
        只保留最新 keep_terminal 个。

        绝不删除非终态任务。返回删除的任务数。keep_terminal 为负 → ConfigurationError。
        """

    @abstractmethod
    def close(self) -> None:
        """释放资源。幂等；关闭后再调用其他方法 → StoreError。"""

    # -- conveniences -------------------------------------------------------------------------------

    def __enter__(self) -> TaskStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


__all__ = [
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
