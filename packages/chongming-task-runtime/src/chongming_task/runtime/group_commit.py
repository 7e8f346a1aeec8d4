"""组提交（group commit）：许多任务的状态迁移合进同一个写事务（用户指南 §9.8）。

每个调用方（持有自己任务锁的线程）把它的 save 交给 :class:`GroupCommit` 并等着。同一时刻至多
``writers`` 个"写者"（每个占一条存储连接，数目取自存储的 ``TaskStore.group_commit_writers``：SQLite 一次只能
有一个写者，取 1；Postgres 也取 1，好让提交线程的 create 排着、与执行槽的写同一批提交）：有空位时，到达的
调用方自己当写者，把自己那一项连同此刻排着的其余项（至多 ``max_batch`` 个）用一次 ``TaskStore.save_many``
写完，叫醒这一批的调用方，让出位置；写者都忙时才排队，由下一个空出来的写者捎带。没有竞争时就是调用方自己直接
``save``——不多一个线程、不多一次线程切换；写者不止一个时，两个线程同时写照样并行提交，不会因为组提交反而排成
一队。

单个提交的 create 也可以排进来（:meth:`GroupCommit.create`，只在存储的 ``TaskStore.group_commit_creates``
为真时由写穿层使用）：批里有 create 时写者用一次 ``TaskStore.write_many`` 把它们与同批的 save 一起写完。
SQLite 上提交线程的 create 与执行槽的 starting / 终态本来各占一个事务、在写锁前排队；合进一个事务，每个任务
少一次提交。同一批里不会有"为同批里刚建的任务 save"：一个任务只在它的 create 返回（已提交）之后才会启动。

三条保证（crash 测试 tests/reliability/test_group_commit_crash.py 逐条验证）：

* **每个调用方只在它自己那一项提交之后返回。** 同批别的项的结果不会让它提前返回，也不会被当成它的结果。
* **逐项结果如实交还。** 一项版本冲突（ConcurrencyConflict）或任务不见了（TaskNotFound）只是那一项的
  结果，同批其余照常提交（存储在同一事务里逐项判定，见 ``TaskStore.save_many``）。
* **整批失败时，每个调用方得到的正是今天一次失败的 save 会给它的东西**：同一个异常，结果未知。我们刻意
  不在这里把成员逐个重试：故障（连接断了、写锁超时）期间逐个重试会让一批 N 项各等满一次超时，而写穿层
  本来就按"结果未知"处理失败——下一次先读回对照（runtime/fencing.py），是自己的前缀就接着写。某一项
  本身有毒（后端拒绝、又没被入参检查挡住）时，它在追平时单独重写（catch_up 逐个任务、一次一项），不会
  反复拖累别的任务。
"""

from __future__ import annotations

from _thread import allocate_lock as _allocate_lock
from collections.abc import Sequence
from time import monotonic as _monotonic
from typing import Any

from chongming_task.core.locks import YieldingLock
from chongming_task.core.records import PackedTransition, unpack_transition
from chongming_task.core.storage import commit_hooks
from chongming_task.errors import StoreError
from chongming_task.models import TaskSnapshot
from chongming_task.storage import SaveRequest, TaskStore

NewTask = tuple[TaskSnapshot, tuple[PackedTransition, ...]]
"""组提交里的一项 create：新任务的快照与它状态机的紧凑历史（``StateMachine.packed_transitions``）。"""

MAX_BATCH = 256
"""一个写事务里至多几项：批太大时一次事务持写锁太久，别的进程的写要排队等。"""

SUCCESSOR_GRACE = 0.002
"""排队者自己醒来接着当写者之前最多等多久（秒）：提交一向很短时，一次提交之后不叫醒排队者，先给刚放下写者
位置的线程这么长的时间回来捎走它（见 ``GroupCommit._sleep_locked``）。"""

_SHORT_COMMIT = SUCCESSOR_GRACE
"""最近提交的平均墙钟短于它时排队者才定时睡（提交长的存储照旧由提交叫醒下一个写者）。取宽限本身而不是更短：
负载下 SQLite 的提交平均在 0.1–2.3 ms 之间来回（2 核机、负载 5），门槛取 1 ms 时一半的时间退回旧做法。"""

_UNMEASURED = float("inf")


class Pending:
    """组提交里排着的一项（:meth:`GroupCommit.enqueue` 的返回值）。"""

    __slots__ = ("create", "done", "error", "patient", "request", "self_waking", "taken", "waiter")

    def __init__(self, request: SaveRequest | None, create: NewTask | None = None) -> None:
        # 恰好一个不是 None：一次 save（request）或一次 create（create）。
        self.request = request
        self.create = create
        self.taken = False  # 已被某个写者放进它的批次
        # 调用方定时睡着、到点自己会醒：还没被捎走时提交不叫醒它去当写者；已被捎走时写完它的那次提交可以把
        # 叫醒推迟到下一个写事务的 COMMIT 之前（见 _sleep_locked、GroupCommit._settle）
        self.self_waking = False
        # 定时睡过一次、到点时写者还在写（提交比平常长）：此后不再定时睡，由下一次提交叫醒它接着当写者
        self.patient = False
        self.done = False
        self.error: BaseException | None = None
        # 调用方线程在等这一项时睡在这把（已被它自己拿着的）锁上；叫醒 = 放开它（见 _sleep_locked）
        self.waiter: Any = None


class GroupCommit:
    """一个存储上的组提交（见模块说明）。线程安全。"""

    def __init__(self, store: TaskStore, *, writers: int | None = None, max_batch: int = MAX_BATCH) -> None:
        self._store = store
        self._writers = max(1, store.group_commit_writers if writers is None else writers)
        self._max_batch = max_batch
        # 这把锁下只有内存里的几步（排队、取批、记数），提交本身在锁外：用让出 GIL 的锁，免得三个线程（提交者
        # 与两个执行槽）在它上面排成车队（core/locks.py）。等"这一项写完"是每项自己的一把锁
        # （Pending.waiter），照常在内核里睡，但只被该叫醒的那一个叫醒。
        self._lock = YieldingLock()
        self._pending: list[Pending] = []
        self._active = 0  # 正在写的写者数
        # 最近几次提交的平均墙钟（秒，指数滑动平均）；还没量过时当作很长（排队者照旧由提交叫醒）
        self._commit_seconds = _UNMEASURED
        # 存储在写事务的 COMMIT 之前调用 commit_hooks.before_commit() 时，写完的一批里定时睡着的调用方
        # 不在提交后立刻叫醒，而是记在这里，由下一个写事务在它的 COMMIT 之前叫醒（见 _settle）
        self._defer_wakes = store.calls_before_commit
        self._deferred: list[Pending] = []
        # 存储能直接吃写穿的紧凑历史时（SQLite 的 ``_write_many_direct``），混合批里的 create 不先现造
        # Transition
        self._write_direct = getattr(store, "_write_many_direct", None)
        self.batches = 0  # 写了几个事务（测试与基准看合并得怎样）
        self.items = 0  # 经它写的项数

    def save(self, request: SaveRequest) -> None:
        """写一项；只在这一项提交之后返回。失败时抛出它自己的异常（整批失败则是那一批的异常）。"""
        self._write(Pending(request))

    def create(self, snapshot: TaskSnapshot, packed: tuple[PackedTransition, ...]) -> None:
        """建一个新任务（语义与 ``store._create_direct(snapshot, packed)`` 相同）；只在它提交之后返回。
        失败时抛出它自己的异常（重复 id、存不下的值；整批失败则是那一批的异常）。"""
        self._write(Pending(None, (snapshot, packed)))

    def _write(self, item: Pending) -> None:
        # 每个 save / create 都走这里：热路径的加锁写法（不进 with 的两层 Python 调用），见 core/locks.py。
        lock = self._lock
        if not lock.try_acquire():
            lock.acquire()
        try:
            self._pending.append(item)
            batch = self._wait_or_lead_locked(item)
        finally:
            lock.release()
        self._settle(item, batch)

    def enqueue(self, request: SaveRequest) -> Pending:
        """先把一项排进来、不等：之后任何一个写者的批次都会捎上它（典型的是同一线程紧接着的下一次 save——
        任务 A 的终态与接着启动的任务 B 的 starting 于是同一个事务提交）。调用方必须再以 :meth:`finish`
        等它提交；在那之前它**不算**已提交（调用方据此把"已落库"之后才能做的事都留到 finish 之后）。"""
        item = Pending(request)
        lock = self._lock  # 热路径的加锁写法，见 _write
        if not lock.try_acquire():
            lock.acquire()
        try:
            self._pending.append(item)
        finally:
            lock.release()
        return item

    def finish(self, item: Pending) -> None:
        """等 :meth:`enqueue` 排进来的这一项提交（还没有写者捎走它、又有空位时本线程自己当写者）。
        失败时抛出它自己的异常（整批失败则是那一批的异常）。"""
        lock = self._lock  # 热路径的加锁写法，见 _write
        if not lock.try_acquire():
            lock.acquire()
        try:
            batch = self._wait_or_lead_locked(item)
        finally:
            lock.release()
        self._settle(item, batch)

    def withdraw(self, item: Pending) -> bool:
        """把 :meth:`enqueue` 排进来、还没有写者捎走的一项撤回（不再写它）：返回是否撤回了。已被某个写者
        放进批次（或已写完）时返回 False，调用方要照常 :meth:`finish` 等它的结果。用途：推迟写的 running
        在同一任务的下一次写到来时撤回，那一次写连同 running 的迁移记录一起落库（历史不缺，少一次写）。"""
        lock = self._lock  # 热路径的加锁写法，见 _write
        if not lock.try_acquire():
            lock.acquire()
        try:
            if item.taken or item.done:
                return False
            self._pending.remove(item)
            item.done = True
            return True
        finally:
            lock.release()

    def _wait_or_lead_locked(self, item: Pending) -> list[Pending] | None:
        """（持有 _lock）等到这一项被别的写者写完，或本线程有空位当写者：后者返回本线程要写的批次。"""
        while not item.done and (item.taken or self._active >= self._writers):
            self._sleep_locked(item)
        if item.done:
            return None
        # 有空位、这一项还没被别的写者捎走：本线程当写者，自己这一项排在批首。
        self._active += 1
        self._pending.remove(item)
        batch = [item, *self._pending[: self._max_batch - 1]]
        del self._pending[: self._max_batch - 1]
        for member in batch:
            member.taken = True
        return batch

    def _sleep_locked(self, item: Pending) -> None:
        """（持有 _lock）睡到有人叫醒这一项（``_wake``），醒来时重新持有 _lock。调用方在循环里重查条件。

        为什么不用一个条件变量 + notify_all：一次提交之后该醒的只有这一批的调用方、外加（有写者空位时）一个
        接着当写者的排队者；notify_all 把排着的调用方全部叫醒、让它们查一遍再睡回去，每次都是白白的上下文
        切换（SQLite 上提交线程的 create 也排在这里之后，每任务多出三四次）。每项一把锁，叫醒就是精确的。

        **还没被捎走的排队者在提交一向很短时定时睡**（``SUCCESSOR_GRACE``），那次提交不叫醒它：逐个 submit
        时写者几乎总是提交线程，它放下写者位置后一两百微秒就带着下一个 create 回来、把排着的项捎进自己的批；
        而被叫醒的排队者要等提交线程放开 GIL 才跑得动——那时它的项早被捎走，只好再睡回去。量下来（SQLite，
        ``bench_sqlite`` 的写法）这种"叫醒接班人"每任务 0.55 次、一次也没当成写者，每次白白两三次上下文切换。
        没人回来时它到点自己醒来当写者：多等至多 ``SUCCESSOR_GRACE``。到点时写者还在写（这次提交比平常长），
        它就改为不定时睡（``patient``），由那次提交照旧叫醒——定时醒来至多一次，长提交里不会反复空转。提交
        本来就长的存储（平均墙钟不短于 ``_SHORT_COMMIT``，或还没量过）一直是原来的做法。

        **已被捎走的调用方在存储声明了 ``calls_before_commit`` 时也定时睡**（同一个宽限）：写完它那一项的提交
        可以不立刻叫醒它，把叫醒推迟到下一个写事务的 COMMIT 之前（``_settle``、``_flush_deferred``）；没有
        下一个事务时它到点自己醒来、看到那一项已写完就返回。到点时那一批还没写完，同样改为不定时睡、由那次提交
        叫醒。"""
        waiter = _allocate_lock()
        waiter.acquire()
        item.waiter = waiter
        timed = (
            (not item.taken or self._defer_wakes)
            and not item.patient
            and self._commit_seconds < _SHORT_COMMIT
        )
        item.self_waking = timed
        self._lock.release()
        woken = True
        try:
            if timed:
                woken = waiter.acquire(True, SUCCESSOR_GRACE)
            else:
                waiter.acquire()  # 由 _wake 放开；先放后睡也不会丢（锁已是放开的状态，立刻拿到）
        finally:
            lock = self._lock
            if not lock.try_acquire():
                lock.acquire()
            item.waiter = None
            item.self_waking = False
            if not woken and self._active >= self._writers:
                item.patient = True

    @staticmethod
    def _wake(item: Pending) -> None:
        """（持有 _lock）叫醒睡在这一项上的线程（没人睡就什么也不做）。"""
        waiter = item.waiter
        if waiter is not None:
            item.waiter = None
            waiter.release()

    def _settle(self, item: Pending, batch: list[Pending] | None) -> None:
        if batch is not None:
            started = _monotonic()
            try:
                self._commit(batch)
            finally:
                elapsed = _monotonic() - started
                lock = self._lock  # 热路径的加锁写法，见 _write（每个写者每次提交都走这里）
                if not lock.try_acquire():
                    lock.acquire()
                try:
                    previous = self._commit_seconds
                    self._commit_seconds = (
                        elapsed if previous == _UNMEASURED else previous + (elapsed - previous) / 8
                    )
                    self._active -= 1
                    defer = self._defer_wakes
                    for member in batch:  # 这一批的调用方：各自的那一项已写完（或整批失败）
                        if member.self_waking and defer:
                            # 它定时睡着、到点自己会醒：叫醒推迟到下一个写事务的 COMMIT 之前
                            # （_flush_deferred）。此刻叫醒它只能在 GIL 上再睡一次——本线程接下来
                            # 一段都是 Python（见 commit_hooks）。
                            self._deferred.append(member)
                        else:
                            waiter = member.waiter  # 即 _wake(member)，逐项少一层调用（写者自己那项没人睡）
                            if waiter is not None:
                                member.waiter = None
                                waiter.release()
                    # 有写者空位、还有没被捎走的项：叫醒其中第一个在等、且不会自己醒来的调用方，由它接着当写者
                    # （它捎上其余全部排着的项，包括 enqueue 进来、调用方还没开始等的那些）。定时睡着的排队者
                    # 不叫醒：它至多 SUCCESSOR_GRACE 后自己醒来，通常在那之前刚放下写者位置的线程已回来捎走它
                    # （见 _sleep_locked）。
                    if self._active < self._writers:
                        for waiting in self._pending:
                            if waiting.waiter is not None and not waiting.self_waking:
                                self._wake(waiting)
                                break
                finally:
                    lock.release()
        if item.error is not None:
            raise item.error

    def _flush_deferred(self) -> None:
        """（存储在本线程的写事务 COMMIT 之前调用，见 commit_hooks）叫醒上一批推迟叫醒的调用方：它们那一项早已
        提交，只是醒来的时机挪到了这一刻——正好赶上本线程在 COMMIT 里写盘、不持 GIL。"""
        if not self._deferred:
            return
        lock = self._lock  # 热路径的加锁写法，见 _write（几乎每次提交都走这里）
        if not lock.try_acquire():
            lock.acquire()
        try:
            deferred, self._deferred = self._deferred, []
            for member in deferred:
                waiter = member.waiter  # 即 _wake(member)，逐项少一层调用；到点自己醒过的，waiter 已是 None
                if waiter is not None:
                    member.waiter = None
                    waiter.release()
        finally:
            lock.release()

    def _commit(self, batch: list[Pending]) -> None:
        self.batches += 1
        self.items += len(batch)
        # 每次提交现取一个绑定方法（几十纳秒），不存一个在 self 上：存着的绑定方法引用 self，组提交（连同
        # 它引用的存储）就成了只有循环 GC 才收得走的环，关掉的控制器丢下的 SQLite 存储与连接要等全量回收。
        previous = commit_hooks.install(self._flush_deferred) if self._defer_wakes else None
        try:
            only = batch[0] if len(batch) == 1 else None
            results: list[BaseException | None]
            if only is not None and only.create is not None:
                # 只有一项 create（没有竞争）：就是写穿从前直接调用的那一次。
                self._store._create_direct(*only.create)
                results = [None]
            elif only is not None and only.request is not None and only.request.lease_expired_before is None:
                # 只有一项 save：直接 save。写穿从不带租约条件（那是 reconcile 的事）。
                request = only.request
                self._store.save(
                    request.snapshot, expect_version=request.expect_version, transitions=request.transitions
                )
                results = [None]
            elif batch[0].create is not None or any(item.create is not None for item in batch):
                # 逐个 submit 时领这一批的几乎总是提交线程自己的 create（排在批首）：先看它，不为每次提交
                # 现造一个生成器。
                results = _write_many_checked(self._store, batch, self._write_direct)
            else:
                requests: list[Any] = [item.request for item in batch]  # 这一批没有 create：每项都带 request
                results = save_many_checked(self._store, requests)
        except BaseException as exc:
            # 整批失败：每个调用方都得到这个异常（与一次失败的 save 同义：结果未知）。
            for item in batch:
                item.error = exc
                item.done = True
            return
        finally:
            if self._defer_wakes:
                commit_hooks.install(previous)
        for item, error in zip(batch, results, strict=True):
            item.error = error
            item.done = True


def _write_many_checked(
    store: TaskStore, batch: list[Pending], write_direct: Any = None
) -> list[BaseException | None]:
    """一批里有 create：``store.write_many``（create 与 save 分两列交给存储），结果按批内顺序交还；
    个数不对的核对同 ``save_many_checked``。``write_direct``：存储的 ``_write_many_direct``（create 一项是
    (快照, 紧凑历史)，语义同 ``_create_direct``）；没有时紧凑历史先现造成 Transition 再交给
    ``write_many``。"""
    # create 为 None 的项带 request（不为每项调用一个只做这一步的函数）
    saves: list[Any] = [item.request for item in batch if item.create is None]
    creates: list[Any] = [item.create for item in batch if item.create is not None]
    if write_direct is not None:
        created, saved = write_direct(creates, saves)
    else:
        creates = [
            (snapshot, [unpack_transition(snapshot.task_id, record) for record in packed])
            for snapshot, packed in creates
        ]
        created, saved = store.write_many(creates, saves)
    created, saved = list(created), list(saved)
    if len(created) != len(creates) or len(saved) != len(saves):
        raise StoreError(
            f"{type(store).__name__}.write_many 返回了 {len(created)} + {len(saved)} 个结果，"
            f"应为 {len(creates)} + {len(saves)} 个：这一批按写失败处理（请修正存储实现）"
        )
    created.reverse()
    saved.reverse()
    results: list[BaseException | None] = []
    for item in batch:
        error = (created if item.create is not None else saved).pop()
        results.append(
            error if error is None or isinstance(error, BaseException) else StoreError(repr(error))
        )
    return results


def save_many_checked(store: TaskStore, requests: Sequence[SaveRequest]) -> list[BaseException | None]:
    """``store.save_many(requests)``，再核对后端交回的结果：个数不对 → StoreError（整批按写失败、结果未知
    处理）；某项既不是 None 也不是异常 → 换成 StoreError。组提交与 reconcile 的批量判 LOST 共用。"""
    results = list(store.save_many(requests))
    if len(results) != len(requests):
        raise StoreError(
            f"{type(store).__name__}.save_many 返回了 {len(results)} 个结果，"
            f"应为 {len(requests)} 个：这一批按写失败处理（请修正存储实现）"
        )
    return [
        error if error is None or isinstance(error, BaseException) else StoreError(repr(error))
        for error in results
    ]


__all__ = ["MAX_BATCH", "GroupCommit", "NewTask", "Pending", "save_many_checked"]
