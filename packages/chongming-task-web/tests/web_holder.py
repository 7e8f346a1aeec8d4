"""浏览器测试里的"持有者"进程：在共享的 SQLite 存储上真的跑几个任务，轮询并执行控制台写下的指令。

用法：python web_holder.py DB。提交完打印 "ready"，之后一直跑到所有任务落终态或收到 SIGTERM。
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from typing import Any

from chongming_task import task
from chongming_task.controller import Controller
from chongming_task.stores.sqlite import SqliteTaskStore


@task(name="live.counter")
def live_counter(ctx: Any, steps: int = 100_000) -> int:
    """每 0.2 秒进一步，持续报告进度、写一行日志；随时可暂停 / 停止（checkpoint）。"""
    for step in range(1, steps + 1):
        ctx.checkpoint()
        ctx.progress(step, total=steps, unit="步", message=f"第 {step} 步")
        ctx.log(f'第 {step} 步完成 <ok> "引号"')  # 持久化日志：任务页的实时尾巴
        time.sleep(0.2)
    return steps


@task(name="bulk.spin")
def bulk_spin(ctx: Any) -> None:
    while True:
        ctx.checkpoint()
        time.sleep(0.05)


def main() -> None:
    store = SqliteTaskStore(sys.argv[1])
    controller = Controller(
        store=store, owner="holder-1", side_channel_interval=0.2, command_poll_interval=0.1
    )
    controller.register_all(live_counter, bulk_spin)
    controller.submit("live.counter", task_id="live-1", label="实时计数")
    controller.submit("live.counter", task_id="live-2", label="一直在跑（总览里节点在线）")
    for i in range(3):
        controller.submit("bulk.spin", task_id=f"bulk-{i}", label=f"批量 {i}")
    signal.signal(signal.SIGTERM, lambda *_: controller.close(reason="持有者退出", timeout=5))
    print("ready", flush=True)
    with contextlib.suppress(TimeoutError):
        controller.wait_all(timeout=120)
    controller.close(reason="持有者退出", timeout=5)
    store.close()


if __name__ == "__main__":
    main()
