"""Prometheus 指标（用户指南 §15.2）：名字、单位、标签，以及与任务迁移历史逐条对得上的计数。"""

from __future__ import annotations

import gc
import sys
import threading
from collections import Counter
from typing import Any

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from chongming_task import (
    ConcurrencyPolicy,
    ConfigurationError,
    Controller,
    FixedBackoff,
    RetryPolicy,
    TaskStatus,
)
from chongming_task.metrics import METRIC_NAMES, instrument


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return samples(registry).get((name, tuple(sorted(labels.items()))), 0.0)


def counting(ctx: Any, n: int) -> int:
    for i in range(n):
        ctx.progress(i + 1, total=n)
    return n


def flaky(ctx: Any) -> None:
    raise ValueError("坏")


def test_counters_match_the_transition_history() -> None:
    registry = CollectorRegistry()
    with Controller(max_parallel=2) as controller:
        metrics = instrument(controller, registry=registry)
        controller.register("counting", counting)
        controller.register("flaky", flaky, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0.01)))
        runs = [controller.submit("counting", 2) for _ in range(5)] + [controller.submit("flaky")]
        for run in runs:
            run.wait(timeout=10)
        assert controller.flush_events(timeout=5)
        expected = Counter(
            (run.name, t.from_status.value, t.to_status.value) for run in runs for t in run.transitions
        )
        for (task, frm, to), count in expected.items():
            got = value(
                registry, "chongming_task_transitions_total", task=task, from_status=frm, to_status=to
            )
            assert got == count, (task, frm, to)
        assert value(registry, "chongming_task_tasks", status="succeeded") == 5
        assert value(registry, "chongming_task_tasks", status="failed") == 1
        assert value(registry, "chongming_task_tasks", status="running") == 0
        assert value(registry, "chongming_task_slots", kind="used") == 0
        assert value(registry, "chongming_task_slots", kind="limit") == 2
        # 每次尝试一个观测：counting 5 次成功，flaky 2 次失败（一次转 retry_wait、一次落 failed）
        assert (
            value(
                registry,
                "chongming_task_attempt_duration_seconds_count",
                task="counting",
                outcome="succeeded",
            )
            == 5
        )
        assert (
            value(registry, "chongming_task_attempt_duration_seconds_count", task="flaky", outcome="failed")
            == 2
        )
        assert value(registry, "chongming_task_queue_wait_seconds_count", task="counting") == 5
        assert value(registry, "chongming_task_queue_wait_seconds_count", task="flaky") == 2
        metrics.close()
    assert not any(name.startswith("chongming_task") for name, _ in samples(registry))


def test_naming_rules() -> None:
    registry = CollectorRegistry()
    with Controller(concurrency=ConcurrencyPolicy(limits={"db": 1})) as controller:
        instrument(controller, registry=registry)
        controller.register("counting", counting, tags={"db"})
        run = controller.submit("counting", 1, task_id="secret-task-id")
        run.wait(timeout=10)
        controller.flush_events(timeout=5)
        text = generate_latest(registry).decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
    assert "secret-task-id" not in text  # 没有 task_id 标签
    for name in METRIC_NAMES:
        base = name.removesuffix("_total")
        assert base in families, name
        kind = families[base].type
        # _total 只在计数器上；时长是秒
        assert (kind == "counter") == name.endswith("_total"), name
        if kind == "histogram":
            assert name.endswith("_seconds"), name
    assert value(registry, "chongming_task_resource_slots", resource="db", kind="limit") == 1
    assert value(registry, "chongming_task_resource_slots", resource="db", kind="used") == 0


def test_slot_gauges_while_running_and_stop_latency() -> None:
    registry = CollectorRegistry()
    gate = threading.Event()

    def gated(ctx: Any) -> None:
        while not gate.wait(0.002):
            ctx.checkpoint()

    with Controller(max_parallel=1, concurrency=ConcurrencyPolicy(limits={"db": 1})) as controller:
        instrument(controller, registry=registry)
        controller.register("gated", gated, tags={"db"})
        run = controller.submit("gated")
        queued = controller.submit("gated")
        deadline = threading.Event()
        for _ in range(500):
            controller.flush_events(timeout=5)
            if value(registry, "chongming_task_tasks", status="running") == 1:
                break
            deadline.wait(0.01)
        assert value(registry, "chongming_task_slots", kind="used") == 1
        assert value(registry, "chongming_task_resource_slots", resource="db", kind="used") == 1
        assert value(registry, "chongming_task_tasks", status="queued") == 1
        controller.stop(queued.task_id)  # 排队中的：立即落 stopped，不经过 stopping
        assert queued.wait(timeout=10).status is TaskStatus.STOPPED
        controller.stop(run.task_id)
        assert run.wait(timeout=10).status is TaskStatus.STOPPED
        controller.flush_events(timeout=5)
        assert value(registry, "chongming_task_stop_latency_seconds_count") == 1
        assert value(registry, "chongming_task_tasks", status="stopped") == 2
        assert value(registry, "chongming_task_slots", kind="used") == 0


def test_missing_prometheus_client_says_which_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import 它会抛 ImportError
    with (
        Controller() as controller,
        pytest.raises(ConfigurationError, match=r"pip install 'chongming-task-runtime\[metrics\]'"),
    ):
        instrument(controller)


def test_one_registry_per_controller() -> None:
    registry = CollectorRegistry()
    with Controller() as a, Controller() as b:
        instrument(a, registry=registry)
        with pytest.raises(ConfigurationError, match="CollectorRegistry"):
            instrument(b, registry=registry)
        with pytest.raises(ConfigurationError, match="Controller"):
            instrument("not a controller", registry=CollectorRegistry())  # type: ignore[arg-type]


def test_paused_tasks_hold_a_slot_only_when_paused_in_place() -> None:
    # 排队中被暂停的任务从未占槽；在跑的任务就地暂停仍占着槽（与控制器的记账同一条规则）。
    registry = CollectorRegistry()
    gate = threading.Event()

    def gated(ctx: Any) -> None:
        while not gate.wait(0.002):
            ctx.checkpoint()

    def settle(predicate: Any) -> None:
        for _ in range(500):
            controller.flush_events(timeout=5)
            if predicate():
                return
            threading.Event().wait(0.01)
        raise AssertionError("指标在超时内没有到位")

    with Controller(max_parallel=1, concurrency=ConcurrencyPolicy(limits={"db": 2})) as controller:
        instrument(controller, registry=registry)
        controller.register("gated", gated, tags={"db"})
        running = controller.submit("gated")
        queued = controller.submit("gated")
        settle(lambda: value(registry, "chongming_task_tasks", status="running") == 1)
        controller.pause(queued.task_id)
        settle(lambda: value(registry, "chongming_task_tasks", status="paused") == 1)
        assert value(registry, "chongming_task_slots", kind="used") == 1
        assert value(registry, "chongming_task_resource_slots", resource="db", kind="used") == 1
        controller.pause(running.task_id)
        settle(lambda: value(registry, "chongming_task_tasks", status="paused") == 2)
        assert value(registry, "chongming_task_tasks", status="running") == 0
        assert value(registry, "chongming_task_slots", kind="used") == 1  # 就地暂停的那个仍占着
        assert value(registry, "chongming_task_resource_slots", resource="db", kind="used") == 1
        controller.stop(running.task_id)
        controller.stop(queued.task_id)
        gate.set()
        for run in (running, queued):
            assert run.wait(timeout=10).status is TaskStatus.STOPPED
        settle(lambda: value(registry, "chongming_task_tasks", status="stopped") == 2)
        assert value(registry, "chongming_task_slots", kind="used") == 0
        assert value(registry, "chongming_task_resource_slots", resource="db", kind="used") == 0
        assert value(registry, "chongming_task_tasks", status="paused") == 0


def test_replaying_recorded_events_through_the_public_batch_entry_gives_the_same_counts() -> None:
    # 交付线程给指标的是未拼装的迁移（内部入口）；公开的 on_event_batch 收事件对象。两条路记出的账必须一样：
    # 把一个普通监听器录下的 TransitionEvent 原样喂给另一个控制器上的指标，计数与直方图的样本数逐个相同。
    from chongming_task.events import TransitionEvent

    recorded: list[Any] = []
    live_registry, replay_registry = CollectorRegistry(), CollectorRegistry()
    with Controller(max_parallel=2) as controller:
        metrics = instrument(controller, registry=live_registry)
        controller.add_listener(recorded.append)
        controller.register("counting", counting)
        controller.register("flaky", flaky, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0.01)))
        runs = [controller.submit("counting", 2) for _ in range(3)] + [controller.submit("flaky")]
        for run in runs:
            run.wait(timeout=10)
        controller.flush_events(timeout=5)
        live = samples(live_registry)
        metrics.close()
    with Controller() as idle:
        replay = instrument(idle, registry=replay_registry)
        replay.on_event_batch([event for event in recorded if isinstance(event, TransitionEvent)])
        replayed = samples(replay_registry)
        replay.close()
    counted = [
        key
        for key in live
        if key[0].endswith(("_total", "_count", "_bucket")) or key[0] == "chongming_task_tasks"
    ]
    assert counted and {key: live[key] for key in counted} == {key: replayed.get(key) for key in counted}
    assert (
        live[
            (
                "chongming_task_transitions_total",
                (("from_status", "running"), ("task", "flaky"), ("to_status", "retry_wait")),
            )
        ]
        == 1
    )


def test_only_metrics_listening_queues_lean_transitions_and_keeps_no_per_task_state_after_landing() -> None:
    # 只有指标在听时迁移以精简的 (name, record, tags) 入队（快照不跟着在队列里活着），指标照样按任务名与
    # 具名资源记账；任务落了终态，每任务的记账（状态、三个时刻、unheld、标签）一项不留——失败重试、
    # 排队中停止、在跑时停止都一样。
    registry = CollectorRegistry()
    gate = threading.Event()
    queued_items: list[Any] = []

    def gated(ctx: Any) -> None:
        while not gate.wait(0.002):
            ctx.checkpoint()

    with Controller(max_parallel=1, concurrency=ConcurrencyPolicy(limits={"db": 2})) as controller:
        metrics = instrument(controller, registry=registry)
        hub = controller._events
        real_deliver = hub._deliver
        hub._deliver = lambda batch: (queued_items.extend(batch), real_deliver(batch))[1]  # type: ignore[method-assign]
        controller.register("gated", gated, tags={"db"})
        controller.register("flaky", flaky, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0.01)))
        running = controller.submit("gated")
        waiting = controller.submit("gated")
        for _ in range(500):
            controller.flush_events(timeout=5)
            if value(registry, "chongming_task_tasks", status="running") == 1:
                break
            threading.Event().wait(0.01)
        assert value(registry, "chongming_task_resource_slots", resource="db", kind="used") == 1
        controller.stop(waiting.task_id)
        controller.stop(running.task_id)
        # 开闸在停止生效之后：先开闸的话，任务体可能在下一次 checkpoint 之前就看到闸门开了、正常返回
        # （落 succeeded 而不是 stopped）——这一条在干净克隆的全量运行里碰到过一次。
        running.wait(timeout=10)
        assert running.status is TaskStatus.STOPPED
        gate.set()
        failing = controller.submit("flaky")
        for run in (running, waiting, failing):
            run.wait(timeout=10)
        assert controller.flush_events(timeout=5)
        transitions = [item for item in queued_items if isinstance(item, tuple)]
        assert transitions and all(isinstance(item[0], str) for item in transitions)
        assert waiting.status is TaskStatus.STOPPED  # 排队中被停止：从未占槽，直接落 stopped
        assert value(registry, "chongming_task_tasks", status="stopped") == 2
        assert value(registry, "chongming_task_tasks", status="failed") == 1
        assert value(registry, "chongming_task_resource_slots", resource="db", kind="used") == 0
        assert value(registry, "chongming_task_stop_latency_seconds_count") == 1
        assert (
            value(registry, "chongming_task_attempt_duration_seconds_count", task="flaky", outcome="failed")
            == 2
        )
        tables = (
            metrics._live,
            metrics._unheld,
            metrics._tags,
            metrics._queued_at,
            metrics._started_at,
            metrics._stopping_at,
        )
        assert [len(table) for table in tables] == [0] * len(tables)
        metrics.close()


def test_a_listener_added_while_only_metrics_listen_gets_every_later_transition_in_full() -> None:
    # 只有指标在听时迁移是精简入队的；挂上一个普通监听器之后提交的任务，它收到完整的、按版本排好的事件
    # （带快照），指标的计数也不重不漏。
    registry = CollectorRegistry()
    events: list[Any] = []
    with Controller(max_parallel=2) as controller:
        metrics = instrument(controller, registry=registry)
        controller.register("counting", counting)
        before = [controller.submit("counting", 1) for _ in range(20)]
        controller.add_listener(events.append)
        after = [controller.submit("counting", 1) for _ in range(5)]
        for run in before + after:
            assert run.wait(timeout=10).ok
        assert controller.flush_events(timeout=5)
        for run in after:
            got = [e for e in events if getattr(e, "task_id", None) == run.task_id and hasattr(e, "snapshot")]
            assert [e.record for e in got] == list(run.transitions)
            assert all(e.snapshot.status is e.to_status and e.name == "counting" for e in got)
        assert value(registry, "chongming_task_tasks", status="succeeded") == 25
        metrics.close()


def test_lean_queue_entries_hold_nothing_the_cycle_collector_tracks() -> None:
    # 只有指标在听时，排队等交付的迁移条目只含不被循环 GC 追踪的值（task_id 与任务名、状态值、datetime、
    # 没有标签时的 None）：一次回收就把元组摘出追踪，它在队列里等多久都不会被晋升到老一代（issue 18 / obs21：
    # 之前的条目带着 Transition 与枚举成员，每条迁移两个被追踪的对象在途）。计数照样与迁移历史对得上。
    registry = CollectorRegistry()
    queued_items: list[Any] = []
    with Controller(max_parallel=2) as controller:
        metrics = instrument(controller, registry=registry)
        hub = controller._events
        real_deliver = hub._deliver
        hub._deliver = lambda batch: (queued_items.extend(batch), real_deliver(batch))[1]  # type: ignore[method-assign]
        controller.register("counting", counting)
        controller.register("flaky", flaky, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0.01)))
        runs = [controller.submit("counting", 1) for _ in range(20)] + [controller.submit("flaky")]
        for run in runs:
            run.wait(timeout=10)
        assert controller.flush_events(timeout=5)
        transitions = [item for item in queued_items if isinstance(item, tuple)]
        assert len(transitions) == sum(len(run.transitions) for run in runs)
        assert (
            value(
                registry,
                "chongming_task_transitions_total",
                task="flaky",
                from_status="running",
                to_status="retry_wait",
            )
            == 1
        )
        metrics.close()
    gc.collect()
    assert [item for item in transitions if gc.is_tracked(item)] == []
    assert {(item[3], item[4]) for item in transitions} >= {("pending", "queued"), ("running", "retry_wait")}
