"""07 并发额度、具名资源、优先级与分桶。

演示并断言：
* max_parallel：超出的任务排队（queued），排队中的任务 ELAPSED 显示 "-"；
* 暂停不释放执行槽：暂停一个任务，排队的任务仍然起不来；
* ConcurrencyPolicy.limits：按标签记账的资源名额（{"db": 1}），没写进 limits 的标签不限流；
* priority：数值大者先走，同优先级先进先出——只在本进程的就绪队列里比较；
* max_parallel_per_bucket：一个桶积压不会饿死其他桶（调度是"扫描"而不是"取队首"）；
* bucket_key 经 blake2b 映射到桶号，跨进程稳定。

运行：python examples/07_concurrency_limits_and_priority.py
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from chongming_task import BucketPolicy, ConcurrencyPolicy, Controller, TaskContext, TaskStatus, render_table

S = TaskStatus
started_order: list[str] = []
order_lock = threading.Lock()


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("条件在限定时间内没有成立")
        time.sleep(0.005)


def hold(ctx: TaskContext, gate: threading.Event) -> str:
    """记下开始顺序，然后一直等到 gate 打开（期间每轮 checkpoint）。"""
    with order_lock:
        started_order.append(ctx.task_id)
    while not gate.is_set():
        ctx.checkpoint()
        time.sleep(0.005)
    return ctx.task_id


def status(controller: Controller, task_id: str) -> TaskStatus:
    snap = controller.get(task_id)
    assert snap is not None
    return snap.status


def main() -> None:
    # 1) 全局额度 + 暂停不释放槽位
    gate = threading.Event()
    controller = Controller(max_parallel=2)
    controller.register("hold", hold)
    for index in range(4):
        controller.submit("hold", gate, task_id=f"t{index}", label=f"转换-{index}")
    wait_until(lambda: status(controller, "t0") is S.RUNNING and status(controller, "t1") is S.RUNNING)
    print(render_table(controller.list_tasks()))
    assert controller.queued_count == 2
    assert status(controller, "t2") is S.QUEUED and controller.get("t2").started_at is None  # type: ignore[union-attr]
    row = next(
        line.split() for line in render_table(controller.list_tasks()).splitlines() if line.startswith("t2")
    )
    assert row[2] == "queued" and row[4] == "-"  # 排队中的任务没有执行过：ELAPSED 显示 "-"
    assert controller.pause("t0", timeout=2) is True
    time.sleep(0.05)
    assert controller.active_count == 2 and status(controller, "t2") is S.QUEUED  # 暂停没有腾出槽位
    assert controller.stats().unfinished == 4  # unfinished 含排队与暂停
    controller.resume("t0")
    gate.set()
    controller.wait_all(timeout=5)
    controller.close()

    # 2) 具名资源名额：db 只有 1 个名额；没写进 limits 的标签 io 不限
    gate = threading.Event()
    controller = Controller(concurrency=ConcurrencyPolicy(max_parallel=10, limits={"db": 1}))
    controller.register("hold", hold)
    controller.submit("hold", gate, task_id="db-A", tags=["db"])
    controller.submit("hold", gate, task_id="db-B", tags=["db", "io"])
    controller.submit("hold", gate, task_id="io-C", tags=["io"])
    wait_until(lambda: status(controller, "db-A") is S.RUNNING and status(controller, "io-C") is S.RUNNING)
    time.sleep(0.05)
    assert status(controller, "db-B") is S.QUEUED  # 等 db 名额
    gate.set()
    controller.wait_all(timeout=5)
    controller.close()

    # 3) 优先级：一个执行槽，先占住，再按 低、高、高、默认 提交
    started_order.clear()
    gate = threading.Event()
    controller = Controller(max_parallel=1)
    controller.register("hold", hold)
    blocker_gate = threading.Event()
    controller.submit("hold", blocker_gate, task_id="blocker")
    wait_until(lambda: controller.active_count == 1)
    controller.submit("hold", gate, task_id="backfill", priority=-5)
    controller.submit("hold", gate, task_id="urgent-1", priority=10)
    controller.submit("hold", gate, task_id="urgent-2", priority=10)
    controller.submit("hold", gate, task_id="normal")  # 默认优先级 0
    gate.set()
    blocker_gate.set()
    controller.wait_all(timeout=5)
    print("开始顺序：", started_order)
    assert started_order == ["blocker", "urgent-1", "urgent-2", "normal", "backfill"]
    controller.close()

    # 4) 分桶：每桶一个额度。租户 A 积压两个任务，不挡租户 B
    policy = BucketPolicy(num_buckets=64)
    bucket_a, bucket_b = policy.bucket_for("tenant-A"), policy.bucket_for("tenant-B")
    assert bucket_a != bucket_b and bucket_a == BucketPolicy(64).bucket_for("tenant-A")  # 确定、跨进程稳定
    gate = threading.Event()
    controller = Controller(max_parallel=10, max_parallel_per_bucket=1)
    controller.register("hold", hold)
    controller.submit("hold", gate, task_id="a0", bucket_key="tenant-A")
    controller.submit("hold", gate, task_id="a1", bucket_key="tenant-A")
    controller.submit("hold", gate, task_id="b0", bucket_key="tenant-B")
    wait_until(lambda: status(controller, "a0") is S.RUNNING and status(controller, "b0") is S.RUNNING)
    assert status(controller, "a1") is S.QUEUED
    assert controller.active_in_bucket(bucket_a) == 1
    snap = controller.get("a0")
    assert snap is not None and snap.bucket == bucket_a and snap.bucket_key == "tenant-A"
    assert controller.bucket_counts() == {bucket_a: 2, bucket_b: 1}
    assert [s.task_id for s in controller.list_tasks(bucket=bucket_b)] == ["b0"]
    gate.set()
    controller.wait_all(timeout=5)
    controller.close()

    print("07_concurrency_limits_and_priority: OK")


if __name__ == "__main__":
    main()
