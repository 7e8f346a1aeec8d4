"""doctor：集群运维体检（分布式设计说明 §5）。

读各节点在存储里发布的桶声明，报告重复、空洞、桶数不一致与孤儿任务。退出码：0 健康；3 命令本身成功、
但集群不健康（给脚本与告警判分支用）；1 命令失败（存储连不上、SQLite 文件损坏等）。

SQLite 存储先做一遍 ``PRAGMA integrity_check``（完整检查，比其他命令打开前的 quick_check 更严）：
损坏的文件上，节点登记与任务计数都可能是残缺的，据此给出的"健康"不可信——所以报告检查结果、退出码 1。
"""

from __future__ import annotations

import os

import click

from chongming_task.cli.app import cli, json_option, pass_state
from chongming_task.cli.errors import EXIT_OK, EXIT_TASK_NOT_SUCCEEDED, CliError
from chongming_task.cli.output import echo_json, echo_text, fmt_time, table
from chongming_task.cli.params import POSITIVE_INT
from chongming_task.cli.state import AppState, sqlite_integrity
from chongming_task.runtime.cluster import DEFAULT_ORPHAN_LIMIT, check_cluster, format_buckets


@cli.command("doctor")
@click.option(
    "--orphan-limit",
    type=POSITIVE_INT,
    default=DEFAULT_ORPHAN_LIMIT,
    show_default=True,
    help="最多列出多少个孤儿任务（总数照常统计）。",
)
@json_option
@pass_state
def doctor_command(state: AppState, orphan_limit: int) -> int:
    """集群体检：数据库文件完整性、节点登记的桶有没有重复/空洞、有没有没人负责的任务。不健康时退出码 3。"""
    integrity = _check_integrity(state)
    store = state.open_store()
    try:
        report = check_cluster(store, num_buckets=state.num_buckets, orphan_limit=orphan_limit)
    finally:
        store.close()
    if state.json:
        echo_json(
            {
                **report.to_dict(),
                "integrity": integrity,
                "healthy": report.healthy,
                "problems": report.problems(),
                "warnings": report.warnings(),
            }
        )
        return EXIT_OK if report.healthy else EXIT_TASK_NOT_SUCCEEDED
    if integrity is not None:
        click.echo(f"✓ 数据库文件完整性检查通过（{integrity['check']}）")
    rows = [
        (
            node.owner,
            "全部（不限定）" if node.buckets is None else format_buckets(node.buckets),
            str(node.num_buckets),
            fmt_time(node.heartbeat_at),
            fmt_time(node.expires_at),
        )
        for node in report.nodes
    ]
    if rows:
        click.echo(table(rows, ("OWNER", "BUCKETS", "NUM_BUCKETS", "HEARTBEAT", "EXPIRES")))
    else:
        click.echo("（没有活着的节点登记桶归属）")
    click.echo("")
    for line in report.problems():
        click.echo(f"✗ {line}")
    for line in report.warnings():
        click.echo(f"! {line}")
    if report.healthy:
        click.echo(f"✓ 集群健康：{len(report.nodes)} 个活节点，{report.num_buckets} 个桶各有且只有一个负责者")
        return EXIT_OK
    return EXIT_TASK_NOT_SUCCEEDED


def _check_integrity(state: AppState) -> dict[str, object] | None:
    """SQLite 文件：integrity_check 通过时返回 {"check": ..., "ok": True}；没通过就报告并退出 1。
    不是 SQLite 文件存储（Postgres、内存）时返回 None。"""
    path = state.sqlite_file()
    if path is None or not os.path.isfile(path) or os.path.getsize(path) == 0:
        return None
    problems = sqlite_integrity(path, full=True)
    if not problems:
        return {"check": "integrity_check", "ok": True, "problems": []}
    if state.json:
        echo_json({"integrity": {"check": "integrity_check", "ok": False, "problems": problems}})
    else:
        click.echo(f"✗ 数据库文件 {state.store_display} 完整性检查（integrity_check）没有通过：")
        for line in problems:
            echo_text(f"  {line}")
    raise CliError(
        f"数据库文件 {state.store_display} 已损坏（integrity_check 的结果见上）：请从备份恢复，"
        "或停掉所有节点后用 sqlite3 的 .recover 导出能救回的数据",
        error="store_damaged",
    )
