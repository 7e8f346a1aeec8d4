"""Controller：一批任务的统一管理入口。

它持有任务定义的白名单、本进程里的 TaskRun 与并发额度；CLI 与任何看板都只是这一层的薄适配。

结构（为什么这样分）：

* 一个后台循环线程负责启动超时、旁路回写（进度/心跳/租约）、存储追平、指令轮询与管道协调——
  不是每个排队任务一个线程。调度就地进行：提交时在调用线程里，任务让出额度时在让出它的线程里，
  把空出的额度直接交给下一个排队任务（吞吐的关键路径上没有线程交接）。
* 任务的每次状态迁移经状态机监听器通知这里（在任务自己的锁内）：记账、写穿存储，让出额度时启动
  刚从就绪队列取出的任务。锁的规矩只有两条：控制器锁内从不拿任务锁（控制器锁是叶子锁）；持有任务锁
  时只会去拿"刚从就绪队列取出、尚未启动"的任务的锁——而持有那种任务锁的线程（停止/暂停一个排队任务）
  不会再去拿别的任务锁，所以不会成环。需要碰别的任务的后续工作（管道放行、连坐取消）交给后台循环。
* 控制器 = 本地调度 + 一个存储链接（``runtime/store_link.py``）。只在有 store 时才存在的一切——写穿每次
  迁移、续租、旁路回写、认领指令、节点登记、对不属于本进程的任务写指令、查询别的进程的任务、
  reconcile、check_cluster——都在 ``StoreLink`` 里；没有 store 时是 ``LocalLink``（空对象），所以这里
  没有"有没有存储"的分支。链接只有自己的叶子锁，它的方法都在控制器锁之外调用（``forget`` 除外，
  它只拿写穿自己的叶子锁）。
* 管道只通过 ``PipelineHost`` 协议（解析名字、提交节点、交后续工作）用到控制器。
"""

from __future__ import annotations

import _thread
import collections
import contextlib
import contextvars
import itertools
import logging
import os
import socket
import threading
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, ParamSpec, TypeVar

from chongming_task.clock import SYSTEM_CLOCK, Clock
from chongming_task.core.archive import ArchiveSummary, Retention
from chongming_task.core.closing import ClosesOnExit
from chongming_task.core.locks import YieldingLock
from chongming_task.core.numbers import check_int, check_seconds
from chongming_task.core.recipes import OnLost, Recipe
from chongming_task.core.records import (
    MAX_ID_LENGTH,
    MAX_PRIORITY,
    MIN_PRIORITY,
    check_storable_changes,
    check_tag_count,
    copy_with,
    validate_task_id,
)
from chongming_task.core.state_machine import StateMachine
from chongming_task.core.storage.claiming import start_record
from chongming_task.errors import ConfigurationError, DuplicateTaskId, TaskError
from chongming_task.models import Outcome, TaskSnapshot, Transition, normalize_tags
from chongming_task.policies import DEFAULT_NUM_BUCKETS, BucketPolicy, ConcurrencyPolicy, RetryPolicy, Timeout
from chongming_task.runtime.cluster import DEFAULT_ORPHAN_LIMIT, ClusterReport
from chongming_task.runtime.commands import remote_payload
from chongming_task.runtime.durable import (
    build_recipe,
    check_durable_flag,
    enqueue_recipe,
    recipe_timeout,
    requeue,
)
from chongming_task.runtime.events import EventHub, Listener, ProgressEvent, StoreErrorEvent
from chongming_task.runtime.executors.base import Executor
from chongming_task.runtime.gc_pause import gc_paused
from chongming_task.runtime.interruptible import join_thread, wait_slice
from chongming_task.runtime.persistence import PersistFailure
from chongming_task.runtime.pipeline import Pipeline, PipelineRun, submit_pipeline
from chongming_task.runtime.pipeline_host import NodeSubmit
from chongming_task.runtime.reconcile import ReconcileReport
from chongming_task.runtime.registry import TaskDefinition, TaskRegistry
from chongming_task.runtime.scheduler import SlotScheduler
from chongming_task.runtime.signature import check_task_signature
from chongming_task.runtime.store_link import NOTIFIED_POLL_INTERVAL, LocalLink, StoreLink
from chongming_task.runtime.table import render_table
from chongming_task.runtime.taskrun import DEFAULT_EXECUTOR, TaskRun
from chongming_task.runtime.worker import (
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_POLL_INTERVAL,
    ClaimChain,
    ServeReport,
    Worker,
)
from chongming_task.states import SLOT_HOLDING_STATUSES, TERMINAL_STATUSES, TaskStatus
from chongming_task.storage import CommandAction, QueryOrder, SaveRequest, TaskQuery, TaskStats, TaskStore

logger = logging.getLogger("chongming_task.controller")

MIN_LEASE_TTL = 0.1
"""lease_ttl 的下限（秒）：每 lease_ttl/3 续租一次，再短就是对存储的空转。"""

MIN_INTERVAL = 0.01
"""command_poll_interval / side_channel_interval 的下限（秒）：再短的间隔只会让后台循环空转。"""

# submit() 自己用的关键字；其余关键字参数原样交给任务。
SUBMIT_KEYWORDS = ("task_id", "label", "tags", "priority", "bucket_key", "durable")

DEFAULT_SUBMIT_BATCH = 1000
"""submit_many 每个写事务建几个任务。"""

MAX_SUBMIT_BATCH = 10_000

GC_PAUSE_MIN_TASKS = 1000
"""submit_many 一次至少这么多个任务才在构造与落库期间暂停循环 GC（runtime/gc_pause.py）；wait_all 返回
至少这么多个结果时，造结果列表期间同样暂停。"""


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _weakly(method: Callable[_P, _R], default: _R) -> Callable[_P, _R]:
    """控制器的绑定方法 → 只弱引用控制器的可调用对象；控制器已被回收时返回 ``default``。

    给存储链接的回调（它们由控制器持有的链接保存）：回调直接是绑定方法的话，控制器 → 链接 → 绑定方法 →
    控制器是一个环，关掉、没人引用的控制器（连同它的全部任务）只能等循环 GC 的全量回收（issue 17）。
    这些回调都不在每次迁移的热路径上（后台循环、指令轮询、写失败）。"""
    ref = weakref.WeakMethod(method)

    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        bound = ref()
        return default if bound is None else bound(*args, **kwargs)

    return call


def _released_transition(run: TaskRun, snapshot: TaskSnapshot, record: Transition) -> None:
    """关掉的控制器不再给新句柄挂自己的迁移钩子（关掉之后造出的句柄在登记时就被拒绝）。"""


def _released_progress(snapshot: TaskSnapshot) -> None:
    """同上：进度钩子。"""


class Submit:
    """``Controller.submit_many`` 的一项：参数与 ``submit`` 一模一样（名字、位置参数、提交参数、其余
    关键字参数交给任务），只是先记下来，批量落库::

        c.submit_many([Submit("etl", day=d, task_id=f"etl-{d}") for d in days])
    """

    __slots__ = ("args", "fields", "kwargs", "name")

    def __init__(
        self,
        name: str,
        /,
        *args: Any,
        task_id: str | None = None,
        label: str | None = None,
        tags: Iterable[str] = (),
        priority: int | None = None,
        bucket_key: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.name = name
        self.args = args
        self.kwargs = kwargs
        # 提交参数原样留给 submit 的那一步（Controller._prepare 的同名关键字参数）。
        self.fields: dict[str, Any] = {
            "task_id": task_id,
            "label": label,
            "tags": tags,
            "priority": priority,
            "bucket_key": bucket_key,
        }

    @property
    def task_id(self) -> str | None:
        task_id: str | None = self.fields["task_id"]
        return task_id

    def __repr__(self) -> str:
        return f"Submit({self.name!r}, task_id={self.task_id!r})"


ARTIFACT_HINT = "请给 Controller(artifact_dir=...) 传产物根目录（它管的每个任务在其下各有一个目录）"
"""Controller 管的任务没配产物目录时的提示：指向 Controller 自己的参数，而不是 TaskRun 的。"""


_CLOSED = "控制器已关闭（close() 之后不再接受提交）；请新建一个 Controller"
"""关闭之后再提交、入队或接手任务得到的错误：处处同一句。"""

# 占着执行槽、载体在跑的状态（不含 paused：排队中暂停的任务从未占槽，要走下面的完整判定）。
_STILL_RUNNING = frozenset(SLOT_HOLDING_STATUSES - {TaskStatus.PAUSED})
# 每个任务都要走的记账路径上用到的成员存成模块常量：读枚举类的属性在 3.11 上经一个慢钩子（约 170 ns，见
# core/statuses.py 的说明）。其余代码照旧写 TaskStatus.X。
_QUEUED = TaskStatus.QUEUED
_STARTING = TaskStatus.STARTING
_PAUSED = TaskStatus.PAUSED
_STOPPING = TaskStatus.STOPPING
_NOT_YET_STARTED = frozenset({TaskStatus.QUEUED, TaskStatus.RETRY_WAIT})


# 每个任务一把的锁（状态机与 TaskRun 共用）：直接是 C 实现的 RLock 类型。threading.RLock 是包着它的一个
# Python 函数（*args / **kwargs 转一手），每个提交多一层调用（issue 17）。
_new_task_lock = _thread.RLock

_SUBMIT_SHAPES_MAX = 64
"""逐个 submit() 的快照模板最多存这么多种形状（满了清空）：常见用法只有几种形状，逐任务不同的 label 只是
不再命中模板（每次照常逐字段校验），内存不随提交数增长。"""


class _Hold:
    """一次 ``holding_slots`` 预留的槽还剩几个没交出去（``host_started`` 每占一个减一；退出时放掉剩下的）。"""

    __slots__ = ("remaining",)

    def __init__(self, count: int) -> None:
        self.remaining = count


class _QuietWakes(threading.local):
    """（每条线程一份）``Controller.release_nodes`` 正在放行一批节点：``depth`` 是嵌套层数，``missed``
    记下这一批里省掉的叫醒（批末补叫一次）。"""

    depth = 0
    missed = False


def default_owner() -> str:
    """默认的发起者/持有者标识：主机名:pid，便于事后追溯是谁按的停止。"""
    return f"{socket.gethostname()}:{os.getpid()}"


def _status_set(status: object) -> frozenset[TaskStatus] | None:
    if status is None:
        return None
    if isinstance(status, (str, TaskStatus)):
        return frozenset({_one_status(status)})
    if isinstance(status, Iterable):
        return frozenset(_one_status(s) for s in status)
    raise ConfigurationError(f"status 必须是 TaskStatus、状态名或它们的集合，收到 {status!r}")


def _one_status(value: object) -> TaskStatus:
    if isinstance(value, TaskStatus):
        return value
    if isinstance(value, str) and value in TaskStatus._value2member_map_:
        return TaskStatus(value)
    # 不让 enum 的 ValueError 漏给调用方：说清楚有哪些状态名
    names = "、".join(status.value for status in TaskStatus)
    raise ConfigurationError(f"未知的状态 {value!r}；可选：{names}")


def _batch_stopped(failed: TaskError, *, submitted: int, missing: int) -> TaskError:
    """submit_many 停下时的错误：同一种异常（DuplicateTaskId 仍是 DuplicateTaskId），消息说清楚停在哪。"""
    text = (
        f"批量提交已停止：{submitted} 个任务已提交（list_tasks 可见），{missing} 个没写进存储；原因：{failed}"
    )
    try:
        stopped = type(failed)(text)
    except TypeError:  # 构造参数不是一条消息的异常：原样抛出
        return failed
    stopped.__cause__ = failed
    return stopped


class Controller(ClosesOnExit):
    """管理一批任务：登记、提交、调度、查询、控制、持久化与重启恢复。"""

    def __init__(
        self,
        max_parallel: int | None = None,
        *,
        concurrency: ConcurrencyPolicy | None = None,
        max_parallel_per_bucket: int | None = None,
        num_buckets: int = DEFAULT_NUM_BUCKETS,
        executor: Any = None,
        owner: str | None = None,
        owned_buckets: Iterable[int] | None = None,
        clock: Clock | None = None,
        store: TaskStore | None = None,
        lease_ttl: float = 30.0,
        graceful_stop: float = 5.0,
        artifact_dir: str | Path | None = None,
        command_poll_interval: float = 0.1,
        side_channel_interval: float = 1.0,
        keep_finished: int | None = None,
        listeners: Iterable[Listener] = (),
        persist_logs: bool = True,
        retention: Retention | None = None,
    ) -> None:
        concurrency = concurrency if concurrency is not None else ConcurrencyPolicy()
        if not isinstance(concurrency, ConcurrencyPolicy):
            raise ConfigurationError(f"concurrency 必须是 ConcurrencyPolicy(...)，收到 {concurrency!r}")
        if max_parallel is not None:
            check_int("max_parallel", max_parallel, low=1)
            if concurrency.max_parallel is not None and concurrency.max_parallel != max_parallel:
                raise ConfigurationError(
                    f"max_parallel={max_parallel} 与 concurrency.max_parallel={concurrency.max_parallel} "
                    "不一致；只给一处即可"
                )
        effective_parallel = max_parallel if max_parallel is not None else concurrency.max_parallel
        if max_parallel_per_bucket is not None:
            check_int("max_parallel_per_bucket（不限请传 None）", max_parallel_per_bucket, low=1)
        # 每个时长都是有限的、有上下限的秒数（core/numbers.py 的唯一数值检查点）。NaN 的间隔会让后台循环
        # 的期限永远"已到"（空转占满 CPU）或永远不到（跨进程指令永远不被认领），inf / 1e308 的租约在提交时
        # 才变成 OverflowError——都在构造时拒绝。间隔的下限防的是同一种空转。
        lease_ttl = check_seconds("lease_ttl", lease_ttl, low=MIN_LEASE_TTL, low_open=False)
        graceful_stop = check_seconds("graceful_stop", graceful_stop)
        command_poll_interval = check_seconds(
            "command_poll_interval", command_poll_interval, low=MIN_INTERVAL, low_open=False
        )
        side_channel_interval = check_seconds(
            "side_channel_interval", side_channel_interval, low=MIN_INTERVAL, low_open=False
        )
        if executor is not None and getattr(executor, "blocking", False):
            raise ConfigurationError(
                "Controller 不能使用 InlineExecutor：它在调用线程里同步跑完任务，会把调度器本身卡住，"
                "也无法被暂停。请用 ThreadExecutor()（默认）或 ProcessExecutor()；"
                "需要同步、确定性的单个执行时直接用 run_task(..., executor=InlineExecutor())"
            )
        if keep_finished is not None:
            check_int("keep_finished（不限请传 None）", keep_finished, low=0)
        if store is not None and not isinstance(store, TaskStore):
            raise ConfigurationError(
                f"store 必须是 TaskStore 的实例（如 SqliteTaskStore(...)），收到 {store!r}"
            )
        if callable(listeners) or isinstance(listeners, (str, bytes)):
            raise ConfigurationError(f"listeners 必须是监听器的列表（如 listeners=[fn]），收到 {listeners!r}")
        if not isinstance(persist_logs, bool):
            raise ConfigurationError(f"persist_logs 必须是 True 或 False，收到 {persist_logs!r}")
        if retention is not None and not isinstance(retention, Retention):
            raise ConfigurationError(f"retention 必须是 Retention(...)，收到 {retention!r}")
        if retention is not None and store is None:
            raise ConfigurationError("retention 需要存储：只有 Controller(store=...) 才有历史可归档")
        if owner is not None and (not isinstance(owner, str) or not owner.strip()):
            raise ConfigurationError(f"owner 必须是非空字符串，收到 {owner!r}")

        self.concurrency = concurrency
        self.max_parallel = effective_parallel
        self.max_parallel_per_bucket = max_parallel_per_bucket
        self.bucket_policy = BucketPolicy(num_buckets)
        self.owned_buckets: frozenset[int] | None = (
            None if owned_buckets is None else self.bucket_policy.validate_buckets(owned_buckets)
        )
        if self.owned_buckets is not None and not self.owned_buckets:
            raise ConfigurationError(
                "owned_buckets 不能为空集合：不负责任何桶的节点提交不了任务；不想限定请传 None"
            )
        self.owner = owner or default_owner()
        self.lease_ttl = lease_ttl
        self.clock: Clock = clock or SYSTEM_CLOCK
        self.graceful_stop = float(graceful_stop)
        self.artifact_dir = Path(artifact_dir) if artifact_dir is not None else None
        self.executor = executor
        # 常驻节点的内存上限：已落地任务的句柄只留最新这么多个（有存储时旧的仍可经 get()/list_tasks 查到）。
        # 不设时一直留着，直到调用 prune()——长期运行的进程里，句柄越积越多，循环 GC 也越来越慢。
        self.keep_finished = keep_finished

        # 自动生成的 task_id：每个控制器一个随机前缀 + 递增序号（不必每次都取系统随机数）。
        self._id_prefix = os.urandom(3).hex()
        self._id_counter = itertools.count(1)
        self._registry = TaskRegistry()
        self._scheduler = SlotScheduler(
            max_parallel=effective_parallel, tag_limits=concurrency.limits, per_bucket=max_parallel_per_bucket
        )
        # 两个执行槽的线程每个任务都要拿几次这把锁（临界区只是内存里的记账）：普通 Lock 在 GIL 下会排成车队，
        # 每次加锁两次上下文切换（见 core/locks.py）。
        self._lock = YieldingLock()
        # Condition 只用底层锁的 acquire / release（鸭子类型）；typeshed 只列了内置锁类型。
        self._settled = threading.Condition(self._lock)  # type: ignore[arg-type]
        self._runs: dict[str, TaskRun] = {}
        self._reserved_ids: set[str] = set()
        # 逐个 submit() 的快照模板（见 _prepare 的 shapes）：按形状存一台不属于任何任务的、刚入队的状态机。
        # 有上限（满了整个清空重来）：形状里含 label 等用户值，逐任务不同的 label 不能让它无限长大。
        self._submit_shapes: dict[tuple[Any, ...], StateMachine] = {}
        # worker 正在认领 / 接手持久任务的调用数（见 claiming）：这期间存储里已归本节点、本进程还没登记的任务
        # 可能正是刚认领来的，它们的指令交还、下一轮再取，而不是当成同名前任留下的、扣到指令租约到期。
        self._claims_in_flight = 0
        self._unfinished: set[str] = set()
        self._terminal_order: list[str] = []
        self._closed = False
        self._wake = threading.Event()
        # 提交线程是否就地启动拿到额度的任务。存储的组提交有几个并行的写者时不：提交线程的 create 与 starting
        # 两次提交不排在同一条链上，starting 交给后台循环（或正让出额度的任务线程）。本地 / 单写者（SQLite、
        # Postgres：一个写者，create 与排着的 save 同一批提交）照旧就地启动：多一次线程交接换不来并行的提交。
        self._start_on_submit = store is None or not store.group_commit or store.group_commit_writers <= 1
        # worker（runtime/worker.py）等空槽用的事件：任务让出执行槽的那一刻就置位（见 watch_slots）。
        self._slot_watchers: tuple[threading.Event, ...] = ()
        self._claim_holds = threading.local()  # 每个认领线程当前那一次 holding_slots 的预留（_Hold）
        self._quiet_wakes = _QuietWakes()  # 本线程正在 release_nodes 里：入队不逐个叫醒后台循环（见那里）
        # worker 登记的"空出的槽接着认领"（见 chain_claims / _chain_next）与此刻正在做的次数（撤下时等它们）。
        self._claim_chain: ClaimChain | None = None
        self._chains_in_flight = 0
        self._chains_idle = threading.Condition(self._lock)  # type: ignore[arg-type]
        self._stop_loop = threading.Event()
        # 监听器在任务锁内运行，不能回调别的任务；需要碰别的任务的后续工作（管道放行/连坐）放到这里，
        # 由后台循环在任何锁之外按顺序执行。
        self._deferred: collections.deque[Callable[[], None]] = collections.deque()
        # 公开的事件钩子（runtime/events.py）：监听器在专用交付线程里、任何锁之外被调用。
        self._events = EventHub(name=f"chongming-events[{self.owner}]")
        self._events.add_all(listeners)
        self._progress_hook = self._on_progress  # 绑定一次，所有任务共用（不为每个任务造一个绑定方法）
        self._run_transition = self._on_run_transition  # 同上：所有任务共用这一个迁移钩子
        self._link: LocalLink = (
            LocalLink()
            if store is None
            else StoreLink(
                store,
                owner=self.owner,
                owned_buckets=self.owned_buckets,
                bucket_policy=self.bucket_policy,
                clock=self.clock,
                lease_ttl=lease_ttl,
                command_poll_interval=command_poll_interval,
                side_channel_interval=side_channel_interval,
                wake=self._wake,
                # 链接的回调只弱引用控制器（_weakly）：不与控制器成环，关掉、没人引用的控制器由引用计数释放。
                live_ids=_weakly(self._live_ids, []),
                side_snapshots=_weakly(self._side_snapshots, []),
                local_run=self._runs.get,
                on_persist_failure=_weakly(self._on_persist_failure, None),
                persist_logs=persist_logs,
                any_live=_weakly(self._any_live, False),
                arriving=_weakly(self._arriving, False),
            )
        )
        self.retention = retention
        self.last_retention: ArchiveSummary | None = None
        """最近一次完成的定期归档的结果（``retention`` 没开时一直是 None）。"""
        self._retention_due: float | None = None if retention is None else self.clock.monotonic()
        self._retention_thread: threading.Thread | None = None
        self._loop = threading.Thread(
            target=self._background_loop, name=f"chongming-controller[{self.owner}]", daemon=True
        )
        self._loop.start()

    @property
    def store(self) -> TaskStore | None:
        """构造时给的存储（没有时为 None）。"""
        return self._link.store

    # -- buckets ------------------------------------------------------------------------------------

    @property
    def owns_all_buckets(self) -> bool:
        """不构成划分：不限定，或显式覆盖了全部桶。"""
        return self.owned_buckets is None or len(self.owned_buckets) == self.bucket_policy.num_buckets

    def owns_bucket(self, bucket: int) -> bool:
        return self.owned_buckets is None or bucket in self.owned_buckets

    def _owned_text(self) -> str:
        owned = sorted(self.owned_buckets or ())
        if len(owned) > 6 and owned == list(range(owned[0], owned[-1] + 1)):
            return f"[{owned[0]}, {owned[1]}, ..., {owned[-1]}]"
        return str(owned)

    def _bucket_for_submit(self, bucket_key: str | None) -> int | None:
        if bucket_key is None:
            if not self.owns_all_buckets:
                raise ConfigurationError(
                    f"本节点只负责部分桶 {self._owned_text()}，提交时必须给出 bucket_key："
                    "没有归属桶的任务不会有任何节点认领它，只会永远排队"
                )
            return None
        bucket = self.bucket_policy.bucket_for(bucket_key)
        if not self.owns_bucket(bucket):
            raise ConfigurationError(
                f"桶 {bucket}（来自 bucket_key={bucket_key!r}）不属于本节点；"
                f"本节点负责 {self._owned_text()}。"
                "任务若写进别人的桶，不会有任何节点执行它。"
            )
        return bucket

    def active_in_bucket(self, bucket: int) -> int:
        with self._lock:
            return self._scheduler.active_in_bucket(bucket)

    # -- registry -----------------------------------------------------------------------------------

    def register(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        tags: Iterable[str] | None = None,
        retry: RetryPolicy | None = None,
        timeout: Timeout | None = None,
        description: str | None = None,
        durable: bool | None = None,
        on_lost: OnLost | str | None = None,
    ) -> TaskDefinition:
        """``durable`` / ``on_lost``：持久任务的默认（None 取 @task 的；用户指南 §9.9）。"""
        with self._lock:
            return self._registry.register(
                name,
                fn,
                tags=tags,
                retry=retry,
                timeout=timeout,
                description=description,
                durable=durable,
                on_lost=on_lost,
            )

    def register_module(self, module: ModuleType) -> list[TaskDefinition]:
        with self._lock:
            return self._registry.register_module(module)

    def register_all(self, *fns: Callable[..., Any]) -> list[TaskDefinition]:
        with self._lock:
            return [self._registry.register_decorated(fn) for fn in fns]

    def definitions(self) -> list[TaskDefinition]:
        with self._lock:
            return list(self._registry)

    @property
    def registered_names(self) -> frozenset[str]:
        """已登记的任务名（worker 按它认领）。

        不拿锁：登记时整个换成新集合，读到的总是某次登记之后的完整集合。"""
        return self._registry.names

    # -- submit -------------------------------------------------------------------------------------

    def submit(
        self,
        name: str,
        *args: Any,
        task_id: str | None = None,
        label: str | None = None,
        tags: Iterable[str] = (),
        priority: int | None = None,
        bucket_key: str | None = None,
        durable: bool | None = None,
        **kwargs: Any,
    ) -> TaskRun:
        """按名字提交（只接受登记过的名字）。返回 TaskRun 句柄；任务先排队，有额度时才执行。

        ``task_id`` / ``label`` / ``tags`` / ``priority`` / ``bucket_key`` / ``durable`` 是提交参数，
        其余关键字参数交给任务。``durable=True``（None 取任务定义的）：连同配方落库——参数必须能经 JSON
        原样往返，否则 ConfigurationError；本进程照常执行它，进程死后别的 worker 能接手（§9.9）。
        """
        run = self._prepare(
            name,
            args,
            kwargs,
            task_id=task_id,
            label=label,
            tags=tags,
            priority=priority,
            bucket_key=bucket_key,
            durable=check_durable_flag(durable),
            shapes=self._submit_shapes,
        )
        self._write_then_admit(run, self._link.create, created=True, start_here=self._start_on_submit)
        return run

    def enqueue(
        self,
        name: str,
        *args: Any,
        task_id: str | None = None,
        label: str | None = None,
        tags: Iterable[str] = (),
        priority: int | None = None,
        bucket_key: str | None = None,
        on_lost: OnLost | str | None = None,
        **kwargs: Any,
    ) -> str:
        """只入队、不执行：写下一个 ``queued``、无人持有的持久任务，返回它的 task_id（用户指南 §9.9）。

        由负责它所在桶、登记了这个名字的 worker（``serve()`` / ``chongming-task worker``）认领执行。名字在本
        控制器上登记过时，重试次数、超时与参数签名按登记的定义检查；没登记也可以入队（纯提交者不必有代码），
        只是要等某个登记了它的 worker。需要 store。
        """
        store = self._link.store
        if store is None:
            raise ConfigurationError(
                "enqueue() 需要共享存储：任务要由别的 worker 认领，请用 Controller(store=...) 构造"
            )
        if self._closed:
            raise ConfigurationError(_CLOSED)
        validate_task_id(name, what="任务名")
        with self._lock:
            definition = self._registry.resolve(name) if name in self._registry else None
        if definition is not None:
            check_task_signature(definition.fn, args, kwargs)
        base_tags = definition.tags if definition is not None else frozenset()
        priority, all_tags = self._submit_fields(label, priority, tags, base_tags)
        # 提交者往任何桶里放都可以（它不执行）：桶只决定哪个 worker 来认领。
        bucket = None if bucket_key is None else self.bucket_policy.bucket_for(bucket_key)
        recipe = build_recipe(
            definition, name, args, kwargs, tags=all_tags, priority=priority, bucket_key=bucket_key,
            on_lost=on_lost,
        )  # fmt: skip
        if task_id is None:
            task_id = f"{name}-{self._id_prefix}{next(self._id_counter):06d}"
        return enqueue_recipe(
            store,
            recipe,
            task_id=task_id,
            clock=self.clock,
            bucket=bucket,
            label=label,
            description=definition.description if definition is not None else None,
            issuer=self.owner,
        )

    def _submit_fields(
        self, label: object, priority: int | None, tags: Iterable[str], base_tags: frozenset[str]
    ) -> tuple[int, frozenset[str]]:
        """submit / enqueue 共用的提交参数检查：label、priority（None 取默认）、标签（并上定义里的）。"""
        if label is not None and not isinstance(label, str):
            raise ConfigurationError(f"label 必须是字符串，收到 {label!r}")
        if priority is None:
            priority = self.concurrency.priority
        else:
            check_int("priority（越大越先执行）", priority, low=MIN_PRIORITY, high=MAX_PRIORITY)
        if tags.__class__ is tuple and not tags:  # 最常见：没有额外标签（提交热路径上省掉规范化）
            return priority, base_tags
        extra_tags = normalize_tags(tags)
        return priority, check_tag_count(base_tags | extra_tags) if extra_tags else base_tags

    def _prepare(
        self,
        name: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        task_id: str | None,
        label: str | None,
        tags: Iterable[str],
        priority: int | None,
        bucket_key: str | None,
        pipeline_id: str | None = None,
        node_id: str | None = None,
        upstream: Any = None,
        blocked: bool = False,
        durable: bool | None = None,
        shapes: dict[tuple[Any, ...], StateMachine] | None = None,
    ) -> TaskRun:
        """提交的前一半：检查参数、造状态机与句柄（还没有落库、没有登记）。

        ``shapes``（``submit_many`` 给的、这一次调用独有的字典）：同一批里除 task_id 与创建时间外字段都相同
        的任务，新建快照只校验一次——第一个照常经 ``TaskSnapshot`` 的逐字段校验建出、入队，它的状态机存作模板；
        其余的由 ``StateMachine.sibling`` 从模板不经校验地复制（已是 queued，连第一条迁移一起），只校验各自的
        task_id。十万个任务的批量提交里，逐字段校验与第二份快照是每任务几微秒的固定开销，而它们查的是同一组值。
        带配方的持久任务（配方里有各自的参数）不走模板；blocked 的管道节点走自己的模板（``_prepare_node``）。

        逐个 ``submit()`` 给的是控制器常驻的 ``_submit_shapes``（有上限）：模板是一台另复制的、不属于任何任务
        的状态机（提交的那台马上要启动），复制出的新任务换上此刻算的租约。用户给的值照样先经一次完整校验才会
        成为模板，之后命中模板的是与它相等的值，校验结果相同（task_id 每次单独校验）。
        """
        # 不拿控制器锁：关闭与否只是提前报错（占 id 的 _reserve 在锁内复查，关闭之后的提交一个也进不来），
        # 登记表按名字取是一次字典读（登记在锁内整项放入，读到的要么没有、要么是完整的定义）。每个提交少一次
        # 加锁（issue 17）。
        if self._closed:
            raise ConfigurationError(_CLOSED)
        definition = self._registry.resolve(name)
        priority, all_tags = self._submit_fields(label, priority, tags, definition.tags)
        # 不分桶、不限定归属（最常见）时桶就是 None，不为它调用 _bucket_for_submit（结果与报错都相同）。
        bucket = (
            None if bucket_key is None and self.owned_buckets is None else self._bucket_for_submit(bucket_key)
        )
        # 自动生成的 id = 登记时校验过的任务名 + "-" + 十六进制前缀 + 序号：只可能在长度上不合格（名字接近上限
        # 时），其余规则（非空、无 NUL、可用 UTF-8 表示）由名字本身保证。所以只有给定的、或超长的才再校验。
        if task_id is None:
            task_id = f"{definition.name}-{self._id_prefix}{next(self._id_counter):06d}"
            checked_id = len(task_id) <= MAX_ID_LENGTH
        else:
            checked_id = False
        retry = definition.retry
        recipe = None
        if durable if durable is not None else definition.durable:
            if pipeline_id is not None:
                raise ConfigurationError(
                    "管道节点不能是持久任务：管道的编排状态不落库，节点无法被别的进程接手"
                )
            recipe = build_recipe(
                definition,
                definition.name,
                args,
                kwargs,
                tags=all_tags,
                priority=priority,
                bucket_key=bucket_key,
            )
        max_attempts = retry.max_attempts if retry is not None else 1
        shape = None
        if shapes is not None and recipe is None and not blocked:
            shape = (
                definition.name,
                definition.description,
                max_attempts,
                label,
                all_tags,
                priority,
                bucket,
                bucket_key,
                pipeline_id,
                node_id,
            )
        elif blocked and shapes is not None and recipe is None:
            return self._prepare_node(
                definition, args, kwargs, shapes, task_id, label, all_tags, priority, bucket, bucket_key,
                pipeline_id, node_id, max_attempts, upstream,
            )  # fmt: skip
        template = None if shape is None else shapes.get(shape)  # type: ignore[union-attr]
        single = shapes is self._submit_shapes
        if template is not None:
            if not checked_id:
                validate_task_id(task_id)
            # 逐个提交的任务各自带此刻算的租约（批量的沿用模板的，由 create_many 按 _lease_floor 复核）。
            lease = self._link.lease_fields() if single else None
            machine = template.sibling(task_id, lock=_new_task_lock(), lease=lease)  # 已是 queued
            return self._make_run(machine, definition, args, kwargs, upstream=upstream)
        machine = self._new_machine(
            definition, task_id, max_attempts, label, all_tags, priority, bucket, bucket_key, pipeline_id,
            node_id, recipe, self._link.lease_fields(),
        )  # fmt: skip
        if blocked:
            machine.mark_blocked()
        else:
            machine.mark_queued()
            if shape is not None:
                assert shapes is not None  # 有 shape 就有 shapes（见上）
                if not single:
                    shapes[shape] = machine
                else:
                    # 逐个提交：这台状态机马上要登记、启动，不能当模板（sibling 只从刚入队的复制）——存一台
                    # 同形状的、不属于任何任务的复制品。
                    if len(shapes) >= _SUBMIT_SHAPES_MAX:
                        shapes.clear()
                    shapes[shape] = machine.sibling(task_id)
        return self._make_run(machine, definition, args, kwargs, upstream=upstream)

    def _new_machine(
        self,
        definition: TaskDefinition,
        task_id: str,
        max_attempts: int,
        label: str | None,
        all_tags: frozenset[str],
        priority: int,
        bucket: int | None,
        bucket_key: str | None,
        pipeline_id: str | None,
        node_id: str | None,
        recipe: Recipe | None,
        lease: Mapping[str, Any],
    ) -> StateMachine:
        """新任务的状态机（pending，快照经完整校验）：提交参数之外的字段（执行者、描述、本节点的租约）由这里
        一处给出，逐个提交与管道节点都经它建第一份。``lease`` 是 ``lease_fields()``：有存储时快照一开始就
        带着本节点的租约（create 不必再复制快照）。"""
        return StateMachine.create(
            task_id,
            definition.name,
            max_attempts=max_attempts,
            clock=self.clock,
            lock=_new_task_lock(),
            label=label,
            tags=all_tags,
            priority=priority,
            bucket=bucket,
            bucket_key=bucket_key,
            owner=self.owner,
            description=definition.description,
            pipeline_id=pipeline_id,
            node_id=node_id,
            recipe=recipe,
            **lease,
        )

    def _prepare_node(
        self,
        definition: TaskDefinition,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        shapes: dict[tuple[Any, ...], Any],
        task_id: str,
        label: str | None,
        all_tags: frozenset[str],
        priority: int,
        bucket: int | None,
        bucket_key: str | None,
        pipeline_id: str | None,
        node_id: str | None,
        max_attempts: int,
        upstream: Any,
    ) -> TaskRun:
        """管道节点（``submit_nodes``）的 ``_prepare`` 后一半：同一条管道里除 task_id / label /
        node_id 外字段都相同的节点，新建快照只完整校验一次。

        为什么：节点以 blocked 建出，不能用 ``StateMachine.sibling``（它只复制刚入队的任务），
        而逐个 ``StateMachine.create`` 的逐字段校验（造冻结快照、``__post_init__``）是建节点的
        大头——一万个节点的管道里每个节点约七百条字节码。第一个节点照常经 ``TaskSnapshot`` 的
        完整校验建出，它 pending 时的快照存作模板；其余的复制模板、换上自己的 task_id / label /
        node_id 与此刻的创建时间（有存储时还有此刻的租约），只把换上的值再校验一遍：task_id 经
        ``validate_task_id``，label 与 node_id 经 ``check_storable_changes``（快照构造对这两个
        字段做的就是这一项；label 是不是字符串已由 ``_submit_fields`` 查过）——它只查与模板不是
        同一个对象的字段（整份的 ``check_storable_fields`` 每个节点约两百条字节码，多半在重查模板里
        查过的那十来个字段），其余字段与模板相同、已校验过。状态机由这份 pending 快照构造、照常
        ``mark_blocked``（第一条迁移与 create 出来的一样）。
        """
        shape = (
            definition.name,
            definition.description,
            max_attempts,
            all_tags,
            priority,
            bucket,
            bucket_key,
            pipeline_id,
        )
        template: TaskSnapshot | None = shapes.get(shape)
        lease = self._link.lease_fields()
        if template is None:
            machine = self._new_machine(
                definition, task_id, max_attempts, label, all_tags, priority, bucket, bucket_key,
                pipeline_id, node_id, None, lease,
            )  # fmt: skip
            shapes[shape] = machine.snapshot  # pending 的那一份（mark_blocked 换上的是新快照）
        else:
            validate_task_id(task_id)  # 完整建出的那一份由快照构造校验过
            changes: dict[str, Any] = {
                "task_id": task_id,
                "label": label,
                "node_id": node_id,
                "created_at": self.clock.now(),
            }
            if lease:
                changes.update(lease)
            snapshot = copy_with(template, changes)
            check_storable_changes(template, snapshot)  # 模板是整份查过的快照
            machine = StateMachine(snapshot, clock=self.clock, lock=_new_task_lock())
        machine.mark_blocked()
        return self._make_run(machine, definition, args, kwargs, upstream=upstream)

    def _make_run(
        self,
        machine: StateMachine,
        definition: TaskDefinition,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        upstream: Any = None,
        timeout: Timeout | None = None,
    ) -> TaskRun:
        """给一台状态机配上控制器的监听器与 TaskRun 句柄（新提交的，或认领 / 接手来的持久任务）。"""
        # 控制器的迁移处理经 TaskRun 的 on_transition 钩子调用，排在 TaskRun 自己的处理之前：TaskRun 在终态时
        # 叫醒 wait() 的调用方，到那一刻存储必须已经写穿（否则 wait() 返回后别的进程还读到旧状态）。钩子是
        # 控制器的同一个绑定方法（构造时建一次），不是每个任务一个监听器对象（issue 17）。
        # 经 TaskRun._controlled：这些值都由控制器构造 / 登记时查过（每次提交照样查参数签名）。
        return TaskRun._controlled(
            definition.fn,
            args,
            kwargs,
            machine=machine,
            executor=self.executor,
            retry=definition.retry,
            timeout=timeout if timeout is not None else definition.timeout,
            graceful_stop=self.graceful_stop,
            artifact_dir=self.artifact_dir,
            artifact_hint=ARTIFACT_HINT,
            clock=self.clock,
            upstream=upstream,
            on_requeue=self._requeue,
            on_transition=self._run_transition,
            on_progress=self._progress_hook,
            log_sink=self._link.log_sink,
        )

    def _reserve(self, runs: list[TaskRun]) -> None:
        """先占住这些 id（落库可能较慢，在锁外做）：重复的 id（已登记的、正在别的线程提交的、本批里
        重复的）→ DuplicateTaskId，一个也不占。"""
        with self._lock:
            if self._closed:
                raise ConfigurationError(_CLOSED)
            taken: set[str] = set()
            for run in runs:
                task_id = run.task_id
                self._refuse_taken_locked(task_id, taken)
                taken.add(task_id)
            self._reserved_ids.update(taken)

    def _reserve_one(self, run: TaskRun) -> None:
        """``_reserve([run])`` 的单个版本（逐个 submit 的热路径，不造列表与集合）；判定、报错相同。"""
        task_id = run.task_id
        # 每个提交都走：不经 with（YieldingLock 的 __enter__ / __exit__ 是两层 Python 调用，见 core/locks.py）
        lock = self._lock
        if not lock.try_acquire():
            lock.acquire()
        try:
            if self._closed:
                raise ConfigurationError(_CLOSED)
            self._refuse_taken_locked(task_id, ())
            self._reserved_ids.add(task_id)
        finally:
            lock.release()

    def _refuse_taken_locked(self, task_id: str, taken: Collection[str]) -> None:
        """（持控制器锁）id 已登记、正被别的线程提交、或在本批 ``taken`` 里 → DuplicateTaskId。"""
        existing = self._runs.get(task_id)
        if existing is not None or task_id in self._reserved_ids or task_id in taken:
            # 建议按已有任务的真实状态给（还在跑 / 已成功 / 已结束）；别的线程正在提交的算"仍在进行"
            status = existing.status if existing is not None else TaskStatus.QUEUED
            raise DuplicateTaskId.for_existing(task_id, status)

    def _write_then_admit(
        self, run: TaskRun, write: Callable[[StateMachine], None], *, created: bool, start_here: bool = True
    ) -> None:
        """单个任务：占住 id → 落库（``create``）或接着存储里的版本写（``track``）→ 登记、入队。

        占位由 ``_admit`` 在登记的同一次加锁里放掉（没有"两边都查不到"的窗口，也不为放占位再加一次锁）；
        只有写失败时才在这里放。"""
        self._reserve_one(run)
        try:
            write(run.machine)
        except BaseException:
            self._release_reserved([run])
            raise
        self._admit([run], blocked=False, created=created, start_here=start_here)

    def _release_reserved(self, runs: list[TaskRun]) -> None:
        with self._lock:
            self._reserved_ids.difference_update(run.task_id for run in runs)

    def _admit(
        self, runs: list[TaskRun], *, blocked: bool, created: bool = True, start_here: bool = True
    ) -> None:
        """提交的后一半（已落库）：登记、补发第一次迁移的事件（``created``：新建的；认领 / 接手来的持久任务
        没有要补发的）、按状态入队（接手来的可能是 paused / retry_wait），有额度就启动（``start_here``
        为 False 时交给后台循环启动）。"""
        # 同 _reserve_one：不经 with
        lock = self._lock
        if not lock.try_acquire():
            lock.acquire()
        try:
            # 占位一直留到登记进 _runs 的这一刻（同一次加锁）：中间没有"两边都查不到"的窗口；
            # 没能登记的（落库失败的）由调用方放掉（_write_then_admit / _submit_batches）。
            if len(runs) == 1:  # 逐个 submit：不为一个任务造生成器
                self._reserved_ids.discard(runs[0].task_id)
            else:
                self._reserved_ids.difference_update(run.task_id for run in runs)
            if self._closed:
                closed_meanwhile = True
            else:
                closed_meanwhile = False
                hub = self._events
                emit = created and bool(hub.listeners)
                # 提交者的上下文只为可能读 submit_context 的监听器拷贝（内置指标声明了不读，
                # 见 events.RAW_BATCH_ENTRY）：只有指标在听时每个提交省一个被 GC 追踪的 Context。
                context = contextvars.copy_context if emit and hub.wants_submit_context else None
                for run in runs:
                    machine = run.machine
                    self._runs[run.task_id] = run
                    self._unfinished.add(run.task_id)
                    if emit:
                        # 第一次迁移（pending → queued/blocked）发生在控制器挂上监听器之前，在这里补发；
                        # 必须在入队之前：入队后别的线程可能立刻启动它，它的 starting 事件不能抢在前面。
                        # 交出最后一条的紧凑形式（只有指标在听时不为它造 Transition，见 emit_packed）。
                        hub.emit_packed(
                            machine.snapshot, machine.packed_transitions()[-1], context() if context else None
                        )
                    if not blocked and machine.status is _QUEUED:
                        self._enqueue_locked(run)
            to_start = self._scheduler.take_runnable() if start_here else []
            if not start_here:
                self._wake.set()
        finally:
            lock.release()
        if closed_meanwhile:
            # 落库期间控制器被关闭：任务已写进存储，如实落 stopped（写穿），而不是留一个没人管的排队任务。
            for run in runs:
                run.stop(reason="控制器已关闭，任务未执行")
            raise ConfigurationError(_CLOSED)
        self._link.start_polling()  # 提交过任务的节点才认领指令、登记节点（幂等）
        if to_start:
            self._start_runs(to_start)

    def submit_many(
        self, submits: Iterable[Submit], *, batch_size: int = DEFAULT_SUBMIT_BATCH
    ) -> list[TaskRun]:
        """批量提交（用户指南 §9.8）：``[Submit("etl", day=d) for d in days]``，返回同样顺序的句柄。

        每个 ``Submit`` 的参数与 ``submit`` 一模一样；区别只在落库：每 ``batch_size`` 个任务一次写事务
        （``TaskStore.create_many``），而不是每个任务一次。全部参数先检查完（名字没登记、id 重复、参数
        不对 → 抛错，一个也不提交），再逐批落库、登记、入队。某一批里存储拒绝了某一项（别的进程已有
        同名任务）或这一批没能写进去：这一批里已写进存储的任务照常登记执行（存储里有的任务必须有人管），
        然后抛出那个错误，后面的批次不再提交——已提交的任务可以用 ``list_tasks`` 看到。
        """
        check_int("batch_size", batch_size, low=1, high=MAX_SUBMIT_BATCH)
        specs = list(submits)
        for index, spec in enumerate(specs):
            if not isinstance(spec, Submit):
                raise ConfigurationError(
                    f"submit_many() 的第 {index + 1} 项不是 Submit：收到 {spec!r}；"
                    '请写成 Submit("任务名", *args, task_id=..., **kwargs)'
                )
        shapes: dict[tuple[Any, ...], StateMachine] = {}
        # 一大批任务的对象全部活着、都不是垃圾：构造与落库期间暂停循环 GC，免得它反复全量扫描它们
        # （见 runtime/gc_pause.py；退出时含异常恢复原设置）。不到一批的不值得去碰进程级的 GC 开关。
        pause = gc_paused() if len(specs) >= GC_PAUSE_MIN_TASKS else contextlib.nullcontext()
        with pause:
            runs = [self._prepare_spec(spec, shapes) for spec in specs]
            return self._submit_batches(runs, batch_size, blocked=False)

    def _prepare_spec(
        self, spec: Submit, shapes: dict[tuple[Any, ...], StateMachine] | None = None
    ) -> TaskRun:
        return self._prepare(spec.name, spec.args, spec.kwargs, shapes=shapes, **spec.fields)

    def _submit_batches(self, runs: list[TaskRun], batch_size: int, *, blocked: bool) -> list[TaskRun]:
        self._reserve(runs)
        try:
            for start in range(0, len(runs), batch_size):
                batch = runs[start : start + batch_size]
                errors = self._link.create_many([run.machine for run in batch])
                written = [run for run, error in zip(batch, errors, strict=True) if error is None]
                if written:
                    self._admit(written, blocked=blocked)
                failed = next((error for error in errors if error is not None), None)
                if failed is not None:
                    missing = len(batch) - len(written)
                    raise _batch_stopped(failed, submitted=start + len(written), missing=missing)
        finally:
            self._release_reserved(runs)
        return runs

    # -- durable tasks: the worker's share (runtime/worker.py) ---------------------------------------

    def serve(
        self,
        stop: threading.Event | None = None,
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
    ) -> ServeReport:
        """作为 worker 运行（阻塞，直到 ``stop`` 置位）：认领、接手、重跑持久任务（用户指南 §9.9）。

        只认领本控制器登记了名字、落在 ``owned_buckets`` 里的任务，一次只认领空闲槽位
        （``max_parallel``）那么多个。
        停止时不再认领，交还还没开始的，等在跑的最多 ``drain_timeout`` 秒，到点仍在跑的走优雅停止。
        返回 ``ServeReport``（``drained`` 为 False 表示有任务是被停掉的）。
        """
        worker = Worker(self, poll_interval=poll_interval, drain_timeout=drain_timeout)
        report = worker.run(stop if stop is not None else threading.Event())
        if report.stopped_at_drain:
            self.stop_all(reason=f"worker 停止：{drain_timeout:g} 秒内没有跑完")
            with contextlib.suppress(TimeoutError):
                self.wait_all(timeout=self.graceful_stop + 2.0)
        return report

    def requeue(self, task_id: str, *, reason: str | None = None) -> TaskSnapshot:
        """把一个已结束（failed / stopped / cancelled / lost）的持久任务经审计的 retry() 复活、交回队列，
        由 worker 认领（``chongming-task retry``）。返回复活后的快照。需要 store。"""
        store = self._link.store
        if store is None:
            raise ConfigurationError("requeue() 需要共享存储：请用 Controller(store=...) 构造")
        if task_id in self._runs and not self._runs[task_id].done:
            raise ConfigurationError(f"任务 {task_id!r} 还在本进程里运行：只能重跑已结束的任务")
        return requeue(store, task_id, clock=self.clock, actor=self.owner, reason=reason)

    def start_serving(self) -> None:
        """worker 启动时：登记节点（带上本节点执行的任务名）、开始认领指令。"""
        self._link.serve_names([definition.name for definition in self.definitions()])

    def watch_slots(self, event: threading.Event) -> Callable[[], None]:
        """本地任务让出执行槽（落终态、进重试等待、排队中被停止或暂停）时置位 ``event``；返回取消的函数。

        worker 靠它在任务结束的那一刻去认领下一个：在控制器锁内、调度账本改动的同一处置位，不经事件交付
        线程（那样既要为每次迁移造事件对象，又可能在槽位真正归还之前就叫醒 worker，让它扑空再等一轮）。
        """
        with self._lock:
            self._slot_watchers = (*self._slot_watchers, event)

        def unwatch() -> None:
            with self._lock:
                self._slot_watchers = tuple(w for w in self._slot_watchers if w is not event)

        return unwatch

    def chain_claims(self, chain: ClaimChain | None) -> None:
        """worker 登记（``chain``）或撤下（None）"执行槽空出的那一刻、在那条线程上认领下一个"
        （见 ``_chain_next``）。撤下时等正在进行的那几次做完才返回：worker 随后交还、收尾（``_drain``），
        不能有一次认领在那之后才把任务开始起来。"""
        with self._lock:
            self._claim_chain = chain
            while chain is None and self._chains_in_flight:
                self._chains_idle.wait()

    def _slot_freed_locked(self) -> None:
        """（持有控制器锁）一个执行槽刚让出：叫醒 ``watch_slots`` 登记的 worker。"""
        for watcher in self._slot_watchers:
            watcher.set()

    def local_run(self, task_id: str) -> TaskRun | None:
        """本进程持有的任务句柄（没有返回 None）。"""
        return self._runs.get(task_id)

    def _any_live(self) -> bool:
        return bool(self._unfinished)

    def _arriving(self, task_id: str) -> bool:
        """这个任务是否正在变成本进程的（指令轮询问）：占着 id 正在落库，或者有一次认领 / 接手正在进行。"""
        return self._claims_in_flight > 0 or task_id in self._reserved_ids

    @contextlib.contextmanager
    def claiming(self) -> Iterator[None]:
        """worker 把"在存储里认领 / 接手 → ``host_durable`` 登记"包在这里面。

        为什么：认领那条语句一提交，任务在存储里就归本节点了，但要等 ``host_durable`` 才在本进程登记。指令按
        持有者认领，这个窗口里到达的指令（比如刚认领就有人 stop）会取到一个"归我、本地却没有"的任务——那本来
        是同名前任留下的任务的特征，指令会被扣到租约到期（默认 30 秒）。窗口内一律交还，下一轮（0.1 秒）再取。
        登记在控制器锁内完成、计数在登记之后才减，所以任何时刻一个认领来的任务要么算"正在来"，要么本地查得到。
        """
        with self._lock:
            self._claims_in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._claims_in_flight -= 1

    def _run_from_recipe(self, machine: StateMachine, definition: TaskDefinition) -> TaskRun:
        """worker 接管的两条路（``host_durable`` / ``host_started``）共用：参数与超时取自快照里的配方；
        本节点留着的同一 id 的旧终态句柄先让位（``_drop_stale_handle``）。"""
        recipe = machine.snapshot.recipe
        if recipe is None:
            raise ConfigurationError(f"任务 {machine.task_id!r} 没有配方，不是持久任务，不能由 worker 接管")
        self._drop_stale_handle(machine.task_id)
        return self._make_run(
            machine, definition, tuple(recipe.args), dict(recipe.kwargs), timeout=recipe_timeout(recipe)
        )

    def host_durable(self, machine: StateMachine, definition: TaskDefinition) -> TaskRun:
        """接管一个存储里已归本节点持有的持久任务（认领或接手来的）：接着存储里的版本写，按状态入队；
        参数与超时取自快照里的配方。"""
        run = self._run_from_recipe(machine, definition)
        # 不在调用方（worker 的认领线程）上就地启动：starting 那次提交交给后台循环（或正让出额度的任务线程）
        # 去做，认领线程马上回去认领下一个空位——认领与 starting 两次往返不再排在同一条线程上一前一后。
        self._write_then_admit(run, self._link.track, created=False, start_here=False)
        return run

    def _drop_stale_handle(self, task_id: str) -> None:
        """接管之前：本节点还留着这个 id 上一轮的终态句柄时（任务落了终态、又在别处被 ``retry`` 重新排队，
        再被本节点认领回来），丢掉那个旧句柄——存储里的新版本才是真相。不丢的话 ``_reserve`` 会把接管当成
        重复提交拒掉：认领时已写成 starting 的任务就卡在"被我持有"，直到租约过期被判 lost。
        只丢已落地的终态句柄；还在跑 / 还没落地的同名任务照旧按重复拒绝（那才是真的重复）。"""
        with self._lock:
            existing = self._runs.get(task_id)
            if existing is None or task_id in self._unfinished or not existing.snapshot.is_terminal:
                return
            del self._runs[task_id]
            with contextlib.suppress(ValueError):  # 已被 prune / keep_finished 清掉的不在表里
                self._terminal_order.remove(task_id)  # O(n)，只在这种少见的重新认领时发生
            self._link.forget(task_id)
        self._release((existing,))

    @property
    def starts_on_claim(self) -> bool:
        """worker 能否用 ``claim_queued(..., start=...)``（认领与 starting 一次提交）：存储的合并写是一次提交
        （``TaskStore.starts_on_claim``）、执行器不在调用线程上跑任务体（InlineExecutor 会把认领线程占住）、
        额度只有全局的 max_parallel（有标签 / 每桶额度时认领来的任务可能要排队等额度，而存储里它已是
        starting，不能回头排队）。有事件监听器也用它：queued → starting 发生在存储里，本进程的状态机没有经历
        这次迁移，``host_started`` 照存储写下的那条迁移记录（``claiming.start_record``）补发给监听器。
        不能时 worker 照旧：认领、本地排队、由后台循环写 starting。"""
        store = self._link.store
        return (
            store is not None
            and store.starts_on_claim
            and not self._run_executor.blocking
            and self._scheduler.only_global_limit
        )

    @property
    def start_executor(self) -> str:
        """认领并开始时写进 starting 的执行器名（与 TaskRun 的 ``mark_starting(executor=...)`` 同一个值）。"""
        return self._run_executor.name

    @property
    def _run_executor(self) -> Executor:
        """任务真正用的执行器（没给 executor 时是 TaskRun 的默认线程执行器）。"""
        return self.executor if self.executor is not None else DEFAULT_EXECUTOR

    @contextlib.contextmanager
    def holding_slots(self) -> Iterator[int]:
        """worker 的"认领并开始"包在这里面：先在调度账本里预留此刻空闲的执行槽（给出个数），认领到的任务由
        ``host_started`` 逐个占上，退出时放掉没用上的。

        为什么预留：认领那次往返期间本地可能有人 ``submit()``，不预留的话它会拿走刚算好的空槽，认领来的任务
        （存储里已是 starting，不能回头排队）就得超出 max_parallel 去跑。关闭中、派发冻结（close / stop_all
        的扫荡）时一个也不预留。
        """
        scheduler = self._scheduler
        with self._lock:
            free = 0
            if not self._closed and not scheduler.frozen and self.max_parallel is not None:
                free = max(
                    0,
                    self.max_parallel
                    - scheduler.active_count
                    - scheduler.queued_count
                    - scheduler.held_count,  # 另一次正在进行的认领预留的槽（worker 的几个认领线程）
                )
            scheduler.hold(free)
        hold = _Hold(free)
        outer = getattr(self._claim_holds, "current", None)
        self._claim_holds.current = hold  # 本线程接下来的 host_started 占的是这一次预留的槽
        try:
            yield free
        finally:
            self._claim_holds.current = outer
            with self._lock:
                scheduler.unhold(hold.remaining)
                # 预留期间本地排进来的任务：交给后台循环启动（不占认领线程，与 host_durable 同理）
                if scheduler.queued_count:
                    self._wake.set()

    def host_started(self, machine: StateMachine, definition: TaskDefinition) -> TaskRun:
        """接管一个认领时已由存储写成 starting 的持久任务：占上 ``holding_slots`` 预留的槽，立刻开始任务体
        （starting 已随认领落库，不再写它）。"""
        run = self._run_from_recipe(machine, definition)
        snapshot = machine.snapshot
        self._reserve([run])
        try:
            self._link.track(machine)
            # 尝试先在任务锁内准备好，再登记：stop / pause 从登记那一刻起看得到它，看到的已是有尝试的 starting
            launch = run.begin_started()
        except BaseException:
            self._release_reserved([run])
            raise
        if self._events.listeners:
            # queued → starting 发生在存储里（认领那条写），本地状态机没有这条迁移：照存储写下的那条补发给
            # 监听器。在登记之前发：之后的 stop / pause 与任务线程上的 running 都排在它后面，
            # 事件顺序与本地开始时一样。
            self._events.emit_transition(snapshot, start_record(snapshot))
        with self._lock:
            self._reserved_ids.discard(run.task_id)
            closed = self._closed
            if not closed:
                self._runs[run.task_id] = run
                self._unfinished.add(run.task_id)
                self._scheduler.occupy(run.task_id, bucket=snapshot.bucket, tags=snapshot.tags)
                hold = getattr(self._claim_holds, "current", None)
                if hold is not None:
                    hold.remaining -= 1
        if closed:
            # 认领期间控制器被关闭：任务体不开始，如实落 stopped（写穿），而不是留一个没人管的 starting。
            # 转移表里 starting 没有直达 stopped 的边：与在跑的任务被停止一样经 stopping。
            machine.mark_stopping(reason="控制器已关闭，任务未执行")
            machine.mark_stopped(reason="控制器已关闭，任务未执行")
            raise ConfigurationError(_CLOSED)
        self._link.start_polling()
        launch()
        return run

    def detach_unstarted_durable(self) -> list[TaskRun]:
        """worker 停止时：把本地还没开始（排队、重试等待、排队中暂停）的持久任务摘出本控制器，
        交给调用方交还存储。"""
        detached: list[TaskRun] = []
        with self._lock:
            for task_id in list(self._unfinished):
                run = self._runs.get(task_id)
                if run is None or self._scheduler.is_active(task_id):
                    continue
                snapshot = run.machine.snapshot
                if snapshot.recipe is None or snapshot.holds_slot:
                    continue
                if snapshot.status not in (TaskStatus.QUEUED, TaskStatus.RETRY_WAIT, TaskStatus.PAUSED):
                    continue
                self._scheduler.discard(task_id)
                del self._runs[task_id]
                self._unfinished.discard(task_id)
                detached.append(run)
            if not self._unfinished:
                self._settled.notify_all()
        for run in detached:
            run.detach()
            self._link.forget(run.task_id)
        return detached

    def check_cluster(self, *, orphan_limit: int = DEFAULT_ORPHAN_LIMIT) -> ClusterReport:
        """运维体检：各节点登记的桶有没有重复、空洞，有没有落在无人负责的桶里（或失去监督者）的任务。"""
        return self._link.check_cluster(orphan_limit=orphan_limit)

    def submit_pipeline(self, pipeline: Pipeline) -> PipelineRun:
        """提交一条 DAG 管道。

        节点是普通任务（task_id = ``<管道运行 id>:<node_id>``），list_tasks / ps 都看得到。
        """
        return submit_pipeline(self, pipeline)

    # -- PipelineHost（管道只经这四个方法用到控制器）--------------------------------------------------

    def resolve_task(self, name: str) -> TaskDefinition:
        """名字登记过就返回它的定义，否则抛 ConfigurationError。"""
        with self._lock:
            return self._registry.resolve(name)

    def submit_nodes(self, nodes: Sequence[NodeSubmit]) -> list[TaskRun]:
        """以 blocked 批量提交管道节点（一次写事务，同 submit_many）：不进就绪队列、不占额度，等管道放行
        （``TaskRun.release``）。"""
        shapes: dict[tuple[Any, ...], Any] = {}  # 这一次调用独有的节点模板（见 _prepare_node）
        runs = [
            self._prepare(
                name,
                args,
                kwargs,
                tags=(),
                priority=None,
                bucket_key=None,
                blocked=True,
                shapes=shapes,
                **node,
            )
            for name, args, kwargs, node in nodes
        ]
        return self._submit_batches(runs, DEFAULT_SUBMIT_BATCH, blocked=True)

    def start_ready(self) -> None:
        """有空额度就在调用线程里启动排队的任务（后台循环每一轮调用它）。冻结派发（stop_all / close）期间什么
        也不启动。管道放行节点之后的就地启动走 ``release_nodes``（同一个取锁方向，另管叫醒）。"""
        lock = self._lock
        if not lock.try_acquire():
            lock.acquire()
        try:
            to_start = self._scheduler.take_runnable()
        finally:
            lock.release()
        if to_start:
            self._start_runs(to_start)

    def release_nodes(self, releases: Sequence[tuple[TaskRun, Mapping[str, Any] | None]]) -> None:
        """放行一批管道节点（``TaskRun.release``，blocked → queued），再取出拿得到额度的排队任务就地
        启动（同 ``start_ready``）；整批至多叫醒后台循环一次。

        为什么：逐个 ``release`` 时每个入队都叫醒一次后台循环（``_enqueue_locked_by_snapshot``）——宽扇出的
        根节点落地时一口气放行上万个下游，就是上万次 ``Event.set``，循环被叫醒、抢 GIL 与控制器锁，在放行
        的同时从另一条线程启动下游（bench/README.md 第二十一轮 pl21）。这里把本线程在这一批里的入队记成
        "欠一次叫醒"（线程局部的标记，别的线程的入队照常叫醒），整批放行完先就地启动（同 ``start_ready``），
        启动之后就绪队列里还有任务才补叫一次——与逐个叫醒同一条保证：本线程入队的每个任务，要么已在这里被
        取走启动，要么之后后台循环至少还会醒一次、看一眼就绪队列。队列在取的那一次加锁里已空时不叫：这批
        入队的都已取走，后台循环醒来也无事可做（长链上每个节点放行一个下游、马上启动它，原来每个节点都叫醒
        一次）。直接调用 ``TaskRun.release`` 的人不经这里，照旧逐个叫醒。

        在一个刚落终态的节点的锁内调用：逐个取被放行节点的锁（它们还在 blocked，是这个节点的直接下游，
        取锁方向顺着 DAG 的边），再启动排队任务：与 ``_account`` 让出额度后就地启动下一个排队任务同一个
        取锁方向（持有刚落地的任务的锁、去取排队任务的锁），被启动的只可能是刚从就绪队列取出的排队任务。"""
        quiet = self._quiet_wakes
        quiet.depth += 1
        try:
            for run, upstream in releases:
                run.release(upstream)
        finally:
            quiet.depth -= 1
            missed = quiet.missed and not quiet.depth
            if missed:
                quiet.missed = False
        lock = self._lock
        if not lock.try_acquire():
            lock.acquire()
        try:
            # 冻结派发（stop_all / close）期间什么也不取，同 start_ready
            to_start = self._scheduler.take_runnable()
            leftover = missed and self._scheduler.queued_count > 0
        finally:
            lock.release()
        try:
            if to_start:
                # 取到几个就地启动几个：线程执行器一次结算只接力一个（executors/thread.py），其余各上各的
                # 线程，不会在这一条线程上排成一串。
                self._start_runs(to_start)
        finally:
            if leftover:
                self._wake.set()

    def _enqueue_locked(self, run: TaskRun) -> None:
        snapshot = run.machine.snapshot
        self._scheduler.enqueue(
            snapshot.task_id, priority=snapshot.priority, bucket=snapshot.bucket, tags=snapshot.tags
        )
        if run.timeout.start is not None:  # 多数任务没有 start 超时：不为它多一次调用
            run.watch_start_timeout()

    @staticmethod
    def _requeue(run: TaskRun) -> None:
        """重试等待到期：回到 queued，重新排队等额度（不绕过并发上限）。"""
        run.retry_due()

    def _start_runs(self, task_ids: list[str]) -> None:
        for task_id in task_ids:
            run = self._runs.get(task_id)
            if run is None:
                continue
            try:
                run.start()
            except TaskError as exc:
                # 预占额度与真正启动之间任务可能已被停止/暂停：状态机拒绝，额度由监听器归还。
                logger.debug("任务 %s 未能启动：%s", task_id, exc)
                with self._lock:
                    if run.machine.status not in SLOT_HOLDING_STATUSES:
                        self._scheduler.release(task_id)
                        self._wake.set()
                        self._slot_freed_locked()

    # -- state-machine listener ----------------------------------------------------------------------

    def _on_run_transition(self, run: TaskRun, snapshot: TaskSnapshot, record: Transition) -> None:
        """每个任务的状态机迁移之后（在任务锁内）由 TaskRun 调用。监听器绝不能把任务搞坏：出错只记日志。

        终态与否按迁移的目标查一次集合（不经 ``snapshot.is_terminal`` 的两层属性调用）。终态先看能不能交给
        认领链或推迟写（``_terminal_handed_over``）；其余（非终态，以及照常写的终态）都走同一条路：写穿、
        发事件、需要时记账（issue 17：每个任务三次迁移里两次不再多转一层）。"""
        try:
            machine = run.machine
            target = record.to_status
            if target in TERMINAL_STATUSES and self._terminal_handed_over(machine, snapshot, record):
                return
            self._link.on_transition(machine, snapshot, record)
            if self._events.listeners:  # 没有监听器时连事件对象都不造
                self._events.emit_transition(snapshot, record)
            # 这次迁移要不要改调度账本（入队、让额度、记落地）——这条规则只写在这里：占着槽、还在跑的
            # 迁移（starting，以及不是从 queued 来的 running / pausing / stopping）不改，每个任务的三四次
            # 迁移里有两次不必去拿控制器锁，也不调 _account（它只为改账本的迁移调用）。就地判定、不另调
            # 一个函数（issue 17）。
            if target not in _STILL_RUNNING or (target is not _STARTING and record.from_status is _QUEUED):
                self._account(snapshot, record, landed=True)
        except Exception:
            logger.exception("处理任务 %s 的状态迁移时出错", snapshot.task_id)

    def _terminal_handed_over(
        self, machine: StateMachine, snapshot: TaskSnapshot, record: Transition
    ) -> bool:
        """（在任务锁内）终态迁移能不能不照常"先写、后让额度"：交给认领链，或推迟写、把额度就地交给排队任务。
        返回 True：写穿、事件与记账都已在这里做完；False：调用方照常做。"""
        chain = self._claim_chain
        # 排队数不加锁地读，只是个提示（_chain_next 在锁内复查）：有本地排队任务时额度照旧交给它们。
        if (
            chain is not None
            and not self._scheduler.queued_count
            and self._chain_next(machine, snapshot, record, chain)
        ):
            return True
        # 终态、且有排队任务等着这个额度时，终态的写先排进组提交、不等（write_later）：让出的额度就地启动
        # 下一个排队任务，它的 starting 那次 save 把这个终态一并捎上——每个任务少一次提交。额度是"交接"
        # 出去的（在跑的 + 排队的个数不变），所以 worker 按空位认领的数目不受影响；没有排队任务时照旧先写、
        # 后让额度（否则 worker 会在终态落库之前多认领一个）。终态在 finish() 返回之前不算落库："落地"的
        # 记账（wait_all 的唤醒）与事件都在它之后；TaskRun 的 wait() 由排在本监听器之后的 TaskRun 监听器
        # 唤醒，本监听器返回时 finish() 早已返回。排队数在这里不加锁地读，只是个提示：_account 在锁内复查。
        finish = self._link.write_later(machine, record) if self._scheduler.queued_count else None
        if finish is None:
            return False
        try:
            handed_over = self._account(snapshot, record, landed=False)
        finally:
            finish()
        if self._events.listeners:
            self._events.emit_transition(snapshot, record)
        if handed_over:
            with self._lock:
                self._landed_locked(snapshot.task_id)
        else:
            self._account(snapshot, record, landed=True)
        return True

    def _chain_next(
        self, machine: StateMachine, snapshot: TaskSnapshot, record: Transition, chain: ClaimChain
    ) -> bool:
        """（在任务锁内，任务刚落终态）serve 中的 worker：这个任务的终态与它空出的槽上下一个任务的认领 +
        starting 一次提交（``ClaimStart.save``，PostgreSQL 上一条语句），认领到的就地开始。返回 False：
        这次不这样做（调用方照常写终态、让出额度）。

        为什么：原来终态一次提交、让出额度叫醒认领线程、认领 + starting 再一次提交，每个任务在同一个槽上
        两次往返一前一后；并成一次，每个任务少一次提交与往返（issue 19）。

        不变式（与分开写时逐条相同）：
        * 不囤积：只在这个任务真占着一个槽、把它让出之后至少空出一个槽时，把这一个槽在调度账本里
          换成"为认领预留"（release + hold 在同一次控制器锁里），只认领一个；认领线程的预留扣掉它，
          本地提交也不会拿走它。
        * 终态先落库、后算结束：落地记账（wait_all）、事件都在那次提交返回之后；TaskRun 的 wait() 由排在
          本监听器之后的监听器唤醒。认领到的任务在存储里已是落了库的 starting 才开始任务体。
        * 合并的提交失败时，终态照写穿层对一次失败的 save 的规矩处理（``WriteThrough.sync_with``：读回
          对照、留待追平），认领照一次失败的认领处理（记日志、什么也不开始）。
        * 预留的槽没用上（扑空、出错、这次终态不能交出去）就放掉并叫醒认领线程——与原来"让出额度即叫醒"
          同一条保证：空出的槽之后总有一次在它空出之后开始的预留。
        """
        task_id = snapshot.task_id
        scheduler = self._scheduler
        limit = self.max_parallel
        with self._lock:
            if (
                self._claim_chain is not chain
                or limit is None
                or self._closed
                or scheduler.frozen
                or scheduler.queued_count
                or not scheduler.is_active(task_id)
                or limit - (scheduler.active_count - 1) - scheduler.held_count < 1
                or not chain.wants_more()
            ):
                return False
            scheduler.release(task_id)  # 这个槽不经"空出"直接换成认领的预留：不叫醒认领线程
            scheduler.hold(1)
            self._chains_in_flight += 1
        hold = _Hold(1)
        claimed: list[TaskSnapshot] = []
        failed: list[TaskError] = []

        def write(request: SaveRequest) -> None:
            try:
                claimed.extend(chain.claim_after(request))
            except TaskError as exc:
                failed.append(exc)
                raise  # 交给写穿层按一次失败的 save 处理终态

        outer = getattr(self._claim_holds, "current", None)
        self._claim_holds.current = hold  # host_started 占的是这一个预留的槽
        try:
            with self.claiming():
                if self._link.write_with(machine, write) is None:
                    # 写穿层此刻不能把这一项交出去（结果未知要先读回、推迟写的 running 已被捎走……）：照常写，
                    # 预留的槽在下面放掉、叫醒认领线程（终态落库之后）。
                    self._link.on_transition(machine, snapshot, record)
                if self._events.listeners:
                    self._events.emit_transition(snapshot, record)
                with self._lock:
                    self._landed_locked(task_id)
                if failed:
                    chain.claim_failed(failed[0])
                for taken in claimed:
                    chain.host(taken)
        finally:
            self._claim_holds.current = outer
            with self._lock:
                scheduler.unhold(hold.remaining)
                if hold.remaining:
                    self._slot_freed_locked()
                if scheduler.queued_count:
                    self._wake.set()  # 预留期间本地排进来的任务：交给后台循环启动（同 holding_slots）
                self._chains_in_flight -= 1
                if not self._chains_in_flight:
                    self._chains_idle.notify_all()
        return True

    def _account(self, snapshot: TaskSnapshot, record: Transition, *, landed: bool) -> bool:
        """迁移之后的调度记账：入队、让出额度（就地启动下一个）；``landed``：终态已落库，可以记"落地"。

        ``landed=False``（终态还没落库）时只做"把额度交接给排队任务"：此刻没有排队任务就什么也不做、
        返回 False（调用方等终态落库后再以 ``landed=True`` 记一次）。

        只为改账本的迁移调用（终态，或 ``_on_run_transition`` 按那里写的规则筛过的）——占着槽、还在跑的迁移
        不入队、不让额度、不落地，调用方根本不调它，这里不再为每个任务重判一遍（issue 17）。"""
        task_id = snapshot.task_id
        target = record.to_status
        # 每个任务落地都走：同 _reserve_one，不经 with
        lock = self._lock
        if not lock.try_acquire():
            lock.acquire()
        try:
            scheduler = self._scheduler
            if not landed and not scheduler.queued_count:
                return False
            if target is _QUEUED:
                self._enqueue_locked_by_snapshot(snapshot)
            elif record.from_status is _QUEUED and target is not _STARTING:
                scheduler.discard(task_id)
            # 排队中/重试等待中被暂停的任务从未占槽（调度器可能刚为它预占了额度，还没真正启动）。
            carrying = target in SLOT_HOLDING_STATUSES and not (
                target is _PAUSED and record.from_status in _NOT_YET_STARTED
            )
            to_start: list[str] = []
            if not carrying:
                self._slot_freed_locked()  # 让出了执行槽（或不再排队）
            if not carrying and scheduler.release(task_id):
                # 空出的额度就地交给下一个排队任务，不必唤醒后台线程再转一手（吞吐的关键路径）。
                to_start = scheduler.take_runnable()
            if landed and target in TERMINAL_STATUSES:
                self._landed_locked(task_id)
        finally:
            lock.release()
        if to_start:
            # 这里仍持有本任务的锁，去启动别的任务（拿它们的锁）不会成环：被启动的只可能是刚从
            # 就绪队列取出的排队任务，而持有排队任务锁的线程（停止/暂停它）从不去拿正在让出额度
            # 的任务的锁——它只会从就绪队列里另取新的任务。
            self._start_runs(to_start)
        return True

    def _landed_locked(self, task_id: str) -> None:
        """（持有控制器锁）这个任务的终态已落库：不再算"未落地"，wait_all 可能就此返回。"""
        self._unfinished.discard(task_id)
        self._terminal_order.append(task_id)
        if self._over_keep_finished():
            self._wake.set()  # 由后台循环在锁外清理
        if not self._unfinished:  # wait_all 只等"全部落地"这一刻：别为每个任务都叫醒它
            self._settled.notify_all()

    def _on_progress(self, snapshot: TaskSnapshot) -> None:
        # 在任务锁内被调用（TaskRun 报进度）：只入队，出错也绝不能传回任务线程。
        if self._events.listeners and snapshot.progress is not None:
            try:
                self._events.emit(
                    ProgressEvent(
                        snapshot.task_id, snapshot.name, snapshot.attempt, snapshot.progress, self.clock.now()
                    )
                )
            except Exception:
                logger.exception("投递任务 %s 的进度事件时出错", snapshot.task_id)

    def _on_persist_failure(self, failure: PersistFailure) -> None:
        if self._events.listeners:
            self._events.emit(StoreErrorEvent(failure.task_id, failure.operation, failure.error, failure.at))

    # -- event hook (public) --------------------------------------------------------------------------

    def add_listener(self, listener: Listener) -> None:
        """登记一个事件监听器 ``fn(event)``（事件类型见 ``chongming_task.events``；用户指南 §15.1）。

        它在控制器的交付线程里、任何锁之外被调用，同一任务的事件按版本顺序到达；抛异常的监听器记一次
        日志后被移除。只看得到登记之后发生的事件。
        """
        self._events.add(listener)

    def remove_listener(self, listener: Listener) -> bool:
        """摘掉一个监听器；返回它原先是否登记着。"""
        return self._events.remove(listener)

    def flush_events(self, timeout: float | None = None) -> bool:
        """等到此刻之前发生的事件都已交给监听器。返回是否在 ``timeout`` 秒内等到。"""
        return self._events.flush(timeout)

    @property
    def dropped_events(self) -> int:
        """因监听器跟不上（积压超过上限）而丢弃的事件数。"""
        return self._events.dropped

    def _enqueue_locked_by_snapshot(self, snapshot: TaskSnapshot) -> None:
        self._scheduler.enqueue(
            snapshot.task_id, priority=snapshot.priority, bucket=snapshot.bucket, tags=snapshot.tags
        )
        quiet = self._quiet_wakes
        if quiet.depth:
            quiet.missed = True  # release_nodes 在整批之后就地启动、再叫醒一次（见那里）
        else:
            self._wake.set()

    # -- background loop ----------------------------------------------------------------------------

    def _background_loop(self) -> None:
        link = self._link
        while not self._stop_loop.is_set():
            # 本地只等唤醒；有存储时还要等续租、旁路回写与指令轮询的期限（由链接给出）。
            deadline = link.next_deadline()
            due = self._retention_due
            if due is not None:
                deadline = due if deadline is None else min(deadline, due)
            timeout = None if deadline is None else max(0.0, deadline - self.clock.monotonic())
            self.clock.wait(self._wake, timeout)
            self._wake.clear()
            if self._stop_loop.is_set():
                break
            try:
                self._run_deferred()
                self.start_ready()
                self._trim_finished()
                link.tick(self.clock.monotonic())
                self._retention_tick()
            except Exception:  # 后台循环不能死：记下来，下一轮继续
                logger.exception("控制器后台循环出错")
                time.sleep(0.05)

    def _retention_tick(self) -> None:
        """到期就在单独的线程里跑一次归档：它可能要几分钟，不能挡住续租、派发与指令轮询。"""
        retention, due = self.retention, self._retention_due
        if retention is None or due is None or self.clock.monotonic() < due:
            return
        self._retention_due = self.clock.monotonic() + retention.every
        running = self._retention_thread
        if running is not None and running.is_alive():
            logger.warning("上一次定期归档还没结束，跳过这一轮")
            return
        self._retention_thread = threading.Thread(
            target=self._run_retention,
            args=(retention,),
            name=f"chongming-retention[{self.owner}]",
            daemon=True,
        )
        self._retention_thread.start()

    def _run_retention(self, retention: Retention) -> None:
        store = self._link.store
        if store is None or self._closed:
            return
        try:
            summary = retention.run(store, self.clock.now())
        except Exception:
            logger.exception("定期归档失败（下一轮会续上，已写出的段不会重复归档）")
            return
        self.last_retention = summary
        logger.info("定期归档：%s", summary.line())

    def _over_keep_finished(self) -> bool:
        keep = self.keep_finished
        # 超出一成（至少 16 个）再批量清，不为每个落地的任务都切一次列表。
        return keep is not None and len(self._terminal_order) > keep + max(16, keep // 10)

    def _trim_finished(self) -> None:
        if self.keep_finished is not None and self._over_keep_finished():
            self._forget_finished(self.keep_finished)

    def defer(self, work: Callable[[], None]) -> None:
        """把一件后续工作交给后台循环（在任何锁之外、按提交顺序执行）。"""
        self._deferred.append(work)
        self._wake.set()

    def _run_deferred(self) -> None:
        while self._deferred:
            work = self._deferred.popleft()
            try:
                work()
            except Exception:
                logger.exception("控制器后续工作出错")

    def _side_snapshots(self, renew_lease: bool) -> list[TaskSnapshot]:
        """旁路回写要看的快照（给存储链接用）。"""
        with self._lock:
            # 续租要覆盖全部在管任务（排队的也归本节点管）；进度与心跳只可能在占着执行槽的任务上变化，
            # 平时只看它们——积压上万个排队任务时，不必每秒把它们全扫一遍。
            task_ids = self._unfinished if renew_lease else self._scheduler.active_ids()
            runs = [self._runs[task_id] for task_id in task_ids if task_id in self._runs]
        return [run.snapshot for run in runs]  # 在控制器锁外读：读快照可能要碰任务锁

    def _live_ids(self) -> list[str]:
        with self._lock:
            return list(self._unfinished)

    # -- queries ------------------------------------------------------------------------------------

    def get(self, task_id: str) -> TaskSnapshot | None:
        """单个快照；不存在返回 None。本进程持有的任务返回内存里最新的一份。"""
        run = self._runs.get(task_id)
        if run is not None:
            # 被隔离（fenced）的任务以存储为准（docs/distributed.md §7.3）；本地结果仍在 run 句柄上。
            # 存储里已没有它（被 prune / 归档清理删掉、因此被隔离）时也以存储为准、返回 None，与
            # list_tasks 一致：不能把一个不再写入、也不会重建的任务的本地快照当成它还在。
            if self._link.is_fenced(task_id):
                return self._link.get(task_id)
            return run.snapshot
        return self._link.get(task_id)

    def list_tasks(
        self,
        status: TaskStatus | str | Iterable[TaskStatus | str] | None = None,
        *,
        name_prefix: str | None = None,
        tag: str | None = None,
        limit: int | None = None,
        bucket: int | None = None,
        buckets: Iterable[int] | None = None,
        owner: str | None = None,
        pipeline_id: str | None = None,
        order: QueryOrder | str = QueryOrder.OLDEST_FIRST,
    ) -> list[TaskSnapshot]:
        """按条件查询（默认按提交先后）。有 store 时查存储，所以能看到别的进程的任务。"""
        query = TaskQuery(
            statuses=_status_set(status),
            name_prefix=name_prefix,
            tag=tag,
            limit=limit,
            bucket=bucket,
            buckets=frozenset(buckets) if buckets is not None else None,
            owner=owner,
            pipeline_id=pipeline_id,
            order=QueryOrder(order),
        )
        return self._link.query(query, self._local_snapshots)

    def _local_snapshots(self) -> list[TaskSnapshot]:
        with self._lock:
            runs = list(self._runs.values())
        return [run.snapshot for run in runs]

    def stats(self) -> TaskStats:
        """各状态计数；``.unfinished`` 是非终态数量（含排队与暂停）。"""
        return self._link.stats(self._local_snapshots)

    def bucket_counts(self) -> dict[int, int]:
        """每桶任务数，用于决定把桶分给谁。"""
        return self._link.bucket_counts(self._local_snapshots)

    def runs(self) -> list[TaskRun]:
        with self._lock:
            return list(self._runs.values())

    @property
    def active_count(self) -> int:
        """真的占着执行额度的任务数（含暂停的：暂停不释放槽位）。"""
        with self._lock:
            return self._scheduler.active_count

    @property
    def queued_count(self) -> int:
        with self._lock:
            return self._scheduler.queued_count

    @property
    def persist_failures(self) -> list[PersistFailure]:
        """最近的写存储失败（最多 20 条，保留最新的）。"""
        return self._link.persist_failures()

    # -- control ------------------------------------------------------------------------------------

    def stop(self, task_id: str, *, reason: str | None = None) -> bool:
        """请求停止，不阻塞。返回是否找到该任务（跨进程时表示"请求已受理"）。"""
        run = self._runs.get(task_id)
        if run is not None:
            run.stop(reason=reason)
            return True
        return self._link.remote_command(task_id, CommandAction.STOP, reason, {})

    def pause(self, task_id: str, *, timeout: float | None = None) -> bool:
        """请求暂停并等待确认。True = 已确认挂起；False = 没生效（状态已回滚）或跨进程未确认。"""
        check_seconds("pause() 的 timeout", timeout, low=0.0, low_open=False, allow_none=True)
        run = self._runs.get(task_id)
        if run is not None:
            return bool(run.pause(timeout=timeout))
        self._link.remote_command(task_id, CommandAction.PAUSE, None, remote_payload(timeout))
        return False  # 跨进程没有回执通道：如实报"未确认"，请轮询 get()

    def resume(self, task_id: str) -> bool:
        run = self._runs.get(task_id)
        if run is not None:
            return bool(run.resume())
        return self._link.remote_command(task_id, CommandAction.RESUME, None, {})

    def stop_all(self, *, reason: str | None = None) -> int:
        """对本进程持有的全部未终结任务发出停止请求；返回本轮**发出**的请求数（不是"已停止"数）。

        先冻结派发再停：扫荡期间停掉在跑的任务让出的槽不会交给排队任务，排队中的任务一个个直接落
        ``stopped``、任务体一行不执行，所以积压几千个时也是"每个任务一个请求"。扫荡完解冻，
        之后（扫荡开始后）新提交的任务照常派发。
        """
        with self._lock:
            self._scheduler.freeze()
        try:
            return self._stop_sweep(reason)
        finally:
            with self._lock:
                self._scheduler.thaw()
                to_start = self._scheduler.take_runnable()
            self._start_runs(to_start)

    def _stop_sweep(self, reason: str | None) -> int:
        """对此刻持有的每个可停的任务发一次停止请求（调用方已冻结派发）；返回发出的请求数。

        占着执行槽的先停（它们的优雅窗口早一点开始计），排队的随后；已在 stopping 的不再发请求、不计数。
        """
        runs = self.runs()
        with self._lock:
            scheduler = self._scheduler
            holding = [run for run in runs if scheduler.is_active(run.task_id)]
            rest = [run for run in runs if not scheduler.is_active(run.task_id)]
        issued = 0
        for run in (*holding, *rest):
            if not run.machine.can_stop or run.status is _STOPPING:
                continue
            with contextlib.suppress(TaskError):  # 与任务自己落终态擦肩而过：状态机拒绝，不算发出
                if run.stop(reason=reason):
                    issued += 1
        return issued

    def wait(self, task_id: str, *, timeout: float | None = None) -> Outcome:
        """等某个任务落终态。超时抛 TimeoutError，任务状态不变。"""
        check_seconds("wait() 的 timeout", timeout, low=0.0, low_open=False, allow_none=True)
        run = self._runs.get(task_id)
        if run is not None:
            outcome: Outcome = run.wait(timeout=timeout)
            return outcome
        return self._link.wait_remote(task_id, timeout)

    def wait_all(self, *, timeout: float | None = None) -> list[Outcome]:
        """等本进程持有的全部任务落终态；超时抛 TimeoutError（任务状态不变）。

        返回内存里仍保留的句柄的结果（设了 ``keep_finished`` 时，更早落地的已被清出内存）。
        """
        check_seconds("wait_all() 的 timeout", timeout, low=0.0, low_open=False, allow_none=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._settled:
            while self._unfinished:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(
                        f"等待超时：还有 {len(self._unfinished)} 个任务没落终态；任务状态未改变"
                    )
                # 主线程按片等：信号交给了别的线程时 Ctrl-C 也立刻生效（runtime/interruptible.py）
                self._settled.wait(wait_slice(remaining))
            runs = list(self._runs.values())
        # 上千个结果对象全都活着、一个也不是垃圾：造它们时碰上的全量回收只是把在管的任务扫一遍（几十毫秒），
        # 与 submit_many 同一条规则暂停循环 GC（runtime/gc_pause.py），退出时恢复。
        pause = gc_paused() if len(runs) >= GC_PAUSE_MIN_TASKS else contextlib.nullcontext()
        with pause:
            return [Outcome.from_snapshot(run.snapshot) for run in runs]

    def prune(self, keep_terminal: int) -> int:
        """丢弃最旧的终态记录，只保留最新 keep_terminal 个（内存里的句柄；有 store 时也清存储）。"""
        check_int("keep_terminal", keep_terminal, low=0)
        return max(self._forget_finished(keep_terminal), self._link.prune(keep_terminal))

    def _forget_finished(self, keep: int) -> int:
        """只从内存里丢掉最旧的已落地任务句柄（存储不动）。返回丢掉的个数。"""
        released: list[TaskRun] = []
        with self._lock:
            excess = len(self._terminal_order) - keep
            dropped = self._terminal_order[:excess] if excess > 0 else []
            self._terminal_order = self._terminal_order[len(dropped) :]
            for task_id in dropped:
                run = self._runs.pop(task_id, None)
                if run is not None:
                    released.append(run)
                self._link.forget(task_id)
        self._release(released)
        return len(dropped)

    @staticmethod
    def _release(runs: Iterable[TaskRun]) -> None:
        """（控制器锁之外）这些已落地的句柄不再归本控制器管：拆掉它们与控制器、与各自状态机之间的环
        （``TaskRun.release_controller``），没人引用的当场由引用计数释放。"""
        for run in runs:
            run.release_controller()

    def reconcile(self, *, dry_run: bool = False, durable_only: bool = False) -> ReconcileReport:
        """把租约过期、失去监督者的任务如实标记（见 runtime/reconcile.py 的规则表）。只看本节点的桶。

        ``durable_only=True`` 只看持久任务（worker 的自动维护用它，普通任务留给调用方自己决定
        何时 reconcile）。
        """
        return self._link.reconcile(
            live_ids=set(self._live_ids()), dry_run=dry_run, durable_only=durable_only
        )

    def close(
        self, *, reason: str = "控制器关闭", timeout: float | None = None, close_store: bool = False
    ) -> None:
        """停止一切并收尾：排队中的任务不会执行任务体（直接落 stopped），在跑的走优雅停止。幂等。"""
        check_seconds("close() 的 timeout", timeout, low=0.0, low_open=False, allow_none=True)
        with self._lock:
            already = self._closed
            self._closed = True
            if not already:
                # 先冻结派发、且永不解冻：停在跑的任务让出的槽不能再交给排队任务（§8.3 的承诺）。
                self._scheduler.freeze()
        if not already:
            self._stop_sweep(reason)
            wait_for = timeout if timeout is not None else self.graceful_stop + 2.0
            with contextlib.suppress(TimeoutError):
                self.wait_all(timeout=wait_for)
            self._events.close()  # 把已发生的事件送完（监听器看得到每个任务的终态），再停交付线程
            self._link.stop_listening()
            self._stop_loop.set()
            self._wake.set()
            if self._loop is not threading.current_thread():
                join_thread(self._loop, 5.0)
            retention = self._retention_thread
            if retention is not None:
                join_thread(retention, self.graceful_stop)  # 正在归档就等它一会儿；中断了下次也能续跑
            self._link.shutdown()
            self._release_landed()
        if close_store:
            self._link.close_store()

    def _release_landed(self) -> None:
        """``close()`` 收尾的最后一步：已落地的句柄不再挂控制器的钩子、状态机只弱引用句柄，控制器也不再
        持有自己的绑定方法（``_release``）。于是关掉的控制器没有环：调用方丢掉它（和它交出的句柄）之后，引用
        计数当场释放它与它的全部任务，不留给循环 GC 的全量回收（issue 17；sq17 量的每 5,000 个任务约 2.5 万个
        循环垃圾）。句柄照常留在表里，``get()`` / ``runs()`` / ``wait_all()`` 与句柄上的读取都不变；收尾时仍没
        落地的（停不下来的任务）保留钩子，它们之后的迁移照常写穿、记账。"""
        with self._lock:
            landed = [run for task_id, run in self._runs.items() if task_id not in self._unfinished]
            self._run_transition = _released_transition
            self._progress_hook = _released_progress
        self._release(landed)

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"Controller(owner={self.owner!r}, max_parallel={self.max_parallel}, tasks={len(self._runs)})"


__all__ = [
    "DEFAULT_SUBMIT_BATCH",
    "NOTIFIED_POLL_INTERVAL",
    "SUBMIT_KEYWORDS",
    "Controller",
    "Submit",
    "default_owner",
    "render_table",
]
