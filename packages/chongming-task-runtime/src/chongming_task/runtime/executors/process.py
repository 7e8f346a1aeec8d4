"""ProcessExecutor：每次尝试一个子进程（用户指南 §7.3）。

它换来三件线程给不了的事：优雅窗口用尽后 terminate() → kill() 真的停掉；CPU 密集真并行；
原生扩展段错误只带走子进程，监督进程毫发无损，任务如实记一次失败。

* 启动方式只用 spawn 或 forkserver（Linux 上默认 forkserver）：从多线程的父进程直接 fork，会把
  别的线程持有中的锁原样复制进子进程，子进程可能在第一次 logging 时就死锁。
* 提交时检查任务函数、参数、上游数据与重试策略都能 pickle，不能就抛 ConfigurationError 说明怎么改。
* 控制走一条双工 Pipe：父 → 子（stop / pause / resume / cancel_pause），子 → 父（running / progress /
  log / parked / unparked / beat / result）。子进程里一条监听线程阻塞在 pipe 上，收到指令立刻拨动
  上下文的标志，所以停止/暂停的延迟就是一次 pipe 往返加上任务两次 checkpoint() 之间的间隔。
* 心跳不逐次过 pipe：子进程监听线程每 ``_BEAT_INTERVAL`` 秒把最近一次心跳发回来一次。
* 子进程不用注入的 clock（FakeClock 无法跨进程），一律用系统时钟；父进程把转发来的心跳换算到
  TaskRun 的时钟上。
* 结果先等子进程真正退出（并回收）再结算，所以落终态时 ``snapshot.pid`` 对应的进程已经不在了。
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from chongming_task.clock import SYSTEM_CLOCK
from chongming_task.context import (
    LOGGER_PREFIX,
    MAX_LOGS,
    ContextEvents,
    LogEntry,
    TaskContext,
    emit_task_log,
)
from chongming_task.errors import ConfigurationError
from chongming_task.models import Failure, FailureKind, Progress
from chongming_task.runtime.executors import base

_BEAT_INTERVAL = 0.2
"""子进程向父进程转发心跳的间隔（秒）。idle 超时的分辨率因此约为这个量级。"""

MIN_IDLE_TIMEOUT = 5 * _BEAT_INTERVAL
"""ProcessExecutor 接受的最短 idle 超时（秒）。父进程看到的心跳最多晚一个转发周期，再加管道与调度的
抖动；idle 短于几个周期，一个每 10 ms 就 checkpoint 的健康任务也会被判 idle 超时（issue 22.10）。
所以提交时拒绝，而不是让它跑起来再失败。"""

ORPHAN_EXIT_BOUND = 2.0
"""监督进程死后，它的子进程（以及 forkserver）最迟多少秒内退出（用户指南 §7.3）。实测在几十毫秒内；
留出余量给满载机器上的调度延迟。"""

_ORPHANED_EXIT_CODE = 70
"""子进程发现监督进程已经不在时的退出码（没人会读到它，只为在 ps / 审计日志里可辨认）。"""

_PR_SET_PDEATHSIG = 1

_EXIT_GRACE = 2.0
"""子进程交回结果之后，等它自己退出的真实秒数；还不退（例如留下了非守护线程）就强制结束。"""

runtime_logger = logging.getLogger("chongming_task.runtime")


# -- the child side ---------------------------------------------------------------------------------


class _ChildEvents(ContextEvents):
    def __init__(self, send: Callable[[tuple[Any, ...]], None]) -> None:
        self._send = send

    def progress(self, progress: Progress) -> None:
        self._send(("progress", progress.to_dict()))

    def log(self, entry: LogEntry) -> None:
        self._send(("log", entry))

    def parked(self) -> None:
        self._send(("parked",))

    def unparked(self) -> None:
        self._send(("unparked",))


def _child_listen(
    conn: multiprocessing.connection.Connection, ctx: TaskContext, send: Callable[[tuple[Any, ...]], None]
) -> None:
    last_sent: float | None = None
    try:
        while True:
            if conn.poll(_BEAT_INTERVAL):
                message = conn.recv()
                tag = message[0]
                if tag == "stop":
                    ctx._request_stop(message[1])
                elif tag == "pause":
                    ctx._request_pause()
                elif tag in ("resume", "cancel_pause"):
                    ctx._request_resume()
            beat = ctx._beat
            if beat != last_sent:
                send(("beat", beat))
                last_sent = beat
    except (EOFError, OSError):
        # 管道另一端只在子进程退出之后才由父进程关闭；子进程还活着却读到 EOF，说明监督进程已经没了
        # （被 SIGKILL 时内核替它关掉了管道）。没人再听结果、存储可能已把任务记成 lost：立刻退出，
        # 不许继续跑、继续写（issue 22.3）。
        os._exit(_ORPHANED_EXIT_CODE)


def _die_with_parent() -> None:
    """Linux：父进程一死，内核就给本进程发 SIGKILL（``prctl(PR_SET_PDEATHSIG, SIGKILL)``）。

    这是第二道保险：控制管道的 EOF 要靠子进程里的监听线程拿到 GIL 才看得见，一直握着 GIL 的 C 循环
    会让它永远看不见；内核信号不需要子进程配合。"父进程"是 forkserver（它在监督进程死后读到自己
    控制管道的 EOF 就退出），或 spawn 时派生子进程的那条线程——PDEATHSIG 跟的是线程，所以派生发生在
    ``ProcessAttempt._monitor`` 里，那条线程一直活到子进程被回收为止。其他平台只靠管道 EOF。
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # 没有 libc / prctl（极少见的精简环境）：退回只靠管道 EOF
        return
    _release_forkserver_alive_fd()


def _release_forkserver_alive_fd() -> None:
    """forkserver 派生的子进程：关掉继承来的那份"监督进程还活着"管道写端。

    forkserver 在这条管道的所有写端都关闭时退出（监督进程持有一份，它派生的每个子进程也各继承一份，
    留着给子进程自己再经同一个 forkserver 派生孙进程用）。只要还有子进程握着写端，监督进程死了
    forkserver 也不退出，上面的 PDEATHSIG 就永远不会触发——实测每次都留下握着 GIL 的子进程。子进程
    若自己要用 forkserver，``ensure_running`` 本来就会另起一个（子进程里 ``_forkserver_pid`` 是 None），
    所以关掉它不影响任何功能。这里碰的是 CPython 的私有属性：属性不在（别的实现/版本）就什么也不做。
    """
    try:
        from multiprocessing import forkserver

        server: Any = forkserver._forkserver
        fd = server._forkserver_alive_fd
        if fd is None or server._forkserver_pid is not None:
            return  # 不是 forkserver 派生的（spawn），或本进程自己启动了 forkserver
        server._forkserver_alive_fd = None
        os.close(fd)
    except (AttributeError, ImportError, OSError):
        return


def _child_main(conn: multiprocessing.connection.Connection, payload: base.AttemptSpec) -> None:
    """子进程入口（模块级函数，spawn / forkserver 都能按名字找到它）。"""
    _die_with_parent()
    # 日志由父进程统一发出（带 task_id 等 extra）；子进程里不再重复打印到 stderr。
    logging.getLogger(LOGGER_PREFIX).disabled = True
    send_lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        with send_lock:
            conn.send(message)

    ctx = base.build_context(payload, _ChildEvents(send))
    listener = threading.Thread(
        target=_child_listen, args=(conn, ctx, send), name="chongming-task-control", daemon=True
    )
    listener.start()
    send(("running", os.getpid()))
    result = base.execute_body(payload.fn, ctx, payload.args, payload.kwargs, payload.retry)
    try:
        send(("result", result))
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        # 失败记录里带了不可 pickle 的东西（极少见）：退回只含文本的版本。
        failure = Failure(FailureKind.EXCEPTION, f"子进程的结果无法回传：{exc}", retryable=False)
        send(("result", base.AttemptResult(base.ResultKind.RAISED, failure=failure)))


# -- the parent side --------------------------------------------------------------------------------


def _describe_exit(exit_code: int | None, pid: int | None) -> Failure:
    if exit_code is not None and exit_code < 0:
        signum = -exit_code
        try:
            signame = signal.Signals(signum).name
        except ValueError:
            signame = f"信号 {signum}"
        return Failure(
            FailureKind.EXCEPTION,
            f"子进程（pid {pid}）被 {signame}（{signum}）终止，没有交回结果（原生崩溃或被杀）；"
            "监督进程不受影响",
            retryable=True,
            exc_type=signame,
        )
    if exit_code:
        return Failure(
            FailureKind.NONZERO_EXIT,
            f"子进程（pid {pid}）以退出码 {exit_code} 结束，没有交回结果"
            "（常见原因：子进程里 import 任务模块失败、任务调用了 sys.exit / os._exit，详见 stderr）",
            retryable=True,
        )
    return Failure(
        FailureKind.EXCEPTION,
        f"子进程（pid {pid}）退出码为 0，却没有交回结果（任务是否调用了 os._exit(0)？）",
        retryable=True,
    )


class ProcessAttempt(base.AttemptHandle):
    def __init__(self, executor: ProcessExecutor, spec: base.AttemptSpec, events: base.AttemptEvents) -> None:
        self._executor = executor
        self._spec = spec
        self._events = events
        self._conn, self._child_conn = executor.mp_context.Pipe(duplex=True)
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._process: multiprocessing.process.BaseProcess | None = None
        self._parked = False
        self._killed = False
        self._closed = False
        self._beat = spec.clock.monotonic()

    # control (parent → child) ----------------------------------------------------------------------

    def _send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            if self._closed:
                return
            # 子进程已经退出时指令没有接收者了，结果由监视线程结算。
            with contextlib.suppress(OSError, EOFError, ValueError):
                self._conn.send(message)

    def request_stop(self, reason: str | None) -> None:
        self._send(("stop", reason))

    def request_pause(self) -> None:
        self._send(("pause",))

    def request_resume(self) -> None:
        self._send(("resume",))

    def confirm_or_cancel_pause(self) -> bool:
        with self._state_lock:
            if self._parked:
                return True
            self._send(("cancel_pause",))
            return False

    def last_beat(self) -> float:
        return self._beat

    def force_stop(self) -> bool:
        with self._state_lock:
            self._killed = True
            process = self._process
        if process is not None and process.is_alive():
            process.terminate()
            killer = threading.Timer(self._executor.kill_after, self._kill)
            killer.daemon = True
            killer.start()
        return True

    def _kill(self) -> None:
        process = self._process
        if process is not None and process.is_alive():
            process.kill()

    # lifecycle --------------------------------------------------------------------------------------

    def launch(self) -> None:
        spec = self._spec
        monitor = threading.Thread(
            target=self._monitor, name=f"chongming-task-process[{spec.task_id}#{spec.attempt}]", daemon=True
        )
        monitor.start()

    def _monitor(self) -> None:
        spec = self._spec
        events = self._events
        # 子进程拿到的就是这份 AttemptSpec（pickle 过去），只换掉不能或不该跨进程的三样：时钟用子进程的
        # 真实时钟（注入的测试时钟不跨进程）、upstream 可能是只读映射代理（不能 pickle）、日志缓冲在子进程
        # 里另起一份（父进程经事件收日志，子进程的 ctx.logs 只看本次尝试）。
        payload = replace(spec, clock=SYSTEM_CLOCK, upstream=dict(spec.upstream), logs=deque(maxlen=MAX_LOGS))
        process = self._executor.mp_context.Process(
            target=_child_main,
            args=(self._child_conn, payload),
            name=f"chongming-task[{spec.task_id}#{spec.attempt}]",
            daemon=True,
        )
        try:
            process.start()
        except Exception as exc:
            self._close()
            events.finished(
                base.AttemptResult(
                    base.ResultKind.RAISED, failure=Failure.from_exception(exc, retryable=True)
                )
            )
            return
        self._child_conn.close()  # 父进程这一端的副本：关掉它，子进程一退出 recv 就能读到 EOF
        with self._state_lock:
            self._process = process
            self.pid = process.pid
            killed = self._killed
        if killed:
            process.terminate()
        result = self._pump(process)
        process.join(_EXIT_GRACE)
        if process.is_alive():
            process.kill()
            process.join()
        exit_code = process.exitcode
        self._close()
        if result is None:
            failure = _describe_exit(exit_code, process.pid)
            result = base.AttemptResult(base.ResultKind.CRASHED, failure=failure, exit_code=exit_code)
        events.finished(result)

    def _pump(self, process: multiprocessing.process.BaseProcess) -> base.AttemptResult | None:
        """读子进程的报告直到拿到结果或管道断开。"""
        spec = self._spec
        events = self._events
        clock = spec.clock
        try:
            while True:
                message = self._conn.recv()
                tag = message[0]
                if tag == "beat":
                    # 子进程的心跳是它的系统单调时钟读数：换算成"多久以前"，再落到 TaskRun 的时钟上。
                    age = max(0.0, time.monotonic() - float(message[1]))
                    self._beat = clock.monotonic() - age
                elif tag == "progress":
                    events.progress(Progress.from_dict(message[1]))
                elif tag == "log":
                    entry: LogEntry = message[1]
                    spec.logs.append(entry)
                    emit_task_log(
                        f"{LOGGER_PREFIX}.{spec.task_id}",
                        entry.level,
                        entry.message,
                        spec.task_id,
                        spec.name,
                        spec.attempt,
                    )
                    events.log(entry)
                elif tag == "parked":
                    with self._state_lock:
                        self._parked = True
                    events.parked()
                elif tag == "unparked":
                    with self._state_lock:
                        self._parked = False
                    events.unparked()
                elif tag == "running":
                    events.running(int(message[1]))
                elif tag == "result":
                    result: base.AttemptResult = message[1]
                    return result
        except (EOFError, OSError):
            return None
        except Exception:  # 收到了无法解码的东西：记下来，按"没有结果"结算
            runtime_logger.exception("读取子进程 %s 的报告时出错", process.pid)
            return None

    def _close(self) -> None:
        with self._send_lock:
            self._closed = True
            self._conn.close()


def _is_main_guard(test: ast.expr) -> bool:
    """``__name__ == "__main__"``（两边顺序都算）。"""
    if not isinstance(test, ast.Compare) or len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    has_name = any(isinstance(side, ast.Name) and side.id == "__name__" for side in sides)
    has_main = any(isinstance(side, ast.Constant) and side.value == "__main__" for side in sides)
    return has_name and has_main


def _bound_names(target: ast.expr) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_bound_names(item) for item in target.elts))
    if isinstance(target, ast.Starred):
        return _bound_names(target.value)
    return set()


def _module_level_names(body: list[ast.stmt], *, guarded: bool, found: dict[bool, set[str]]) -> None:
    """把模块顶层（含顶层 if / try / with / for 里）绑定的名字按"在不在 main 守卫之下"分两组收进 found。"""
    for stmt in body:
        names: set[str] = set()
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                names |= _bound_names(target)
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
            names |= _bound_names(stmt.target)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(stmt, ast.If):
            _module_level_names(stmt.body, guarded=guarded or _is_main_guard(stmt.test), found=found)
            _module_level_names(stmt.orelse, guarded=guarded, found=found)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody, *(h.body for h in stmt.handlers)):
                _module_level_names(block, guarded=guarded, found=found)
        elif isinstance(stmt, (ast.With, ast.For, ast.While)):
            _module_level_names(stmt.body, guarded=guarded, found=found)
            _module_level_names(getattr(stmt, "orelse", []), guarded=guarded, found=found)
        found[guarded] |= names


def _main_module_problem(fn: Callable[..., Any], qualname: str) -> str | None:
    """任务函数定义在主模块里、子进程却找不到它时，返回说明怎么改的一行；找得到（或判断不了）返回 None。

    spawn / forkserver 的子进程按文件路径重新 import 主模块（名字是 ``__mp_main__``），不执行
    ``if __name__ == "__main__":`` 块；pickle 按名字找函数，于是定义在守卫里的函数在子进程里不存在，
    子进程 unpickle 时抛 AttributeError、以退出码 1 结束。提交时读主模块源码、按 AST 判断：只有
    **确定**名字只在守卫里绑定时才拒绝，判断不了（动态生成、``import *``、源码读不到）就放行，不误伤。
    """
    if getattr(fn, "__module__", None) != "__main__":
        return None
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path:
        return (
            f"ProcessExecutor 无法在子进程里找到任务函数 {qualname!r}：它定义在没有源文件的主模块里"
            "（交互式解释器、python -c、notebook），子进程无法重新 import。请把任务函数写进一个 .py 模块"
            "再 import 进来，或改用 ThreadExecutor"
        )
    try:
        tree = ast.parse(Path(path).read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    found: dict[bool, set[str]] = {False: set(), True: set()}
    _module_level_names(tree.body, guarded=False, found=found)
    top = qualname.split(".")[0]
    if top in found[False] or top not in found[True]:
        return None
    return (
        f"ProcessExecutor 无法在子进程里找到任务函数 {qualname!r}：它定义在 "
        f'{Path(path).name} 的 `if __name__ == "__main__":` 块里，子进程重新 import 主模块时不执行这一块。'
        "请把函数定义移到守卫之外的模块顶层（或单独的模块里），守卫里只留提交任务的代码"
    )


class ProcessExecutor(base.Executor):
    """每次尝试一个子进程：停得住、真并行、崩溃隔离。代价是参数/返回值必须可 pickle，任务函数必须在
    可导入的模块里（调用方脚本要有 ``if __name__ == "__main__":`` 守卫）。"""

    name = "process"

    def __init__(self, *, start_method: str | None = None, kill_after: float = 1.0) -> None:
        available = multiprocessing.get_all_start_methods()
        if start_method is None:
            start_method = "forkserver" if "forkserver" in available else "spawn"
        if start_method == "fork":
            raise ConfigurationError(
                "ProcessExecutor 不使用 fork：从多线程的监督进程 fork 会把别的线程持有中的锁复制进子进程，"
                "子进程可能直接死锁。请用 start_method='spawn' 或 'forkserver'"
            )
        if start_method not in available:
            raise ConfigurationError(f"本平台不支持启动方式 {start_method!r}；可选：{', '.join(available)}")
        if isinstance(kill_after, bool) or not isinstance(kill_after, (int, float)) or kill_after < 0:
            raise ConfigurationError(f"kill_after 必须是非负的秒数，收到 {kill_after!r}")
        self.start_method = start_method
        self.kill_after = float(kill_after)
        self.mp_context: Any = multiprocessing.get_context(start_method)

    def check_submittable(self, job: base.Submission) -> None:
        super().check_submittable(job)
        fn, args, kwargs, extra = job
        qualname = getattr(fn, "__qualname__", "")
        if "<locals>" in qualname or "<lambda>" in qualname:
            raise ConfigurationError(
                f"ProcessExecutor 无法在子进程里找到任务函数 {qualname!r}："
                "lambda、闭包和函数体里定义的局部函数都不行。请把它写成模块级函数"
                "（用 @task 装饰的模块级函数没问题），并确保调用方脚本有 "
                '`if __name__ == "__main__":` 守卫'
            )
        problem = _main_module_problem(fn, qualname)
        if problem is not None:
            raise ConfigurationError(problem)
        checks: list[tuple[str, Any]] = [("任务函数", fn), ("位置参数", args), ("关键字参数", dict(kwargs))]
        timeout = extra.get("timeout")
        idle = getattr(timeout, "idle", None)
        if idle is not None and idle < MIN_IDLE_TIMEOUT:
            raise ConfigurationError(
                f"ProcessExecutor 的 idle 超时至少 {MIN_IDLE_TIMEOUT:g} 秒，收到 {idle:g} 秒：子进程每 "
                f"{_BEAT_INTERVAL:g} 秒才把心跳转发给监督进程一次，更短的 idle 会把健康的任务判成超时。"
                f"请设 Timeout(idle={MIN_IDLE_TIMEOUT:g}) 或更长，或改用 ThreadExecutor"
            )
        # 超时策略只在父进程里用（看门狗），不送进子进程，不必可 pickle。
        checks.extend((f"{key}", value) for key, value in extra.items() if key != "timeout")
        for what, value in checks:
            try:
                pickle.dumps(value)
            except Exception as exc:
                raise ConfigurationError(
                    f"ProcessExecutor 要求{what}可 pickle（要送进子进程），但序列化失败：{exc}。"
                    "请把任务写成可导入模块里的模块级函数，参数换成可 pickle 的值（不要传 lambda、闭包、"
                    '连接或锁），并确保调用方脚本有 `if __name__ == "__main__":` 守卫；'
                    "不需要进程隔离时改用 ThreadExecutor"
                ) from None

    def prepare(self, spec: base.AttemptSpec, events: base.AttemptEvents) -> ProcessAttempt:
        return ProcessAttempt(self, spec, events)

    def __repr__(self) -> str:
        return f"ProcessExecutor(start_method={self.start_method!r})"


__all__ = ["MIN_IDLE_TIMEOUT", "ORPHAN_EXIT_BOUND", "ProcessAttempt", "ProcessExecutor"]
