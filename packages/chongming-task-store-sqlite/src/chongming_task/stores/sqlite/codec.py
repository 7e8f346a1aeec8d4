"""快照、迁移记录、指令与 SQLite 行之间的转换。

保真要求（每个后端都一样）：带时区的时间到微秒、原始时区偏移、枚举、标签集合、嵌套的
failure / progress、任意 JSON outcome 都要逐字段往返。时间存 ISO 原文保偏移，另存 UTC 微秒
整数作排序键；JSON 值经 ``check_json_value`` 校验后存为 TEXT。
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from chongming_task.errors import ConfigurationError
from chongming_task.models import Failure, Progress, TaskSnapshot, Transition
from chongming_task.states import TaskStatus
from chongming_task.storage import Command, CommandAction, NodeRecord, check_json_value

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

_MAX_CODE_POINT = 0x10FFFF
_SURROGATES = range(0xD800, 0xE000)


def dt_text(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="microseconds")


def dt_parse(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def dt_key(value: datetime | None) -> int | None:
    """UTC 微秒整数：按时刻排序（不同偏移的同一时刻 key 相同），且在 64 位整数范围内（公元 1–9999 年）。"""
    return None if value is None else (value - _EPOCH) // _MICROSECOND


def json_text(value: Any, *, what: str) -> str:
    """严格 JSON 文本。含孤立代理项（无法编成 UTF-8）时退回 ASCII 转义写法，解析结果不变。"""
    text = check_json_value(value, what=what)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = json.dumps(value, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text


def prefix_upper_bound(prefix: str) -> str | None:
    """大于所有以 ``prefix`` 开头的字符串的最小字符串（码点序，也就是 UTF-8 字节序）。

    ``name >= prefix AND name < bound`` 恰好等价于 ``name.startswith(prefix)``，并且能走普通
    BINARY 索引——而 SQLite 的 LIKE 默认对 ASCII 不分大小写，与 ``str.startswith`` 不一致。
    前缀全由最大码点组成时没有上界，返回 None。
    """
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if code in _SURROGATES:
            code = _SURROGATES.stop
        if code <= _MAX_CODE_POINT:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


def snapshot_row(snapshot: TaskSnapshot) -> dict[str, Any]:
    """快照 → 全部列（命名参数）。JSON 值在这里校验，坏值在动数据库之前就被拒绝。"""
    return {
        "task_id": snapshot.task_id,
        "name": snapshot.name,
        "label": snapshot.label,
        "status": snapshot.status.value,
        "status_version": snapshot.status_version,
        "attempt": snapshot.attempt,
        "max_attempts": snapshot.max_attempts,
        "created_at": dt_text(snapshot.created_at),
        "created_key": dt_key(snapshot.created_at),
        "queued_at": dt_text(snapshot.queued_at),
        "started_at": dt_text(snapshot.started_at),
        "finished_at": dt_text(snapshot.finished_at),
        "finished_key": dt_key(snapshot.finished_at),
        "last_heartbeat_at": dt_text(snapshot.last_heartbeat_at),
        "progress": progress_text(snapshot.progress),
        "failure": None
        if snapshot.failure is None
        else json_text(snapshot.failure.to_dict(), what="failure"),
        "outcome": json_text(snapshot.outcome, what="outcome"),
        "tags": tags_text(snapshot.tags),
        "priority": snapshot.priority,
        "bucket": snapshot.bucket,
        "bucket_key": snapshot.bucket_key,
        "executor": snapshot.executor,
        "pid": snapshot.pid,
        "owner": snapshot.owner,
        "lease_owner": snapshot.lease_owner,
        "lease_until": dt_text(snapshot.lease_until),
        "lease_key": dt_key(snapshot.lease_until),
        "pipeline_id": snapshot.pipeline_id,
        "node_id": snapshot.node_id,
        "retry_at": dt_text(snapshot.retry_at),
        "description": snapshot.description,
    }


def progress_text(progress: Progress | None) -> str | None:
    return None if progress is None else json_text(progress.to_dict(), what="progress")


def tags_text(tags: frozenset[str]) -> str:
    return json_text(sorted(tags), what="tags")


def snapshot_from_row(row: Sequence[Any]) -> TaskSnapshot:
    """``SELECT <TASK_COLUMNS>`` 的一行 → 快照（列顺序见 schema.TASK_COLUMNS）。"""
    (
        task_id,
        name,
        label,
        status,
        status_version,
        attempt,
        max_attempts,
        created_at,
        _created_key,
        queued_at,
        started_at,
        finished_at,
        _finished_key,
        last_heartbeat_at,
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
        _lease_key,
        pipeline_id,
        node_id,
        retry_at,
        description,
    ) = row
    created = dt_parse(created_at)
    assert created is not None
    return TaskSnapshot(
        task_id=task_id,
        name=name,
        created_at=created,
        status=TaskStatus(status),
        status_version=status_version,
        label=label,
        attempt=attempt,
        max_attempts=max_attempts,
        queued_at=dt_parse(queued_at),
        started_at=dt_parse(started_at),
        finished_at=dt_parse(finished_at),
        last_heartbeat_at=dt_parse(last_heartbeat_at),
        progress=None if progress is None else Progress.from_dict(json.loads(progress)),
        failure=None if failure is None else Failure.from_dict(json.loads(failure)),
        outcome=None if outcome == "null" else json.loads(outcome),
        tags=frozenset(json.loads(tags)) if tags != "[]" else frozenset(),
        priority=priority,
        bucket=bucket,
        bucket_key=bucket_key,
        executor=executor,
        pid=pid,
        owner=owner,
        lease_owner=lease_owner,
        lease_until=dt_parse(lease_until),
        pipeline_id=pipeline_id,
        node_id=node_id,
        retry_at=dt_parse(retry_at),
        description=description,
    )


def check_transitions(task_id: str | None, transitions: Sequence[Transition]) -> None:
    for record in transitions:
        if not isinstance(record, Transition):
            raise ConfigurationError(f"迁移记录必须是 Transition，收到 {type(record).__name__}")
        if task_id is not None and record.task_id != task_id:
            raise ConfigurationError(f"迁移记录属于任务 {record.task_id!r}，不属于 {task_id!r}")


def transition_row(record: Transition) -> tuple[Any, ...]:
    return (
        record.task_id,
        record.version,
        record.from_status.value,
        record.to_status.value,
        record.trigger,
        record.actor,
        record.reason,
        dt_text(record.at),
    )


def transition_from_row(row: Sequence[Any]) -> Transition:
    task_id, version, from_status, to_status, trigger, actor, reason, at = row
    parsed = dt_parse(at)
    assert parsed is not None
    return Transition(
        task_id=task_id,
        from_status=TaskStatus(from_status),
        to_status=TaskStatus(to_status),
        trigger=trigger,
        actor=actor,
        reason=reason,
        version=version,
        at=parsed,
    )


def command_from_row(row: Sequence[Any]) -> Command:
    """``SELECT <COMMAND_COLUMNS>`` 的一行 → 指令。"""
    (
        command_id,
        task_id,
        action,
        issuer,
        reason,
        payload,
        created_at,
        bucket,
        claimant,
        lease_until,
        deliveries,
        completed_at,
    ) = row
    created = dt_parse(created_at)
    assert created is not None
    return Command(
        command_id=command_id,
        task_id=task_id,
        action=CommandAction(action),
        issuer=issuer,
        reason=reason,
        payload=json.loads(payload),
        created_at=created,
        bucket=bucket,
        claimant=claimant,
        lease_until=dt_parse(lease_until),
        deliveries=deliveries,
        completed_at=dt_parse(completed_at),
    )


def node_row(record: NodeRecord) -> tuple[Any, ...]:
    """节点记录 → ``NODE_COLUMNS`` 顺序的一行。buckets：升序 JSON 数组，None 存 NULL（与空数组不同）。"""
    return (
        record.owner,
        None if record.buckets is None else json.dumps(sorted(record.buckets), separators=(",", ":")),
        record.num_buckets,
        dt_text(record.heartbeat_at),
        dt_text(record.expires_at),
        json_text(dict(record.info), what="NodeRecord.info"),
    )


def node_from_row(row: Sequence[Any]) -> NodeRecord:
    owner, buckets, num_buckets, heartbeat_at, expires_at, info = row
    heartbeat = dt_parse(heartbeat_at)
    expires = dt_parse(expires_at)
    assert heartbeat is not None and expires is not None
    return NodeRecord(
        owner=owner,
        buckets=None if buckets is None else frozenset(json.loads(buckets)),
        num_buckets=num_buckets,
        heartbeat_at=heartbeat,
        expires_at=expires,
        info=json.loads(info),
    )


__all__ = [
    "check_transitions",
    "command_from_row",
    "dt_key",
    "dt_parse",
    "dt_text",
    "json_text",
    "node_from_row",
    "node_row",
    "prefix_upper_bound",
    "progress_text",
    "snapshot_from_row",
    "snapshot_row",
    "tags_text",
    "transition_from_row",
    "transition_row",
]
