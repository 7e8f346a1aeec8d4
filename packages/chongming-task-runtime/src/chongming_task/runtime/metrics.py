"""Prometheus 指标：``instrument(controller, registry=...)``（用户指南 §15.2）。

只建立在事件钩子（``runtime/events.py``）之上：登记一个监听器，在交付线程里把事件折算成指标（经钩子的内部
批量入口 ``RAW_BATCH_ENTRY`` 直接读迁移记录，交付线程不必为它拼装事件对象）；
不碰控制器的任何内部状态，也不在任务的锁里做任何事。额度上限这类**配置**从控制器的公开属性读。

命名遵守 Prometheus 的规矩：基本单位（秒），``_total`` 只给计数器，标签里没有 task_id（任务成千上万，
每个 id 一条时间序列会撑爆 Prometheus）——``task`` 标签是任务**名**（登记过的有限集合）。

记账与导出分开（issue 18 的开销目标）：交付线程里只做普通的 dict / list 算术（每组标签一个整数、每个
直方图一组桶计数加一个和），一批事件拿一次锁；抓取时由一个自定义 collector（``registry.register``）
把账本拷出来、拼成与 prometheus-client 自带的 Counter / Gauge / Histogram 完全相同的样本（名字、类型、
标签、桶边界、``_created``）。为什么不直接用它们：每次 ``inc`` / ``observe`` 都要拿一把锁、直方图还要在
Python 里逐个桶比较，每个任务四次迁移下来十几微秒，是整个可观测性开销里最大的一块；而指标每几秒才被
抓一次。

依赖 ``prometheus-client``（可选 extra ``chongming-task-runtime[metrics]``）；没装时 ``instrument()``
说清楚该 ``pip install`` 什么，而 ``import chongming_task.metrics`` 本身不需要它。
"""

from __future__ import annotations

import importlib
import threading
import time
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from chongming_task.core.records import STATUS_VALUE
from chongming_task.errors import ConfigurationError
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.runtime.controller import Controller
from chongming_task.runtime.events import Event, RawItem, StoreErrorEvent, TransitionEvent
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

# 每个指标：(名字——计数器不带 _total，与 prometheus-client 的 Counter 一样, 类型, 说明)；顺序即导出顺序。
_FAMILIES = (
    ("chongming_task_transitions", "counter", "任务状态迁移次数（本节点）"),
    ("chongming_task_tasks", "gauge", "本节点各状态的任务数（终态为 instrument 以来在本节点落地的个数）"),
    ("chongming_task_attempt_duration_seconds", "histogram", "一次尝试从 starting 到结束的秒数（含暂停）"),
    ("chongming_task_queue_wait_seconds", "histogram", "从进入 queued 到拿到执行槽（starting）的秒数"),
    ("chongming_task_stop_latency_seconds", "histogram", "从 stopping 到落终态的秒数"),
    ("chongming_task_slots", "gauge", "本节点的执行槽：used 占用、limit 上限"),
    (
        "chongming_task_resource_slots",
        "gauge",
        "具名资源（ConcurrencyPolicy.limits）的名额：used 占用、limit 上限",
    ),
    ("chongming_task_lost", "counter", "本节点观察到的 lost 次数"),
    ("chongming_task_store_errors", "counter", "写存储失败次数（任务照常运行）"),
)

# 账本里的状态都是**值**（``"queued"`` 这样的字符串），不是枚举成员：交付队列里的精简迁移带的就是值（见
# ``events.LeanTransition``：只含不被 GC 追踪的对象，元组才能在第一次年轻代回收时被摘出追踪），导出的标签
# 也是值。比较一律用 ``==`` / 集合成员，不靠字符串的同一性。

# 一次尝试在这些迁移上结束；值是 attempt_duration_seconds 的 outcome 标签。
_ATTEMPT_OUTCOME = {
    S.SUCCEEDED.value: "succeeded",
    S.FAILED.value: "failed",
    S.RETRY_WAIT.value: "failed",
    S.STOPPED.value: "stopped",
    S.CANCELLED.value: "stopped",
    S.LOST.value: "lost",
}

# 热路径上用的值：模块常量只是一次全局读（``TaskStatus.X.value`` 是两次属性查找）。
_QUEUED, _STARTING, _RUNNING, _STOPPING, _PAUSED, _LOST = (
    S.QUEUED.value,
    S.STARTING.value,
    S.RUNNING.value,
    S.STOPPING.value,
    S.PAUSED.value,
    S.LOST.value,
)
_TERMINAL = frozenset(status.value for status in S if status.is_terminal)
_HOLDING = frozenset(status.value for status in SLOT_HOLDING_STATUSES)
# 从这里暂停的任务从未占槽（与控制器的记账同一条规则）
_NEVER_STARTED = frozenset({S.QUEUED.value, S.RETRY_WAIT.value})

# 直方图的账（每组标签一个 list）：前 len(DURATION_BUCKETS) + 1 个是各桶（最后一个是 +Inf）的**非累计**
# 计数，接着是和，最后是首次观测的时刻（``_created``）。``bisect_left`` 给出第一个 ≥ 值的边界，即
# prometheus-client 的 "value <= bound" 落桶规则。
_SUM = len(DURATION_BUCKETS) + 1
_CREATED = _SUM + 1

# 每个在管任务的记账不用每任务一个容器，而是几张以 task_id 为键、值是原子（状态值、datetime、共享的标签
# 集合）的表：每个任务一个 list 会从 queued 一直活到终态，积压时几乎都被晋升到循环 GC 的最老一代（issue 18：
# 每一万个任务因此多一次全量回收）；表项本身不是对象，表里的值也都不是新造的被追踪对象。终态时各表一并删掉。


def _prometheus() -> Any:
    try:
        return importlib.import_module("prometheus_client")
    except ImportError:
        raise ConfigurationError(INSTALL_HINT) from None


def _new_histogram() -> list[float]:
    counts = [0.0] * (_CREATED + 1)
    counts[_CREATED] = time.time()
    return counts


class ControllerMetrics:
    """一个控制器的指标。它自己既是控制器的监听器（交付线程里记账），也是 registry 里的 collector
    （抓取线程里导出）；两边共用一把锁：交付线程一批事件拿一次，抓取拿一次拷出账本。"""

    def __init__(self, controller: Controller, registry: Any) -> None:
        prom = _prometheus()
        self.controller = controller
        self.registry = registry
        self._closed = False
        self._lock = threading.Lock()
        self._metric_type = prom.Metric
        self._metrics_module = importlib.import_module("prometheus_client.metrics")
        go_string = importlib.import_module("prometheus_client.utils").floatToGoString
        self._le = tuple(go_string(bound) for bound in (*DURATION_BUCKETS, float("inf")))
        now = time.time()
        # 计数器 / 直方图：标签组合 → 值（插入顺序即首次出现的顺序，也是导出顺序，与 prometheus-client 的
        # 子项表一致）；``_created`` 记首次出现的时刻（prometheus-client 在 labels() 建子项时记）。
        self._transitions: dict[tuple[str, str, str], int] = {}  # (任务名, 起点状态值, 终点状态值)
        self._durations: dict[tuple[str, str], list[float]] = {}
        self._waits: dict[str, list[float]] = {}
        self._stop_latency = _new_histogram()
        self._store_errors: dict[str, int] = {}
        self._transitions_created: dict[tuple[str, str, str], float] = {}
        self._store_errors_created: dict[str, float] = {}
        self._lost = 0
        self._lost_created = now
        # 仪表。落地的（终态）个数在这里累计；在管任务各状态的个数与占用的槽位不逐个事件加减，而是
        # 抓取时数一遍 ``_live``（每个任务的状态就在那里）：交付线程每次迁移省下几次 dict 加减，
        # 抓取多花 O(在管任务数)（10 万个在管任务约几十毫秒，抓取本来就是每十几秒一次）。
        self._landed: dict[str, int] = dict.fromkeys(_TERMINAL, 0)
        self._max_parallel = controller.max_parallel
        self._limits: dict[str, int] = dict(controller.concurrency.limits)
        # 在管任务（见模块里"每个在管任务的记账"）：task_id → 最近的状态；终态即删，连同下面几张表里的项。
        self._live: dict[str, str] = {}
        # 最近一次是从 queued / retry_wait 直接暂停的任务（这种 paused 不占槽）；只在状态是 paused 时才读。
        self._unheld: set[str] = set()
        # 标签（算具名资源的占用）：只在配置了具名资源、且任务带标签时记。
        self._tags: dict[str, frozenset[str]] = {}
        # 三个时刻：进入 queued / starting / stopping 的时间，各自用掉即删。
        self._queued_at: dict[str, datetime] = {}
        self._started_at: dict[str, datetime] = {}
        self._stopping_at: dict[str, datetime] = {}
        registry.register(self)  # 撞名时抛 ValueError（DuplicateTimeseries），什么都没登记
        controller.add_listener(self)

    def __call__(self, event: Event) -> None:
        self.on_event_batch((event,))

    def on_event_batch(self, events: Sequence[Event]) -> None:
        """公开的批量入口（``events.BATCH_ENTRY``）：别人手里的事件对象也能喂进来（测试、回放）。"""
        self._on_raw_event_batch(
            [
                (
                    event.record.task_id,
                    event.snapshot.name,
                    event.snapshot.tags or None,
                    STATUS_VALUE[event.record.from_status],
                    STATUS_VALUE[event.record.to_status],
                    event.record.at,
                )
                if isinstance(event, TransitionEvent)
                else event
                for event in events
            ]
        )

    def _on_raw_event_batch(self, items: Sequence[RawItem]) -> None:
        """交付线程的内部批量入口（``events.RAW_BATCH_ENTRY``）：迁移是未拼装的六元组——只有内部监听器在听时的
        精简 ``(task_id, name, tags 或 None, 起点状态值, 终点状态值, at)``，或有公开监听器时的 ``(snapshot,
        record, submit_context, None, None, None)``（见 ``events.RawItem``）——一批拿一次锁记账，只有指标在听时
        交付线程一个事件对象都不造。

        热路径（每个任务至少四条迁移）：只有 dict / set 操作与算术，没有 Python 函数调用（落桶的 ``bisect``
        在 C 里）。计数器用 ``+= 1`` 加 ``KeyError``：一组标签只在第一次出现时走异常那条路（3.11 的 try
        不花钱），其余每条迁移比 ``get`` / 判空 / 写回少几条字节码。"""
        transitions, live, waits, durations = self._transitions, self._live, self._waits, self._durations
        queued_at, started_at, stopping_at = self._queued_at, self._started_at, self._stopping_at
        limits, unheld, landed = self._limits, self._unheld, self._landed
        with self._lock:
            for item in items:
                if item.__class__ is not tuple:
                    if isinstance(item, StoreErrorEvent):
                        self._store_error(item)
                    continue
                task_id: str
                name: str
                tags: frozenset[str] | None
                source: str
                target: str
                at: datetime | None
                task_id, name, tags, source, target, at = item  # type: ignore[assignment]
                # 精简条目的最后一项是时刻；是 None 的是有公开监听器时的完整条目
                # (snapshot, record, submit_context, None, None, None)
                if at is None:
                    snapshot: TaskSnapshot = item[0]  # type: ignore[assignment]
                    record: Transition = item[1]  # type: ignore[assignment]
                    task_id, name, tags = record.task_id, snapshot.name, snapshot.tags
                    source, target = STATUS_VALUE[record.from_status], STATUS_VALUE[record.to_status]
                    at = record.at
                key = (name, source, target)
                try:
                    transitions[key] += 1
                except KeyError:
                    transitions[key] = 1
                    self._transitions_created[key] = time.time()
                if target in _TERMINAL:
                    # 终态只计数，不再记账（内存不随历史增长）：各表一并删掉。instrument 之前就已在管的任务
                    # 本来就不在表里，pop 的默认值照顾它们。
                    live.pop(task_id, None)
                    queued_at.pop(task_id, None)
                    if unheld:  # 只有暂停过的任务在这里（多数时候是空的：不为每个任务调一次 discard）
                        unheld.discard(task_id)
                    if limits:
                        self._tags.pop(task_id, None)
                    landed[target] += 1
                    if target == _LOST:
                        self._lost += 1
                    since = started_at.pop(task_id, None)
                    if since is not None:
                        outcome = _ATTEMPT_OUTCOME.get(target)  # skipped 不结束任何尝试
                        if outcome is not None:
                            # 尝试时长的一次观测（就地写，不另调函数：每个任务一次）
                            seconds = (at - since).total_seconds()
                            if seconds < 0.0:
                                seconds = 0.0
                            buckets = durations.get((name, outcome))
                            if buckets is None:
                                buckets = durations[name, outcome] = _new_histogram()
                            buckets[bisect_left(DURATION_BUCKETS, seconds)] += 1
                            buckets[_SUM] += seconds
                    since = stopping_at.pop(task_id, None)
                    if since is None:
                        continue
                    buckets = self._stop_latency
                else:
                    live[task_id] = target
                    if limits and tags:
                        self._tags[task_id] = tags
                    if target == _QUEUED:
                        queued_at[task_id] = at
                        continue
                    if target == _RUNNING:
                        continue  # 最常见的中间一步：只有计数与仪表
                    if target == _STARTING:
                        started_at[task_id] = at
                        since = queued_at.pop(task_id, None)
                        if since is None:
                            continue
                        buckets = waits.get(name)
                        if buckets is None:
                            buckets = waits[name] = _new_histogram()
                    else:
                        if target == _PAUSED:
                            # 与控制器的记账同一条规则：排队中 / 重试等待中被暂停的任务从未占槽。
                            if source in _NEVER_STARTED:
                                unheld.add(task_id)
                            else:
                                unheld.discard(task_id)
                        outcome = _ATTEMPT_OUTCOME.get(target)  # 非终态里只有 retry_wait 结束一次尝试
                        if outcome is not None:
                            started = started_at.pop(task_id, None)
                            if started is not None:
                                self._observe(durations, (name, outcome), at, started)
                        if target == _STOPPING:
                            stopping_at[task_id] = at
                        continue
                # 直方图的一次观测（排队等待 / 停止时延）：落桶计数加一、和加上秒数。
                seconds = (at - since).total_seconds()
                if seconds < 0.0:
                    seconds = 0.0
                buckets[bisect_left(DURATION_BUCKETS, seconds)] += 1
                buckets[_SUM] += seconds

    def _store_error(self, event: StoreErrorEvent) -> None:
        # "touch×12" 是批量写：标签只留操作名，不让批大小变成新的时间序列。
        operation = event.operation.split("×", 1)[0]
        n = self._store_errors.get(operation)
        if n is None:
            self._store_errors_created[operation] = time.time()
            n = 0
        self._store_errors[operation] = n + 1

    def _observe(self, table: dict[Any, list[float]], key: Any, at: datetime, since: datetime) -> None:
        """尝试时长的一次观测（调用方持有锁）：落桶计数加一、和加上秒数。终态上的那一次在
        ``_on_raw_event_batch`` 里就地写（每个任务一次）；这里只剩 retry_wait 结束的尝试。"""
        seconds = (at - since).total_seconds()
        if seconds < 0.0:
            seconds = 0.0
        counts = table.get(key)
        if counts is None:
            counts = table[key] = _new_histogram()
        counts[bisect_left(DURATION_BUCKETS, seconds)] += 1
        counts[_SUM] += seconds

    # -- collector（registry 在抓取时调用）-------------------------------------------------------------

    def describe(self) -> Iterator[Any]:
        """registry 据此检查重名：没有样本的空指标族，类型决定它占用哪些 ``_total`` / ``_bucket`` 等名字。"""
        for name, kind, doc in _FAMILIES:
            yield self._metric_type(name, doc, kind)

    def collect(self) -> Iterator[Any]:
        """把账本拷出来（锁内只做浅拷贝），拼成与 prometheus-client 自带指标逐字相同的样本。"""
        with self._lock:
            transitions = list(self._transitions.items())
            durations = [(key, list(value)) for key, value in self._durations.items()]
            waits = [(key, list(value)) for key, value in self._waits.items()]
            stop_latency = list(self._stop_latency)
            store_errors = [
                (key, value, self._store_errors_created[key]) for key, value in self._store_errors.items()
            ]
            transitions_created = dict(self._transitions_created)
            counts = dict.fromkeys(STATUS_VALUE.values(), 0)
            counts.update(self._landed)
            used = dict.fromkeys(self._limits, 0)
            used[""] = 0
            limits = self._limits
            unheld, tags_of = self._unheld, self._tags
            for task_id, status in self._live.items():
                counts[status] += 1
                if status in _HOLDING and not (status == _PAUSED and task_id in unheld):
                    used[""] += 1
                    if limits:
                        for tag in tags_of.get(task_id, ()):
                            if tag in limits:
                                used[tag] += 1
            lost = self._lost
        # prometheus-client 的全局开关（disable_created_metrics() / PROMETHEUS_DISABLE_CREATED_SERIES）：
        # 它自带的指标据此决定导不导出 _created，这里跟着它，导出的样本才与原来一样。
        use_created = bool(getattr(self._metrics_module, "_use_created", True))
        family = iter(_FAMILIES)

        def new() -> Any:
            name, kind, doc = next(family)
            return self._metric_type(name, doc, kind)

        metric = new()
        for (task, source, target), value in transitions:
            labels = {"task": task, "from_status": source, "to_status": target}
            self._counter_sample(
                metric, labels, value, transitions_created[(task, source, target)], use_created
            )
        yield metric
        metric = new()
        for status, value in counts.items():
            metric.add_sample(metric.name, {"status": status}, float(value))
        yield metric
        metric = new()
        for (task, outcome), buckets in durations:
            self._histogram_samples(metric, {"task": task, "outcome": outcome}, buckets, use_created)
        yield metric
        metric = new()
        for task, buckets in waits:
            self._histogram_samples(metric, {"task": task}, buckets, use_created)
        yield metric
        metric = new()
        self._histogram_samples(metric, {}, stop_latency, use_created)
        yield metric
        metric = new()
        metric.add_sample(metric.name, {"kind": "used"}, float(used[""]))
        if self._max_parallel is not None:
            metric.add_sample(metric.name, {"kind": "limit"}, float(self._max_parallel))
        yield metric
        metric = new()
        for resource, limit in self._limits.items():
            metric.add_sample(metric.name, {"resource": resource, "kind": "limit"}, float(limit))
            metric.add_sample(metric.name, {"resource": resource, "kind": "used"}, float(used[resource]))
        yield metric
        metric = new()
        self._counter_sample(metric, {}, lost, self._lost_created, use_created)
        yield metric
        metric = new()
        for operation, value, created in store_errors:
            self._counter_sample(metric, {"operation": operation}, value, created, use_created)
        yield metric

    @staticmethod
    def _counter_sample(
        metric: Any, labels: dict[str, str], value: int, created: float, use_created: bool
    ) -> None:
        metric.add_sample(metric.name + "_total", labels, float(value))
        if use_created:
            metric.add_sample(metric.name + "_created", labels, created)

    def _histogram_samples(
        self, metric: Any, labels: dict[str, str], buckets: list[float], use_created: bool
    ) -> None:
        # 与 prometheus-client 的 Histogram 同样的样本与顺序：累计的 _bucket（le 用它的 floatToGoString）、
        # _count、_sum、_created。
        total = 0.0
        for le, count in zip(self._le, buckets, strict=False):
            total += count
            metric.add_sample(metric.name + "_bucket", {**labels, "le": le}, total)
        metric.add_sample(metric.name + "_count", labels, total)
        metric.add_sample(metric.name + "_sum", labels, float(buckets[_SUM]))
        if use_created:
            metric.add_sample(metric.name + "_created", labels, buckets[_CREATED])

    def close(self) -> None:
        """摘掉监听器，并从 registry 里注销这些指标（之后可以对同一个 registry 再 instrument）。幂等。"""
        if self._closed:
            return
        self._closed = True
        self.controller.remove_listener(self)
        self.registry.unregister(self)


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
