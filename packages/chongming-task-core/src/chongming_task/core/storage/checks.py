"""写后端用的入参校验：内存、SQLite、Postgres 与第三方后端共用这一个模块。

存储方法常被无类型的代码调用（CLI、配置文件、别的语言经由 JSON）：类型标注拦不住 ``True``、``-1``、``"5"``、
单个字符串当集合这类输入。每个后端都要在写入之前拦住它们，而且报错措辞应当一致——所以只在这里写一次，
后端不得各抄一份（抄过：时区检查曾有五份、touch 的检查四份，Postgres 的指令检查与别人行为不同）。

后端只负责自己存储介质的额外限制（例如 PostgreSQL 的 text 存不下 NUL）：那些放在后端自己的 codec 里。
不依赖值类型的那一半定义在 ``_base_checks``（值类型构造时也要用，拆开只为避免导入环），这里全部重新导出。
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chongming_task.core.storage._base_checks import (
    MAX_LEASE_SECONDS,
    TOUCH_FIELDS,
    check_aware,
    check_bucket,
    check_claimant,
    check_count,
    check_json_value,
    check_key,
    check_node_owner,
    check_optional_text,
    check_positive_seconds,
    check_snapshot,
    check_transitions,
    claim_args,
    id_set,
    touch_args,
    touch_many_fields,
    validate_lease,
    validate_save,
)
from chongming_task.core.storage.values import CommandAction, NodeRecord
from chongming_task.errors import ConfigurationError


def check_node_record(record: object) -> NodeRecord:
    """publish_node 的参数检查：只接受 NodeRecord（字段已在构造时校验过）。"""
    if not isinstance(record, NodeRecord):
        raise ConfigurationError(f"publish_node 只接受 NodeRecord，收到 {type(record).__name__}")
    return record


def command_args(
    task_id: object, action: object, issuer: object, reason: object, payload: object
) -> tuple[CommandAction, dict[str, Any]]:
    """submit_command 的入参：动作名规范化为 CommandAction，payload 规范化为 dict（JSON 校验由后端做，
    因为各后端的 JSON 文本规则不同）。"""
    check_key("task_id", task_id)
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
    "MAX_LEASE_SECONDS",
    "TOUCH_FIELDS",
    "check_aware",
    "check_bucket",
    "check_claimant",
    "check_count",
    "check_json_value",
    "check_key",
    "check_node_owner",
    "check_node_record",
    "check_optional_text",
    "check_positive_seconds",
    "check_snapshot",
    "check_transitions",
    "claim_args",
    "command_args",
    "id_set",
    "touch_args",
    "touch_many_fields",
    "validate_lease",
    "validate_save",
]
