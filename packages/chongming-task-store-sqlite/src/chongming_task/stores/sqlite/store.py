"""SqliteTaskStore 的实现（模块说明见包的 ``__init__``）。"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal, TypeVar

from chongming_task.clock import SYSTEM_CLOCK, Clock
from chongming_task.core.records import PackedTransition, unpack_transition
from chongming_task.core.storage import checks
from chongming_task.core.storage import values as v
from chongming_task.core.storage.claiming import ClaimStart, QueuedClaim, start_claimed
from chongming_task.core.storage.commit_hooks import before_commit
from chongming_task.core.storage.contract import TaskStore
from chongming_task.core.storage.opening import CreateSchema, OpensReadonly, SchemaMissing, check_opening
from chongming_task.core.storage.retention import RetentionByModule, RetentionModule
from chongming_task.errors import (
    ConcurrencyConflict,
    ConfigurationError,
    DuplicateTaskId,
    StoreError,
    TaskError,
    TaskNotFound,
)
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.states import TERMINAL_STATUSES, TaskStatus
from chongming_task.stores.sqlite import _archive, _claim, _logs, _sql
from chongming_task.stores.sqlite import _codec as codec
from chongming_task.stores.sqlite import _schema as schema
from chongming_task.stores.sqlite._checkpoint import BackgroundCheckpointer
from chongming_task.stores.sqlite._fork import FORKS

T = TypeVar("T")
_Mode = Literal["write", "read", "none"]

MEMORY = ":memory:"

_SYNCHRONOUS_MODES = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
_URL_OPTIONS = frozenset({"clock", "busy_timeout", "synchronous", "readonly", "create_schema"})

# SQLite 主错误码（扩展码的低 8 位）。
NAME_INDEX_ROWS = 5000
"""任务名前缀匹配的行不超过这么多时，带 LIMIT 的查询走 name 索引再排序；更多时沿时间索引边走边筛。"""

_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_READONLY = 8
_SQLITE_CORRUPT = 11
_SQLITE_FULL = 13
_SQLITE_CANTOPEN = 14
_SQLITE_NOTADB = 26
_SQLITE_CONSTRAINT_PRIMARYKEY = 1555
_SQLITE_CONSTRAINT_UNIQUE = 2067

# 退避：首轮 1 毫秒，逐轮翻倍，封顶 100 毫秒，带 ±50% 抖动——多个进程同时撞锁时错开重试时刻。
_FIRST_BACKOFF = 0.001
_MAX_BACKOFF = 0.1

_RETURNING_SUPPORTED = sqlite3.sqlite_version_info >= (3, 35, 0)


def _error_code(exc: sqlite3.Error) -> int:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code
    # 没有错误码属性的老解释器：只能按消息判断。
    text = str(exc).lower()
    if "locked" in text:
        return _SQLITE_BUSY
    if "not a database" in text:
        return _SQLITE_NOTADB
    return -1


def _is_busy(exc: sqlite3.Error) -> bool:
    return _error_code(exc) & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)


class _Connection(sqlite3.Connection):
    """本存储的连接：多带一个复用的游标 ``writes``，给结果当场就用完的写语句（BEGIN / COMMIT、INSERT、
    只看 ``rowcount`` 的 UPDATE）用。

    为什么：``Connection.execute`` 每条语句都现造一个游标（GC 追踪的对象，连接还要为它登记一个弱引用），
    语句执行完就丢。这台机器上的 3.11 里稳定运行时一次约 3.3 µs，复用同一个游标约 0.75 µs（循环 GC 开着时，
    现造的游标让第 0 代回收更频繁；关掉 GC 时两者只差约 0.2 µs）；逐个 submit 每任务 6 条这样的语句。
    只用于结果不留到下一条语句之后的写：游标执行下一条语句时会重置上一条的结果，所以 SELECT 照旧各用
    ``conn.execute`` 的新游标。同一时刻一条连接只有一个线程在用（连接池），游标也就只有它在用。"""

    writes: sqlite3.Cursor

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.writes = self.cursor()


class _Pool:
    """连接池。文件库：借出/归还，空闲连接最多留 ``max_idle`` 条。内存库：唯一一条连接，借出期间持锁。"""

    def __init__(
        self, connect: weakref.WeakMethod[Callable[[], _Connection]], *, shared: bool, max_idle: int = 8
    ) -> None:
        # 存储的 _connect 只经弱引用拿：池归存储所有，存着一个绑定方法就成了 存储 → 池 → 方法 → 存储 的环，
        # 没人再引用的存储（连同它的连接与文件句柄）要等一次全量回收才释放，而不是当场由引用计数释放。
        self._connect_ref = connect
        self._shared = shared
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._serial = threading.Lock()
        self._idle: list[_Connection] = []
        self._single: _Connection | None = None
        self._closed = False
        self._generation = FORKS.generation

    def _connect(self) -> _Connection:
        connect = self._connect_ref()
        if connect is None:  # 存储已被回收：池只由它持有，正常走不到这里
            raise self._closed_error()
        return connect()

    @staticmethod
    def _closed_error() -> StoreError:
        return StoreError("存储已关闭：close() 之后不能再读写；请重新打开一个存储")

    def _after_fork(self) -> None:
        # fork 出来的子进程不能继续用父进程的连接（SQLite 明确禁止跨 fork 使用同一连接）。
        # 也不能在子进程里关闭它们——那会动到父进程仍在用的文件锁状态；直接丢弃，子进程重新连。
        # 按 fork 的代数判定（见 _fork），不是每次借连接都查一次进程号（一次系统调用）。
        if self._generation != FORKS.generation:
            self._generation = FORKS.generation
            self._idle = []
            self._single = None

    def acquire(self) -> _Connection:
        """借一条连接；用完必须 ``release``（哪怕出了异常）。``_run`` 每个事务都走这里：不经
        ``contextlib.contextmanager`` 的生成器（每次借还多一个生成器对象、几层调用）。"""
        if self._shared:
            self._serial.acquire()
            try:
                if self._closed:
                    raise self._closed_error()
                if self._single is None:
                    self._single = self._connect()
            except BaseException:
                self._serial.release()
                raise
            return self._single
        with self._lock:
            if self._closed:
                raise self._closed_error()
            if self._generation != FORKS.generation:  # 每个事务都走这里：代数相同时不多一层调用
                self._after_fork()
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._connect()
        return conn

    def release(self, conn: _Connection) -> None:
        if self._shared:
            self._serial.release()
            return
        keep = False
        with self._lock:
            # 仍处于事务中（回滚本身失败了）的连接不能再借给别人。
            if not self._closed and len(self._idle) < self._max_idle and not conn.in_transaction:
                self._idle.append(conn)
                keep = True
        if not keep:
            conn.close()

    @contextlib.contextmanager
    def connection(self) -> Iterator[_Connection]:
        conn = self.acquire()
        try:
            yield conn
        finally:
            self.release(conn)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        if self._shared:
            # 等正在进行的操作做完再关唯一的连接。
            with self._serial:
                if self._single is not None:
                    self._single.close()
                    self._single = None

    @property
    def closed(self) -> bool:
        return self._closed


class _WriterTurn:
    """同一进程里的写事务先在这里排队，再去拿 SQLite 的写锁。

    SQLite 一次只允许一个写者；同一进程的两条连接撞上写锁时，输的一方进 SQLite 自带的忙等处理——它按 1、2、5、
    10 毫秒……地睡，而一个写事务本身只要一两百微秒。提交线程的 create 与工作线程的 save 撞锁，每次就白睡至少
    1 毫秒（吞吐的头号损耗）。在进程内先排队：前一个写者一提交，下一个立刻接手，不睡。跨进程的争用照旧交给
    SQLite 的忙等与 ``_run`` 的退避。可重入（写事务里再开写事务的路径保持原来的行为）；fork 之后在子进程里
    换一把新锁（父进程里别的线程可能正持有它）。
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._generation = FORKS.generation

    def turn(self) -> threading.RLock:
        if self._generation != FORKS.generation:  # fork 之后（见 _fork：不为每个写事务查一次进程号）
            self._lock = threading.RLock()
            self._generation = FORKS.generation
        return self._lock


# create 的一项准备好的行：(task_id, 任务行, 标签行, 迁移记录行)。
_CreateRows = tuple[str, tuple[Any, ...], list[tuple[Any, ...]], list[tuple[Any, ...]]]
# 一条迁移记录与它编码出的行（create_many 里下一条记录照抄同一对象字段的编码，见 RowCodec.values_like）。
_EncodedTransition = tuple[Transition, tuple[Any, ...]]
# save 慢路径要的参数：(task_id, expect_version, 租约条件的排序键或 None, save 行, 其中没有索引的列, 标签)。
_SlowSave = tuple[str, int, "int | None", tuple[Any, ...], tuple[Any, ...], frozenset[str]]
# 准备好的一项 save（``SqliteTaskStore._prepared_save``）：(快速路径的 UPDATE 或 None, 迁移记录行,
# 慢路径的参数)。
_PreparedSave = tuple["tuple[str, list[Any]] | None", list[tuple[Any, ...]], _SlowSave]
# 准备好的一项 create（``SqliteTaskStore._prepared_create``）：(task_id, 任务行的 INSERT, 标签行,
# 迁移记录行)。
_PreparedCreate = tuple[str, tuple[str, list[Any]], list[tuple[Any, ...]], list[tuple[Any, ...]]]
# 任务行（TASK_COLUMNS 顺序的元组）里 created_key 的位置：标签行带着它（task_tags 按创建先后排序）。
_CREATED_KEY_AT = schema.TASK_COLUMNS.index("created_key")
transition_values = codec.TRANSITIONS.values  # 迁移记录 → TRANSITION_COLUMNS 顺序的一行（不经字典）


HINT_TASKS = 4096
"""``_RowHints`` 至多记着多少个任务的上一次 save 行（满了整个清空：见那里）。"""


class _RowHints:
    """编码的提示：每个任务上一次准备好的 (快照, save 行)（save 准备好时记下；create 准备好时记下任务行里
    save 写的那几列）。下一次 save 同一个任务时，与提示里是**同一个不可变对象**的字段照抄它的编码
    （``SnapshotCodec.save_values_since``），其余字段照常编码。入参检查不看提示：每次照常整份检查
    （``check_storable_fields`` 本身不到 0.5 µs；相对上一版只查变了的字段在有文本字段变了时反而贵一倍，
    callgrind 实测）。

    为什么可以不管那次写有没有提交：编码是字段值的纯函数，与存储里有什么无关。提示里的快照在放进来之前已经
    整份查过、编码过，同一个不可变对象的编码不会因为那次写失败、冲突或回滚而改变；存储状态相关的判定
    （版本、是否存在、租约）每次照旧在事务里做。照抄只限于不可变的值（``save_values_since``）：outcome 这样的
    JSON 值、可变的标签集合可能被调用方在两次写之间就地改过，同一个对象也每次重新编码、重新检查
    （JSON 的检查就在编码里）。

    为什么值得：写穿每次迁移只改状态、版本与一两个时间，快照其余列（时间、文本、标签）原样沿用——照抄它们
    省掉 save 编码里约七分之一的指令（callgrind：19.4k → 16.8k / 次）。

    内存有上限：任务到终态时丢掉它的那一项（不会再有 save），记满 ``HINT_TASKS`` 个任务时整个清空
    （十万个在管的任务不会留下十万行；清空只是让下一次 save 整份编码一次）。

    线程安全不靠锁：每次读写都是字典的单个操作（原子），读到旧的、别的线程刚换上的或者已被清掉的提示都只是
    提示，结果一样正确。fork 安全也因此不必另做：子进程继承的提示照样正确（纯函数的结果），也没有锁会被
    父进程里别的线程持着带进子进程。
    """

    __slots__ = ("saved",)

    def __init__(self) -> None:
        self.saved: dict[str, tuple[TaskSnapshot, tuple[Any, ...]]] = {}

    def save_hint(self, snapshot: object) -> tuple[TaskSnapshot, tuple[Any, ...]] | None:
        """``snapshot``（还没检查的入参）所属任务的提示；入参不是快照、task_id 不是字符串时没有。"""
        if snapshot.__class__ is not TaskSnapshot:
            return None
        task_id = snapshot.task_id
        return self.saved.get(task_id) if task_id.__class__ is str else None

    def remember_save(self, snapshot: TaskSnapshot, row: tuple[Any, ...]) -> None:
        """``snapshot`` 已查过、``row`` 是它的 save 行（``SNAPSHOTS.save_values``）。"""
        saved = self.saved
        if snapshot.status in TERMINAL_STATUSES:
            saved.pop(snapshot.task_id, None)  # 终态之后不会再有 save
            return
        if len(saved) >= HINT_TASKS:
            saved.clear()
        saved[snapshot.task_id] = (snapshot, row)


def _duplicate(task_id: str) -> DuplicateTaskId:
    return DuplicateTaskId(f"task_id {task_id!r} 已存在：存储拒绝重复创建（想重跑请换一个 task_id 提交）")


def _insert_created(
    conn: _Connection, task_id: str, insert_task: tuple[str, list[Any]], tags: list[tuple[Any, ...]]
) -> None:
    """create 的任务行与标签行（迁移记录由调用方插）。id 已存在 → DuplicateTaskId，这一项什么也没写。"""
    try:
        conn.writes.execute(*insert_task)
    except sqlite3.IntegrityError as exc:
        if _error_code(exc) in (_SQLITE_CONSTRAINT_PRIMARYKEY, _SQLITE_CONSTRAINT_UNIQUE):
            raise _duplicate(task_id) from None
        raise
    if tags:
        conn.executemany(_sql.INSERT_TAG, tags)


def _save_slow(conn: _Connection, slow: _SlowSave) -> None:
    """save 的慢路径（快速路径改到 0 行时，见 ``SqliteTaskStore._prepared_save``）：先读再写。任务不存在 /
    版本冲突 / 租约仍有效 → TaskNotFound / ConcurrencyConflict，什么也没写。"""
    task_id, expect_version, lease_key, row, plain_values, tags = slow
    current = conn.execute(_sql.SAVE_SELECT, (task_id,)).fetchone()
    if current is None:
        raise TaskNotFound(f"存储里没有任务 {task_id!r}")
    stored_version = current[_sql.SAVE_VERSION_INDEX]
    if stored_version != expect_version:
        raise ConcurrencyConflict(
            f"任务 {task_id!r} 的版本已是 {stored_version}，不是期望的 {expect_version}："
            "有别的写者抢先了，请重新读取后再决定"
        )
    if lease_key is not None:
        # 与版本检查在同一个写事务里：读到的租约就是写入那一刻的租约。
        held = conn.execute(_sql.SAVE_LEASE_HELD, (task_id, lease_key)).fetchone()
        if held is not None:
            raise ConcurrencyConflict(v.lease_held_message(task_id, codec.dt_parse(held[0])))
    # 被索引的列只在真的变了时 SET：SQLite 会为 SET 里出现的每个被索引的列维护索引（哪怕值没变），
    # 而一次状态迁移通常只改 status 和时间戳，不碰 name、owner、桶号。其余的列每次照写。
    changed = [
        (column, new)
        for column, old, new in zip(
            schema.INDEXED_SAVE_COLUMNS,
            current[_sql.SAVE_INDEXED_OFFSET :],
            _sql.save_indexed(row),
            strict=True,
        )
        if old != new or type(old) is not type(new)
    ]
    conn.execute(*_sql.save_update(plain_values, changed, task_id))
    # 标签行带着排序键：标签或 created_at 变了都要重写（两者几乎从不变，平常是零开销）。
    created_key = row[_sql.SAVE_ROW_CREATED_KEY]
    if (
        current[_sql.SAVE_TAGS_INDEX] != row[_sql.SAVE_ROW_TAGS]
        or current[_sql.SAVE_CREATED_INDEX] != created_key
    ):
        conn.execute("DELETE FROM task_tags WHERE task_id = ?", (task_id,))
        conn.executemany(_sql.INSERT_TAG, [(tag, created_key, task_id) for tag in tags])


def _execute(conn: _Connection, fn: Callable[[_Connection], T], mode: _Mode) -> T:
    if mode == "none":
        return fn(conn)
    writes = conn.writes  # 复用的游标（见 _Connection）：BEGIN / COMMIT 没有要留的结果
    writes.execute("BEGIN IMMEDIATE" if mode == "write" else "BEGIN")
    try:
        result = fn(conn)
        if mode == "write":
            before_commit()  # 组提交在这里叫醒上一批定时睡着的调用方（见 commit_hooks）
        writes.execute("COMMIT")
        return result
    except BaseException:
        if conn.in_transaction:
            # 回滚失败时连接仍在事务里，连接池会丢弃它而不是复用；原异常更重要。
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


class SqliteTaskStore(OpensReadonly, RetentionByModule, TaskStore):
    """SQLite 存储。``path`` 是文件路径或 ``":memory:"``。

    * ``clock``：指令的创建时间与租约取自它（测试注入 FakeClock）；默认真实时钟。
    * ``busy_timeout``：等待别的连接/进程释放写锁的总秒数；超时抛 StoreError。
    * ``synchronous``：``OFF`` / ``NORMAL``（默认：WAL 下崩溃安全，断电可能丢最后几个事务）/
      ``FULL`` / ``EXTRA``。
    * ``readonly``：只读打开——不建文件、不建表、不改 journal 模式，连接带 ``PRAGMA query_only``，
      写方法一律抛 StoreError；文件里没有 chongming-task 的表就抛 ``SchemaMissing``。
    * ``create_schema``：``"auto"``（默认，只在新文件 / 0 字节 / 一张表也没有的库上建表）、``"always"``
      （库里有别的应用的表也建）、``"never"``（从不建表）。约定见 ``chongming_task.core.storage.opening``。
    """

    _retention: ClassVar[RetentionModule] = _archive  # 归档保留四个方法的实现（见 RetentionByModule）
    group_commit_writers: ClassVar[int] = 1  # 一次只有一个写者：组提交排成一队、合批，不在写锁上互相等
    # 单个提交的 create 也经组提交：它反正要在写锁前与执行槽的 save 排队，合进一个事务少一次提交
    group_commit_creates: ClassVar[bool] = True
    # 写事务的 COMMIT 之前调用 commit_hooks.before_commit()：组提交把叫醒上一批的调用方挪到那一刻（见那里）
    calls_before_commit: ClassVar[bool] = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        busy_timeout: float = 30.0,
        synchronous: str = "NORMAL",
        readonly: bool = False,
        create_schema: CreateSchema = "auto",
    ) -> None:
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if not isinstance(path, str) or not path.strip():
            raise ConfigurationError(
                f"SQLite 数据库路径必须是非空字符串（文件路径或 ':memory:'），收到 {path!r}"
            )
        if "\x00" in path:
            raise ConfigurationError("SQLite 数据库路径不能包含 NUL 字符（\\x00）")
        checks.check_positive_seconds("busy_timeout", busy_timeout)
        if not isinstance(synchronous, str) or synchronous.upper() not in _SYNCHRONOUS_MODES:
            raise ConfigurationError(
                f"synchronous 只能是 {', '.join(sorted(_SYNCHRONOUS_MODES))} 之一，收到 {synchronous!r}"
            )
        self._create_schema = check_opening(readonly, create_schema)
        self._readonly = readonly
        self._path = path
        self._memory = path == MEMORY
        if readonly and not self._memory and not os.path.isfile(path):
            # sqlite3.connect 会顺手建出一个空文件：只读打开必须在连接之前就拒绝，什么也不留下。
            raise SchemaMissing(
                f"数据库文件 {path} 不存在：只读打开不会创建它；请检查路径（新库由写入方——run 或 "
                "chongming-task init——创建）"
            )
        self._clock: Clock = clock or SYSTEM_CLOCK
        self._busy_timeout = float(busy_timeout)
        self._synchronous = synchronous.upper()
        self._returning = _RETURNING_SUPPORTED
        self._pool = _Pool(weakref.WeakMethod(self._connect), shared=self._memory)
        self._writers = _WriterTurn()
        self._hints = _RowHints()
        # 写穿上一个查过的新任务快照（_packed_create 相对它检查下一个）
        self._last_created: TaskSnapshot | None = None
        # WAL 检查点由后台线程做，不在提交的线程上（见 _checkpoint）。内存库没有 WAL；只读打开不写。
        self._checkpointer: BackgroundCheckpointer | None = None
        if not (self._memory or readonly):
            # 线程只经弱引用回到存储：忘了 close() 的存储照样能被回收，回收时（finalize）线程跟着退出——
            # 否则每个没关的存储都留下一条永远等着的线程和它的连接池。
            method = weakref.WeakMethod(self._checkpoint_wal)

            def checkpoint(exclusive: bool) -> Any:
                bound = method()
                return None if bound is None else bound(exclusive)

            self._checkpointer = BackgroundCheckpointer(
                checkpoint, name=f"chongming-sqlite-checkpoint[{path}]"
            )
            weakref.finalize(self, self._checkpointer.close, 0.0)
        try:
            self._run("打开数据库", self._prepare, "none")
        except BaseException:
            self._pool.close()
            raise

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> SqliteTaskStore:
        """``sqlite:///绝对路径``、``sqlite:相对路径.db``、``sqlite:///:memory:`` / ``sqlite://:memory:``。"""
        unknown = set(kwargs) - _URL_OPTIONS
        if unknown:
            raise ConfigurationError(
                f"SqliteTaskStore 只接受 {', '.join(sorted(_URL_OPTIONS))} 参数，"
                f"收到多余的：{sorted(unknown)}"
            )
        return cls(parse_url(url), **kwargs)

    # -- plumbing -----------------------------------------------------------------------------------

    @property
    def path(self) -> str:
        return self._path

    @staticmethod
    def schema_sql() -> str:
        """建表脚本（含事务）：与打开新库时执行的是同一份语句，可交给 sqlite3 命令行手工执行。"""
        return schema.schema_sql()

    @property
    def clock(self) -> Clock:
        return self._clock

    def __repr__(self) -> str:
        state = ", closed" if self._pool.closed else ""
        return f"SqliteTaskStore({self._path!r}{state})"

    def _connect(self) -> _Connection:
        conn = sqlite3.connect(
            self._path,
            timeout=self._busy_timeout,
            isolation_level=None,  # 自己管事务：BEGIN IMMEDIATE / BEGIN / COMMIT
            check_same_thread=False,  # 连接在池里跨线程借还，但同一时刻只有一个线程在用
            cached_statements=256,
            factory=_Connection,  # 带一个复用的游标（见 _Connection）
        )
        try:
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            if self._checkpointer is not None:
                conn.execute("PRAGMA wal_autocheckpoint = 0")  # 检查点交给后台线程（见 _checkpoint）
                # WAL 从头复用时把文件截短：后台检查点下 WAL 的峰值比默认的大（见 _checkpoint），不截短的话
                # 一阵突发之后文件一直占着峰值那么大，之后的提交都写进早已分配的空间——磁盘满了也照样成功，
                # 故障要等到 WAL 再次变长时才暴露。截短之后每次提交都在文件末尾追加，磁盘满立刻报出来。
                conn.execute("PRAGMA journal_size_limit = 0").fetchone()
            if self._readonly:
                # 连接级的只读：即使某条代码路径忘了检查 readonly，SQLite 自己也拒绝任何修改。
                conn.execute("PRAGMA query_only = ON")
        except BaseException:
            conn.close()
            raise
        return conn

    def _prepare(self, conn: _Connection) -> None:
        """首次打开：检查/建立表结构，然后切到 WAL。可重入——撞锁时整个重跑。

        先判定"能不能用、该不该建"，再动文件：别人的库、只读打开、不许建表时，文件一个字节都不改
        （连 journal 模式也不切——那会改写文件头）。
        """
        version = schema.read_version(conn)
        schema.check_not_newer(version, self._path)
        where = "内存数据库" if self._memory else f"数据库文件 {self._path}"
        if version == schema.SCHEMA_VERSION and (
            self._create_schema == "never" or not schema.missing_tables(conn)
        ):
            # 只读 / 不许建表时，同一版本里后补的表（节点表）缺了也照常打开：用到它的方法才报错。
            # 缺后补的列（配方）则不行：每条读快照的语句都要选它。
            lacking = schema.missing_columns(conn)
            if lacking:
                raise SchemaMissing(
                    f"{where} 是持久任务加入之前建的，tasks 表缺列 {', '.join(lacking)}：只读（或不许建表）的"
                    "打开不会补列；请用可写方式打开一次（chongming-task init）"
                )
            self._use_wal(conn)
            return
        if self._create_schema == "never":
            if version is not None:
                raise SchemaMissing(
                    f"{where} 的表结构版本是 {version}，低于当前的 {schema.SCHEMA_VERSION}："
                    "只读（或不许建表）"
                    "的打开不会升级它；请用可写方式打开一次（chongming-task init）"
                )
            raise SchemaMissing(
                f"{where} 里没有 chongming-task 的表：请确认路径指向 chongming-task 的数据库"
                "（它可能是别的应用的库或空文件；新库由 run 或 chongming-task init 创建）",
                ddl=schema.schema_sql(),
            )
        if version is None and self._create_schema == "auto":
            others = schema.foreign_tables(conn)
            if others:
                raise SchemaMissing(
                    f"{where} 里已有别的表（{', '.join(others[:3])}{' 等' if len(others) > 3 else ''}），"
                    "没有 chongming-task 的表：确实要把任务表建在这个库里，请先运行 chongming-task init"
                    "（代码里传 create_schema='always'），否则换一个新文件",
                    ddl=schema.schema_sql(),
                )
        if not self._memory and schema.is_new_file(conn):
            # 两者都只能在建第一张表之前设定；页大小必须在 auto_vacuum 之前（设 auto_vacuum 会把新库的页大小
            # 定成当时的值）。
            schema.use_small_pages(conn)  # 见 _schema.NEW_FILE_PAGE_SIZE
            _archive.use_incremental_vacuum(conn)  # 见 _archive
        _execute(conn, lambda c: schema.create_or_migrate(c, self._path), "write")
        self._use_wal(conn)

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        if self._memory or self._readonly:
            return  # 只读打开不改 journal 模式：那会改写文件头
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if str(mode).lower() != "wal":
            conn.execute("PRAGMA journal_mode = WAL").fetchone()

    def _wrap(self, exc: sqlite3.Error, what: str) -> StoreError:
        code = _error_code(exc) & 0xFF
        where = "内存数据库" if self._memory else f"数据库文件 {self._path}"
        if code == _SQLITE_NOTADB:
            return StoreError(
                f"{where} 不是 SQLite 数据库（或文件头已损坏）：请确认路径指向 chongming-task 的数据库，"
                "或换一个新的文件名让它重新建库"
            )
        if code == _SQLITE_CORRUPT:
            return StoreError(f"{where} 已损坏（{exc}）：请从备份恢复，或换一个新文件")
        if code == _SQLITE_CANTOPEN:
            return StoreError(f"无法打开{where}（{exc}）：请检查所在目录是否存在、是否有读写权限")
        if code == _SQLITE_READONLY and self._readonly:
            return StoreError(
                f"{where} 是只读打开的（readonly=True）：不能写入（{what}）；要写入请去掉 readonly"
            )
        if code == _SQLITE_READONLY:
            return StoreError(f"{where} 是只读的（{exc}）：请检查文件与所在目录的写权限")
        if code == _SQLITE_FULL:
            return StoreError(f"{where} 写入失败：磁盘已满（{exc}）")
        return StoreError(f"SQLite 操作失败（{what}，{where}）：{exc}")

    def _run(self, what: str, fn: Callable[[_Connection], T], mode: _Mode = "write") -> T:
        """在一条连接上执行 ``fn``（按 mode 包在写事务 / 读事务里），撞锁则退避重试整个事务。"""
        started = time.monotonic()
        delay = _FIRST_BACKOFF
        while True:
            try:
                # 写者队列与连接的借还直接调用，不叠两层 with（contextmanager 的生成器、nullcontext）：
                # 每个事务都走这里。先排队再借连接，还连接之后再让出队列——与原来嵌套的 with 同一个顺序。
                if mode == "write":
                    # 写事务（组提交的每一批都是）：与 _execute 的 "write" 同样的几步，直接写在这里——少一层
                    # 调用，也不必数 total_changes（写事务总算"写过"）。
                    turn = self._writers.turn()
                    turn.acquire()
                    try:
                        pool = self._pool
                        conn = pool.acquire()
                        try:
                            writes = conn.writes  # 复用的游标（见 _Connection）
                            writes.execute("BEGIN IMMEDIATE")
                            try:
                                result = fn(conn)
                                before_commit()  # 组提交在这里叫醒上一批定时睡着的调用方（见 commit_hooks）
                                writes.execute("COMMIT")
                            except BaseException:
                                if conn.in_transaction:
                                    # 回滚失败时连接仍在事务里，连接池会丢弃它而不是复用；原异常更重要。
                                    with contextlib.suppress(sqlite3.Error):
                                        conn.execute("ROLLBACK")
                                raise
                        finally:
                            pool.release(conn)
                    finally:
                        turn.release()
                    if self._checkpointer is not None:
                        self._checkpointer.committed()  # 在写锁之外：只数数，检查点在后台线程上做
                    return result
                pool = self._pool
                conn = pool.acquire()
                try:
                    changes = conn.total_changes
                    result = _execute(conn, fn, mode)
                    wrote = conn.total_changes != changes
                finally:
                    pool.release(conn)
                if wrote and self._checkpointer is not None:
                    self._checkpointer.committed()
                return result
            except sqlite3.Error as exc:
                if not _is_busy(exc):
                    raise self._wrap(exc, what) from exc
                # 退避用真实时间而不是 self._clock：注入的 FakeClock 不会自己走，用它会永远睡下去。
                remaining = started + self._busy_timeout - time.monotonic()
                if remaining <= 0:
                    where = "内存数据库" if self._memory else f"SQLite 数据库 {self._path}"
                    raise StoreError(
                        f"{where} 被其他连接锁定，{self._busy_timeout:g} 秒内未能完成操作（{what}）："
                        "请检查是否有长事务或挂起的进程占着写锁；负载确实很高时可调大 busy_timeout"
                    ) from exc
                time.sleep(min(remaining, delay * random.uniform(0.5, 1.5)))
                delay = min(delay * 2, _MAX_BACKOFF)
            except OverflowError as exc:
                raise ConfigurationError(f"整数超出 SQLite 的 64 位整数范围（{what}）：{exc}") from exc
            except UnicodeEncodeError as exc:
                raise ConfigurationError(
                    f"文本里有无法用 UTF-8 表示的字符（孤立的代理项，如 '\\ud800'），"
                    f"SQLite 存不下（{what}）：{exc}"
                ) from exc

    # -- snapshots ----------------------------------------------------------------------------------

    def create(self, snapshot: TaskSnapshot, transitions: Sequence[Transition] = ()) -> None:
        self._run("create", self._create_tx(self._prepared_create(snapshot, transitions)))

    def _create_direct(self, snapshot: TaskSnapshot, packed: tuple[PackedTransition, ...]) -> None:
        """写穿落库新任务（见 ``TaskStore._create_direct``）：快照照样整份检查；迁移记录是状态机自己的紧凑历史
        （调用方担保合法、属于这个任务），直接编成行（``codec.packed_transition_row``），不先现造 Transition、
        再逐条查类型与归属、再编码——与 ``create(snapshot, [unpack_transition(...) ...])`` 写下的行逐列
        相同。"""
        if getattr(self.create, "__func__", None) is not SqliteTaskStore.create:
            # create 被包了一层（实例上换掉的；子类与混入类由基类的 __init_subclass__ 退回默认实现）：
            # 照基类的默认实现经过它，收到的是 Transition。
            super()._create_direct(snapshot, packed)
            return
        self._run("create", self._create_tx(self._packed_create(snapshot, packed)))

    def create_many(
        self, items: Sequence[tuple[TaskSnapshot, Sequence[Transition]]]
    ) -> list[TaskError | None]:
        """一次写事务建一批任务（语义见 ``TaskStore.create_many``）。

        不逐个任务 INSERT（每行一次 ``execute`` 的 Python 开销是大头），而是一次查出本批里已存在的 id、
        其余的任务行 / 标签 / 迁移记录各一次 ``executemany``。查与插在同一个 ``BEGIN IMMEDIATE`` 写事务里，
        中间不会有别的写者插进同一个 id；已存在的 id 是 DuplicateTaskId、什么也不写；同一批里重复的 id
        以第一项为准。事务失败（写锁超时、磁盘满）整批什么也没写。"""
        # 逐项检查、编码，直接攒成三张表各自的行（行是只含标量的元组，循环 GC 第一次扫到就不再追踪）。
        # 不为每项留一个 (下标, 行们) 的元组、一个 partial：一批一千个任务时这些临时容器活过整批，会被
        # 循环 GC 晋升到最老的一代、计入"该做全量回收了"的账——十万个任务的 submit_many 因此多做几次全量
        # 扫描（每次扫全部在管任务的对象）。
        results: list[TaskError | None] = [None] * len(items)
        first: dict[str, int] = {}  # task_id → 下标（同一批里重复的 id 以第一项为准）
        task_rows: list[tuple[Any, ...]] = []
        tag_rows: list[tuple[Any, ...]] = []
        history: list[tuple[Any, ...]] = []
        # 这一批里上一个通过检查的快照与它的任务行（见 checks.check_snapshot 的 like、RowCodec.values_like）。
        # 迁移记录同理：这一批里上一条编码过的记录与它的行（新任务通常只有 pending → queued 一条）。
        checked: TaskSnapshot | None = None
        checked_row: tuple[Any, ...] = ()
        encoded: list[_EncodedTransition] = []
        for index, (snapshot, transitions) in enumerate(items):
            try:
                task_id, row, tags, records = self._create_rows(
                    snapshot, transitions, like=checked, like_row=checked_row, encoded=encoded
                )
            except TaskError as exc:
                results[index] = exc
                continue
            checked, checked_row = snapshot, row
            if task_id in first:
                results[index] = _duplicate(task_id)
                continue
            first[task_id] = index
            task_rows.append(row)
            if tags:
                tag_rows.extend(tags)
            history.extend(records)
        if not first:
            return results

        def tx(conn: sqlite3.Connection) -> set[str]:
            ids = json.dumps(list(first), ensure_ascii=False)
            existing = {row[0] for row in conn.execute(_sql.EXISTING_TASK_IDS, (ids,))}
            tasks, tags, records = task_rows, tag_rows, history
            if existing:  # 已存在的 id 什么也不写（任务行、迁移记录的第一列是 task_id，标签行的最后一列是）
                tasks = [row for row in task_rows if row[0] not in existing]
                tags = [row for row in tag_rows if row[-1] not in existing]
                records = [row for row in history if row[0] not in existing]
            # None 写成字面量 NULL、按 NULL 的分布分组插入（见 _sql.grouped_without_nulls）。
            for sql, params in _sql.grouped_without_nulls(_sql.INSERT_TASK_HEAD, tasks):
                conn.executemany(sql, params)
            conn.executemany(_sql.INSERT_TAG, tags)
            for sql, params in _sql.grouped_without_nulls(_sql.INSERT_TRANSITION_HEAD, records):
                conn.executemany(sql, params)
            return existing

        for task_id in self._run("create_many", tx):
            results[first[task_id]] = _duplicate(task_id)
        return results

    def save_many(self, requests: Sequence[v.SaveRequest]) -> list[TaskError | None]:
        """组提交：一次写事务写一批 save（语义见 ``TaskStore.save_many``）。"""
        results: list[TaskError | None] = [None] * len(requests)
        saves = self._checked_saves(requests, results, 0)
        if saves:
            self._write_prepared("save_many", (), saves, results)
        return results

    def write_many(
        self,
        creates: Sequence[tuple[TaskSnapshot, Sequence[Transition]]],
        saves: Sequence[v.SaveRequest],
    ) -> tuple[list[TaskError | None], list[TaskError | None]]:
        """组提交的混合批：create 与 save 一次写事务（语义见 ``TaskStore.write_many``）。与 ``save_many``
        同一个 ``_write_prepared``：重复 id 的 create 只让它那一条 INSERT 失败（SQLite 的 ABORT 只撤销这一条
        语句，事务照常进行），它的标签与迁移记录不写。"""
        return self._write_mixed(creates, self._prepared_create, saves)

    def _write_mixed(
        self,
        creates: Sequence[tuple[TaskSnapshot, Any]],
        prepare: Callable[[TaskSnapshot, Any], _PreparedCreate],
        saves: Sequence[v.SaveRequest],
    ) -> tuple[list[TaskError | None], list[TaskError | None]]:
        """``write_many`` 与 ``_write_many_direct`` 共用的一段：逐项准备 create（``prepare``：Transition 的
        或紧凑历史的）与 save，检查不过的项直接成为自己的结果，其余一个事务写完。"""
        count = len(creates)
        results: list[TaskError | None] = [None] * (count + len(saves))
        created: list[tuple[int, _PreparedCreate]] = []
        for index, (snapshot, records) in enumerate(creates):
            try:
                created.append((index, prepare(snapshot, records)))
            except TaskError as exc:
                results[index] = exc
        prepared = self._checked_saves(saves, results, count)
        if created or prepared:
            self._write_prepared("write_many", created, prepared, results)
        return results[:count], results[count:]

    def _checked_saves(
        self, requests: Sequence[v.SaveRequest], results: list[TaskError | None], offset: int
    ) -> list[tuple[int, _PreparedSave]]:
        """逐项检查、准备一批 save（还不碰数据库）：检查不过的项（ConfigurationError 等）直接成为它自己的
        结果（``results[offset + 下标]``），根本不进事务。"""
        prepared: list[tuple[int, _PreparedSave]] = []
        for index, request in enumerate(requests, offset):
            try:
                prepared.append((index, self._checked_save(request)))
            except TaskError as exc:
                results[index] = exc
        return prepared

    def _checked_save(self, request: v.SaveRequest) -> _PreparedSave:
        # 编码以同一任务上一次准备好的快照为提示（见 _RowHints）。有提示、又不带租约条件时（组提交里写穿的
        # save 都是这样），入参检查也相对于它做（``checks.check_save_since``）：与 ``check_save_request`` 拒绝
        # 同样的入参、报同样的错，只是可存储性只查与提示里不是同一个（也不相等）的字段——提示里的快照是整份
        # 查过（或这样相对查过）才记下的，字段值不可变，相等的值可存储性相同。内存存储的 ``_save_direct``
        # 相对存储里的上一版做的是同一件事。callgrind：每次 save 的检查约 28.5k → 20k 条指令。
        hint = self._hints.save_hint(request.snapshot)
        if hint is not None and request.lease_expired_before is None:
            snapshot, expect_version = request.snapshot, request.expect_version
            transitions = request.transitions
            if transitions.__class__ is not tuple:
                transitions = tuple(transitions)
            checks.check_save_since(hint[0], snapshot, expect_version, transitions)
            # 写穿交来的记录本来就是元组（最常见）：入参原样就是检查过的那一项，不再为它另造一个
            # SaveRequest（冻结的 dataclass，每造一个要四次 object.__setattr__）。
            checked = (
                request
                if transitions is request.transitions
                else v.SaveRequest(snapshot, expect_version, transitions)
            )
        else:
            checked = checks.check_save_request(request)
        return self._prepared_save(checked, hint)

    def _write_prepared(
        self,
        what: str,
        creates: Sequence[tuple[int, _PreparedCreate]],
        saves: Sequence[tuple[int, _PreparedSave]],
        results: list[TaskError | None],
    ) -> None:
        """一次写事务执行准备好的 create 与 save：某项抛 TaskError（重复 id、版本冲突、任务不存在）只是它
        自己的结果（``results[下标]``），同批其余照常提交。不必每项一个 SAVEPOINT：重复 id 的 INSERT 只撤销
        它自己那条语句，save 只在这一项写下任何东西之前抛 TaskError（快速路径改到 0 行时什么也没写，慢路径
        先查版本再写）。各项的迁移记录不各自插入，而是攒到最后合成多行 INSERT
        （``_sql.transition_inserts``）：抛 TaskError 的项在攒之前就抛了，它的记录不会写进去；其余项的
        记录与它们的任务行在同一事务里落库。事务本身失败（写锁超时、磁盘满）照常抛出：整批都没写进去，
        调用方逐项按"这次写失败"处理。撞锁重试整个事务时逐项结果与攒的记录都重新来（准备好的项是不可变的
        语句与参数，重放照旧）。

        准备好的项是元组、事务体里逐项直接执行：不为每项造一个 partial、三个闭包（原来每次 save 的
        ``_save_tx`` 都现造 ``tx`` / ``batched_tx`` / ``slow``，再经 ``prepare_batch`` 逐个调用）。"""

        def tx(conn: _Connection) -> list[tuple[int, TaskError]]:
            failed: list[tuple[int, TaskError]] = []
            history: list[tuple[Any, ...]] = []
            writes = conn.writes
            for index, (task_id, insert_task, tags, records) in creates:
                try:
                    _insert_created(conn, task_id, insert_task, tags)
                except TaskError as exc:
                    failed.append((index, exc))
                    continue
                history.extend(records)  # 任务行已写进去：它的记录在最后一并插入
            for index, (fast, records, slow) in saves:
                if fast is None or writes.execute(*fast).rowcount != 1:
                    try:
                        _save_slow(conn, slow)
                    except TaskError as exc:
                        failed.append((index, exc))
                        continue
                history.extend(records)  # 任务行已改好：它的记录在最后一并插入
            if history:
                for insert in _sql.transition_inserts(history):
                    writes.execute(*insert)
            return failed

        for index, error in self._run(what, tx):
            results[index] = error

    def _prepared_create(self, snapshot: TaskSnapshot, transitions: Sequence[Transition]) -> _PreparedCreate:
        """一项 create 的入参检查与要执行的东西（还不碰数据库）：(task_id, 任务行的 INSERT, 标签行,
        迁移记录行)。"""
        task_id, row, tags, history = self._hinted_create_rows(snapshot, transitions)
        return task_id, _sql.insert_without_nulls(_sql.INSERT_TASK_HEAD, row), tags, history

    def _packed_create(self, snapshot: TaskSnapshot, packed: Sequence[PackedTransition]) -> _PreparedCreate:
        """``_prepared_create`` 的写穿版（见 ``_create_direct``）：快照整份检查、整份编码，迁移记录由紧凑形式
        直接编成行。"""
        # 逐个 submit 的快照多半由同一个模板复制（StateMachine.sibling）：文本字段与标签就是上一个新任务的那批
        # 对象，只查与上一个查过的快照不是同一个（也不相等）的字段，与整份再查结果相同（check_snapshot 的
        # like；内存存储的 _create_direct 同一条规则）。读写这个属性各是一次原子操作：别的线程同时换上的
        # 也是一份查过的快照，照样可以作比较的底本。
        snapshot = checks.check_snapshot(snapshot, self._last_created)
        self._last_created = snapshot  # 查过了（下面落库失败也不影响：它仍是一份查过的快照）
        row = codec.SNAPSHOTS.values(snapshot)
        self._hints.remember_save(snapshot, codec.SNAPSHOTS.save_from_row(row))
        task_id = snapshot.task_id
        packed_row = codec.packed_transition_row
        history = [packed_row(task_id, record) for record in packed]
        tags = [(tag, row[_CREATED_KEY_AT], task_id) for tag in snapshot.tags]
        return task_id, _sql.insert_without_nulls(_sql.INSERT_TASK_HEAD, row), tags, history

    def _write_many_direct(
        self,
        creates: Sequence[tuple[TaskSnapshot, tuple[PackedTransition, ...]]],
        saves: Sequence[v.SaveRequest],
    ) -> tuple[list[TaskError | None], list[TaskError | None]]:
        """组提交的混合批，create 是写穿交来的 (快照, 紧凑历史)（语义与 ``write_many`` 相同，create 一项的
        语义同 ``_create_direct``）：组提交不必先把紧凑历史现造成 Transition。

        ``write_many`` 被包了一层（子类、排在前面的混入类、或实例上换掉的——故障注入与记账的常见写法）时，
        照旧经过它：紧凑历史先解包成 Transition 再交给它，与组提交原来的做法逐步相同。"""
        write_many = self.write_many
        if getattr(write_many, "__func__", None) is not SqliteTaskStore.write_many:
            return write_many(
                [(s, [unpack_transition(s.task_id, record) for record in packed]) for s, packed in creates],
                saves,
            )
        return self._write_mixed(creates, self._packed_create, saves)

    @staticmethod
    def _create_tx(prepared: _PreparedCreate) -> Callable[[_Connection], None]:
        task_id, insert_task, tags, history = prepared
        # 行按 TASK_COLUMNS 顺序（见 _create_rows）：None 写成字面量 NULL（见 _sql）。
        inserts = _sql.transition_inserts(history) if history else []

        def tx(conn: _Connection) -> None:
            _insert_created(conn, task_id, insert_task, tags)
            for insert in inserts:
                conn.writes.execute(*insert)

        return tx

    def _hinted_create_rows(self, snapshot: TaskSnapshot, transitions: Sequence[Transition]) -> _CreateRows:
        """单个 create 的 ``_create_rows``（照常整份检查、整份编码），准备好的任务行里 save 写的那几列成为这个
        任务第一次 save 的编码提示（``_RowHints``；一次 C 实现的取值）。"""
        rows = self._create_rows(snapshot, transitions)
        self._hints.remember_save(snapshot, codec.SNAPSHOTS.save_from_row(rows[1]))
        return rows

    @staticmethod
    def _create_rows(
        snapshot: TaskSnapshot,
        transitions: Sequence[Transition],
        *,
        like: TaskSnapshot | None = None,
        like_row: tuple[Any, ...] = (),
        encoded: list[_EncodedTransition] | None = None,
    ) -> _CreateRows:
        """create 的入参检查与行（还不碰数据库）：(task_id, 任务行, 标签行, 迁移记录行)。``like``：同一批里
        上一个通过检查的快照（只查与它不同的字段），``like_row`` 是它的任务行（与它相同的字段照抄编码）。
        ``encoded``：最多一项，这一批里上一条编码过的迁移记录与它的行（照抄同理；这里换成本项的最后一条）。"""
        snapshot = checks.check_snapshot(snapshot, like)
        transitions = tuple(transitions)
        checks.check_transitions(snapshot.task_id, transitions)
        # 按位置绑定（``INSERT_TASK_HEAD`` 的列与 ``TASK_COLUMNS`` 同序，params 的键也是这个顺序）：45 个命名
        # 参数逐个按名字查字典，每行要多 3–4 µs——十万个任务的 submit_many 里是 0.3–0.4 s。同一批里由同一个
        # 模板复制出的快照只有 task_id 与时间不同：其余字段的编码从上一行照抄（见 RowCodec.values_like）。
        if like is None:
            row = codec.SNAPSHOTS.values(snapshot)
        else:
            row = codec.SNAPSHOTS.values_like(snapshot, like, like_row)
        if encoded is None:
            history = [codec.transition_row(t) for t in transitions]
        else:
            history = []
            values_like = codec.TRANSITIONS.values_like
            for record in transitions:
                if encoded:
                    previous, previous_row = encoded[0]
                    record_row = values_like(record, previous, previous_row)
                else:
                    record_row = codec.transition_row(record)
                history.append(record_row)
                encoded[:] = [(record, record_row)]
        tags = [(tag, row[_CREATED_KEY_AT], snapshot.task_id) for tag in snapshot.tags]
        return snapshot.task_id, row, tags, history

    def _save(self, request: v.SaveRequest) -> None:
        self._run("save", self._save_tx(request, hint=self._hints.save_hint(request.snapshot)))

    def _save_tx(
        self,
        request: v.SaveRequest,
        *,
        hint: tuple[TaskSnapshot, tuple[Any, ...]] | None = None,
        checked: bool = True,
    ) -> Callable[[_Connection], None]:
        """一次 save 的事务体（入参已检查：``_save`` 由基类检查）：准备好的一项（``_prepared_save``）加上它
        自己的迁移记录的 INSERT。"""
        fast, records, slow = self._prepared_save(request, hint, checked)
        inserts = _sql.transition_inserts(records) if records else []

        # 快速路径的 UPDATE 与迁移记录的 INSERT 走复用的游标（见 _Connection）：结果只看 rowcount。
        def tx(conn: _Connection) -> None:
            if fast is None or conn.writes.execute(*fast).rowcount != 1:
                _save_slow(conn, slow)
            for insert in inserts:
                conn.writes.execute(*insert)

        return tx

    def _prepared_save(
        self,
        request: v.SaveRequest,
        hint: tuple[TaskSnapshot, tuple[Any, ...]] | None,
        checked: bool = True,
    ) -> _PreparedSave:
        """一次 save 要执行的东西（入参已检查；还不碰数据库）：(快速路径的 UPDATE 或 None, 迁移记录行,
        慢路径要的参数)。执行见 ``_write_prepared`` / ``_save_tx``。

        先走快速路径：一条带前提的 UPDATE（``_sql.guarded_save_update``：版本是期望的版本，被索引的列与
        标签都没变），改到一行就只剩插迁移记录——每次 save 少一条 SELECT。改到 0 行时它什么也没写，再走
        先读再写的慢路径（``_save_slow``）：由读到的行分清任务不存在与版本冲突（报错与以前一字不差），并按
        读到的旧值决定 SET 哪些被索引的列、要不要重写标签。带租约条件的 save（reconcile 判 LOST）直接走慢
        路径：租约检查与版本检查在同一个写事务里，快速路径不管租约。

        ``hint``：这个任务上一次准备好的 (快照, save 行)（``_RowHints``），与它是同一个不可变对象的字段照抄
        编码。``checked``：快照经过了入参检查（认领路径上由存储自己的行演变出的快照没有）——只有查过的快照才
        成为提示：提示里的每一列都是某次整份检查过的写入编码出来的。"""
        snapshot, expect_version, transitions = request.snapshot, request.expect_version, request.transitions
        lease_expired_before = request.lease_expired_before
        lease_key = None if lease_expired_before is None else codec.dt_key(lease_expired_before)
        # save 的一行是 SAVE_COLUMNS 顺序的元组，按位置取列（见 _sql.save_plain）。
        if hint is None:
            row = codec.SNAPSHOTS.save_values(snapshot)
        else:
            row = codec.SNAPSHOTS.save_values_since(snapshot, hint[0], hint[1])
        if checked:
            self._hints.remember_save(snapshot, row)
        plain_values = _sql.save_plain(row)
        records = [transition_values(t) for t in transitions]
        task_id = snapshot.task_id
        # 存储里此刻的状态按调用方的说法猜：随附迁移记录的第一条从哪个状态出发（入参检查保证记录首尾相接、
        # 版本接着 expect_version）；没有迁移记录的 save 不改状态。猜错了只是快速路径改到 0 行、走慢路径。
        old_status = transitions[0].from_status._value_ if transitions else row[_sql.SAVE_ROW_STATUS]
        fast = (
            None
            if lease_key is not None
            else _sql.guarded_save_update(row, plain_values, old_status, task_id, expect_version)
        )
        return fast, records, (task_id, expect_version, lease_key, row, plain_values, snapshot.tags)

    def get(self, task_id: str) -> TaskSnapshot | None:
        def read(conn: sqlite3.Connection) -> TaskSnapshot | None:
            found = conn.execute(f"{_sql.TASK_SELECT} WHERE task_id = ?", (task_id,)).fetchone()
            return None if found is None else codec.snapshot_from_row(found)

        checks.check_key("task_id", task_id)
        return self._run("get", read, "none")

    def query(self, query: v.TaskQuery | None = None) -> list[TaskSnapshot]:
        query = v.as_query(query)
        if query.limit == 0:
            self._check_open()
            return []
        source, params, alias = _sql.select_from(query, name_index=self._name_index_pays(query))
        direction = "DESC" if query.order is v.QueryOrder.NEWEST_FIRST else "ASC"
        order = f"{alias}.created_key {direction}, {alias}.task_id {direction}"
        sql = f"SELECT {_sql.TASK_COLUMNS_T}{source} ORDER BY {order}"
        if query.limit is not None:
            sql += " LIMIT ?"
            params.append(query.limit)

        def read(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(sql, params).fetchall()

        rows = self._run("query", read, "none")
        return [codec.snapshot_from_row(r) for r in rows]

    def _name_index_pays(self, query: v.TaskQuery) -> bool:
        """带 LIMIT 的任务名前缀查询走不走 name 索引。

        name 索引给出的是按名字排的行：前缀匹配的行少时，全取出来再按时间排序最快；匹配几十万行时
        （``name=sync-``）排序要一秒多，不如沿时间索引倒着走、边走边筛，凑够 LIMIT 行就停。
        先在 name 索引上数一数（最多数到 ``NAME_INDEX_ROWS`` 就停，只读索引），再决定。
        """
        if not query.name_prefix or query.limit is None or query.tag is not None:
            return True
        upper = codec.prefix_upper_bound(query.name_prefix)
        sql = "SELECT count(*) FROM (SELECT 1 FROM tasks WHERE name >= ?"
        params: list[Any] = [query.name_prefix]
        if upper is not None:
            sql += " AND name < ?"
            params.append(upper)
        sql += " LIMIT ?)"
        params.append(NAME_INDEX_ROWS)
        found = self._run("query", lambda conn: conn.execute(sql, params).fetchone()[0], "none")
        return bool(found < NAME_INDEX_ROWS)

    def stats(self, query: v.TaskQuery | None = None) -> v.TaskStats:
        source, params, _ = _sql.select_from(v.as_query(query))
        sql = f"SELECT t.status, count(*){source} GROUP BY t.status"
        rows = self._run("stats", lambda conn: conn.execute(sql, params).fetchall(), "none")
        return v.TaskStats({TaskStatus(status): int(count) for status, count in rows})

    def bucket_counts(self, query: v.TaskQuery | None = None) -> dict[int, int]:
        source, params, _ = _sql.select_from(v.as_query(query), "t.bucket IS NOT NULL")
        sql = f"SELECT t.bucket, count(*){source} GROUP BY t.bucket"
        rows = self._run("bucket_counts", lambda conn: conn.execute(sql, params).fetchall(), "none")
        return {int(bucket): int(count) for bucket, count in rows}

    def _check_open(self) -> None:
        if self._pool.closed:
            raise _Pool._closed_error()

    # -- history ------------------------------------------------------------------------------------

    def _claim_queued(self, request: QueuedClaim) -> list[TaskSnapshot]:
        if request.empty:
            self._check_open()
            return []
        return self._run("claim_queued", lambda conn: _claim.claim(conn, request))

    claim_start_saves = True  # _claim_and_start 在同一个事务里先写 start.save（见 TaskStore.saves_on_claim）

    def _claim_and_start(self, request: QueuedClaim, start: ClaimStart) -> list[TaskSnapshot]:
        """认领与 starting 在同一个 ``BEGIN IMMEDIATE`` 写事务里（starting 那一步与 save 同一份事务体）。
        给了 ``start.save`` 时它是这个事务的第一步（同一份 save 事务体）：``_save_tx`` 只在写下任何东西之前
        抛 TaskError，抛出时 ``_execute`` 回滚、认领不做——"save 写不成就什么也不写"。"""
        save = start.save
        if request.empty and save is None:
            self._check_open()
            return []
        first = None if save is None else self._save_tx(save)

        def tx(conn: _Connection) -> list[TaskSnapshot]:
            result: list[TaskSnapshot] = []
            if first is not None:
                first(conn)
                if request.empty:
                    return result
            for snapshot in _claim.claim(conn, request):
                begun = start_claimed(snapshot, start)
                if begun is None:
                    result.append(snapshot)
                    continue
                started, transitions = begun
                # 认领出的快照由存储里的行演变而来、没经入参检查：不成为下一次 save 的提示（checked=False）。
                started_save = v.SaveRequest(started, snapshot.status_version, transitions)
                self._save_tx(started_save, hint=self._hints.save_hint(started), checked=False)(conn)
                result.append(started)
            return result

        return self._run("claim_and_start", tx)

    def append(self, transitions: Sequence[Transition]) -> None:
        transitions = tuple(transitions)
        checks.check_transitions(None, transitions)
        history = [codec.transition_row(t) for t in transitions]
        task_ids = sorted({t.task_id for t in transitions})

        def tx(conn: sqlite3.Connection) -> None:
            # 先全部检查再写：一批里有未知任务时整批不写，避免留下半截历史。
            for task_id in task_ids:
                if conn.execute("SELECT 1 FROM tasks WHERE task_id = ?", (task_id,)).fetchone() is None:
                    raise TaskNotFound(f"存储里没有任务 {task_id!r}")
            conn.executemany(_sql.INSERT_TRANSITION, history)

        if not history:
            self._check_open()
            return
        self._run("append", tx)

    def history(self, task_id: str) -> list[Transition]:
        checks.check_key("task_id", task_id)
        columns = ", ".join(schema.TRANSITION_COLUMNS)
        sql = f"SELECT {columns} FROM transitions WHERE task_id = ? ORDER BY version"
        rows = self._run("history", lambda conn: conn.execute(sql, (task_id,)).fetchall(), "none")
        return [codec.transition_from_row(r) for r in rows]

    # -- side channel -------------------------------------------------------------------------------

    @staticmethod
    def _touch_sets(update: v.TouchUpdate) -> tuple[str, list[Any]]:
        sets: list[str] = []
        params: list[Any] = []
        if update.progress is not None:
            sets.append("progress = ?")
            params.append(codec.progress_text(update.progress))
        if update.heartbeat_at is not None:
            sets.append("last_heartbeat_at = ?")
            params.append(codec.dt_text(update.heartbeat_at))
        if update.lease_owner is not None:
            sets.append("lease_owner = ?")
            params.append(update.lease_owner)
        if update.lease_until is not None:
            sets.append("lease_until = ?, lease_key = ?")
            params.extend((codec.dt_text(update.lease_until), codec.dt_key(update.lease_until)))
        return ", ".join(sets), params

    def _touch(self, update: v.TouchUpdate) -> bool:
        task_id = update.task_id
        sets, params = self._touch_sets(update)
        if not sets:
            found = self._run(
                "touch",
                lambda conn: conn.execute("SELECT 1 FROM tasks WHERE task_id = ?", (task_id,)).fetchone(),
                "none",
            )
            return found is not None
        sql = f"UPDATE tasks SET {sets} WHERE task_id = ?"
        params.append(task_id)
        # 单条 UPDATE 在自动提交模式下本身就是原子的写事务，不必再包 BEGIN/COMMIT。
        return self._run("touch", lambda conn: conn.execute(sql, params).rowcount > 0, "none")

    def touch_many(self, updates: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """整批一个写事务：心跳线程每轮给全部任务续租，一次提交，而不是每个任务一次。"""
        prepared: list[tuple[str, list[Any]]] = []
        for task_id, raw in updates:
            sets, params = self._touch_sets(checks.touch_many_update(task_id, raw))
            if sets:
                params.append(task_id)
                prepared.append((f"UPDATE tasks SET {sets} WHERE task_id = ?", params))

        def tx(conn: sqlite3.Connection) -> None:
            for sql, params in prepared:
                conn.execute(sql, params)

        if not prepared:
            self._check_open()
            return
        self._run("touch_many", tx)

    def _renew_leases(self, lease_owner: str, task_ids: frozenset[str], lease_until: datetime) -> None:
        """一条 UPDATE：id 以一个 JSON 数组参数传入（避开变量个数上限），每行按主键找到、写同一组值。"""
        params = (
            lease_owner,
            codec.dt_text(lease_until),
            codec.dt_key(lease_until),
            json.dumps(sorted(task_ids)),
        )
        self._run("renew_leases", lambda conn: conn.execute(_sql.RENEW_LEASES, params))

    # -- commands -----------------------------------------------------------------------------------

    def _submit_command(self, submission: v.CommandSubmission) -> v.Command:
        task_id, verb = submission.task_id, submission.action
        issuer, reason = submission.issuer, submission.reason
        payload_text = codec.json_text(submission.payload, what="指令 payload")
        command_id = uuid.uuid4().hex

        def tx(conn: sqlite3.Connection) -> v.Command:
            found = conn.execute("SELECT bucket FROM tasks WHERE task_id = ?", (task_id,)).fetchone()
            if found is None:
                raise TaskNotFound(f"存储里没有任务 {task_id!r}")
            # 时间在拿到写锁之后再取：同一文件上的指令按 seq 排序，created_at 也随之单调（同一时钟下）。
            created_at = self._clock.now()
            conn.execute(
                "INSERT INTO commands (command_id, task_id, action, issuer, reason, payload, created_at, "
                "bucket) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    command_id,
                    task_id,
                    verb.value,
                    issuer,
                    reason,
                    payload_text,
                    codec.dt_text(created_at),
                    found[0],
                ),
            )
            return submission.written(command_id, created_at, found[0], json.loads(payload_text))

        return self._run("submit_command", tx)

    def _claim_commands(self, request: v.ClaimRequest) -> list[v.Command]:
        claimant, lease, limit = request.claimant, request.lease, request.limit
        wanted_tasks, wanted_buckets = request.task_ids, request.buckets
        if limit == 0 or wanted_tasks == frozenset() or wanted_buckets == frozenset():
            self._check_open()
            return []
        filters = ""
        filter_params: list[Any] = []
        if wanted_tasks is not None:
            filters += " AND " + _sql.in_clause("task_id", wanted_tasks, filter_params)
        if wanted_buckets is not None:
            filters += " AND " + _sql.in_clause("bucket", wanted_buckets, filter_params)
        if request.holder is not None:
            # 在同一个写事务里对照任务行此刻的持有者（主键查找，每条待取指令一次）：adopt 之后指令随任务走。
            filters += (
                " AND EXISTS (SELECT 1 FROM tasks WHERE tasks.task_id = commands.task_id AND tasks.owner = ?)"
            )
            filter_params.append(request.holder)
        candidates = (
            "SELECT seq FROM commands WHERE completed_at IS NULL AND (lease_key IS NULL OR lease_key <= ?)"
            f"{filters} ORDER BY seq LIMIT ?"
        )
        columns = ", ".join(schema.COMMAND_COLUMNS)
        returning = self._returning

        def anything_claimable(conn: sqlite3.Connection) -> bool:
            # 只读预检（走 commands_pending 部分索引，不带过滤条件）：绝大多数轮询时根本没有待取的指令，
            # 这时不该为它开写事务、抢写锁、再把一长串 task_id 交给 SQLite 过滤——控制器每 0.1 秒轮询一次，
            # 在管的任务可能成千上万。
            row = conn.execute(
                "SELECT 1 FROM commands WHERE completed_at IS NULL"
                " AND (lease_key IS NULL OR lease_key <= ?) LIMIT 1",
                [codec.dt_key(self._clock.now())],
            ).fetchone()
            return row is not None

        if not self._run("claim_commands", anything_claimable, mode="read"):
            return []

        def tx(conn: sqlite3.Connection) -> list[Any]:
            # 租约的起点在拿到写锁之后取：排队等锁的时间不该吃掉租约。
            now = self._clock.now()
            until = now + timedelta(seconds=lease)
            params: list[Any] = [claimant, codec.dt_text(until), codec.dt_key(until)]
            select_params = [codec.dt_key(now), *filter_params, limit]
            update = (
                "UPDATE commands SET claimant = ?, lease_until = ?, lease_key = ?, "
                "deliveries = deliveries + 1 "
            )
            if returning:
                sql = f"{update}WHERE seq IN ({candidates}) RETURNING seq, {columns}"
                return conn.execute(sql, [*params, *select_params]).fetchall()
            seqs = [r[0] for r in conn.execute(candidates, select_params).fetchall()]
            if not seqs:
                return []
            marks = ", ".join("?" for _ in seqs)
            conn.execute(f"{update}WHERE seq IN ({marks})", [*params, *seqs])
            return conn.execute(
                f"SELECT seq, {columns} FROM commands WHERE seq IN ({marks})", seqs
            ).fetchall()

        rows = self._run("claim_commands", tx)
        # RETURNING 的行序没有保证：按提交先后排好再交出。
        rows.sort(key=lambda r: r[0])
        return [codec.command_from_row(r[1:]) for r in rows]

    def complete_command(self, command_id: str, claimant: str) -> bool:
        checks.check_key("command_id", command_id)

        def tx(conn: sqlite3.Connection) -> bool:
            found = conn.execute(
                "SELECT claimant, completed_at FROM commands WHERE command_id = ?", (command_id,)
            ).fetchone()
            if found is None or found[0] != claimant:
                return False
            if found[1] is None:
                conn.execute(
                    "UPDATE commands SET completed_at = ?, lease_until = NULL, lease_key = NULL "
                    "WHERE command_id = ?",
                    (codec.dt_text(self._clock.now()), command_id),
                )
            return True

        return self._run("complete_command", tx)

    def release_command(self, command_id: str, claimant: str) -> bool:
        checks.check_key("command_id", command_id)
        sql = (
            "UPDATE commands SET claimant = NULL, lease_until = NULL, lease_key = NULL "
            "WHERE command_id = ? AND claimant = ? AND completed_at IS NULL"
        )
        return self._run(
            "release_command", lambda conn: conn.execute(sql, (command_id, claimant)).rowcount > 0, "none"
        )

    # -- membership ---------------------------------------------------------------------------------

    def publish_node(self, record: v.NodeRecord) -> None:
        row = codec.node_row(checks.check_node_record(record))
        # 单条语句在自动提交模式下本身就是原子的写事务。
        self._run("publish_node", lambda conn: conn.execute(_sql.UPSERT_NODE, row), "none")

    def list_nodes(self) -> list[v.NodeRecord]:
        rows = self._run("list_nodes", lambda conn: conn.execute(_sql.SELECT_NODES).fetchall(), "none")
        return [codec.node_from_row(row) for row in rows]

    def remove_node(self, owner: str) -> bool:
        checks.check_node_owner(owner)
        return self._run(
            "remove_node",
            lambda conn: conn.execute("DELETE FROM nodes WHERE owner = ?", (owner,)).rowcount > 0,
            "none",
        )

    # -- task logs (issue 18；实现在 _logs.py) ------------------------------------------------------

    def append_logs(self, lines: Sequence[v.LogLine]) -> None:
        _logs.append_logs(self, lines)

    def read_logs(
        self, task_id: str, *, attempt: int | None = None, after_seq: int | None = None, limit: int = 1000
    ) -> list[v.LogLine]:
        return _logs.read_logs(self, task_id, attempt, after_seq, limit)

    def log_stats(self, task_id: str) -> v.LogStats:
        return _logs.log_stats(self, task_id)

    # -- upkeep -------------------------------------------------------------------------------------

    def prune(self, keep_terminal: int) -> int:
        checks.check_count("keep_terminal", keep_terminal)

        def tx(conn: sqlite3.Connection) -> int:
            total = conn.execute(
                f"SELECT count(*) FROM tasks WHERE {_sql.TERMINAL_IN}", _sql.TERMINAL_VALUES
            ).fetchone()[0]
            excess = total - keep_terminal
            if excess <= 0:
                return 0
            # 最旧的排前面：缺 finished_at 的终态记录（导入的旧数据）视为最旧，其间按 created_at。
            doomed = conn.execute(
                f"SELECT task_id FROM tasks WHERE {_sql.TERMINAL_IN} "
                "ORDER BY finished_key IS NOT NULL, coalesce(finished_key, created_key), task_id LIMIT ?",
                (*_sql.TERMINAL_VALUES, excess),
            ).fetchall()
            for table in ("tasks", "transitions", "task_tags", "commands"):
                conn.executemany(f"DELETE FROM {table} WHERE task_id = ?", doomed)
            _logs.delete_for(conn, doomed)
            return len(doomed)

        return self._run("prune", tx)

    def close(self) -> None:
        if self._checkpointer is not None:
            # 先停后台检查点（它借池里的连接）；最后一条连接关闭时 SQLite 自己做收尾的检查点。
            self._checkpointer.close()
        self._pool.close()

    def _checkpoint_wal(self, exclusive: bool) -> Any:
        """后台线程的一次检查点。PASSIVE：不等读者、能拷回多少拷多少；``exclusive`` 时占着本进程的写者
        队列（``_WriterTurn``），期间本进程没有新的提交，这一次能拷完（见 ``_checkpoint``）。"""
        turn = self._writers.turn() if exclusive else contextlib.nullcontext()
        with turn:
            return self._run(
                "WAL 检查点", lambda conn: conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone(), "none"
            )


def parse_url(url: str) -> str:
    """连接串 → sqlite3 能打开的路径。

    ``sqlite:///abs/path`` → ``/abs/path``；``sqlite:relative.db`` → ``relative.db``；
    ``sqlite:///:memory:``、``sqlite://:memory:``、``sqlite::memory:`` → ``":memory:"``。
    """
    if not isinstance(url, str):
        raise ConfigurationError(f"SQLite 连接串必须是字符串，收到 {url!r}")
    scheme, sep, rest = url.partition(":")
    if not sep or scheme.lower() != "sqlite":
        raise ConfigurationError(
            f"SQLite 连接串必须以 sqlite: 开头（例如 sqlite:///tmp/tasks.db），收到 {url!r}"
        )
    if rest in (MEMORY, "//" + MEMORY, "///" + MEMORY):
        return MEMORY
    if rest.startswith("//") and "?" in rest:
        # 否则 sqlite:///tasks.db?busy_timeout=5（SQLAlchemy 式写法）会静默打开一个名为
        # "tasks.db?busy_timeout=5" 的新文件。选项走关键字参数；文件名真含 ? 时用 SqliteTaskStore(路径)。
        raise ConfigurationError(
            f"SQLite 连接串 {url!r} 不接受 ?参数：busy_timeout / synchronous 请作为关键字参数传入，"
            "例如 open_store('sqlite:///tmp/tasks.db', busy_timeout=5)"
        )
    if rest.startswith("///"):
        path = rest[2:]
    elif rest.startswith("//"):
        raise ConfigurationError(
            f"无法解析 SQLite 连接串 {url!r}：绝对路径写成 sqlite:///绝对路径（三个斜杠），"
            "相对路径写成 sqlite:相对路径.db，内存库写成 sqlite:///:memory:"
        )
    else:
        path = rest
    if not path or path.endswith("/"):
        raise ConfigurationError(
            f"SQLite 连接串 {url!r} 里没有文件路径：例如 sqlite:///tmp/tasks.db 或 sqlite:tasks.db"
        )
    return path


__all__ = ["SqliteTaskStore", "parse_url"]
