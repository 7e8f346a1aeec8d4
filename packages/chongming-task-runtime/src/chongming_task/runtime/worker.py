"""worker：认领、接手、重跑持久任务的循环（``Controller.serve()`` / ``chongming-task worker``；issue 19）。

每一轮：

1. **认领**（``TaskStore.claim_queued``）：只认本控制器登记了名字的、落在本节点负责的桶里的、无人持有的 queued
   持久任务；一次只认领空闲槽位那么多个（槽位 = ``max_parallel`` 减去本地在跑与排队的），不囤积。认领是存储里
   的原子操作，多少个 worker 同时来取，每个任务也只被一个取走。认领来的任务按它存储里的版本接着写（写穿、
   续租、指令都和本地提交的一样）。存储支持时（``TaskStore.starts_on_claim``，见
   ``Controller.starts_on_claim`` 的其余条件）认领与 starting 是一次提交（``claim_queued(..., start=...)``）：
   认领来的任务已是落了库的 starting，占上预留的槽立刻开始任务体，每个任务少一次提交与往返；这时槽位
   至少 2 个的 worker 有两条认领线程（``Worker._start_claimer``），一个槽在另一个槽的认领往返进行时空出，
   马上就有线程去认领它，两条线程各自只预留此刻真正空着的槽。存储的合并写还认得 ``ClaimStart.save`` 时
   （``TaskStore.saves_on_claim``），任务落终态、它空出的槽上还要认领的那一刻，让出槽的线程把终态与下一个任务
   的认领 + starting 并成一次提交（``_ClaimChain``，见 ``Controller._chain_next``）、认领到的在这条线程上接着
   跑：同一个槽上每个任务一次提交，认领线程只管开头、新任务的通知与这条路扑空之后。否则启动
   （starting 那次提交）不在认领线程上做，交给控制器的后台循环（或正让出额度的任务线程：它的终态与这个
   任务的 starting 一个事务）：认领线程马上回去认领别的空位，认领与 starting 两次往返不排在同一条线程上。
2. **维护**（每 ``lease_ttl / 2`` 一次）：``reconcile(durable_only=True)`` 本节点的桶里的持久任务——
   * 失联持有者的 queued / paused / retry_wait 持久任务：以 ``cluster:adopted`` 接手（状态不变、换持有者，迁移
     记录写明接手者与原持有者；暂停的仍暂停，重试等待的到点才排队）。queued 的也只接手空闲槽位那么多个；
   * 失联持有者在跑的任务：reconcile 照旧判 lost；配方说 ``on_lost="retry"`` 且尝试预算有剩余的，经审计的
     ``retry()`` 复活并由本节点接手、重新排队（at-least-once：任务体可能执行了两次）。
   * 补救：上一步没复活成的（判 lost 之后写存储出错，或判 lost 的 worker 在复活之前就死了）留在存储里是终态
     lost，reconcile 不会再看它。所以每轮还扫一遍本节点桶里、租约已过期、最后一次迁移是 reconcile 判的 lost、
     配方 ``on_lost="retry"``、名字已登记、尝试预算有剩余的持久任务，走同一条审计过的复活路径。几个 worker
     同时补救同一个任务时靠带版本条件的写（``ConcurrencyConflict``）保证只复活一次。因停止请求超出优雅窗口
     而落的 lost 不是"载体消失"，不补救。
   普通任务 worker 不碰：它们何时被判 lost 仍由调用方自己的 ``reconcile()`` 决定，与以前完全一样。
3. **等待**：有空槽时等"新任务"的通知（PostgreSQL 的 NOTIFY；``store.listen``）或本地任务让出执行槽
   （``Controller.watch_slots``：在调度账本归还槽位的同一处置位，任务一结束就去认领下一个），最多
   ``poll_interval`` 秒（轮询兜底；SQLite 只有轮询）。认领之后总是回到这里等，哪怕取满了空槽：那时已没有空槽，
   马上再取只会扑空；认领往返期间空出的槽早已置位唤醒，等待立刻返回。

停止（``stop`` 事件置位，CLI 里是 SIGTERM / Ctrl-C）：不再认领与接手；本地还没开始的持久任务交还存储
（持有者清空，别的 worker 立刻可认领）；在跑的最多等 ``drain_timeout`` 秒自己跑完，到点仍在跑的走优雅停止
（落 stopped，可 ``chongming-task retry``）。
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from chongming_task.clock import Clock
from chongming_task.core.numbers import check_seconds
from chongming_task.core.state_machine import StateMachine
from chongming_task.core.storage.claiming import MAX_CLAIM, ClaimStart
from chongming_task.core.triggers import TRIGGER_RECONCILE
from chongming_task.errors import ConcurrencyConflict, ConfigurationError, TaskError, TaskNotFound
from chongming_task.models import Failure, FailureKind, TaskSnapshot
from chongming_task.runtime.reconcile import ReconcileReport
from chongming_task.runtime.registry import TaskDefinition
from chongming_task.runtime.taskrun import TaskRun
from chongming_task.states import TaskStatus
from chongming_task.storage import QueryOrder, SaveRequest, TaskQuery, TaskStore

logger = logging.getLogger("chongming_task.worker")

S = TaskStatus
DEFAULT_POLL_INTERVAL = 0.2
"""没有即时通知时（SQLite）多久看一次有没有新任务（秒）；有 NOTIFY 时它只是兜底。"""
DEFAULT_DRAIN_TIMEOUT = 30.0
_STOP_CHECK = 0.2
"""空闲等待时多久看一次停止请求（秒）。"""

_ADOPT_STATUSES = frozenset({S.QUEUED, S.PAUSED, S.RETRY_WAIT})
_LOST = frozenset({S.LOST})


def _revivable(snapshot: TaskSnapshot, names: frozenset[str]) -> bool:
    """lost 的持久任务是否该由本节点自动复活：配方 ``on_lost="retry"``、名字已登记、尝试预算有剩余。"""
    recipe = snapshot.recipe
    return (
        recipe is not None
        and recipe.retries_when_lost
        and snapshot.name in names
        and snapshot.attempt < snapshot.max_attempts
    )


class _WakeOne(threading.Event):
    """叫醒 worker 认领线程的"自动复位"事件：一次置位只叫醒一条等着的线程，被叫醒的那条取走它（复位）。

    为什么不用普通的 ``threading.Event``：两条认领线程（``Worker._start_claimer``）等同一个事件时，
    一个槽空出来（``Controller.watch_slots`` 的置位）两条都醒，先到的预留走了那个槽，后到的预留到 0 个——
    量下来每个任务约 0.5 次这样的空预留（两次控制器锁、一次 GIL 交接；issue 19）。

    为什么这样不会让空槽闲着（不变式）：每次置位之后，总有一条线程在置位之后取走它，而取走之后、
    下一次 ``holding_slots`` 之前不再等待——所以每个空出的槽之后都有一次在它空出之后才开始的预留，
    与原来"醒来、清掉、再预留"是同一条保证。置位时已有一次没被取走的，不再叫醒别的线程：取走它的那条
    线程的预留在这两次置位之后，一并覆盖了两个空槽（多叫醒一条只会多一次空预留）。两条线程都在认领
    往返里时置位留着，先回来的那条不等待、马上取走它去预留。

    只覆盖 worker 用到的 ``set`` / ``is_set`` / ``clear`` / ``wait``（存储的 NOTIFY 监听与控制器的
    ``watch_slots`` 只调用 ``set``）；``wait`` 与普通事件不同：返回 True 时已把置位取走。
    """

    def __init__(self) -> None:
        super().__init__()
        self._signal = threading.Condition(threading.Lock())
        self._pending = False

    def set(self) -> None:
        with self._signal:
            if not self._pending:
                self._pending = True
                self._signal.notify()  # 只叫醒一条：被叫醒的那条预留此刻所有的空槽

    def is_set(self) -> bool:
        return self._pending

    def clear(self) -> None:
        with self._signal:
            self._pending = False

    def wait(self, timeout: float | None = None) -> bool:
        """等到有一次置位并取走它（复位）；超时仍没有则返回 False。"""
        with self._signal:
            if not self._pending:
                # wait_for：被叫醒时置位可能已被刚回来、没进等待的另一条线程取走了，那就接着等剩下的时间
                self._signal.wait_for(lambda: self._pending, timeout)
            taken = self._pending
            self._pending = False
            return taken


@dataclass
class ServeReport:
    """一次 ``serve()`` 的记账。``stopped_at_drain``：停止时等满 ``drain_timeout`` 仍在跑、被停止的任务数。"""

    claimed: int = 0
    adopted: int = 0
    revived: int = 0
    released: int = 0
    rejected: list[str] = field(default_factory=list)
    stopped_at_drain: int = 0

    @property
    def drained(self) -> bool:
        return self.stopped_at_drain == 0


class ClaimChain(Protocol):
    """worker 交给控制器的"空出的槽接着认领"（``Controller.chain_claims``；实现是 ``_ClaimChain``）。"""

    def wants_more(self) -> bool:
        """此刻还认领不认领（停止请求之后不再认领）。"""
        ...

    def claim_after(self, request: SaveRequest) -> list[TaskSnapshot]:
        """``request``（刚落终态的任务的写穿）与一个任务的认领 + starting 一次提交；失败时抛 TaskError。"""
        ...

    def claim_failed(self, error: TaskError) -> None:
        """合并的提交失败了：认领那一半按一次失败的认领处理（记日志）。"""
        ...

    def host(self, snapshot: TaskSnapshot) -> None:
        """认领到的任务交给控制器（与认领线程认领到的同一条路：``Worker._host``）。"""
        ...


class _ClaimChain:
    """``ClaimChain`` 的实现：执行槽空出的那一刻，在让出它的线程上认领一个（见模块说明第 1 步）。

    为什么在那条线程上：终态那次提交本来就在它上面，认领 + starting 并进同一次提交（``ClaimStart.save``），
    每个任务少一次提交与往返；认领线程只在开头、新任务的通知、和这条路没认领到时才去认领。只认领一个——
    控制器只为刚空出的这一个槽预留（不囤积）。
    """

    def __init__(self, worker: Worker, stop: threading.Event) -> None:
        self._worker = worker
        self._stop = stop

    def wants_more(self) -> bool:
        return not self._stop.is_set()

    def claim_after(self, request: SaveRequest) -> list[TaskSnapshot]:
        controller = self._worker.controller
        return self._worker._claim_queued(
            1,
            controller.owned_buckets,
            start=ClaimStart(at=controller.clock.now(), executor=controller.start_executor, save=request),
        )

    def claim_failed(self, error: TaskError) -> None:
        if isinstance(error, (ConcurrencyConflict, TaskNotFound)):
            # 终态那一半写不成（被隔离、任务被删了）：什么也没认领，写穿层去读回对照、如实记下
            logger.debug("终态与认领合并的提交未执行（下一轮再认领）：%s", error)
        else:
            logger.warning("认领持久任务失败（下一轮再试）：%s", error)

    def host(self, snapshot: TaskSnapshot) -> None:
        worker = self._worker
        machine = StateMachine(snapshot, (), clock=worker.controller.clock, lock=threading.RLock())
        if worker._host(machine):
            with worker._report_lock:
                worker.report.claimed += 1


class WorkerHost(Protocol):
    """worker 经由它用到控制器的那几样（Controller 实现它；与 ``PipelineHost`` 同一个做法，免得互相导入）。"""

    owner: str
    max_parallel: int | None
    lease_ttl: float
    clock: Clock
    owned_buckets: frozenset[int] | None

    @property
    def store(self) -> TaskStore | None: ...
    @property
    def owns_all_buckets(self) -> bool: ...
    @property
    def active_count(self) -> int: ...
    @property
    def queued_count(self) -> int: ...
    def definitions(self) -> list[TaskDefinition]: ...
    @property
    def registered_names(self) -> frozenset[str]: ...
    def resolve_task(self, name: str) -> TaskDefinition: ...
    def start_serving(self) -> None: ...
    def watch_slots(self, event: threading.Event) -> Callable[[], None]: ...
    def reconcile(self, *, dry_run: bool = False, durable_only: bool = False) -> ReconcileReport: ...
    def local_run(self, task_id: str) -> TaskRun | None: ...
    def detach_unstarted_durable(self) -> list[TaskRun]: ...
    def host_durable(self, machine: StateMachine, definition: TaskDefinition) -> TaskRun: ...
    def host_started(self, machine: StateMachine, definition: TaskDefinition) -> TaskRun: ...
    @property
    def starts_on_claim(self) -> bool: ...
    @property
    def start_executor(self) -> str: ...
    def holding_slots(self) -> contextlib.AbstractContextManager[int]: ...
    def claiming(self) -> contextlib.AbstractContextManager[None]: ...
    def chain_claims(self, chain: ClaimChain | None) -> None: ...


class Worker:
    """一个控制器的 worker 循环（见模块说明）。由 ``Controller.serve()`` 构造并运行。"""

    def __init__(
        self,
        controller: WorkerHost,
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
    ) -> None:
        store = controller.store
        if store is None:
            raise ConfigurationError("serve() 需要共享存储：请用 Controller(store=...) 构造 worker")
        if controller.max_parallel is None:
            raise ConfigurationError(
                "serve() 需要 max_parallel（worker 按空闲槽位认领，不设上限就会把队列全搬走）："
                "请用 Controller(max_parallel=N) 构造"
            )
        if not controller.definitions():
            raise ConfigurationError(
                "serve() 之前请先登记任务（register / register_module）：worker 只执行登记了名字的配方"
            )
        self.controller = controller
        self.store = store
        self.owner = controller.owner
        self.capacity: int = controller.max_parallel
        self.poll_interval = check_seconds("poll_interval", poll_interval, low=0.01, low_open=False)
        self.drain_timeout = check_seconds("drain_timeout", drain_timeout, low=0.0, low_open=False)
        lease_ttl = controller.lease_ttl
        self.lease_ttl = lease_ttl
        self.maintenance_interval = max(0.2, lease_ttl / 2)
        self.report = ServeReport()
        self._report_lock = threading.Lock()  # 两条认领线程都记账
        self._wake = _WakeOne()  # 一次槽位让出 / 新任务通知只叫醒一条认领线程（见 _WakeOne）
        # 此刻在 _claim_and_start 里的认领线程 → 是否有另一次认领把叫醒转交给了它（_report_lock 守着）
        self._in_claim: dict[int, bool] = {}
        self._retry_due: dict[str, datetime] = {}

    # -- the loop -----------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> ServeReport:
        controller = self.controller
        controller.start_serving()
        unwatch = controller.watch_slots(self._wake)
        unlisten = self._listen()
        next_maintenance = 0.0
        halt = threading.Event()  # 主循环退出（停止或出错）时叫第二条认领线程停
        # 空出的槽在让出它的线程上接着认领（_ClaimChain）。在任何一次认领之前登记：认领来的任务可能在第二条
        # 认领线程起来之前就跑完了，它空出的槽也要接着认领。
        chained = controller.starts_on_claim and self.store.saves_on_claim
        if chained:
            controller.chain_claims(_ClaimChain(self, stop))
        helper = self._start_claimer(stop, halt)
        stopped = False  # 循环因 stop 正常退出（而不是被异常打断）
        try:
            while not stop.is_set():
                now = time.monotonic()
                if now >= next_maintenance:
                    self._maintain()
                    next_maintenance = time.monotonic() + self.maintenance_interval
                self._requeue_due()
                self._claim()
                # 取满了空槽也去等（见 _claim_loop）：认领往返期间有槽空出来、另一条认领线程也没取走那次置位时
                # _wake 仍置位着，_idle 立刻返回。
                self._idle(stop)
            stopped = True
        finally:
            if chained:
                controller.chain_claims(None)  # 等正在进行的那几次做完：之后不再有任务被认领、开始
            halt.set()
            if helper is not None:
                helper.join()  # 它至多 _STOP_CHECK 秒就看到 halt（或还在一次认领往返里）
            if unlisten is not None:
                unlisten()
            unwatch()
            # 被异常打断（KeyboardInterrupt、命令行第二下中断的 SignalStop、存储的错误）时只交还、不等：
            # 原来 finally 里照样等满 drain_timeout，第二下 Ctrl-C 若在循环退出之前到达，就被变成一次完整的
            # drain（默认 30 秒），正好与它"不再等"的意思相反。交还很快，而且让别的 worker 立刻能认领。
            self._drain(wait=stopped)
        return self.report

    def _start_claimer(self, stop: threading.Event, halt: threading.Event) -> threading.Thread | None:
        """认领并开始时，再起一条认领线程（槽位至少 2 个时；共两条）。

        为什么：认领是一次往返（语句里还有选行、加锁、写 starting 与迁移记录），一次只取得到刚空出的那一个槽；
        只有一条认领线程时，两个槽先后空出，第二个槽要等第一个槽的认领往返回来才轮得到——量下来 worker 线程
        大半时间都在这条往返上，成了吞吐的瓶颈（issue 19）。两条线程各自预留此刻的空槽（``holding_slots``
        扣掉另一次认领已预留的），所以同时在跑 + 排队 + 预留的仍不超过槽位数（不囤积），存储里的认领照旧原子、
        每个任务只被取走一次。维护（reconcile、接手、复活）仍只在主循环里做。
        """
        if self.capacity < 2 or not self.controller.starts_on_claim:
            return None
        helper = threading.Thread(
            target=self._claim_loop, args=(stop, halt), name=f"chongming-claim-{self.owner}", daemon=True
        )
        helper.start()
        return helper

    def _claim_loop(self, stop: threading.Event, halt: threading.Event) -> None:
        try:
            while not (stop.is_set() or halt.is_set()):
                self._claim_and_start()
                # 取满了空槽也不马上再取：此刻已没有空槽（认领来的占上了，另一条线程的预留也扣掉了），再取只会
                # 预留到 0 个——原来每认领到一个任务就这样扑空一次（两次控制器锁、一次认领记账）。认领往返期间
                # 有槽空出来时，_slot_freed_locked 已置位 _wake：另一条线程正等着就只叫醒它（它的预留在槽
                # 空出之后，覆盖那个槽，这条线程不再跟着扑空），否则置位留着、这条线程的 _idle 取走它立刻
                # 返回。取走在下一次 holding_slots 之前，之后空出的槽会重新置位，不会漏掉（见 _WakeOne）。
                self._idle(stop, halt)
        except Exception:
            logger.exception("worker 的第二条认领线程出错退出（主循环照常认领）")

    def _idle(self, stop: threading.Event, halt: threading.Event | None = None) -> None:
        """等到有新任务的通知、本地让出执行槽、或满一个 ``poll_interval``；停止请求最多晚 ``_STOP_CHECK`` 秒
        被看到（轮询间隔可以设得很长，SIGTERM 不该等它一整段才开始交还与收尾）。"""
        deadline = time.monotonic() + self.poll_interval
        while not stop.is_set() and not (halt is not None and halt.is_set()):
            remaining = deadline - time.monotonic()
            # wait 返回 True 时已取走了置位（_WakeOne），不再 clear：取走之后的置位可能已叫醒了另一条
            # 认领线程，清掉它只会让那条线程白醒一次。超时返回时不取：之后到的置位留给下一次等待
            # （多一次认领，不会漏）。
            if remaining <= 0 or self._wake.wait(min(remaining, _STOP_CHECK)):
                break

    def _listen(self) -> Callable[[], None] | None:
        listen = getattr(self.store, "listen", None)
        if not callable(listen):
            return None
        try:
            unlisten: Callable[[], None] = listen(self._wake)
        except TaskError as exc:
            logger.warning("无法订阅新任务通知，改为纯轮询：%s", exc)
            return None
        return unlisten

    def _names(self) -> frozenset[str]:
        return self.controller.registered_names

    def _free_slots(self) -> int:
        controller = self.controller
        return max(0, self.capacity - controller.active_count - controller.queued_count)

    def _lease_until(self) -> datetime:
        return self.controller.clock.now() + timedelta(seconds=self.lease_ttl)

    # -- claim --------------------------------------------------------------------------------------

    def _claim_queued(
        self, limit: int, owned: frozenset[int] | None, start: ClaimStart | None = None
    ) -> list[TaskSnapshot]:
        """三处认领（分两步写的 ``_claim``、认领并开始的 ``_claim_and_start_once``、接着认领的
        ``_ClaimChain.claim_after``）共用的那次 ``store.claim_queued``。

        ``start`` 只在给了时才传：分两步写的路径正是为改写了 ``claim_queued``（``starts_on_claim`` 为假）的
        存储准备的，老的第三方后端的覆盖可能根本没有 ``start`` 这个参数——多传一个 ``start=None`` 就是
        TypeError，worker 一个任务也认领不到。
        """
        extra: dict[str, ClaimStart] = {} if start is None else {"start": start}
        return self.store.claim_queued(
            self.owner,
            names=self._names(),
            buckets=None if self.controller.owns_all_buckets else owned,
            limit=limit,
            lease_until=self._lease_until(),
            **extra,
        )

    def _claim(self) -> None:
        """认领至多空闲槽位那么多个。"""
        if self.controller.starts_on_claim:
            self._claim_and_start()
            return
        free = self._free_slots()
        if free == 0:
            return
        owned = self.controller.owned_buckets
        # 从认领提交到登记进控制器之间到达的指令交还、下一轮再取（见 Controller.claiming）。
        with self.controller.claiming():
            try:
                snapshots = self._claim_queued(min(free, MAX_CLAIM), owned)
            except TaskError as exc:
                logger.warning("认领持久任务失败（下一轮再试）：%s", exc)
                return
            for snapshot in snapshots:
                machine = StateMachine(snapshot, (), clock=self.controller.clock, lock=threading.RLock())
                if self._host(machine):
                    self.report.claimed += 1

    def _claim_and_start(self) -> None:
        """认领并开始（``TaskStore.claim_queued(..., start=...)``）：认领与 starting 一次提交，认领来的任务
        立刻开始任务体。

        空闲槽先在控制器里预留（``holding_slots``），认领到的逐个占上，所以任何时刻在跑 + 排队的都不超过
        槽位数，与分开写时"只认领空闲槽位那么多个"同一条规矩。状态机不让开始的（尝试预算已用完）交回时
        仍是 queued，照旧路径交给控制器（本地排队、后台循环写 starting 时由状态机如实拒绝）。
        """
        controller = self.controller
        owned = controller.owned_buckets
        me = threading.get_ident()
        while True:
            # 进预留之前记上、放掉预留之后才去掉：另一次认领预留到 0 个时，据此知道有没有认领正占着预留
            with self._report_lock:
                self._in_claim[me] = False
            free = 0
            try:
                free = self._claim_and_start_once(controller, owned, me)
            finally:
                with self._report_lock:
                    handed = self._in_claim.pop(me)
            # 有人转交了叫醒、这次又确实预留过槽（取到的可能比预留的少、放掉了一些）：不等待，再预留一次。
            # 这次没预留到槽的不理会转交——两条线程都预留到 0 个时互相转交会来回空转。
            if not (handed and free > 0):
                return

    def _claim_and_start_once(self, controller: WorkerHost, owned: frozenset[int] | None, me: int) -> int:
        """一次预留 + 认领并开始；返回这次预留到的槽数（``_claim_and_start`` 据此决定要不要再来一次）。"""
        with controller.claiming(), controller.holding_slots() as free:
            if free == 0:
                # 空槽都被另一次正在进行的认领预留着，而这次是被叫醒来的（新任务的通知、槽位让出）：那次认领
                # 的语句可能早于新任务落库，取到的比预留的少，放掉的槽之后没人置位、就没人认领了。把叫醒转交
                # 给它（见 _claim_and_start）。
                with self._report_lock:
                    for other in self._in_claim:
                        if other != me:
                            self._in_claim[other] = True
                return 0
            try:
                snapshots = self._claim_queued(
                    min(free, MAX_CLAIM),
                    owned,
                    start=ClaimStart(at=controller.clock.now(), executor=controller.start_executor),
                )
            except TaskError as exc:
                logger.warning("认领持久任务失败（下一轮再试）：%s", exc)
                return 0  # 出错时不因转交马上重试：下一轮再试
            hosted = 0
            for snapshot in snapshots:
                machine = StateMachine(snapshot, (), clock=controller.clock, lock=threading.RLock())
                if self._host(machine):
                    hosted += 1
        with self._report_lock:
            self.report.claimed += hosted
        return free

    def _host(self, machine: StateMachine) -> bool:
        """把存储里已是本节点持有的持久任务交给控制器管（接着它存储里的版本写）。"""
        snapshot = machine.snapshot
        recipe = snapshot.recipe
        assert recipe is not None
        controller = self.controller
        try:
            definition = controller.resolve_task(snapshot.name)
            if snapshot.status is S.STARTING:  # 认领时已开始（claim_queued(start=...)）：占上预留的槽，立刻跑
                controller.host_started(machine, definition)
            else:
                controller.host_durable(machine, definition)
        except ConfigurationError as exc:
            # 配方与本节点登记的定义对不上（参数签名变了之类）：如实落 stopped，不让它永远卡在"被我持有"。
            self._reject(machine, str(exc))
            return False
        except TaskError as exc:
            logger.warning("接管持久任务 %s 失败：%s", snapshot.task_id, exc)
            return False
        if snapshot.status is S.RETRY_WAIT and snapshot.retry_at is not None:
            self._retry_due[snapshot.task_id] = snapshot.retry_at
        return True

    def _reject(self, machine: StateMachine, why: str) -> None:
        snapshot = machine.snapshot
        self.report.rejected.append(snapshot.task_id)
        logger.error("持久任务 %s 的配方无法在本节点执行：%s", snapshot.task_id, why)
        if machine.status is S.STARTING:
            # 认领时已开始（claim_queued(start=...)）：starting 没有直达 stopped 的边，
            # 与在跑的任务被停止一样经 stopping
            machine.mark_stopping(actor=self.owner, reason="配方与本节点登记的任务定义不符")
        if not machine.can(S.STOPPED):
            return
        failure = Failure(
            FailureKind.EXCEPTION, f"配方无法在 worker {self.owner} 上执行：{why}", retryable=False
        )
        machine.mark_stopped(failure=failure, actor=self.owner, reason="配方与本节点登记的任务定义不符")
        try:
            self.store.save(
                machine.snapshot,
                expect_version=snapshot.status_version,
                transitions=machine.transitions_since(snapshot.status_version),
            )
        except TaskError as exc:
            logger.warning("写回被拒绝的持久任务 %s 失败：%s", snapshot.task_id, exc)

    def _requeue_due(self) -> None:
        if not self._retry_due:
            return
        now = self.controller.clock.now()
        for task_id, due in list(self._retry_due.items()):
            if due > now:
                continue
            del self._retry_due[task_id]
            run = self.controller.local_run(task_id)
            if run is not None:
                run.retry_due()

    # -- adoption and re-run ------------------------------------------------------------------------

    def _maintain(self) -> None:
        try:
            report = self.controller.reconcile(durable_only=True)
        except TaskError as exc:
            logger.warning("reconcile 失败（下一轮再试）：%s", exc)
            return
        names = self._names()
        tried: set[str] = set()
        for lost in report.lost:
            if _revivable(lost, names):
                tried.add(lost.task_id)
                self._revive(lost)
        for lost in self._stranded_lost(names, tried):
            self._revive(lost)
        budget = self._free_slots()
        for snapshot in report.adoptable:
            if (
                snapshot.recipe is None
                or snapshot.name not in names
                or snapshot.status not in _ADOPT_STATUSES
            ):
                continue
            if snapshot.status is S.QUEUED:
                if budget <= 0:
                    continue  # 不囤积：剩下的留给下一轮或别的 worker
                budget -= 1
            self._adopt(snapshot)

    def _stranded_lost(self, names: frozenset[str], tried: set[str]) -> list[TaskSnapshot]:
        """存储里落了 lost、本该由 ``on_lost="retry"`` 复活却没复活成的持久任务（见模块说明"补救"）。

        ``tried``：这一轮刚试过的不再试（写存储刚出错的留到下一轮）。
        """
        controller = self.controller
        query = TaskQuery(
            statuses=_LOST,
            durable=True,
            buckets=None if controller.owns_all_buckets else controller.owned_buckets,
            lease_expired_before=controller.clock.now(),
            order=QueryOrder.OLDEST_FIRST,
        )
        stranded: list[TaskSnapshot] = []
        try:
            for snapshot in self.store.query(query):
                if snapshot.task_id in tried or not _revivable(snapshot, names):
                    continue
                history = self.store.history(snapshot.task_id)
                last = history[-1] if history else None
                if (
                    last is not None
                    and last.trigger == TRIGGER_RECONCILE
                    and last.version == snapshot.status_version
                ):
                    stranded.append(snapshot)
        except TaskError as exc:
            logger.warning("查找未复活的失联持久任务失败（下一轮再试）：%s", exc)
        return stranded

    def _take_over(
        self, snapshot: TaskSnapshot, change: Callable[[StateMachine], Any]
    ) -> StateMachine | None:
        """在一台临时状态机上做一次接手类的迁移，以"租约此刻仍已过期"为条件写回；成功则续上本节点的租约。"""
        clock = self.controller.clock
        machine = StateMachine(snapshot, (), clock=clock, lock=threading.RLock())
        try:
            change(machine)
        except TaskError as exc:
            logger.debug("任务 %s 不能接手：%s", snapshot.task_id, exc)
            return None
        now = clock.now()
        try:
            self.store.save(
                machine.snapshot,
                expect_version=snapshot.status_version,
                transitions=machine.transitions_since(snapshot.status_version),
                lease_expired_before=now,
            )
        except ConcurrencyConflict:
            return None  # 别的 worker 抢先接手了，或者原持有者活过来续上了租约
        except TaskError as exc:
            logger.warning("接手任务 %s 失败：%s", snapshot.task_id, exc)
            return None
        until = self._lease_until()
        machine.update_side(lease_owner=self.owner, lease_until=until)
        try:
            self.store.touch(snapshot.task_id, lease_owner=self.owner, lease_until=until)
        except TaskError as exc:
            logger.warning("给接手的任务 %s 续租失败（下一轮续租补上）：%s", snapshot.task_id, exc)
        return machine

    def _adopt(self, snapshot: TaskSnapshot) -> None:
        dead = snapshot.owner or "（无人）"
        until = snapshot.lease_until.isoformat(timespec="seconds") if snapshot.lease_until else "从未续租"
        reason = f"原持有者 {dead} 的租约已过期（lease_until={until}）：由 {self.owner} 接手"
        with self.controller.claiming():
            machine = self._take_over(
                snapshot, lambda m: m.adopt(self.owner, actor=self.owner, reason=reason)
            )
            hosted = machine is not None and self._host(machine)
        if hosted:
            self.report.adopted += 1
            logger.info("接手了 %s 的持久任务 %s（%s）", dead, snapshot.task_id, snapshot.status.value)

    def _revive(self, lost: TaskSnapshot) -> None:
        dead = lost.lease_owner or lost.owner or "（未知）"

        def change(machine: StateMachine) -> None:
            machine.retry(
                actor=self.owner,
                reason=f"持久任务在 {dead} 上运行时载体消失，配方 on_lost='retry'：重新排队（可能重复执行）",
            )
            machine.adopt(
                self.owner, actor=self.owner, reason=f"原持有者 {dead} 已失联：由 {self.owner} 接手重跑"
            )

        with self.controller.claiming():
            machine = self._take_over(lost, change)
            hosted = machine is not None and self._host(machine)
        if hosted:
            self.report.revived += 1
            logger.info("重跑失联节点 %s 上的持久任务 %s", dead, lost.task_id)

    # -- drain --------------------------------------------------------------------------------------

    def _drain(self, *, wait: bool) -> None:
        """停止认领之后：交还还没开始的持久任务，等在跑的跑完（最多 drain_timeout；``wait=False`` 不等），
        再停掉剩下的（由调用方的 close() 停）。"""
        controller = self.controller
        for run in controller.detach_unstarted_durable():
            if self._release(run):
                self.report.released += 1
        if not wait:
            return
        deadline = time.monotonic() + self.drain_timeout
        while controller.active_count and time.monotonic() < deadline:
            time.sleep(0.05)
        self.report.stopped_at_drain = controller.active_count

    def _release(self, run: TaskRun) -> bool:
        """把一个本地还没开始的持久任务交还存储：持有者清空（版本不变），任何 worker 都能立刻认领。"""
        snapshot = run.snapshot
        try:
            self.store.save(snapshot.evolve(owner=None), expect_version=snapshot.status_version)
        except TaskError as exc:
            logger.warning("交还持久任务 %s 失败（租约过期后会被接手）：%s", snapshot.task_id, exc)
            return False
        return True


__all__ = [
    "DEFAULT_DRAIN_TIMEOUT",
    "DEFAULT_POLL_INTERVAL",
    "ClaimChain",
    "ServeReport",
    "Worker",
    "WorkerHost",
]
