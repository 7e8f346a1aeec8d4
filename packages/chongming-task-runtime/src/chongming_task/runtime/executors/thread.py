"""ThreadExecutor（默认）：每次尝试跑在一条守护线程上，不用线程池（用户指南 §7.1，设计文档 §6）。

为什么不用 ThreadPoolExecutor：它的工作线程会在解释器退出时被 join，一个不响应取消的任务会让
整个进程退不出去；池子也没法放弃一条卡住的线程。守护线程的代价是被放弃的线程会泄漏——所以
优雅窗口用尽时结果如实记为 lost。并发上限由调度层负责，这里不再叠一层池。

建一条线程（加上 ``Thread.start`` 等新线程报到的那次交接）是高吞吐调度时最大的固定开销，所以
干净跑完的线程会被复用，分两种：

* **接力**：一条线程跑完任务体、在结算里把空出的额度交给下一个排队任务时（Controller 的调度就发生
  在这一刻、这条线程上），下一个尝试不经任何交接，等结算返回后由这条线程接着跑；一次结算只接力一个，
  同时放出的其余尝试各自交给别的线程（否则它们排在这条线程上串行跑）；
* **空闲等待**：没有接力的活时，线程在空闲栈里最多等 ``IDLE_WORKER_TIMEOUT`` 秒，期间 ``launch()``
  直接把尝试交给它（一次锁释放），不再新建线程；等不到就退出。空闲的最多 ``MAX_IDLE_WORKERS`` 条。

只有干净结算的线程才会被复用：优雅窗口用尽、任务被判 lost 时 TaskRun 会调 ``force_stop()``，线程
尝试由此被标成"已放弃"，它的任务体哪天真的返回了，这条线程也直接退出，永不进空闲栈、永不接力。
所有线程都是守护线程（空闲等待的也是），解释器随时能退出；每次尝试在一个全新的 contextvars 上下文
里运行，上一个任务设下的上下文变量不会漏给下一个。
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading

from chongming_task.runtime.executors.base import (
    AttemptEvents,
    AttemptSpec,
    Executor,
    LocalAttempt,
    execute_body,
)

logger = logging.getLogger("chongming_task.runtime")

IDLE_WORKER_TIMEOUT = 2.0
"""干净跑完的工作线程等下一个尝试的最长时间（秒），之后退出。"""

MAX_IDLE_WORKERS = 32
"""同时空闲等待的工作线程上限；更多的直接退出。"""

IDLE_THREAD_NAME = "chongming-task[idle]"

# 当前线程正在结算一次刚跑完的尝试时，这里是一个列表：此刻 launch() 的尝试放进来，结算返回后由本线程接着跑。
_relay = threading.local()


class _Parked:
    """空闲栈里的一条工作线程：``wake`` 是一把被占着的锁，交接者放进尝试后释放它把线程叫醒。"""

    __slots__ = ("attempt", "wake")

    def __init__(self) -> None:
        self.attempt: ThreadAttempt | None = None
        self.wake = threading.Lock()
        self.wake.acquire()


_idle: list[_Parked] = []
_idle_lock = threading.Lock()


def _reset_after_fork() -> None:
    # fork 出的子进程里没有这些线程；锁可能在 fork 那一刻正被别的线程拿着。
    global _idle_lock
    _idle.clear()
    _idle_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def _thread_name(attempt: LocalAttempt) -> str:
    return f"chongming-task[{attempt.spec.task_id}#{attempt.spec.attempt}]"


def _spawn(attempt: ThreadAttempt) -> None:
    # 交给线程的是一个列表而不是尝试本身：Thread 在 run() 返回之前一直持有 args，线程空闲等待时
    # 它也不能再引用跑完的尝试（见 _worker 里 del attempt 的说明）；列表由 _worker 清空。
    threading.Thread(target=_worker, args=([attempt],), name=_thread_name(attempt), daemon=True).start()


def _hand_off(attempt: ThreadAttempt) -> None:
    """有空闲的工作线程就交给它（后进先出：最近干完活的先用，多余的自然等到超时退出），否则新建。"""
    with _idle_lock:
        parked = _idle.pop() if _idle else None
    if parked is None:
        _spawn(attempt)
        return
    parked.attempt = attempt
    parked.wake.release()


def _wait_for_work(parked: _Parked, pending: list[ThreadAttempt]) -> bool:
    """进空闲栈等下一个尝试，等到就放进 ``pending``；超时（或栈已满）返回 False，线程随后退出。

    放进调用方的列表而不是返回它：调用方不必再用一个局部变量接住它，那个变量会在下一次空闲等待时
    还引用着这次的尝试（见 _worker）。"""
    with _idle_lock:
        if len(_idle) >= MAX_IDLE_WORKERS:
            return False
        _idle.append(parked)
    threading.current_thread().name = IDLE_THREAD_NAME
    if not parked.wake.acquire(timeout=IDLE_WORKER_TIMEOUT):
        with _idle_lock:
            if parked in _idle:  # 没人来取：从栈里撤下，退出
                _idle.remove(parked)
                return False
        parked.wake.acquire()  # 超时的同一刻被取走了：交接者马上会放进尝试并释放
    attempt, parked.attempt = parked.attempt, None
    if attempt is None:  # 交接者总是先放进尝试再释放锁；没有尝试就按"没等到"处理（线程退出）
        return False
    pending.append(attempt)
    return True


def _worker(pending: list[ThreadAttempt]) -> None:
    parked: _Parked | None = None
    me = threading.current_thread()  # 每个尝试都要改线程名：不为它每次再查一遍当前线程
    while True:
        while pending:
            attempt = pending.pop(0)
            spec = attempt.spec
            me.name = f"chongming-task[{spec.task_id}#{spec.attempt}]"  # 同 _thread_name，就地拼
            try:
                pending.extend(contextvars.Context().run(attempt.run_and_collect))
            except BaseException:
                logger.exception("线程执行器的工作线程出错（任务 %s）", attempt.spec.task_id)
                for rest in pending:  # 本线程不再可信：剩下接力来的尝试各起一条新线程
                    _spawn(rest)
                raise
            if attempt.abandoned:  # 这条线程的任务被放弃过：不再接任何活（接力来的另起线程）
                for rest in pending:
                    _spawn(rest)
                return
        # 空闲等待之前放下最后一次尝试（这里的局部变量、线程的 args 都不再引用它；见 _spawn）：否则这条
        # 线程最多 IDLE_WORKER_TIMEOUT 秒里一直引用着它——经它的事件回调引用着 TaskRun，再经控制器的钩子
        # 引用着整个控制器与它在管的全部任务（连同任务的参数与返回值）。控制器早已关闭、没人再引用它时，这
        # 一大片对象本该马上释放，却要等这条线程接到下一个活才变成垃圾，那时它们已进了最老的一代，由之后
        # 某一次全量回收整片扫掉：那次回收的停顿（五万个任务约半秒）落在不相干的下一批任务头上（issue 17）。
        del attempt, spec
        if parked is None:
            parked = _Parked()
        if not _wait_for_work(parked, pending):
            return


class ThreadAttempt(LocalAttempt):
    abandoned = False
    """优雅窗口用尽、TaskRun 放弃了这次尝试（``force_stop``）：它的线程永不复用。"""

    def launch(self) -> None:
        relay: list[ThreadAttempt] | None = getattr(_relay, "pending", None)
        # 只接力一个：一次结算里放出的第二个、第三个尝试若也接力到这条线程，它们要等前一个跑完才开始——
        # 调度层已经给了它们各自的额度，却挤在一条线程上串行跑（限流标签一次放出两个、管道一次放行几个
        # 下游时都会这样）。多出来的照常交给空闲线程或新建线程。
        if relay is not None and not relay:
            relay.append(self)
            return
        _hand_off(self)

    def force_stop(self) -> bool:
        # 线程无法被强制终止：只能放弃它（TaskRun 如实记 lost），并记下来让这条线程永不被复用。
        self.abandoned = True
        return False

    def run_and_collect(self) -> list[ThreadAttempt]:
        """跑本次尝试；返回在结算期间被 launch、需要本线程接着跑的尝试。"""
        relayed: list[ThreadAttempt] = []
        self.events.running(None)
        spec = self.spec
        result = execute_body(spec.fn, self._ctx, spec.args, spec.kwargs, spec.retry)
        _relay.pending = relayed
        try:
            self.events.finished(result)
        finally:
            _relay.pending = None
        return relayed


class ThreadExecutor(Executor):
    """每次尝试一条守护线程（干净跑完的线程可复用）。适合阻塞式 I/O 与普通业务函数；``async def``
    任务在该线程里跑完。"""

    name = "thread"

    def prepare(self, spec: AttemptSpec, events: AttemptEvents) -> ThreadAttempt:
        return ThreadAttempt(spec, events)


__all__ = ["IDLE_WORKER_TIMEOUT", "MAX_IDLE_WORKERS", "ThreadAttempt", "ThreadExecutor"]
