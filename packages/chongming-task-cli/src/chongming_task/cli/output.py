"""输出：表格（tabulate + wcwidth，中文按显示宽度对齐）、--json、时间格式、run 的实时进度。

人看的输出走 stdout；实时进度与状态迁移（run 前台运行时）走 stderr——这样 ``--json run`` 的
stdout 只有一份 JSON，``run ... > result.txt`` 也只留下最终结果。
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, TextIO

import click
import tabulate as _tabulate
from wcwidth import wcswidth

from chongming_task.models import TaskSnapshot, Transition
from chongming_task.runtime.registry import TaskDefinition
from chongming_task.runtime.table import HEADERS as TASK_HEADERS
from chongming_task.runtime.table import elapsed_text, table_row

# 按显示宽度对齐（中文占两列）；render_table 也开着它，这里显式再写一次，不依赖导入顺序。
_tabulate.WIDE_CHARS_MODE = True

EMPTY = "-"

# 会驱动终端的字符：C0 控制字符（ESC、BEL、退格、\r……）、DEL、C1 控制字符（0x9b 在很多终端里就是 CSI），
# 以及改写显示顺序的双向文本控制符。任务 id、标签、返回值、日志都是任务数据，可能来自不可信的输入：
# 原样打印它们，一个 task_id 就能清屏、改标题、伪造输出行（issue 22.12）。一律显示成 \xNN / \uNNNN。
_CONTROL_EXCEPT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
# JSON 编码本来就把 C0 写成 \u00XX；剩下的 C1 与双向控制符在 ensure_ascii=False 时会原样输出。
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape_text(text: str, *, keep_newlines: bool = True) -> str:
    """把控制字符显示成转义序列。``keep_newlines``：多行文本（表格、堆栈）保留换行本身。"""
    pattern = _CONTROL_EXCEPT_NEWLINE if keep_newlines else _CONTROL
    return pattern.sub(_escape_char, text)


def escape_cell(value: Any) -> Any:
    """表格的一格：连换行也转义（一格里的换行会把表格撕开，也能伪造出一行假数据）。"""
    return _CONTROL.sub(_escape_char, value) if isinstance(value, str) else value


def echo_json(value: Any) -> None:
    """一份 JSON 文档（中文原样输出，不转义成 \\uXXXX；控制字符一律转义）。"""
    text = json.dumps(value, ensure_ascii=False, indent=2, default=str)
    click.echo(_JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text))


def echo_json_line(value: Any) -> None:
    """一行 JSON（ps --watch --json 每次刷新一行）。"""
    text = json.dumps(value, ensure_ascii=False, default=str)
    click.echo(_JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text))


def echo_text(text: str) -> None:
    """给人看的一段输出（可能含任务数据）：转义控制字符后再打印。"""
    click.echo(escape_text(text))


def table(rows: Iterable[Sequence[Any]], headers: Sequence[str]) -> str:
    return _tabulate.tabulate(
        [[EMPTY if cell is None else escape_cell(cell) for cell in row] for row in rows],
        headers=list(headers),
        tablefmt="simple",
        disable_numparse=True,
        stralign="left",
    )


def render_tasks(snapshots: Iterable[TaskSnapshot], now: datetime) -> str:
    """ps 的任务表：与 render_table 同样的列与排版（同一个 table_row），只是每格先转义控制字符。"""
    return table([table_row(snapshot, now) for snapshot in snapshots], TASK_HEADERS)


def fmt_time(value: datetime | None, *, date: bool = True) -> str:
    """本地时间，到毫秒：同一秒里的多次迁移仍分得清先后。"""
    if value is None:
        return EMPTY
    local = value.astimezone()
    text = local.strftime("%Y-%m-%d %H:%M:%S.%f" if date else "%H:%M:%S.%f")
    return text[:-3]


def fmt_value(value: Any) -> str:
    """返回值、参数等任意 JSON 值的一行写法。"""
    if value is None:
        return EMPTY
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def detail_rows(snapshot: TaskSnapshot, now: datetime) -> list[tuple[str, str]]:
    """status 命令的纵向明细：字段名与 --json 的键一致，便于对照。"""
    progress = snapshot.progress
    progress_text = EMPTY
    if progress is not None:
        progress_text = progress.describe()
        if progress.fraction is not None:
            progress_text += f"（{progress.fraction:.0%}）"
        if progress.message:
            progress_text += f" {progress.message}"
    failure = snapshot.failure
    rows: list[tuple[str, str]] = [
        ("task_id", snapshot.task_id),
        ("name", snapshot.name),
        ("label", snapshot.label or EMPTY),
        ("description", snapshot.description or EMPTY),
        ("status", snapshot.status.value),
        ("status_version", str(snapshot.status_version)),
        ("attempt", f"{snapshot.attempt}/{snapshot.max_attempts}"),
        ("elapsed", elapsed_text(snapshot, now)),
        ("progress", progress_text),
        ("failure", EMPTY if failure is None else f"{failure.kind.value}：{failure.message}"),
        ("outcome", fmt_value(snapshot.outcome)),
        ("tags", ", ".join(sorted(snapshot.tags)) or EMPTY),
        ("priority", str(snapshot.priority)),
        ("bucket", EMPTY if snapshot.bucket is None else str(snapshot.bucket)),
        ("bucket_key", snapshot.bucket_key or EMPTY),
        ("executor", snapshot.executor or EMPTY),
        ("pid", EMPTY if snapshot.pid is None else str(snapshot.pid)),
        ("owner", snapshot.owner or EMPTY),
        ("lease_owner", snapshot.lease_owner or EMPTY),
        ("lease_until", fmt_time(snapshot.lease_until)),
        ("pipeline_id", snapshot.pipeline_id or EMPTY),
        ("node_id", snapshot.node_id or EMPTY),
        ("created_at", fmt_time(snapshot.created_at)),
        ("started_at", fmt_time(snapshot.started_at)),
        ("finished_at", fmt_time(snapshot.finished_at)),
        ("last_heartbeat_at", fmt_time(snapshot.last_heartbeat_at)),
    ]
    return rows


def render_detail(snapshot: TaskSnapshot, now: datetime) -> str:
    rows = [(key, escape_cell(value)) for key, value in detail_rows(snapshot, now)]
    return _tabulate.tabulate(rows, tablefmt="plain", disable_numparse=True)


HISTORY_HEADERS = ("TIME", "FROM → TO", "TRIGGER", "ACTOR", "REASON", "VERSION")


def render_history(transitions: Iterable[Transition]) -> str:
    rows = [
        (
            fmt_time(record.at),
            f"{record.from_status.value} → {record.to_status.value}",
            record.trigger,
            record.actor,
            record.reason,
            str(record.version),
        )
        for record in transitions
    ]
    return table(rows, HISTORY_HEADERS)


def definition_dict(definition: TaskDefinition) -> dict[str, Any]:
    timeout = definition.timeout
    return {
        "name": definition.name,
        "description": definition.description,
        "tags": sorted(definition.tags),
        "max_attempts": definition.retry.max_attempts if definition.retry is not None else 1,
        "timeout": None
        if timeout is None or timeout.is_unlimited
        else {"start": timeout.start, "per_attempt": timeout.per_attempt, "idle": timeout.idle},
    }


def _seconds(value: float) -> str:
    return f"{value:g}s"


def render_definitions(definitions: Iterable[TaskDefinition]) -> str:
    rows = []
    for definition in definitions:
        retry = definition.retry
        timeout = definition.timeout
        timeout_parts = []
        if timeout is not None:
            for name in ("start", "per_attempt", "idle"):
                limit = getattr(timeout, name)
                if limit is not None:
                    timeout_parts.append(f"{name}={_seconds(limit)}")
        rows.append(
            (
                definition.name,
                definition.description,
                ", ".join(sorted(definition.tags)) or None,
                f"最多 {retry.max_attempts} 次" if retry is not None and retry.max_attempts > 1 else None,
                " ".join(timeout_parts) or None,
            )
        )
    return table(rows, ("NAME", "DESCRIPTION", "TAGS", "RETRY", "TIMEOUT"))


def progress_bar(fraction: float, width: int = 20) -> str:
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "[" + "#" * filled + "-" * (width - filled) + f"] {fraction:4.0%}"


class LiveDisplay:
    """run 的实时显示。

    终端（TTY）上：底部一行进度就地刷新（``\\r`` + 清行），状态迁移与日志作为永久行打印在它上面。
    不是终端（nohup、systemd、管道）时：只打印普通的整行，不输出任何控制字符——日志文件里不该
    出现成百上千个 ``\\r``。
    """

    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self._status = ""

    def line(self, text: str) -> None:
        text = escape_text(text, keep_newlines=False)  # 日志与迁移原因是任务数据
        if self.tty and self._status:
            self.stream.write("\r\x1b[K")
        self.stream.write(text + "\n")
        if self.tty and self._status:
            self.stream.write(self._status)
        self.stream.flush()

    def status(self, text: str) -> None:
        """终端上就地刷新的那一行；非终端时不做任何事（调用方自己按节奏打印整行）。"""
        if not self.tty:
            return
        width = shutil.get_terminal_size((100, 20)).columns - 1
        text = _truncate(escape_text(text, keep_newlines=False), width)
        if text == self._status:
            return
        self._status = text
        self.stream.write("\r\x1b[K" + text)
        self.stream.flush()

    def finish(self) -> None:
        if self.tty and self._status:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
        self._status = ""


def _truncate(text: str, width: int) -> str:
    """按显示宽度截断（中文占两列），免得进度行折到下一行后 \\r 再也清不掉。"""
    if wcswidth(text) <= width:
        return text
    out = ""
    for char in text:
        if wcswidth(out + char) > width - 1:
            break
        out += char
    return out + "…"


__all__ = [
    "HISTORY_HEADERS",
    "LiveDisplay",
    "definition_dict",
    "echo_json",
    "echo_json_line",
    "echo_text",
    "escape_cell",
    "escape_text",
    "fmt_time",
    "fmt_value",
    "progress_bar",
    "render_definitions",
    "render_detail",
    "render_history",
    "render_tasks",
    "table",
]
