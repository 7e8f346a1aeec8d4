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
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from functools import reduce
from itertools import compress, repeat
from operator import add, attrgetter, is_, is_not, itemgetter, sub
from typing import Any

from chongming_task.errors import ConfigurationError
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

# 一次尝试在这些迁移上结束；值是 attempt_duration_seconds 的 outcome 标签。
_ATTEMPT_OUTCOME = {
    S.SUCCEEDED: "succeeded",
    S.FAILED: "failed",
    S.RETRY_WAIT: "failed",
    S.STOPPED: "stopped",
    S.CANCELLED: "stopped",
    S.LOST: "lost",
}

# 热路径上用的成员：3.11 里 ``TaskStatus.X`` 每读一次都要走一遍枚举类的属性查找，模块常量只是一次全局读。
_QUEUED, _STARTING, _RUNNING, _STOPPING, _PAUSED, _LOST = (
    S.QUEUED,
    S.STARTING,
    S.RUNNING,
    S.STOPPING,
    S.PAUSED,
    S.LOST,
)
_TERMINAL = frozenset(status for status in S if status.is_terminal)
_HOLDING = frozenset(SLOT_HOLDING_STATUSES)
_NEVER_STARTED = frozenset({S.QUEUED, S.RETRY_WAIT})  # 从这里暂停的任务从未占槽（与控制器的记账同一条规则）

# 批量快路径（``ControllerMetrics._fast_batch``）只收这几种"往前走一步"的迁移：每个任务一生里各至多一次
# （要再走一遍得先经过 retry_wait / paused / 终态之后的重来，那些都不在表里），所以同一批里一个任务在每一种
# 上至多出现一次，按阶段（进队列 → 拿到槽 → 跑起来 → 落地）分组处理与逐条按顺序处理记出的账相同。
_FAST_STEPS = frozenset(
    {
        (S.PENDING, S.QUEUED),
        (S.BLOCKED, S.QUEUED),
        (S.QUEUED, S.STARTING),
        (S.STARTING, S.RUNNING),
        (S.RUNNING, S.SUCCEEDED),
        (S.RUNNING, S.FAILED),
    }
)
_FAST_MIN_BATCH = 16
"""批里至少这么多条才走快路径：它每批有约两百条字节码的固定开销（十几次 C 层的 map / zip），只有摊到
几十条迁移上才比逐条处理便宜；小批（低负载、单测）照旧逐条处理。"""
_HEAD, _RECORD = itemgetter(0), itemgetter(1)
_TASK_ID, _FROM, _TO, _AT = (
    attrgetter("task_id"),
    attrgetter("from_status"),
    attrgetter("to_status"),
    attrgetter("at"),
)
_NAME = attrgetter("name")
_SECONDS = timedelta.total_seconds
_SINK: deque[object] = deque(maxlen=0)
_consume = _SINK.extend  # 在 C 里把一个迭代器跑完（map 的副作用就是要做的事）；maxlen=0 什么都不留

# 直方图的账（每组标签一个 list）：前 len(DURATION_BUCKETS) + 1 个是各桶（最后一个是 +Inf）的**非累计**
# 计数，接着是和，最后是首次观测的时刻（``_created``）。``bisect_left`` 给出第一个 ≥ 值的边界，即
# prometheus-client 的 "value <= bound" 落桶规则。
_SUM = len(DURATION_BUCKETS) + 1
_CREATED = _SUM + 1

# 每个在管任务的记账不用每任务一个容器，而是几张以 task_id 为键、值是原子（枚举成员、datetime、共享的标签
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
        self._transitions: dict[tuple[str, TaskStatus, TaskStatus], int] = {}
        self._durations: dict[tuple[str, str], list[float]] = {}
        self._waits: dict[str, list[float]] = {}
        self._stop_latency = _new_histogram()
        self._store_errors: dict[str, int] = {}
        self._transitions_created: dict[tuple[str, TaskStatus, TaskStatus], float] = {}
        self._store_errors_created: dict[str, float] = {}
        self._lost = 0
        self._lost_created = now
        # 仪表。落地的（终态）个数在这里累计；在管任务各状态的个数与占用的槽位不逐个事件加减，而是
        # 抓取时数一遍 ``_live``（每个任务的状态就在那里）：交付线程每次迁移省下几次 dict 加减，
        # 抓取多花 O(在管任务数)（10 万个在管任务约几十毫秒，抓取本来就是每十几秒一次）。
        self._landed: dict[TaskStatus, int] = dict.fromkeys(_TERMINAL, 0)
        self._max_parallel = controller.max_parallel
        self._limits: dict[str, int] = dict(controller.concurrency.limits)
        # 在管任务（见模块里"每个在管任务的记账"）：task_id → 最近的状态；终态即删，连同下面几张表里的项。
        self._live: dict[str, TaskStatus] = {}
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
                (event.snapshot, event.record, event.submit_context)
                if isinstance(event, TransitionEvent)
                else event
                for event in events
            ]
        )

    def _on_raw_event_batch(self, items: Sequence[RawItem]) -> None:
        """交付线程的内部批量入口（``events.RAW_BATCH_ENTRY``）：迁移是未拼装的三元组——完整的 ``(snapshot,
        record, submit_context)`` 或精简的 ``(name, record, tags)``（只有内部监听器在听时，见
        ``EventHub.emit_transition``）——一批拿一次锁记账，只有指标在听时交付线程一个事件对象都不造。

        大批里全是"往前走一步"的迁移时（吞吐时几乎每一批）走 ``_fast_batch``：按阶段分组、用 C 层的
        map / zip / Counter 一次处理整组，不为每条迁移跑一遍 Python；其余（小批、重试、暂停、停止、丢失、
        存储错误、配置了具名资源……）逐条处理（``_slow_batch``）。两条路记出的账逐项相同（测试逐项对比）。"""
        with self._lock:
            if len(items) < _FAST_MIN_BATCH or not self._fast_batch(items):
                self._slow_batch(items)

    def _fast_batch(self, items: Sequence[RawItem]) -> bool:
        """（持有锁）整批都是 ``_FAST_STEPS`` 里的迁移时按阶段分组记账，返回 True；否则什么都不改、返回
        False（调用方逐条处理）。

        为什么分组是对的：同一批里一个任务的这几步按版本顺序出现，且每种至多一次（见 ``_FAST_STEPS``），
        各阶段只读写前一阶段留下的项（进队列的时刻 → 拿到槽时取走；拿到槽的时刻 → 落地时取走）。所以先做完
        整批的"进队列"、再做"拿到槽"、再"落地"，与逐条做的结果相同；在管状态按批内顺序 ``update``（后到的
        覆盖先到的），再删掉落地的。计数按首次出现的顺序插入（导出顺序不变），直方图的和按批内顺序逐个相加
        （``reduce``：浮点和与逐条加完全相同）。

        代价（issue 18）：逐条处理每条迁移约一百条字节码（解包、拼键、查表、几个分支），每个任务四条；
        这里每批是二十几次 C 层调用，每条迁移只剩 C 里的几次 dict / 属性操作。"""
        if self._limits or set(map(type, items)) != {tuple}:
            return False  # 具名资源要逐条记标签；存储错误等事件对象逐条处理
        heads: list[Any] = list(map(_HEAD, items))  # type: ignore[arg-type]  # 上面已确认全是元组
        head_types = set(map(type, heads))
        if head_types == {str}:
            names: list[str] = heads  # 精简三元组：第一项就是任务名
        elif str in head_types:
            return False  # 两种三元组混在一批里（刚挂上 / 摘掉公开监听器）：少见，逐条处理
        else:
            names = list(map(_NAME, heads))  # 完整三元组：第一项是快照
        records = list(map(_RECORD, items))  # type: ignore[arg-type]
        sources = list(map(_FROM, records))
        targets = list(map(_TO, records))
        if not _FAST_STEPS.issuperset(zip(sources, targets, strict=True)):
            return False
        ids = list(map(_TASK_ID, records))
        ats = list(map(_AT, records))
        # 迁移计数：整批在 C 里数一遍（键按首次出现的顺序），再并进账本；新键记首次出现的时刻。
        transitions = self._transitions
        for key, n in Counter(zip(names, sources, targets, strict=True)).items():
            old = transitions.get(key)
            if old is None:
                self._transitions_created[key] = time.time()
                old = 0
            transitions[key] = old + n
        # 在管状态：按批内顺序写（同一任务后到的覆盖先到的），落地的随后删掉（落地之后本批里不会再有它）。
        live = self._live
        live.update(zip(ids, targets, strict=True))
        queued_at, started_at = self._queued_at, self._started_at
        # 进队列：记下时刻。
        mask = list(map(is_, targets, repeat(_QUEUED)))
        queued_at.update(zip(compress(ids, mask), compress(ats, mask), strict=True))
        # 拿到槽：记下开始时刻；取走进队列的时刻，观测排队等待（instrument 之前就进了队列的任务没有，跳过）。
        mask = list(map(is_, targets, repeat(_STARTING)))
        starting = list(compress(ids, mask))
        if starting:
            at = list(compress(ats, mask))
            started_at.update(zip(starting, at, strict=True))
            since = list(map(queued_at.pop, starting, repeat(None)))
            self._observe_many(self._waits, compress(names, mask), at, since)
        # 落地（succeeded / failed，都从 running 来）：删掉每任务的记账，计落地个数，观测尝试时长。
        mask = list(map(_TERMINAL.__contains__, targets))
        landing = list(compress(ids, mask))
        if landing:
            at = list(compress(ats, mask))
            ended = list(compress(targets, mask))
            _consume(map(live.pop, landing))
            if queued_at:
                _consume(map(queued_at.pop, landing, repeat(None)))
            if self._unheld:
                self._unheld.difference_update(landing)
            landed = self._landed
            for target, n in Counter(ended).items():
                landed[target] += n
            since = list(map(started_at.pop, landing, repeat(None)))
            keys = zip(compress(names, mask), map(_ATTEMPT_OUTCOME.__getitem__, ended), strict=True)
            self._observe_many(self._durations, keys, at, since)
            stopping_at = self._stopping_at
            if stopping_at:
                since = list(map(stopping_at.pop, landing, repeat(None)))
                if any(map(is_not, since, repeat(None))):
                    self._observe_many(None, repeat(None), at, since)
        return True

    def _observe_many(
        self,
        table: dict[Any, list[float]] | None,
        keys: Iterable[Any],
        at: list[datetime],
        since: list[datetime | None],
    ) -> None:
        """（持有锁）批量的直方图观测：第 i 个观测是 ``at[i] - since[i]`` 秒，记在 ``table[键 i]``（``table``
        为 None 时记在停止时延上）；``since[i]`` 为 None 的跳过（instrument 之前就开始的）。与逐条观测
        （``_observe``）的结果相同：负值当 0、按 ``bisect_left`` 落桶、和按原顺序逐个相加、直方图按键首次
        出现的顺序建。"""
        if None in since:
            keep = list(map(is_not, since, repeat(None)))
            keys, at, since = compress(keys, keep), list(compress(at, keep)), list(compress(since, keep))
        seconds = list(map(_SECONDS, map(sub, at, since)))
        if not seconds:
            return
        if min(seconds) < 0.0:  # 时钟回拨：与逐条观测一样当 0
            seconds = [value if value >= 0.0 else 0.0 for value in seconds]
        groups: dict[Any, list[float]]
        if table is None:
            groups = {None: seconds}
        else:
            keys = list(keys)
            if len(set(keys)) == 1:
                groups = {keys[0]: seconds}  # 常见情形：一批里只有一种任务（与结局）
            else:
                groups = {}
                for key, value in zip(keys, seconds, strict=True):
                    group = groups.get(key)
                    if group is None:
                        group = groups[key] = []
                    group.append(value)
        for key, values in groups.items():
            if table is None:
                counts = self._stop_latency
            else:
                found = table.get(key)
                counts = table[key] = _new_histogram() if found is None else found
            for bucket, n in Counter(map(bisect_left, repeat(DURATION_BUCKETS), values)).items():
                counts[bucket] += n
            counts[_SUM] = reduce(add, values, counts[_SUM])

    def _slow_batch(self, items: Sequence[RawItem]) -> None:
        """（持有锁）逐条按顺序记账：任何迁移、任何事件都能处理（快路径不收的都在这里）。

        热路径：只有 dict / set 操作与算术，没有函数调用（除了落桶的 ``bisect``）。"""
        transitions, live, waits = self._transitions, self._live, self._waits
        queued_at, started_at, stopping_at = self._queued_at, self._started_at, self._stopping_at
        limits = self._limits
        for item in items:
            if item.__class__ is not tuple:
                if isinstance(item, StoreErrorEvent):
                    self._store_error(item)
                continue
            head, record, third = item
            tags: frozenset[str]
            if isinstance(head, str):
                # 精简三元组的第三项是标签集合（不用 typing.cast：那是每条迁移一次 Python 函数调用）
                name, tags = head, third  # type: ignore[assignment]
            else:
                name, tags = head.name, head.tags
            task_id, source, target = record.task_id, record.from_status, record.to_status
            key = (name, source, target)
            n = transitions.get(key)
            if n is None:
                self._transitions_created[key] = time.time()
                n = 0
            transitions[key] = n + 1
            if target in _TERMINAL:
                # 终态只计数，不再记账（内存不随历史增长）：各表一并删掉。instrument 之前就已在管的任务
                # 本来就不在表里，pop 的默认值照顾它们。
                live.pop(task_id, None)
                queued_at.pop(task_id, None)
                self._unheld.discard(task_id)
                if limits:
                    self._tags.pop(task_id, None)
                self._landed[target] += 1
                if target is _LOST:
                    self._lost += 1
                at = record.at
                started = started_at.pop(task_id, None)
                outcome = _ATTEMPT_OUTCOME.get(target)  # skipped 不结束任何尝试
                if started is not None and outcome is not None:
                    self._observe(self._durations, (name, outcome), at, started)
                since = stopping_at.pop(task_id, None)
                if since is None:
                    continue
                buckets = self._stop_latency
            else:
                live[task_id] = target
                if limits and tags:
                    self._tags[task_id] = tags
                if target is _QUEUED:
                    queued_at[task_id] = record.at
                    continue
                if target is _RUNNING:
                    continue  # 最常见的中间一步：只有计数与仪表
                at = record.at
                if target is _STARTING:
                    started_at[task_id] = at
                    since = queued_at.pop(task_id, None)
                    if since is None:
                        continue
                    wait_buckets = waits.get(name)
                    if wait_buckets is None:
                        wait_buckets = waits[name] = _new_histogram()
                    buckets = wait_buckets
                else:
                    if target is _PAUSED:
                        # 与控制器的记账同一条规则：排队中 / 重试等待中被暂停的任务从未占槽。
                        if source in _NEVER_STARTED:
                            self._unheld.add(task_id)
                        else:
                            self._unheld.discard(task_id)
                    outcome = _ATTEMPT_OUTCOME.get(target)  # 非终态里只有 retry_wait 结束一次尝试
                    if outcome is not None:
                        started = started_at.pop(task_id, None)
                        if started is not None:
                            self._observe(self._durations, (name, outcome), at, started)
                    if target is _STOPPING:
                        stopping_at[task_id] = at
                    continue
            # 直方图的一次观测（排队等待 / 停止时延；尝试时长见 _observe）：落桶计数加一、和加上秒数。
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
        """尝试时长的一次观测（调用方持有锁）：落桶计数加一、和加上秒数。"""
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
            counts = dict.fromkeys(S, 0)
            counts.update(self._landed)
            used = dict.fromkeys(self._limits, 0)
            used[""] = 0
            limits = self._limits
            unheld, tags_of = self._unheld, self._tags
            for task_id, status in self._live.items():
                counts[status] += 1
                if status in _HOLDING and not (status is _PAUSED and task_id in unheld):
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
            labels = {"task": task, "from_status": source.value, "to_status": target.value}
            self._counter_sample(
                metric, labels, value, transitions_created[(task, source, target)], use_created
            )
        yield metric
        metric = new()
        for status, value in counts.items():
            metric.add_sample(metric.name, {"status": status.value}, float(value))
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
