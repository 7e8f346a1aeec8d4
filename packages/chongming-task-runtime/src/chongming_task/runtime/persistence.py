"""Controller 与存储之间的写穿层。

* 每次状态迁移：在任务自己的锁内，把新快照连同它新增的迁移记录原子地 save（带 expect_version）。
  锁内写保证同一任务的写入按版本顺序到达存储。同一时刻许多任务的 save 经组提交（runtime/group_commit.py）
  合进一个写事务；每个调用方仍只在它自己那一项提交之后返回。
* 存储故障绝不让任务失败：记进 ``failures``（最多 20 条，保留最新的）并打日志。存储里落后的
  版本由下一次成功的写入追平（一次 save 带上所有缺的迁移记录），所以存储最终收敛。
* 进度、心跳与租约走 touch，由 Controller 的后台循环按固定节奏批量写，从不逐次 checkpoint 写。
* 结果未知的写（连接在语句中途断了：服务器可能已经提交，只是回执丢了）之后不盲目重放：下一次先读回存储的
  版本与历史对照（runtime/fencing.py）——是本进程写过的前缀就从那里接着写，是别人写的就认定被隔离（fenced），
  如实记下、不再覆盖（docs/distributed.md §7.2、§7.3）。
* 日志按故障汇总（runtime/outage_log.py）：故障期间每个间隔一行带计数的汇总，不是每任务每轮一行。
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

from chongming_task.clock import Clock
from chongming_task.core.locks import YieldingLock
from chongming_task.core.state_machine import StateMachine
from chongming_task.errors import (
    ConcurrencyConflict,
    ConfigurationError,
    DuplicateTaskId,
    StoreError,
    TaskError,
)
from chongming_task.models import Progress, TaskSnapshot, Transition
from chongming_task.runtime.fencing import LeaseWatch, Verdict, compare, fenced_text
from chongming_task.runtime.group_commit import GroupCommit, Pending
from chongming_task.runtime.outage_log import OutageLog
from chongming_task.states import TERMINAL_STATUSES, TaskStatus
from chongming_task.storage import SaveRequest, TaskStore

logger = logging.getLogger("chongming_task.controller")

MAX_PERSIST_FAILURES = 20

_NOTHING_WRITTEN: tuple[None, None] = (None, None)


@dataclass(frozen=True)
class PersistFailure:
    """一次写存储失败的记录。任务本身没问题，坏的只是可观测性——但绝不静默。"""

    at: datetime
    task_id: str
    operation: str
    error: str


def _plain_version(entry: int | _TaskState | None) -> int | None:
    """记账里"平常"的版本：已落库、结果确定、没被隔离、没有推迟写的 running；否则 None。"""
    if entry is None or entry.__class__ is int:
        return entry
    assert isinstance(entry, _TaskState)
    if entry.fenced or entry.uncertain or entry.lazy is not None:
        return None
    return entry.persisted_version


@dataclass(slots=True)
class _TaskState:
    """一个任务写穿的记账里"不平常"的那一份（``WriteThrough._tasks`` 的值；平常的只是一个 int，见那里）。"""

    # 存储已确认到的版本。记账里的任务都确认在存储里存在过（create 已确认，或从存储认领来），所以总有一个
    # 版本：读回时不见了的按隔离处理、不重建（``_converge``）。
    persisted_version: int
    # 上一次写的结果未知（连接中途断了、或撞了冲突/重复 id——可能是自己那次丢了回执的写）：下次先读回再写。
    uncertain: bool = False
    # 被隔离：存储里这个任务已被别人改写。此后不再写它，对外报告以存储为准。
    fenced: bool = False
    # 推迟写的 running（见 WriteThrough.on_transition）：还没落库的那一项。平常只是登记下的 SaveRequest
    # （没排进组提交）；到点时后台循环把它排进组提交（``flush_lazy``），之后是排着的 Pending、可能已被某个
    # 写者捎走。
    lazy: Pending | SaveRequest | None = None


TOUCH_BATCH = 2000
"""旁路回写（进度、心跳、续租）每个事务至多写几个任务。"""

RENEW_BATCH = 20_000
"""只续租的任务一条语句最多带几个：同一组值按主键写，两万行在 Postgres 上是一两百毫秒，远在一次调用的
时限之内；再大的一批写失败时要重来的也多。"""

LEASE_REUSE = 0.05
"""逐个提交时，这么长（秒）之内的提交共用同一个租约时刻（``WriteThrough.lease_fields``）；租约很短时取
lease_ttl 的 1/20。"""

LAZY_RUNNING_DELAY = 0.05
"""推迟写的 running 最多等多久（秒）：期间本任务没有再写（没落下一个状态）时，由后台循环补写。"""

_STARTING = TaskStatus.STARTING
_RUNNING = TaskStatus.RUNNING

CREATE_ATTEMPTS = 3
"""提交时的 create 最多试几次（只在读回确认"没写进去"时才重试）。"""


def _records_since(
    machine: StateMachine, expected: int, version: int, carried: Sequence[Transition], record: Transition
) -> Sequence[Transition]:
    """（持有 machine.lock）版本 ``expected`` 之后、直到 ``version`` 的迁移记录，与
    ``machine.transitions_since(expected)`` 逐条相同：手里现成的记录——撤回的推迟写那一项带着的 ``carried``
    加上刚发生的那条 ``record``——正好首尾相接地补上这一段时直接用它们，否则照常从状态机的历史里取。

    为什么：``transitions_since`` 每条记录都从紧凑历史现造一个 Transition（``unpack_transition``），而写穿
    推迟写的 running、交出终态的那两次写要的正是监听器刚拿到的记录与撤回的那一条——逐个 submit 时每个任务
    省三次现造（issue 17）。记录都是不可变的同一批对象（状态机发给监听器的那条，就是它之后解包出的那条的
    等值对象），存储收到的内容一字不差。"""
    first = carried[0].version if carried else record.version
    if (
        record.version == version
        and first == expected + 1
        and len(carried) == version - expected - 1
        and (not carried or carried[-1].version == version - 1)
    ):
        return (*carried, record) if carried else (record,)
    return machine.transitions_since(expected)


class _CreateItems(Sequence[tuple[TaskSnapshot, Sequence[Transition]]]):
    """``store.create_many`` 的入参：(快照, 迁移记录) 对按需现造，不为每个任务预先存一个元组。

    一批一千个任务，那一千个元组要活过整个写事务，期间会被循环 GC 晋升到最老的一代、计入"该做全量回收了"
    的账；按顺序遍历时 ``zip`` 还会复用同一个结果元组。"""

    __slots__ = ("_machines", "_snapshots")

    def __init__(self, snapshots: list[TaskSnapshot], machines: Sequence[StateMachine]) -> None:
        self._snapshots = snapshots
        self._machines = machines

    def __len__(self) -> int:
        return len(self._snapshots)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return list(
                zip(self._snapshots[index], [m.transitions for m in self._machines[index]], strict=True)
            )
        return self._snapshots[index], self._machines[index].transitions

    def __iter__(self) -> Iterator[tuple[TaskSnapshot, Sequence[Transition]]]:
        return zip(self._snapshots, (m.transitions for m in self._machines), strict=True)


class _Unreachable(StoreError):
    """批量 create 失败后读回也读不到：存储仍不可用。"""


class WriteThrough:
    """一个 Controller 的写穿状态。"""

    def __init__(
        self,
        store: TaskStore,
        *,
        owner: str,
        lease_ttl: float,
        clock: Clock,
        on_failure: Callable[[PersistFailure], None] | None = None,
    ) -> None:
        self.store = store
        # 每次失败都告诉它（事件钩子的 StoreErrorEvent）；failures 只留最新 20 条，计数得靠这个。
        self.on_failure = on_failure
        self.owner = owner
        self.lease_ttl = lease_ttl
        self.clock = clock
        self.failures: deque[PersistFailure] = deque(maxlen=MAX_PERSIST_FAILURES)
        # task_id → 存储里的版本。平常（已落库、结果确定、没被隔离、没有推迟写的 running）只是那个 int；有了
        # 这几样标记之一时才换成一个 _TaskState（``_promote``，只由持有该任务锁的线程做），写成功、标记都清掉
        # 之后换回 int（``_written``）。为什么：积压上万个任务时每个任务一个常驻的 _TaskState 就是一个被循环
        # GC 追踪、每次全量回收都要扫的对象；int 不被追踪（issue 17）。
        self._tasks: dict[str, int | _TaskState] = {}
        # task_id → 上次写进存储的 (进度, 心跳)：只为写过进度 / 心跳的任务记
        # （有变化才写，见 flush_side_channel）。
        # 读写都在 _lock 下（后台循环的旁路回写与任务线程的终态补写都会写它；forget 在同一把锁下删）。
        self._side_written: dict[str, tuple[Progress | None, datetime | None]] = {}
        self._behind: dict[str, StateMachine] = {}
        # task_id → 本进程从存储的哪个版本接着写（``track``：认领 / 接手来的持久任务，接手那一刻存储里的
        # 版本）。只为这些任务记（提交的任务从版本 0 写起，不记）。为什么要记：它们的状态机只凭快照重建、没有
        # 那之前的历史，结果未知的写之后读回对照时（``_converge``）只能对照这个版本之后的那一段，否则本进程
        # 自己写成的前缀永远"对不上"，任务被误判隔离、一直停在 running 直到被判 lost（runtime/fencing.py 的
        # compare）。值是 int（不被 GC 追踪），与 _tasks 同在 _lock 下增删。
        self._bases: dict[str, int] = {}
        # 每次迁移都拿、临界区只有字典操作：用不排车队的锁（见 core/locks.py）。
        self._lock = YieldingLock()
        self._failure_seq = 0  # 写失败的累计次数（catch_up 据此判断"存储此刻不可用"）
        self.outage = OutageLog(logger, monotonic=clock.monotonic)
        self.lease = LeaseWatch(lease_ttl, clock.monotonic())
        self._lease_span = timedelta(seconds=lease_ttl)
        # create 时沿用快照里已有的租约（lease_fields 在提交时给的），只要它是一秒之内算出来的：再旧就重算。
        self._fresh_lease = timedelta(seconds=max(lease_ttl - 1.0, lease_ttl / 2))
        # lease_fields 最近一次算的租约：(算它时的 now, 共用到何时, 字段)。整个元组一次换上，并发的提交读到的
        # 总是同一次算的三项。
        self._lease_reuse = timedelta(seconds=min(LEASE_REUSE, lease_ttl / 20))
        self._lease_issued: tuple[datetime, datetime, Mapping[str, object]] | None = None
        # 组提交只对能省下提交的存储有用（TaskStore.group_commit）；否则写穿直接 save。
        self.commits: GroupCommit | None = GroupCommit(store) if store.group_commit else None
        # 单个提交的 create 也排进组提交（与同一时刻排着的 save 合进一个事务）：只在存储能把混合批写成一个
        # 事务时（TaskStore.group_commit_creates）；否则照旧直接 create，不多一层排队。
        self._create_commits = self.commits if store.group_commit_creates else None
        # 推迟写的 running：task_id → (最晚何时由后台循环补写, 状态机)。守护锁是 _lock。
        self._lazy: dict[str, tuple[float, StateMachine]] = {}
        self.on_lazy: Callable[[], None] | None = None
        """一项推迟写的 running 排进来、而后台循环不会在它到点之前醒来时调用（叫醒后台循环，让它按
        ``loop_deadline`` 重新算等待时长）。"""
        # 后台循环上一次算出的醒来时刻（monotonic，见 loop_deadline）。初值 inf：还没算过，排进来就叫醒它。
        self._loop_due = math.inf
        self._lazy_since_plan = False  # 上次算醒来时刻之后又有推迟写的 running 排进来过

    def record(self, task_id: str, operation: str, exc: BaseException) -> None:
        """记一次写存储失败（最多保留最新 20 条）；日志交给限流的 OutageLog（故障期间按间隔汇总）。"""
        failure = PersistFailure(self.clock.now(), task_id, operation, f"{type(exc).__name__}: {exc}")
        with self._lock:
            self.failures.append(failure)
            self._failure_seq += 1
        self.outage.failure(operation, task_id, failure.error)
        if self.on_failure is not None:
            self.on_failure(failure)

    def _note(self, task_id: str, operation: str, text: str) -> None:
        """记一条不是"写失败"的事件（fenced / lease_expired）：逐条记、逐条打 WARNING（每个任务至多一次）。"""
        with self._lock:
            self.failures.append(PersistFailure(self.clock.now(), task_id, operation, text))
        logger.warning("%s %s：%s", operation, task_id, text)

    def lease_until(self) -> datetime:
        return self.clock.now() + self._lease_span

    def lease_fields(self) -> Mapping[str, object]:
        """新任务的快照一开始就带上本节点的租约（``StateMachine.create`` 的字段）：create 时不必再为它复制一份
        快照（``update_side``），每个提交省一次整份快照的拷贝。

        ``LEASE_REUSE`` 之内的提交共用同一个租约时刻（同一个 datetime 对象、同一份只读字段）。为什么：逐个
        submit 时每个任务要现算一个新时刻，存储还要为它编一次原文与排序键（SQLite 每个新时刻约 7k 条指令，
        bench/README.md 第二十一轮 sq21）；共用的那一个在存储的时间记忆表里命中。代价：任务的租约至多早
        ``LEASE_REUSE`` 到期——远短于 create 认"刚算的"租约的余量（``_fresh_lease`` 比 lease_ttl 少一秒或一半，
        所以 create 照样原样用它），也远短于续租的间隔。按 ``now`` 判定而不是单调时钟：测试的假时钟只拨
        ``now`` 时照样重算。"""
        now = self.clock.now()
        issued = self._lease_issued
        if issued is not None and issued[0] <= now < issued[1]:
            return issued[2]
        fields = MappingProxyType({"lease_owner": self.owner, "lease_until": now + self._lease_span})
        self._lease_issued = (now, now + self._lease_reuse, fields)
        return fields

    def _lease_floor(self) -> datetime:
        """快照里已有的租约（提交时 ``lease_fields`` 给的）不早于这个时刻，create 就原样用它、不复制快照。

        两种情形都够用：一秒之内算出来的（``_fresh_lease``）；或者不短于本节点自己认定的租约
        （``LeaseWatch``：上次续租开始的时刻 + lease_ttl）——那样别的节点能合法接管它的那一刻，本节点也
        已经知道自己的租约过期了，与续租过的任务一样。后一条让 ``submit_many`` 先造完十万个任务、几秒后
        才逐批落库时，同一份模板租约在下一次续租之前一直可用。本节点的租约已过期时只认前一条。"""
        now = self.clock.now()
        left = self.lease.valid_for(self.clock.monotonic())
        if left <= 0:
            return now + self._fresh_lease
        return now + min(self._fresh_lease, timedelta(seconds=left))

    def _lease_usable(self, snapshot: TaskSnapshot, floor: datetime) -> bool:
        """提交时带上的租约能原样落库：是本节点的，且不早于 ``floor``（``_lease_floor``）。create 与
        create_many 的同一条规则。"""
        lease = snapshot.lease_until
        return snapshot.lease_owner == self.owner and lease is not None and lease >= floor

    def _lease_fresh(self, snapshot: TaskSnapshot) -> bool:
        """单个 create 的 ``_lease_usable(snapshot, self._lease_floor())``，结果相同，只是常见情形更省。

        ``floor = now + min(_fresh_lease, 本节点租约余下的时间)``，所以"不早于 floor"就是"不早于
        ``now + _fresh_lease``，或不早于 ``now + 余下的时间``"。提交时刚算的租约（``lease_fields``，
        几微秒前的 ``now + lease_ttl``）总满足前一条：一次取时间、一次比较就够，不必再读单调时钟、问
        LeaseWatch、造 timedelta（每个提交约 1 µs，issue 17）。不满足时才照原样算后一条。"""
        lease = snapshot.lease_until
        if snapshot.lease_owner != self.owner or lease is None:
            return False
        now = self.clock.now()
        if lease >= now + self._fresh_lease:
            return True
        left = self.lease.valid_for(self.clock.monotonic())
        return left > 0 and lease >= now + timedelta(seconds=left)

    def create(self, machine: StateMachine) -> None:
        """提交时落库：必须成功，任务才会执行（issue 16.6）。

        首次落库失败（没有写权限的角色、只读文件、存储宕机）抛 StoreError，调用方据此拒绝提交、任务体一行
        也不跑——否则任务在存储里永远不可见，只留下一串"写存储失败（任务照常运行）"。"存储故障不让任务失败"
        只从这一步成功之后开始：之后的 save / touch 失败记进 persist_failures，恢复后追平。
        重复 id 原样抛出。
        """
        # 先在状态机上记下租约，再把这同一个快照对象交给存储（不另造一份副本）。提交时已经带上了
        # （lease_fields）且是刚算的：原样用它，不再复制一份快照。
        snapshot = machine.snapshot
        lease = snapshot.lease_until
        # 同 _lease_fresh(snapshot)，只是先就地判它的常见情形（提交时刚算的租约），少一层调用。
        if not (
            lease is not None
            and snapshot.lease_owner == self.owner
            and lease >= self.clock.now() + self._fresh_lease
        ) and not self._lease_fresh(snapshot):
            snapshot = machine.update_side(lease_owner=self.owner, lease_until=self.lease_until())
        task_id = snapshot.task_id
        create_commits = self._create_commits
        last: TaskError | None = None
        duplicate: DuplicateTaskId | None = None
        # 结果未知的失败（连接在语句中途断了、回执丢了，issue 22.1）之后先读回：存储里正是本进程刚建的这一份
        # → 成功；确定没写进去 → 再建一次（至多 CREATE_ATTEMPTS 次）；读不到、或是别人的同名任务 → 拒绝提交。
        # 只有存储确认了，任务体才会执行（issue 16.6）。
        for attempt in range(CREATE_ATTEMPTS):
            try:
                # 存储的写穿入口（与 create 同一语义；内存存储直接收下状态机的紧凑历史，
                # 见 TaskStore._create_direct）。经组提交时语义、报错都相同，只是可能与别的任务的写同一事务。
                if create_commits is None:
                    self.store._create_direct(snapshot, machine.packed_transitions())
                else:
                    create_commits.create(snapshot, machine.packed_transitions())
            except DuplicateTaskId as exc:
                # 必须排在 ConfigurationError 前面（它是其子类）：原来排在后面，下面的读回永远走不到，
                # 撞上自己那次迟到的提交也被报成"task_id 已存在"。
                if last is None:
                    raise  # 第一次就撞了：真的有同名任务
                # 先前那次"失败"的 create 其实写进去了（读回之后才落地）：下面读回确认是不是自己的。
                duplicate = exc
            except ConfigurationError:
                raise
            except TaskError as exc:
                last = exc
            else:
                self._tasks[task_id] = snapshot.status_version
                return
            verdict = self._read_back_create(machine)
            if verdict is Verdict.PREFIX:
                # 写进去了，只是回执丢了：照常提交，但这次失败如实记下（persist_failures），不静默。
                if last is not None:
                    self.record(task_id, "create", last)
                self._tasks[task_id] = snapshot.status_version
                return
            if duplicate is not None:
                raise duplicate  # 别人的同名任务（或读不到）：如实报重复
            if verdict is not Verdict.ABSENT or attempt == CREATE_ATTEMPTS - 1:
                break
        raise StoreError(f"任务 {task_id!r} 没能写进存储，已拒绝提交（任务没有执行）：{last}") from last

    def create_many(self, machines: Sequence[StateMachine]) -> list[TaskError | None]:
        """批量提交时落库（``Controller.submit_many``）：一次 ``store.create_many``，返回逐项结果。

        逐项的语义与 :meth:`create` 相同：``None`` 的那些已确认写进存储，才会执行。整批的事务失败（结果
        未知）时逐个读回：存储里正是这一份 → 成功；确定没写进去 → 单独 create（带 create 的重试）；
        读不到 → 这一项拒绝提交（StoreError）。
        """
        # 与 create 同一规则：提交时带上的租约够新就原样用（十万个任务省十万次快照复制），否则复制一份、
        # 换上新租约（整批同一个值）。
        floor = self._lease_floor()
        lease_until: datetime | None = None
        snapshots: list[TaskSnapshot] = []
        for machine in machines:
            snapshot = machine.snapshot
            if not self._lease_usable(snapshot, floor):
                if lease_until is None:
                    lease_until = self.lease_until()
                snapshot = machine.update_side(lease_owner=self.owner, lease_until=lease_until)
            snapshots.append(snapshot)
        try:
            results = self.store.create_many(_CreateItems(snapshots, machines))
        except ConfigurationError:
            raise
        except TaskError as exc:
            # 逐个读回；一旦读不到（存储仍不可用），其余的不再逐个去撞（每次都可能等满一次超时）。
            results = []
            for machine in machines:
                if results and isinstance(results[-1], _Unreachable):
                    results.append(_Unreachable(f"任务 {machine.task_id!r} 没能写进存储，已拒绝提交：{exc}"))
                else:
                    results.append(self._create_after_unknown(machine, exc))
            return results
        for snapshot, error in zip(snapshots, results, strict=True):
            if error is None:
                self._tasks[snapshot.task_id] = snapshot.status_version
        return results

    def _create_after_unknown(self, machine: StateMachine, exc: TaskError) -> TaskError | None:
        verdict = self._read_back_create(machine)
        task_id = machine.task_id
        if verdict is Verdict.PREFIX:
            self.record(task_id, "create", exc)  # 写进去了，只是回执丢了：如实记下
            self._tasks[task_id] = machine.snapshot.status_version
            return None
        if verdict is Verdict.ABSENT:
            try:
                self.create(machine)
            except ConfigurationError as refused:  # 含 DuplicateTaskId：这一项自己的问题
                return refused
            except TaskError as again:
                return _Unreachable(str(again))
            return None
        text = f"任务 {task_id!r} 没能写进存储，已拒绝提交（任务没有执行）：{exc}"
        if verdict is Verdict.DIVERGED:  # 存储里是别人的同名任务
            return StoreError(text)
        return _Unreachable(text)

    def track(self, machine: StateMachine) -> None:
        """接着存储里已有的版本写（认领 / 接手来的持久任务：存储里就是 ``machine.snapshot`` 这一版）。

        这一版同时记作本进程写这个任务的起点（``_bases``）：读回对照时，它及以前的记录是接手时的底子。"""
        snapshot = machine.snapshot
        task_id = snapshot.task_id
        version = snapshot.status_version
        with self._lock:
            self._tasks[task_id] = version
            if version:
                self._bases[task_id] = version
            else:  # 版本 0 的任务没有底子（与提交的任务一样整段对照）；同一个 id 先前记过的起点作废
                self._bases.pop(task_id, None)

    def _read_back_create(self, machine: StateMachine) -> Verdict | None:
        """create 结果未知之后读回：PREFIX = 存储里正是这一份；ABSENT = 确定没写进去；None = 读不到。"""
        snapshot = machine.snapshot
        try:
            stored = self.store.get(snapshot.task_id)
            history = self.store.history(snapshot.task_id) if stored is not None else []
        except TaskError:
            return None
        if stored is None:
            return Verdict.ABSENT
        if stored.status_version == snapshot.status_version:
            return compare(machine.transitions, stored, history)
        return Verdict.DIVERGED

    def on_transition(self, machine: StateMachine, snapshot: TaskSnapshot, record: Transition) -> None:
        """在任务锁内调用：把存储追到当前版本（``record`` 是刚发生的那条迁移：存储正好落后它一条时
        直接写它）。

        例外是线程执行器的 ``starting → running``：它只登记、不写也不排进组提交，任务体随即开始。要挡在任务体
        前面的只有 ``starting``（用户指南 §9.8）：存储里 starting 与 running 同样"占着执行槽"，载体失联时
        reconcile 都判 lost，多等一次提交换不来任何保证。running 由本任务的下一次写落库——通常是终态那次写，
        连同 running 的迁移记录一起写（少一次提交）——到点（``LAZY_RUNNING_DELAY`` 秒）还没写的由后台循环排进
        组提交补写（``flush_lazy``，同一时刻到点的一次提交写完）。存储里的历史始终没有空洞：running 的记录总在
        终态之前、同一事务或更早落库。进程执行器的 running 带着子进程 pid（父进程死后据此找孤儿进程），照常
        同步写。

        为什么登记时不排进组提交（第二十一轮 sq21 之前排进去、等别的任务的提交捎上）：逐个 submit 的短任务里
        它从来没被捎走过（sq20 数过：3,000 个任务撤回成功 3,000 次），每个任务排进去再撤回是约 200 条字节码、
        两次组提交加锁、一个 Pending 的纯开销。代价只落在长任务上：它的 running 至多晚 ``LAZY_RUNNING_DELAY``
        落库，而不是赶上下一次任何提交。
        """
        # 最常见的情形——记账是平常的 int、存储正好落后这一条——直接写这一条，不走 sync 的通用路径（每个任务
        # 三次迁移都走这里，issue 17）：写法、报错处理与 sync 逐项相同，写不成时交给 _write_failed（冲突之后
        # 读回对照，或记下、留待追平）。
        task_id = snapshot.task_id
        tasks = self._tasks
        entry = tasks.get(task_id)
        version = record.version
        commits = self.commits
        if entry.__class__ is int and version == entry + 1:
            if commits is None:
                # 不经组提交（内存存储）：没有可推迟的写。写的是监听器拿到的这一版快照：状态机此刻若已又走了
                # 一步（监听器里嵌套的迁移），这一版照样是接得上的那一版，下一步由它自己的监听器接着写；紧凑
                # 记录不是这一版的（last_packed 已是更新的那条）时存储按 _save_direct 完整检查（见
                # TaskStore._save_next）。
                try:
                    # 存储的"正好落后一条"入口（与 _save_direct(snapshot, entry, (record,)) 同一语义）：状态机
                    # 刚记下的紧凑记录原样交出去，内存存储直接存下它（见 TaskStore._save_next）。
                    self.store._save_next(snapshot, record, machine.last_packed())
                except TaskError as exc:
                    self._write_failed(machine, record, entry, exc)
                    return
            else:
                # 经组提交：sync 写的是状态机此刻的快照。监听器拿到的正是它（没有嵌套的迁移）时，sync 要写的
                # 就是 (这一版, 期望 entry, 只有这一条记录)——在这里直接写，少 sync → _rounds → _written →
                # _caught_up 四层调用（执行槽上每个任务的 starting 都走这里）。嵌套的迁移照旧走 sync。
                if machine.snapshot is not snapshot:
                    self.sync(machine, record)
                    return
                if record.from_status is _STARTING and record.to_status is _RUNNING and snapshot.pid is None:
                    # 推迟写的 running（见上；子进程的 pid 要尽快落库——父进程死后据此找孤儿进程——照常写）。
                    if not self._defer_running(commits, machine, snapshot, entry, (record,)):
                        self.sync(machine, record)
                    return
                try:
                    # 组提交：与同一时刻别的任务的迁移合进一个写事务；只在这一项提交之后返回。
                    commits.save(SaveRequest._write_through(snapshot, entry, (record,)))
                except TaskError as exc:
                    self._write_failed(machine, record, entry, exc)
                    return
            # 同 _written（记账是平常的 int：没有标记要留，只在还在管时记下新版本）与 _caught_up，只是内联。
            # 记账只可能被持有本任务锁的线程（我们）换成 _TaskState，所以这里仍是 int；forget 在 _lock 下删，
            # 下面同一把锁里判"还在不在"（热路径的加锁写法见 core/locks.py）。
            lock = self._lock
            if not lock.try_acquire():
                lock.acquire()
            try:
                if task_id in tasks:
                    tasks[task_id] = version
            finally:
                lock.release()
            outage = self.outage
            if outage._in_outage:  # 同 OutageLog.recovered 的快路径（不在故障中什么也不做），少一层调用
                outage.recovered()
            if self._behind and task_id in self._behind:  # 不拿锁先看一眼（同 _caught_up 的说明）
                with self._lock:
                    self._behind.pop(task_id, None)
            if snapshot.progress is not None and snapshot.status in TERMINAL_STATUSES:
                self._flush_one(snapshot)  # 同 _caught_up：终态补写最后的进度
            return
        if (
            commits is not None
            and record.from_status is _STARTING
            and record.to_status is _RUNNING
            and snapshot.pid is None  # 子进程的 pid 要尽快落库（父进程死后据此找孤儿进程），照常写
            and self._write_lazily(machine, record)
        ):
            return
        self.sync(machine, record)

    def _write_failed(
        self, machine: StateMachine, record: Transition, persisted: int, exc: TaskError
    ) -> None:
        """（持有 machine.lock）``on_transition`` 的直写（``sync`` 的第一轮）失败了：与 ``sync`` 里同样处理。
        版本冲突 / 重复 id → 可能是自己那次丢了回执的写，交给 ``_rounds`` 读回对照、再走剩下的那一轮；
        别的错误 → 结果未知，记下、留待追平（下次先读回）。"""
        task_id = machine.task_id
        if isinstance(exc, (ConcurrencyConflict, DuplicateTaskId)):
            state = self._mark_uncertain(task_id)
            if state is not None:  # 写的同时被 forget 了（不再归本进程管）：不再追
                self._rounds(machine, record, persisted, state, 1)
            return
        self._mark_uncertain(task_id)
        self.record(task_id, "save", exc)
        self._mark_behind(machine)

    def _write_lazily(self, machine: StateMachine, record: Transition) -> bool:
        """（持有 machine.lock）推迟写 running 的通用入口：记账可以是 _TaskState、``record`` 之前也可以还有
        没写的迁移（带上它们）。返回 False：没有可推迟的（不经组提交、不在管、已追平），调用方照常 sync。"""
        snapshot = machine.snapshot
        commits = self.commits
        expected = _plain_version(self._tasks.get(snapshot.task_id))
        if commits is None or expected is None or expected == snapshot.status_version:
            return False
        transitions = _records_since(machine, expected, snapshot.status_version, (), record)
        return self._defer_running(commits, machine, snapshot, expected, transitions)

    def _defer_running(
        self,
        commits: GroupCommit,
        machine: StateMachine,
        snapshot: TaskSnapshot,
        persisted: int,
        transitions: Sequence[Transition],
    ) -> bool:
        """（持有 machine.lock）把 ``snapshot``（状态机此刻的快照，存储里是 ``persisted`` 那一版）连同
        ``transitions`` 记成推迟写的一项（``state.lazy``，不排进组提交——理由见 ``on_transition``），登记到点
        由后台循环补写。返回 False：这个任务已不归本进程管（forget 了），什么也没记。``on_transition`` 的常见
        情形直接调用它，其余经 ``_write_lazily``。

        记账换成 _TaskState 与登记到点补写（``_lazy``）在同一次 ``_lock`` 里做；"在不在"的判定与换入也在
        这把锁下（同 ``_promote`` 的理由：forget 不拿任务锁，两步之间落进来的 forget 之后不能再把记账
        加回来）。
        先登记、后把那一项挂到 ``state.lazy`` 上也不会漏写：后台循环的 ``flush_lazy`` 先拿这个任务的锁
        （在我们手里）才看 ``state.lazy``，它看到的总是挂好之后的样子。"""
        task_id = snapshot.task_id
        due = self.clock.monotonic() + LAZY_RUNNING_DELAY
        lock = self._lock
        if not lock.try_acquire():
            lock.acquire()
        try:
            tasks = self._tasks
            current = tasks.get(task_id)
            if current is None:  # 不在管了（forget）
                return False
            if isinstance(current, _TaskState):
                state = current
            else:
                state = _TaskState(persisted_version=current)
                tasks[task_id] = state
            self._lazy[task_id] = (due, machine)
        finally:
            lock.release()
        state.lazy = SaveRequest._write_through(snapshot, persisted, transitions)
        self._lazy_since_plan = True
        # 后台循环本来就会在到点之前醒来（旁路回写、续租、轮询的期限，或更早排进来的另一项）时不叫醒它：
        # 两个执行槽跑短任务时几乎每个任务都有一项推迟写的 running，而它几乎总是由本任务的终态那次写带走——
        # 每任务叫醒一次后台循环是两次上下文切换加一轮循环的 Python 代码，比省下的那次提交还贵。
        # 为什么不会漏：本项先登记、后读 _loop_due；后台循环先发布 _loop_due、后读登记（loop_deadline）。
        # 这里读到的若是旧值，说明循环此刻还没发布新值，它之后读登记时必然看得到本项。
        if self._loop_due > due and self.on_lazy is not None:
            self.on_lazy()
        return True

    def _drop_lazy(self, task_id: str, state: _TaskState) -> Pending | SaveRequest | None:
        item, state.lazy = state.lazy, None
        with self._lock:
            self._lazy.pop(task_id, None)
        return item

    def _resolve_lazy(self, machine: StateMachine, state: _TaskState) -> bool:
        """（持有 machine.lock）本任务要再写之前，先了结推迟写的 running：只是登记着（没排进组提交）或排着还没
        被捎走就丢掉 / 撤回（这次写带上它的迁移记录）；已被某个写者捎走就等它的结果。返回 False：那次写失败了
        （已记下，结果未知）。"""
        item = self._drop_lazy(machine.task_id, state)
        commits = self.commits
        if item is None or isinstance(item, SaveRequest) or commits is None:
            return True
        if commits.withdraw(item):
            return True
        try:
            commits.finish(item)
        except (ConcurrencyConflict, DuplicateTaskId):
            state.uncertain = True  # 与 sync 同一判定：读回再说
        except TaskError as exc:
            state.uncertain = True
            self.record(machine.task_id, "save", exc)
            return False
        else:
            assert item.request is not None  # 推迟写的 running 是一项 save
            state.persisted_version = item.request.snapshot.status_version
        return True

    def lazy_deadline(self) -> float | None:
        """最早一项推迟写的 running 该由后台循环补写的时刻（monotonic）；没有则 None。"""
        if not self._lazy:
            return None
        with self._lock:
            return min((due for due, _ in self._lazy.values()), default=None)

    def loop_deadline(self, other: float) -> float:
        """后台循环算它下一次醒来的时刻：别的期限 ``other`` 与最早一项推迟写的 running 取早者。

        先发布 ``other``、再读推迟写的登记（顺序不能反，见 ``_write_lazily``）：之后排进来、比它更早到点的
        项会叫醒循环；此刻已登记的项算进返回值里。

        上次算过之后又有项登记过、而它们都已了结（短任务的终态带走了它们）时，也至多睡
        ``LAZY_RUNNING_DELAY``：任务一个接一个地跑时，循环每 50 毫秒醒一次，而不是每个任务被叫醒一次。
        这只是省唤醒的估计，不影响"到点必补写"：那由上面的发布 / 登记顺序保证。"""
        self._loop_due = other
        lazy = self.lazy_deadline()
        if self._lazy_since_plan:
            self._lazy_since_plan = False
            soon = self.clock.monotonic() + LAZY_RUNNING_DELAY
            lazy = soon if lazy is None else min(lazy, soon)
        if lazy is None or lazy >= other:
            return other
        self._loop_due = lazy
        return lazy

    def flush_lazy(self) -> None:
        """后台循环调用：把到点还没落库的推迟写的 running 写掉（长任务在存储里不会一直显示 starting）。

        先把到点的每一项排进组提交，再逐个 ``sync``：第一个 ``sync`` 当写者时捎上其余排着的项（撤回的是它
        自己那一项、由它这次写带上），其余的 ``sync`` 看到自己那一项已被捎走、只等结果——许多长任务同时开始时
        是一次提交，而不是一串。排进去之后、``sync`` 之前任务落了终态也照常：交出终态时撤回它或等它写完
        （``_handoff`` / ``_resolve_lazy``），与别的写者捎走它时一样。"""
        if not self._lazy:
            return
        now = self.clock.monotonic()
        with self._lock:
            due = [machine for when, machine in self._lazy.values() if when <= now]
        commits = self.commits
        if commits is not None:
            for machine in due:
                with machine.lock:
                    state = self._tasks.get(machine.task_id)
                    if isinstance(state, _TaskState) and isinstance(state.lazy, SaveRequest):
                        state.lazy = commits.enqueue(state.lazy)
        for machine in due:
            with machine.lock:
                state = self._tasks.get(machine.task_id)
                if isinstance(state, _TaskState) and state.lazy is not None:
                    self.sync(machine)

    def sync_later(self, machine: StateMachine, record: Transition) -> Callable[[], bool] | None:
        """把这次写先排进组提交、不等（调用方持有 machine.lock）；返回"等它提交并收尾"的函数，调用方必须
        在放开 machine.lock 之前调用它（返回值同 :meth:`sync`）。不是最常见的情形（还没落库过、结果未知要先
        读回、被隔离、已经追平）时返回 None：调用方照常 :meth:`sync`。

        用途：任务 A 落终态时控制器先把它的写排进来，再去启动下一个任务 B——B 的 starting 那次 save 当写者时
        把 A 的终态一并捎上，每个任务少一次提交。A 的终态在这个函数返回之前**不算**落库：wait() / wait_all()
        的唤醒都在它之后（runtime/controller.py）。
        """
        commits = self.commits
        if commits is None:
            return None  # 存储不做组提交（内存存储）：没有可以捎带的提交，照常 sync
        snapshot = machine.snapshot
        handoff = self._handoff(snapshot)
        if handoff is None:
            return None
        expected, carried = handoff
        transitions = _records_since(machine, expected, snapshot.status_version, carried, record)
        item = commits.enqueue(SaveRequest._write_through(snapshot, expected, transitions))

        def finish() -> bool:
            return self._after_write(machine, snapshot, commits.finish, item)

        return finish

    def sync_with(self, machine: StateMachine, write: Callable[[SaveRequest], None]) -> bool | None:
        """把这次写交给 ``write`` 去提交（调用方持有 machine.lock）：``write`` 收到的 ``SaveRequest`` 正是
        :meth:`sync` 此刻会写的那一项，由它连同别的写在同一个事务里提交（worker 的执行槽：终态与下一个任务的
        认领 + starting 一次提交，见 ``TaskStore.claim_queued`` 的 ``ClaimStart.save``）。
        返回值同 :meth:`sync`；不是最常见的情形（还没落库过、结果未知要先读回、被隔离、已经追平、推迟写的
        running 已被别的写者捎走）时返回 None、什么也没交出去：调用方照常 :meth:`sync`。

        ``write`` 抛出的异常按这一项自己的 save 抛了它处理，与 :meth:`sync` 里逐字相同：版本冲突 / 重复 id →
        读回对照再说（下面的 sync 去做）；别的 TaskError → 结果未知，记下、留待追平（下次先读回，
        runtime/fencing.py）。所以合并的提交整个失败时，这个任务的写穿与一次失败的 save 一模一样。
        """
        snapshot = machine.snapshot
        handoff = self._handoff(snapshot)
        if handoff is None:
            return None
        expected = handoff[0]
        request = SaveRequest(snapshot, expected, machine.transitions_since(expected))
        return self._after_write(machine, snapshot, write, request)

    def _handoff(self, snapshot: TaskSnapshot) -> tuple[int, Sequence[Transition]] | None:
        """（持有该任务的锁）``sync_later`` / ``sync_with`` 的共同前提：这次写是最常见的情形、可以交给别人
        提交时，返回 (存储里的版本——交出去的那一项的 expect_version, 撤回的推迟写那一项带着的迁移记录)；
        否则 None，调用方照常 :meth:`sync`。

        推迟写的 running 只是登记着、或排进了组提交还没被捎走时先丢掉 / 撤回它（交出去的这一项连同 running 的
        记录一起写：那几条记录原样交还，``sync_later`` 不必再从状态机的紧凑历史里现造一遍）；已被某个写者捎走
        就不交（sync 先等它的结果）。还没落库过、结果未知要先读回、被隔离、已经追平的也不交。"""
        task_id = snapshot.task_id
        state = self._tasks.get(task_id)
        carried: Sequence[Transition] = ()
        # 下面是 ``_drop_lazy`` 与 ``_plain_version`` 内联的写法（交出的终态每个任务都走这里，少两层调用）。
        if state.__class__ is int:
            expected = state
        elif state is None:
            return None
        else:
            assert isinstance(state, _TaskState)
            lazy = state.lazy
            if lazy is not None:
                request: SaveRequest | None
                if isinstance(lazy, SaveRequest):  # 只是登记着（平常的情形）：没有排进组提交，不必撤回
                    request = lazy
                else:  # 到点时后台循环排进了组提交（flush_lazy）
                    commits = self.commits
                    if commits is None or not commits.withdraw(lazy):
                        return None
                    request = lazy.request
                state.lazy = None  # 同 _drop_lazy
                lock = self._lock
                if not lock.try_acquire():
                    lock.acquire()
                try:
                    self._lazy.pop(task_id, None)
                finally:
                    lock.release()
                if request is not None and request.expect_version == state.persisted_version:
                    carried = request.transitions
            if state.fenced or state.uncertain:  # 同 _plain_version（推迟写的那一项已撤回）
                return None
            expected = state.persisted_version
        if expected == snapshot.status_version:
            return None
        return expected, carried

    def _after_write(
        self, machine: StateMachine, snapshot: TaskSnapshot, write: Callable[[Any], None], item: Any
    ) -> bool:
        """（持有 machine.lock）执行一次交给别人提交的写（组提交的 ``finish``、worker 合并的认领提交），
        按这一项自己的 save 的结果记账，再由 :meth:`sync` 收尾；返回值同 :meth:`sync`。``sync_later`` 与
        ``sync_with`` 共用：两条路径的失败处理必须与 :meth:`sync` 里的一字不差。"""
        task_id = snapshot.task_id
        try:
            write(item)  # 不为每次写现造一个 lambda（交出的终态每个任务都走这里）
        except (ConcurrencyConflict, DuplicateTaskId):
            self._mark_uncertain(task_id)  # 与 sync 里同一判定：读回再说（下面的 sync 去做）
        except TaskError as exc:
            self._mark_uncertain(task_id)  # 结果未知：记下，留待追平（下次先读回，runtime/fencing.py）
            self.record(task_id, "save", exc)
            self._mark_behind(machine)
            return False
        else:
            version = snapshot.status_version
            self._written(task_id, version)
            # 写成了、记账已是平常的 int 且正是状态机此刻的版本：sync 此时只会走到"已追平"的收尾（_rounds 的
            # 第一轮就 break，再 _caught_up），直接做收尾，少两层调用（交出的终态每个任务都走这里）。
            entry = self._tasks.get(task_id)
            current = machine.snapshot
            if entry.__class__ is int and entry == version and current.status_version == version:
                self._caught_up(task_id, current)
                return True
        # 已追平时 sync 只做收尾（清"落后"记账、终态补写进度）；冲突时它读回对照、再写或隔离。
        return self.sync(machine)

    def sync(self, machine: StateMachine, record: Transition | None = None) -> bool:
        """把存储追到状态机的当前版本（调用方持有 machine.lock）。返回是否已追平（被隔离也算：不再追）。

        ``record``：刚发生的那条迁移（监听器传入）。存储正好落后它一条（最常见）时，要补写的就是它，不必再从
        状态机的历史里切一份出来。
        """
        snapshot = machine.snapshot
        task_id = snapshot.task_id
        entry = self._tasks.get(task_id)
        if entry is None:
            return True
        # 平常的任务（int）没有标记：不必看隔离 / 推迟写 / 结果未知，直接按它的版本写（每次迁移都走这里）。
        state = None if entry.__class__ is int else entry
        if state is not None:
            assert isinstance(state, _TaskState)
            if state.fenced:
                return True
            if state.lazy is not None and not self._resolve_lazy(machine, state):
                self._mark_behind(machine)
                return False
        # 至多两轮：一次写撞了冲突 / 重复 id，可能是自己那次丢了回执的写——读回对照之后再写一次。
        return self._rounds(machine, record, entry, state, 2)

    def _rounds(
        self,
        machine: StateMachine,
        record: Transition | None,
        entry: int | _TaskState,
        state: _TaskState | None,
        rounds: int,
    ) -> bool:
        """``sync`` 的写循环（至多 ``rounds`` 轮）与收尾；``on_transition`` 的直写撞了冲突之后从这里
        走剩下的一轮。"""
        snapshot = machine.snapshot
        task_id = snapshot.task_id
        for _ in range(rounds):
            if state is not None and state.uncertain:
                try:
                    if not self._converge(machine, state):
                        return True  # 被隔离：如实记下了，不再追写
                except TaskError as exc:
                    self.record(task_id, "read_back", exc)
                    self._mark_behind(machine)
                    return False
            persisted = entry if state is None else state.persisted_version
            assert isinstance(persisted, int)
            if persisted == snapshot.status_version:
                if state is not None:  # 推迟写的 running 刚了结 / 读回确认已追平：标记都清了就换回 int
                    self._written(task_id, persisted)
                break
            try:
                if record is not None and record.version == persisted + 1 == snapshot.status_version:
                    transitions: tuple[Transition, ...] = (record,)
                else:
                    transitions = machine.transitions_since(persisted)
                if self.commits is None:
                    # 不经组提交：存储的写穿入口（与 save 同一语义；内存存储在锁内相对上一版检查，见
                    # TaskStore._save_direct）。
                    self.store._save_direct(snapshot, persisted, transitions)
                else:
                    # 组提交：与同一时刻别的任务的迁移合进一个写事务；只在这一项提交之后返回。
                    self.commits.save(SaveRequest._write_through(snapshot, persisted, transitions))
            except (ConcurrencyConflict, DuplicateTaskId):
                state = self._mark_uncertain(task_id)  # 读回再判：是自己先前那次写成功了，还是别人改写了
                if state is None:  # 写的同时被 forget 了（不再归本进程管）：不再追
                    return True
                continue
            except TaskError as exc:
                # 结果未知（也可能根本没写进去）：下次先读回，不拿旧版本盲目重放。
                self._mark_uncertain(task_id)
                self.record(task_id, "save", exc)
                self._mark_behind(machine)
                return False
            self._written(task_id, snapshot.status_version)
            break
        else:
            # 读回说"是自己的前缀"、再写又冲突：有别的写者正在同时改它。按隔离处理，不再争。
            try:
                stored = self.store.get(task_id)
                history = self.store.history(task_id) if stored is not None else []
            except TaskError as exc:
                self.record(task_id, "read_back", exc)
                self._mark_behind(machine)
                return False
            assert state is not None  # 走到这里说明两轮都撞了冲突：_mark_uncertain 已换成 _TaskState
            self._fence(machine, state, stored, history)
            return True
        self._caught_up(task_id, snapshot)
        return True

    def _caught_up(self, task_id: str, snapshot: TaskSnapshot) -> None:
        """（持有该任务锁）存储已追到 ``snapshot``：结束故障汇总、清"落后"记账、终态补写进度。"""
        outage = self.outage
        if outage._in_outage:  # 同 OutageLog.recovered 的快路径（不在故障中什么也不做），少一层调用
            outage.recovered()
        # 不拿锁先看一眼（每次迁移都走这里）：本任务只会由持有它的任务锁的线程（也就是此刻的我们）放进
        # _behind，所以"不在"的读数不会因别的线程而过时；在的时候才拿锁移除。
        if task_id in self._behind:
            with self._lock:
                self._behind.pop(task_id, None)
        if snapshot.progress is not None and snapshot.status in TERMINAL_STATUSES:
            self._flush_one(snapshot)  # 没有进度时 _flush_one 什么也不做：不为它多一层调用

    def _promote(self, task_id: str) -> _TaskState | None:
        """（持有该任务锁）这个任务的记账换成可以挂标记的 _TaskState（已是的原样返回）；不在管的返回 None。

        "在不在"与换入在 ``_lock`` 下一起做：forget 不拿任务锁（它在同一把 ``_lock`` 下 pop），
        两步之间没有锁的话，恰好落在中间的 forget 之后这里会把记账加回来——一个再也没人删的
        _TaskState（长跑的守护进程里慢慢漏）。"""
        entry = self._tasks.get(task_id)
        if entry is None or isinstance(entry, _TaskState):
            return entry
        with self._lock:
            entry = self._tasks.get(task_id)
            if entry is None or isinstance(entry, _TaskState):
                return entry
            state = _TaskState(persisted_version=entry)
            self._tasks[task_id] = state
        return state

    def _mark_uncertain(self, task_id: str) -> _TaskState | None:
        """（持有该任务锁）上一次写结果未知：下次先读回再写。返回它的 _TaskState（不在管的返回 None）。"""
        state = self._promote(task_id)
        if state is not None:
            state.uncertain = True
        return state

    def _written(self, task_id: str, version: int) -> None:
        """（持有该任务锁）存储已确认到 ``version``。没有别的标记时换回 int（见 ``_tasks``）。

        只改还在管的任务：与 forget 擦肩而过时不把它的记账加回来——换成 int 时"在不在"与写入在
        ``_lock`` 下一起做（forget 在同一把锁下 pop；没有锁的话，落在两步之间的 forget 会留下一个
        再也没人删的字典项）。"""
        entry = self._tasks.get(task_id)
        if entry is None:
            return
        if isinstance(entry, _TaskState) and (entry.uncertain or entry.fenced or entry.lazy is not None):
            entry.persisted_version = version
            return
        # 每次迁移都走这里：热路径的加锁写法（不进 with 的帧），见 core/locks.py。
        lock = self._lock
        if not lock.try_acquire():
            lock.acquire()
        try:
            if task_id in self._tasks:
                self._tasks[task_id] = version
        finally:
            lock.release()

    def _mark_behind(self, machine: StateMachine) -> None:
        with self._lock:
            # 挪到队尾：catch_up 在一轮里遇到第一次失败就停，一个总是失败的任务若一直排在最前，会饿死后面的。
            self._behind.pop(machine.task_id, None)
            self._behind[machine.task_id] = machine

    def _local_since_base(self, machine: StateMachine) -> tuple[int, tuple[Transition, ...], str | None]:
        """读回对照用的 (起点, 本进程写下的迁移记录, 持有者)：提交的任务是 (0, 全部历史, None)；认领 / 接手
        来的是 (接手时的版本, 那之后的记录, 本节点)——见 runtime/fencing.py 的 ``compare``。"""
        base = self._bases.get(machine.task_id, 0)
        if not base:
            return 0, machine.transitions, None
        return base, machine.transitions_since(base), self.owner

    def _converge(self, machine: StateMachine, state: _TaskState) -> bool:
        """读回存储里的快照与历史，与本进程的历史对照。返回 False 表示被隔离（已记下）。

        对照从"存储已确认到的版本"（``state.persisted_version``）起要求记录在线，之前的只在仍在线时逐条核对
        （``compare`` 的 ``durable``）。为什么不是整段历史：提交的任务原来整段按位置对照，运行得比保留窗口还久
        的任务（早期历史被 Archiver 归档出在线库）读回时"缺头"，一次其实写成了的写也被判成别人的改写——本进程
        从此停写，存储停在旧状态直到被判 lost。为什么是确认到的版本、而不是"最老的在线记录"：确认过的版本是
        存储按 expect_version 核对后收下的，记录只追加，无需再看；结果未知的那次写带的记录（确认版本之后）才是
        要判定的，它们必须在线——若连它们也被归档了就无从判断，宁可按隔离处理。只按"最老的在线记录"起对照，
        等于接受任何在线部分恰好对得上的存储，包括确认过的写已经不见了的那种。

        这个任务总是确认在存储里存在过（提交时 create 已确认；认领来的本来就在存储里），所以读回时不见了只能是
        被删了（``prune``、归档器整体归档终态任务、手工删除）：按隔离处理、记一条 fenced，绝不重新 create——
        那等于替运维撤销一次删除（``compare`` 在给了 ``durable`` 时从不返回 ABSENT）。"""
        task_id = machine.task_id
        stored = self.store.get(task_id)
        history = self.store.history(task_id) if stored is not None else []
        base, local, holder = self._local_since_base(machine)
        verdict = compare(local, stored, history, base=base, holder=holder, durable=state.persisted_version)
        if verdict is not Verdict.PREFIX or stored is None:
            self._fence(machine, state, stored, history)
            return False
        # PREFIX：那些写都成功了，从存储的版本接着写。
        state.persisted_version = stored.status_version
        state.uncertain = False
        return True

    def _fence(
        self, machine: StateMachine, state: _TaskState, stored: TaskSnapshot | None, history: list[Transition]
    ) -> None:
        """存储里的这个任务已被别人改写：不覆盖，记一条 fenced（写明本地的真实结果），此后以存储为准。"""
        state.fenced = True
        state.uncertain = False
        with self._lock:
            self._behind.pop(machine.task_id, None)
        if stored is None:  # 读回时它不见了（prune、归档清理、手工删除）：不再写，也绝不重建
            text = (
                "本节点被隔离（fenced）：存储中这个任务已被删除（prune / 归档清理 / 手工删除）；"
                "本地结果不再写入，也不会重建它。如仍需要这个结果，请核对后用新的 task_id 重新提交"
            )
        else:
            base, local, holder = self._local_since_base(machine)
            text = fenced_text(machine.snapshot, local, stored, history, base=base, holder=holder)
        self._note(machine.task_id, "fenced", text)

    def is_fenced(self, task_id: str) -> bool:
        state = self._tasks.get(task_id)
        return isinstance(state, _TaskState) and state.fenced

    def catch_up(self) -> int:
        """后台循环调用：重试所有落后于内存的任务。返回仍落后的数量。"""
        with self._lock:
            behind = list(self._behind.values())
        remaining = 0
        failures_before = self._failure_count()
        for index, machine in enumerate(behind):
            with machine.lock:
                if not self.sync(machine):
                    remaining += 1
            if self._failure_count() != failures_before:
                # 存储不可用：这一轮不再逐个去撞（每次都可能要等满一次调用的上限），下一轮再试。
                return remaining + len(behind) - index - 1
        return remaining

    def _failure_count(self) -> int:
        with self._lock:
            return self._failure_seq

    @property
    def behind_count(self) -> int:
        with self._lock:
            return len(self._behind)

    def _flush_one(self, snapshot: TaskSnapshot) -> None:
        """终态时补写最后的进度（看板上"最终推进到哪了"）。

        只有进度变了才写：已结束任务的心跳没有用途（idle 判定与 reconcile 都不看终态任务），为它单独多一次
        写事务不值得——这条路径每个任务都要走一次。进度要写时顺带写上心跳，不多花一次往返。
        """
        if snapshot.progress is None:
            return
        task_id = snapshot.task_id
        with self._lock:
            last_progress, last_heartbeat = self._side_written.get(task_id, _NOTHING_WRITTEN)
        if snapshot.progress == last_progress:
            return
        fields: dict[str, object] = {"progress": snapshot.progress}
        if snapshot.last_heartbeat_at is not None and snapshot.last_heartbeat_at != last_heartbeat:
            fields["heartbeat_at"] = snapshot.last_heartbeat_at
        try:
            self.store.touch(task_id, **fields)  # type: ignore[arg-type]
        except TaskError as exc:
            self.record(task_id, "touch", exc)
            return
        self._note_side_written([snapshot])

    def _note_side_written(self, snapshots: Iterable[TaskSnapshot]) -> None:
        """这些快照的进度与心跳已写进存储（下次没变就不再写）。只记还在管的任务：与 forget 同在 _lock 下。"""
        with self._lock:
            for snapshot in snapshots:
                if snapshot.task_id in self._tasks:
                    self._side_written[snapshot.task_id] = (snapshot.progress, snapshot.last_heartbeat_at)

    def flush_side_channel(self, snapshots: list[TaskSnapshot], *, renew_lease: bool) -> None:
        """批量回写进度、心跳（有变化才写）与租约（renew_lease 时为全部在管任务续租）。"""
        updates: list[tuple[str, dict[str, object]]] = []
        # 先记"这一轮续租从何时算起"，再算要写的 lease_until：本节点相信的租约（started + lease_ttl）就不会比
        # 写进存储的更长——反过来的话，十万个任务的循环要几十毫秒，本节点会多信这么久，而别的节点的 reconcile
        # 按存储里的值判它过期。
        started = self.clock.monotonic()
        lease_until = self.lease_until() if renew_lease else None
        touched: list[TaskSnapshot] = []
        lease_only: list[str] = []  # 只需续租的（排队中的任务都是）：一批一条语句，见下
        tasks = self._tasks
        with self._lock:
            side_written = dict(self._side_written) if self._side_written else {}
        for snapshot in snapshots:
            state = tasks.get(snapshot.task_id)
            if state is None or (isinstance(state, _TaskState) and state.fenced):
                continue  # 被隔离的任务在存储里归别人了：不再替它续租、写进度
            fields: dict[str, object] = {}
            last_progress, last_heartbeat = side_written.get(snapshot.task_id, _NOTHING_WRITTEN)
            if snapshot.progress is not None and snapshot.progress != last_progress:
                fields["progress"] = snapshot.progress
            if snapshot.last_heartbeat_at is not None and snapshot.last_heartbeat_at != last_heartbeat:
                fields["heartbeat_at"] = snapshot.last_heartbeat_at
            renew = lease_until is not None and not snapshot.is_terminal
            if fields:
                if renew:
                    fields["lease_owner"] = self.owner
                    fields["lease_until"] = lease_until
                updates.append((snapshot.task_id, fields))
                touched.append(snapshot)
            elif renew:
                lease_only.append(snapshot.task_id)
        if not updates and not lease_only:
            if renew_lease:
                self.lease.renewed(started)  # 没有在管的任务：没有要续的租约
            return
        # 分批写：十万个排队任务续一次租，一个事务写十万行会超过一次调用的时限（Postgres 的 StoreNoReply），
        # 租约随之过期。每批一个事务；某一批失败就停（存储此刻不可用），已写的批照样算数。
        for start in range(0, len(updates), TOUCH_BATCH):
            chunk = updates[start : start + TOUCH_BATCH]
            try:
                self.store.touch_many(chunk)
            except TaskError as exc:
                self.record(chunk[0][0], f"touch×{len(chunk)}", exc)
                return
            self._note_side_written(touched[start : start + TOUCH_BATCH])
        # 只需续租的任务写的是同一组值：``renew_leases`` 一批一条语句（内置后端），而不是每个任务一个字段
        # 字典、一次检查、一行编码——积压十万个排队任务时，那是每 lease_ttl/3 一轮、每轮几秒的 CPU。
        until = lease_until if lease_until is not None else self.lease_until()  # lease_only 非空 ⇒ 已算过
        for start in range(0, len(lease_only), RENEW_BATCH):
            ids = lease_only[start : start + RENEW_BATCH]
            try:
                self.store.renew_leases(self.owner, ids, until)
            except TaskError as exc:
                self.record(ids[0], f"renew_leases×{len(ids)}", exc)
                return
        self.outage.recovered()
        if renew_lease and self.lease.renewed(started):
            logger.info("本节点 %s 重新续上了租约", self.owner)

    def tick(self) -> None:
        """后台循环每轮调用：按时打故障汇总；租约到期没续上时本节点自己先知道（docs/distributed.md §7.3）。"""
        self.outage.tick()
        overdue = self.lease.expired_now(self.clock.monotonic())
        if overdue is not None:
            self._note(
                self.owner,
                "lease_expired",
                f"本节点已 {overdue:.1f} 秒没能续租（lease_ttl={self.lease_ttl:g}），租约已过期：别的节点的 "
                "reconcile() 可以把本节点在跑的任务判为 lost；恢复后被改写的任务以存储为准（记为 fenced）",
            )

    def forget(self, task_id: str) -> None:
        with self._lock:
            state = self._tasks.pop(task_id, None)
            self._side_written.pop(task_id, None)
            self._bases.pop(task_id, None)
        item = self._drop_lazy(task_id, state) if isinstance(state, _TaskState) else None
        if isinstance(item, Pending) and self.commits is not None:
            self.commits.withdraw(item)  # 已被捎走的就让它写完：写的是本进程真实经过的迁移
        with self._lock:
            self._behind.pop(task_id, None)

    def snapshot_failures(self) -> list[PersistFailure]:
        with self._lock:
            return list(self.failures)


__all__ = ["MAX_PERSIST_FAILURES", "PersistFailure", "WriteThrough"]
