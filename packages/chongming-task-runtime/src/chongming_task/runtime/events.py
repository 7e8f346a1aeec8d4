"""公开的事件钩子：``Controller(listeners=[...])`` / ``controller.add_listener(fn)``（用户指南 §15.1）。

监听器收到三种事件（都是冻结的 dataclass，字段与属性即文档）：

* ``TransitionEvent``：任务的每一次状态迁移（和存储里的迁移记录一一对应）；
* ``ProgressEvent``：任务每一次 ``ctx.progress(...)``；
* ``StoreErrorEvent``：每一次写存储失败（任务照常运行，同一条也进 ``controller.persist_failures``）。

交付规则（为什么这样定）：

* **从不在任务的锁里调用监听器。** 迁移通知发生在任务自己的锁内（设计文档 §13）；那里只把事件放进
  一个队列，由控制器的一条专用交付线程在任何锁之外按顺序调用监听器（交付线程醒来一次取走积压的整批，
  只有它睡着时入队才叫醒它——热路径上没有逐个事件的线程交接）。慢监听器因此拖不慢任务，也拖不慢调度；
  监听器里调用 ``controller.get()`` / ``stop()`` 之类也不会死锁。
* **顺序**：同一任务的事件按版本顺序到达（入队发生在该任务的锁内）；不同任务之间按入队先后。
* **绝不能把任务搞坏。** 监听器抛异常：记一次日志（带堆栈），然后把它摘掉、不再调用——一个坏掉的监听器
  每个事件都刷一遍堆栈，只会淹没真正的日志；任务、其他监听器照常。
* **批量入口（可选）**：类上有 ``on_event_batch(events)`` 的监听器一次收到整批（见 ``BATCH_ENTRY``）。
* **没有监听器时不花任何代价**：控制器连事件对象都不构造，交付线程也不启动。有监听器时任务的锁里也只把
  ``(快照, 迁移记录, 上下文)`` 放进队列，事件对象由交付线程在锁外拼装；只有内置指标在听时一个都不造
  （``RAW_BATCH_ENTRY``），入队的也只是 ``(task_id, 任务名, 标签, 起点, 终点, 时刻)`` 这几个现成的值
  （``EventHub.emit_transition``）。
* **有界**：积压超过 ``MAX_PENDING_EVENTS`` 条（监听器太慢）时丢弃新事件并计数（``dropped``），记一次
  警告——内存不能因为一个慢的看板而无限增长。
"""

from __future__ import annotations

import collections
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from itertools import repeat, starmap

from chongming_task.core.readonly import Read
from chongming_task.core.records import STATUS_VALUE, PackedTransition, unpack_transition
from chongming_task.errors import ConfigurationError
from chongming_task.models import FailureKind, Progress, TaskSnapshot, Transition
from chongming_task.runtime.interruptible import join_thread, wait_slice
from chongming_task.states import TaskStatus

logger = logging.getLogger("chongming_task.events")

_new_object = object.__new__
_set = object.__setattr__

MAX_PENDING_EVENTS = 100_000
"""交付队列的上限（条，含交付线程手里正在送的那一批）。超过时新事件被丢弃并计入 ``EventHub.dropped``。"""

BATCH_ENTRY = "on_event_batch"
"""可选的批量入口：监听器的**类**上定义了这个方法时，交付线程一次把整批事件（按入队顺序的序列）交给
``listener.on_event_batch(events)``，而不是逐个 ``listener(event)``。内置的 Prometheus 指标用它一批只拿
一次自己的锁（抓取线程读同一份账本）。只看类、不看实例：``Mock`` 这类对任何属性
都答"有"的对象不会被误认成批量监听器。批量监听器抛异常时同样记一次、摘掉；同一批里它排在逐个事件的
监听器之前收到事件（每个监听器自己看到的顺序不变）。"""

DELIVERY_BATCH = 1_024
"""交付线程一次最多取走多少条事件。"""

COALESCE_SECONDS = 0.002
"""交付线程被第一条事件叫醒后再等多久才开始送（把同一阵的事件攒成一批）。监听器因此最多晚这么久看到事件。"""

# 会带失败分类的目标状态：其余迁移上快照里可能还留着上一次尝试的 failure，不能算在这次迁移头上。
_FAILURE_TARGETS = frozenset({TaskStatus.FAILED, TaskStatus.RETRY_WAIT, TaskStatus.LOST, TaskStatus.STOPPED})


@dataclass(
    frozen=True
)  # 不用 slots：3.11 里 frozen+slots 的类给属性赋值会报 TypeError 而不是 FrozenInstanceError
class TransitionEvent:
    """一次状态迁移：``record`` 是这条迁移记录（与存储里的历史一一对应），``snapshot`` 是迁移后的完整快照。

    其余字段（``task_id``、``name``、``from_status``、``to_status``、``trigger``、``actor``、``reason``、
    ``version``——迁移后的 status_version、``at``、``attempt``、``failure_kind``）都是从这两者读出的只读属性：
    事件由交付线程在任何锁之外拼装，只存三个引用比逐字段拷贝便宜得多（每个任务至少四条迁移）。

    ``submit_context`` 只在任务的第一条迁移（pending → queued / blocked）上有：提交者线程在 ``submit()``
    那一刻的 contextvars（``contextvars.copy_context()``）。追踪据此把每次尝试的 span 挂在提交时的 span
    下面（§15.3）——监听器在交付线程里运行，那里的"当前上下文"不是提交者的；靠这份拷贝，不靠全局表。
    """

    record: Transition
    snapshot: TaskSnapshot
    submit_context: contextvars.Context | None = None

    @classmethod
    def of(
        cls, snapshot: TaskSnapshot, record: Transition, submit_context: contextvars.Context | None = None
    ) -> TransitionEvent:
        # 每次迁移一个（交付线程里）：跳过 frozen dataclass 的 __init__，三个字段就是传进来的引用，
        # 没有要校验的。用 object.__setattr__ 而不是去填 ``event.__dict__``：3.11 的实例属性先放在对象内联的
        # 值数组里，一读 ``__dict__`` 才另造一个字典——每个事件多一个被循环 GC 追踪的对象。（三种造法在
        # 3.11 上量过：这样 0.50 µs，填 ``__dict__`` 0.75 µs，slots 加成员描述符 0.57 µs。）
        event: TransitionEvent = _new_object(cls)
        _set(event, "record", record)
        _set(event, "snapshot", snapshot)
        _set(event, "submit_context", submit_context)
        return event

    # 读出的字段：名字与 record / snapshot 上的同名字段一致（一张表，而不是十个一模一样的 property）。
    task_id = Read[str]("record.task_id")
    name = Read[str]("snapshot.name")
    from_status = Read[TaskStatus]("record.from_status")
    to_status = Read[TaskStatus]("record.to_status")
    trigger = Read[str]("record.trigger")
    actor = Read[str | None]("record.actor")
    reason = Read[str | None]("record.reason")
    version = Read[int]("record.version")
    at = Read[datetime]("record.at")
    attempt = Read[int]("snapshot.attempt")

    @property
    def failure_kind(self) -> FailureKind | None:
        """这次迁移带的失败分类：只在落 failed / retry_wait / lost / stopped 时有（其余迁移上快照里可能还
        留着上一次尝试的 failure，不能算在这次迁移头上）。"""
        failure = self.snapshot.failure
        return failure.kind if failure is not None and self.record.to_status in _FAILURE_TARGETS else None


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    """任务报了一次进度（``ctx.progress``）。"""

    task_id: str
    name: str
    attempt: int
    progress: Progress
    at: datetime


@dataclass(frozen=True, slots=True)
class StoreErrorEvent:
    """一次写存储失败（任务照常运行）。``operation`` 如 ``save`` / ``touch`` / ``create``。"""

    task_id: str
    operation: str
    error: str
    at: datetime


Event = TransitionEvent | ProgressEvent | StoreErrorEvent
Listener = Callable[[Event], object]
LeanTransition = tuple[str, str, "frozenset[str] | None", str, str, datetime]
"""只有内部监听器在听时入队的一条迁移：``(task_id, 任务名, 标签或 None, 起点状态值, 终点状态值, 时刻)``（见
``EventHub.emit_transition``）。状态是值（``"queued"``）而不是枚举成员、没有标签时是 ``None`` 而不是空集合：
这样六项全是不被循环 GC 追踪的对象（字符串、datetime、None），元组在第一次年轻代回收时就被摘出追踪，在队列里
等多久都不会被晋升（枚举成员与 frozenset 是被追踪的对象，带着它们的元组永远被追踪）。"""
FullTransition = tuple[TaskSnapshot, Transition, "contextvars.Context | None", None, None, None]
"""有公开监听器时入队的一条迁移：``(snapshot, record, submit_context, None, None, None)``——与精简的同样是
六项（内部监听器一次解包六个名字），最后一项是 ``None`` 就是这一种（精简的最后一项是时刻，从不为 None）。"""
RawItem = LeanTransition | FullTransition | ProgressEvent | StoreErrorEvent | TransitionEvent
"""交付队列里的一条（见 ``RAW_BATCH_ENTRY``）：迁移是未拼装的六元组（``LeanTransition`` 或
``FullTransition``，按最后一项是不是 ``None`` 区分），其余事件是事件对象。"""


RAW_BATCH_ENTRY = "_on_raw_event_batch"
"""内部的批量入口（不是公开钩子）：类上定义了这个方法的监听器（内置的 Prometheus 指标）一次收到整批**未拼装**
的条目（``RawItem``）——迁移是六元组，其余事件是事件对象本身，顺序与入队顺序相同。
为什么有它：只有指标在听时，交付线程不必为每条迁移造一个 ``TransitionEvent``（每个任务四个对象），指标直接读
迁移的那几个值。声明了它的监听器也就声明了自己不读 ``submit_context``：只有它们在听时，``submit()`` 不拷贝
上下文；也声明了自己只读 task_id、任务名、标签、起止状态与时刻：只有它们在听时迁移以精简的
``LeanTransition`` 入队（见 ``EventHub.emit_transition``），它们必须认得两种六元组。"""

# 交付线程睡在哪一种觉里（``EventHub._sleep``）：醒着 / 攒批小睡（只有 flush、close 叫醒）/
# 空闲（入队也叫醒）。
_AWAKE, _NAPPING, _IDLE = 0, 1, 2


class EventHub:
    """一个控制器的监听器表与交付队列（交付线程按需启动）。

    ``listeners`` 是不可变元组，整体替换（写时复制）：热路径上读它不需要锁，``active`` 只是一次属性读。
    队列里的迁移是未拼装的六元组（入队方只建一个元组：有公开监听器时带着快照与迁移记录，只有内部监听器在听时
    是精简的几个值，见 ``RawItem`` 与 ``emit_transition``），``TransitionEvent`` 由交付线程在任何锁之外
    拼装，每条迁移一个、所有公开监听器共用。

    叫醒用一把"被占着的锁"（``_wake``）而不是条件变量：交付线程 ``acquire`` 它睡觉，叫醒者 ``release`` 一次；
    都是 C 里的一次调用，而 ``threading.Condition`` 的 wait / notify 各是好几层 Python 调用加一把临时锁。
    谁来叫醒由 ``_sleep`` 决定（在 ``_lock`` 下改），``release`` 只在把它从"睡着"改成"醒着"的那一刻做，所以
    锁至多被放一次（见 ``_doze``）。
    """

    def __init__(self, name: str = "chongming-events", *, max_pending: int | None = None) -> None:
        self._name = name
        self._max_pending = MAX_PENDING_EVENTS if max_pending is None else max_pending
        self.listeners: tuple[Listener, ...] = ()
        self.dropped = 0
        self.wants_submit_context = False
        """有没有监听器可能读 ``submit_context``（没声明 ``RAW_BATCH_ENTRY`` 的都算）：没有时提交不拷贝
        上下文。"""
        # 交付时的分工（add / remove 时算好，整体替换）：内部批量入口、公开批量入口、逐个事件。
        self._raw: tuple[Listener, ...] = ()
        self._batched: tuple[Listener, ...] = ()
        self._singles: tuple[Listener, ...] = ()
        self._queue: collections.deque[RawItem] = collections.deque()  # 只 append / popleft，从不换掉
        self._lock = threading.Lock()  # 叶子锁：护着下面的标志与计数
        self._flushed = threading.Condition(self._lock)  # flush() 等在这里（冷路径）
        self._wake = threading.Lock()
        self._wake.acquire()  # 平时被占着：交付线程 acquire 它就是睡觉，别人 release 一次就是叫醒一次
        self._sleep = _AWAKE
        self._busy = False  # 交付线程手里正拿着一批事件（flush 要等它送完）
        # 队列里还能有几条（积压上限减去交付线程手里那一批；关闭之后是 -1）：入队方只比一次
        # ``len(queue) >= _room``，就同时查了"关了没有"与"满了没有"（每条迁移省几条字节码）。在 _lock 下改。
        self._room = self._max_pending
        self._flushers = 0  # 正在 flush() 里等的线程数（>0 时交付线程不攒批）
        self._thread: threading.Thread | None = None
        self._closed = False
        self._warned_drop = False

    @property
    def active(self) -> bool:
        """有没有监听器。控制器据此决定要不要构造事件（没有时什么都不做）。"""
        return bool(self.listeners)

    def add(self, listener: Listener) -> None:
        """挂上一个监听器：``add`` 返回之后入队的事件它都会收到；此前已入队、还没送出的事件不保证（只有内部
        监听器在听时迁移是精简入队的，拼不出公开事件，见 ``emit_transition``）。"""
        if not callable(listener):
            raise ConfigurationError(f"监听器必须是可调用对象 fn(event)，收到 {listener!r}")
        with self._lock:
            if self._closed:
                raise ConfigurationError("控制器已关闭，不能再添加监听器；请在 close() 之前添加")
            self._set_listeners((*self.listeners, listener))
            if self._thread is None:
                self._thread = threading.Thread(target=self._deliver_loop, name=self._name, daemon=True)
                self._thread.start()

    def add_all(self, listeners: Iterable[Listener]) -> None:
        for listener in listeners:
            self.add(listener)

    def remove(self, listener: Listener) -> bool:
        """摘掉一个监听器；返回它原先是否在表里。"""
        with self._lock:
            if listener not in self.listeners:
                return False
            items = list(self.listeners)
            items.remove(listener)
            self._set_listeners(tuple(items))
            return True

    def _set_listeners(self, listeners: tuple[Listener, ...]) -> None:
        # （持有 _lock）只看类、不看实例（见 BATCH_ENTRY）。分工表先于 listeners 换上：热路径先读 listeners
        # 决定要不要入队，交付线程读分工表——新加的监听器最多晚一条事件才被交付，不会收到半套。
        def declares(listener: Listener, entry: str) -> bool:
            return getattr(type(listener), entry, None) is not None

        raw = tuple(item for item in listeners if declares(item, RAW_BATCH_ENTRY))
        batched = tuple(item for item in listeners if item not in raw and declares(item, BATCH_ENTRY))
        self._raw, self._batched = raw, batched
        self._singles = tuple(item for item in listeners if item not in raw and item not in batched)
        self.wants_submit_context = len(raw) < len(listeners)
        self.listeners = listeners

    def emit_transition(
        self, snapshot: TaskSnapshot, record: Transition, submit_context: contextvars.Context | None = None
    ) -> None:
        """一条迁移入队（任务锁内每次迁移一次；调用方已确认有监听器）。

        有公开监听器时入队 ``FullTransition``（交付线程据此拼 ``TransitionEvent``）；只有内部监听器
        （内置指标，``RAW_BATCH_ENTRY``）在听时只入队 ``LeanTransition``：
        ``(task_id, 任务名, 标签或 None, 起点状态值, 终点状态值, 时刻)``。
        为什么（issue 18）：交付线程攒批、又要和工作线程抢 GIL，一条迁移在队列里常常待过一两次
        年轻代回收；条目里有被 GC 追踪的对象时它就被晋升，在老一代里才死去——年轻代回收更勤、
        全量回收更早到来（每一万个任务多一次）。完整的条目让这一刻的中间快照（连同它的实例字典）
        与迁移记录跟着活下来。精简条目只含不被追踪的现成值（见 ``LeanTransition``）：元组本身在
        第一次年轻代回收时就被摘出追踪，不再被晋升；``Transition`` 在迁移通知之后就像没有监听器
        时一样立刻被释放。obs21 量过：之前的精简条目 ``(name, record, tags)`` 每条迁移两个被追踪
        的对象在途，每个任务晋升进中间代的对象比没有指标时多约 4 个、进最老一代的多约 2 个；
        现在与没有指标时相同。

        代价：精简入队的迁移拼不出 ``TransitionEvent``，交付时不送给公开监听器——它们是在这条迁移入队之后才
        挂上的，从挂上之后入队的迁移开始收（``add`` 只保证这些；挂上之前已入队的完整条目照旧也送）。
        """
        # 与 emit 同一段入队逻辑（为什么不拿锁、为什么不会漏叫醒，见 emit），就地写一遍而不是调用 emit：
        # 每个任务四条迁移，多一层 Python 调用就是每任务约半微秒。
        queue = self._queue
        if len(queue) >= self._room:  # 满了，或已关闭（_room 为 -1）
            self._refuse()
            return
        if self.wants_submit_context:
            queue.append((snapshot, record, submit_context, None, None, None))
        else:
            queue.append(
                (
                    record.task_id,
                    snapshot.name,
                    snapshot.tags or None,
                    STATUS_VALUE[record.from_status],
                    STATUS_VALUE[record.to_status],
                    record.at,
                )
            )
        if self._sleep == _IDLE:
            self._kick(_IDLE)

    def emit_packed(
        self, snapshot: TaskSnapshot, packed: PackedTransition, submit_context: contextvars.Context | None
    ) -> None:
        """同 ``emit_transition``，迁移给的是紧凑形式（``records.PackedTransition``，状态机历史里的那一条）：
        提交时补发第一条迁移用。只有内部监听器在听时直接从紧凑元组取值，不为它现造一条 ``Transition``（每个
        提交省一次解包，obs21）；有公开监听器时解包成 ``Transition``，交付线程拼事件要用。"""
        queue = self._queue
        if len(queue) >= self._room:  # 满了，或已关闭（_room 为 -1）
            self._refuse()
            return
        if self.wants_submit_context:
            record = unpack_transition(snapshot.task_id, packed)
            queue.append((snapshot, record, submit_context, None, None, None))
        else:
            queue.append(
                (
                    snapshot.task_id,
                    snapshot.name,
                    snapshot.tags or None,
                    packed[0],
                    packed[1],
                    packed[6],
                )
            )
        if self._sleep == _IDLE:
            self._kick(_IDLE)

    def emit(self, item: RawItem) -> None:
        """入队（可在任何锁内调用：常数时间，通常不拿任何锁）。

        ``item`` 是一个事件对象（``ProgressEvent`` / ``StoreErrorEvent``）；迁移走 ``emit_transition``
        （任务锁内每次迁移一次：入队方只建一个元组，``TransitionEvent`` 由交付线程拼装，见类说明）。

        热路径只是一次 ``deque.append``（本身线程安全）加一次标志读：只有交付线程空闲地睡着（``_IDLE``）时
        才拿锁叫醒它。不会漏叫醒：交付线程先置 ``_IDLE`` 再查队列、入队方先 append 再读标志——两边各自
        "先写后读"，所以要么交付线程查队列时已经看到这条，要么入队方读标志时已经看到它在睡（解释器按字节码
        顺序执行，两步不会被重排）。积压上限也是不拿锁地读：并发入队时最多多收几条，上限本来就是防内存无限
        增长的保护，不是精确的配额。
        """
        queue = self._queue
        if len(queue) >= self._room:  # 满了，或已关闭（_room 为 -1）
            self._refuse()
            return
        queue.append(item)
        if self._sleep == _IDLE:  # 交付线程醒着（或在攒批）时它自己会把队列取空：不为每个事件做一次线程交接
            self._kick(_IDLE)

    def _kick(self, level: int) -> None:
        """叫醒睡在 ``level`` 或更深的觉里的交付线程（入队只叫醒空闲的；flush / close 连攒批的也叫醒）。"""
        with self._lock:
            self._kick_locked(level)

    def _kick_locked(self, level: int) -> None:
        # 只在把 _sleep 从"睡着"改成"醒着"的这一刻放锁：_wake 因此至多被放一次（放两次会抛 RuntimeError）。
        if self._sleep >= level:
            self._sleep = _AWAKE
            self._wake.release()

    def _refuse(self) -> None:
        # 关闭之后的事件照旧忽略（不算丢弃）；没关就是积压满了。
        if not self._closed:
            self._drop_new()

    def _drop_new(self) -> None:
        with self._lock:
            self.dropped += 1
            warn = not self._warned_drop
            self._warned_drop = True
        if warn:
            logger.warning(
                "事件监听器跟不上：积压已达 %d 条，新事件被丢弃（计数见 dropped）；请让监听器更快返回",
                MAX_PENDING_EVENTS,
            )

    def flush(self, timeout: float | None = None) -> bool:
        """等到此刻之前入队的事件都已交付（或被丢弃）。返回是否在 timeout 内等到。"""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            # 有人在 flush 时交付线程不攒批（见 _deliver_loop），正在攒批的立刻开始送：
            # flush 不必等满攒批时长。
            self._flushers += 1
            self._kick_locked(_NAPPING)
            try:
                while self._queue or self._busy:
                    if self._thread is None or self._closed:
                        return True
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._flushed.wait(wait_slice(remaining))  # 主线程按片等：Ctrl-C 立刻生效
            finally:
                self._flushers -= 1
        return True

    def close(self, timeout: float = 5.0) -> None:
        """把已入队的事件送完，然后停掉交付线程。之后的事件被忽略。幂等。"""
        self.flush(timeout)
        with self._lock:
            self._closed = True
            self._room = -1  # 之后入队的一律忽略（见 _room）
            self._queue.clear()
            self._kick_locked(_NAPPING)
            self._flushed.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            join_thread(thread, timeout)

    def _doze(self, level: int, timeout: float) -> None:
        """交付线程睡一觉：``_IDLE``（不限时，队列里来了事件、flush 或 close 叫醒）或 ``_NAPPING``（攒批，
        ``timeout`` 秒，flush 或 close 提前叫醒）。"""
        lock = self._lock
        with lock:
            # 先置标志、再查条件（与 emit 的"先 append、再读标志"配对，见 emit）。
            if self._closed or (self._queue if level == _IDLE else self._flushers):
                return
            self._sleep = level
        if self._wake.acquire(timeout=timeout):
            return  # 被叫醒：叫醒者已把 _sleep 改回 _AWAKE
        with lock:
            if self._sleep != _AWAKE:  # 睡满了，没人叫：自己醒来
                self._sleep = _AWAKE
                return
        # 超时的同一刻有人叫醒了（它已经 release）：把那一次放锁收掉，锁回到"被占着"
        self._wake.acquire()

    def _deliver_loop(self) -> None:
        lock = self._lock
        queue = self._queue
        popleft = queue.popleft
        while True:
            if not queue:
                self._doze(_IDLE, -1)
            if self._closed:
                return
            if len(queue) < DELIVERY_BATCH and not self._flushers:
                # 刚被第一条事件叫醒：再等一小会儿让同一阵迁移攒成一批（入队时不再叫醒它），
                # 否则每条事件都是一次线程交接——吞吐时最贵的那一步。close() 与 flush() 会提前叫醒这里。
                self._doze(_NAPPING, COALESCE_SECONDS)
                if self._closed:
                    return
            with lock:
                # 一次取走积压的事件（按入队顺序，至多一批）：一次唤醒送一批，而不是每个事件一次线程交接。
                # 逐个 popleft 而不是把整个 deque 换掉：入队方不拿锁，可能正拿着旧 deque 的引用往里 append。
                # 取批与置 _busy 在同一次加锁里：flush 看到的"队列空且不忙"就是真的送完了。
                count = len(queue)
                if count > DELIVERY_BATCH:  # 不用 min()：3.11 里它是带关键字解析的通用迭代，贵十倍
                    count = DELIVERY_BATCH
                # starmap 在 C 里调 count 次 popleft()：列表推导式每条事件约八条字节码（每个任务四条）。
                batch = list(starmap(popleft, repeat((), count)))
                if not self._closed:  # 仍算在积压上限里，直到这批送完
                    self._room = self._max_pending - len(batch)
                self._busy = True
            try:
                self._deliver(batch)
            finally:
                # 送完就放手：否则这一批（连同它引用的中间快照与提交上下文）要一直活到下一批取出来，
                # 而交付线程在那之间可能空闲地睡上很久。
                del batch
                with lock:
                    self._busy = False
                    if not self._closed:
                        self._room = self._max_pending
                    if self._flushers:  # 没人在 flush 时不碰条件变量（notify_all 是几层 Python 调用）
                        self._flushed.notify_all()

    def _deliver(self, batch: list[RawItem]) -> None:
        # 先把整批交给内部批量入口（未拼装的条目），再交给公开批量入口，最后逐个事件送给其余监听器
        # （见 BATCH_ENTRY / RAW_BATCH_ENTRY）。每一步之前重读分工表：途中被摘掉的监听器不再收到后面的事件。
        for listener in self._raw:
            try:
                getattr(listener, RAW_BATCH_ENTRY)(batch)
            except Exception:
                self._drop(listener)
        if not (self._batched or self._singles):
            return  # 只有内部监听器在听：一个事件对象都不造
        of = TransitionEvent.of
        events: list[Event] = []
        for item in batch:
            if item.__class__ is tuple:
                snapshot, record, context, _, _, at = item
                if at is not None:
                    continue  # 精简入队的迁移（入队时还没有公开监听器，见 emit_transition）：拼不出事件
                events.append(of(snapshot, record, context))  # type: ignore[arg-type]
            else:
                events.append(item)  # type: ignore[arg-type]
        for listener in self._batched:
            try:
                getattr(listener, BATCH_ENTRY)(events)
            except Exception:
                self._drop(listener)
        if not self._singles:
            return
        for event in events:
            # 每个事件都重读监听器表：批内途中被摘掉（remove 或抛异常）的监听器不再收到后面的事件。
            for listener in self._singles:
                try:
                    listener(event)
                except Exception:
                    self._drop(listener)

    def _drop(self, listener: Listener) -> None:
        # 记一次、摘掉：任务与其他监听器照常（模块文档里写了为什么不保留它）。
        self.remove(listener)
        logger.exception("事件监听器 %r 抛出异常，已被移除，不再调用；任务不受影响", listener)


__all__ = [
    "BATCH_ENTRY",
    "MAX_PENDING_EVENTS",
    "Event",
    "EventHub",
    "Listener",
    "ProgressEvent",
    "RawItem",
    "StoreErrorEvent",
    "TransitionEvent",
]
