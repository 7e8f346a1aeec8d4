"""快照 / 迁移记录 / 指令与 SQL 参数、结果行之间的转换。

PostgreSQL 存不下、而 Python 里合法的输入（text 里的 NUL、jsonb 里的 ``\\u0000``、超出 bigint 的整数）
在这里或在执行时被转换成 ConfigurationError：宁可明确拒绝，也不写入一行被改写过的数据。
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from decimal import Decimal
from typing import Any

from chongming_task.errors import ConfigurationError
from chongming_task.models import Failure, Progress, TaskSnapshot, Transition
from chongming_task.states import TaskStatus
from chongming_task.storage import Command, CommandAction, NodeRecord, check_json_value

_MICROSECOND = timedelta(microseconds=1)

# json.dumps 把 NUL 写成 \u0000；字面的反斜杠写成 \\。所以只有前面是偶数个反斜杠的 \u0000 才是 NUL。
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

_TZ_CACHE: dict[int, tzinfo] = {0: UTC}


def split_dt(value: datetime | None) -> tuple[datetime | None, int | None]:
    """(时刻, 原始 UTC 偏移的微秒数)。timestamptz 只存时刻，偏移单独存一列以便逐字往返。"""
    if value is None:
        return None, None
    offset = value.utcoffset()
    if offset is None:  # 模型层已拒绝 naive 时间；这里再挡一次，免得数据库按会话时区猜
        raise ConfigurationError(f"时间必须带时区，收到 {value!r}")
    return value, offset // _MICROSECOND


def join_dt(value: datetime | None, offset_us: int | None) -> datetime | None:
    if value is None:
        return None
    offset = offset_us or 0
    tz = _TZ_CACHE.get(offset)
    if tz is None:
        tz = timezone(timedelta(microseconds=offset))
        _TZ_CACHE[offset] = tz
    return value.astimezone(tz)


def check_text(value: str | None, what: str) -> str | None:
    if value is not None and "\x00" in value:
        raise ConfigurationError(f"{what} 不能包含 NUL 字符（\\x00）：PostgreSQL 的 text 无法保存它")
    return value


def json_text(value: Any, what: str) -> str:
    """严格 JSON 文本；含 NUL 的字符串被拒绝（jsonb 不接受 \\u0000）。"""
    text = check_json_value(value, what=what)
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise ConfigurationError(
            f"{what} 里的字符串不能包含 NUL 字符（\\x00）：PostgreSQL 的 jsonb 无法保存它，请先去掉或转义"
        )
    if ("e" in text or "E" in text) and _has_exponent_float(value):
        return _plain_json(value)
    return text


def _has_exponent_float(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if "e" in repr(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def _plain_json(value: Any) -> str:
    """与 json.dumps 相同，只是浮点数一律写成带小数点的定点形式。

    为什么：jsonb 把数字存成 numeric，``1e+17`` 读回来是整数 100000000000000000，
    ``1.0629773069210299e+17`` 读回来是与原浮点数不相等的整数——类型与值都变了。定点写法
    （``106297730692102990.0``）带着小数点，numeric 保留它，读回时 json.loads 给出的正是原来的浮点数
    （repr 是最短的可往返十进制串，它的定点展开表示同一个值）。
    """
    if isinstance(value, float):
        plain = format(Decimal(repr(value)), "f")
        return plain if "." in plain else plain + ".0"
    if isinstance(value, dict):
        items = []
        for key, item in value.items():
            # 非字符串键按 json.dumps 的规则变成字符串（1.5 → "1.5"、True → "true"）。
            key_text = key if isinstance(key, str) else json.dumps({key: None})[2:-8]
            items.append(json.dumps(key_text, ensure_ascii=False) + ":" + _plain_json(item))
        return "{" + ",".join(items) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_plain_json(item) for item in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def optional_json(value: Any, what: str) -> str | None:
    return None if value is None else json_text(value, what)


# -- tasks -------------------------------------------------------------------------------------------

TASK_COLUMNS = (
    "task_id",
    "name",
    "label",
    "status",
    "status_version",
    "attempt",
    "max_attempts",
    "created_at",
    "created_at_off",
    "queued_at",
    "queued_at_off",
    "started_at",
    "started_at_off",
    "finished_at",
    "finished_at_off",
    "last_heartbeat_at",
    "last_heartbeat_at_off",
    "progress",
    "failure",
    "outcome",
    "tags",
    "priority",
    "bucket",
    "bucket_key",
    "executor",
    "pid",
    "owner",
    "lease_owner",
    "lease_until",
    "lease_until_off",
    "pipeline_id",
    "node_id",
    "retry_at",
    "retry_at_off",
    "description",
)

JSONB_COLUMNS = frozenset({"progress", "failure", "outcome"})

SIDE_CHANNEL_COLUMNS = frozenset(
    {
        "progress",
        "last_heartbeat_at",
        "last_heartbeat_at_off",
        "lease_owner",
        "lease_until",
        "lease_until_off",
    }
)
"""save 从不改写的列（SIDE_CHANNEL_FIELDS 及其偏移列）：它们只由 create 与 touch 写入。"""

SAVE_COLUMNS = tuple(c for c in TASK_COLUMNS if c not in SIDE_CHANNEL_COLUMNS and c != "task_id")

_TEXT_FIELDS = (
    "label",
    "bucket_key",
    "executor",
    "owner",
    "lease_owner",
    "pipeline_id",
    "node_id",
    "description",
)


def task_params(snapshot: TaskSnapshot) -> dict[str, Any]:
    """一个快照对应的全部列值（jsonb 列是 JSON 文本，SQL 里再 ::jsonb）。"""
    for name in _TEXT_FIELDS:
        check_text(getattr(snapshot, name), f"快照字段 {name}")
    params: dict[str, Any] = {
        "task_id": snapshot.task_id,
        "name": snapshot.name,
        "label": snapshot.label,
        "status": snapshot.status.value,
        "status_version": snapshot.status_version,
        "attempt": snapshot.attempt,
        "max_attempts": snapshot.max_attempts,
        "progress": None if snapshot.progress is None else json_text(snapshot.progress.to_dict(), "progress"),
        "failure": None if snapshot.failure is None else json_text(snapshot.failure.to_dict(), "failure"),
        "outcome": optional_json(snapshot.outcome, "outcome"),
        "tags": sorted(snapshot.tags),
        "priority": snapshot.priority,
        "bucket": snapshot.bucket,
        "bucket_key": snapshot.bucket_key,
        "executor": snapshot.executor,
        "pid": snapshot.pid,
        "owner": snapshot.owner,
        "lease_owner": snapshot.lease_owner,
        "pipeline_id": snapshot.pipeline_id,
        "node_id": snapshot.node_id,
        "description": snapshot.description,
    }
    for name in (
        "created_at",
        "queued_at",
        "started_at",
        "finished_at",
        "last_heartbeat_at",
        "lease_until",
        "retry_at",
    ):
        params[name], params[name + "_off"] = split_dt(getattr(snapshot, name))
    return params


def snapshot_from_row(row: Sequence[Any]) -> TaskSnapshot:
    """按 TASK_COLUMNS 的顺序把一行还原成快照。"""
    (
        task_id,
        name,
        label,
        status,
        status_version,
        attempt,
        max_attempts,
        created_at,
        created_at_off,
        queued_at,
        queued_at_off,
        started_at,
        started_at_off,
        finished_at,
        finished_at_off,
        last_heartbeat_at,
        last_heartbeat_at_off,
        progress,
        failure,
        outcome,
        tags,
        priority,
        bucket,
        bucket_key,
        executor,
        pid,
        owner,
        lease_owner,
        lease_until,
        lease_until_off,
        pipeline_id,
        node_id,
        retry_at,
        retry_at_off,
        description,
    ) = row
    created = join_dt(created_at, created_at_off)
    assert created is not None  # NOT NULL 列
    return TaskSnapshot(
        task_id=task_id,
        name=name,
        label=label,
        status=TaskStatus(status),
        status_version=status_version,
        attempt=attempt,
        max_attempts=max_attempts,
        created_at=created,
        queued_at=join_dt(queued_at, queued_at_off),
        started_at=join_dt(started_at, started_at_off),
        finished_at=join_dt(finished_at, finished_at_off),
        last_heartbeat_at=join_dt(last_heartbeat_at, last_heartbeat_at_off),
        progress=None if progress is None else Progress.from_dict(progress),
        failure=None if failure is None else Failure.from_dict(failure),
        outcome=outcome,
        tags=frozenset(tags),
        priority=priority,
        bucket=bucket,
        bucket_key=bucket_key,
        executor=executor,
        pid=pid,
        owner=owner,
        lease_owner=lease_owner,
        lease_until=join_dt(lease_until, lease_until_off),
        pipeline_id=pipeline_id,
        node_id=node_id,
        retry_at=join_dt(retry_at, retry_at_off),
        description=description,
    )


# -- transitions -------------------------------------------------------------------------------------

TRANSITION_COLUMNS = (
    "task_id",
    "version",
    "from_status",
    "to_status",
    "trigger",
    "actor",
    "reason",
    "at",
    "at_off",
)


def transition_arrays(transitions: Sequence[Transition]) -> list[list[Any]]:
    """按列拆成数组，供 ``unnest(...)`` 一次插入多行（一条语句、一次往返）。"""
    columns: list[list[Any]] = [[] for _ in TRANSITION_COLUMNS]
    for record in transitions:
        if not isinstance(record, Transition):
            raise ConfigurationError(f"迁移记录必须是 Transition，收到 {type(record).__name__}")
        check_text(record.trigger, "迁移记录的 trigger")
        check_text(record.actor, "迁移记录的 actor")
        check_text(record.reason, "迁移记录的 reason")
        at, at_off = split_dt(record.at)
        values = (
            record.task_id,
            record.version,
            TaskStatus(record.from_status).value,
            TaskStatus(record.to_status).value,
            record.trigger,
            record.actor,
            record.reason,
            at,
            at_off,
        )
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    return columns


def transition_from_row(row: Sequence[Any]) -> Transition:
    task_id, version, from_status, to_status, trigger, actor, reason, at, at_off = row
    moment = join_dt(at, at_off)
    assert moment is not None
    return Transition(
        task_id=task_id,
        from_status=TaskStatus(from_status),
        to_status=TaskStatus(to_status),
        trigger=trigger,
        actor=actor,
        reason=reason,
        version=version,
        at=moment,
    )


# -- commands ----------------------------------------------------------------------------------------

COMMAND_COLUMNS = (
    "command_id",
    "task_id",
    "action",
    "issuer",
    "reason",
    "payload",
    "created_at",
    "created_at_off",
    "bucket",
    "claimant",
    "lease_until",
    "lease_until_off",
    "deliveries",
    "completed_at",
    "completed_at_off",
)


def command_from_row(row: Sequence[Any]) -> Command:
    (
        command_id,
        task_id,
        action,
        issuer,
        reason,
        payload,
        created_at,
        created_at_off,
        bucket,
        claimant,
        lease_until,
        lease_until_off,
        deliveries,
        completed_at,
        completed_at_off,
    ) = row
    created = join_dt(created_at, created_at_off)
    assert created is not None
    return Command(
        command_id=command_id,
        task_id=task_id,
        action=CommandAction(action),
        issuer=issuer,
        reason=reason,
        payload=dict(payload) if isinstance(payload, Mapping) else {},
        created_at=created,
        bucket=bucket,
        claimant=claimant,
        lease_until=join_dt(lease_until, lease_until_off),
        deliveries=deliveries,
        completed_at=join_dt(completed_at, completed_at_off),
    )


# -- nodes -------------------------------------------------------------------------------------------

NODE_COLUMNS = (
    "owner",
    "buckets",
    "num_buckets",
    "heartbeat_at",
    "heartbeat_at_off",
    "expires_at",
    "expires_at_off",
    "info",
)


def node_params(record: NodeRecord) -> dict[str, Any]:
    """节点记录 → 列值。buckets 升序的 bigint[]；None 存 NULL（与空数组 '{}' 不同）。"""
    heartbeat_at, heartbeat_off = split_dt(record.heartbeat_at)
    expires_at, expires_off = split_dt(record.expires_at)
    return {
        "owner": check_text(record.owner, "节点名 owner"),
        "buckets": None if record.buckets is None else sorted(record.buckets),
        "num_buckets": record.num_buckets,
        "heartbeat_at": heartbeat_at,
        "heartbeat_at_off": heartbeat_off,
        "expires_at": expires_at,
        "expires_at_off": expires_off,
        "info": json_text(dict(record.info), "NodeRecord.info"),
    }


def node_from_row(row: Sequence[Any]) -> NodeRecord:
    owner, buckets, num_buckets, heartbeat_at, heartbeat_off, expires_at, expires_off, info = row
    heartbeat = join_dt(heartbeat_at, heartbeat_off)
    expires = join_dt(expires_at, expires_off)
    assert heartbeat is not None and expires is not None
    return NodeRecord(
        owner=owner,
        buckets=None if buckets is None else frozenset(int(b) for b in buckets),
        num_buckets=int(num_buckets),
        heartbeat_at=heartbeat,
        expires_at=expires,
        info=dict(info) if isinstance(info, Mapping) else {},
    )


__all__ = [
    "COMMAND_COLUMNS",
    "JSONB_COLUMNS",
    "NODE_COLUMNS",
    "SAVE_COLUMNS",
    "TASK_COLUMNS",
    "TRANSITION_COLUMNS",
    "check_text",
    "command_from_row",
    "join_dt",
    "json_text",
    "node_from_row",
    "node_params",
    "snapshot_from_row",
    "split_dt",
    "task_params",
    "transition_arrays",
    "transition_from_row",
]
