"""持久任务的三个命令（issue 19，docs/cli.md）：submit（只入队）、retry（重跑已结束的）、worker（认领执行）。

* ``submit``：按模块登记的定义检查名字与参数，写下一个 queued、无人持有的持久任务，打印 task_id 后立刻
  退出；这个进程不执行它。
* ``retry``：已结束的持久任务经审计的 retry() 复活、交回队列。
* ``worker``：前台运行 ``Controller.serve()``。第一次 SIGTERM / Ctrl-C：不再认领，交还还没开始的，等在跑的
  最多 ``--drain-timeout`` 秒；到点仍在跑的走优雅停止。第二次：不再等，立刻停。退出码：0 干净退出（在跑的
  都跑完了）；3 有任务是在 drain 超时后被停掉的；1 命令本身失败（参数、模块、存储）。
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import click

from chongming_task.cli.app import cli, json_option, pass_state, tasks_option
from chongming_task.cli.buckets import format_bucket_spec, owned_buckets
from chongming_task.cli.cmd_run import (
    SignalStop,
    TaskCall,
    ignore_interrupts,
    submit_errors,
    submit_options,
    task_controller,
)
from chongming_task.cli.errors import EXIT_OK, EXIT_TASK_NOT_SUCCEEDED, CliError
from chongming_task.cli.output import echo_json
from chongming_task.cli.params import EXECUTOR, IntType, seconds_option
from chongming_task.cli.state import AppState, load_task_module, register_tasks
from chongming_task.errors import StoreError, TaskError, TaskNotFound
from chongming_task.runtime.executors import ProcessExecutor, ThreadExecutor

KEEP_FINISHED = 1000
"""常驻的 worker 在内存里只留最新这么多个已落地任务的句柄（更早的仍可在存储里查到），内存不随处理量增长。"""


@cli.command("submit")
@click.argument("task_name", metavar="TASK")
@tasks_option(
    "任务模块（如 myapp.tasks）：名字必须是它的 register(controller) 登记过的，参数按它的签名检查。"
)
@submit_options(
    task_id="任务 id（默认自动生成）；id 不能重复。",
    bucket_key="业务键：决定任务落在哪个桶、由负责那个桶的 worker 认领。",
    priority="优先级，越大越先被认领。",
)
@click.option(
    "--on-lost",
    type=click.Choice(["fail", "retry"]),
    help="在跑时 worker 失联之后：fail 保持 lost；retry 还有尝试次数时自动重跑。默认取任务定义的。",
)
@json_option
@pass_state
def submit_command(state: AppState, call: TaskCall, on_lost: str | None) -> int:
    """只入队不执行：写下一个持久任务，由 worker 认领执行；打印 task_id（退出码 0）。"""
    task_name, fields = call.task_name, call.fields
    module, kwargs = call.load()
    if "on_lost" in kwargs:
        raise CliError("--arg on_lost=... 与提交参数同名：请用 --on-lost 选项")
    if not state.has_store():
        raise CliError(
            "submit 需要共享存储（--db 或 --store）：任务要由别的 worker 进程认领", error="configuration"
        )
    store = state.open_store(create=True)
    controller = task_controller(state, store, module, task_name, kwargs)
    with submit_errors(state, controller, fields["task_id"]):
        new_id = controller.enqueue(task_name, on_lost=on_lost, **fields, **kwargs)
    if state.json:
        snapshot = store.get(new_id)
        echo_json(snapshot.to_dict() if snapshot is not None else {"task_id": new_id})
    else:
        click.echo(new_id)
    return EXIT_OK


@cli.command("retry")
@click.argument("task_id", metavar="TASK")
@click.option("--reason", metavar="TEXT", help="写进迁移历史的原因。")
@json_option
@pass_state
def retry_command(state: AppState, task_id: str, reason: str | None) -> int:
    """重跑一个已结束（failed / stopped / cancelled / lost）的持久任务：复活并交回队列，由 worker 认领。"""
    store = state.open_store()
    controller = state.controller(store)
    try:
        revived = controller.requeue(task_id, reason=reason)
    except TaskNotFound as exc:
        raise CliError(f"retry 被拒绝：{state.mask(str(exc))}", error="task_not_found") from exc
    except StoreError as exc:
        raise CliError(f"retry 失败：{state.mask(str(exc))}", error="store_error") from exc
    except TaskError as exc:
        raise CliError(f"retry 被拒绝：{state.mask(str(exc))}", error="retry_rejected") from exc
    if state.json:
        echo_json(revived.to_dict())
    else:
        click.echo(f"任务 {task_id} 已重新排队（第 {revived.attempt + 1} 次尝试，等 worker 认领）")
    return EXIT_OK


@cli.command("worker")
@tasks_option("任务模块（如 myapp.tasks）：worker 只执行它登记过名字的持久任务。")
@click.option(
    "--owned-buckets",
    "worker_buckets",
    metavar="SPEC",
    help="本 worker 负责的桶，如 0-15 或 0-3,8（默认取全局的 --owned-buckets；都不给就是全部桶）。",
)
@click.option(
    "--max-parallel",
    type=IntType(minimum=1, maximum=1000),
    default=4,
    show_default=True,
    metavar="N",
    help="槽位数：同时执行的任务上限，也是一次最多认领的个数（不囤积）。",
)
@seconds_option(
    "--drain-timeout", 30.0, "收到 SIGTERM / Ctrl-C 后等在跑的任务跑完的秒数，到点仍在跑的被停止。"
)
@seconds_option("--poll-interval", 0.2, "没有新任务通知时（SQLite；PostgreSQL 有 NOTIFY）多久看一次队列。")
@seconds_option("--lease-ttl", 30.0, "租约时长：worker 失联多久之后别的 worker 接手它的任务。")
@click.option(
    "--executor", "executor_name", type=EXECUTOR, default="thread", show_default=True, help="执行器。"
)
@pass_state
def worker_command(
    state: AppState,
    module_name: str | None,
    worker_buckets: str | None,
    max_parallel: int,
    drain_timeout: float,
    poll_interval: float,
    lease_ttl: float,
    executor_name: str,
) -> int:
    """认领并执行持久任务，直到 SIGTERM / Ctrl-C（退出码：0 干净退出；3 有任务在 drain 超时后被停止）。"""
    module = load_task_module(module_name)
    if not state.has_store():
        raise CliError("worker 需要共享存储（--db 或 --store）：任务由别的进程 submit", error="configuration")
    owned = (
        state.owned_buckets if worker_buckets is None else owned_buckets(worker_buckets, state.num_buckets)
    )
    store = state.open_store(create=True)
    executor = ProcessExecutor() if executor_name == "process" else ThreadExecutor()
    controller = state.controller(
        store,
        executor=executor,
        close_reason="worker 退出",
        max_parallel=max_parallel,
        owned_buckets=owned,
        lease_ttl=lease_ttl,
        keep_finished=KEEP_FINISHED,
    )
    register_tasks(controller, module)
    names = sorted(d.name for d in controller.definitions())
    buckets = "全部" if owned is None else format_bucket_spec(owned)
    click.echo(
        f"worker {controller.owner} 已启动：任务 {', '.join(names) or '（无）'}，桶 {buckets}，"
        f"槽位 {max_parallel}，存储 {state.store_display}（SIGTERM / Ctrl-C 停止）",
        err=True,
    )
    stop = threading.Event()
    with _stop_on_signals(stop):
        try:
            report = controller.serve(stop, poll_interval=poll_interval, drain_timeout=drain_timeout)
        except (KeyboardInterrupt, SignalStop):
            # 第二下的意思是"不再等"：以 0 秒窗口关（给在跑的发停止请求、把已发生的写追平，不等它们落定）。
            # 原来按优雅停止的整个窗口（graceful_stop + 2 秒）关，一个不 checkpoint 的任务就让进程再挂 7 秒，
            # 而第三下中断会在 close() 半途抛出。收尾期间再来的中断一律忽略：它不能再把收尾打断在半截。
            ignore_interrupts()
            click.echo("再次中断：不再等待在跑的任务，立刻停止", err=True)
            controller.close(reason="worker 被再次中断", timeout=0)
            running = [run for run in controller.runs() if not run.status.is_terminal]
            if running:
                click.echo(
                    f"{len(running)} 个任务没来得及落定（{', '.join(r.task_id for r in running[:5])}"
                    f"{' …' if len(running) > 5 else ''}）：租约过期后 reconcile 把它们如实标记为 lost，"
                    "持久任务按 on_lost 决定是否重跑",
                    err=True,
                )
            return EXIT_TASK_NOT_SUCCEEDED
    click.echo(
        f"worker {controller.owner} 已停止：认领 {report.claimed}，接手 {report.adopted}，"
        f"重跑 {report.revived}，交还 {report.released}，drain 超时被停止 {report.stopped_at_drain}",
        err=True,
    )
    return EXIT_OK if report.drained else EXIT_TASK_NOT_SUCCEEDED


class _stop_on_signals:
    """第一次 SIGTERM / SIGINT：置位 stop（开始 drain）；第二次：在主线程里抛 SignalStop（不再等）。"""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.stop.is_set():
            raise SignalStop(signal.Signals(signum).name)
        # 先置位、再打印：第二下可能紧跟着第一下、在打印的半途（处理函数里）到达。先打印的话，它看到的 stop
        # 还没置位，被当成又一个"第一下"吞掉，worker 照旧等满整个 --drain-timeout。
        self.stop.set()
        click.echo(f"收到 {signal.Signals(signum).name}：不再认领，等在跑的任务跑完…", err=True)

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGINT, signal.SIGTERM):
            self.previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)

    def __exit__(self, *exc: object) -> None:
        for signum, old in self.previous.items():
            signal.signal(signum, old)  # type: ignore[arg-type]


__all__ = ["retry_command", "submit_command", "worker_command"]
