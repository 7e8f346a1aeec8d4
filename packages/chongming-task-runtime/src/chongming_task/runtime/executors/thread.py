"""ThreadExecutor（默认）：每次尝试一条守护线程，不用线程池（用户指南 §7.1，设计文档 §6）。

为什么不用 ThreadPoolExecutor：它的工作线程会在解释器退出时被 join，一个不响应取消的任务会让
整个进程退不出去；池子也没法放弃一条卡住的线程。守护线程的代价是被放弃的线程会泄漏——所以
优雅窗口用尽时结果如实记为 lost。并发上限由调度层负责，这里不再叠一层池。

接力（不是线程池）：一条线程跑完任务体、在结算里把空出的额度交给下一个排队任务时（Controller 的
调度就发生在这一刻、这条线程上），下一个尝试不再新建线程，而是等结算返回后由这条线程接着跑。
这条线程本来就要退出、而且刚刚干净地跑完——被放弃的线程永远不会走到结算这一步，所以卡住的线程
不会被复用；没有常驻的空闲线程，也没有任何需要在退出时 join 的东西。省下的是每个任务一次
建线程加一次线程交接，这是高吞吐调度时最大的固定开销。
"""

from __future__ import annotations

import logging
import threading

from chongming_task.runtime.executors.base import (
    AttemptEvents,
    AttemptSpec,
    Executor,
    LocalAttempt,
    execute_body,
)

logger = logging.getLogger("chongming_task.runtime")

# 当前线程正在结算一次刚跑完的尝试时，这里是一个列表：此刻 launch() 的尝试放进来，结算返回后由本线程接着跑。
_relay = threading.local()


def _thread_name(attempt: LocalAttempt) -> str:
    return f"chongming-task[{attempt.spec.task_id}#{attempt.spec.attempt}]"


def _spawn(attempt: ThreadAttempt) -> None:
    threading.Thread(target=_worker, args=(attempt,), name=_thread_name(attempt), daemon=True).start()


def _worker(first: ThreadAttempt) -> None:
    pending = [first]
    while pending:
        attempt = pending.pop(0)
        threading.current_thread().name = _thread_name(attempt)
        try:
            pending.extend(attempt.run_and_collect())
        except BaseException:
            logger.exception("线程执行器的工作线程出错（任务 %s）", attempt.spec.task_id)
            for rest in pending:  # 本线程不再可信：剩下接力来的尝试各起一条新线程
                _spawn(rest)
            raise


class ThreadAttempt(LocalAttempt):
    def launch(self) -> None:
        relay: list[ThreadAttempt] | None = getattr(_relay, "pending", None)
        if relay is not None:
            relay.append(self)
            return
        _spawn(self)

    def run_and_collect(self) -> list[ThreadAttempt]:
        """跑本次尝试；返回在结算期间被 launch、需要本线程接着跑的尝试。"""
        spec = self.spec
        self.events.running(None)
        result = execute_body(spec.fn, self.context, spec.args, spec.kwargs, spec.retry)
        relayed: list[ThreadAttempt] = []
        _relay.pending = relayed
        try:
            self.events.finished(result)
        finally:
            _relay.pending = None
        return relayed


class ThreadExecutor(Executor):
    """每次尝试一条守护线程。适合阻塞式 I/O 与普通业务函数；``async def`` 任务在该线程里跑完。"""

    name = "thread"

    def prepare(self, spec: AttemptSpec, events: AttemptEvents) -> ThreadAttempt:
        return ThreadAttempt(spec, events)


__all__ = ["ThreadAttempt", "ThreadExecutor"]
