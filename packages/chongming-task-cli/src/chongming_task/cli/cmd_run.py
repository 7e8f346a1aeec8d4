"""run：提交一个任务并在前台执行到落终态。

这个进程就是任务的持有者：它的 Controller 带着 --owner / --owned-buckets 与存储，于是别的终端
写下的 stop / pause / resume 指令会被它取走执行。它退出时任务就没人管了（§4.5），所以
Ctrl-C / SIGTERM 一律走 controller.close()：在跑的任务走优雅停止，落下一个诚实的终态再退出。
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import FrameType, ModuleType
from typing import Any

import click

from chongming_task.cli.app import cli, json_option, pass_state, tasks_option
from chongming_task.cli.buckets import format_bucket_spec
from chongming_task.cli.errors import EXIT_OK, EXIT_TASK_NOT_SUCCEEDED, CliError
from chongming_task.cli.output import LiveDisplay, echo_json, fmt_time, fmt_value, progress_bar
from chongming_task.cli.params import EXECUTOR, INT, IntType, parse_task_argument, seconds_option
from chongming_task.cli.state import AppState, load_task_module, register_tasks
from chongming_task.controller import SUBMIT_KEYWORDS, Controller
from chongming_task.errors import DuplicateTaskId, StoreError, TaskError
from chongming_task.models import Progress, TaskSnapshot
from chongming_task.run import TaskRun
from chongming_task.runtime.executors import ProcessExecutor, ThreadExecutor
from chongming_task.runtime.table import elapsed_text
from chongming_task.states import TaskStatus
from chongming_task.storage import TaskStore

# 提交参数对应的 run 选项：--arg 撞名时告诉用户该用哪个选项。
_SUBMIT_OPTIONS = {
    "task_id": "--task-id",
    "label": "--label",
    "tags": "--tag",
    "priority": "--priority",
    "bucket_key": "--bucket-key",
}


class SignalStop(BaseException):
    """SIGTERM 到达：和 Ctrl-C 一样走 close()。继承 BaseException，任务代码里的 except Exception 接不住它。"""

    def __init__(self, signame: str) -> None:
        super().__init__(signame)
        self.signame = signame


_INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _interrupts_as_exceptions() -> Iterator[None]:
    """SIGTERM（systemd stop、kill）→ 在主线程里抛 SignalStop；Ctrl-C 本来就是 KeyboardInterrupt。

    退出时恢复两个信号原来的处理（CliRunner 在同一个进程里跑很多条命令）。
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SignalStop(signal.Signals(signum).name)

    previous = {signum: signal.getsignal(signum) for signum in _INTERRUPTS}
    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def ignore_interrupts() -> None:
    """此后的 Ctrl-C / SIGTERM 一律忽略：收尾已经决定（run：已停完，只剩打印结果；worker：第二下中断之后的
    0 秒收尾），再来的中断不该把它打断在半截、也不该把退出码从 3 变成 1。"""
    if threading.current_thread() is threading.main_thread():
        for signum in _INTERRUPTS:
            signal.signal(signum, signal.SIG_IGN)


def _parse_arguments(raw_args: tuple[str, ...]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    for text in raw_args:
        try:
            key, value = parse_task_argument(text)
        except click.BadParameter as exc:
            raise CliError(f"--arg {exc.message}") from None
        if key in SUBMIT_KEYWORDS:
            raise CliError(f"--arg {key}=... 与提交参数同名：请用 {_SUBMIT_OPTIONS.get(key, key)} 选项")
        if key in kwargs:
            raise CliError(f"--arg {key} 给了两次：每个参数只能给一个值")
        kwargs[key] = value
    return kwargs


def _check_signature(controller: Controller, name: str, kwargs: dict[str, Any]) -> None:
    """参数对不上就在提交前说清楚（退出码 1），而不是让任务跑起来再以 TypeError 失败（退出码 3）。

    任务函数的第一个位置参数接收上下文 ctx（TaskContext），--arg 只给其余的参数。最常见的错误是
    忘了写 ctx（``def fetch(url)``）：那时 url 收到的是上下文，--arg url=... 撞名——报错要指出这一点，
    而不是说"它接受的参数是：（无参数）"（issue 16.8）。
    """
    definition = next(d for d in controller.definitions() if d.name == name)
    try:
        signature = inspect.signature(definition.fn)
    except (TypeError, ValueError):
        return  # 拿不到签名（C 实现的可调用对象）：交给运行时去报
    params = list(signature.parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    takes_ctx = bool(params) and (
        params[0].kind in positional or params[0].kind is inspect.Parameter.VAR_POSITIONAL
    )
    fn_name = getattr(definition.fn, "__name__", name)
    if not takes_ctx:
        rest = ", ".join(p.name for p in params)
        raise CliError(
            f"任务 {name} 的函数没有接收上下文的位置参数：第一个位置参数接收 ctx（TaskContext），"
            f"请把它写成 def {fn_name}(ctx{', ' + rest if rest else ''})",
            error="submit_rejected",
        )
    first = params[0].name
    if first in kwargs and params[0].kind is not inspect.Parameter.POSITIONAL_ONLY:
        raise CliError(
            f"--arg {first}=... 对不上：任务 {name} 的第一个位置参数 {first} 接收的是"
            "上下文 ctx（TaskContext），不是任务参数——多半是忘了写 ctx，"
            f"请把函数写成 def {fn_name}(ctx, {first}, ...)",
            error="submit_rejected",
        )
    try:
        signature.bind(None, **kwargs)  # 第一个位置参数是 ctx
    except TypeError as exc:
        names = [p.name for p in params[1:]]
        expected = "、".join(names) if names else "（除上下文外没有参数）"
        raise CliError(
            f"任务 {name} 的参数与 --arg 对不上：{exc}；它接受的参数是：{expected}"
            f"（第一个位置参数 {first} 接收上下文 ctx，不用 --arg 给）",
            error="submit_rejected",
        ) from None


def _resolve_name(controller: Controller, module_name: str, name: str) -> None:
    """只接受登记过的名字（§8.1）。点号路径、冒号路径一律当作"想启动任意可调用对象"拒绝。"""
    known = sorted(d.name for d in controller.definitions())
    if name in known:
        return
    known_text = ", ".join(known) if known else "（没有登记任何任务）"
    if "." in name or ":" in name:
        raise CliError(
            f"拒绝运行 {name!r}：CLI 只接受模块 {module_name} 的 register(controller) 登记过的任务名，"
            f"不接受模块路径或可调用对象——能启动任意可调用对象的入口等于任意代码执行。已登记的有：{known_text}",
            error="not_registered",
        )
    raise CliError(
        f"任务名 {name!r} 没有登记：模块 {module_name} 登记的有：{known_text}", error="not_registered"
    )


_FIELD_PARAMS = ("task_id", "label", "tags", "priority", "bucket_key")


@dataclass(frozen=True)
class TaskCall:
    """run / submit 要提交的东西：任务名、任务模块、``--arg`` 原文与五个提交参数 ``fields``（原样交给
    submit / enqueue）。"""

    task_name: str
    module_name: str | None
    raw_args: tuple[str, ...]
    fields: dict[str, Any]

    def load(self) -> tuple[ModuleType, dict[str, Any]]:
        """导入任务模块，再解析 ``--arg``（先模块后参数：两样都错时先说模块）。"""
        return load_task_module(self.module_name), _parse_arguments(self.raw_args)


def submit_options(
    *, task_id: str, bucket_key: str, priority: str
) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """run / submit 共用的提交参数选项：--arg、--task-id、--bucket-key、--label、--tag、--priority（帮助文字
    按命令说各自的含义）。命令函数收到的是一个 ``call``（TaskCall：任务名、模块、参数与提交参数）。"""
    options = [
        click.option(
            "--arg",
            "raw_args",
            multiple=True,
            metavar="K=V",
            help="任务参数，可重复；值能按 JSON 解析就解析。",
        ),
        click.option("--task-id", metavar="ID", help=task_id),
        click.option("--bucket-key", metavar="KEY", help=bucket_key),
        click.option("--label", metavar="TEXT", help="给人看的名字（ps 的 NAME 列）。"),
        click.option("--tag", "tags", multiple=True, metavar="TAG", help="附加标签，可重复。"),
        click.option("--priority", type=INT, help=priority),
    ]

    def decorate(fn: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(fn)
        def gather(*args: Any, **params: Any) -> int:
            fields = {key: params.pop(key) for key in _FIELD_PARAMS}
            call = TaskCall(
                params.pop("task_name"), params.pop("module_name"), params.pop("raw_args"), fields
            )
            return fn(*args, call=call, **params)

        command: Callable[..., int] = gather
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def task_controller(
    state: AppState,
    store: TaskStore | None,
    module: ModuleType,
    task_name: str,
    kwargs: dict[str, Any],
    **options: Any,
) -> Controller:
    """run / submit 的准备：建 Controller、登记模块的任务，再在碰存储之前检查名字与参数。"""
    controller = state.controller(store, **options)
    register_tasks(controller, module)
    _resolve_name(controller, module.__name__, task_name)
    _check_signature(controller, task_name, kwargs)
    return controller


@cli.command("run")
@click.argument("task_name", metavar="TASK")
@tasks_option("任务模块（如 myapp.tasks），只有它的 register(controller) 登记过的名字能跑。")
@submit_options(
    task_id="任务 id（默认自动生成）；id 不能重复，同一个任务再跑一次要换一个 id。",
    bucket_key="业务键；限定了 --owned-buckets 时必需。",
    priority="优先级，越大越先执行。",
)
@click.option(
    "--executor", "executor_name", type=EXECUTOR, default="thread", show_default=True, help="执行器。"
)
@seconds_option("--progress-interval", 5.0, "不是终端时，进度行最多每隔几秒打印一次。")
@click.option(
    "--metrics-port",
    type=IntType(minimum=1, maximum=65535),
    metavar="PORT",
    help="在这个端口提供 Prometheus 指标（/metrics），直到本命令退出；需要 chongming-task-runtime[metrics]。",
)
@click.option(
    "--metrics-host",
    default="127.0.0.1",
    show_default=True,
    metavar="ADDR",
    help="指标端点监听的地址；要让别的机器上的 Prometheus 来抓，给 0.0.0.0。",
)
@json_option
@pass_state
def run_command(
    state: AppState,
    call: TaskCall,
    executor_name: str,
    progress_interval: float,
    metrics_port: int | None,
    metrics_host: str,
) -> int:
    """提交一个任务并在前台执行到落终态（Ctrl-C / SIGTERM 会把它停干净）。

    退出码：0 任务 succeeded；3 任务落在别的终态（failed / stopped / lost ...）；1 命令本身失败。
    """
    task_name, fields = call.task_name, call.fields
    module, kwargs = call.load()
    owned = state.owned_buckets
    if fields["bucket_key"] is None and owned is not None and len(owned) < state.num_buckets:
        # 与 Controller 的规则相同（§9.6），只是在碰存储之前、用命令行的说法讲出来。
        raise CliError(
            f"限定了 --owned-buckets {format_bucket_spec(owned)}（共 {state.num_buckets} 个桶）时必须给出 "
            "--bucket-key：没有归属桶的任务不会有任何节点认领它，只会永远排队",
            error="submit_rejected",
        )
    store = state.open_store(create=True) if state.has_store() else None
    executor = ProcessExecutor() if executor_name == "process" else ThreadExecutor()
    controller = task_controller(
        state, store, module, task_name, kwargs, claim_buckets=True, executor=executor
    )
    metrics_url = None
    if metrics_port is not None:
        metrics_url = _serve_metrics(state, controller, metrics_host, metrics_port)
    with submit_errors(state, controller, fields["task_id"]):
        run = controller.submit(task_name, **fields, **kwargs)
    display = LiveDisplay()
    snapshot = run.snapshot
    bucket = "-" if snapshot.bucket is None else str(snapshot.bucket)
    display.line(
        f"已提交 {run.task_id}（任务 {task_name}，桶 {bucket}，持有者 {controller.owner}，"
        f"存储 {state.store_display if store is not None else '无（仅本进程内存）'}）"
    )
    if metrics_url is not None:
        display.line(f"指标：{metrics_url}")
    interrupted: str | None = None
    with _interrupts_as_exceptions():
        watcher = _Watcher(run, display, progress_interval)
        try:
            watcher.follow()
        except (KeyboardInterrupt, SignalStop) as exc:
            interrupted = exc.signame if isinstance(exc, SignalStop) else "SIGINT"
            if not _close_after_interrupt(controller, watcher, display, interrupted):
                return EXIT_TASK_NOT_SUCCEEDED
            ignore_interrupts()
        watcher.render(final=True)
        display.finish()
        return _report(state, run.snapshot, interrupted)


@contextlib.contextmanager
def submit_errors(state: AppState, controller: Controller, task_id: str | None) -> Iterator[None]:
    """提交（run / submit）时库的异常 → 一行中文与稳定错误码。"""
    try:
        yield
    except DuplicateTaskId as exc:
        raise _duplicate_id(state, controller, run_id=task_id, exc=exc) from exc
    except StoreError as exc:
        # 首次落库失败（没有写权限的角色、只读文件……）：任务体一行也没跑（issue 16.6）。
        raise CliError(f"提交被拒绝：{state.mask(str(exc))}", error="store_error") from exc
    except TaskError as exc:
        raise CliError(f"提交被拒绝：{state.mask(str(exc))}", error="submit_rejected") from exc


def _serve_metrics(state: AppState, controller: Controller, host: str, port: int) -> str:
    """instrument() 本进程的控制器，并在 host:port 上起 /metrics（守护线程），命令退出时关掉。

    在提交之前做：端口占用、没装 prometheus-client 这类问题要在任务开始跑之前说清楚（退出码 1）。
    """
    from chongming_task.metrics import instrument

    try:
        metrics = instrument(controller, registry=_new_registry())
    except TaskError as exc:
        raise CliError(f"--metrics-port：{exc}", error="configuration") from exc
    import prometheus_client

    try:
        server, thread = prometheus_client.start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as exc:
        metrics.close()
        raise CliError(
            f"--metrics-port {port}：无法在 {host}:{port} 上监听（{exc.strerror or exc}）；请换一个端口",
            error="configuration",
        ) from None

    def shutdown() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        metrics.close()

    state.on_close(shutdown)
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/metrics"


def _new_registry() -> Any:
    """每条 run 命令一个自己的 registry：不混进 prometheus-client 全局 REGISTRY 里的进程指标。"""
    try:
        import prometheus_client
    except ImportError:
        return None  # instrument() 会报"请 pip install ..."
    return prometheus_client.CollectorRegistry()


def _duplicate_id(state: AppState, controller: Controller, *, run_id: str | None, exc: TaskError) -> CliError:
    """--task-id 撞上了已有的任务：按那个任务的真实状态说话。

    库的 DuplicateTaskId 说的是"停止过的任务想再跑"，可占着这个 id 的任务也可能已经成功、或者还在跑
    （issue 16.13）。这里读出它的状态，给出对它成立的那句话和该怎么办。
    """
    existing = None
    if run_id is not None and controller.store is not None:
        with contextlib.suppress(TaskError):
            existing = controller.store.get(run_id)
    if existing is None:
        return CliError(f"提交被拒绝：{state.mask(str(exc))}", error="duplicate_task_id")
    status = existing.status.value
    if existing.is_terminal:
        truth = f"提交被拒绝：task_id {run_id!r} 已存在，占着它的任务已经结束（{status}）"
        advice = (
            "task_id 不能重复使用：请换一个 --task-id，或先用 prune 清理终态记录；"
            f"history {run_id} 可看它的经过"
        )
    else:
        holder = _holder_of(existing)
        truth = f"提交被拒绝：task_id {run_id!r} 已存在，占着它的任务还没结束（{status}，持有者 {holder}）"
        advice = (
            f"它还在由别的进程执行：要看它就用 status {run_id}，要停它就用 stop {run_id}，"
            "想另跑一个请换 --task-id"
        )
    return CliError(
        f"{truth}：{advice}", error="duplicate_task_id", details={"task_id": run_id, "status": status}
    )


def _holder_of(snapshot: TaskSnapshot) -> str:
    return snapshot.lease_owner or snapshot.owner or "（未知）"


def _close_after_interrupt(
    controller: Controller, watcher: _Watcher, display: LiveDisplay, signame: str
) -> bool:
    """Ctrl-C / SIGTERM：controller.close() 停掉任务并追平存储。再来一次中断就不再等。

    整个函数体都在 try 里（包括第一行提示）：第二次中断可能紧跟着第一次到达。
    """
    try:
        wait = controller.graceful_stop + 2
        display.line(f"收到 {signame}：正在停止任务 {watcher.run.task_id}（最多等 {wait:g} 秒）…")
        controller.close(reason=f"命令行收到 {signame}", close_store=True)
    except (KeyboardInterrupt, SignalStop):
        # 第二下可能在上面那行提示之后、close() 置位"已关闭"之前到达：那样 close() 根本没开始，命令收尾
        # （AppState.close）会再调一次并等满整个窗口。这里以 0 秒窗口关一次：没开始的就现在开始（停任务、
        # 不等），已经在关的这次调用什么也不做。
        controller.close(reason=f"命令行再次收到 {signame}", timeout=0)
        display.finish()
        click.echo(
            f"再次中断：不再等待收尾。任务 {watcher.run.task_id} 可能停在 {watcher.run.status.value}，"
            "租约过期后可用 reconcile 把它如实标记",
            err=True,
        )
        return False
    return True


class _Watcher:
    """把 TaskRun 的状态迁移、日志和进度渲染到 LiveDisplay。只读快照，不碰状态机。"""

    def __init__(self, run: TaskRun, display: LiveDisplay, progress_interval: float) -> None:
        self.run = run
        self.display = display
        self.progress_interval = progress_interval
        self._seen_transitions = 0
        self._last_log: object = None
        self._printed_progress: Progress | None = None
        self._last_progress_line = 0.0

    def follow(self) -> None:
        while not self.run.done:
            self.render(final=False)
            self.run.done_event.wait(0.1)

    def render(self, *, final: bool) -> None:
        run = self.run
        snapshot = run.snapshot
        # 已落终态就按收尾渲染：最后一行进度要排在终态迁移之前，不能等到循环外的那次 render。
        final = final or snapshot.is_terminal
        prefix = f"[{time.strftime('%H:%M:%S')}] {run.task_id}"
        # 迁移与日志按发生时间合并：任务收尾时写的日志排在"→ succeeded"之前。
        lines: list[tuple[datetime, str]] = []
        transitions = run.transitions
        for record in transitions[self._seen_transitions :]:
            reason = f"（{record.reason}）" if record.reason else ""
            text = f"{record.from_status.value} → {record.to_status.value}{reason}"
            lines.append((record.at, f"[{fmt_time(record.at, date=False)[:8]}] {run.task_id} {text}"))
        self._seen_transitions = len(transitions)
        lines.extend(self._new_logs())
        progress_line = self._progress_line(snapshot, prefix, final)
        if progress_line is not None:
            # 进度没有自己的时间戳：按"现在"排；任务已落终态时排在终态迁移之前，读起来顺。
            at = datetime.now(UTC)
            if snapshot.finished_at is not None:
                at = min(at, snapshot.finished_at - timedelta(microseconds=1))
            lines.append((at, progress_line))
        for _, text in sorted(lines, key=lambda item: item[0]):
            self.display.line(text)

    def _progress_line(self, snapshot: TaskSnapshot, prefix: str, final: bool) -> str | None:
        """终端上就地刷新底部那一行（返回 None）；否则按节奏返回一行普通的进度文字。"""
        progress = snapshot.progress
        if self.display.tty:
            if not final:
                self.display.status(_status_line(snapshot, progress))
            return None
        now = time.monotonic()
        due = final or now - self._last_progress_line >= self.progress_interval
        if progress is None or progress == self._printed_progress or not due:
            return None
        self._printed_progress = progress
        self._last_progress_line = now
        message = f" {progress.message}" if progress.message else ""
        return f"{prefix} 进度 {progress.describe()}{message}"

    def _new_logs(self) -> list[tuple[datetime, str]]:
        logs = self.run.logs
        start = 0
        if self._last_log is not None:
            # 日志只保留最近 200 条：按对象身份找上次看到的位置；找不到（已被挤出）就全部算新的。
            for index in range(len(logs) - 1, -1, -1):
                if logs[index] is self._last_log:
                    start = index + 1
                    break
        if logs:
            self._last_log = logs[-1]
        result = []
        for entry in logs[start:]:
            level = "" if entry.level < logging.WARNING else f"{entry.level_name} "
            stamp = fmt_time(entry.at, date=False)[:8]
            result.append((entry.at, f"[{stamp}] {self.run.task_id} 日志 {level}{entry.message}"))
        return result


def _status_line(snapshot: TaskSnapshot, progress: Progress | None) -> str:
    elapsed = elapsed_text(snapshot, datetime.now(UTC))
    parts = [snapshot.task_id, snapshot.status.value, elapsed]
    if progress is not None:
        if progress.fraction is not None:
            parts.append(progress_bar(progress.fraction))
        parts.append(progress.describe())
        if progress.message:
            parts.append(progress.message)
    return "  ".join(parts)


def _report(state: AppState, snapshot: TaskSnapshot, interrupted: str | None) -> int:
    succeeded = snapshot.status is TaskStatus.SUCCEEDED
    if state.json:
        echo_json(snapshot.to_dict())
    elif succeeded:
        elapsed = elapsed_text(snapshot, snapshot.finished_at or snapshot.created_at)
        click.echo(
            f"任务 {snapshot.task_id} 成功（succeeded），用时 {elapsed}，"
            f"返回值：{fmt_value(snapshot.outcome)}"
        )
        if interrupted:
            click.echo(f"（收到 {interrupted} 后，任务按停止请求优雅收尾并正常返回，所以是 succeeded）")
    else:
        failure = snapshot.failure
        detail = f"：{failure.kind.value}，{failure.message}" if failure is not None else ""
        click.echo(f"任务 {snapshot.task_id} 没有成功，终态 {snapshot.status.value}{detail}")
    return EXIT_OK if succeeded else EXIT_TASK_NOT_SUCCEEDED
