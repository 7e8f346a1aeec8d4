"""PostgresTaskStore 的实现（模块说明见包的 ``__init__``）。"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import select
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from chongming_task.clock import SYSTEM_CLOCK, Clock
from chongming_task.errors import (
    ConcurrencyConflict,
    ConfigurationError,
    DuplicateTaskId,
    StoreError,
    TaskNotFound,
)
from chongming_task.models import Progress, TaskSnapshot, Transition, validate_task_id
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
    escape_like,
    validate_lease,
    validate_save,
)
from chongming_task.stores.postgres import _schema
from chongming_task.stores.postgres._codec import (
    COMMAND_COLUMNS,
    JSONB_COLUMNS,
    NODE_COLUMNS,
    SAVE_COLUMNS,
    TASK_COLUMNS,
    TRANSITION_COLUMNS,
    check_text,
    command_from_row,
    json_text,
    node_from_row,
    node_params,
    snapshot_from_row,
    split_dt,
    task_params,
    transition_arrays,
    transition_from_row,
)
from chongming_task.stores.postgres._listener import CommandListener, NoticeCallback

logger = logging.getLogger("chongming_task.stores.postgres")

T = TypeVar("T")
Conn = psycopg.Connection[Any]

_TERMINAL = sorted(s.value for s in TERMINAL_STATUSES)

# 连接级故障：重试一次只读操作是安全的（读不改变任何东西）；写操作不重试——语句可能已经
# 在服务器上提交、只是回执丢了，盲目重放会把一次成功的 save 变成 ConcurrencyConflict。
_CONNECTION_ERRORS = (psycopg.OperationalError, psycopg.InterfaceError)


# -- helpers ------------------------------------------------------------------------------------------


def redact(conninfo: str) -> str:
    """去掉密码的连接串：用于报错与 repr，绝不把口令写进日志。"""
    try:
        params = conninfo_to_dict(conninfo)
    except psycopg.Error:
        return "<无法解析的连接串>"
    if "password" in params:
        params["password"] = "***"
    try:
        return make_conninfo("", **params)
    except psycopg.Error:
        return "<无法解析的连接串>"


def _validate_schema_name(schema: object) -> str:
    if not isinstance(schema, str) or not schema.strip():
        raise ConfigurationError(f"schema 必须是非空字符串，收到 {schema!r}")
    if "\x00" in schema:
        raise ConfigurationError("schema 名不能包含 NUL 字符（\\x00）")
    if len(schema.encode("utf-8")) > _schema.MAX_IDENTIFIER_BYTES:
        raise ConfigurationError(
            f"schema 名过长（{len(schema.encode('utf-8'))} 字节，PostgreSQL 上限 "
            f"{_schema.MAX_IDENTIFIER_BYTES}）：超长的名字会被静默截断，两个 schema 可能撞名"
        )
    if schema.lower().startswith("pg_"):
        raise ConfigurationError(f"schema 名不能以 pg_ 开头（{schema!r}）：那是 PostgreSQL 的保留前缀")
    return schema


def _positive_int(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name} 必须是 >= {minimum} 的整数，收到 {value!r}")
    return value


def _positive_seconds(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigurationError(f"{name} 必须是正的秒数，收到 {value!r}")
    return float(value)


def channel_for(schema: str) -> str:
    """NOTIFY 频道名：由 schema 推导，同一 schema 的所有节点天然在同一频道上。"""
    channel = f"{schema}.commands"
    if len(channel.encode("utf-8")) <= _schema.MAX_IDENTIFIER_BYTES:
        return channel
    # 太长会被 LISTEN 截断而 pg_notify 直接报错：改用定长摘要，仍由 schema 唯一决定。
    import hashlib

    return "chongming_task.commands." + hashlib.sha256(schema.encode("utf-8")).hexdigest()[:32]


_id_lock = threading.Lock()
_id_last = 0


def _new_command_id() -> str:
    """按时间单调递增的 UUIDv7 风格 id：同一 created_at 的指令按它排序，即按提交先后。

    不用数据库序列：只有 SELECT/INSERT/UPDATE/DELETE 权限的角色用不了序列（见 _schema）。
    同一进程内严格递增（毫秒内用计数器占位）；跨进程在同一毫秒内的先后本就没有定义。
    """
    global _id_last
    with _id_lock:
        stamp = time.time_ns() // 1_000_000 << 12
        _id_last = max(stamp, _id_last + 1)
        high = _id_last
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    ms, seq = high >> 12, high & 0xFFF
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | seq << 64 | 0b10 << 62 | rand
    return str(uuid.UUID(int=value))


def _socket_readable(fd: int) -> bool:
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


def _is_healthy(conn: Conn) -> bool:
    """借出连接前的检查：空闲连接上本不该有任何可读数据。

    服务器重启或 pg_terminate_backend 之后，空闲连接的套接字上躺着 FATAL 消息或 EOF。只有在
    这种时候才花一次往返做真正的检查（``ConnectionPool.check_connection``）；健康连接零开销，
    不拖慢 save 这条热路径。
    """
    if conn.closed or conn.pgconn.status != psycopg.pq.ConnStatus.OK:
        return False
    if not _socket_readable(conn.pgconn.socket):
        return True
    try:
        ConnectionPool.check_connection(conn)
    except psycopg.Error:
        return False
    return True


def _data_error(exc: BaseException) -> ConfigurationError:
    if isinstance(exc, pg_errors.NumericValueOutOfRange):
        return ConfigurationError(f"数值超出 PostgreSQL 列的范围（整数列为 64 位，桶号为 32 位）：{exc}")
    if isinstance(exc, UnicodeEncodeError):
        return ConfigurationError(f"字符串里有无法编码为 UTF-8 的字符（例如孤立的代理项）：{exc}")
    return ConfigurationError(
        f"PostgreSQL 拒绝了这份数据（请检查字符串里是否有 NUL 等无法保存的字符）：{exc}"
    )


# -- SQL ---------------------------------------------------------------------------------------------


def _cols(columns: Iterable[str], prefix: str = "") -> str:
    return ", ".join(prefix + c for c in columns)


def _value_expr(column: str) -> str:
    return f"%({column})s::jsonb" if column in JSONB_COLUMNS else f"%({column})s"


def _transitions_insert(s: str, guard: str) -> str:
    """从列数组 unnest 出多行迁移记录；(task_id, version) 已存在则跳过（幂等）。"""
    return (
        f"INSERT INTO {s}.transitions ({_cols(TRANSITION_COLUMNS)}) "
        f"SELECT {_cols(TRANSITION_COLUMNS, 'x.')} FROM unnest("
        "%(t_task_id)s::text[], %(t_version)s::bigint[], %(t_from)s::text[], %(t_to)s::text[], "
        "%(t_trigger)s::text[], %(t_actor)s::text[], %(t_reason)s::text[], %(t_at)s::timestamptz[], "
        f"%(t_at_off)s::bigint[]) AS x({_cols(TRANSITION_COLUMNS)}) {guard} "
        "ON CONFLICT (task_id, version) DO NOTHING"
    )


def _transition_params(transitions: Sequence[Transition]) -> dict[str, Any]:
    keys = (
        "t_task_id",
        "t_version",
        "t_from",
        "t_to",
        "t_trigger",
        "t_actor",
        "t_reason",
        "t_at",
        "t_at_off",
    )
    return dict(zip(keys, transition_arrays(transitions), strict=True))


class _Sql:
    """一个 schema 下的全部语句，构造时渲染一次（schema 名已转义）。"""

    def __init__(self, schema: str) -> None:
        s = _schema.quote_ident(schema)
        self.s = s
        task_cols = _cols(TASK_COLUMNS)
        self.task_cols = task_cols
        self.create = (
            f"WITH ins AS (INSERT INTO {s}.tasks ({task_cols}) "
            f"VALUES ({', '.join(_value_expr(c) for c in TASK_COLUMNS)}) "
            "ON CONFLICT (task_id) DO NOTHING RETURNING task_id), "
            f"hist AS ({_transitions_insert(s, 'WHERE EXISTS (SELECT 1 FROM ins)')}) "
            "SELECT count(*) FROM ins"
        )
        # 热路径：版本校验的 UPDATE 与迁移记录的 INSERT 在同一条语句里，一次往返、天然原子。
        # 版本不符时 upd 为空，hist 的 WHERE EXISTS 也就不插入任何一行——冲突时什么也不写。
        assignments = ", ".join(f"{c} = {_value_expr(c)}" for c in SAVE_COLUMNS)
        self.save = (
            f"WITH upd AS (UPDATE {s}.tasks SET {assignments} "
            "WHERE task_id = %(task_id)s AND status_version = %(expect_version)s RETURNING 1), "
            f"hist AS ({_transitions_insert(s, 'WHERE EXISTS (SELECT 1 FROM upd)')}) "
            f"SELECT (SELECT count(*) FROM upd), EXISTS (SELECT 1 FROM {s}.tasks WHERE task_id = %(task_id)s)"
        )
        self.save_no_history = (
            f"WITH upd AS (UPDATE {s}.tasks SET {assignments} "
            "WHERE task_id = %(task_id)s AND status_version = %(expect_version)s RETURNING 1) "
            f"SELECT (SELECT count(*) FROM upd), EXISTS (SELECT 1 FROM {s}.tasks WHERE task_id = %(task_id)s)"
        )
        self.current_version = f"SELECT status_version FROM {s}.tasks WHERE task_id = %s"
        self.get = f"SELECT {task_cols} FROM {s}.tasks WHERE task_id = %s"
        # 批里有不存在的任务 → 整批不写（否则留下 prune 永远删不掉的孤儿历史），并报出是哪些。
        self.append = (
            "WITH missing AS (SELECT DISTINCT m.task_id FROM unnest(%(t_task_id)s::text[]) AS m(task_id) "
            f"WHERE NOT EXISTS (SELECT 1 FROM {s}.tasks t WHERE t.task_id = m.task_id)), "
            f"ins AS ({_transitions_insert(s, 'WHERE NOT EXISTS (SELECT 1 FROM missing)')}) "
            "SELECT array_agg(task_id ORDER BY task_id) FROM missing"
        )
        self.history = (
            f"SELECT {_cols(TRANSITION_COLUMNS)} FROM {s}.transitions WHERE task_id = %s ORDER BY version"
        )
        self.exists = f"SELECT EXISTS (SELECT 1 FROM {s}.tasks WHERE task_id = %s)"
        command_cols = _cols(COMMAND_COLUMNS)
        self.command_cols = command_cols
        notice = (
            "json_build_object('command_id', {t}.command_id, 'task_id', {t}.task_id, "
            "'action', {t}.action, 'bucket', {t}.bucket)::text"
        )
        self.submit = (
            f"WITH ins AS (INSERT INTO {s}.commands "
            "(command_id, task_id, action, issuer, reason, payload, created_at, created_at_off, bucket) "
            "SELECT %(command_id)s, t.task_id, %(action)s, %(issuer)s, %(reason)s, %(payload)s::jsonb, "
            f"%(created_at)s, %(created_at_off)s, t.bucket FROM {s}.tasks t WHERE t.task_id = %(task_id)s "
            "RETURNING command_id, task_id, action, bucket) "
            f"SELECT ins.bucket, pg_notify(%(channel)s, {notice.format(t='ins')}) FROM ins"
        )
        self.complete = (
            f"UPDATE {s}.commands SET "
            "completed_at_off = CASE WHEN completed_at IS NULL THEN %(at_off)s ELSE completed_at_off END, "
            "completed_at = COALESCE(completed_at, %(at)s) "
            "WHERE command_id = %(command_id)s AND claimant = %(claimant)s RETURNING 1"
        )
        self.release = (
            f"WITH rel AS (UPDATE {s}.commands "
            "SET claimant = NULL, lease_until = NULL, lease_until_off = NULL "
            "WHERE command_id = %(command_id)s AND claimant = %(claimant)s AND completed_at IS NULL "
            "RETURNING command_id, task_id, action, bucket) "
            f"SELECT pg_notify(%(channel)s, {notice.format(t='rel')}) FROM rel"
        )
        self.prune = (
            f"WITH victims AS (SELECT task_id FROM {s}.tasks WHERE status = ANY(%(terminal)s::text[]) "
            "ORDER BY finished_at DESC NULLS LAST, created_at DESC, task_id DESC OFFSET %(keep)s), "
            f"dh AS (DELETE FROM {s}.transitions WHERE task_id IN (SELECT task_id FROM victims)), "
            f"dc AS (DELETE FROM {s}.commands WHERE task_id IN (SELECT task_id FROM victims)), "
            f"dt AS (DELETE FROM {s}.tasks WHERE task_id IN (SELECT task_id FROM victims) RETURNING 1) "
            "SELECT count(*) FROM dt"
        )
        node_cols = _cols(NODE_COLUMNS)
        node_values = ", ".join(
            "%(buckets)s::bigint[]" if c == "buckets" else "%(info)s::jsonb" if c == "info" else f"%({c})s"
            for c in NODE_COLUMNS
        )
        # ON CONFLICT DO UPDATE 在并发下也不会撞唯一约束：同一 owner 的并发发布按提交先后覆盖。
        self.publish_node = (
            f"INSERT INTO {s}.nodes ({node_cols}) VALUES ({node_values}) ON CONFLICT (owner) DO UPDATE SET "
            + ", ".join(f"{c} = EXCLUDED.{c}" for c in NODE_COLUMNS if c != "owner")
        )
        self.list_nodes = f"SELECT {node_cols} FROM {s}.nodes ORDER BY owner"
        self.remove_node = f"DELETE FROM {s}.nodes WHERE owner = %s RETURNING 1"
        self._claim: dict[tuple[bool, bool], str] = {}
        self._touch: dict[tuple[bool, bool, bool, bool], str] = {}

    def claim(self, by_task: bool, by_bucket: bool) -> str:
        key = (by_task, by_bucket)
        text = self._claim.get(key)
        if text is None:
            filters = ""
            if by_task:
                filters += " AND task_id = ANY(%(task_ids)s::text[])"
            if by_bucket:
                filters += " AND bucket = ANY(%(buckets)s::integer[])"
            # SKIP LOCKED：并发的认领者各自跳过别人正锁着的行，互不等待，也绝不拿到同一条。
            # READ COMMITTED 下被别人刚提交认领的行会按最新版本复查 WHERE，租约未过期就不会被选中。
            text = (
                f"WITH picked AS (SELECT command_id FROM {self.s}.commands "
                "WHERE completed_at IS NULL AND (lease_until IS NULL OR lease_until <= %(now)s)"
                f"{filters} ORDER BY enqueued_at, command_id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) "
                f"UPDATE {self.s}.commands c SET claimant = %(claimant)s, lease_until = %(until)s, "
                "lease_until_off = %(until_off)s, deliveries = c.deliveries + 1 "
                f"FROM picked WHERE c.command_id = picked.command_id "
                f"RETURNING {_cols(COMMAND_COLUMNS, 'c.')}, c.enqueued_at"
            )
            self._claim[key] = text
        return text

    def touch(self, progress: bool, heartbeat: bool, lease_owner: bool, lease_until: bool) -> str:
        key = (progress, heartbeat, lease_owner, lease_until)
        text = self._touch.get(key)
        if text is None:
            sets = []
            if progress:
                sets.append("progress = %(progress)s::jsonb")
            if heartbeat:
                sets += [
                    "last_heartbeat_at = %(heartbeat_at)s",
                    "last_heartbeat_at_off = %(heartbeat_at_off)s",
                ]
            if lease_owner:
                sets.append("lease_owner = %(lease_owner)s")
            if lease_until:
                sets += ["lease_until = %(lease_until)s", "lease_until_off = %(lease_until_off)s"]
            text = f"UPDATE {self.s}.tasks SET {', '.join(sets)} WHERE task_id = %(task_id)s RETURNING 1"
            self._touch[key] = text
        return text


def _where(query: TaskQuery) -> tuple[str, dict[str, Any]]:
    """TaskQuery → WHERE 子句。每一条都与 ``TaskQuery.matches`` 的参照语义逐条对应。"""
    clauses: list[str] = []
    params: dict[str, Any] = {}
    if query.statuses is not None:
        clauses.append("status = ANY(%(statuses)s::text[])")
        params["statuses"] = sorted(s.value for s in query.statuses)
    if query.name_prefix is not None:
        # 前缀按字面匹配：escape_like 转义 % _ 与转义符本身（列是 COLLATE "C"，按码点比较）。
        clauses.append("name LIKE %(name_like)s ESCAPE '\\'")
        params["name_like"] = escape_like(query.name_prefix)
    if query.tag is not None:
        clauses.append("tags @> ARRAY[%(tag)s::text]")
        params["tag"] = query.tag
    if query.bucket is not None:
        clauses.append("bucket = %(bucket)s")
        params["bucket"] = query.bucket
    if query.buckets is not None:
        clauses.append("bucket = ANY(%(buckets)s::bigint[])")
        params["buckets"] = sorted(query.buckets)
    if query.owner is not None:
        clauses.append("owner = %(owner)s")
        params["owner"] = query.owner
    if query.pipeline_id is not None:
        clauses.append("pipeline_id = %(pipeline_id)s")
        params["pipeline_id"] = query.pipeline_id
    if query.created_after is not None:
        clauses.append("created_at > %(created_after)s")
        params["created_after"] = query.created_after
    if query.created_before is not None:
        clauses.append("created_at < %(created_before)s")
        params["created_before"] = query.created_before
    if query.lease_expired_before is not None:
        clauses.append("(lease_until IS NULL OR lease_until < %(lease_expired_before)s)")
        params["lease_expired_before"] = query.lease_expired_before
    for name in ("name_like", "tag", "owner", "pipeline_id"):
        if name in params:
            check_text(params[name], f"TaskQuery.{name}")
    where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
    return where, params


# -- the store ---------------------------------------------------------------------------------------


class PostgresTaskStore(TaskStore):
    """PostgreSQL 持久层：多台机器共用一套任务存储与控制指令通道。

    ``dsn`` 是 libpq 连接串（``postgresql://user:pw@host:5432/db`` 或 ``host=... dbname=...``）。
    所有表放在 ``schema`` 里（默认 ``chongming_task``），不同 schema 互不可见——一个数据库里可以
    放多套互相隔离的部署（测试正是这样做的）。

    * ``min_size`` / ``max_size``：连接池大小。
    * ``pool_timeout``：借不到连接（数据库宕机、池已耗尽）时最多等多久，之后抛 StoreError。
    * ``connect_timeout``：建立单条连接的超时。
    * ``reconnect_timeout``：连接池一轮重连退避的上限（见构造函数里的说明）。
    * ``application_name``：出现在 pg_stat_activity 里的名字（监听连接另加 ``:listen`` 后缀）。
    * ``statement_timeout``：单条语句（含等锁）最多执行多久，超时抛 StoreError；None 表示不限。
      默认 10 秒：Controller 在任务自己的锁内写穿，一张被锁住的表或挂住的服务器不能让 stop() / get()
      永远卡住——写入失败会进 persist_failures，任务照常，恢复后存储自动追平。
    * ``clock``：写进指令与租约的"现在"（测试注入 FakeClock）。
    """

    def __init__(
        self,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 8,
        schema: str = _schema.DEFAULT_SCHEMA,
        clock: Clock | None = None,
        connect_timeout: float = 5.0,
        pool_timeout: float = 5.0,
        reconnect_timeout: float = 10.0,
        application_name: str = "chongming-task",
        statement_timeout: float | None = 10.0,
        connect_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(dsn, str) or not dsn.strip():
            raise ConfigurationError(
                f"PostgresTaskStore 需要连接串，例如 postgresql://user:pw@host:5432/db，收到 {dsn!r}"
            )
        self._schema = _validate_schema_name(schema)
        min_size = _positive_int("min_size", min_size, minimum=0)
        max_size = _positive_int("max_size", max_size, minimum=max(1, min_size))
        self._connect_timeout = _positive_seconds("connect_timeout", connect_timeout)
        self._pool_timeout = _positive_seconds("pool_timeout", pool_timeout)
        reconnect_timeout = _positive_seconds("reconnect_timeout", reconnect_timeout)
        statement_ms = (
            None
            if statement_timeout is None
            else math.ceil(1000 * _positive_seconds("statement_timeout", statement_timeout))
        )
        self._clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._dsn = dsn
        self._display = redact(dsn)
        self._channel = channel_for(self._schema)
        self._sql = _Sql(self._schema)
        self._closed = False
        self._close_lock = threading.Lock()
        self._listener: CommandListener | None = None
        self._listener_lock = threading.Lock()
        # libpq 的 connect_timeout 是整数秒，且小于 2 会被当作 2。
        self._connect_kwargs: dict[str, Any] = {
            "connect_timeout": max(2, math.ceil(self._connect_timeout)),
            "application_name": application_name,
        }
        if connect_kwargs:
            self._connect_kwargs.update(connect_kwargs)
        pool_kwargs = dict(self._connect_kwargs)
        # autocommit：每个方法都是一条自成事务的语句，省掉 BEGIN / COMMIT 两次往返；
        # 需要多条语句原子执行的地方显式 conn.transaction()。
        pool_kwargs["autocommit"] = True
        if statement_ms is not None and "options" not in dsn and "options" not in pool_kwargs:
            # 连接串或 connect_kwargs 里已有 options（例如 -c statement_timeout=…）就尊重它，不覆盖。
            pool_kwargs["options"] = f"-c statement_timeout={statement_ms}"
        try:
            self._pool: ConnectionPool[Conn] = ConnectionPool(
                dsn,
                min_size=min_size,
                max_size=max_size,
                kwargs=pool_kwargs,
                open=False,
                timeout=self._pool_timeout,
                # 连接池重连的退避是 1、2、4、8……秒，直到 reconnect_timeout 才放弃这一轮；放弃之后下一个
                # 借连接的请求会立刻发起新一轮。默认的 5 分钟意味着数据库恢复后最多还要再等一两分钟
                # 才重连上；这里收短，让"数据库回来了 → 存储恢复"在几秒内发生。
                reconnect_timeout=reconnect_timeout,
                name=f"chongming-task:{self._schema}",
            )
        except psycopg.Error as exc:
            raise ConfigurationError(f"无法解析 PostgreSQL 连接串 {self._display}：{exc}") from exc
        try:
            # 先用一条独立连接检查/建表：连不上时立刻拿到驱动的真实原因（拒绝连接、认证失败、库不存在），
            # 而不是等连接池在退避重试里耗满超时、只报一句"超时"。
            self._ensure_schema()
            try:
                self._pool.open(wait=min_size > 0, timeout=self._connect_timeout + 1)
            except PoolTimeout as exc:
                raise StoreError(
                    f"连不上 PostgreSQL（{self._display}）：{self._connect_timeout:g} 秒内没能建立连接池。"
                    "请确认数据库在运行、连接数没有耗尽。"
                ) from exc
        except BaseException:
            self._pool.close(timeout=2.0)
            self._closed = True
            raise

    # -- construction helpers -------------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> PostgresTaskStore:
        """``open_store("postgresql://...")`` 的入口。

        连接串里可以带本库自己的参数（libpq 不认识它们，会在传给驱动之前摘掉）：
        ``?schema=...&min_size=...&max_size=...&pool_timeout=...&connect_timeout=...``。
        显式的关键字参数优先于连接串里的同名参数。
        """
        if not isinstance(url, str):
            raise ConfigurationError(f"连接串必须是字符串，收到 {url!r}")
        parts = urlsplit(url)
        ours: dict[str, Any] = {}
        rest: list[tuple[str, str]] = []
        converters: dict[str, Callable[[str], Any]] = {
            "schema": str,
            "min_size": int,
            "max_size": int,
            "pool_timeout": float,
            "connect_timeout": float,
            "statement_timeout": float,
        }
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key in converters:
                try:
                    ours[key] = converters[key](value)
                except ValueError:
                    raise ConfigurationError(f"连接串参数 {key}={value!r} 不合法") from None
            else:
                rest.append((key, value))
        # quote 而不是默认的 quote_plus：libpq 只做百分号解码，不把 + 当空格——options=-c%20x=1
        # 被重新编码成 -c+x=1 后，服务器会报 unrecognized configuration parameter "+x"。
        dsn = urlunsplit(parts._replace(query=urlencode(rest, quote_via=quote)))
        ours.update(kwargs)
        return cls(dsn, **ours)

    @staticmethod
    def schema_sql(schema: str = _schema.DEFAULT_SCHEMA) -> str:
        """建表 SQL（含事务）。角色没有 DDL 权限时，把它交给有权限的账号执行一次。"""
        return _schema.schema_sql(_validate_schema_name(schema))

    @staticmethod
    def grant_sql(schema: str, role: str) -> str:
        """给只读写、不建表的角色授权的 SQL（在 schema_sql 之后执行）。"""
        return _schema.grant_sql(_validate_schema_name(schema), role)

    @property
    def schema(self) -> str:
        return self._schema

    @property
    def channel(self) -> str:
        """指令通知的频道名（由 schema 推导）。"""
        return self._channel

    @property
    def pool(self) -> ConnectionPool[Conn]:
        """底层连接池（只读用途：监控、统计；不要借出连接长期持有）。"""
        return self._pool

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"PostgresTaskStore({self._display!r}, schema={self._schema!r}, {state})"

    # -- schema ---------------------------------------------------------------------------------------

    def _read_version(self, conn: Conn) -> int | None:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [f"{self._sql.s}.schema_version"]).fetchone()
        if row is None or not row[0]:
            return None
        version_row = conn.execute(f"SELECT version FROM {self._sql.s}.schema_version").fetchone()
        return None if version_row is None else int(version_row[0])

    def _ensure_schema(self) -> None:
        """首次连接时建表。先看表在不在：在就直接用（只读写角色也能连），不在才建。

        建表在事务级咨询锁之下进行：两个节点同时启动时，后到的一方等前者提交，再看到表已存在；
        否则并发的 CREATE TABLE IF NOT EXISTS 会在系统目录上撞唯一约束而失败。
        """
        try:
            conn = psycopg.connect(self._dsn, autocommit=True, **self._connect_kwargs)
        except psycopg.Error as exc:
            raise StoreError(
                f"连不上 PostgreSQL（{self._display}）：{str(exc).strip()}。"
                "请确认数据库在运行、地址端口与账号正确、网络可达。"
            ) from exc
        with conn:
            try:
                self._check_schema_usage(conn)
            except psycopg.Error as exc:
                raise StoreError(
                    f"读取 PostgreSQL 系统目录失败（{self._display}）：{str(exc).strip()}"
                ) from exc
            try:
                version = self._read_version(conn)
                if version is None:
                    with conn.transaction():
                        conn.execute(
                            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                            ["chongming_task.ddl:" + self._schema],
                        )
                        version = self._read_version(conn)
                        if version is None:
                            self._create_tables(conn)
                            version = _schema.SCHEMA_VERSION
                if version == _schema.SCHEMA_VERSION and not self._has_nodes_table(conn):
                    self._add_nodes_table(conn)
            except pg_errors.InsufficientPrivilege as exc:
                raise StoreError(self._privilege_message(conn, exc)) from exc
            except psycopg.Error as exc:
                raise StoreError(
                    f"检查/创建 schema {self._schema!r} 的表时 PostgreSQL 报错（{self._display}）："
                    f"{str(exc).strip()}"
                ) from exc
        if version > _schema.SCHEMA_VERSION:
            raise StoreError(
                f"PostgreSQL schema {self._schema!r} 的表结构版本是 {version}，高于本程序支持的 "
                f"{_schema.SCHEMA_VERSION}：它是由更新版本的 chongming-task 建的。请升级 "
                "chongming-task-store-postgres，或换一个 schema，不要用旧程序写新结构。"
            )
        if version < _schema.SCHEMA_VERSION:
            raise StoreError(
                f"PostgreSQL schema {self._schema!r} 的表结构版本是 {version}，低于本程序的 "
                f"{_schema.SCHEMA_VERSION}，且没有可用的迁移路径；请联系维护者或换一个新 schema。"
            )

    def _has_nodes_table(self, conn: Conn) -> bool:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [f"{self._sql.s}.nodes"]).fetchone()
        return bool(row and row[0])

    def _add_nodes_table(self, conn: Conn) -> None:
        """给节点表加入之前建的第 1 版 schema 补建节点表（同样在咨询锁下，两个节点同时补建不撞车）。

        没有建表权限时不让构造失败：任务、历史与指令照常可用（那是已有部署赖以运行的部分），只有
        成员方法会报错并附上要执行的 SQL。
        """
        try:
            with conn.transaction():
                conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                    ["chongming_task.ddl:" + self._schema],
                )
                if not self._has_nodes_table(conn):
                    for statement in _schema.node_ddl_statements(self._schema):
                        conn.execute(statement)
        except pg_errors.InsufficientPrivilege:
            logger.warning(
                "schema %r 里没有节点表 nodes，而角色 %r 没有建表权限：任务读写照常，"
                "publish_node / list_nodes / remove_node 不可用，直到有权限的账号补建它",
                self._schema,
                conn.info.user,
            )

    def _membership_error(self, exc: StoreError) -> StoreError:
        """节点表缺失时的报错：说清楚是旧 schema 缺表，并给出补建与授权的 SQL。"""
        if not isinstance(exc.__cause__, pg_errors.UndefinedTable):
            return exc
        ddl = ";\n".join(_schema.node_ddl_statements(self._schema))
        q_schema = _schema.quote_ident(self._schema)
        return StoreError(
            f"schema {self._schema!r} 里没有节点成员表 nodes（它是在这套表建好之后才加入的，而当前角色没有"
            "建表权限，没能自动补建）。请让有权限的账号执行：\n"
            f"{ddl};\nGRANT SELECT, INSERT, UPDATE, DELETE ON {q_schema}.nodes TO <运行节点的角色>;"
        )

    def _check_schema_usage(self, conn: Conn) -> None:
        """schema 在、但本角色连 USAGE 都没有：这时表在不在都看不见，得说清楚是缺 USAGE，而不是缺表。"""
        row = conn.execute(
            "SELECT has_schema_privilege(n.oid, 'USAGE') FROM pg_namespace n WHERE n.nspname = %s",
            [self._schema],
        ).fetchone()
        if row is None or row[0]:
            return
        role = conn.info.user
        raise StoreError(
            f"PostgreSQL 角色 {role!r} 没有 schema {self._schema!r} 的 USAGE 权限，看不到里面的表。"
            f"请让有权限的账号执行：\n{_schema.grant_sql(self._schema, role)}"
        )

    def _create_tables(self, conn: Conn) -> None:
        statements = _schema.ddl_statements(self._schema)
        exists = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s)", [self._schema])
        row = exists.fetchone()
        # CREATE SCHEMA IF NOT EXISTS 即使 schema 已存在也要数据库级 CREATE 权限：已存在就跳过它。
        start = 1 if row is not None and row[0] else 0
        for statement in statements[start:]:
            conn.execute(statement)

    def _privilege_message(self, conn: Conn, exc: BaseException) -> str:
        role = database = "?"
        schema_exists = False
        # 只为把报错写得更具体：连这几个查询都失败时，按"schema 不存在"给建议，原始错误照样出现在消息里。
        with contextlib.suppress(psycopg.Error):
            info = conn.info
            role, database = info.user, info.dbname
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s)", [self._schema]
            ).fetchone()
            schema_exists = bool(row and row[0])
        q_schema, q_role = _schema.quote_ident(self._schema), _schema.quote_ident(role)
        if schema_exists:
            missing = f"schema {self._schema!r} 上的 CREATE 权限（用于在其中建表）"
            grant = f"GRANT CREATE ON SCHEMA {q_schema} TO {q_role};"
        else:
            missing = f"数据库 {database!r} 上的 CREATE 权限（schema {self._schema!r} 还不存在，要先建它）"
            grant = f"GRANT CREATE ON DATABASE {_schema.quote_ident(database)} TO {q_role};"
        return (
            f"PostgreSQL 角色 {role!r} 没有建表权限，而 schema {self._schema!r} 里的表还不存在"
            f"（数据库报错：{str(exc).strip()}）。\n"
            f"缺少的权限：{missing}。\n"
            "二选一：\n"
            "  1. 让有权限的账号执行一次下面的建表 SQL"
            f"（也可用 PostgresTaskStore.schema_sql({self._schema!r}) 取得），再给本角色授权读写：\n"
            f"{_schema.schema_sql(self._schema)}\n"
            f"{_schema.grant_sql(self._schema, role)}\n"
            f"  2. 或者授予本角色建表权限，让它首次连接时自己建：{grant}"
        )

    # -- connection handling --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"PostgresTaskStore（schema {self._schema!r}）已关闭，不能再使用")

    @contextmanager
    def _connection(self) -> Iterator[Conn]:
        """借一条连接；驱动与连接池的异常一律翻译成本库的异常（带中文说明）。"""
        self._check_open()
        try:
            conn = self._acquire()
            try:
                with conn:  # 出错回滚；连接属于池，退出时不会被关闭
                    yield conn
            finally:
                self._pool.putconn(conn)
        except PoolTimeout as exc:
            raise StoreError(
                f"{self._pool_timeout:g} 秒内没能从连接池拿到可用的 PostgreSQL 连接（{self._display}）："
                "数据库可能宕机、网络不通或连接数已满。恢复后会自动重连。"
            ) from exc
        except PoolClosed as exc:
            raise StoreError(f"PostgresTaskStore（schema {self._schema!r}）已关闭，不能再使用") from exc
        except (psycopg.DataError, UnicodeEncodeError) as exc:
            raise _data_error(exc) from exc
        except (pg_errors.UndefinedTable, pg_errors.InvalidSchemaName) as exc:
            raise StoreError(
                f"schema {self._schema!r} 里的表不见了（被删除了？）：{str(exc).strip()}。"
                "重新构造存储会重建它们。"
            ) from exc
        except pg_errors.InsufficientPrivilege as exc:
            raise StoreError(
                f"PostgreSQL 角色没有操作 schema {self._schema!r} 的权限：{str(exc).strip()}。需要 USAGE 与 "
                f"SELECT/INSERT/UPDATE/DELETE，可参考 PostgresTaskStore.grant_sql({self._schema!r}, 角色名)。"
            ) from exc
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL 操作失败（{self._display}）：{str(exc).strip()}") from exc

    def _acquire(self) -> Conn:
        """从池里借一条健康的连接。

        不用连接池自带的 ``check=`` 回调：它每发现一条坏连接就按 1、2、4 秒退避重试，服务器重启
        之后池里的空闲连接全是坏的，第一次调用会被拖上好几秒。这里发现一条坏连接就让池一次性
        清掉所有坏的空闲连接（``pool.check()``），再借一条——通常是刚建好的新连接，毫秒级。
        """
        deadline = time.monotonic() + self._pool_timeout
        conn = self._pool.getconn(timeout=self._pool_timeout)
        for _ in range(3):
            if _is_healthy(conn):
                return conn
            self._pool.putconn(conn)  # 坏连接：池丢弃它并在后台补一条新的
            self._pool.check()
            conn = self._pool.getconn(timeout=max(0.001, deadline - time.monotonic()))
        return conn  # 仍不健康就让语句自己失败，翻译成 StoreError

    def _read(self, fn: Callable[[Conn], T]) -> T:
        """只读操作：遇到连接级故障重试一次（读是幂等的，重放安全）。"""
        try:
            with self._connection() as conn:
                return fn(conn)
        except StoreError as exc:
            cause = exc.__cause__
            # PoolTimeout 也是 OperationalError，但它意味着已经等满了超时：再等一轮只会让调用方挂得更久。
            if not isinstance(cause, _CONNECTION_ERRORS) or isinstance(cause, PoolTimeout) or self._closed:
                raise
        logger.info("PostgreSQL 连接中断，重试一次只读操作")
        with self._connection() as conn:
            return fn(conn)

    # -- snapshots ------------------------------------------------------------------------------------

    def create(self, snapshot: TaskSnapshot, transitions: Sequence[Transition] = ()) -> None:
        if not isinstance(snapshot, TaskSnapshot):
            raise ConfigurationError(f"create() 需要 TaskSnapshot，收到 {type(snapshot).__name__}")
        for record in transitions:
            if isinstance(record, Transition) and record.task_id != snapshot.task_id:
                raise ConfigurationError(f"迁移记录属于任务 {record.task_id!r}，不属于 {snapshot.task_id!r}")
        params = task_params(snapshot)
        params.update(_transition_params(transitions))
        with self._connection() as conn:
            row = conn.execute(self._sql.create, params).fetchone()
        if row is None or row[0] == 0:
            raise DuplicateTaskId(f"task_id {snapshot.task_id!r} 已存在；想再跑一次请换一个 task_id 提交")

    def save(
        self, snapshot: TaskSnapshot, *, expect_version: int, transitions: Sequence[Transition] = ()
    ) -> None:
        if not isinstance(snapshot, TaskSnapshot):
            raise ConfigurationError(f"save() 需要 TaskSnapshot，收到 {type(snapshot).__name__}")
        validate_save(snapshot, expect_version, transitions)
        params = task_params(snapshot)
        params["expect_version"] = expect_version
        if transitions:
            params.update(_transition_params(transitions))
            statement = self._sql.save
        else:
            statement = self._sql.save_no_history
        with self._connection() as conn:
            row = conn.execute(statement, params).fetchone()
            if row is not None and row[0] == 1:
                return
            if row is None or not row[1]:
                raise TaskNotFound(f"任务 {snapshot.task_id!r} 不存在，无法保存（先 create）")
            # 冲突是少见路径：多花一次往返读出当前版本，让报错说清楚差在哪。
            current = conn.execute(self._sql.current_version, [snapshot.task_id]).fetchone()
        actual = "?" if current is None else current[0]
        raise ConcurrencyConflict(
            f"任务 {snapshot.task_id!r} 的版本冲突：期望 status_version={expect_version}，存储中为 {actual}；"
            "有别的写入者抢先改了它，请重新读取后再决定"
        )

    def get(self, task_id: str) -> TaskSnapshot | None:
        if not isinstance(task_id, str) or "\x00" in task_id:
            return None

        def run(conn: Conn) -> TaskSnapshot | None:
            row = conn.execute(self._sql.get, [task_id]).fetchone()
            return None if row is None else snapshot_from_row(row)

        return self._read(run)

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        query = as_query(query)
        if query.limit == 0:
            return []
        where, params = _where(query)
        direction = "DESC" if query.order is QueryOrder.NEWEST_FIRST else "ASC"
        text = (
            f"SELECT {self._sql.task_cols} FROM {self._sql.s}.tasks{where} "
            f"ORDER BY created_at {direction}, task_id {direction}"
        )
        if query.limit is not None:
            text += " LIMIT %(limit)s"
            params["limit"] = query.limit

        def run(conn: Conn) -> list[TaskSnapshot]:
            return [snapshot_from_row(row) for row in conn.execute(text, params).fetchall()]

        return self._read(run)

    def stats(self, query: TaskQuery | None = None) -> TaskStats:
        query = as_query(query)
        where, params = _where(query)
        text = f"SELECT status, count(*) FROM {self._sql.s}.tasks{where} GROUP BY status"

        def run(conn: Conn) -> TaskStats:
            rows = conn.execute(text, params).fetchall()
            return TaskStats({TaskStatus(status): int(n) for status, n in rows})

        return self._read(run)

    def bucket_counts(self, query: TaskQuery | None = None) -> dict[int, int]:
        query = as_query(query)
        where, params = _where(query)
        where = f"{where} AND bucket IS NOT NULL" if where else " WHERE bucket IS NOT NULL"
        text = f"SELECT bucket, count(*) FROM {self._sql.s}.tasks{where} GROUP BY bucket ORDER BY bucket"

        def run(conn: Conn) -> dict[int, int]:
            return {int(bucket): int(n) for bucket, n in conn.execute(text, params).fetchall()}

        return self._read(run)

    # -- history --------------------------------------------------------------------------------------

    def append(self, transitions: Sequence[Transition]) -> None:
        if not transitions:
            return
        params = _transition_params(transitions)
        with self._connection() as conn:
            row = conn.execute(self._sql.append, params).fetchone()
        missing = None if row is None else row[0]
        if missing:
            raise TaskNotFound(f"这些任务不存在，整批迁移记录都没有写入：{', '.join(map(repr, missing))}")

    def history(self, task_id: str) -> list[Transition]:
        if not isinstance(task_id, str) or "\x00" in task_id:
            return []

        def run(conn: Conn) -> list[Transition]:
            return [transition_from_row(row) for row in conn.execute(self._sql.history, [task_id]).fetchall()]

        return self._read(run)

    # -- side channel ---------------------------------------------------------------------------------

    def _touch_statement(
        self,
        task_id: str,
        progress: Progress | None,
        heartbeat_at: datetime | None,
        lease_owner: str | None,
        lease_until: datetime | None,
    ) -> tuple[str, dict[str, Any]] | None:
        if not isinstance(task_id, str):
            raise ConfigurationError(f"task_id 必须是字符串，收到 {task_id!r}")
        if progress is not None and not isinstance(progress, Progress):
            raise ConfigurationError(f"progress 必须是 Progress，收到 {type(progress).__name__}")
        for name, value in (("heartbeat_at", heartbeat_at), ("lease_until", lease_until)):
            if value is not None and (not isinstance(value, datetime) or value.utcoffset() is None):
                raise ConfigurationError(f"{name} 必须是带时区的 datetime，收到 {value!r}")
        if lease_owner is not None and not isinstance(lease_owner, str):
            raise ConfigurationError(f"lease_owner 必须是字符串，收到 {lease_owner!r}")
        check_text(lease_owner, "lease_owner")
        if progress is None and heartbeat_at is None and lease_owner is None and lease_until is None:
            return None
        params: dict[str, Any] = {"task_id": task_id, "lease_owner": lease_owner}
        params["progress"] = None if progress is None else json_text(progress.to_dict(), "progress")
        params["heartbeat_at"], params["heartbeat_at_off"] = split_dt(heartbeat_at)
        params["lease_until"], params["lease_until_off"] = split_dt(lease_until)
        text = self._sql.touch(
            progress is not None, heartbeat_at is not None, lease_owner is not None, lease_until is not None
        )
        return text, params

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        statement = self._touch_statement(task_id, progress, heartbeat_at, lease_owner, lease_until)
        if "\x00" in task_id:
            return False
        if statement is None:

            def run(conn: Conn) -> bool:
                row = conn.execute(self._sql.exists, [task_id]).fetchone()
                return bool(row and row[0])

            return self._read(run)
        text, params = statement
        with self._connection() as conn:
            return conn.execute(text, params).fetchone() is not None

    def touch_many(self, updates: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """一次事务、一次管道发送：控制器每轮续租几十个任务，不该付几十次往返。"""
        statements: list[tuple[str, dict[str, Any]]] = []
        for task_id, fields in updates:
            unknown = set(fields) - {"progress", "heartbeat_at", "lease_owner", "lease_until"}
            if unknown:
                raise ConfigurationError(f"touch_many 里有未知字段：{sorted(unknown)}")
            if isinstance(task_id, str) and "\x00" in task_id:
                continue
            statement = self._touch_statement(
                task_id,
                fields.get("progress"),
                fields.get("heartbeat_at"),
                fields.get("lease_owner"),
                fields.get("lease_until"),
            )
            if statement is not None:
                statements.append(statement)
        if not statements:
            return
        with self._connection() as conn, conn.pipeline(), conn.transaction():
            for text, params in statements:
                conn.execute(text, params)

    # -- commands -------------------------------------------------------------------------------------

    def submit_command(
        self,
        task_id: str,
        action: CommandAction | str,
        *,
        issuer: str | None = None,
        reason: str | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> Command:
        validate_task_id(task_id)
        try:
            action = CommandAction(action)
        except ValueError:
            known = ", ".join(a.value for a in CommandAction)
            raise ConfigurationError(f"未知的指令动作 {action!r}；可选：{known}") from None
        for name, value in (("issuer", issuer), ("reason", reason)):
            if value is not None and not isinstance(value, str):
                raise ConfigurationError(f"指令的 {name} 必须是字符串，收到 {value!r}")
            check_text(value, f"指令的 {name}")
        if payload is not None and not isinstance(payload, Mapping):
            raise ConfigurationError(f"指令的 payload 必须是字典，收到 {type(payload).__name__}")
        body = dict(payload or {})
        payload_text = json_text(body, "指令 payload")
        created_at = self._clock.now()
        command_id = _new_command_id()
        at, at_off = split_dt(created_at)
        params = {
            "command_id": command_id,
            "task_id": task_id,
            "action": action.value,
            "issuer": issuer,
            "reason": reason,
            "payload": payload_text,
            "created_at": at,
            "created_at_off": at_off,
            "channel": self._channel,
        }
        with self._connection() as conn:
            row = conn.execute(self._sql.submit, params).fetchone()
        if row is None:
            raise TaskNotFound(f"任务 {task_id!r} 不存在，无法下发指令 {action.value}")
        return Command(
            command_id=command_id,
            task_id=task_id,
            action=action,
            issuer=issuer,
            reason=reason,
            payload=json.loads(payload_text),
            created_at=created_at,
            bucket=row[0],
        )

    def claim_commands(
        self,
        claimant: str,
        *,
        lease: float,
        limit: int = 100,
        task_ids: Iterable[str] | None = None,
        buckets: Iterable[int] | None = None,
    ) -> list[Command]:
        if not isinstance(claimant, str) or not claimant:
            raise ConfigurationError(f"claimant 必须是非空字符串，收到 {claimant!r}")
        check_text(claimant, "claimant")
        validate_lease(lease)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigurationError(f"limit 必须是非负整数，收到 {limit!r}")
        ids: list[str] | None = None
        if task_ids is not None:
            if isinstance(task_ids, str):
                raise ConfigurationError("task_ids 必须是 task_id 的集合，不能是单个字符串")
            ids = [t for t in task_ids if isinstance(t, str) and "\x00" not in t]
            if not ids:
                return []
        bucket_list: list[int] | None = None
        if buckets is not None:
            bucket_list = []
            for bucket in buckets:
                if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 0:
                    raise ConfigurationError(f"buckets 里只能放非负整数桶号，收到 {bucket!r}")
                if bucket < 2**31:  # 更大的桶号不可能出现在 integer 列里
                    bucket_list.append(bucket)
            if not bucket_list:
                return []
        if limit == 0:
            return []
        now = self._clock.now()
        until, until_off = split_dt(now + timedelta(seconds=lease))
        params: dict[str, Any] = {
            "now": now,
            "limit": limit,
            "claimant": claimant,
            "until": until,
            "until_off": until_off,
            "task_ids": ids,
            "buckets": bucket_list,
        }
        text = self._sql.claim(ids is not None, bucket_list is not None)
        with self._connection() as conn:
            rows = conn.execute(text, params).fetchall()
        # RETURNING 不保证顺序：按认领时用的同一键 (enqueued_at, command_id) 排好再交出。
        rows.sort(key=lambda row: (row[-1], row[0]))
        return [command_from_row(row[:-1]) for row in rows]

    def complete_command(self, command_id: str, claimant: str) -> bool:
        if not isinstance(command_id, str) or not isinstance(claimant, str):
            return False
        if "\x00" in command_id or "\x00" in claimant:
            return False
        at, at_off = split_dt(self._clock.now())
        params = {"command_id": command_id, "claimant": claimant, "at": at, "at_off": at_off}
        with self._connection() as conn:
            return conn.execute(self._sql.complete, params).fetchone() is not None

    def release_command(self, command_id: str, claimant: str) -> bool:
        if not isinstance(command_id, str) or not isinstance(claimant, str):
            return False
        if "\x00" in command_id or "\x00" in claimant:
            return False
        params = {"command_id": command_id, "claimant": claimant, "channel": self._channel}
        with self._connection() as conn:
            return conn.execute(self._sql.release, params).fetchone() is not None

    # -- instant commands (beyond the TaskStore contract) ---------------------------------------------

    def _get_listener(self) -> CommandListener:
        self._check_open()
        with self._listener_lock:
            if self._listener is None:
                kwargs = dict(self._connect_kwargs)
                kwargs["application_name"] = f"{kwargs.get('application_name', 'chongming-task')}:listen"
                self._listener = CommandListener(self._dsn, kwargs, self._channel)
            return self._listener

    def listen(self, target: NoticeCallback | threading.Event) -> Callable[[], None]:
        """有新指令（submit_command / release_command）时立刻通知：调用回调，或置位 Event。

        用一条专用连接 LISTEN（不占连接池）。回调在后台线程里执行，参数是 ``CommandNotice``；
        参数为 None 表示监听连接刚重连、期间的通知可能漏了，应补一次轮询。通知只是提示，
        指令仍要用 ``claim_commands`` 取；轮询照常保留作兜底。返回值是取消订阅的函数。

        会等监听真正生效（最多 connect_timeout）再返回；数据库暂时连不上时不报错，后台会一直重连。
        """
        if not isinstance(target, threading.Event) and not callable(target):
            raise ConfigurationError("listen() 需要一个回调函数或 threading.Event")
        listener = self._get_listener()
        unsubscribe = listener.add(target)
        if not listener.start(self._connect_timeout):
            logger.warning(
                "指令监听 %s 秒内没有建立，后台继续重连；在此之前靠轮询兜底", self._connect_timeout
            )
        return unsubscribe

    def wait_for_commands(self, timeout: float | None) -> bool:
        """阻塞到有新指令的通知（返回 True）或超时（返回 False）。

        按线程记账：本线程上次调用之后到达的通知不会丢——"取指令 → wait_for_commands → 取指令"
        的循环里，取指令期间到达的通知会让下一次等待立刻返回。超时按真实时间计（这是网络等待）。
        首次调用会先建立监听连接（最多等 connect_timeout，之后才开始计 timeout）；数据库连不上时
        等满 timeout 返回 False（轮询兜底）。
        """
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0
        ):
            raise ConfigurationError(f"timeout 必须是非负秒数或 None，收到 {timeout!r}")
        listener = self._get_listener()
        started = time.monotonic()
        if not listener.started:
            # 第一次调用：等监听真正生效再返回，否则紧接着提交的指令的通知会落空。
            listener.start(self._connect_timeout)
            started = time.monotonic()
        else:
            listener.start(0 if timeout is None else min(timeout, self._connect_timeout))
        remaining = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        return listener.wait(remaining)

    @property
    def listening(self) -> bool:
        """指令监听当前是否生效。"""
        listener = self._listener
        return listener is not None and listener.listening

    # -- membership -----------------------------------------------------------------------------------

    def publish_node(self, record: NodeRecord) -> None:
        params = node_params(check_node_record(record))
        try:
            with self._connection() as conn:
                conn.execute(self._sql.publish_node, params)
        except StoreError as exc:
            raise self._membership_error(exc) from exc.__cause__

    def list_nodes(self) -> list[NodeRecord]:
        def run(conn: Conn) -> list[NodeRecord]:
            return [node_from_row(row) for row in conn.execute(self._sql.list_nodes).fetchall()]

        try:
            return self._read(run)
        except StoreError as exc:
            raise self._membership_error(exc) from exc.__cause__

    def remove_node(self, owner: str) -> bool:
        check_node_owner(owner)
        try:
            with self._connection() as conn:
                return conn.execute(self._sql.remove_node, [owner]).fetchone() is not None
        except StoreError as exc:
            raise self._membership_error(exc) from exc.__cause__

    # -- upkeep ---------------------------------------------------------------------------------------

    def prune(self, keep_terminal: int) -> int:
        if isinstance(keep_terminal, bool) or not isinstance(keep_terminal, int) or keep_terminal < 0:
            raise ConfigurationError(f"keep_terminal 必须是非负整数，收到 {keep_terminal!r}")
        params = {"terminal": _TERMINAL, "keep": keep_terminal}
        with self._connection() as conn:
            row = conn.execute(self._sql.prune, params).fetchone()
        return 0 if row is None else int(row[0])

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        listener = self._listener
        if listener is not None:
            listener.stop()
        self._pool.close()


__all__ = ["PostgresTaskStore", "channel_for", "redact"]
