"""写后端用的入参校验：内存、SQLite、Postgres 与第三方后端共用这一个模块。

存储方法常被无类型的代码调用（CLI、配置文件、别的语言经由 JSON）：类型标注拦不住 ``True``、``-1``、``"5"``、
单个字符串当集合这类输入。每个后端都要在写入之前拦住它们，而且报错措辞应当一致——所以只在这里写一次，
后端不得各抄一份（抄过：时区检查曾有五份、touch 的检查四份，Postgres 的指令检查与别人行为不同）。

后端只负责自己存储介质的额外限制（例如 PostgreSQL 的 text 存不下 NUL）：那些放在后端自己的 codec 里。
不依赖值类型的那一半定义在 ``_base_checks``（值类型构造时也要用，拆开只为避免导入环），这里全部重新导出。
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from chongming_task.core.storage._base_checks import (
    MAX_LEASE_SECONDS,
    TOUCH_FIELDS,
    check_aware,
    check_bucket,
    check_claimant,
    check_count,
    check_holder,
    check_json_value,
    check_key,
    check_node_owner,
    check_optional_text,
    check_positive_seconds,
    check_save_since,
    check_snapshot,
    check_transitions,
    claim_args,
    id_set,
    renew_args,
    touch_args,
    touch_many_fields,
    validate_checked_save,
    validate_lease,
    validate_save,
)
from chongming_task.core.storage.values import (
    ArchiveReceipt,
    CommandAction,
    LogLine,
    NodeRecord,
    SaveRequest,
    TouchUpdate,
)
from chongming_task.errors import ConfigurationError
from chongming_task.models import TaskSnapshot, Transition


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


def check_save(
    snapshot: TaskSnapshot,
    expect_version: int,
    transitions: Sequence[Transition],
    lease_expired_before: datetime | None,
) -> SaveRequest:
    """save 的入参检查一次：快照可存、迁移记录都属于它且正好接上版本、租约条件带时区。

    记录逐条只查一遍（``check_transitions``：都是 Transition、都属于这个任务），版本号与末条状态交给
    ``validate_checked_save``——不再经 ``validate_save``，它会把同样的逐条检查再跑两遍（见那里）。"""
    checked = check_snapshot(snapshot)
    records = tuple(transitions)
    check_transitions(checked.task_id, records)
    validate_checked_save(checked, expect_version, records)
    check_aware("lease_expired_before", lease_expired_before)
    return SaveRequest(checked, expect_version, records, lease_expired_before)


def check_save_request(request: SaveRequest) -> SaveRequest:
    """``save_many`` 的一项（调用方装的、还没检查）→ 与 ``save`` 完全相同的检查。"""
    return check_save(
        request.snapshot, request.expect_version, request.transitions, request.lease_expired_before
    )


# -- 归档与保留（issue 20；存储指南 §9）---------------------------------------------------------------

MAX_EXPORT_LIMIT = 100_000
"""一批最多导出多少条：批是"一次读、一个归档段、一次删除"的单位，太大就失去了"短事务"的意义。"""


def _export_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_EXPORT_LIMIT:
        raise ConfigurationError(f"limit 必须是 1..{MAX_EXPORT_LIMIT} 之间的整数，收到 {limit!r}")
    return limit


def export_transitions_args(before: object, after: object, limit: object) -> tuple[str, int] | None:
    """export_transitions 的入参：带时区的截止时刻、键集游标 ``(task_id, version)`` 或 None、批大小。"""
    check_aware("before", before, required=True)
    _export_limit(limit)
    if after is None:
        return None
    if (
        not isinstance(after, tuple)
        or len(after) != 2
        or isinstance(after[1], bool)
        or not isinstance(after[1], int)
    ):
        raise ConfigurationError(f"after 必须是上一批最后一条的 (task_id, version) 或 None，收到 {after!r}")
    check_key("after 的 task_id", after[0])
    return after


def export_finished_args(before: object, after: object, limit: object) -> str | None:
    """export_finished 的入参：带时区的截止时刻、键集游标 task_id 或 None、批大小。"""
    check_aware("before", before, required=True)
    _export_limit(limit)
    if after is None:
        return None
    return check_key("after", after)


def check_receipt(receipt: object) -> ArchiveReceipt:
    """delete_archived 的参数：只接受 ArchiveReceipt（键在构造时已校验）。"""
    if not isinstance(receipt, ArchiveReceipt):
        raise ConfigurationError(
            "delete_archived 只接受 ArchiveReceipt（用 ArchiveReceipt.of(...) 构造），"
            f"收到 {type(receipt).__name__}"
        )
    return receipt


def check_touch(update: TouchUpdate) -> TouchUpdate:
    """touch 的入参检查一次（``touch_args``），原样返回：后端唯一要处理的就是这个值。"""
    touch_args(update.task_id, update.progress, update.heartbeat_at, update.lease_owner, update.lease_until)
    return update


def touch_many_update(task_id: str, fields: object) -> TouchUpdate:
    """touch_many 的一项 ``(task_id, {字段: 值})``：字段名只接受 ``TOUCH_FIELDS``，值与 touch 同样检查。"""
    return check_touch(TouchUpdate(task_id, **touch_many_fields(fields)))


# -- 任务日志（issue 18；存储指南 §11）-------------------------------------------------------------

MAX_LOG_READ_LIMIT = 10_000
"""read_logs 一次最多读多少行（每任务本来最多只存 ``MAX_LOG_LINES`` 行，这是给将来调大上限留的余地）。"""


def append_logs_args(lines: object) -> list[LogLine]:
    """append_logs 的入参：LogLine 的序列（单个 LogLine、字符串之类的误用给出清楚的错误）。

    正文的可存储性（NUL、孤立代理项）与快照文本同一份规则：写入前在这里拦住，整批不写。
    """
    if lines.__class__ is list or lines.__class__ is tuple:
        batch = list(lines)  # 运行时总是传 list：跳过下面两次抽象基类的 isinstance（各要走一遍 ABC 缓存）
    elif isinstance(lines, (LogLine, str, bytes, Mapping)) or not isinstance(lines, Iterable):
        raise ConfigurationError(f"append_logs 需要 LogLine 的列表，收到 {type(lines).__name__}")
    else:
        batch = list(lines)
    for line in batch:
        if not isinstance(line, LogLine):
            raise ConfigurationError(f"append_logs 只接受 LogLine，收到 {type(line).__name__}")
        check_optional_text("日志正文", line.message)
        check_optional_text("日志级别", line.level)
    return batch


def read_logs_args(task_id: object, attempt: object, after_seq: object, limit: object) -> None:
    """read_logs 的入参：task_id 字符串，attempt / after_seq 为 None 或非负整数，limit 为 1..10000。"""
    check_key("task_id", task_id)
    if attempt is not None:
        check_count("attempt", attempt)
    if after_seq is not None:
        check_count("after_seq", after_seq)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LOG_READ_LIMIT:
        raise ConfigurationError(f"limit 必须是 1..{MAX_LOG_READ_LIMIT} 之间的整数，收到 {limit!r}")


__all__ = [
    "MAX_EXPORT_LIMIT",
    "MAX_LEASE_SECONDS",
    "MAX_LOG_READ_LIMIT",
    "TOUCH_FIELDS",
    "append_logs_args",
    "check_aware",
    "check_bucket",
    "check_claimant",
    "check_count",
    "check_holder",
    "check_json_value",
    "check_key",
    "check_node_owner",
    "check_node_record",
    "check_optional_text",
    "check_positive_seconds",
    "check_receipt",
    "check_save",
    "check_save_since",
    "check_snapshot",
    "check_touch",
    "check_transitions",
    "claim_args",
    "command_args",
    "export_finished_args",
    "export_transitions_args",
    "id_set",
    "read_logs_args",
    "renew_args",
    "touch_args",
    "touch_many_fields",
    "touch_many_update",
    "validate_checked_save",
    "validate_lease",
    "validate_save",
]
