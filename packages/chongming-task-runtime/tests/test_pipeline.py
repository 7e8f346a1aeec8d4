"""Pipeline：blocked 不占额度、三种汇合、两种结算、skipped / cancelled / stopped 分得清。"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from chongming_runtime_test_support import wait_until

from chongming_task import (
    AggregationPolicy,
    CircularDependency,
    ConfigurationError,
    Controller,
    FailureKind,
    JoinMode,
    Pipeline,
    PipelineRun,
    TaskStatus,
)

S = TaskStatus


@pytest.fixture
def controller() -> Iterator[Controller]:
    c = Controller(max_parallel=4, graceful_stop=1.0)
    seen: list[str] = []
    c.seen = seen  # type: ignore[attr-defined]
    lock = threading.Lock()

    def fetch(ctx: Any, day: str) -> dict[str, Any]:
        with lock:
            seen.append("fetch")
        return {"day": day, "rows": 30}

    def transform(ctx: Any, index: int) -> int:
        fetched = ctx.input("fetch", {})
        with lock:
            seen.append(f"transform{index}")
        return int(fetched["rows"]) // 3 + index

    def load(ctx: Any) -> int:
        with lock:
            seen.append("load")
        return sum(v for k, v in ctx.upstream.items())

    def audit(ctx: Any) -> list[str]:
        with lock:
            seen.append("audit")
        return sorted(ctx.upstream)

    def ok(ctx: Any, value: Any = None) -> Any:
        return value

    def boom(ctx: Any) -> None:
        raise RuntimeError("上游炸了")

    def slow(ctx: Any) -> str:
        while True:
            ctx.checkpoint()
            time.sleep(0.002)

    for name, fn in [
        ("fetch", fetch),
        ("transform", transform),
        ("load", load),
        ("audit", audit),
        ("ok", ok),
        ("boom", boom),
        ("slow", slow),
    ]:
        c.register(name, fn)
    yield c
    c.close(timeout=5)


def test_nightly_etl_example_end_to_end(controller: Controller) -> None:
    pipeline = Pipeline("nightly-etl", aggregation=AggregationPolicy.all_settled())
    fetch = pipeline.node("fetch", "2026-10-02", node_id="fetch")
    shards = [
        pipeline.node("transform", index, node_id=f"shard{index}", depends_on=[fetch]) for index in range(3)
    ]
    load = pipeline.node("load", node_id="load", depends_on=shards)
    pipeline.node("audit", node_id="audit", depends_on=[load], join=JoinMode.ALL_SETTLED)
    run = controller.submit_pipeline(pipeline)
    outcome = run.wait(timeout=10)
    assert outcome.status is S.SUCCEEDED and outcome.ok
    assert outcome.nodes["load"].value == 10 + 11 + 12
    assert outcome.nodes["audit"].value == ["load"]
    seen = controller.seen  # type: ignore[attr-defined]
    assert seen[0] == "fetch" and seen[-2:] == ["load", "audit"]
    # 节点是普通任务：list_tasks 看得到，带 pipeline_id / node_id。
    nodes = controller.list_tasks(pipeline_id=run.pipeline_id)
    assert sorted(s.node_id for s in nodes) == ["audit", "fetch", "load", "shard0", "shard1", "shard2"]  # type: ignore[type-var]
    assert all(s.task_id == f"{run.pipeline_id}:{s.node_id}" for s in nodes)
    # 下游节点经历过 blocked，而不是 queued。
    load_history = [t.to_status for t in run.runs["load"].transitions]
    assert load_history[:2] == [S.BLOCKED, S.QUEUED]


def _gated_chain(c: Controller, length: int) -> tuple[PipelineRun, threading.Event]:
    """交一条 ``length`` 个节点的长链（节点 n0 … n{length-1}，各返回自己的序号）：根节点在返回的闸门打开之前
    一直在跑（边等边 checkpoint），其余节点 blocked。"""
    gate = threading.Event()

    def step(ctx: Any, i: int) -> int:
        if i == 0:
            while not gate.wait(0.002):
                ctx.checkpoint()
        return i

    c.register("step", step)
    pipeline = Pipeline("chain")
    previous = None
    for i in range(length):
        previous = pipeline.node("step", i, node_id=f"n{i}", depends_on=[previous] if previous else [])
    return c.submit_pipeline(pipeline), gate


def _count_wakes(c: Controller) -> list[str]:
    """从此刻起记下每一次叫醒后台循环（它等的那个事件被 set）的线程名；返回的列表随之变长。"""
    wakes: list[str] = []
    event = c._wake
    original = event.set

    def counting_set() -> None:
        wakes.append(threading.current_thread().name)
        original()

    event.set = counting_set  # type: ignore[method-assign]
    return wakes


def test_blocked_nodes_hold_no_slot_and_long_chain_never_deadlocks() -> None:
    c = Controller(max_parallel=1)
    run, gate = _gated_chain(c, 20)
    wait_until(lambda: run.runs["n0"].status is S.RUNNING)
    assert c.active_count == 1  # 只有根节点占额度
    assert c.queued_count == 0  # 下游还在 blocked，不是 queued
    assert sum(1 for s in c.list_tasks(status=S.BLOCKED)) == 19
    gate.set()
    assert run.wait(timeout=20).status is S.SUCCEEDED
    c.close()


@pytest.mark.parametrize(
    ("join", "upstreams", "expected"),
    [
        (JoinMode.ALL_SUCCEEDED, ["ok", "ok"], S.SUCCEEDED),
        (JoinMode.ALL_SUCCEEDED, ["ok", "boom"], S.SKIPPED),
        (JoinMode.ALL_SETTLED, ["ok", "boom"], S.SUCCEEDED),
        (JoinMode.ALL_SETTLED, ["boom", "boom"], S.SUCCEEDED),
        (JoinMode.ANY_SUCCEEDED, ["boom", "ok"], S.SUCCEEDED),
        (JoinMode.ANY_SUCCEEDED, ["boom", "boom"], S.SKIPPED),
    ],
)
def test_join_modes(
    controller: Controller, join: JoinMode, upstreams: list[str], expected: TaskStatus
) -> None:
    pipeline = Pipeline("join", aggregation=AggregationPolicy.all_settled())
    ups = [pipeline.node(name, node_id=f"up{i}") for i, name in enumerate(upstreams)]
    pipeline.node("audit", node_id="down", depends_on=ups, join=join)
    outcome = controller.submit_pipeline(pipeline).wait(timeout=10)
    down = outcome.nodes["down"]
    assert down.status is expected
    if expected is S.SKIPPED:
        assert down.failure is not None and down.failure.kind is FailureKind.DEPENDENCY_FAILED
    if expected is S.SUCCEEDED:
        # ctx.upstream 只含成功的上游
        assert down.value == sorted(f"up{i}" for i, name in enumerate(upstreams) if name == "ok")


def test_skip_cascades_to_dependants(controller: Controller) -> None:
    pipeline = Pipeline("cascade", aggregation=AggregationPolicy.all_settled())
    bad = pipeline.node("boom", node_id="bad")
    mid = pipeline.node("ok", node_id="mid", depends_on=[bad])
    pipeline.node("ok", node_id="leaf", depends_on=[mid])
    outcome = controller.submit_pipeline(pipeline).wait(timeout=10)
    assert outcome.nodes["mid"].status is S.SKIPPED and outcome.nodes["leaf"].status is S.SKIPPED
    assert outcome.status is S.FAILED
    assert outcome.failed_nodes == ["bad"]


def test_fail_fast_cancels_released_nodes_but_all_settled_lets_them_finish(controller: Controller) -> None:
    def build(aggregation: AggregationPolicy) -> Pipeline:
        p = Pipeline("ff", aggregation=aggregation)
        p.node("slow", node_id="sibling")
        p.node("boom", node_id="bad")
        return p

    run = controller.submit_pipeline(build(AggregationPolicy.fail_fast()))
    outcome = run.wait(timeout=10)
    assert outcome.nodes["bad"].status is S.FAILED
    assert outcome.nodes["sibling"].status is S.CANCELLED  # 被连坐，不是 stopped
    assert outcome.status is S.FAILED

    run = controller.submit_pipeline(build(AggregationPolicy.all_settled()))
    wait_until(lambda: run.runs["bad"].status is S.FAILED)
    time.sleep(0.05)
    assert run.runs["sibling"].status is S.RUNNING  # all_settled：不连坐
    run.stop(reason="测试结束")
    outcome = run.wait(timeout=10)
    assert outcome.nodes["sibling"].status is S.STOPPED
    assert outcome.status is S.FAILED


def test_manual_stop_is_stopped_not_cancelled_or_skipped(controller: Controller) -> None:
    pipeline = Pipeline("manual")
    first = pipeline.node("slow", node_id="first")
    pipeline.node("ok", node_id="after", depends_on=[first])
    run = controller.submit_pipeline(pipeline)
    wait_until(lambda: run.runs["first"].status is S.RUNNING)
    assert run.status is S.RUNNING
    assert run.stop(reason="值班手动停") == 2
    outcome = run.wait(timeout=10)
    assert outcome.nodes["first"].status is S.STOPPED
    assert outcome.nodes["after"].status is S.STOPPED  # blocked → stopped 立即生效
    assert outcome.status is S.STOPPED


def test_node_ids_default_suffix_and_duplicates(controller: Controller) -> None:
    p = Pipeline("ids")
    assert p.node("ok", "after").node_id == "ok"  # "after" 是参数，不是节点名
    assert p.node("ok").node_id == "ok#2"
    assert p.node("ok").node_id == "ok#3"
    with pytest.raises(ConfigurationError, match="已有节点"):
        p.node("ok", node_id="ok#2")
    other = Pipeline("other")
    foreign = other.node("ok")
    with pytest.raises(ConfigurationError, match="另一条管道"):
        p.node("ok", depends_on=[foreign])


def test_cycle_is_detected_and_named(controller: Controller) -> None:
    p = Pipeline("cyclic")
    p.node("ok", node_id="a", depends_on=["c"])
    p.node("ok", node_id="b", depends_on=["a"])
    p.node("ok", node_id="c", depends_on=["b"])
    with pytest.raises(CircularDependency) as info:
        controller.submit_pipeline(p)
    assert set(info.value.cycle) == {"a", "b", "c"} and info.value.cycle[0] == info.value.cycle[-1]
    assert "依赖成环" in str(info.value)
    assert controller.list_tasks() == []  # 什么也没提交


def test_unknown_task_name_refused_at_submit(controller: Controller) -> None:
    p = Pipeline("unknown")
    p.node("ok", node_id="a")
    p.node("no-such-task", node_id="b", depends_on=["a"])
    with pytest.raises(ConfigurationError, match="没有登记"):
        controller.submit_pipeline(p)
    assert controller.list_tasks() == []


def test_quorum_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="quorum"):
        AggregationPolicy.quorum(2)


def test_wide_fan_out_and_long_chain_scale() -> None:
    c = Controller(max_parallel=4)
    c.register("ok", lambda ctx, value=None: value)
    p = Pipeline("wide", aggregation=AggregationPolicy.all_settled())
    root = p.node("ok", 1, node_id="root")
    leaves = [p.node("ok", i, node_id=f"leaf{i}", depends_on=[root]) for i in range(1000)]
    p.node("ok", node_id="sink", depends_on=leaves)
    started = time.monotonic()
    outcome = c.submit_pipeline(p).wait(timeout=60)
    assert outcome.status is S.SUCCEEDED
    assert len(outcome.nodes) == 1002
    assert time.monotonic() - started < 60
    c.close()


# -- 就地协调（节点在落地的那个线程里放行 / 跳过下游、就地启动刚放行的节点）-------------------------------


def test_chain_advances_without_the_controller_background_loop() -> None:
    """放行与启动下游在上游落地的线程里就地完成，不经后台循环转一手：后台循环被占住时，链照样跑完。"""
    c = Controller(max_parallel=2)
    loop_held = threading.Event()
    loop_gate = threading.Event()

    def hold_loop() -> None:
        loop_held.set()
        loop_gate.wait(20)

    run, gate = _gated_chain(c, 30)
    try:
        wait_until(lambda: run.runs["n0"].status is S.RUNNING)  # 根节点由后台循环启动
        c.defer(hold_loop)  # 占住后台循环：之后的放行、启动都不能指望它
        assert loop_held.wait(10)
        gate.set()
        outcome = run.wait(timeout=10)
        assert outcome.status is S.SUCCEEDED
        assert [outcome.nodes[f"n{i}"].value for i in range(30)] == list(range(30))
    finally:
        loop_gate.set()
        c.close()


def test_one_settle_releases_its_children_with_one_wake_of_the_background_loop() -> None:
    """根节点落地一次放行 500 个下游：整批放行完就地启动拿得到额度的，后台循环至多被叫醒一次（原来每个入队
    叫醒一次，宽扇出一万个就是一万次）；其余下游由让出额度的节点接力启动，全部跑完。直接调用
    ``TaskRun.release`` 的照旧逐个叫醒（test_pipeline_host 的协议测试）。"""
    c = Controller(max_parallel=2)
    gate = threading.Event()

    def root(ctx: Any) -> None:
        while not gate.wait(0.002):
            ctx.checkpoint()

    c.register("root", root)
    c.register("ok", lambda ctx, i: i)
    pipeline = Pipeline("wide", aggregation=AggregationPolicy.all_settled())
    head = pipeline.node("root", node_id="root")
    for i in range(500):
        pipeline.node("ok", i, node_id=f"leaf{i}", depends_on=[head])
    run = c.submit_pipeline(pipeline)
    try:
        wait_until(lambda: run.runs["root"].status is S.RUNNING)
        wakes = _count_wakes(c)
        gate.set()
        outcome = run.wait(timeout=30)
        assert outcome.status is S.SUCCEEDED
        assert [outcome.nodes[f"leaf{i}"].value for i in range(500)] == list(range(500))
        assert len(wakes) <= 1, f"放行 500 个下游叫醒了后台循环 {len(wakes)} 次"
    finally:
        gate.set()
        c.close()


def test_a_chain_advancing_in_place_does_not_wake_the_background_loop() -> None:
    """长链上每个节点落地放行一个下游、就地启动它：就绪队列当场取空，不必叫醒后台循环（原来每个节点一次）。"""
    c = Controller(max_parallel=2)
    run, gate = _gated_chain(c, 50)
    try:
        wait_until(lambda: run.runs["n0"].status is S.RUNNING)
        wakes = _count_wakes(c)
        gate.set()
        outcome = run.wait(timeout=30)
        assert outcome.status is S.SUCCEEDED
        assert wakes == [], f"49 次就地放行叫醒了后台循环 {len(wakes)} 次"
    finally:
        gate.set()
        c.close()


def test_children_released_together_run_in_parallel() -> None:
    """一个节点落地放行的几个下游各占一个槽、同时跑（max_parallel=4 的四个下游互相等到对方才返回）：不能都接力
    到落地的那一条线程上排成一串（第二十轮起是这样：四个各睡 0.5 秒的下游要 2 秒）。"""
    c = Controller(max_parallel=4)
    together = threading.Barrier(4, timeout=5)

    def meet(ctx: Any, i: int) -> int:
        together.wait()  # 四个不同时在跑就等不齐：BrokenBarrierError，节点失败
        return i

    c.register("ok", lambda ctx: None)
    c.register("meet", meet)
    pipeline = Pipeline("fan")
    root = pipeline.node("ok", node_id="root")
    for i in range(4):
        pipeline.node("meet", i, node_id=f"leaf{i}", depends_on=[root])
    try:
        outcome = c.submit_pipeline(pipeline).wait(timeout=30)
        assert outcome.status is S.SUCCEEDED, outcome.failed_nodes
        assert [outcome.nodes[f"leaf{i}"].value for i in range(4)] == [0, 1, 2, 3]
    finally:
        c.close()


def test_concurrent_upstreams_all_reach_a_fan_in() -> None:
    """多个上游在不同线程里同时落地：管道锁下的计数不丢，汇合节点拿到每一个成功上游的值、只放行一次。"""
    c = Controller(max_parallel=4)
    c.register("value", lambda ctx, i: i)
    c.register("collect", lambda ctx: dict(ctx.upstream))
    for _ in range(3):
        pipeline = Pipeline("fan-in")
        leaves = [pipeline.node("value", i, node_id=f"leaf{i}") for i in range(200)]
        pipeline.node("collect", node_id="sink", depends_on=leaves)
        run = c.submit_pipeline(pipeline)
        outcome = run.wait(timeout=30)
        assert outcome.status is S.SUCCEEDED
        assert outcome.nodes["sink"].value == {f"leaf{i}": i for i in range(200)}
        history = [t.to_status for t in run.runs["sink"].transitions]
        assert history.count(S.QUEUED) == 1
    c.close()


def test_skip_cascade_down_a_long_chain_does_not_recurse() -> None:
    """根节点失败，两千个节点的链逐个被跳过：同一线程里的嵌套落地排队处理，不沿着链递归
    （不会 RecursionError）。"""
    c = Controller(max_parallel=2)
    c.register("ok", lambda ctx: None)

    def boom(ctx: Any) -> None:
        raise RuntimeError("根节点炸了")

    c.register("boom", boom)
    pipeline = Pipeline("doomed")
    previous = pipeline.node("boom", node_id="root")
    for i in range(2000):
        previous = pipeline.node("ok", node_id=f"n{i}", depends_on=[previous])
    outcome = c.submit_pipeline(pipeline).wait(timeout=60)
    assert outcome.status is S.FAILED and outcome.failed_nodes == ["root"]
    skipped = [node for node, o in outcome.nodes.items() if node != "root"]
    assert len(skipped) == 2000
    for node in skipped:
        failure = outcome.nodes[node].failure
        assert outcome.nodes[node].status is S.SKIPPED
        assert failure is not None and failure.kind is FailureKind.DEPENDENCY_FAILED
    c.close()


def test_fail_fast_cancels_the_all_settled_node_the_failure_releases(controller: Controller) -> None:
    """fail_fast：失败那一刻放行的 ALL_SETTLED 节点也在"已放行"之列——被连坐取消，任务体一行不跑。"""
    pipeline = Pipeline("ff-audit")
    bad = pipeline.node("boom", node_id="bad")
    pipeline.node("audit", node_id="audit", depends_on=[bad], join=JoinMode.ALL_SETTLED)
    for _ in range(5):
        outcome = controller.submit_pipeline(pipeline).wait(timeout=10)
        assert outcome.nodes["bad"].status is S.FAILED
        assert outcome.nodes["audit"].status is S.CANCELLED
        assert outcome.status is S.FAILED
    assert "audit" not in controller.seen  # type: ignore[attr-defined]


def test_stopping_a_waiting_pipeline_stops_every_node_and_skips_none() -> None:
    """人工停止：排队中的根节点一停就落地，它的下游仍要被如实记成 stopped（没轮到的下游不能被就地跳过）。
    只停上游一个节点时，下游照汇合规则落 skipped。"""
    c = Controller(max_parallel=1)
    gate = threading.Event()
    c.register("ok", lambda ctx: None)
    c.register("hold", lambda ctx: gate.wait(20))
    try:
        c.submit("hold")  # 占住唯一的额度：管道的根节点只能排队
        wait_until(lambda: c.active_count == 1)

        def build(name: str) -> Pipeline:
            pipeline = Pipeline(name)
            previous = pipeline.node("ok", node_id="root")
            for i in range(20):
                previous = pipeline.node("ok", node_id=f"n{i}", depends_on=[previous])
            return pipeline

        by_run = c.submit_pipeline(build("by-run"))
        by_sweep = c.submit_pipeline(build("by-sweep"))
        one_node = c.submit_pipeline(build("one-node"))
        wait_until(lambda: one_node.runs["root"].status is S.QUEUED)
        assert by_run.stop(reason="值班手动停") == 21
        outcome = by_run.wait(timeout=10)
        assert {o.status for o in outcome.nodes.values()} == {S.STOPPED}
        assert outcome.status is S.STOPPED

        assert c.stop(one_node.task_id_of("root"), reason="只停根节点")
        outcome = one_node.wait(timeout=10)
        assert outcome.nodes["root"].status is S.STOPPED
        assert {outcome.nodes[f"n{i}"].status for i in range(20)} == {S.SKIPPED}

        c.stop_all(reason="全部停")
        gate.set()
        outcome = by_sweep.wait(timeout=10)
        assert {o.status for o in outcome.nodes.values()} == {S.STOPPED}
    finally:
        gate.set()
        c.close()
