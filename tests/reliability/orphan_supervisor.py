"""被 SIGKILL 的监督进程（issue 22.3）：一个 Controller 用 ProcessExecutor 跑着几个永不结束的任务。

用法：python orphan_supervisor.py <start_method> <n_forever>

所有任务都进入 running、子进程 pid 都已知之后，打印一行 ``PIDS <json>``（子进程 pid 列表），然后睡着等死。
任务里有一个 ``gil_hog``：它一直握着 GIL，子进程的监听线程跑不起来，只有内核的 PR_SET_PDEATHSIG 能带走它。
"""

from __future__ import annotations

import json
import sys
import time

from process_tasks import forever, gil_hog

from chongming_task import Controller, ProcessExecutor, TaskStatus

if __name__ == "__main__":
    start_method, count = sys.argv[1], int(sys.argv[2])
    controller = Controller(executor=ProcessExecutor(start_method=start_method))
    controller.register("forever", forever)
    controller.register("gil_hog", gil_hog)
    runs = [controller.submit("forever") for _ in range(count)] + [controller.submit("gil_hog")]
    deadline = time.monotonic() + 60
    while not all(run.status is TaskStatus.RUNNING and run.snapshot.pid for run in runs):
        if time.monotonic() > deadline:
            print("TIMEOUT", [run.status.value for run in runs], flush=True)
            sys.exit(1)
        time.sleep(0.01)
    print("PIDS", json.dumps([run.snapshot.pid for run in runs]), flush=True)
    while True:
        time.sleep(1)
