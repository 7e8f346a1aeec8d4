"""查询命令：tasks、ps、status、history、stats、buckets。

它们只读：用一个不声明桶归属的 Controller（不认领任何指令），查询全部走存储。
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import datetime

import click

from chongming_task.cli.app import cli, json_option, pass_state
from chongming_task.cli.errors import EXIT_OK, CliError
from chongming_task.cli.output import (
    definition_dict,
    echo_json,
    echo_json_line,
    echo_text,
    render_definitions,
    render_detail,
    render_history,
    render_tasks,
    table,
)
from chongming_task.cli.params import NON_NEGATIVE_INT, POSITIVE_INT, SECONDS, STATUS
from chongming_task.cli.state import ENV_MODULE, AppState, load_task_module, register_tasks
from chongming_task.controller import Controller
from chongming_task.models import TaskSnapshot
from chongming_task.policies import BucketPolicy
from chongming_task.states import TaskStatus


def _console(state: AppState) -> Controller:
    return state.controller(state.open_store())


def _snapshot_or_fail(controller: Controller, state: AppState, task_id: str) -> TaskSnapshot:
    snapshot = controller.get(task_id)
    if snapshot is None:
        raise CliError(
            f"找不到任务 {task_id!r}（存储 {state.store_display}）：请用 ps 查看已有的任务 id",
            error="task_not_found",
        )
    return snapshot


@cli.command("tasks")
@click.option(
    "--tasks",
    "module_name",
    metavar="MODULE",
    envvar=ENV_MODULE,
    show_envvar=True,
    help="任务模块（如 myapp.tasks），它的 register(controller) 决定有哪些任务。",
)
@json_option
@pass_state
def tasks_command(state: AppState, module_name: str | None) -> int:
    """列出模块里登记的任务定义（名字、描述、标签、重试、超时）。"""
    module = load_task_module(module_name)
    controller = state.controller(None)
    register_tasks(controller, module)
    definitions = sorted(controller.definitions(), key=lambda d: d.name)
    if state.json:
        echo_json([definition_dict(d) for d in definitions])
    elif definitions:
        echo_text(render_definitions(definitions))
    else:
        click.echo(f"模块 {module.__name__} 的 register(controller) 没有登记任何任务")
    return EXIT_OK


@cli.command("ps")
@click.option("--status", "statuses", type=STATUS, multiple=True, help="只看这些状态（可重复）。")
@click.option("--name-prefix", metavar="P", help="任务名前缀。")
@click.option("--tag", metavar="T", help="带这个标签的任务。")
@click.option("--bucket", type=NON_NEGATIVE_INT, help="只看这个桶。")
@click.option("--pipeline", "pipeline_id", metavar="ID", help="只看这条管道的节点。")
@click.option("--limit", type=POSITIVE_INT, help="最多显示几条。")
@click.option("--newest", is_flag=True, help="最新提交的排在前面（默认按提交先后）。")
@click.option(
    "--watch",
    type=SECONDS,
    is_flag=False,
    flag_value=2.0,
    default=None,
    metavar="[SECONDS]",
    help="每隔几秒原地刷新（默认 2 秒），Ctrl-C 退出。",
)
@json_option
@pass_state
def ps_command(
    state: AppState,
    statuses: tuple[str, ...],
    name_prefix: str | None,
    tag: str | None,
    bucket: int | None,
    pipeline_id: str | None,
    limit: int | None,
    newest: bool,
    watch: float | None,
) -> int:
    """任务列表（render_table：TASK_ID NAME STATUS ATTEMPT ELAPSED PROGRESS BUCKET FAILURE）。"""
    if bucket is not None and bucket >= state.num_buckets:
        raise CliError(
            f"--bucket {bucket} 越界：桶数为 {state.num_buckets}，合法范围是 0-{state.num_buckets - 1}"
        )
    controller = _console(state)

    def snapshots() -> list[TaskSnapshot]:
        return controller.list_tasks(
            status=statuses or None,
            name_prefix=name_prefix,
            tag=tag,
            limit=limit,
            bucket=bucket,
            pipeline_id=pipeline_id,
            order="newest" if newest else "oldest",
        )

    if watch is None:
        found = snapshots()
        if state.json:
            echo_json([s.to_dict() for s in found])
        else:
            click.echo(render_tasks(found, controller.clock.now()) if found else "（没有符合条件的任务）")
        return EXIT_OK
    return _watch(state, controller, snapshots, watch)


def _watch(
    state: AppState, controller: Controller, snapshots: Callable[[], list[TaskSnapshot]], interval: float
) -> int:
    """原地刷新直到 Ctrl-C。终端上清屏重画；不是终端时逐次追加（JSON 则每次一行）。"""
    tty = sys.stdout.isatty()
    try:
        while True:
            found: list[TaskSnapshot] = snapshots()
            if state.json:
                echo_json_line([s.to_dict() for s in found])
            else:
                now = datetime.now().astimezone().strftime("%H:%M:%S")
                header = f"{now}  每 {interval:g} 秒刷新，Ctrl-C 退出  存储 {state.store_display}"
                body = render_tasks(found, controller.clock.now()) if found else "（没有符合条件的任务）"
                if tty:
                    click.echo("\x1b[H\x1b[2J" + header + "\n\n" + body)
                else:
                    click.echo(header + "\n" + body + "\n")
            time.sleep(interval)
    except KeyboardInterrupt:
        return EXIT_OK


@cli.command("status")
@click.argument("task_id")
@json_option
@pass_state
def status_command(state: AppState, task_id: str) -> int:
    """单个任务的快照明细（字段名与 --json 一致）。"""
    controller = _console(state)
    snapshot = _snapshot_or_fail(controller, state, task_id)
    if state.json:
        echo_json(snapshot.to_dict())
    else:
        click.echo(render_detail(snapshot, controller.clock.now()))
    return EXIT_OK


@cli.command("history")
@click.argument("task_id")
@json_option
@pass_state
def history_command(state: AppState, task_id: str) -> int:
    """任务的每一次状态迁移：时间、from → to、触发源、操作者、原因、版本号。"""
    controller = _console(state)
    _snapshot_or_fail(controller, state, task_id)
    assert controller.store is not None
    transitions = controller.store.history(task_id)
    if state.json:
        echo_json([t.to_dict() for t in transitions])
    else:
        click.echo(render_history(transitions))
    return EXIT_OK


@cli.command("stats")
@json_option
@pass_state
def stats_command(state: AppState) -> int:
    """各状态的任务数（unfinished 含排队与暂停）。"""
    stats = _console(state).stats()
    if state.json:
        echo_json({"counts": stats.to_dict(), "total": stats.total, "unfinished": stats.unfinished})
        return EXIT_OK
    rows = [(status.value, str(stats[status])) for status in TaskStatus if stats[status]]
    click.echo(table(rows, ("STATUS", "COUNT")) if rows else "（存储里还没有任务）")
    click.echo(f"\n合计 {stats.total}，未结束 {stats.unfinished}")
    return EXIT_OK


@cli.command("buckets")
@click.option("--all", "show_all", is_flag=True, help="列出全部桶（默认只列有任务的桶和本节点的桶）。")
@click.option("--key", "keys", multiple=True, metavar="KEY", help="看某个 bucket_key 落在哪个桶（可重复）。")
@json_option
@pass_state
def buckets_command(state: AppState, show_all: bool, keys: tuple[str, ...]) -> int:
    """每个桶的任务数；OWNED 标出 --owned-buckets 负责的桶。"""
    policy = BucketPolicy(state.num_buckets)
    owned = state.owned_buckets

    def is_owned(bucket: int) -> bool:
        return owned is None or bucket in owned

    key_rows = []
    for key in keys:
        if not key:
            raise CliError("--key 不能是空字符串")
        key_rows.append(
            {"key": key, "bucket": policy.bucket_for(key), "owned": is_owned(policy.bucket_for(key))}
        )
    counts = _console(state).bucket_counts()
    shown = list(range(state.num_buckets)) if show_all else sorted(set(counts) | (owned or set()))
    rows = [{"bucket": b, "count": counts.get(b, 0), "owned": is_owned(b)} for b in shown]
    if state.json:
        echo_json(
            {
                "num_buckets": state.num_buckets,
                "owned": state.owned_display,
                "buckets": rows,
                "keys": key_rows,
            }
        )
        return EXIT_OK
    for item in key_rows:
        mark = "本节点负责" if item["owned"] else "不归本节点"
        echo_text(f"bucket_key {item['key']!r} → 桶 {item['bucket']}（{mark}）")
    if key_rows:
        click.echo()
    if rows:
        click.echo(
            table(
                [(str(r["bucket"]), str(r["count"]), "✓" if r["owned"] else "") for r in rows],
                ("BUCKET", "COUNT", "OWNED"),
            )
        )
    else:
        click.echo("（还没有任何带桶的任务）")
    bucketed = sum(counts.values())
    click.echo(f"\n桶数 {state.num_buckets}，本节点负责：{state.owned_display}，带桶的任务共 {bucketed} 个")
    return EXIT_OK
