"""ThreadExecutor（默认）：每次尝试一条守护线程，不用线程池（用户指南 §7.1、§7.3）。

为什么不用 ThreadPoolExecutor：它的工作线程会在解释器退出时被 join，一个不响应取消的任务会让
整个进程退不出去；池子也没法放弃一条卡住的线程。守护线程的代价是被放弃的线程会泄漏——所以
优雅窗口用尽时结果如实记为 lost。并发上限由调度层负责，这里不再叠一层池。
"""

from __future__ import annotations

import threading

from chongming_task.runtime.executors.base import AttemptEvents, AttemptSpec, Executor, LocalAttempt


class ThreadAttempt(LocalAttempt):
    def launch(self) -> None:
        spec = self.spec
        thread = threading.Thread(
            target=self.run_here, name=f"chongming-task[{spec.task_id}#{spec.attempt}]", daemon=True
        )
        thread.start()


class ThreadExecutor(Executor):
    """每次尝试一条守护线程。适合阻塞式 I/O 与普通业务函数；``async def`` 任务在该线程里跑完。"""

    name = "thread"

    def prepare(self, spec: AttemptSpec, events: AttemptEvents) -> ThreadAttempt:
        return ThreadAttempt(spec, events)


__all__ = ["ThreadAttempt", "ThreadExecutor"]
