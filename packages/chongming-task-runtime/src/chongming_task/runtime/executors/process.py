"""ProcessExecutor：每次尝试一个子进程（用户指南 §7.4）。

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

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from chongming_task.clock import SYSTEM_CLOCK
from chongming_task.context import LOGGER_PREFIX, ContextEvents, LogEntry, TaskContext, emit_task_log
from chongming_task.errors import ConfigurationError
from chongming_task.models import Failure, FailureKind, Progress
from chongming_task.policies import RetryPolicy
from chongming_task.runtime.executors.base import (
    AttemptEvents,
    AttemptHandle,
    AttemptResult,
    AttemptSpec,
    Executor,
    ResultKind,
    execute_body,
)

_BEAT_INTERVAL = 0.2
"""子进程向父进程转发心跳的间隔（秒）。idle 超时的分辨率因此约为这个量级。"""

_EXIT_GRACE = 2.0
"""子进程交回结果之后，等它自己退出的真实秒数；还不退（例如留下了非守护线程）就强制结束。"""

runtime_logger = logging.getLogger("chongming_task.runtime")


@dataclass(frozen=True)
class _ChildPayload:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    task_id: str
    name: str
    attempt: int
    retry: RetryPolicy
    upstream: dict[str, Any]
    artifact_root: str | None
    artifact_hint: str | None = None


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
        return  # 父进程关了管道或本进程正在退出：监听到此为止


def _child_main(conn: multiprocessing.connection.Connection, payload: _ChildPayload) -> None:
    """子进程入口（模块级函数，spawn / forkserver 都能按名字找到它）。"""
    # 日志由父进程统一发出（带 task_id 等 extra）；子进程里不再重复打印到 stderr。
    logging.getLogger(LOGGER_PREFIX).disabled = True
    send_lock = threading.Lock()

    def send(message: tuple[Any, ...]) -> None:
        with send_lock:
            conn.send(message)

    ctx = TaskContext(
        payload.task_id,
        name=payload.name,
        attempt=payload.attempt,
        clock=SYSTEM_CLOCK,
        upstream=payload.upstream,
        artifact_root=payload.artifact_root,
        events=_ChildEvents(send),
        artifact_hint=payload.artifact_hint,
    )
    listener = threading.Thread(
        target=_child_listen, args=(conn, ctx, send), name="chongming-task-control", daemon=True
    )
    listener.start()
    send(("running", os.getpid()))
    result = execute_body(payload.fn, ctx, payload.args, payload.kwargs, payload.retry)
    try:
        send(("result", result))
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        # 失败记录里带了不可 pickle 的东西（极少见）：退回只含文本的版本。
        failure = Failure(FailureKind.EXCEPTION, f"子进程的结果无法回传：{exc}", retryable=False)
        send(("result", AttemptResult(ResultKind.RAISED, failure=failure)))


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


class ProcessAttempt(AttemptHandle):
    def __init__(self, executor: ProcessExecutor, spec: AttemptSpec, events: AttemptEvents) -> None:
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
        payload = _ChildPayload(
            fn=spec.fn,
            args=spec.args,
            kwargs=spec.kwargs,
            task_id=spec.task_id,
            name=spec.name,
            attempt=spec.attempt,
            retry=spec.retry,
            upstream=dict(spec.upstream),
            artifact_root=None if spec.artifact_root is None else str(spec.artifact_root),
            artifact_hint=spec.artifact_hint,
        )
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
                AttemptResult(ResultKind.RAISED, failure=Failure.from_exception(exc, retryable=True))
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
            result = AttemptResult(ResultKind.CRASHED, failure=failure, exit_code=exit_code)
        events.finished(result)

    def _pump(self, process: multiprocessing.process.BaseProcess) -> AttemptResult | None:
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
                    result: AttemptResult = message[1]
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


class ProcessExecutor(Executor):
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

    def check_submittable(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        extra: Mapping[str, Any],
    ) -> None:
        super().check_submittable(fn, args, kwargs, extra)
        qualname = getattr(fn, "__qualname__", "")
        if "<locals>" in qualname or "<lambda>" in qualname:
            raise ConfigurationError(
                f"ProcessExecutor 无法在子进程里找到任务函数 {qualname!r}："
                "lambda、闭包和函数体里定义的局部函数都不行。请把它写成模块级函数"
                "（用 @task 装饰的模块级函数没问题），并确保调用方脚本有 "
                '`if __name__ == "__main__":` 守卫'
            )
        checks: list[tuple[str, Any]] = [("任务函数", fn), ("位置参数", args), ("关键字参数", dict(kwargs))]
        checks.extend((f"{key}", value) for key, value in extra.items())
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

    def prepare(self, spec: AttemptSpec, events: AttemptEvents) -> ProcessAttempt:
        return ProcessAttempt(self, spec, events)

    def __repr__(self) -> str:
        return f"ProcessExecutor(start_method={self.start_method!r})"


__all__ = ["ProcessAttempt", "ProcessExecutor"]
