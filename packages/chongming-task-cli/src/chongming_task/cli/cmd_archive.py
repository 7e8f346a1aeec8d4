"""归档命令：archive（按时间窗口先归档再删除；docs/cli.md "归档：archive"，存储指南 §9）。

``prune`` 仍负责按个数保留；``archive`` 按时间：把 ``--older-than`` 之前的迁移历史与早已结束的任务写成
``--to`` 目录里的归档段，确认落盘之后才从存储删除。中途被杀掉，重跑同一条命令即可续上。
"""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime, timedelta

import click

from chongming_task.cli.app import cli, json_option, pass_state
from chongming_task.cli.errors import EXIT_OK, CliError
from chongming_task.cli.output import echo_json
from chongming_task.cli.state import AppState
from chongming_task.core.archive import BATCH_SIZE, ArchiveError, Archiver, ArchiveSummary

_DURATION = re.compile(r"^\s*(\d+)\s*([dhms])\s*$")
_UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


def parse_age(text: str) -> timedelta:
    """``90d`` / ``12h`` / ``30m`` / ``3600s`` → timedelta（正数，最多 100 年）。"""
    match = _DURATION.match(text)
    if match is None or int(match.group(1)) <= 0:
        raise CliError(
            f"--older-than 写法不对：{text!r}；请写成正整数加单位，例如 90d、12h、30m", error="usage"
        )
    delta = timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})
    if delta > timedelta(days=36_500):
        raise CliError(f"--older-than 太大：{text!r}；最多 36500d", error="usage")
    return delta


@cli.command("archive")
@click.option("--older-than", "older_than", required=True, metavar="AGE", help="保留窗口，例如 90d、12h。")
@click.option("--to", "directory", required=True, metavar="DIR", help="归档目录（不存在就创建）。")
@click.option("--dry-run", is_flag=True, help="只统计将会归档多少，不写文件、不删除。")
@click.option(
    "--batch-size",
    type=click.IntRange(1, 100_000),
    default=BATCH_SIZE,
    show_default=True,
    help="每段的迁移记录数。",
)
@click.option(
    "--purge-commands-older-than", "purge_age", metavar="AGE", default=None, help="同时清理早于它完成的指令。"
)
@json_option
@pass_state
def archive_command(
    state: AppState, older_than: str, directory: str, dry_run: bool, batch_size: int, purge_age: str | None
) -> int:
    """把窗口之外的迁移历史与终态任务归档到 DIR，落盘之后再从存储删除（中断后重跑即可续上）。"""
    now = datetime.now(UTC)
    before = now - parse_age(older_than)
    purge_before = None if purge_age is None else now - parse_age(purge_age)
    tty = sys.stderr.isatty() and not state.json

    def progress(summary: ArchiveSummary) -> None:
        # 进度只在终端上画（回车覆盖同一行）；重定向到文件或管道时不输出，免得日志里全是进度行。
        click.echo(f"\r归档中：{summary.segments} 段，{summary.transitions} 条迁移记录……", nl=False, err=True)

    store = state.open_store()
    try:
        archiver = Archiver(store, directory, batch_size=batch_size, progress=progress if tty else None)
        summary = archiver.run(before, dry_run=dry_run, purge_commands_before=purge_before)
    except ArchiveError as exc:
        raise CliError(str(exc), error="archive_error") from exc
    finally:
        if tty:
            click.echo("\r" + " " * 60 + "\r", nl=False, err=True)
        store.close()
    if state.json:
        echo_json(
            {
                "dry_run": summary.dry_run,
                "before": before.isoformat(),
                "transitions": summary.transitions,
                "tasks": summary.tasks,
                "commands": summary.commands,
                "segments": summary.segments,
                "reconciled_segments": summary.reconciled_segments,
                "partitions_dropped": summary.partitions_dropped,
                "purged_commands": summary.purged_commands,
                "directory": directory,
            }
        )
    else:
        click.echo(f"{summary.line()}（截止 {before.isoformat(timespec='seconds')}，目录 {directory}）")
    return EXIT_OK
