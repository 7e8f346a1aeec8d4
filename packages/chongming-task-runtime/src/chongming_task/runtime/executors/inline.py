"""InlineExecutor：在调用线程里同步跑完（用户指南 §7.2）。

零调度开销，适合微秒级的纯计算步骤与确定性测试。它刻意违反"launch 不得阻塞"的约定——这就是它
存在的意义——因此异步调度器不得使用它。它也无法被暂停：``pause()`` 如实返回 False。
停止仍然有效（任务体调用 ``checkpoint()`` 即可），超时到期同样会请求停止。
"""

from __future__ import annotations

from chongming_task.runtime.executors.base import AttemptEvents, AttemptSpec, Executor, LocalAttempt


class InlineAttempt(LocalAttempt):
    def launch(self) -> None:
        self.run_here()


class InlineExecutor(Executor):
    name = "inline"
    blocking = True
    supports_pause = False

    def prepare(self, spec: AttemptSpec, events: AttemptEvents) -> InlineAttempt:
        return InlineAttempt(spec, events)


__all__ = ["InlineAttempt", "InlineExecutor"]
