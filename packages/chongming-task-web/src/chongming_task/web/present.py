"""把快照变成给人看的东西：状态的中文名、时长、年龄、进度——页面、JSON API 与 SSE 共用一份。

原则是**如实**（issue 21）：

* ``stopping`` 就是"停止中"，直到存储里真的落了终态才显示"已停止"；
* ``lost`` 显示为"结果未知"：载体随进程消失，副作用可能已部分发生，不能说成"失败"；
* 本控制台发出的跨进程请求（停止 / 暂停 / 恢复）在持有者执行之前显示"未确认"：指令只是写进了
  存储，持有者可能已经不在了。
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from chongming_task import TaskSnapshot, TaskStatus, Transition
from chongming_task.core.recipes import Recipe
from chongming_task.states import RETRYABLE_FROM
from chongming_task.storage import LogLine, LogStats

STATUS_LABELS: dict[TaskStatus, str] = {
    TaskStatus.PENDING: "待调度",
    TaskStatus.BLOCKED: "等待依赖",
    TaskStatus.QUEUED: "排队中",
    TaskStatus.STARTING: "启动中",
    TaskStatus.RUNNING: "运行中",
    TaskStatus.PAUSING: "暂停中",
    TaskStatus.PAUSED: "已暂停",
    TaskStatus.RETRY_WAIT: "等待重试",
    TaskStatus.STOPPING: "停止中",
    TaskStatus.SUCCEEDED: "已成功",
    TaskStatus.FAILED: "已失败",
    TaskStatus.STOPPED: "已停止",
    TaskStatus.CANCELLED: "已取消",
    TaskStatus.SKIPPED: "已跳过",
    TaskStatus.LOST: "结果未知",
}

ACTION_LABELS = {"stop": "停止", "pause": "暂停", "resume": "恢复", "retry": "重试"}
"""动作的中文名。retry 只对单个持久任务（不进批量）：见 ``RETRY_STATUSES``。"""

RETRY_STATUSES: frozenset[TaskStatus] = RETRYABLE_FROM
"""持久任务能"重试"（经审计的 retry() 复活、交回队列）的终态：与状态机 retry() 同一份集合。"""

# 各动作能作用的状态（与转移表一致：pause 只对还没挂起的活任务，resume 只对已暂停的）。
ACTION_STATUSES: dict[str, frozenset[TaskStatus]] = {
    "stop": frozenset(s for s in TaskStatus if not s.is_terminal and s is not TaskStatus.STOPPING),
    "pause": frozenset({TaskStatus.QUEUED, TaskStatus.STARTING, TaskStatus.RUNNING, TaskStatus.RETRY_WAIT}),
    "resume": frozenset({TaskStatus.PAUSED}),
}

ACTIVE_STATUSES = frozenset(
    {TaskStatus.STARTING, TaskStatus.RUNNING, TaskStatus.PAUSING, TaskStatus.PAUSED, TaskStatus.STOPPING}
)
QUEUED_STATUSES = frozenset(
    {TaskStatus.PENDING, TaskStatus.BLOCKED, TaskStatus.QUEUED, TaskStatus.RETRY_WAIT}
)


def status_label(status: TaskStatus) -> str:
    return STATUS_LABELS[status]


def fmt_duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} 秒"
    if seconds < 3600:
        return f"{int(seconds // 60)} 分 {int(seconds % 60)} 秒"
    if seconds < 86400:
        return f"{int(seconds // 3600)} 时 {int(seconds % 3600 // 60)} 分"
    return f"{seconds / 86400:.1f} 天"


def fmt_time(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def elapsed(snapshot: TaskSnapshot, now: datetime) -> str:
    """从未启动的任务显示 "-"（排队多久不是"运行了多久"）。"""
    if snapshot.started_at is None:
        return "-"
    end = snapshot.finished_at or now
    return fmt_duration((end - snapshot.started_at).total_seconds())


def age(value: datetime | None, now: datetime) -> str:
    return "-" if value is None else f"{fmt_duration((now - value).total_seconds())}前"


def lease_text(snapshot: TaskSnapshot, now: datetime) -> str:
    if snapshot.lease_until is None:
        return "-"
    left = (snapshot.lease_until - now).total_seconds()
    if left >= 0:
        return f"剩余 {fmt_duration(left)}"
    return f"已过期 {fmt_duration(-left)}"


def progress_view(snapshot: TaskSnapshot) -> dict[str, Any]:
    """``<progress>`` 元素要的 value/max 与一行文字。总数未知时 max 为 None（不定进度条）。"""
    progress = snapshot.progress
    if progress is None:
        return {"done": None, "total": None, "percent": None, "text": "-"}
    unit = f" {progress.unit}" if progress.unit else ""
    if progress.total:
        percent = max(0.0, min(100.0, progress.done / progress.total * 100))
        text = f"{progress.done:g}/{progress.total:g}{unit}（{percent:.0f}%）"
    else:
        percent = None
        text = f"{progress.done:g}{unit}"
    if progress.message:
        text += f" · {progress.message}"
    return {"done": progress.done, "total": progress.total, "percent": percent, "text": text}


def task_row(snapshot: TaskSnapshot, now: datetime, pending: dict[str, Any] | None = None) -> dict[str, Any]:
    """列表里的一行（也是 API 与 SSE 里的一行）：只含 JSON 值，模板与 JS 都只把它当文本用。"""
    return {
        "task_id": snapshot.task_id,
        "name": snapshot.name,
        "label": snapshot.label,
        "status": snapshot.status.value,
        "status_label": status_label(snapshot.status),
        "terminal": snapshot.is_terminal,
        "status_version": snapshot.status_version,
        "attempt": snapshot.attempt,
        "max_attempts": snapshot.max_attempts,
        "elapsed": elapsed(snapshot, now),
        "progress": progress_view(snapshot),
        "bucket": snapshot.bucket,
        "tags": sorted(snapshot.tags),
        "holder": snapshot.lease_owner or snapshot.owner,
        "owner": snapshot.owner,
        "lease": lease_text(snapshot, now),
        "heartbeat": age(snapshot.last_heartbeat_at, now),
        "created_at": fmt_time(snapshot.created_at),
        "failure": None if snapshot.failure is None else snapshot.failure.message,
        "pending": pending,
        "durable": snapshot.recipe is not None,
        "claim_label": "待认领" if unclaimed(snapshot) else None,
    }


def unclaimed(snapshot: TaskSnapshot) -> bool:
    """持久任务在队列里、还没有 worker 认领（queued 且无人持有）。"""
    return (
        snapshot.recipe is not None
        and snapshot.status is TaskStatus.QUEUED
        and snapshot.owner is None
        and snapshot.lease_owner is None
    )


def _json_text(value: Any) -> str:
    # 只生成文本：模板再按 HTML 转义，页面里永远不会把参数当标记或脚本解释。
    return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=False)


def recipe_view(recipe: Recipe | None) -> dict[str, Any] | None:
    """持久任务的配方（任务名、参数与策略）：JSON API 原样给出，页面另有排好版的参数文本。"""
    if recipe is None:
        return None
    data = recipe.to_dict()
    return {
        **data,
        "on_lost_label": "worker 失联后自动重跑（还有尝试次数时）"
        if recipe.retries_when_lost
        else "保持结果未知",
        "args_text": _json_text(data["args"]),
        "kwargs_text": _json_text(data["kwargs"]),
        "timeout_text": "-" if data["timeout"] is None else _json_text(data["timeout"]),
    }


def transition_row(record: Transition) -> dict[str, Any]:
    return {
        "version": record.version,
        "at": fmt_time(record.at),
        "from_status": record.from_status.value,
        "to_status": record.to_status.value,
        "to_label": status_label(record.to_status),
        "trigger": record.trigger,
        "actor": record.actor,
        "reason": record.reason,
    }


def log_row(line: LogLine) -> dict[str, Any]:
    """一行持久化日志（页面、JSON API 与 SSE 共用）。时间到毫秒：同一秒里的多行仍分得清先后。"""
    return {
        "seq": line.seq,
        "attempt": line.attempt,
        "at": line.at.astimezone().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3],
        "level": line.level,
        "message": line.message,
        "truncated": line.truncated,
    }


def log_stats_view(stats: LogStats) -> dict[str, int]:
    return {"kept": stats.kept, "dropped": stats.dropped, "last_seq": stats.last_seq}


def task_detail(
    snapshot: TaskSnapshot, history: list[Transition], now: datetime, pending: dict[str, Any] | None
) -> dict[str, Any]:
    failure = snapshot.failure
    return {
        **task_row(snapshot, now, pending),
        "queued_at": fmt_time(snapshot.queued_at),
        "started_at": fmt_time(snapshot.started_at),
        "finished_at": fmt_time(snapshot.finished_at),
        "lease_owner": snapshot.lease_owner,
        "lease_until": fmt_time(snapshot.lease_until),
        "executor": snapshot.executor,
        "pid": snapshot.pid,
        "priority": snapshot.priority,
        "pipeline_id": snapshot.pipeline_id,
        "description": snapshot.description,
        "failure_detail": None
        if failure is None
        else {
            "kind": failure.kind.value,
            "message": failure.message,
            "retryable": failure.retryable,
            "exc_type": failure.exc_type,
            "traceback": failure.traceback,
        },
        "actions": sorted(
            [a for a, statuses in ACTION_STATUSES.items() if snapshot.status in statuses]
            + (["retry"] if snapshot.recipe is not None and snapshot.status in RETRY_STATUSES else [])
        ),
        "recipe": recipe_view(snapshot.recipe),
        "history": [transition_row(t) for t in history],
    }


__all__ = [
    "ACTION_LABELS",
    "ACTION_STATUSES",
    "ACTIVE_STATUSES",
    "QUEUED_STATUSES",
    "RETRY_STATUSES",
    "STATUS_LABELS",
    "age",
    "elapsed",
    "fmt_duration",
    "fmt_time",
    "log_row",
    "log_stats_view",
    "progress_view",
    "recipe_view",
    "status_label",
    "task_detail",
    "task_row",
    "transition_row",
    "unclaimed",
]
