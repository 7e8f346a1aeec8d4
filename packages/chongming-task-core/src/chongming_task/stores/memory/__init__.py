"""InMemoryTaskStore：TaskStore 的参照实现（单进程、线程安全、零依赖）。

它有三个用途：单进程嵌入时的默认存储、单元测试的替身、其他后端的语义参照物——SQL 后端与它
行为不一致时，以它（和 ``StoreContract``）为准。

实现要点（也是别的后端要照抄的语义）：

* 一把锁护住全部状态。每个方法在锁内完成，所以"检查版本再写入"天然原子。
* 快照是冻结的 dataclass，除 ``outcome`` 外所有字段都不可变（frozenset、冻结的 Progress /
  Failure、datetime），可以在存储与调用方之间安全共享，不必逐次深拷贝。``outcome`` 与指令
  ``payload`` 是任意 JSON 值：入库时用 ``check_json_value`` 校验并保存为 JSON 文本，出库时
  重新解析——于是调用方改动返回对象（或改动交给我们的原对象）永远碰不到存储里的那一份，
  而且内存后端与 SQL 后端对 outcome 的规范化（元组变列表等）完全一致。
* 只有容器型 outcome 才走 JSON 文本；None 与标量直接存放，热路径上不做整份快照的序列化。
* 时间（指令的创建时间与租约）一律取自注入的 ``clock``，测试用 FakeClock 就能确定性地验证租约到期。
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import math
import operator
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar

from chongming_task.clock import SYSTEM_CLOCK, Clock
from chongming_task.core.locks import YieldingLock
from chongming_task.core.records import (
    PACKED_TUPLE_MAX,
    STORABLE_FIELDS,
    PackedTransition,
    check_storable_values,
    pack_transition,
    unpack_transition,
)
from chongming_task.core.storage import checks
from chongming_task.core.storage import values as v
from chongming_task.core.storage.claiming import (
    ClaimStart,
    QueuedClaim,
    claim_order,
    claimable,
    claimed,
    start_claimed,
)
from chongming_task.core.storage.contract import TaskStore
from chongming_task.core.storage.retention import archivable_prefix
from chongming_task.errors import (
    ConcurrencyConflict,
    ConfigurationError,
    DuplicateTaskId,
    StoreError,
    TaskNotFound,
)
from chongming_task.models import TaskSnapshot, Transition

_StoredLine = tuple[int, int, datetime, str, str, bool]
"""存下的一行：``(seq, attempt, at, level, message, truncated)``。不存 ``LogLine`` 对象：元组里全是不可变的
原子值，循环 GC 第一次扫到它就不再追踪（一个常驻的 dataclass 实例每次全量回收都要再扫一遍，存下的行越多
越贵）；``task_id`` 就是所在的行，幂等身份只在写入时有用（读回的行不带它，与 SQL 后端一致）。"""

_SMALL_LOG = 32
"""一个任务的行数不超过这么多时用元组存（追加时整个换掉，O(行数)）；超过后换成 ``deque(maxlen)``。
多数写日志的任务只有几行：元组不被 GC 追踪，deque 总是被追踪（每个任务一个常驻容器）。"""


def _read_line(task_id: str, stored: _StoredLine) -> v.LogLine:
    """把存下的元组还原成 ``LogLine``。每个值写入时都已校验过（来自一个合法的 LogLine），不必再查一遍。"""
    seq, attempt, at, level, message, truncated = stored
    return v.checked_log_line(task_id, attempt, at, level, message, seq, truncated, "", 0)


def _encode_json(value: Any, *, what: str) -> tuple[Any, str | None]:
    """把 JSON 值拆成 (可共享的不可变部分, 容器的 JSON 文本)。

    None 与内置标量本身不可变，直接存放（热路径：运行中的任务 outcome 都是 None，不做任何序列化）；
    dict / list 只保留文本，出库时再解析，保证出入库都是拷贝；其余类型（元组、str 子类、枚举……）
    经一次 JSON 往返规范化成 SQL 后端会交回的样子。
    """
    kind = type(value)
    if value is None or kind is int or kind is bool:
        return value, None
    if kind is str:
        # 短的、无 NUL 的 ASCII 文本一定存得下（转义后最多 6 倍，远低于 16 MiB）；其余的交给与 SQL 后端
        # 同一份的 check_json_value（NUL、孤立代理项、大小）——内存后端不能比别的后端宽松。
        if len(value) > 1 << 20 or not value.isascii() or "\x00" in value:
            checks.check_json_value(value, what=what)
        return value, None
    if kind is float:
        if not math.isfinite(value):
            checks.check_json_value(value, what=what)  # 抛出统一措辞的 ConfigurationError
        return value, None
    text = checks.check_json_value(value, what=what)
    if kind is dict or kind is list:
        return None, text
    parsed = json.loads(text)
    if isinstance(parsed, (dict, list)):
        return None, text
    return parsed, None


class _Row:
    """一个任务的全部存储状态。snapshot 里的 outcome 只在 outcome_text 为 None 时有效。

    ``snapshot`` 是存储眼里的这一版。save 沿用存储自己的旁路字段与配方（``_SAVE_KEEPS``）：行里存调用方的
    快照（``_snapshot``）加一个"存储自己的那几个值"的元组（``_sides``，首项是存下的 outcome），第一次读
    ``snapshot`` 时才按它合成一份、换上（之后照常直接读）。``_sides`` 为 None 表示存储自己的值就是
    ``_snapshot`` 里的。

    为什么 save 只记、不比：原来每次 save 都把两份快照的五个沿用字段逐个比一遍（"是同一个对象"就不记
    ``_sides``），写穿每个任务三次 save，十次字典查找加一次逐项比较，是内存存储每任务指令数的一成半
    （issue 17）。现在 ``_sides`` 为 None 时第一次 save 把存储自己的那组值（连同存下的 outcome）一次取出来
    记下，之后的 save 原样留着它（只在 outcome 变了时换首项）；比较挪到读的时候做、且只做一次（见
    ``snapshot``）——写穿出去的快照多半再也没人读。为什么不每次复制一份合成的快照：写穿出去的终态多半没人读，复制就是每个任务
    两个常驻、每次全量回收都要扫的对象（快照与它的实例字典）；元组里通常只有 None、时间与字符串，循环 GC
    第一次扫到就不再追踪它。读写都在存储的锁内，合成时换上不会与写者交错。
    """

    __slots__ = ("_sides", "_snapshot", "history", "log_seq", "log_writers", "logs", "outcome_text")

    def __init__(self, snapshot: TaskSnapshot, outcome_text: str | None) -> None:
        self._snapshot = snapshot
        self._sides: tuple[Any, ...] | None = None
        self.outcome_text = outcome_text
        # 迁移记录的紧凑形式（records.PackedTransition：GC 不追踪的元组，读历史时才现造 Transition）。
        # 两种形状：版本从首条起逐一连续、按版本升序的元组（常见：写穿落库新任务、之后每次迁移接一条），
        # 或 version → 记录的 dict（其余情形，见 table()）。为什么平常是元组：dict 一装进新造的元组（它还
        # 被 GC 追踪着）就被追踪上，而且只有全量回收才复查、放掉它——积压 5 万个排队任务时每个任务多一个
        # 晋升进最老一代的对象，全量回收的次数与每次的时间都跟着涨（issue 17，bench/README 第二十轮 bl20）。
        # 只装不被追踪的元组的元组，年轻代回收就不再追踪它、从不晋升；写穿的任务落库时交来的就是状态机
        # 自己的那个元组，不必另造。
        self.history: tuple[PackedTransition, ...] | dict[int, PackedTransition] = ()
        # 日志挂在任务行上：删掉任务（prune / delete_archived）就连同日志一起删掉，不会留下孤儿。
        # 多数任务一行日志也不写：行与水位线在第一次 append_logs 时才建；行少时是元组（见 _SMALL_LOG），
        # 水位线是 str → int 的 dict（只含原子值，GC 不追踪）。
        self.logs: tuple[_StoredLine, ...] | collections.deque[_StoredLine] | None = None
        self.log_seq = 0
        self.log_writers: dict[str, int] | None = (
            None  # 写入者 → 已接受的最大 writer_seq（幂等水位线，见 values）
        )

    def table(self) -> dict[int, PackedTransition]:
        """（持锁调用）历史的 dict 形状（version → 记录）：还是元组时就地换成 dict（之后一直是 dict）。
        给不常走的路径（公开的 create / save / append、读历史、归档）用：它们要按版本查找、删除或乱序插入。"""
        history = self.history
        if history.__class__ is tuple:
            history = self.history = {record[5]: record for record in history}
        return history  # type: ignore[return-value]

    @property
    def snapshot(self) -> TaskSnapshot:
        sides = self._sides
        if sides is None:
            return self._snapshot
        current = self._snapshot
        # 调用方那份的这几个字段本来就是存储自己的那组对象（最常见：没被 touch 过、也没记心跳）：不必合成。
        # 逐个"是同一个对象"，不按值相等——时区不同、时刻相同的时间也要换成存储自己的那一个。
        if all(map(operator.is_, _side_values(current.__dict__), sides)):
            self._sides = None
            return current
        combined = current.evolve(**dict(zip(_SIDE_FIELDS, sides, strict=True)))
        self._snapshot, self._sides = combined, None
        return combined

    @snapshot.setter
    def snapshot(self, value: TaskSnapshot) -> None:
        self._snapshot, self._sides = value, None


def _check_version(current: TaskSnapshot, task_id: str, expect_version: int) -> None:
    if current.status_version != expect_version:
        raise ConcurrencyConflict(
            f"任务 {task_id!r} 的版本已是 {current.status_version}，"
            f"不是期望的 {expect_version}：有别的写者抢先了，请重新读取后再决定"
        )


_SAVE_KEEPS = ("progress", "last_heartbeat_at", "lease_owner", "lease_until", "recipe")
"""save 从不改写、沿用存储里的值的字段：旁路字段（只归 create / touch）与配方（只归 create）。"""

_VERSION = operator.itemgetter(5)  # PackedTransition 的 version


def _consecutive(packed: tuple[PackedTransition, ...]) -> bool:
    """紧凑记录的版本是否从首条起逐一连续（于是元组就能当历史存，见 ``_Row``）。"""
    return all(later[5] == earlier[5] + 1 for earlier, later in itertools.pairwise(packed))


_SIDE_FIELDS = ("outcome", *_SAVE_KEEPS)
"""``_Row._sides`` 的各项：存下的 outcome（容器型的只存文本，这里是 None）与沿用的那几个字段。"""
_side_values = operator.itemgetter(*_SIDE_FIELDS)
_LEASE_UNTIL_AT = _SIDE_FIELDS.index("lease_until")


def _keep_sides(row: _Row, old: dict[str, Any], scalar: Any) -> None:
    """（持锁调用）save 换上调用方的快照之前：记下存储自己的旁路字段与配方（``old`` 是行里那份快照的实例
    字典），``scalar`` 是这次存下的 outcome。已经记着的原样留着，只在 outcome 变了时换掉首项（见
    ``_Row``）。"""
    sides = row._sides
    if sides is None:  # 行里那份就是存储眼里的（outcome 也是存下的那个）：整组取出来
        sides = row._sides = _side_values(old)
    if sides[0] is not scalar:
        row._sides = (scalar, *sides[1:])


def _put(
    row: _Row,
    snapshot: TaskSnapshot,
    scalar: Any,
    text: str | None,
    transitions: Sequence[Transition],
) -> None:
    """（持锁调用，检查都已通过）把 save 的快照与迁移记录写进任务行。

    旁路字段只归 touch 管：沿用存储里的值，调用方手里那份可能早已过时。不复制快照：存调用方这份，另记下
    存储里的那组值，读时才合成（见 ``_Row``）。
    """
    _keep_sides(row, row._snapshot.__dict__, scalar)
    row._snapshot = snapshot
    row.outcome_text = text
    # 同 _add_history，只是内联。
    history = row.table()
    for record in transitions:
        version = record.version
        if version not in history:
            history[version] = pack_transition(record)


def _add_history(history: dict[int, PackedTransition], transitions: Iterable[Transition]) -> None:
    """把迁移记录按紧凑形式记进一行的历史；已有的版本保留先到的那条（同 ``setdefault``，只是不为已有的
    版本白打包一次）。"""
    for record in transitions:
        if record.version not in history:
            history[record.version] = pack_transition(record)


class _CommandRow:
    """一条指令的存储状态：不可变的 ``Command`` 加 payload 的 JSON 文本。

    认领 / 完成 / 交还时整体换成 ``dataclasses.replace`` 的新值（字段只在 Command 里写一遍）；payload 只信
    文本，出库时解析成新的 dict，调用方改它碰不到库里的那份。
    """

    __slots__ = ("command", "payload_text")

    def __init__(self, command: v.Command, payload_text: str) -> None:
        self.command = command
        self.payload_text = payload_text

    def export(self) -> v.Command:
        return dataclasses.replace(self.command, payload=json.loads(self.payload_text))

    def update(self, **changes: Any) -> None:
        self.command = dataclasses.replace(self.command, **changes)


class InMemoryTaskStore(TaskStore):
    """线程安全的内存存储。``clock`` 决定指令的创建时间与租约（默认真实时钟）。"""

    group_commit: ClassVar[bool] = False  # 没有可合并的提交：写穿直接 save（见 TaskStore.group_commit）

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._clock: Clock = clock or SYSTEM_CLOCK
        # 写穿时每次迁移都从执行任务的线程进来、临界区只是几次字典操作：用不排车队的锁（见 core/locks.py）。
        self._lock = YieldingLock()
        self._rows: dict[str, _Row] = {}
        # 全部指令（按提交先后）与尚未完成的指令：认领只扫描后者，已完成的指令越积越多也不拖慢轮询。
        self._commands: dict[str, _CommandRow] = {}
        self._pending: dict[str, _CommandRow] = {}
        self._sequence = itertools.count(1)
        # 成员记录：owner → (记录, info 的 JSON 文本)。info 是可变的 dict，出入库都经文本拷贝。
        self._nodes: dict[str, tuple[v.NodeRecord, str]] = {}
        self._closed = False
        # 写穿落库的上一个新任务的实例字典、它的 STORABLE_FIELDS 与标签（已整份查过、或相对于查过的查过）：
        # 下一个 _create_direct 只查与它不是同一个对象的字段，不必再为它取一遍（见 _create_direct）。
        # 锁外读写：一个属性整体换掉，任何时刻读到的都是同一份查过的快照的那一组，哪一组都行。
        self._last_created: tuple[dict[str, Any], tuple[Any, ...], frozenset[str]] | None = None
        # 写穿 _save_next 上一次整项查过、有变的那组可存储字段值（STORABLE_FIELDS）：下一次有变的与它相等时
        # 可存储性也一样，不再逐项查（见 _save_next）。只在存储的锁内读写。
        self._last_changed: tuple[Any, ...] | None = None

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> InMemoryTaskStore:
        """``memory://``：每次打开都是一个新的空存储（进程内，不跨进程共享）。"""
        scheme, sep, rest = url.partition(":")
        if scheme.lower() != "memory" or not sep or rest.strip("/"):
            raise ConfigurationError(f"内存存储的连接串只能是 memory://（不带路径），收到 {url!r}")
        unknown = set(kwargs) - {"clock"}
        if unknown:
            raise ConfigurationError(f"memory:// 只接受 clock= 参数，收到多余的：{sorted(unknown)}")
        return cls(clock=kwargs.get("clock"))

    @property
    def clock(self) -> Clock:
        return self._clock

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._rows)} tasks"
        return f"InMemoryTaskStore({state})"

    # -- helpers (call with the lock held) -----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("存储已关闭：close() 之后不能再读写；请重新打开一个存储")

    def _row(self, task_id: str) -> _Row:
        row = self._rows.get(task_id)
        if row is None:
            raise TaskNotFound(f"存储里没有任务 {task_id!r}")
        return row

    def _select(self, query: v.TaskQuery | None) -> list[TaskSnapshot]:
        """满足条件（不含 limit 与顺序）的内部快照。调用方不得把含容器 outcome 的它们直接交出去。"""
        if query is None:
            return [row.snapshot for row in self._rows.values()]
        checked = v.as_query(query)
        return [row.snapshot for row in self._rows.values() if checked.matches(row.snapshot)]

    # -- snapshots ----------------------------------------------------------------------------------

    def create(self, snapshot: TaskSnapshot, transitions: Sequence[Transition] = ()) -> None:
        snapshot = checks.check_snapshot(snapshot)
        transitions = tuple(transitions)
        checks.check_transitions(snapshot.task_id, transitions)
        outcome = snapshot.outcome
        scalar, text = (None, None) if outcome is None else _encode_json(outcome, what="outcome")
        stored = snapshot if scalar is outcome else snapshot.evolve(outcome=scalar)
        task_id = snapshot.task_id
        with self._lock:
            if self._closed:
                self._check_open()
            if task_id in self._rows:
                raise DuplicateTaskId(
                    f"task_id {task_id!r} 已存在：存储拒绝重复创建（想重跑请换一个 task_id 提交）"
                )
            row = _Row(stored, text)
            _add_history(row.table(), transitions)
            self._rows[task_id] = row

    def _create_direct(self, snapshot: TaskSnapshot, packed: tuple[PackedTransition, ...]) -> None:
        """写穿落库新任务（见 ``TaskStore._create_direct``）：快照照样整份检查，迁移记录按调用方担保的紧凑形式
        直接记进历史（与 create 记下的同一种元组），不再逐条查类型、打包。不是常见形状的快照（子类）交给
        完整的 create。"""
        if snapshot.__class__ is not TaskSnapshot:
            super()._create_direct(snapshot, packed)
            return
        # 逐个 submit 的快照多半由同一个模板复制（StateMachine.sibling）：文本字段与标签就是上一个新任务的那批
        # 对象，只查不是同一个对象的字段，与整份再查结果相同（check_snapshot 的 like，create_many 同一条规则；
        # 每个提交省下十来次文本检查，issue 17）。
        last = self._last_created
        new = snapshot.__dict__
        new_values = STORABLE_FIELDS(new)
        tags = snapshot.tags
        if last is None:
            checks.check_snapshot(snapshot)
        else:  # 同 check_snapshot(snapshot, like=上一个)（类型上面已确认），少一层调用
            old, old_values, old_tags = last
            # check_storable_changes 的快速判定就地先做（同 _save_next）：模板复制出的新任务什么也不用查
            if new_values != old_values or new["priority"] is not old["priority"] or tags is not old_tags:
                check_storable_values(new_values, old_values, new, old, tags, old_tags)
        self._last_created = (new, new_values, tags)  # 查过了（下面落库失败也不影响：它仍是一份查过的快照）
        outcome = snapshot.outcome
        scalar, text = (None, None) if outcome is None else _encode_json(outcome, what="outcome")
        stored = snapshot if scalar is outcome else snapshot.evolve(outcome=scalar)
        task_id = snapshot.task_id
        row = _Row(stored, text)  # 锁外造好：锁内只剩查重与放入
        if packed.__class__ is tuple and (len(packed) < 2 or _consecutive(packed)):
            row.history = packed  # 常见（逐个 submit：一条 pending → queued）：就是状态机的那个元组，见 _Row
        else:
            history = row.table()
            for record in packed:
                history.setdefault(record[5], record)  # 同 _add_history：已有的版本保留先到的那条
        lock = self._lock
        if not lock.try_acquire():  # 热路径的加锁写法见 core/locks.py
            lock.acquire()
        try:
            if self._closed:
                self._check_open()
            if task_id in self._rows:
                raise DuplicateTaskId(
                    f"task_id {task_id!r} 已存在：存储拒绝重复创建（想重跑请换一个 task_id 提交）"
                )
            self._rows[task_id] = row
        finally:
            lock.release()

    def _save(self, request: v.SaveRequest) -> None:
        scalar, text = _encode_json(request.snapshot.outcome, what="outcome")
        with self._lock:
            self._save_locked(request, scalar, text)

    def _save_locked(self, request: v.SaveRequest, scalar: Any, text: str | None) -> None:
        """（持锁调用）save 的判定与写入；``scalar`` / ``text`` 是 outcome 的编码（锁外编好）。"""
        snapshot, expect_version = request.snapshot, request.expect_version
        self._check_open()
        row = self._row(snapshot.task_id)
        # 不经 snapshot 属性合成（同 _save_direct）：版本号不是旁路字段；要看的租约是存储自己的那个
        current = row._snapshot
        _check_version(current, snapshot.task_id, expect_version)
        if request.lease_expired_before is not None:
            sides = row._sides
            lease_until = current.lease_until if sides is None else sides[_LEASE_UNTIL_AT]
            if v.lease_is_held(lease_until, request.lease_expired_before):
                raise ConcurrencyConflict(v.lease_held_message(snapshot.task_id, lease_until))
        _put(row, snapshot, scalar, text, request.transitions)

    def _save_direct(
        self, snapshot: TaskSnapshot, expect_version: int, transitions: Sequence[Transition]
    ) -> None:
        """写穿的 save（见 ``TaskStore._save_direct``）：入参在锁内相对存储里的上一版检查
        （``check_save_since``），不造 ``SaveRequest``。存储里的每一版都是整份查过（或相对查过的上一版查过）
        才存下的，所以只查变了的字段与查整份结果相同。不是常见形状的入参（快照子类、迁移记录不是元组）交给
        完整的 save。"""
        if snapshot.__class__ is not TaskSnapshot or transitions.__class__ is not tuple:
            self.save(snapshot, expect_version=expect_version, transitions=transitions)
            return
        outcome = snapshot.outcome
        # 运行中的任务 outcome 都是 None：不必为它调用编码
        scalar, text = (None, None) if outcome is None else _encode_json(outcome, what="outcome")
        lock = self._lock
        if not lock.try_acquire():  # 热路径的加锁写法见 core/locks.py
            lock.acquire()
        try:
            if self._closed:
                self._check_open()
            row = self._rows.get(snapshot.task_id)
            if row is None:
                row = self._row(snapshot.task_id)  # 抛 TaskNotFound
            # 不经 snapshot 属性合成：可存储性的基准只要是查过的快照，行里存下的调用方那份每个字段都查过；
            # 版本号不是旁路字段（见 _Row）
            current = row._snapshot
            checks.check_save_since(current, snapshot, expect_version, transitions)
            if current.status_version != expect_version:
                _check_version(current, snapshot.task_id, expect_version)
            _put(row, snapshot, scalar, text, transitions)
        finally:
            lock.release()

    def _save_next(self, snapshot: TaskSnapshot, record: Transition, packed: PackedTransition) -> None:
        """写穿最常见的那一次写（见 ``TaskStore._save_next``）：存储正好落后 ``record`` 这一条。

        与 ``_save_direct`` 逐项相同的检查——快照相对存储里的上一版查可存储性（``check_storable_changes``，
        先于版本号，与 ``check_save_since`` 同一先后）、版本冲突、任务不存在、存储已关闭——只是不再逐项对
        迁移记录的版本链（调用方担保：状态机刚记下的那一条，按构造接得上），也不再打包：历史里存的就是
        状态机自己的那个元组（与 ``pack_transition(record)`` 逐项相同）。记录的版本不是快照的版本（担保不
        成立）、或不是常见形状的快照时交给 ``_save_direct`` 的完整检查。"""
        version = packed[5]
        if snapshot.__class__ is not TaskSnapshot or version != snapshot.status_version:
            self._save_direct(snapshot, record.version - 1, (record,))
            return
        outcome = snapshot.outcome
        if outcome is None:  # 运行中的任务 outcome 都是 None：不必为它调用编码
            scalar = text = None
        else:
            scalar, text = _encode_json(outcome, what="outcome")
        lock = self._lock
        if not lock.try_acquire():  # 热路径的加锁写法见 core/locks.py
            lock.acquire()
        try:
            if self._closed:
                self._check_open()
            row = self._rows.get(snapshot.task_id)
            if row is None:
                row = self._row(snapshot.task_id)  # 抛 TaskNotFound
            current = row._snapshot  # 不合成旁路值：同 _save_direct
            new, old = snapshot.__dict__, current.__dict__
            # check_storable_changes(current, snapshot)，先就地做它的快速判定（文本字段与标签原样沿用、
            # priority 是同一个对象时它什么也不查）：每次迁移省一层调用；有变的交给它的后一半，取好的两个元组
            # 一并交过去、不再取第二遍。有变的多半是每个任务的 starting 记下执行器名，一个接一个的任务记下的
            # 是同一组值：与上一次查过的那组相等（priority 仍是上一版的那个对象）时可存储性也一样，不再逐项查
            # ——与 check_storable_changes 认"与查过的文本相等的文本"同一条规则，_create_direct 的
            # _last_created 是同一个做法（issue 17）。
            new_values, old_values = STORABLE_FIELDS(new), STORABLE_FIELDS(old)
            unchecked = new_values != old_values and new_values != self._last_changed
            # 标签在槽里，不在实例字典里（records._SnapshotSlots）
            tags, old_tags = snapshot.tags, current.tags
            if unchecked or new["priority"] is not old["priority"] or tags is not old_tags:
                check_storable_values(new_values, old_values, new, old, tags, old_tags)
                self._last_changed = new_values
            if current.status_version != version - 1:
                _check_version(current, snapshot.task_id, version - 1)
            # 同 _put 的快照那一半（_keep_sides），只是内联（每次迁移都走这里）：旁路字段与配方沿用存储里的。
            sides = row._sides
            if sides is None:
                sides = row._sides = _side_values(old)
            if sides[0] is not scalar:
                row._sides = (scalar, *sides[1:])
            row._snapshot = snapshot
            row.outcome_text = text
            history = row.history
            if isinstance(history, tuple):
                if len(history) < PACKED_TUPLE_MAX and (not history or history[-1][5] == version - 1):
                    # 常见：正好接在最后一条之后——换一个长一条的元组，仍是连续的（见 _Row）
                    row.history = (*history, packed)
                    return
                history = row.table()
            if version not in history:  # 已有的版本保留先到的那条（同 _add_history）
                history[version] = packed
        finally:
            lock.release()

    def get(self, task_id: str) -> TaskSnapshot | None:
        checks.check_key("task_id", task_id)
        with self._lock:
            self._check_open()
            row = self._rows.get(task_id)
            if row is None:
                return None
            snapshot, text = row.snapshot, row.outcome_text
        # JSON 解析放在锁外：大 outcome 不阻塞别的线程。
        return snapshot if text is None else snapshot.evolve(outcome=json.loads(text))

    def query(self, query: v.TaskQuery | None = None) -> list[TaskSnapshot]:
        query = v.as_query(query)
        with self._lock:
            self._check_open()
            # 快照与 outcome 文本必须在锁内成对取出：锁外再分别读 row 的两个属性，中间可能插进一次 save。
            pairs = [
                (row.snapshot, row.outcome_text) for row in self._rows.values() if query.matches(row.snapshot)
            ]
        pairs.sort(key=lambda pair: query.sort_key(pair[0]), reverse=query.order is v.QueryOrder.NEWEST_FIRST)
        if query.limit is not None:
            pairs = pairs[: query.limit]
        return [
            snapshot if text is None else snapshot.evolve(outcome=json.loads(text))
            for snapshot, text in pairs
        ]

    def stats(self, query: v.TaskQuery | None = None) -> v.TaskStats:
        with self._lock:
            self._check_open()
            selected = self._select(query)
        return v.TaskStats.of(selected)

    def bucket_counts(self, query: v.TaskQuery | None = None) -> dict[int, int]:
        with self._lock:
            self._check_open()
            selected = self._select(query)
        return v.count_buckets(selected)

    # -- history ------------------------------------------------------------------------------------

    def append(self, transitions: Sequence[Transition]) -> None:
        transitions = tuple(transitions)
        checks.check_transitions(None, transitions)
        with self._lock:
            self._check_open()
            # 先全部检查再写：一批里有未知任务时整批不写，避免留下半截历史。
            rows = [self._row(record.task_id) for record in transitions]
            for row, record in zip(rows, transitions, strict=True):
                _add_history(row.table(), (record,))

    def history(self, task_id: str) -> list[Transition]:
        checks.check_key("task_id", task_id)
        with self._lock:
            self._check_open()
            row = self._rows.get(task_id)
            if row is None:
                return []
            packed = list(row.table().values())
        packed.sort(key=_VERSION)
        return [unpack_transition(task_id, record) for record in packed]

    # -- durable tasks ------------------------------------------------------------------------------

    def _claim_queued(self, request: QueuedClaim) -> list[TaskSnapshot]:
        with self._lock:
            return self._claim_locked(request)

    claim_start_saves = True  # _claim_and_start 在同一个事务里先写 start.save（见 TaskStore.saves_on_claim）

    def _claim_and_start(self, request: QueuedClaim, start: ClaimStart) -> list[TaskSnapshot]:
        """认领与 starting 在同一次持锁里（判据与开始之后的快照都取自 ``core.storage.claiming``）；给了
        ``start.save`` 时它先在同一次持锁里写（写不成就抛出，什么也没认领）。"""
        save = start.save
        encoded = None if save is None else _encode_json(save.snapshot.outcome, what="outcome")
        with self._lock:
            if save is not None:
                assert encoded is not None
                self._save_locked(save, *encoded)
            taken = self._claim_locked(request)
            result: list[TaskSnapshot] = []
            for snapshot in taken:
                begun = start_claimed(snapshot, start)
                if begun is None:
                    result.append(snapshot)
                    continue
                started, transitions = begun
                row = self._rows[snapshot.task_id]
                scalar, text = _encode_json(started.outcome, what="outcome")
                _put(row, started, scalar, text, transitions)
                result.append(started)
        return result

    def _claim_locked(self, request: QueuedClaim) -> list[TaskSnapshot]:
        """（持锁调用）认领：写上持有者与租约，按认领顺序交回出库的快照。"""
        self._check_open()
        if request.empty:
            return []
        rows = [row for row in self._rows.values() if claimable(row.snapshot, request)]
        rows.sort(key=lambda row: claim_order(row.snapshot))
        taken: list[TaskSnapshot] = []
        for row in rows[: request.limit]:
            row.snapshot = claimed(row.snapshot, request)
            text = row.outcome_text
            taken.append(row.snapshot if text is None else row.snapshot.evolve(outcome=json.loads(text)))
        return taken

    # -- side channel -------------------------------------------------------------------------------

    @staticmethod
    def _touch_changes(update: v.TouchUpdate) -> dict[str, Any]:
        changes = {
            "progress": update.progress,
            "last_heartbeat_at": update.heartbeat_at,
            "lease_owner": update.lease_owner,
            "lease_until": update.lease_until,
        }
        return {name: value for name, value in changes.items() if value is not None}

    def _touch(self, update: v.TouchUpdate) -> bool:
        changes = self._touch_changes(update)
        with self._lock:
            self._check_open()
            row = self._rows.get(update.task_id)
            if row is None:
                return False
            if changes:
                row.snapshot = row.snapshot.evolve(**changes)
            return True

    def touch_many(self, updates: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """一次加锁处理整批：心跳线程每轮给全部任务续租，不该为每个任务各抢一次锁。"""
        prepared = [
            (task_id, self._touch_changes(checks.touch_many_update(task_id, raw))) for task_id, raw in updates
        ]
        with self._lock:
            self._check_open()
            for task_id, changes in prepared:
                row = self._rows.get(task_id)
                if row is not None and changes:
                    row.snapshot = row.snapshot.evolve(**changes)

    def _renew_leases(self, lease_owner: str, task_ids: frozenset[str], lease_until: datetime) -> None:
        """一次加锁、每行一次复制：续租只改两个字段，不必逐项造字段字典、逐项检查。"""
        with self._lock:
            self._check_open()
            rows = self._rows
            for task_id in task_ids:
                row = rows.get(task_id)
                if row is not None:
                    row.snapshot = row.snapshot.evolve(lease_owner=lease_owner, lease_until=lease_until)

    # -- commands -----------------------------------------------------------------------------------

    def _submit_command(self, submission: v.CommandSubmission) -> v.Command:
        payload_text = checks.check_json_value(submission.payload, what="指令 payload")
        task_id = submission.task_id
        with self._lock:
            self._check_open()
            row = self._row(task_id)
            command_id = f"{next(self._sequence):012d}-{uuid.uuid4().hex[:12]}"
            # payload 先放空字典：库里只信 payload_text（见 _CommandRow）。
            created = v.Command(
                command_id,
                task_id,
                submission.action,
                submission.issuer,
                submission.reason,
                {},
                self._clock.now(),
                row.snapshot.bucket,
            )
            command = _CommandRow(created, payload_text)
            self._commands[command_id] = command
            self._pending[command_id] = command
            return command.export()

    def _claim_commands(self, request: v.ClaimRequest) -> list[v.Command]:
        claimant, limit = request.claimant, request.limit
        wanted_tasks, wanted_buckets, holder = request.task_ids, request.buckets, request.holder
        claimed: list[v.Command] = []
        with self._lock:
            self._check_open()
            now = self._clock.now()
            lease_until = now + timedelta(seconds=request.lease)
            for row in self._pending.values():
                if len(claimed) >= limit:
                    break
                command = row.command
                if command.lease_until is not None and command.lease_until > now:
                    continue
                if wanted_tasks is not None and command.task_id not in wanted_tasks:
                    continue
                if wanted_buckets is not None and command.bucket not in wanted_buckets:
                    continue
                if holder is not None:
                    task = self._rows.get(command.task_id)
                    if task is None or task.snapshot.owner != holder:
                        continue
                row.update(claimant=claimant, lease_until=lease_until, deliveries=command.deliveries + 1)
                claimed.append(row.export())
        return claimed

    def _held_command(
        self, rows: dict[str, _CommandRow], command_id: str, claimant: str
    ) -> _CommandRow | None:
        """（持锁调用）``claimant`` 持有的那条指令；不存在或不归它 → None。完成与交还共用。"""
        checks.check_key("command_id", command_id)
        self._check_open()
        row = rows.get(command_id)
        return row if row is not None and row.command.claimant == claimant else None

    def complete_command(self, command_id: str, claimant: str) -> bool:
        with self._lock:
            row = self._held_command(self._commands, command_id, claimant)
            if row is None:
                return False
            if row.command.completed_at is None:
                row.update(completed_at=self._clock.now(), lease_until=None)
                del self._pending[command_id]
            return True

    def release_command(self, command_id: str, claimant: str) -> bool:
        with self._lock:
            row = self._held_command(self._pending, command_id, claimant)
            if row is None:
                return False
            row.update(claimant=None, lease_until=None)
            return True

    # -- membership ---------------------------------------------------------------------------------

    def publish_node(self, record: v.NodeRecord) -> None:
        record = checks.check_node_record(record)
        text = checks.check_json_value(dict(record.info), what="NodeRecord.info")
        stored = dataclasses.replace(record, info=json.loads(text))
        with self._lock:
            self._check_open()
            self._nodes[record.owner] = (stored, text)

    def list_nodes(self) -> list[v.NodeRecord]:
        with self._lock:
            self._check_open()
            pairs = sorted(self._nodes.values(), key=lambda pair: pair[0].owner)
        return [dataclasses.replace(record, info=json.loads(text)) for record, text in pairs]

    def remove_node(self, owner: str) -> bool:
        checks.check_node_owner(owner)
        with self._lock:
            self._check_open()
            return self._nodes.pop(owner, None) is not None

    # -- task logs (issue 18) -----------------------------------------------------------------------

    def append_logs(self, lines: Sequence[v.LogLine]) -> None:
        self._write_logs(checks.append_logs_args(lines))

    def _append_log_lines(self, lines: list[v.LogLine]) -> None:
        # 受信入口（见 TaskStore._append_log_lines）：运行时的缓冲造好、查过的行，不再逐行检查。
        self._write_logs(lines)

    def _write_logs(self, lines: list[v.LogLine]) -> None:
        # 公开的 append_logs 检查完入参也走这里。不能经 _append_log_lines：子类只改了 append_logs 时，那个名字
        # 退回基类的默认实现（又调 append_logs），会无限递归。
        # 逐行处理与"按任务分组、组内按序去重编号"的结果相同：seq 与水位线都是每任务各自的，组内顺序不变。
        with self._lock:
            self._check_open()
            rows = self._rows
            for line in lines:
                row = rows.get(line.task_id)
                if row is None:
                    continue  # 任务已不在（例如刚被 prune）：跳过，见契约
                if line.writer:  # 水位线去重（values.unseen_log_lines 说明为什么）
                    marks = row.log_writers
                    if marks is None:
                        row.log_writers = marks = {}
                    if not v.accept_log_line(line, marks):
                        continue
                row.log_seq = seq = row.log_seq + 1
                stored = (seq, line.attempt, line.at, line.level, line.message, line.truncated)
                logs = row.logs
                if logs is None:
                    row.logs = (stored,)
                elif isinstance(logs, tuple):
                    if len(logs) < _SMALL_LOG:
                        row.logs = (*logs, stored)
                    else:
                        row.logs = collections.deque((*logs, stored), maxlen=v.MAX_LOG_LINES)
                else:
                    # deque(maxlen) 在满时自动丢最旧的一行：丢掉的行数 = log_seq - len(logs)。
                    logs.append(stored)

    def read_logs(
        self, task_id: str, *, attempt: int | None = None, after_seq: int | None = None, limit: int = 1000
    ) -> list[v.LogLine]:
        checks.read_logs_args(task_id, attempt, after_seq, limit)
        with self._lock:
            self._check_open()
            row = self._rows.get(task_id)
            if row is None:
                return []
            picked: list[v.LogLine] = []
            for stored in row.logs or ():
                if after_seq is not None and stored[0] <= after_seq:
                    continue
                if attempt is not None and stored[1] != attempt:
                    continue
                picked.append(_read_line(task_id, stored))
                if len(picked) >= limit:
                    break
            return picked

    def log_stats(self, task_id: str) -> v.LogStats:
        checks.check_key("task_id", task_id)
        with self._lock:
            self._check_open()
            row = self._rows.get(task_id)
            if row is None:
                return v.LogStats()
            kept = 0 if row.logs is None else len(row.logs)
            return v.LogStats(kept=kept, dropped=row.log_seq - kept, last_seq=row.log_seq)

    # -- upkeep -------------------------------------------------------------------------------------

    def prune(self, keep_terminal: int) -> int:
        checks.check_count("keep_terminal", keep_terminal)
        with self._lock:
            self._check_open()
            terminal = [row.snapshot for row in self._rows.values() if row.snapshot.is_terminal]
            excess = len(terminal) - keep_terminal
            if excess <= 0:
                return 0
            terminal.sort(key=_prune_key)
            doomed = {snapshot.task_id for snapshot in terminal[:excess]}
            for task_id in doomed:
                del self._rows[task_id]
            for command_id in [key for key, c in self._commands.items() if c.command.task_id in doomed]:
                del self._commands[command_id]
                self._pending.pop(command_id, None)
            return len(doomed)

    # -- retention: archive-then-delete (issue 20；存储指南 §9) ---------------------------------------

    def export_transitions(
        self, before: datetime, *, after: tuple[str, int] | None = None, limit: int = 1000
    ) -> list[Transition]:
        after = checks.export_transitions_args(before, after, limit)

        def fetch(cursor: tuple[str, int], n: int) -> list[Transition]:
            # 内存后端没有有序索引：在锁内排一次键（只排键，不复制记录），锁外不碰内部结构。
            with self._lock:
                self._check_open()
                keys = sorted(
                    (task_id, version)
                    for task_id, row in self._rows.items()
                    if task_id >= cursor[0]
                    for version in row.table()
                )
                picked = [key for key in keys if key > cursor][:n]
                return [
                    unpack_transition(task_id, self._rows[task_id].table()[version])
                    for task_id, version in picked
                ]

        return archivable_prefix(fetch, before, after, limit)

    def export_finished(
        self, before: datetime, *, after: str | None = None, limit: int = 100
    ) -> list[v.ArchivedTask]:
        after = checks.export_finished_args(before, after, limit)
        with self._lock:
            self._check_open()
            chosen = sorted(
                task_id
                for task_id, row in self._rows.items()
                if row.snapshot.is_terminal
                and (row.snapshot.finished_at or row.snapshot.created_at) < before
                and (after is None or task_id > after)
            )[:limit]
            picked = []
            for task_id in chosen:
                row = self._rows[task_id]
                table = row.table()
                history = tuple(unpack_transition(task_id, table[v]) for v in sorted(table))
                commands = tuple(c.export() for c in self._commands.values() if c.command.task_id == task_id)
                picked.append((row.snapshot, row.outcome_text, history, commands))
        return [
            v.ArchivedTask(
                snapshot if text is None else snapshot.evolve(outcome=json.loads(text)), history, commands
            )
            for snapshot, text, history, commands in picked
        ]

    def delete_archived(self, receipt: v.ArchiveReceipt) -> v.ArchiveDeleted:
        receipt = checks.check_receipt(receipt)
        doomed_tasks = dict(receipt.tasks)
        transitions = tasks = commands = 0
        with self._lock:
            self._check_open()
            for task_id, version in receipt.transitions:
                row = self._rows.get(task_id)
                if row is not None and row.table().pop(version, None) is not None:
                    transitions += 1
            for command_id in receipt.commands:
                stored = self._commands.get(command_id)
                if stored is None:
                    continue
                command = stored.command
                # 未完成的指令只在它的任务整体离开时才随之删除，否则它还等着被执行。
                if command.completed_at is None and not self._task_leaves(command.task_id, doomed_tasks):
                    continue
                del self._commands[command_id]
                self._pending.pop(command_id, None)
                commands += 1
            for task_id in doomed_tasks:
                row = self._rows.get(task_id)
                if row is None or not self._task_leaves(task_id, doomed_tasks):
                    continue
                if any(c.command.task_id == task_id for c in self._commands.values()):
                    continue
                del self._rows[task_id]
                tasks += 1
        return v.ArchiveDeleted(transitions, tasks, commands)

    def _task_leaves(self, task_id: str, doomed: Mapping[str, int]) -> bool:
        """回执里的任务能否整体删除（锁内调用）：仍是终态、版本一致、在线历史已全部归档。"""
        row = self._rows.get(task_id)
        return (
            row is not None
            and task_id in doomed
            and row.snapshot.is_terminal
            and row.snapshot.status_version == doomed[task_id]
            and not row.history
        )

    def purge_commands(self, completed_before: datetime) -> int:
        checks.check_aware("completed_before", completed_before, required=True)
        with self._lock:
            self._check_open()
            doomed = [
                key
                for key, c in self._commands.items()
                if c.command.completed_at is not None and c.command.completed_at < completed_before
            ]
            for command_id in doomed:
                del self._commands[command_id]
            return len(doomed)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._rows.clear()
            self._commands.clear()
            self._pending.clear()
            self._nodes.clear()


def _prune_key(snapshot: TaskSnapshot) -> tuple[int, datetime, str]:
    """最旧的排前面：按 finished_at；缺 finished_at 的终态记录（导入的旧数据）视为最旧。"""
    if snapshot.finished_at is None:
        return (0, snapshot.created_at, snapshot.task_id)
    return (1, snapshot.finished_at, snapshot.task_id)


__all__ = ["InMemoryTaskStore"]
