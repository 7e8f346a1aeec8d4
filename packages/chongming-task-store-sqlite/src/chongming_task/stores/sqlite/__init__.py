"""SqliteTaskStore：标准库 sqlite3 上的 TaskStore（同机跨进程可见 + 持久化，默认后端）。

设计要点（也是它与内存参照实现的不同之处）：

* **连接**：文件库用一个小连接池——每个操作从池里借一条连接、用完归还，所以并发线程各用各的
  连接（WAL 下读不阻塞写），线程退出也不会泄漏连接；``close()`` 关闭全部连接。``":memory:"``
  只有一条连接，由锁串行化：SQLite 的内存库属于连接本身，多条连接看到的是各自的库。
* **写事务**：一律 ``BEGIN IMMEDIATE``——事务一开始就拿写锁，杜绝"先读后写"在两个进程之间
  升级锁时的死锁（那种 SQLITE_BUSY 不会触发忙等，只能整个事务重来）。
* **"database is locked" 绝不泄漏给调用方**：连接自带 busy timeout，此外对 SQLITE_BUSY /
  SQLITE_LOCKED 在 ``busy_timeout`` 秒内带抖动指数退避、整事务重试（事务体只有数据库副作用，
  重跑是安全的）；超时才抛 StoreError，并用中文说明该查什么。
* **乐观并发**：save 在写事务里先比对 status_version，再改快照列、插迁移记录；不一致抛
  ConcurrencyConflict 并回滚，什么也不写。旁路字段（progress / last_heartbeat_at / lease_*）
  只由 create 与 touch 写，save 的 UPDATE 根本不列出这些列。
* **指令认领**：一条 ``UPDATE ... RETURNING``（SQLite ≥ 3.35；更旧的版本退回 SELECT + UPDATE，
  同样在 BEGIN IMMEDIATE 里，所以同样原子），两个进程在租约内绝不会取到同一条指令。
* **时间**：ISO 原文保留原始时区偏移与微秒，另存 UTC 微秒整数作排序与过滤键（见 schema.py）。
* 每个 sqlite3.Error 都包装成 StoreError（``__cause__`` 保留原异常）；契约自己的异常原样抛出。
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar

from chongming_task.clock import SYSTEM_CLOCK, Clock
from chongming_task.errors import (
    ConcurrencyConflict,
    ConfigurationError,
    DuplicateTaskId,
    StoreError,
    TaskNotFound,
)
from chongming_task.models import Progress, TaskSnapshot, Transition
from chongming_task.states import TERMINAL_STATUSES, TaskStatus
from chongming_task.storage import (
    Command,
    CommandAction,
    NodeRecord,
    QueryOrder,
    TaskQuery,
    TaskStats,
    TaskStore,
    as_query,
    check_node_owner,
    check_node_record,
    validate_save,
)
from chongming_task.store_checks import (
    check_aware,
    check_count,
    check_optional_text,
    check_snapshot,
    claim_args,
    command_args,
)
from chongming_task.stores.sqlite import codec, schema

T = TypeVar("T")
_Mode = Literal["write", "read", "none"]

MEMORY = ":memory:"

_SYNCHRONOUS_MODES = frozenset({"OFF", "NORMAL", "FULL", "EXTRA"})
_URL_OPTIONS = frozenset({"clock", "busy_timeout", "synchronous"})
_TOUCH_FIELDS = frozenset({"progress", "heartbeat_at", "lease_owner", "lease_until"})

# SQLite 主错误码（扩展码的低 8 位）。
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

# 集合参数少时展开成占位符（规划器能据此估算选择度）；多时整包成一个 JSON 参数，避开变量个数上限。
_MAX_INLINE_PARAMS = 256

_RETURNING_SUPPORTED = sqlite3.sqlite_version_info >= (3, 35, 0)

_TASK_SELECT = f"SELECT {', '.join(schema.TASK_COLUMNS)} FROM tasks"
_TASK_COLUMNS_T = ", ".join(f"t.{c}" for c in schema.TASK_COLUMNS)
_INSERT_TAG = "INSERT OR IGNORE INTO task_tags (tag, created_key, task_id) VALUES (?, ?, ?)"
_INSERT_TASK = (
    f"INSERT INTO tasks ({', '.join(schema.TASK_COLUMNS)}) "
    f"VALUES ({', '.join(':' + c for c in schema.TASK_COLUMNS)})"
)
_SAVE_SELECT = f"SELECT {', '.join(schema.SAVE_COLUMNS)} FROM tasks WHERE task_id = ?"
_SAVE_VERSION_INDEX = schema.SAVE_COLUMNS.index("status_version")
_SAVE_TAGS_INDEX = schema.SAVE_COLUMNS.index("tags")
_SAVE_CREATED_INDEX = schema.SAVE_COLUMNS.index("created_key")
_INSERT_TRANSITION = (
    f"INSERT OR IGNORE INTO transitions ({', '.join(schema.TRANSITION_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in schema.TRANSITION_COLUMNS)})"
)
_COMMAND_SELECT = f"SELECT {', '.join(schema.COMMAND_COLUMNS)} FROM commands"
# 整行覆盖（last writer wins）。INSERT OR REPLACE 而不是 UPSERT：节点表没有外键与触发器，"先删后插"与
# 原地更新结果相同，而且不挑 SQLite 版本（UPSERT 要 3.24+）。
_UPSERT_NODE = (
    f"INSERT OR REPLACE INTO nodes ({', '.join(schema.NODE_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in schema.NODE_COLUMNS)})"
)
_SELECT_NODES = f"SELECT {', '.join(schema.NODE_COLUMNS)} FROM nodes ORDER BY owner"
_TERMINAL_VALUES = tuple(sorted(s.value for s in TERMINAL_STATUSES))
_TERMINAL_IN = f"status IN ({', '.join('?' for _ in _TERMINAL_VALUES)})"


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


def _in_clause(column: str, values: frozenset[Any], params: list[Any]) -> str:
    ordered = sorted(values)
    if len(ordered) <= _MAX_INLINE_PARAMS:
        params.extend(ordered)
        return f"{column} IN ({', '.join('?' for _ in ordered)})"
    params.append(codec.json_text(ordered, what=column))
    return f"{column} IN (SELECT value FROM json_each(?))"


def _select_from(query: TaskQuery, *extra: str) -> tuple[str, list[Any], str]:
    """TaskQuery → (``FROM ... WHERE ...``, 参数, 排序键所在的表别名)。逐条对应 ``TaskQuery.matches``。

    任务表的别名总是 ``t``。给了 tag 时从标签旁表 ``g`` 出发联到 ``t``，并按 ``g`` 上的排序键排序
    （与 t 上的值相同），这样带 LIMIT 的标签查询沿旁表主键有序读取。
    """
    clauses: list[str] = list(extra)
    params: list[Any] = []
    source = "tasks AS t"
    order_alias = "t"
    if query.tag is not None:
        source = "task_tags AS g JOIN tasks AS t ON t.task_id = g.task_id"
        order_alias = "g"
        clauses.append("g.tag = ?")
        params.append(query.tag)
    if query.statuses is not None:
        if not query.statuses:
            return " FROM tasks AS t WHERE 0", [], "t"
        clauses.append(_in_clause("t.status", frozenset(s.value for s in query.statuses), params))
    if query.name_prefix:
        # 区间比较而不是 LIKE：LIKE 对 ASCII 不分大小写，而 startswith 区分；区间还能走索引。
        clauses.append("t.name >= ?")
        params.append(query.name_prefix)
        upper = codec.prefix_upper_bound(query.name_prefix)
        if upper is not None:
            clauses.append("t.name < ?")
            params.append(upper)
    if query.bucket is not None:
        clauses.append("t.bucket = ?")
        params.append(query.bucket)
    if query.buckets is not None:
        if not query.buckets:
            return " FROM tasks AS t WHERE 0", [], "t"
        clauses.append(_in_clause("t.bucket", query.buckets, params))
    if query.owner is not None:
        clauses.append("t.owner = ?")
        params.append(query.owner)
    if query.pipeline_id is not None:
        clauses.append("t.pipeline_id = ?")
        params.append(query.pipeline_id)
    if query.created_after is not None:
        clauses.append(f"{order_alias}.created_key > ?")
        params.append(codec.dt_key(query.created_after))
    if query.created_before is not None:
        clauses.append(f"{order_alias}.created_key < ?")
        params.append(codec.dt_key(query.created_before))
    if query.lease_expired_before is not None:
        clauses.append("(t.lease_key IS NULL OR t.lease_key < ?)")
        params.append(codec.dt_key(query.lease_expired_before))
    where = " WHERE " + " AND ".join(clauses) if clauses else ""
    return f" FROM {source}{where}", params, order_alias


class _Pool:
    """连接池。文件库：借出/归还，空闲连接最多留 ``max_idle`` 条。内存库：唯一一条连接，借出期间持锁。"""

    def __init__(self, connect: Callable[[], sqlite3.Connection], *, shared: bool, max_idle: int = 8) -> None:
        self._connect = connect
        self._shared = shared
        self._max_idle = max_idle
        self._lock = threading.Lock()
        self._serial = threading.Lock()
        self._idle: list[sqlite3.Connection] = []
        self._single: sqlite3.Connection | None = None
        self._closed = False
        self._pid = os.getpid()

    @staticmethod
    def _closed_error() -> StoreError:
        return StoreError("存储已关闭：close() 之后不能再读写；请重新打开一个存储")

    def _after_fork(self) -> None:
        # fork 出来的子进程不能继续用父进程的连接（SQLite 明确禁止跨 fork 使用同一连接）。
        # 也不能在子进程里关闭它们——那会动到父进程仍在用的文件锁状态；直接丢弃，子进程重新连。
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._idle = []
            self._single = None

    @contextlib.contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        if self._shared:
            with self._serial:
                if self._closed:
                    raise self._closed_error()
                if self._single is None:
                    self._single = self._connect()
                yield self._single
            return
        with self._lock:
            if self._closed:
                raise self._closed_error()
            self._after_fork()
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            conn = self._connect()
        try:
            yield conn
        finally:
            keep = False
            with self._lock:
                # 仍处于事务中（回滚本身失败了）的连接不能再借给别人。
                if not self._closed and len(self._idle) < self._max_idle and not conn.in_transaction:
                    self._idle.append(conn)
                    keep = True
            if not keep:
                conn.close()

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


def _execute(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T], mode: _Mode) -> T:
    if mode == "none":
        return fn(conn)
    conn.execute("BEGIN IMMEDIATE" if mode == "write" else "BEGIN")
    try:
        result = fn(conn)
        conn.execute("COMMIT")
        return result
    except BaseException:
        if conn.in_transaction:
            # 回滚失败时连接仍在事务里，连接池会丢弃它而不是复用；原异常更重要。
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


class SqliteTaskStore(TaskStore):
    """SQLite 存储。``path`` 是文件路径或 ``":memory:"``。

    * ``clock``：指令的创建时间与租约取自它（测试注入 FakeClock）；默认真实时钟。
    * ``busy_timeout``：等待别的连接/进程释放写锁的总秒数；超时抛 StoreError。
    * ``synchronous``：``OFF`` / ``NORMAL``（默认：WAL 下崩溃安全，断电可能丢最后几个事务）/
      ``FULL`` / ``EXTRA``。
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        busy_timeout: float = 30.0,
        synchronous: str = "NORMAL",
    ) -> None:
        if isinstance(path, os.PathLike):
            path = os.fspath(path)
        if not isinstance(path, str) or not path.strip():
            raise ConfigurationError(
                f"SQLite 数据库路径必须是非空字符串（文件路径或 ':memory:'），收到 {path!r}"
            )
        if "\x00" in path:
            raise ConfigurationError("SQLite 数据库路径不能包含 NUL 字符（\\x00）")
        if (
            isinstance(busy_timeout, bool)
            or not isinstance(busy_timeout, (int, float))
            or not math.isfinite(busy_timeout)
            or busy_timeout <= 0
        ):
            raise ConfigurationError(f"busy_timeout 必须是正的秒数，收到 {busy_timeout!r}")
        if not isinstance(synchronous, str) or synchronous.upper() not in _SYNCHRONOUS_MODES:
            raise ConfigurationError(
                f"synchronous 只能是 {', '.join(sorted(_SYNCHRONOUS_MODES))} 之一，收到 {synchronous!r}"
            )
        self._path = path
        self._memory = path == MEMORY
        self._clock: Clock = clock or SYSTEM_CLOCK
        self._busy_timeout = float(busy_timeout)
        self._synchronous = synchronous.upper()
        self._returning = _RETURNING_SUPPORTED
        self._pool = _Pool(self._connect, shared=self._memory)
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

    @property
    def clock(self) -> Clock:
        return self._clock

    def __repr__(self) -> str:
        state = ", closed" if self._pool.closed else ""
        return f"SqliteTaskStore({self._path!r}{state})"

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._path,
            timeout=self._busy_timeout,
            isolation_level=None,  # 自己管事务：BEGIN IMMEDIATE / BEGIN / COMMIT
            check_same_thread=False,  # 连接在池里跨线程借还，但同一时刻只有一个线程在用
            cached_statements=256,
        )
        try:
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _prepare(self, conn: sqlite3.Connection) -> None:
        """首次打开：WAL、检查/建立表结构。可重入——撞锁时整个重跑。"""
        if not self._memory:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                conn.execute("PRAGMA journal_mode = WAL").fetchone()
        version = schema.read_version(conn)
        schema.check_not_newer(version, self._path)
        if version == schema.SCHEMA_VERSION and not schema.missing_tables(conn):
            return
        _execute(conn, lambda c: schema.create_or_migrate(c, self._path), "write")

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
        if code == _SQLITE_READONLY:
            return StoreError(f"{where} 是只读的（{exc}）：请检查文件与所在目录的写权限")
        if code == _SQLITE_FULL:
            return StoreError(f"{where} 写入失败：磁盘已满（{exc}）")
        return StoreError(f"SQLite 操作失败（{what}，{where}）：{exc}")

    def _run(self, what: str, fn: Callable[[sqlite3.Connection], T], mode: _Mode = "write") -> T:
        """在一条连接上执行 ``fn``（按 mode 包在写事务 / 读事务里），撞锁则退避重试整个事务。"""
        started = time.monotonic()
        delay = _FIRST_BACKOFF
        while True:
            try:
                with self._pool.connection() as conn:
                    return _execute(conn, fn, mode)
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
        snapshot = check_snapshot(snapshot)
        transitions = tuple(transitions)
        codec.check_transitions(snapshot.task_id, transitions)
        row = codec.snapshot_row(snapshot)
        history = [codec.transition_row(t) for t in transitions]
        tags = [(tag, row["created_key"], snapshot.task_id) for tag in snapshot.tags]

        def tx(conn: sqlite3.Connection) -> None:
            try:
                conn.execute(_INSERT_TASK, row)
            except sqlite3.IntegrityError as exc:
                if _error_code(exc) in (_SQLITE_CONSTRAINT_PRIMARYKEY, _SQLITE_CONSTRAINT_UNIQUE):
                    raise DuplicateTaskId(
                        f"task_id {snapshot.task_id!r} 已存在：存储拒绝重复创建"
                        "（想重跑请换一个 task_id 提交）"
                    ) from None
                raise
            if tags:
                conn.executemany(_INSERT_TAG, tags)
            if history:
                conn.executemany(_INSERT_TRANSITION, history)

        self._run("create", tx)

    def save(
        self, snapshot: TaskSnapshot, *, expect_version: int, transitions: Sequence[Transition] = ()
    ) -> None:
        snapshot = check_snapshot(snapshot)
        transitions = tuple(transitions)
        codec.check_transitions(snapshot.task_id, transitions)
        validate_save(snapshot, expect_version, transitions)
        row = codec.snapshot_row(snapshot)
        new_values = [row[column] for column in schema.SAVE_COLUMNS]
        history = [codec.transition_row(t) for t in transitions]
        task_id = snapshot.task_id

        def tx(conn: sqlite3.Connection) -> None:
            current = conn.execute(_SAVE_SELECT, (task_id,)).fetchone()
            if current is None:
                raise TaskNotFound(f"存储里没有任务 {task_id!r}")
            stored_version = current[_SAVE_VERSION_INDEX]
            if stored_version != expect_version:
                raise ConcurrencyConflict(
                    f"任务 {task_id!r} 的版本已是 {stored_version}，不是期望的 {expect_version}："
                    "有别的写者抢先了，请重新读取后再决定"
                )
            # 只 SET 真正变了的列：SQLite 会为 SET 里出现的每个被索引的列维护索引（哪怕值没变），
            # 而一次状态迁移通常只改 status / status_version 和一两个时间戳，不碰 name、owner、桶号。
            changed = [
                (column, new)
                for column, old, new in zip(schema.SAVE_COLUMNS, current, new_values, strict=True)
                if old != new or type(old) is not type(new)
            ]
            if changed:
                assignments = ", ".join(f"{column} = ?" for column, _ in changed)
                conn.execute(
                    f"UPDATE tasks SET {assignments} WHERE task_id = ?",
                    [*(new for _, new in changed), task_id],
                )
            # 标签行带着排序键：标签或 created_at 变了都要重写（两者几乎从不变，平常是零开销）。
            if current[_SAVE_TAGS_INDEX] != row["tags"] or current[_SAVE_CREATED_INDEX] != row["created_key"]:
                conn.execute("DELETE FROM task_tags WHERE task_id = ?", (task_id,))
                conn.executemany(_INSERT_TAG, [(tag, row["created_key"], task_id) for tag in snapshot.tags])
            if history:
                conn.executemany(_INSERT_TRANSITION, history)

        self._run("save", tx)

    def get(self, task_id: str) -> TaskSnapshot | None:
        def read(conn: sqlite3.Connection) -> TaskSnapshot | None:
            found = conn.execute(f"{_TASK_SELECT} WHERE task_id = ?", (task_id,)).fetchone()
            return None if found is None else codec.snapshot_from_row(found)

        if not isinstance(task_id, str):
            return None
        return self._run("get", read, "none")

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        query = as_query(query)
        if query.limit == 0:
            self._check_open()
            return []
        source, params, alias = _select_from(query)
        direction = "DESC" if query.order is QueryOrder.NEWEST_FIRST else "ASC"
        order = f"{alias}.created_key {direction}, {alias}.task_id {direction}"
        sql = f"SELECT {_TASK_COLUMNS_T}{source} ORDER BY {order}"
        if query.limit is not None:
            sql += " LIMIT ?"
            params.append(query.limit)

        def read(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(sql, params).fetchall()

        rows = self._run("query", read, "none")
        return [codec.snapshot_from_row(r) for r in rows]

    def stats(self, query: TaskQuery | None = None) -> TaskStats:
        source, params, _ = _select_from(as_query(query))
        sql = f"SELECT t.status, count(*){source} GROUP BY t.status"
        rows = self._run("stats", lambda conn: conn.execute(sql, params).fetchall(), "none")
        return TaskStats({TaskStatus(status): int(count) for status, count in rows})

    def bucket_counts(self, query: TaskQuery | None = None) -> dict[int, int]:
        source, params, _ = _select_from(as_query(query), "t.bucket IS NOT NULL")
        sql = f"SELECT t.bucket, count(*){source} GROUP BY t.bucket"
        rows = self._run("bucket_counts", lambda conn: conn.execute(sql, params).fetchall(), "none")
        return {int(bucket): int(count) for bucket, count in rows}

    def _check_open(self) -> None:
        if self._pool.closed:
            raise _Pool._closed_error()

    # -- history ------------------------------------------------------------------------------------

    def append(self, transitions: Sequence[Transition]) -> None:
        transitions = tuple(transitions)
        codec.check_transitions(None, transitions)
        history = [codec.transition_row(t) for t in transitions]
        task_ids = sorted({t.task_id for t in transitions})

        def tx(conn: sqlite3.Connection) -> None:
            # 先全部检查再写：一批里有未知任务时整批不写，避免留下半截历史。
            for task_id in task_ids:
                if conn.execute("SELECT 1 FROM tasks WHERE task_id = ?", (task_id,)).fetchone() is None:
                    raise TaskNotFound(f"存储里没有任务 {task_id!r}")
            conn.executemany(_INSERT_TRANSITION, history)

        if not history:
            self._check_open()
            return
        self._run("append", tx)

    def history(self, task_id: str) -> list[Transition]:
        columns = ", ".join(schema.TRANSITION_COLUMNS)
        sql = f"SELECT {columns} FROM transitions WHERE task_id = ? ORDER BY version"
        rows = self._run("history", lambda conn: conn.execute(sql, (task_id,)).fetchall(), "none")
        return [codec.transition_from_row(r) for r in rows]

    # -- side channel -------------------------------------------------------------------------------

    @staticmethod
    def _touch_sets(
        progress: Progress | None,
        heartbeat_at: datetime | None,
        lease_owner: str | None,
        lease_until: datetime | None,
    ) -> tuple[str, list[Any]]:
        if progress is not None and not isinstance(progress, Progress):
            raise ConfigurationError(f"progress 必须是 Progress，收到 {type(progress).__name__}")
        check_aware("heartbeat_at", heartbeat_at)
        check_aware("lease_until", lease_until)
        check_optional_text("lease_owner", lease_owner)
        sets: list[str] = []
        params: list[Any] = []
        if progress is not None:
            sets.append("progress = ?")
            params.append(codec.progress_text(progress))
        if heartbeat_at is not None:
            sets.append("last_heartbeat_at = ?")
            params.append(codec.dt_text(heartbeat_at))
        if lease_owner is not None:
            sets.append("lease_owner = ?")
            params.append(lease_owner)
        if lease_until is not None:
            sets.append("lease_until = ?, lease_key = ?")
            params.extend((codec.dt_text(lease_until), codec.dt_key(lease_until)))
        return ", ".join(sets), params

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        sets, params = self._touch_sets(progress, heartbeat_at, lease_owner, lease_until)
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
        for task_id, fields in updates:
            unknown = set(fields) - _TOUCH_FIELDS
            if unknown:
                raise ConfigurationError(
                    f"touch_many 只接受 {sorted(_TOUCH_FIELDS)}，收到多余的：{sorted(unknown)}"
                )
            sets, params = self._touch_sets(
                fields.get("progress"),
                fields.get("heartbeat_at"),
                fields.get("lease_owner"),
                fields.get("lease_until"),
            )
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

    # -- commands -----------------------------------------------------------------------------------

    def submit_command(
        self,
        task_id: str,
        action: CommandAction | str,
        *,
        issuer: str | None = None,
        reason: str | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> Command:
        action, body = command_args(action, issuer, reason, payload)
        payload_text = codec.json_text(body, what="指令 payload")
        command_id = uuid.uuid4().hex
        verb = action

        def tx(conn: sqlite3.Connection) -> Command:
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
            return Command(
                command_id=command_id,
                task_id=task_id,
                action=verb,
                issuer=issuer,
                reason=reason,
                payload=json.loads(payload_text),
                created_at=created_at,
                bucket=found[0],
            )

        return self._run("submit_command", tx)

    def claim_commands(
        self,
        claimant: str,
        *,
        lease: float,
        limit: int = 100,
        task_ids: Iterable[str] | None = None,
        buckets: Iterable[int] | None = None,
    ) -> list[Command]:
        wanted_tasks, wanted_buckets = claim_args(claimant, lease, limit, task_ids, buckets)
        if limit == 0 or wanted_tasks == frozenset() or wanted_buckets == frozenset():
            self._check_open()
            return []
        filters = ""
        filter_params: list[Any] = []
        if wanted_tasks is not None:
            filters += " AND " + _in_clause("task_id", wanted_tasks, filter_params)
        if wanted_buckets is not None:
            filters += " AND " + _in_clause("bucket", wanted_buckets, filter_params)
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
        sql = (
            "UPDATE commands SET claimant = NULL, lease_until = NULL, lease_key = NULL "
            "WHERE command_id = ? AND claimant = ? AND completed_at IS NULL"
        )
        return self._run(
            "release_command", lambda conn: conn.execute(sql, (command_id, claimant)).rowcount > 0, "none"
        )

    # -- membership ---------------------------------------------------------------------------------

    def publish_node(self, record: NodeRecord) -> None:
        row = codec.node_row(check_node_record(record))
        # 单条语句在自动提交模式下本身就是原子的写事务。
        self._run("publish_node", lambda conn: conn.execute(_UPSERT_NODE, row), "none")

    def list_nodes(self) -> list[NodeRecord]:
        rows = self._run("list_nodes", lambda conn: conn.execute(_SELECT_NODES).fetchall(), "none")
        return [codec.node_from_row(row) for row in rows]

    def remove_node(self, owner: str) -> bool:
        check_node_owner(owner)
        return self._run(
            "remove_node",
            lambda conn: conn.execute("DELETE FROM nodes WHERE owner = ?", (owner,)).rowcount > 0,
            "none",
        )

    # -- upkeep -------------------------------------------------------------------------------------

    def prune(self, keep_terminal: int) -> int:
        check_count("keep_terminal", keep_terminal)

        def tx(conn: sqlite3.Connection) -> int:
            total = conn.execute(
                f"SELECT count(*) FROM tasks WHERE {_TERMINAL_IN}", _TERMINAL_VALUES
            ).fetchone()[0]
            excess = total - keep_terminal
            if excess <= 0:
                return 0
            # 最旧的排前面：缺 finished_at 的终态记录（导入的旧数据）视为最旧，其间按 created_at。
            doomed = conn.execute(
                f"SELECT task_id FROM tasks WHERE {_TERMINAL_IN} "
                "ORDER BY finished_key IS NOT NULL, coalesce(finished_key, created_key), task_id LIMIT ?",
                (*_TERMINAL_VALUES, excess),
            ).fetchall()
            for table in ("tasks", "transitions", "task_tags", "commands"):
                conn.executemany(f"DELETE FROM {table} WHERE task_id = ?", doomed)
            return len(doomed)

        return self._run("prune", tx)

    def close(self) -> None:
        self._pool.close()


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
