"""控制器与存储之间的那一半：只在有 store 时才存在的一切都在 ``StoreLink`` 里。

Controller 本身只做本地调度（登记、排队、额度、句柄）；和存储打交道的事——写穿每次迁移、续租、
旁路字段（进度/心跳）回写、存储追平、认领跨进程指令、登记节点、给不在本进程的任务写指令、
查询别的进程的任务、reconcile 与 check_cluster——交给它的"存储链接"。没有存储时换成
``LocalLink``（空对象：同样的方法，本地语义），于是控制器里没有一处 ``store is None`` 分支。

锁：链接自己只有一把叶子锁（守着"是否已开始认领指令"），持有它时不调用任何别的东西。它向控制器要
数据走构造时给的回调（``live_ids`` / ``side_snapshots`` / ``local_run``），回调按控制器的规矩在
控制器锁内只拷一份 id 列表、在锁外读快照。链接的方法都在控制器锁之外调用（``forget`` 除外：它只拿
写穿自己的叶子锁）。
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from chongming_task.clock import Clock
from chongming_task.core.state_machine import StateMachine
from chongming_task.errors import ConfigurationError, DuplicateTaskId, TaskError
from chongming_task.models import Outcome, TaskSnapshot, Transition
from chongming_task.policies import BucketPolicy
from chongming_task.runtime.cluster import ClusterReport, check_cluster, node_record
from chongming_task.runtime.commands import poll_commands
from chongming_task.runtime.persistence import PersistFailure, WriteThrough
from chongming_task.runtime.reconcile import ReconcileReport, reconcile_store
from chongming_task.runtime.signature import accepts_keyword
from chongming_task.runtime.task_logs import LogSink
from chongming_task.storage import CommandAction, SaveRequest, TaskQuery, TaskStats, TaskStore, count_buckets

if TYPE_CHECKING:
    from chongming_task.runtime.taskrun import TaskRun

logger = logging.getLogger("chongming_task.controller")

NOTIFIED_POLL_INTERVAL = 2.0
"""存储能即时通知新指令（Postgres 的 LISTEN/NOTIFY）时的兜底轮询间隔：通知丢了最多晚这么久。"""

LocalSnapshots = Callable[[], list[TaskSnapshot]]


def _not_found(task_id: str) -> ConfigurationError:
    return ConfigurationError(f"找不到任务 {task_id!r}")


_NO_FIELDS: Mapping[str, object] = MappingProxyType({})


def _no_write(machine: StateMachine, snapshot: TaskSnapshot, record: Transition) -> None:
    """没有要写穿的地方。"""


def _no_lease_fields() -> Mapping[str, object]:
    """没有存储：新任务不带租约。"""
    return _NO_FIELDS


def _never_later(machine: StateMachine, record: Transition) -> Callable[[], bool] | None:
    """没有可以捎带的提交（没有存储，或存储不做组提交）：不必推迟，调用方照常 on_transition。"""
    return None


def _never_with(machine: StateMachine, write: Callable[[SaveRequest], None]) -> bool | None:
    """没有存储：没有要交给别人一起提交的写，调用方照常 on_transition。"""
    return None


class LocalLink:
    """没有存储时的链接：不写、不租、不认领指令；查询只看本进程的任务。"""

    store: TaskStore | None = None
    log_sink: LogSink | None = None
    """任务日志的缓冲（``Controller(persist_logs=...)``）；没有存储时为 None，日志只在内存里。"""

    on_transition: Callable[[StateMachine, TaskSnapshot, Transition], None]
    """每次迁移（在任务锁内）：写穿存储。是实例属性而不是方法：有存储时它就是写穿对象的那个方法本身，
    每次迁移少一层转手（issue 17）。"""
    write_later: Callable[[StateMachine, Transition], Callable[[], bool] | None]
    """这次迁移的写先排进组提交、不等（见 ``WriteThrough.sync_later``）；返回"等它提交"的函数，None 表示
    不能推迟（调用方照常 on_transition）。"""

    write_with: Callable[[StateMachine, Callable[[SaveRequest], None]], bool | None]
    """这次迁移的写交给调用方给的函数、与别的写同一个事务提交（见 ``WriteThrough.sync_with``）；None 表示
    不能（调用方照常 on_transition）。"""

    lease_fields: Callable[[], Mapping[str, object]]
    """新任务快照的初始租约字段（``StateMachine.create`` 的关键字参数）：没有存储就没有租约。
    同 on_transition，是实例属性：有存储时它就是写穿对象的 ``lease_fields`` 本身（每个提交少一层转手）。"""

    def __init__(self) -> None:
        self.on_transition = _no_write
        self.write_later = _never_later
        self.write_with = _never_with
        self.lease_fields = _no_lease_fields

    def create(self, machine: StateMachine) -> None:
        """新任务只在内存里。"""

    def create_many(self, machines: Sequence[StateMachine]) -> list[TaskError | None]:
        """新任务只在内存里：逐项都成功。"""
        return [None] * len(machines)

    def track(self, machine: StateMachine) -> None:
        """没有存储，就没有"接着存储里的版本写"（认领 / 接手只在有存储时发生）。"""

    def forget(self, task_id: str) -> None:
        """没有写穿记账要清。"""

    def start_polling(self) -> None:
        """没有指令表可认领。"""

    def serve_names(self, names: Collection[str]) -> None:
        """没有节点记录可发布。"""

    def next_deadline(self) -> float | None:
        # 不回写旁路字段、不续租、不轮询：后台循环只等唤醒（否则到点后不再推进的期限会让它空转）。
        return None

    def tick(self, now: float) -> None:
        """后台循环每轮调用一次：本地没有到点要做的存储工作。"""

    def get(self, task_id: str) -> TaskSnapshot | None:
        return None

    def is_fenced(self, task_id: str) -> bool:
        """本进程持有的这个任务是否已被隔离（此后对外报告以存储里的记录为准，见 Controller.get）。"""
        return False

    def query(self, query: TaskQuery, local: LocalSnapshots) -> list[TaskSnapshot]:
        return query.apply(local())

    def stats(self, local: LocalSnapshots) -> TaskStats:
        return TaskStats.of(local())

    def bucket_counts(self, local: LocalSnapshots) -> dict[int, int]:
        return count_buckets(local())

    def persist_failures(self) -> list[PersistFailure]:
        return []

    def remote_command(
        self, task_id: str, action: CommandAction, reason: str | None, payload: Mapping[str, Any]
    ) -> bool:
        return False  # 不在本进程、又没有共享存储：找不到这个任务

    def wait_remote(self, task_id: str, timeout: float | None) -> Outcome:
        raise _not_found(task_id)

    def prune(self, keep_terminal: int) -> int:
        return 0

    def reconcile(
        self, *, live_ids: Collection[str], dry_run: bool, durable_only: bool = False
    ) -> ReconcileReport:
        raise ConfigurationError(
            "reconcile() 需要持久化存储：请用 Controller(store=SqliteTaskStore(...)) 构造"
        )

    def check_cluster(self, *, orphan_limit: int) -> ClusterReport:
        raise ConfigurationError("check_cluster() 需要共享存储：请用 Controller(store=...) 构造")

    def stop_listening(self) -> None:
        """没有订阅。"""

    def shutdown(self) -> None:
        """没有要追平或下线的东西。"""

    def close_store(self) -> None:
        """没有存储可关。"""


def _command_notice(poll_now: threading.Event, wake: threading.Event) -> Callable[[object], None]:
    """指令通知的回调：叫醒后台循环马上认领一次。只引用两个事件、不引用 StoreLink——链接存着存储给的取消订阅
    函数，那个函数又引用着回调：回调若是 StoreLink 的绑定方法，链接（连同写穿、组提交与存储）就成了只有
    循环 GC 才收得走的环，关掉的 Postgres 控制器丢下的这一片要等一次全量回收。"""

    def on_notice(notice: object) -> None:
        poll_now.set()
        wake.set()

    return on_notice


class StoreLink(LocalLink):
    """有存储时的链接（见模块说明）。继承 LocalLink 只为共用"不需要存储"的那几个空操作的声明；
    凡是和存储有关的方法这里都重新实现。"""

    def __init__(
        self,
        store: TaskStore,
        *,
        owner: str,
        owned_buckets: frozenset[int] | None,
        bucket_policy: BucketPolicy,
        clock: Clock,
        lease_ttl: float,
        command_poll_interval: float,
        side_channel_interval: float,
        wake: threading.Event,
        live_ids: Callable[[], Collection[str]],
        side_snapshots: Callable[[bool], list[TaskSnapshot]],
        local_run: Callable[[str], TaskRun | None],
        on_persist_failure: Callable[[PersistFailure], None] | None = None,
        persist_logs: bool = True,
        any_live: Callable[[], bool] | None = None,
        arriving: Callable[[str], bool] | None = None,
    ) -> None:
        self.store = store
        self._store: TaskStore = store
        self._owner = owner
        self._owned_buckets = owned_buckets
        self._partitioned = owned_buckets is not None and len(owned_buckets) != bucket_policy.num_buckets
        self._num_buckets = bucket_policy.num_buckets
        self._clock = clock
        self._lease_ttl = lease_ttl
        self._command_poll_interval = command_poll_interval
        self._side_channel_interval = side_channel_interval
        self._wake = wake
        self._live_ids = live_ids
        self._any_live = any_live if any_live is not None else (lambda: bool(live_ids()))
        self._arriving = arriving if arriving is not None else (lambda task_id: False)
        # 按名字认领（存储对照任务行的 owner）：不必每 0.1 秒把在管的全部 task_id 交给存储。
        self._by_holder = accepts_keyword(store.claim_commands, "holder")
        self._side_snapshots = side_snapshots
        self._local_run = local_run
        self._write = WriteThrough(
            store, owner=owner, lease_ttl=lease_ttl, clock=clock, on_failure=on_persist_failure
        )
        # 每次迁移都走的两个入口直接是写穿的方法（少一层转手）；存储不做组提交时没有可推迟的写。
        self.on_transition = self._write.on_transition
        self.lease_fields = self._write.lease_fields
        self.write_later = self._write.sync_later if self._write.commits is not None else _never_later
        self.write_with = self._write.sync_with
        self._write.on_lazy = wake.set  # 推迟写的 running 到点由后台循环补写（见 WriteThrough.on_transition）
        # 日志与旁路字段同一个节奏、同一条失败路径（persist_failures、事件钩子、指标）。
        self.log_sink = LogSink(store, on_failure=self._write.record) if persist_logs else None
        self._lock = threading.Lock()
        self._polling = False
        self._poll_now = threading.Event()
        self._unlisten: Callable[[], None] | None = None
        self._serves: list[str] | None = None
        now = clock.monotonic()
        self._next_side = now + side_channel_interval
        self._next_lease = now + lease_ttl / 3
        self._next_poll = now
        if owned_buckets is not None:
            # 声明了归属的节点从构造起就轮询指令：否则别人停一个排队中的任务，要等本节点第一次提交才被取走。
            self.start_polling()

    # -- write-through ------------------------------------------------------------------------------

    def create(self, machine: StateMachine) -> None:
        try:
            self._write.create(machine)
        except DuplicateTaskId:
            # 建议按存储里那个任务的真实状态给（还在跑 / 已成功 / 已结束）；读不到就只说"已存在"。
            try:
                existing = self._store.get(machine.task_id)
            except TaskError:
                existing = None
            status = existing.status if existing is not None else None
            raise DuplicateTaskId.for_existing(machine.task_id, status, where="于存储中") from None

    def create_many(self, machines: Sequence[StateMachine]) -> list[TaskError | None]:
        """一次写事务建一批（submit_many）。返回逐项结果；重复 id 的报错与 ``create`` 相同。"""
        results = self._write.create_many(machines)
        for index, error in enumerate(results):
            if isinstance(error, DuplicateTaskId):
                try:
                    self.create(machines[index])  # 复用单个 create 的读回与报错（按存储里那个任务的状态）
                except TaskError as exc:
                    results[index] = exc
        return results

    def track(self, machine: StateMachine) -> None:
        self._write.track(machine)

    def forget(self, task_id: str) -> None:
        self._write.forget(task_id)

    def persist_failures(self) -> list[PersistFailure]:
        return self._write.snapshot_failures()

    # -- commands and node publishing ---------------------------------------------------------------

    def start_polling(self) -> None:
        """开始认领指令（幂等）。存储若支持即时通知（Postgres 的 LISTEN/NOTIFY），指令一提交就来取；
        轮询始终保留为兜底（通知丢了最多多等一个轮询间隔）。"""
        if self._polling:  # 提交的热路径：已在认领时不拿锁
            return
        with self._lock:
            if self._polling:
                return
            self._polling = True
        self._publish_node()
        listen = getattr(self._store, "listen", None)
        if callable(listen):
            try:
                self._unlisten = listen(_command_notice(self._poll_now, self._wake))
            except TaskError as exc:
                logger.warning("无法订阅指令通知，改为纯轮询：%s", exc)
        self._wake.set()

    def serve_names(self, names: Collection[str]) -> None:
        """本节点作为 worker 执行这些名字的持久任务：写进节点记录（info.serves），
        doctor 据此找出没人服务的任务。"""
        self._serves = sorted(names)
        self.start_polling()
        self._publish_node()

    def _publish_node(self) -> None:
        """在存储里登记本节点负责的桶（带心跳与过期时间），供 check_cluster / doctor 发现重复与空洞。

        只有持有任务的控制器才登记（与认领指令同一条件）：纯查询的控制台登记了，会被当成一个
        不限定桶的节点，掩盖"没有活节点"这类真问题。
        """
        record = node_record(
            self._owner,
            self._owned_buckets,
            num_buckets=self._num_buckets,
            ttl=self._lease_ttl,
            clock=self._clock,
            info={
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                **({} if self._serves is None else {"serves": self._serves}),
            },
        )
        try:
            self._store.publish_node(record)
        except TaskError as exc:
            self._write.record(self._owner, "publish_node", exc)

    def _effective_poll_interval(self) -> float:
        """订阅了即时通知时，轮询只是兜底（通知丢了才用得上），不必每 0.1 秒扫一遍指令表。"""
        if self._unlisten is not None:
            return max(self._command_poll_interval, NOTIFIED_POLL_INTERVAL)
        return self._command_poll_interval

    def _poll_commands(self) -> None:
        if not self._partitioned and not self._any_live():
            return
        by_list = not self._partitioned and not self._by_holder
        poll_commands(
            self._store,
            self._owner,
            lease=max(self._lease_ttl, 1.0),
            task_ids=list(self._live_ids()) if by_list else None,
            buckets=self._owned_buckets if self._partitioned else None,
            local_run=self._local_run,
            on_store_error=self._poll_failed,
            by_holder=not self._partitioned and self._by_holder,
            arriving=self._arriving,
        )

    def _poll_failed(self, operation: str, exc: BaseException) -> None:
        self._write.outage.failure(operation, self._owner, f"{type(exc).__name__}: {exc}")

    def remote_command(
        self, task_id: str, action: CommandAction, reason: str | None, payload: Mapping[str, Any]
    ) -> bool:
        snapshot = self._store.get(task_id)
        if snapshot is None:
            return False
        if snapshot.is_terminal:
            return True  # 找到了，但已落终态：没有可执行的动作，不写一条永远没人执行的指令
        self._store.submit_command(task_id, action, issuer=self._owner, reason=reason, payload=payload)
        return True

    # -- the background loop's share ----------------------------------------------------------------

    def next_deadline(self) -> float | None:
        deadline = min(self._next_side, self._next_lease)
        if self._polling:
            deadline = min(deadline, self._next_poll)
        return self._write.loop_deadline(deadline)

    def tick(self, now: float) -> None:
        """续租（每 lease_ttl/3）、旁路回写（每 side_channel_interval）、追平落后的写、认领指令。"""
        if now >= self._next_lease:
            self._flush_side_channel(renew_lease=True)
            if self._polling:
                self._publish_node()
            self._next_lease = now + self._lease_ttl / 3
            self._next_side = now + self._side_channel_interval
        elif now >= self._next_side:
            self._flush_side_channel(renew_lease=False)
            self._next_side = now + self._side_channel_interval
        self._write.flush_lazy()
        if self._write.behind_count:
            self._write.catch_up()
        self._write.tick()
        if self._polling and (now >= self._next_poll or self._poll_now.is_set()):
            self._poll_now.clear()
            self._poll_commands()
            self._next_poll = self._clock.monotonic() + self._effective_poll_interval()

    def _flush_side_channel(self, *, renew_lease: bool) -> None:
        self._write.flush_side_channel(self._side_snapshots(renew_lease), renew_lease=renew_lease)
        if self.log_sink is not None:
            self.log_sink.flush()

    # -- reading other processes' tasks -------------------------------------------------------------

    def get(self, task_id: str) -> TaskSnapshot | None:
        return self._store.get(task_id)

    def is_fenced(self, task_id: str) -> bool:
        return self._write.is_fenced(task_id)

    def query(self, query: TaskQuery, local: LocalSnapshots) -> list[TaskSnapshot]:
        results = self._store.query(query)
        # 本进程持有的任务用内存里的最新快照（进度等旁路字段按节奏回写，存储里可能稍旧）；
        # 被隔离的任务例外：以存储为准。
        out = []
        for snapshot in results:
            run = self._local_run(snapshot.task_id)
            use_local = run is not None and not self._write.is_fenced(snapshot.task_id)
            out.append(run.snapshot if use_local and run is not None else snapshot)
        return out

    def stats(self, local: LocalSnapshots) -> TaskStats:
        return self._store.stats()

    def bucket_counts(self, local: LocalSnapshots) -> dict[int, int]:
        return self._store.bucket_counts()

    def wait_remote(self, task_id: str, timeout: float | None) -> Outcome:
        if self._store.get(task_id) is None:
            raise _not_found(task_id)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            snapshot = self._store.get(task_id)
            if snapshot is not None and snapshot.is_terminal:
                return Outcome.from_snapshot(snapshot)
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"等待任务 {task_id!r} 超时（{timeout} 秒）；任务状态未改变")
            time.sleep(0.05)

    def prune(self, keep_terminal: int) -> int:
        return self._store.prune(keep_terminal)

    # -- operations ---------------------------------------------------------------------------------

    def reconcile(
        self, *, live_ids: Collection[str], dry_run: bool, durable_only: bool = False
    ) -> ReconcileReport:
        return reconcile_store(
            self._store,
            clock=self._clock,
            actor=self._owner,
            buckets=self._owned_buckets if self._partitioned else None,
            live_task_ids=live_ids,
            dry_run=dry_run,
            durable_only=durable_only,
        )

    def check_cluster(self, *, orphan_limit: int) -> ClusterReport:
        return check_cluster(
            self._store, num_buckets=self._num_buckets, clock=self._clock, orphan_limit=orphan_limit
        )

    # -- shutdown -----------------------------------------------------------------------------------

    def stop_listening(self) -> None:
        if self._unlisten is not None:
            try:
                self._unlisten()
            except Exception:  # 关闭路径上不能因为通知通道坏了就半途而废
                logger.debug("取消指令通知订阅时出错", exc_info=True)

    def shutdown(self) -> None:
        """追平落后的写、最后一次旁路回写，认领过指令的节点正常下线（立刻让出登记的桶，不等过期）。"""
        self._write.catch_up()
        self._flush_side_channel(renew_lease=False)
        if self._polling:
            try:
                self._store.remove_node(self._owner)
            except TaskError as exc:
                self._write.record(self._owner, "remove_node", exc)

    def close_store(self) -> None:
        self._store.close()


__all__ = ["NOTIFIED_POLL_INTERVAL", "LocalLink", "StoreLink"]
