"""控制命令：stop、pause、resume，以及运维用的 reconcile、prune。

本进程不持有这些任务，所以 stop / pause / resume 都是写进存储的指令，由持有者轮询取走执行
（用户指南 §9.4）：stop / resume 的"成功"是"请求已受理"，跨进程的 pause 如实报"未确认"
（``pause --wait`` 则轮询存储，直到任务真的 paused）。

对已经结束的任务，三个控制命令的退出方式相同（docs/cli.md "控制命令与已结束的任务"）：什么都不写，
退出码 1，错误码 ``task_finished``，消息里给出终态。理由：命令没能做它要做的事（没有写下任何指令）；
想把"已经结束"当作成功的脚本（"确保它不在跑"）按错误码判断即可，而不必猜三个命令各自的约定。
"""

from __future__ import annotations

import time

import click

from chongming_task.cli.app import cli, json_option, pass_state
from chongming_task.cli.errors import EXIT_OK, CliError
from chongming_task.cli.output import echo_json, fmt_time, table
from chongming_task.cli.params import NON_NEGATIVE_INT, SECONDS
from chongming_task.cli.state import AppState
from chongming_task.controller import Controller
from chongming_task.models import TaskSnapshot
from chongming_task.run import DEFAULT_PAUSE_TIMEOUT
from chongming_task.states import TaskStatus

# pause --wait 在持有者的暂停窗口之外多等的时间：指令要等持有者下一轮轮询才被取走（默认 0.5 秒一轮），
# 确认写回存储也要一点时间。
_PAUSE_WAIT_MARGIN = 3.0


def _target(state: AppState, task_id: str) -> tuple[Controller, TaskSnapshot]:
    controller = state.controller(state.open_store())
    snapshot = controller.get(task_id)
    if snapshot is None:
        raise CliError(
            f"找不到任务 {task_id!r}（存储 {state.store_display}）：请用 ps 查看已有的任务 id",
            error="task_not_found",
        )
    return controller, snapshot


_VERBS = {"stop": "停止", "pause": "暂停", "resume": "恢复"}


def _refuse_finished(task_id: str, snapshot: TaskSnapshot, action: str) -> None:
    """三个控制命令对已结束任务的统一出口（见模块说明）。"""
    if snapshot.is_terminal:
        raise CliError(
            f"任务 {task_id} 已经结束（{snapshot.status.value}），没有可{_VERBS[action]}的执行："
            f"没有写入任何指令；用 status {task_id} 查看结果",
            error="task_finished",
            details={"task_id": task_id, "action": action, "status": snapshot.status.value},
        )


def _holder(snapshot: TaskSnapshot) -> str:
    return snapshot.lease_owner or snapshot.owner or "（未知）"


def _warn_if_unattended(controller: Controller, snapshot: TaskSnapshot) -> None:
    """指令要靠持有者取走。持有者的租约已过期，多半没有进程会执行它：如实提醒，而不是让人干等。"""
    lease_until = snapshot.lease_until
    if lease_until is not None and lease_until < controller.clock.now():
        click.echo(
            f"注意：持有者 {_holder(snapshot)} 的租约已在 {fmt_time(lease_until)} 过期，"
            "可能没有进程会执行这条指令；确认持有进程已经不在后，可用 reconcile 把任务如实标记",
            err=True,
        )


@cli.command("stop")
@click.argument("task_id")
@click.option("--reason", metavar="TEXT", help="停止原因，写进迁移历史。")
@click.option(
    "--wait", "wait_seconds", type=SECONDS, metavar="SECONDS", help="等任务落终态再返回，最多等这么久。"
)
@json_option
@pass_state
def stop_command(state: AppState, task_id: str, reason: str | None, wait_seconds: float | None) -> int:
    """请求停止任务（写成指令，由持有它的进程执行）。"""
    controller, snapshot = _target(state, task_id)
    _refuse_finished(task_id, snapshot, "stop")
    _warn_if_unattended(controller, snapshot)
    accepted = controller.stop(task_id, reason=reason)
    final = _wait(controller, task_id, wait_seconds) if wait_seconds is not None else None
    if state.json:
        result: dict[str, object] = {"task_id": task_id, "action": "stop", "accepted": accepted}
        if final is not None:
            result["snapshot"] = final.to_dict()
        echo_json(result)
    else:
        click.echo(f"已受理：停止请求已写入存储，由持有者 {_holder(snapshot)} 执行")
        if final is not None:
            click.echo(f"任务 {task_id} 已落终态：{final.status.value}")
        else:
            click.echo(f"用 status {task_id} 查看结果")
    return EXIT_OK


def _wait(controller: Controller, task_id: str, seconds: float) -> TaskSnapshot:
    try:
        return controller.wait(task_id, timeout=seconds).snapshot
    except TimeoutError:
        current = controller.get(task_id)
        status = current.status.value if current is not None else "未知"
        raise CliError(
            f"等了 {seconds:g} 秒，任务 {task_id} 仍未落终态（当前 {status}）；"
            "停止请求仍然有效，稍后再用 status 查看",
            error="wait_timeout",
        ) from None


@cli.command("pause")
@click.argument("task_id")
@click.option(
    "--timeout",
    type=SECONDS,
    metavar="SECONDS",
    help=f"持有者等待任务挂起的最长时间（暂停窗口，默认 {DEFAULT_PAUSE_TIMEOUT:g} 秒），过了就撤回暂停。",
)
@click.option(
    "--wait",
    "wait_flag",
    is_flag=True,
    help="等持有者确认：任务到达 paused 才返回（最多等暂停窗口再加几秒），没暂停成就退出码 1。",
)
@json_option
@pass_state
def pause_command(state: AppState, task_id: str, timeout: float | None, wait_flag: bool) -> int:
    """请求暂停任务。跨进程没有回执通道：不加 --wait 只能报"未确认"（退出码仍是 0）。"""
    controller, snapshot = _target(state, task_id)
    _refuse_finished(task_id, snapshot, "pause")
    _warn_if_unattended(controller, snapshot)
    confirmed = controller.pause(task_id, timeout=timeout)
    final: TaskSnapshot | None = None
    if wait_flag and not confirmed:
        window = DEFAULT_PAUSE_TIMEOUT if timeout is None else timeout
        final = _wait_paused(controller, task_id, window + _PAUSE_WAIT_MARGIN)
        confirmed = True
    if state.json:
        result: dict[str, object] = {"task_id": task_id, "action": "pause", "confirmed": confirmed}
        if final is not None:
            result["snapshot"] = final.to_dict()
        echo_json(result)
    elif confirmed:
        click.echo(f"任务 {task_id} 已暂停（paused）；用 resume {task_id} 恢复")
    else:
        click.echo(
            f"已发出暂停请求，未确认：跨进程没有回执通道，由持有者 {_holder(snapshot)} 执行；"
            f"用 status {task_id} 查看是否已经 paused（或加 --wait 等它确认）"
        )
    return EXIT_OK


def _wait_paused(controller: Controller, task_id: str, seconds: float) -> TaskSnapshot:
    """轮询存储直到任务 paused。持有者撤回暂停（回到 running）、任务结束、等满时间：都如实报错。"""
    deadline = time.monotonic() + seconds
    seen_pausing = False
    while True:
        current = controller.get(task_id)
        status = current.status if current is not None else None
        if current is not None and status is TaskStatus.PAUSED:
            return current
        if current is not None and current.is_terminal:
            raise CliError(
                f"任务 {task_id} 在暂停生效前就结束了（{current.status.value}）；"
                f"用 status {task_id} 查看结果",
                error="task_finished",
            )
        seen_pausing = seen_pausing or status is TaskStatus.PAUSING
        if seen_pausing and status is TaskStatus.RUNNING:
            raise CliError(
                f"任务 {task_id} 没能在暂停窗口内挂起，持有者已撤回暂停（现在 running）；"
                "任务可能很久才 checkpoint 一次：请加大 --timeout 再试",
                error="wait_timeout",
            )
        if time.monotonic() >= deadline:
            shown = status.value if status is not None else "未知"
            raise CliError(
                f"等了 {seconds:g} 秒，任务 {task_id} 仍未暂停（当前 {shown}）；持有者可能没有在运行，"
                f"稍后用 status {task_id} 查看",
                error="wait_timeout",
            )
        time.sleep(0.05)


@cli.command("resume")
@click.argument("task_id")
@json_option
@pass_state
def resume_command(state: AppState, task_id: str) -> int:
    """请求恢复一个暂停的任务。"""
    controller, snapshot = _target(state, task_id)
    _refuse_finished(task_id, snapshot, "resume")
    _warn_if_unattended(controller, snapshot)
    accepted = controller.resume(task_id)
    if state.json:
        echo_json({"task_id": task_id, "action": "resume", "accepted": accepted})
    else:
        click.echo(
            f"已受理：恢复请求已写入存储，由持有者 {_holder(snapshot)} 执行；用 status {task_id} 查看结果"
        )
    return EXIT_OK


@cli.command("reconcile")
@click.option("--dry-run", is_flag=True, help="只报告，不写任何状态。")
@json_option
@pass_state
def reconcile_command(state: AppState, dry_run: bool) -> int:
    """把租约过期、失去监督者的任务如实标记为 lost（只看 --owned-buckets 负责的桶）。"""
    controller = state.controller(state.open_store(), claim_buckets=True)
    report = controller.reconcile(dry_run=dry_run)
    groups = (("lost", report.lost), ("adoptable", report.adoptable), ("skipped", report.skipped))
    if state.json:
        echo_json({"dry_run": dry_run, **{name: [s.to_dict() for s in items] for name, items in groups}})
        return EXIT_OK
    verb = {
        "lost": "会被判为 lost" if dry_run else "已判为 lost",
        "adoptable": "无人接手（需重新提交）",
        "skipped": "有人正在写，已跳过",
    }
    rows = [
        (s.task_id, s.name, s.status.value, verb[name], s.lease_owner, fmt_time(s.lease_until))
        for name, items in groups
        for s in items
    ]
    if not rows:
        click.echo(f"没有失去监督者的任务（本节点负责的桶：{state.owned_display}）")
        return EXIT_OK
    click.echo(table(rows, ("TASK_ID", "NAME", "STATUS", "处置", "LEASE_OWNER", "LEASE_UNTIL")))
    summary = f"\nlost {len(report.lost)}，adoptable {len(report.adoptable)}，skipped {len(report.skipped)}"
    click.echo(summary + ("（dry-run：没有写入任何状态）" if dry_run else ""))
    return EXIT_OK


@cli.command("prune")
@click.option(
    "--keep-terminal", type=NON_NEGATIVE_INT, required=True, metavar="N", help="保留最新的 N 条终态记录。"
)
@json_option
@pass_state
def prune_command(state: AppState, keep_terminal: int) -> int:
    """丢弃最旧的终态记录，只保留最新 N 条（未结束的任务不受影响）。"""
    removed = state.controller(state.open_store()).prune(keep_terminal)
    if state.json:
        echo_json({"removed": removed, "keep_terminal": keep_terminal})
    else:
        click.echo(f"已清理 {removed} 条终态记录（保留最新 {keep_terminal} 条）")
    return EXIT_OK
