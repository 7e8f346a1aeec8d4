"""06 Controller：登记任务、按名字提交、查询、控制、收尾。

演示并断言：
* 只接受登记过的名字：未登记的名字、直接传函数都会被拒绝（ConfigurationError）；重名登记报错；
* @task 的规格（名字、标签、重试、超时）在 register_all / register_module 时取用；
* 查询：get / list_tasks（按状态、名字前缀、标签）/ stats / runs / render_table；
* 控制的返回值：stop → 是否找到；pause → 是否**确认**挂起；stop_all → 本轮发出的请求数（不是"已停止"数）；
* close() 停止一切：排队中的任务不会执行任务体。

运行：python examples/06_controller.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from chongming_task import (
    ConfigurationError,
    Controller,
    FixedBackoff,
    RetryPolicy,
    TaskContext,
    TaskStatus,
    render_table,
    task,
)

S = TaskStatus
executed: list[str] = []


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("条件在限定时间内没有成立")
        time.sleep(0.005)


@task(tags={"io"}, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0)))
def extract(ctx: TaskContext, source: str) -> dict[str, Any]:
    """从数据源抽取。"""
    executed.append(ctx.task_id)
    for part in range(3):
        ctx.checkpoint()
        ctx.progress(part + 1, total=3, unit="分区")
        time.sleep(0.01)
    return {"source": source, "rows": 3}


def transform(ctx: TaskContext, factor: int) -> int:
    executed.append(ctx.task_id)
    while True:  # 常驻：直到被停止
        ctx.checkpoint()
        time.sleep(0.01)


def main() -> None:
    controller = Controller(max_parallel=2)
    controller.register_all(extract)  # 名字、标签、重试取自 @task
    controller.register("transform", transform, tags={"cpu"})

    # 安全底线：只接受名字
    for bad in (lambda: controller.submit("nope"), lambda: controller.submit(transform)):  # type: ignore[arg-type]
        try:
            bad()
        except ConfigurationError as exc:
            print("拒绝：", exc)
        else:
            raise AssertionError("应当拒绝")
    try:
        controller.register("transform", transform)
    except ConfigurationError:
        pass
    else:
        raise AssertionError("重名登记应当报错")

    first = controller.submit("extract", "s3://bucket/a", task_id="e0", label="抽取-A")
    controller.submit("transform", 100, task_id="t0", label="转换-1")
    controller.submit("transform", 200, task_id="t1", label="转换-2")  # 额度只有 2：排队
    assert first.wait(timeout=5).value == {"source": "s3://bucket/a", "rows": 3}

    wait_until(lambda: len(controller.list_tasks(status=S.RUNNING)) == 2)  # 占了槽不等于已在 running
    print(render_table(controller.list_tasks()))

    # 查询
    snap = controller.get("e0")
    assert snap is not None and snap.status is S.SUCCEEDED and snap.max_attempts == 2
    assert controller.get("no-such-task") is None
    assert [s.task_id for s in controller.list_tasks(tag="io")] == ["e0"]
    assert {s.task_id for s in controller.list_tasks(name_prefix="trans")} == {"t0", "t1"}
    running = controller.list_tasks(status=S.RUNNING)
    assert {s.task_id for s in running} == {"t0", "t1"}
    stats = controller.stats()
    assert stats[S.SUCCEEDED] == 1 and stats.unfinished == 2 and stats.total == 3
    assert {r.task_id for r in controller.runs()} == {"e0", "t0", "t1"}

    # 控制与返回值
    assert controller.pause("t0", timeout=2) is True  # 已确认挂起
    assert controller.get("t0").status is S.PAUSED  # type: ignore[union-attr]
    assert controller.active_count == 2  # 暂停不释放执行槽
    assert controller.resume("t0") is True
    assert controller.stop("no-such-task") is False  # 没找到
    assert controller.stop("t0", reason="手工干预") is True
    issued = controller.stop_all(reason="下班")  # 发出的请求数，不是"已停止"数
    print("stop_all 发出的请求数：", issued)
    assert issued >= 1
    outcomes = controller.wait_all(timeout=10)
    assert sorted(o.status.value for o in outcomes) == ["stopped", "stopped", "succeeded"]

    # close()：排队中的任务不会执行任务体
    controller2 = Controller(max_parallel=1)
    controller2.register("transform", transform)
    controller2.submit("transform", 1, task_id="busy")
    controller2.submit("transform", 2, task_id="waiting")
    wait_until(lambda: controller2.active_count == 1)
    controller2.close(reason="进程退出", timeout=5)
    assert controller2.get("waiting").status is S.STOPPED  # type: ignore[union-attr]
    assert "waiting" not in executed
    try:
        controller2.submit("transform", 3)
    except ConfigurationError:
        pass
    else:
        raise AssertionError("close() 之后不再接受提交")

    controller.close()
    print("06_controller: OK")


if __name__ == "__main__":
    main()
