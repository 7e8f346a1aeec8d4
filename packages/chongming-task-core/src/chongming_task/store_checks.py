"""写后端用的入参校验（内存、SQLite、Postgres 与第三方后端共用）。

存储方法常被无类型的代码调用（CLI、配置文件、别的语言经由 JSON）：类型标注拦不住 ``True``、``-1``、``"5"``、
单个字符串当集合这类输入。每个后端都要在写入之前拦住它们，而且报错措辞应当一致——所以放在这里，而不是
每个后端各抄一份。
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from chongming_task.errors import ConfigurationError
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.storage import CommandAction, validate_lease


def check_snapshot(snapshot: object) -> TaskSnapshot:
    if not isinstance(snapshot, TaskSnapshot):
        raise ConfigurationError(f"存储只接受 TaskSnapshot，收到 {type(snapshot).__name__}")
    return snapshot


def check_transitions(task_id: str, transitions: Sequence[Transition]) -> None:
    for record in transitions:
        if not isinstance(record, Transition):
            raise ConfigurationError(f"迁移记录必须是 Transition，收到 {type(record).__name__}")
        if record.task_id != task_id:
            raise ConfigurationError(f"迁移记录属于任务 {record.task_id!r}，不属于 {task_id!r}")


def check_aware(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, datetime) or value.utcoffset() is None):
        raise ConfigurationError(f"{name} 必须是带时区的 datetime，收到 {value!r}")


def check_optional_text(name: str, value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise ConfigurationError(f"{name} 必须是字符串或 None，收到 {value!r}")


def check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{name} 必须是非负整数，收到 {value!r}")


def check_claimant(value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"认领者 claimant 必须是非空字符串，收到 {value!r}")


def id_set(name: str, values: Iterable[Any] | None, kind: type) -> frozenset[Any] | None:
    """task_ids / buckets 这类过滤集合：None 表示不限；单个值（而不是集合）是常见误用，明确拒绝。"""
    if values is None:
        return None
    if isinstance(values, (str, int)):
        raise ConfigurationError(f"{name} 必须是集合（例如 [{values!r}]），不能是单个值")
    result = frozenset(values)
    for item in result:
        if isinstance(item, bool) or not isinstance(item, kind):
            raise ConfigurationError(f"{name} 里只能放 {kind.__name__}，收到 {item!r}")
    return result


def claim_args(
    claimant: object,
    lease: float,
    limit: object,
    task_ids: Iterable[Any] | None,
    buckets: Iterable[Any] | None,
) -> tuple[frozenset[str] | None, frozenset[int] | None]:
    """claim_commands 的入参：校验认领者、租约与 limit，返回规范化后的 (task_ids, buckets) 过滤集合。"""
    check_claimant(claimant)
    validate_lease(lease)
    check_count("limit", limit)
    return id_set("task_ids", task_ids, str), id_set("buckets", buckets, int)


def command_args(
    action: object, issuer: object, reason: object, payload: object
) -> tuple[CommandAction, dict[str, Any]]:
    """submit_command 的入参：动作名规范化为 CommandAction，payload 规范化为 dict（JSON 校验由后端做）。"""
    try:
        normalized = CommandAction(action)  # type: ignore[arg-type]  # 入参可能来自无类型代码
    except ValueError:
        known = ", ".join(a.value for a in CommandAction)
        raise ConfigurationError(f"未知的指令动作 {action!r}；可选：{known}") from None
    check_optional_text("issuer", issuer)
    check_optional_text("reason", reason)
    if payload is None:
        payload = {}
    if not isinstance(payload, Mapping):
        raise ConfigurationError(f"指令 payload 必须是 dict（JSON 对象），收到 {type(payload).__name__}")
    return normalized, dict(payload)


__all__ = [
    "check_aware",
    "check_claimant",
    "check_count",
    "check_optional_text",
    "check_snapshot",
    "check_transitions",
    "claim_args",
    "command_args",
    "id_set",
]
