"""10 DAG 管道：按依赖把登记过的任务串起来。

演示并断言：
* 节点的第一个位置参数是任务名，其后才是任务参数；节点 id 用 node_id=（省略时取任务名，重名加 #2）；
* 等上游的节点处于 blocked：不进就绪队列、不占执行额度；
* 下游用 ctx.input("节点id") / ctx.upstream 取成功上游的返回值；
* 汇合：ALL_SUCCEEDED（默认）、ALL_SETTLED（不管成败都跑，如审计）、ANY_SUCCEEDED（任一成功即可）；
* 结算：fail_fast()（默认）首个失败即取消其余已放行的节点（cancelled），汇合不可能满足的节点 skipped；
  all_settled() 等所有节点落地再判定；
* quorum 被明确拒绝；依赖成环报 CircularDependency。

运行：python examples/10_pipeline.py
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from chongming_task import (
    AggregationPolicy,
    CircularDependency,
    ConfigurationError,
    Controller,
    FailureKind,
    JoinMode,
    Pipeline,
    TaskContext,
    TaskStatus,
)

S = TaskStatus
gate = threading.Event()


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("条件在限定时间内没有成立")
        time.sleep(0.005)


def fetch(ctx: TaskContext, day: str) -> dict[str, Any]:
    while not gate.is_set():  # 等演示代码检查完"下游处于 blocked"
        ctx.checkpoint()
        time.sleep(0.005)
    return {"day": day, "rows": 90}


def transform(ctx: TaskContext, shard: int) -> int:
    rows = ctx.input("fetch")["rows"]
    return rows // 3 + shard


def load(ctx: TaskContext) -> int:
    return sum(ctx.upstream.values())  # 只有成功的上游出现在这里


def audit(ctx: TaskContext) -> list[str]:
    return sorted(ctx.upstream)


def explode(ctx: TaskContext) -> None:
    raise RuntimeError("分片 1 的数据损坏")


def slow(ctx: TaskContext) -> str:
    while True:
        ctx.checkpoint()
        time.sleep(0.005)


def source_a(ctx: TaskContext) -> str:
    raise ConnectionError("主源不可用")


def source_b(ctx: TaskContext) -> str:
    return "备源数据"


def pick(ctx: TaskContext) -> str:
    return ctx.input("a", None) or ctx.input("b")


def main() -> None:
    controller = Controller(max_parallel=4)
    for name, fn in [
        ("fetch", fetch),
        ("transform", transform),
        ("load", load),
        ("audit", audit),
        ("explode", explode),
        ("slow", slow),
        ("source_a", source_a),
        ("source_b", source_b),
        ("pick", pick),
    ]:
        controller.register(name, fn)

    # 1) 正常的一条：fetch → 3 个 transform → load → audit
    pipeline = Pipeline("nightly-etl", aggregation=AggregationPolicy.all_settled())
    first = pipeline.node("fetch", "2026-10-02", node_id="fetch")
    shards = [pipeline.node("transform", i, node_id=f"shard{i}", depends_on=[first]) for i in range(3)]
    loaded = pipeline.node("load", node_id="load", depends_on=shards)
    pipeline.node("audit", node_id="audit", depends_on=[loaded], join=JoinMode.ALL_SETTLED)

    run = controller.submit_pipeline(pipeline)
    wait_until(lambda: run.snapshot["fetch"].status is S.RUNNING)
    assert controller.active_count == 1  # 只有根节点占额度
    assert controller.queued_count == 0  # 下游在 blocked，不在 queued
    assert run.snapshot["load"].status is S.BLOCKED
    gate.set()
    outcome = run.wait(timeout=10)
    print("nightly-etl:", outcome.status.value, {k: v.value for k, v in outcome.nodes.items()})
    assert outcome.ok
    assert outcome.nodes["load"].value == 30 + 31 + 32
    assert outcome.nodes["audit"].value == ["load"]
    # 节点是普通任务：task_id = <管道运行 id>:<node_id>，list_tasks 看得到
    assert run.task_id_of("load") == f"{run.pipeline_id}:load"
    assert len(controller.list_tasks(pipeline_id=run.pipeline_id)) == 6

    # 2) fail_fast（默认）：一个节点失败 → 已放行的兄弟被 cancelled，下游被 skipped，审计照跑
    pipeline = Pipeline("fragile")
    root_a = pipeline.node("explode", node_id="bad")
    root_b = pipeline.node("slow", node_id="sibling")
    merged = pipeline.node("load", node_id="load", depends_on=[root_a, root_b])
    pipeline.node("audit", node_id="audit", depends_on=[merged], join=JoinMode.ALL_SETTLED)
    outcome = controller.submit_pipeline(pipeline).wait(timeout=10)
    statuses = {node: o.status.value for node, o in outcome.nodes.items()}
    print("fragile:", outcome.status.value, statuses)
    assert statuses == {"bad": "failed", "sibling": "cancelled", "load": "skipped", "audit": "succeeded"}
    assert outcome.status is S.FAILED and outcome.failed_nodes == ["bad"]
    assert outcome.nodes["load"].failure.kind is FailureKind.DEPENDENCY_FAILED  # type: ignore[union-attr]

    # 3) ANY_SUCCEEDED：多源冗余，先到先得
    pipeline = Pipeline("redundant", aggregation=AggregationPolicy.all_settled())
    a = pipeline.node("source_a", node_id="a")
    b = pipeline.node("source_b", node_id="b")
    pipeline.node("pick", node_id="pick", depends_on=[a, b], join=JoinMode.ANY_SUCCEEDED)
    outcome = controller.submit_pipeline(pipeline).wait(timeout=10)
    assert outcome.nodes["pick"].value == "备源数据"
    assert outcome.status is S.FAILED  # a 失败了：汇合成功不会把整条管道"洗白"

    # 4) 节点 id 省略时取任务名，重名自动加后缀；quorum 与成环被拒绝
    pipeline = Pipeline("names")
    assert pipeline.node("transform", 1).node_id == "transform"
    assert pipeline.node("transform", 2).node_id == "transform#2"
    try:
        AggregationPolicy.quorum(2)
    except ConfigurationError as exc:
        print("quorum:", exc)
    else:
        raise AssertionError("quorum 应当被拒绝")
    cyclic = Pipeline("cyclic")
    cyclic.node("load", node_id="x", depends_on=["y"])
    cyclic.node("load", node_id="y", depends_on=["x"])
    try:
        controller.submit_pipeline(cyclic)
    except CircularDependency as exc:
        print("成环：", exc)
    else:
        raise AssertionError("成环应当被拒绝")

    controller.close()
    print("10_pipeline: OK")


if __name__ == "__main__":
    main()
