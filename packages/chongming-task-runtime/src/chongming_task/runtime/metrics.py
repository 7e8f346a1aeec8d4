"""Prometheus 指标：``instrument(controller, registry=...)``（用户指南 §15.2）。

只建立在公开事件钩子（``runtime/events.py``）之上：登记一个监听器，在交付线程里把事件折算成指标；
不碰控制器的任何内部状态，也不在任务的锁里做任何事。额度上限这类**配置**从控制器的公开属性读。

命名遵守 Prometheus 的规矩：基本单位（秒），``_total`` 只给计数器，标签里没有 task_id（任务成千上万，
每个 id 一条时间序列会撑爆 Prometheus）——``task`` 标签是任务**名**（登记过的有限集合）。

依赖 ``prometheus-client``（可选 extra ``chongming-task-runtime[metrics]``）；没装时 ``instrument()``
说清楚该 ``pip install`` 什么，而 ``import chongming_task.metrics`` 本身不需要它。
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from chongming_task.errors import ConfigurationError
from chongming_task.models import Transition
from chongming_task.runtime.controller import Controller
from chongming_task.runtime.events import Event, StoreErrorEvent, TransitionEvent
from chongming_task.states import SLOT_HOLDING_STATUSES, TaskStatus

S = TaskStatus

INSTALL_HINT = (
    "Prometheus 指标需要 prometheus-client：请 pip install 'chongming-task-runtime[metrics]'"
    "（或 pip install 'chongming-task[metrics]'）"
)

# 秒。尝试可能很长（小时级），排队与停止通常是毫秒到分钟：一套桶覆盖两端。
DURATION_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)

METRIC_NAMES = (
    "chongming_task_transitions_total",
    "chongming_task_tasks",
    "chongming_task_attempt_duration_seconds",
    "chongming_task_queue_wait_seconds",
    "chongming_task_stop_latency_seconds",
    "chongming_task_slots",
    "chongming_task_resource_slots",
    "chongming_task_lost_total",
    "chongming_task_store_errors_total",
)
"""``instrument()`` 注册的全部指标名（与用户指南 §15.2 的表一致）。"""

# 一次尝试在这些迁移上结束；值是 attempt_duration_seconds 的 outcome 标签。
_ATTEMPT_OUTCOME = {
    S.SUCCEEDED: "succeeded",
    S.FAILED: "failed",
    S.RETRY_WAIT: "failed",
    S.STOPPED: "stopped",
    S.CANCELLED: "stopped",
    S.LOST: "lost",
}


_NO_TAGS: frozenset[str] = frozenset()

# 热路径上用的成员：3.11 里 ``TaskStatus.X`` 每读一次都要走一遍枚举类的属性查找，模块常量只是一次全局读。
_QUEUED, _STARTING, _STOPPING, _LOST = S.QUEUED, S.STARTING, S.STOPPING, S.LOST
_TERMINAL = frozenset(status for status in S if status.is_terminal)


def _prometheus() -> Any:
    try:
        return importlib.import_module("prometheus_client")
    except ImportError:
        raise ConfigurationError(INSTALL_HINT) from None


def _holds_slot(record: Transition) -> bool:
    # 与控制器的记账同一条规则：排队中/重试等待中被暂停的任务从未占槽。
    target = record.to_status
    return target in SLOT_HOLDING_STATUSES and not (
        target is S.PAUSED and record.from_status in (S.QUEUED, S.RETRY_WAIT)
    )


class ControllerMetrics:
    """一个控制器的指标。它自己就是控制器的监听器（只在交付线程里被调用，所以账本不需要锁）。"""

    def __init__(self, controller: Controller, registry: Any) -> None:
        prom = _prometheus()
        self.controller = controller
        self.registry = registry
        self._closed = False
        self._registered: list[Any] = []
        kw: dict[str, Any] = {"registry": registry}
        try:
            self._create(prom, kw)
        except ValueError:
            for collector in self._registered:  # 半途撞名：已注册的那几个也撤掉，registry 保持原样
                registry.unregister(collector)
            raise
        self._init_values(controller)
        controller.add_listener(self)

    def _metric(self, factory: Any, *args: Any, **kwargs: Any) -> Any:
        metric = factory(*args, **kwargs)
        self._registered.append(metric)
        return metric

    def _create(self, prom: Any, kw: dict[str, Any]) -> None:
        self.transitions = self._metric(
            prom.Counter,
            "chongming_task_transitions",
            "任务状态迁移次数（本节点）",
            ["task", "from_status", "to_status"],
            **kw,
        )
        self.tasks = self._metric(
            prom.Gauge,
            "chongming_task_tasks",
            "本节点各状态的任务数（终态为 instrument 以来在本节点落地的个数）",
            ["status"],
            **kw,
        )
        self.attempt_duration = self._metric(
            prom.Histogram,
            "chongming_task_attempt_duration_seconds",
            "一次尝试从 starting 到结束的秒数（含暂停）",
            ["task", "outcome"],
            buckets=DURATION_BUCKETS,
            **kw,
        )
        self.queue_wait = self._metric(
            prom.Histogram,
            "chongming_task_queue_wait_seconds",
            "从进入 queued 到拿到执行槽（starting）的秒数",
            ["task"],
            buckets=DURATION_BUCKETS,
            **kw,
        )
        self.stop_latency = self._metric(
            prom.Histogram,
            "chongming_task_stop_latency_seconds",
            "从 stopping 到落终态的秒数",
            buckets=DURATION_BUCKETS,
            **kw,
        )
        self.slots = self._metric(
            prom.Gauge, "chongming_task_slots", "本节点的执行槽：used 占用、limit 上限", ["kind"], **kw
        )
        self.resource_slots = self._metric(
            prom.Gauge,
            "chongming_task_resource_slots",
            "具名资源（ConcurrencyPolicy.limits）的名额：used 占用、limit 上限",
            ["resource", "kind"],
            **kw,
        )
        self.lost = self._metric(prom.Counter, "chongming_task_lost", "本节点观察到的 lost 次数", **kw)
        self.store_errors = self._metric(
            prom.Counter, "chongming_task_store_errors", "写存储失败次数（任务照常运行）", ["operation"], **kw
        )

    def _init_values(self, controller: Controller) -> None:
        # 三个"此刻有多少"的仪表（各状态任务数、占用的槽位、具名资源的占用）在交付线程里只记普通整数，
        # 抓取时才由 set_function 读出：每次迁移省下几次带锁的 inc/dec（读一个 int 在别的线程里也是安全的）。
        self._counts: dict[TaskStatus, int] = dict.fromkeys(S, 0)
        for status in S:
            self.tasks.labels(status=status.value).set_function(self._counter_of(self._counts, status))
        self._used: dict[str, int] = {"": 0}  # "" = 全局执行槽，其余键是具名资源
        self.slots.labels(kind="used").set_function(self._counter_of(self._used, ""))
        if controller.max_parallel is not None:
            self.slots.labels(kind="limit").set(controller.max_parallel)
        self._limits: dict[str, int] = dict(controller.concurrency.limits)
        for resource, limit in self._limits.items():
            self._used[resource] = 0
            self.resource_slots.labels(resource=resource, kind="limit").set(limit)
            self.resource_slots.labels(resource=resource, kind="used").set_function(
                self._counter_of(self._used, resource)
            )
        # 预先绑定的标签子项：``labels(...)`` 每次都要拼键、拿锁、查表，热路径上按键缓存一次就够
        # （标签值是有限集合：任务名 × 状态）。只在交付线程里读写，不需要锁。
        self._transition_children: dict[tuple[str, TaskStatus, TaskStatus], Any] = {}
        self._queue_wait_children: dict[str, Any] = {}
        self._duration_children: dict[tuple[str, str], Any] = {}
        self._status: dict[str, TaskStatus] = {}
        self._holding: dict[str, frozenset[str]] = {}
        self._queued_at: dict[str, datetime] = {}
        self._started_at: dict[str, datetime] = {}
        self._stopping_at: dict[str, datetime] = {}

    def __call__(self, event: Event) -> None:
        self.on_event_batch((event,))

    def on_event_batch(self, events: Sequence[Event]) -> None:
        """事件钩子的批量入口（``events.BATCH_ENTRY``）：交付线程一次交来整批。

        同一批里迁移计数器按标签组合先在普通 dict 里累加，批末每组只 ``inc(n)`` 一次（prometheus-client
        的每次 inc 都拿一次锁）；直方图的观测值仍逐个 observe（每个值落在哪个桶各不相同）。抓取看到的值
        因此最多晚一批——交付线程本来就是批量送的，语义不变。
        """
        pending: dict[tuple[str, TaskStatus, TaskStatus], int] = {}
        lost = 0
        try:
            for event in events:
                if isinstance(event, TransitionEvent):
                    record = event.record
                    key = (event.snapshot.name, record.from_status, record.to_status)
                    pending[key] = pending.get(key, 0) + 1
                    if self._on_transition(record, key[0], event.snapshot.tags):
                        lost += 1
                elif isinstance(event, StoreErrorEvent):
                    # "touch×12" 是批量写：标签只留操作名，不让批大小变成新的时间序列。
                    self.store_errors.labels(operation=event.operation.split("×", 1)[0]).inc()
        finally:  # 途中出错（监听器随即被摘掉）也把已经算过的计数交出去
            for key, n in pending.items():
                self._transition_child(key).inc(n)
            if lost:
                self.lost.inc(lost)

    def _transition_child(self, key: tuple[str, TaskStatus, TaskStatus]) -> Any:
        child = self._transition_children.get(key)
        if child is None:
            name, source, target = key
            child = self.transitions.labels(task=name, from_status=source.value, to_status=target.value)
            self._transition_children[key] = child
        return child

    def _queue_wait_child(self, name: str) -> Any:
        child = self._queue_wait_children.get(name)
        if child is None:
            child = self._queue_wait_children[name] = self.queue_wait.labels(task=name)
        return child

    def _duration_child(self, name: str, outcome: str) -> Any:
        key = (name, outcome)
        child = self._duration_children.get(key)
        if child is None:
            child = self._duration_children[key] = self.attempt_duration.labels(task=name, outcome=outcome)
        return child

    def _on_transition(self, record: Transition, name: str, tags: Iterable[str]) -> bool:
        """记一次迁移的仪表与直方图（计数器由调用方按批合并）；返回这次是不是落 lost。"""
        # 直接读迁移记录的字段（事件上的同名属性是描述符，每读一次多一层 Python 调用；每个任务四条事件）。
        task_id, target, at = record.task_id, record.to_status, record.at
        status = self._status
        previous = status.get(task_id)
        counts = self._counts
        if previous is not None:
            counts[previous] -= 1
        counts[target] += 1
        terminal = target in _TERMINAL
        if terminal:
            status.pop(task_id, None)  # 终态只计数，不再记账（内存不随历史增长）
        else:
            status[task_id] = target
        self._account_slots(task_id, record, tags)
        if target is _QUEUED:
            self._queued_at[task_id] = at
            return False
        if target is _STARTING:
            queued = self._queued_at.pop(task_id, None)
            if queued is not None:
                self._queue_wait_child(name).observe(max(0.0, (at - queued).total_seconds()))
            self._started_at[task_id] = at
            return False
        outcome = _ATTEMPT_OUTCOME.get(target)
        if outcome is not None:
            started = self._started_at.pop(task_id, None)
            if started is not None:
                seconds = max(0.0, (at - started).total_seconds())
                self._duration_child(name, outcome).observe(seconds)
        if target is _STOPPING:
            self._stopping_at[task_id] = at
        elif terminal:
            stopping = self._stopping_at.pop(task_id, None)
            if stopping is not None:
                self.stop_latency.observe(max(0.0, (at - stopping).total_seconds()))
            self._queued_at.pop(task_id, None)
            self._started_at.pop(task_id, None)
        return target is _LOST

    def _account_slots(self, task_id: str, record: Transition, tags: Iterable[str]) -> None:
        held = self._holding.get(task_id)
        if _holds_slot(record):
            if held is None:
                limits = self._limits
                mine = frozenset(tag for tag in tags if tag in limits) if limits else _NO_TAGS
                self._holding[task_id] = mine
                used = self._used
                used[""] += 1
                for tag in mine:
                    used[tag] += 1
        elif held is not None:
            del self._holding[task_id]
            used = self._used
            used[""] -= 1
            for tag in held:
                used[tag] -= 1

    @staticmethod
    def _counter_of(counts: dict[Any, int], key: Any) -> Any:
        return lambda: counts[key]

    def close(self) -> None:
        """摘掉监听器，并从 registry 里注销这些指标（之后可以对同一个 registry 再 instrument）。幂等。"""
        if self._closed:
            return
        self._closed = True
        self.controller.remove_listener(self)
        for collector in self._registered:
            self.registry.unregister(collector)


def instrument(controller: Controller, *, registry: Any = None) -> ControllerMetrics:
    """给控制器挂上 Prometheus 指标，返回 ``ControllerMetrics``（``.close()`` 摘掉）。

    ``registry`` 默认是 prometheus-client 的全局 ``REGISTRY``；同一个 registry 上只能 instrument 一个
    控制器（指标名相同），多控制器请各给一个 ``CollectorRegistry()``。只统计 instrument 之后发生的事件。
    """
    prom = _prometheus()
    if not isinstance(controller, Controller):
        raise ConfigurationError(f"instrument() 的参数必须是 Controller，收到 {controller!r}")
    try:
        return ControllerMetrics(controller, prom.REGISTRY if registry is None else registry)
    except ValueError as exc:  # prometheus-client 对重名指标抛 ValueError
        raise ConfigurationError(
            f"这个 registry 上已经有 chongming_task_* 指标（{exc}）：每个控制器请给一个自己的 "
            "CollectorRegistry()，或先 close() 之前的那个"
        ) from None


__all__ = ["DURATION_BUCKETS", "INSTALL_HINT", "METRIC_NAMES", "ControllerMetrics", "instrument"]
