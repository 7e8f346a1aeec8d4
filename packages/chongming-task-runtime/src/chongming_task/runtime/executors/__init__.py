"""执行器：InlineExecutor（调用线程）、ThreadExecutor（默认，每次尝试一条守护线程）、ProcessExecutor（子进程）。"""

from chongming_task.runtime.executors.base import Executor
from chongming_task.runtime.executors.inline import InlineExecutor
from chongming_task.runtime.executors.process import ProcessExecutor
from chongming_task.runtime.executors.thread import ThreadExecutor

__all__ = ["Executor", "InlineExecutor", "ProcessExecutor", "ThreadExecutor"]
