"""render_table：把快照渲染成等宽文本表。CLI 与任何看板共用这一份。

经 tabulate 渲染；装了 wcwidth 时 tabulate 按显示宽度对齐，中文标签（每字占两列）不会把列挤歪。
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import tabulate as _tabulate

from chongming_task.clock import SYSTEM_CLOCK, Clock
from chongming_task.models import TaskSnapshot

HEADERS = ("TASK_ID", "NAME", "STATUS", "ATTEMPT", "ELAPSED", "PROGRESS", "BUCKET", "FAILURE")

# 按显示宽度而不是字符数对齐（中文占两列）。
_tabulate.WIDE_CHARS_MODE = True


def format_elapsed(seconds: float) -> str:
    """0.4s / 12.3s / 5m03s / 2h01m：人读得快的时长。"""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def elapsed_text(snapshot: TaskSnapshot, now: datetime) -> str:
    """从未执行过的任务显示 "-"：给排队中的任务显示时长，会被误读成"已经跑了这么久"。"""
    if snapshot.started_at is None:
        return "-"
    end = snapshot.finished_at or now
    return format_elapsed(max(0.0, (end - snapshot.started_at).total_seconds()))


def status_text(snapshot: TaskSnapshot) -> str:
    """STATUS 列：持久任务带"(持久)"，还没有持有者的（等 worker 认领）带"(持久·待认领)"。"""
    if snapshot.recipe is None:
        return snapshot.status.value
    if snapshot.owner is None and not snapshot.is_terminal:
        return f"{snapshot.status.value}(持久·待认领)"
    return f"{snapshot.status.value}(持久)"


def table_row(snapshot: TaskSnapshot, now: datetime) -> tuple[str, ...]:
    return (
        snapshot.task_id,
        snapshot.label or snapshot.name,
        status_text(snapshot),
        f"{snapshot.attempt}/{snapshot.max_attempts}",
        elapsed_text(snapshot, now),
        snapshot.progress.describe() if snapshot.progress is not None else "-",
        "-" if snapshot.bucket is None else str(snapshot.bucket),
        snapshot.failure.kind.value if snapshot.failure is not None else "-",
    )


def render_table(snapshots: Iterable[TaskSnapshot], *, clock: Clock | None = None) -> str:
    """渲染等宽文本表：TASK_ID NAME STATUS ATTEMPT ELAPSED PROGRESS BUCKET FAILURE。"""
    now = (clock or SYSTEM_CLOCK).now()
    rows = [table_row(snapshot, now) for snapshot in snapshots]
    return _tabulate.tabulate(
        rows, headers=HEADERS, tablefmt="simple", disable_numparse=True, stralign="left"
    )


__all__ = ["HEADERS", "elapsed_text", "format_elapsed", "render_table", "status_text", "table_row"]
