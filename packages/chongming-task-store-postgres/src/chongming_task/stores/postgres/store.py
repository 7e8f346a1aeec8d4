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
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from functools import partial
from typing import Any, ClassVar, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from chongming_task.clock import SYSTEM_CLOCK, Clock
from chongming_task.core.storage import checks
from chongming_task.core.storage import values as v
from chongming_task.core.storage.claiming import ClaimStart, QueuedClaim
from chongming_task.core.storage.contract import ArchiveWrite, TaskStore, prepare_batch
from chongming_task.core.storage.opening import (
    CreateSchema,
    OpensReadonly,
    SchemaMissing,
    SchemaPrivilegeError,
    check_opening,
)
from chongming_task.core.storage.retention import RetentionByModule, RetentionModule
from chongming_task.core.version import NODE_FEATURE_LEVEL
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
from chongming_task.stores.postgres import _archive, _claim, _logs, _partitions, _schema, _sql
from chongming_task.stores.postgres._codec import (
    SNAPSHOTS,
    TASK_COLUMNS,
    TRANSITIONS,
    array_literal,
    check_text,
    command_from_row,
    json_text,
    node_from_row,
    node_params,
    snapshot_from_row,
    split_dt,
    task_params,
    transition_from_row,
)
from chongming_task.stores.postgres._deadline import Deadlines, socket_inode
from chongming_task.stores.postgres._listener import CommandListener, NoticeCallback
from chongming_task.stores.postgres._sql import rows_param
from chongming_task.stores.postgres._sql import transition_params as _transition_params

logger = logging.getLogger("chongming_task.stores.postgres")

T = TypeVar("T")
Conn = psycopg.Connection[Any]
# 一条准备好的写语句：(SQL, 参数, 判定)。判定看返回行决定这一项成功（None）还是它自己的异常。
_Prepared = tuple[str, dict[str, Any], Callable[[Conn, Any], TaskError | None]]


def _duplicate(task_id: str) -> DuplicateTaskId:
    return DuplicateTaskId(f"task_id {task_id!r} 已存在；想再跑一次请换一个 task_id 提交")


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


_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
# 不写成 "postgresql://用户:口令@…"：那正是口令遮盖要找的模式，提示本身会被遮成 ***。
_DSN_FORMAT = "postgresql://用户@主机:端口/库名?schema=名字（有口令时写成 用户:口令@主机）"


def _dsn_problem(dsn: str) -> str | None:
    """连接串本身的写法问题（不连接）。返回原因，写法没问题时返回 None。

    为什么在连接之前查（issue 16.7 / 16.13）：驱动对这些问题的报错常常是"解析主机失败"之类，
    再配上"请确认数据库在运行"，把人引向排查服务器，而问题在连接串本身。
    """
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        text = str(exc).strip()
        if "IPv6" in text:
            return "IPv6 地址的方括号没有配对"
        if "percent-encoded" in text:
            return "有不完整的百分号转义（% 后面必须是两位十六进制数，口令里的 % 要写成 %25）"
        if "invalid URI query parameter" in text:
            return f"有 libpq 不认识的参数（{text[:80]}）"
        return f"libpq 无法解析它（{text[:80]}）"
    if dsn.startswith(("postgresql://", "postgres://")):
        try:
            port: object = urlsplit(dsn).port
        except ValueError:
            return "端口必须是 1-65535 的数字"
        if port == 0:
            return "端口必须是 1-65535 的数字"
    for value in str(params.get("port") or "").split(","):
        if value and not (value.isdigit() and 1 <= int(value) <= 65535):
            return "端口必须是 1-65535 的数字"
    sslmode = params.get("sslmode")
    if sslmode is not None and sslmode not in _SSLMODES:
        return f"sslmode 只能是 {' / '.join(_SSLMODES)}"
    return None


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


class StoreNoReply(StoreError):
    """客户端期限到了还没有收到服务器的回复（连接已被切断）。"""


def _keepalive_defaults(
    dsn: str, connect_kwargs: Mapping[str, Any] | None, network_timeout: float | None
) -> dict[str, Any]:
    """TCP keepalive 与 tcp_user_timeout 的默认值：让内核也能发现真正断掉的链路（半开连接、被丢包的分区）。

    连接串或 connect_kwargs 里已有同名参数就不给默认值。tcp_user_timeout 需要 libpq 12 及以上。
    """
    try:
        given = set(conninfo_to_dict(dsn))
    except psycopg.Error:
        given = set()
    given |= set(connect_kwargs or ())
    defaults: dict[str, Any] = {
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
    }
    if network_timeout is not None and psycopg.pq.version() >= 120000:
        defaults["tcp_user_timeout"] = math.ceil(network_timeout * 1000)
    return {key: value for key, value in defaults.items() if key not in given}


def _session_options(statement_ms: int | None, network_timeout: float | None) -> str:
    """连接池会话的服务器端上限（libpq ``options``）。

    * ``statement_timeout``：单条语句（含等锁）的上限。
    * ``idle_in_transaction_session_timeout`` = ``network_timeout``：本库的事务都短、由客户端驱动，
      一个会话在事务里空等得比客户端自己等回复的上限还久，客户端就已经死了或放弃了（网络分区：中间设备
      让服务器那一侧的 TCP 连接一直活着，服务器自己永远发现不了）。到期由服务器结束会话、放掉行锁，
      否则同伴对这些任务的 reconcile / 控制要一直等到 TCP keepalive（几个小时）。活着的客户端在事务里
      从不空等这么久：它等回复最多 ``network_timeout``，到期自己就切断连接了。

    只给连接池的会话：建表与维护（``_maintenance_connection``，整块归档分区）用的独立连接在事务里
    要做客户端的工作（写归档文件），不适用这条上限。
    """
    options = []
    if statement_ms is not None:
        options.append(f"-c statement_timeout={statement_ms}")
    if network_timeout is not None:
        options.append(f"-c idle_in_transaction_session_timeout={math.ceil(network_timeout * 1000)}")
    return " ".join(options)


_IDLE = psycopg.pq.TransactionStatus.IDLE


_CURSOR = "_chongming_cursor"
_RAW_CURSOR = "_chongming_raw_cursor"
_SOCKET = "_chongming_socket"  # (描述符, inode)：见 PostgresTaskStore._arm


def _cursor(conn: Conn) -> psycopg.Cursor[Any]:
    """这条连接上复用的游标（挂在连接对象上，随连接一起被连接池丢弃）。

    为什么：``conn.execute`` 每次新建一个游标，连带一份适配器表的副本和一个 Transformer，参数的 dumper、
    结果列的 loader 都得重新查一遍——一条几十个参数、几十列结果的写语句（建任务、终态 + 认领并开始）
    每次多 10–30 µs 客户端 CPU，入队与 worker 每个任务各一条。复用同一个游标，这些按类型缓存住。
    为什么安全：连接一次只借给一个调用方（``_connection``），游标随之只有一个线程在用；每次 execute 都
    重置游标的结果，语句出错之后下一次照常可用。只给"执行一条语句、当场取完结果"的路径用：取结果之前
    在同一游标上再执行会冲掉前一个结果（判定里的补充查询仍用 ``conn.execute``）。
    """
    cursor: psycopg.Cursor[Any] | None = getattr(conn, _CURSOR, None)
    if cursor is None or cursor.closed:
        cursor = conn.cursor()
        setattr(conn, _CURSOR, cursor)
    return cursor


def _execute_hot(conn: Conn, text: str, params: Any) -> psycopg.Cursor[Any]:
    """热路径上一条语句的执行（建任务、save、认领并开始、终态 + 认领并开始）：在复用的游标上执行，
    并且**第一次执行就做成服务器端预备语句**（``prepare=True``）。

    为什么（issue 19，dur17）：psycopg 默认一条语句执行到第 5 次才 PREPARE（``prepare_threshold``），之前
    每次都是未命名语句，服务器每次重新解析、规划；预备之后 PostgreSQL 再按 ``plan_cache_mode = auto`` 先做
    5 次定制计划、第 6 次起比较通用计划。于是每条新连接、每种语句形状要规划约 11 次——serve 那条
    "终态 + 认领并开始"一次规划约 0.6–1.2 ms，基准一轮 1,000 个任务里规划 33 次。第一次就预备，前 5 次
    未命名执行的规划省掉，每条连接、每种形状规划 6 次。计划怎样选不变：仍是服务器的 auto 规则在
    5 次定制计划之后决定用不用通用计划（没有强制通用计划：dur15 见过没有统计信息时的坏计划，
    那条语句的防护见 ``_claim._recheck``）。这几条语句的文本是有限的几种（按 schema 与变体缓存），
    不会撑满 psycopg 每条连接的预备语句缓存（默认 100 条，满了按最近最少使用逐出）。"""
    return _cursor(conn).execute(text, params, prepare=True)


PREPARED_BATCH_ITEMS = 8
"""组提交的一批（``Sql.write_batch`` / ``Sql.save_batch``）不多于这么多项时，第一次执行就预备。"""


def _execute_batch(conn: Conn, text: str, values: list[Any], items: int) -> psycopg.RawCursor[Any]:
    """组提交的一条批量语句（``$n`` 编号，见 ``_sql.numbered``）：在这条连接上复用的 ``RawCursor`` 上执行，
    项数不多时第一次执行就做成服务器端预备语句。

    为什么（issue 17，pg18）：Controller 路径上每个任务平均约 0.8 条这种语句（``write_batch`` 的"1 个建任务 +
    2 项 save"一种形状就占六成），原来每次 ``psycopg.RawCursor(conn)`` 新建一个游标（连带一份适配器表
    与 Transformer，约 100 个参数的 dumper 每次重新查），并且按 psycopg 的默认门槛执行到第 5 次才预备：每条
    新连接、每种形状先有 4 次未命名执行，服务器每次从头解析、分析、规划这条五六千字节的语句（一次约 1–2 ms）。
    复用游标的理由与 ``_cursor`` 相同（连接一次只借给一个调用方、当场取完结果）。预备只给项数不多的形状：
    形状按 (建任务数, save 数) 各是一段文本，项数 ≤ ``PREPARED_BATCH_ITEMS`` 的至多 36 + 7 种，加上
    ``_execute_hot`` 的几条，仍在 psycopg 每条连接的预备缓存（100 条）之内；更大的批（罕见的形状）仍按
    psycopg 的默认门槛，不会把常用的预备语句挤出缓存。``prepare_threshold=None`` 时 psycopg 一条也不预备。"""
    cursor: psycopg.RawCursor[Any] | None = getattr(conn, _RAW_CURSOR, None)
    if cursor is None or cursor.closed:
        cursor = psycopg.RawCursor(conn)
        setattr(conn, _RAW_CURSOR, cursor)
    return cursor.execute(text, values, prepare=True if items <= PREPARED_BATCH_ITEMS else None)


def _discard_if_stale_plans(conn: Conn, exc: psycopg.Error) -> None:
    """连接上已预备的语句的结果类型被改表改掉了（``cached plan must not change result type``，
    SQLSTATE 0A000）：关掉这条连接，让池丢掉它、下次借一条新的。

    为什么：状态列从 text 换成域（``_schema.domain_upgrade_statements``，别的进程在它自己打开时换）之后，
    这条连接上每条结果里带这几列的预备语句都会这样失败——psycopg 不把失败的语句移出它的预备缓存，不处理
    的话同一条连接上以后每次都失败，直到连接到龄被池换掉。错误发生在绑定参数时，语句没有执行，所以本次调用
    照常报 StoreError（调用方按存储故障处理），之后的调用用新连接、重新预备，就好了。"""
    if isinstance(exc, pg_errors.FeatureNotSupported) and "cached plan must not change result type" in str(
        exc
    ):
        with contextlib.suppress(Exception):
            conn.close()


def _rollback_quietly(conn: Conn) -> None:
    """调用途中出错：连接若停在事务里就回滚（与 ``with conn:`` 相同）；回滚本身出错只记日志，
    不掩盖原来的异常。"""
    if conn.closed or conn.pgconn.transaction_status == _IDLE:
        return
    try:
        conn.rollback()
    except Exception as exc:
        logger.warning("调用出错后回滚连接失败（已忽略）：%s", exc)


def _data_error(exc: BaseException) -> ConfigurationError:
    if isinstance(exc, pg_errors.NumericValueOutOfRange):
        return ConfigurationError(f"数值超出 PostgreSQL 列的范围（整数列为 64 位，桶号为 32 位）：{exc}")
    if isinstance(exc, UnicodeEncodeError):
        return ConfigurationError(f"字符串里有无法编码为 UTF-8 的字符（例如孤立的代理项）：{exc}")
    return ConfigurationError(
        f"PostgreSQL 拒绝了这份数据（请检查字符串里是否有 NUL 等无法保存的字符）：{exc}"
    )


# -- the store ---------------------------------------------------------------------------------------


# write_many 里一项通过检查的 create：(在 creates 里的下标, 快照, 迁移记录, 任务行参数, 迁移记录行参数)。
_FreshCreate = tuple[int, TaskSnapshot, Sequence[Transition], dict[str, Any], list[dict[str, Any]]]


class PostgresTaskStore(OpensReadonly, RetentionByModule, TaskStore):
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
    * ``network_timeout``：客户端等服务器回复最多多久（默认 ``statement_timeout + 1`` 秒；
      ``statement_timeout`` 为 None 时默认不限）。网络分区时语句到不了服务器，
      服务器端的 statement_timeout 不起作用：到期由看门线程切断这条连接，调用抛 StoreError
      （写入的结果未知，写穿层会读回再收敛）。一次调用的上界因此是
      ``pool_timeout + network_timeout``（docs/distributed.md §7.1）。
      同时默认开启 TCP keepalive 与 ``tcp_user_timeout``，连接串或 ``connect_kwargs``
      里给了同名参数就以它们为准。连接池会话的 ``idle_in_transaction_session_timeout`` 也等于它：
      分区时留在服务器上的事务由服务器结束、放掉行锁（见 ``_session_options`` 与 docs/distributed.md §7.5）。
    * ``clock``：写进指令与租约的"现在"（测试注入 FakeClock）。
    * ``readonly``：只读打开——不建 schema、不建表、不补建，每条连接都是
      ``default_transaction_read_only``（写方法一律失败）；schema 里没有 chongming-task 的表 →
      ``SchemaMissing``。
    * ``create_schema``：``"auto"``（默认：只在 schema 不存在或里面一张表也没有时建表）、``"always"``
      （schema 里有别的表也建）、``"never"``（从不建表，表由 DBA 按 ``schema_sql()`` 建）。
      约定见 ``chongming_task.core.storage.opening``。
    """

    _retention: ClassVar[RetentionModule] = _archive  # 归档保留四个方法的实现（见 RetentionByModule）
    # 单个提交的 create 也经组提交（write_many：与排着的 starting / 终态一条语句、一个事务），写者只有一个。
    # 两者要一起：写者有四个时几乎从不排队（提交线程与两个执行槽至多三个同时写），create 总是自己一批，合不进
    # 任何提交；一个写者时，一批在途、别的写排着，下一批把 create 与排着的 save 一起写完——bench ours 每任务
    # 提交 2.3 → 1.1 次，服务器 CPU 约 −28 %（bench/README.md pg11 一节）。写者一个，Controller 也随之由提交
    # 线程就地启动拿到额度的任务（Controller._start_on_submit）：starting 与下一个 create 排在同一条链上。
    group_commit_writers: ClassVar[int] = 1
    group_commit_creates: ClassVar[bool] = True

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
        readonly: bool = False,
        create_schema: CreateSchema = "auto",
        network_timeout: float | None = None,
    ) -> None:
        if not isinstance(dsn, str) or not dsn.strip():
            raise ConfigurationError(
                f"PostgresTaskStore 需要连接串，例如 postgresql://user:pw@host:5432/db，收到 {dsn!r}"
            )
        problem = _dsn_problem(dsn)
        if problem is not None:
            raise ConfigurationError(
                f"PostgreSQL 连接串 {redact(dsn)} 写法不对：{problem}；请按 {_DSN_FORMAT} 的格式改正"
            )
        self._schema = _validate_schema_name(schema)
        self._create_schema = check_opening(readonly, create_schema)
        self._readonly = readonly
        min_size = _positive_int("min_size", min_size, minimum=0)
        max_size = _positive_int("max_size", max_size, minimum=max(1, min_size))
        self._connect_timeout = checks.check_positive_seconds("connect_timeout", connect_timeout)
        self._pool_timeout = checks.check_positive_seconds("pool_timeout", pool_timeout)
        reconnect_timeout = checks.check_positive_seconds("reconnect_timeout", reconnect_timeout)
        statement_ms = (
            None
            if statement_timeout is None
            else math.ceil(1000 * checks.check_positive_seconds("statement_timeout", statement_timeout))
        )
        if network_timeout is not None:
            self._network_timeout: float | None = checks.check_positive_seconds(
                "network_timeout", network_timeout
            )
        else:
            # 比服务器端的上限多 1 秒：服务器正常时总是它先到、报错更清楚；只有回复到不了时才由客户端切断。
            self._network_timeout = None if statement_ms is None else statement_ms / 1000 + 1.0
        self._deadlines = Deadlines(f"chongming-task:{schema}")
        self._clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._dsn = dsn
        self._display = redact(dsn)
        self._channel = channel_for(self._schema)
        self._sql = _sql.Sql(self._schema)
        self._log_sql = _logs.LogSql(self._sql.s)
        self._archive_sql = _archive.ArchiveSql(self._schema, self._sql.task_cols)
        self._closed = False
        self._close_lock = threading.Lock()
        self._listener: CommandListener | None = None
        self._listener_lock = threading.Lock()
        # libpq 的 connect_timeout 是整数秒，且小于 2 会被当作 2。
        self._connect_kwargs: dict[str, Any] = {
            "connect_timeout": max(2, math.ceil(self._connect_timeout)),
            "application_name": application_name,
        }
        self._connect_kwargs.update(_keepalive_defaults(dsn, connect_kwargs, self._network_timeout))
        if connect_kwargs:
            self._connect_kwargs.update(connect_kwargs)
        pool_kwargs = dict(self._connect_kwargs)
        # autocommit：每个方法都是一条自成事务的语句，省掉 BEGIN / COMMIT 两次往返；
        # 需要多条语句原子执行的地方显式 conn.transaction()。
        pool_kwargs["autocommit"] = True
        options = _session_options(statement_ms, self._network_timeout)
        if options and "options" not in dsn and "options" not in pool_kwargs:
            # 连接串或 connect_kwargs 里已有 options（例如 -c statement_timeout=…）就尊重它，不覆盖。
            pool_kwargs["options"] = options
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
                # 只读打开：每条连接都设成只读事务，哪条代码路径都写不进去（服务器拒绝）。
                configure=self._make_readonly if readonly else None,
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
            "network_timeout": float,
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
    def migration_sql(schema: str = _schema.DEFAULT_SCHEMA, from_version: int = 1) -> str:
        """把第 ``from_version`` 版的表结构升级到本程序版本的 SQL（含事务），交给表的属主执行。"""
        if isinstance(from_version, bool) or not isinstance(from_version, int):
            raise ConfigurationError(f"from_version 必须是整数，收到 {from_version!r}")
        if not 1 <= from_version < _schema.SCHEMA_VERSION:
            raise ConfigurationError(
                f"from_version 必须在 1..{_schema.SCHEMA_VERSION - 1} 之间"
                f"（当前版本是 {_schema.SCHEMA_VERSION}），收到 {from_version}"
            )
        return _schema.migration_sql(_validate_schema_name(schema), from_version)

    @staticmethod
    def grant_sql(schema: str, role: str) -> str:
        """给只读写、不建表的角色授权的 SQL（在 schema_sql 之后执行）。"""
        return _schema.grant_sql(_validate_schema_name(schema), role)

    @property
    def schema(self) -> str:
        return self._schema

    @staticmethod
    def _make_readonly(conn: Conn) -> None:
        conn.execute("SET default_transaction_read_only = on")

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
            if self._readonly:
                self._make_readonly(conn)
            try:
                self._check_schema_usage(conn)
            except psycopg.Error as exc:
                raise StoreError(
                    f"读取 PostgreSQL 系统目录失败（{self._display}）：{str(exc).strip()}"
                ) from exc
            try:
                version = self._read_version(conn)
                if version is None:
                    self._refuse_creation(conn)
                    with conn.transaction():
                        _schema.lock_ddl(conn, self._schema)
                        version = self._read_version(conn)
                        if version is None:
                            self._create_tables(conn)
                            version = _schema.SCHEMA_VERSION
                if version < _schema.SCHEMA_VERSION and not self._readonly:
                    version = self._migrate(conn, version)
                if (
                    version == _schema.SCHEMA_VERSION
                    and self._create_schema != "never"
                    and not self._has_nodes_table(conn)
                ):
                    self._add_nodes_table(conn)
                if (
                    version == _schema.SCHEMA_VERSION
                    and self._create_schema != "never"
                    and not _logs.has_tables(conn, self._log_sql)
                ):
                    self._add_logs_table(conn)
                if (
                    version == _schema.SCHEMA_VERSION
                    and self._create_schema != "never"
                    and not self._readonly
                ):
                    _partitions.ensure_ahead_or_warn(conn, self._schema, at_open=True)
                if version == _schema.SCHEMA_VERSION:
                    self._add_later_columns(conn)
                if (
                    version == _schema.SCHEMA_VERSION
                    and self._create_schema != "never"
                    and not self._readonly
                ):
                    self._slim_indexes(conn)
                    self._typed_statuses(conn)
            except pg_errors.InsufficientPrivilege as exc:
                raise self._privilege_error(conn, exc) from exc
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
        if version < _schema.SCHEMA_VERSION and not self._readonly:
            raise StoreError(
                f"PostgreSQL schema {self._schema!r} 的表结构版本是 {version}，低于本程序的 "
                f"{_schema.SCHEMA_VERSION}，且没有可用的迁移路径；请联系维护者或换一个新 schema。"
            )

    def _migrate(self, conn: Conn, version: int) -> int:
        """把旧版本的 schema 原地升级到 ``SCHEMA_VERSION``（咨询锁下、一个事务；数据不搬，见 ``_schema``）。

        ``create_schema="never"`` 或角色不是表的属主 → SchemaPrivilegeError，说明要运行什么。
        """
        if self._create_schema == "never":
            raise self._migration_error(conn, version, "create_schema='never'：本程序不改表结构")
        try:
            with conn.transaction():
                _schema.lock_ddl(conn, self._schema)
                current = self._read_version(conn)
                if current is None or current >= _schema.SCHEMA_VERSION:
                    return current if current is not None else version
                steps = _schema.migration_statements(self._schema)
                for step in range(current, _schema.SCHEMA_VERSION):
                    for statement in steps[step]:
                        conn.execute(statement)
        except pg_errors.InsufficientPrivilege as exc:
            raise self._migration_error(conn, version, (str(exc).strip().splitlines() or [""])[0]) from exc
        logger.info(
            "schema %r 的表结构已从第 %d 版升级到第 %d 版", self._schema, version, _schema.SCHEMA_VERSION
        )
        return _schema.SCHEMA_VERSION

    def _migration_error(self, conn: Conn, version: int, why: str) -> SchemaPrivilegeError:
        role = "?"
        with contextlib.suppress(psycopg.Error):
            role = conn.info.user
        sql = _schema.migration_sql(self._schema, version)
        return SchemaPrivilegeError(
            f"PostgreSQL schema {self._schema!r} 的表结构是第 {version} 版，"
            f"需要升级到第 {_schema.SCHEMA_VERSION} 版（迁移记录表改为按月分区），"
            f"而角色 {role!r} 不能改表结构（{why}）："
            f"请让表的属主执行 chongming-task schema-sql --migrate-from {version} 打印的 SQL，然后再启动"
            f"\n升级 SQL 也可以在代码里取：PostgresTaskStore.migration_sql({self._schema!r}, {version})",
            ddl=sql,
            detail=_schema.grant_sql(self._schema, role),
        )

    def _maintenance_connection(self) -> Conn:
        """维护操作（整块归档分区）用的独立连接：它的事务比一次普通调用长，不占连接池、不受单次调用期限约束。"""
        self._check_open()
        try:
            return psycopg.connect(self._dsn, autocommit=True, **self._connect_kwargs)
        except psycopg.Error as exc:
            raise StoreError(f"连不上 PostgreSQL（{self._display}）：{str(exc).strip()}") from exc

    def _refuse_creation(self, conn: Conn) -> None:
        """schema 里没有我们的表：按 readonly / create_schema 决定能不能建（见 ``core.storage.opening``）。

        只读与 ``"never"`` 一律不建——``?schema=拼错的名字`` 不能悄悄建出一个新 schema；``"auto"`` 只在
        schema 不存在或一张表也没有时建，里面已有别的应用的表就要调用方明确说"建在这里"。
        """
        ddl = _schema.schema_sql(self._schema)
        if self._create_schema == "never":
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s)", [self._schema]
            )
            found = row.fetchone()
            what = " 里没有 chongming-task 的表" if found and found[0] else " 不存在"
            raise SchemaMissing(
                f"PostgreSQL schema {self._schema!r}{what}（{self._display}）：请检查 ?schema= 的拼写；"
                "新部署的表由写入方（run / chongming-task init）创建，"
                "或由 DBA 执行 chongming-task schema-sql 打印的建表 SQL",
                ddl=ddl,
            )
        if self._create_schema == "auto":
            rows = conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f') ORDER BY c.relname LIMIT 4",
                [self._schema],
            ).fetchall()
            if rows:
                names = ", ".join(str(r[0]) for r in rows[:3]) + (" 等" if len(rows) > 3 else "")
                raise SchemaMissing(
                    f"PostgreSQL schema {self._schema!r} 里已有别的表（{names}），没有 chongming-task 的表："
                    "确实要把任务表建在这里，请先运行 chongming-task init"
                    "（代码里传 create_schema='always'），否则换一个 schema",
                    ddl=ddl,
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
                _schema.lock_ddl(conn, self._schema)
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

    def _add_later_columns(self, conn: Conn) -> None:
        """持久任务加入之前建的 schema 缺配方列：可写打开时补（咨询锁下，幂等）；只读 / 不许建表时报错——
        每条读快照的语句都要选这一列。"""
        lacking = _claim.missing_columns(conn, self._schema)
        if not lacking:
            return
        if self._readonly or self._create_schema == "never":
            raise SchemaMissing(
                f"PostgreSQL schema {self._schema!r} 是持久任务加入之前建的，"
                f"tasks 表缺列 {', '.join(lacking)}："
                "只读（或不许建表）的打开不会补列；请用可写方式打开一次（chongming-task init），"
                "或由 DBA 执行 chongming-task schema-sql 里的 ALTER TABLE 语句",
                ddl=";\n".join(_schema.later_ddl_statements(self._schema)),
            )
        with conn.transaction():
            _schema.lock_ddl(conn, self._schema)
            _claim.add_later_columns(conn, self._schema)

    def _slim_indexes(self, conn: Conn) -> None:
        """tasks 上的索引还是旧形状（全量的状态 / 标签索引、租约与结束时间的索引）时换成部分索引
        （``_schema.slim_index_statements``）：可写打开时在咨询锁下、一个事务里换；只读与不许建表的打开不动。

        只影响快慢，不影响结果：没有权限（不是表的属主）时只告警，任务读写照常。"""
        if self._upgrade_in_place(
            conn,
            lambda: bool(_schema.outdated_indexes(conn, self._schema)),
            _schema.index_upgrade_statements(self._schema),
            "schema %r 的 tasks 表还是旧的索引形状，而角色 %r 换不了（%s）：任务读写照常，"
            "只是每次写入多维护几个索引；请让表的属主执行一次：%s",
        ):
            logger.info(
                "schema %r 的 tasks 表已换成部分索引（%s）", self._schema, ", ".join(_schema.SLIM_INDEXES)
            )

    def _typed_statuses(self, conn: Conn) -> None:
        """状态与版本列还是"text / bigint + 表上的 CHECK"（域之前建的库）时换成域类型
        （``_schema.domain_upgrade_statements``）：可写打开时在咨询锁下、一个事务里换；只读与不许建表的打开不动。

        与换索引一样不升版本号：同样的值被接受、同样的值被拒绝（同一个 SQLSTATE），旧包新开的连接
        照常读写换过的库（结果里的列类型，PostgreSQL 报的是域的基础类型），所以只影响快慢（每条写
        tasks / transitions 的语句少一次约束表达式的重新编译，见 ``_codec.PostgresDialect``）。
        没有权限（不是表的属主）时只告警，旧的 CHECK 照样保护数据。正在运行的旧版本进程换完之后读不了
        （每条已预备的语句都失败到连接到龄），所以升级前先停掉它们，见 ``domain_upgrade_statements``；
        ``nodes`` 里还有活着的旧代码节点（``info.feature_level`` 不到 1）时这次不换，告警说是哪些节点，
        等它们停掉（或心跳过期）之后下一次可写打开再换——滚动升级时先上线的新进程不会打断还没换下的旧进程。"""
        if self._upgrade_in_place(
            conn,
            lambda: bool(_schema.untyped_columns(conn, self._schema)),
            _schema.domain_upgrade_statements(self._schema),
            "schema %r 的状态列还是带 CHECK 约束的 text，而角色 %r 换不了域类型（%s）：任务读写照常，"
            "只是每条写入多编译一次约束；请在停掉旧进程之后让表的属主执行一次：%s",
            waits_for_old_nodes="schema %r 的状态列还是带 CHECK 约束的 text，但还有旧版本的节点活着（%s）："
            "现在换成域类型会让它们已预备的读语句全部失败，所以这次不换，任务读写照常。等这些节点停掉（或心跳"
            "过期）之后，下一次可写打开会自动换；也可以在停掉它们之后让表的属主执行：%s",
        ):
            columns = ", ".join(f"{table}.{column}" for table, column, _ in _schema.TYPED_COLUMNS)
            logger.info("schema %r 的状态与版本列已换成域类型（%s）", self._schema, columns)

    def _upgrade_in_place(
        self,
        conn: Conn,
        needed: Callable[[], bool],
        statements: Sequence[str],
        refused: str,
        *,
        waits_for_old_nodes: str | None = None,
    ) -> bool:
        """不升版本号、只影响快慢的原地升级（换索引、换域类型）共用的做法：需要时在咨询锁下、一个事务里
        重查一遍再执行 ``statements``（两个进程同时打开只有一个真的做）。返回这次是否做了。

        没有权限（不是表的属主，或连到了只读的备库）时不拦着打开：按 ``refused``（参数依次是 schema、角色、
        错误的第一行、要由属主执行的语句）告警一次，返回 False。

        ``waits_for_old_nodes``：会让**运行中的旧代码**出错的升级（换域类型）给出的告警模板（参数依次是
        schema、活着的旧节点、语句）。``nodes`` 里还有 ``info.feature_level`` 低于 ``NODE_FEATURE_LEVEL`` 的
        活节点时这次不做，按它告警，返回 False。"""
        if not needed():
            return False
        if waits_for_old_nodes is not None:
            old_nodes = _schema.live_nodes_below(conn, self._schema, NODE_FEATURE_LEVEL, self._clock.now())
            if old_nodes:
                logger.warning(
                    waits_for_old_nodes, self._schema, ", ".join(old_nodes), ";\n".join(statements)
                )
                return False
        try:
            with conn.transaction():
                _schema.lock_ddl(conn, self._schema)
                if not needed():
                    return False
                for statement in statements:
                    conn.execute(statement)
        except (pg_errors.InsufficientPrivilege, pg_errors.ReadOnlySqlTransaction) as exc:
            logger.warning(
                refused,
                self._schema,
                conn.info.user,
                (str(exc).strip().splitlines() or [""])[0],
                ";\n".join(statements),
            )
            return False
        return True

    def _add_logs_table(self, conn: Conn) -> None:
        """给日志表加入之前建的 schema 补建日志表（咨询锁下；没有建表权限时只告警：日志写入会失败并按
        旁路写入失败处理，任务照常运行）。只读打开从不走到这里。"""
        try:
            with conn.transaction():
                _schema.lock_ddl(conn, self._schema)
                if not _logs.has_tables(conn, self._log_sql):
                    for statement in _logs.ddl_statements(self._sql.s):
                        conn.execute(statement)
        except pg_errors.InsufficientPrivilege:
            logger.warning(
                "schema %r 里缺任务日志表 task_logs / task_log_writers，而角色 %r 没有建表权限："
                "任务读写照常，任务日志不会持久化，直到有权限的账号执行 chongming-task schema-sql 里"
                "这两张表的建表语句",
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

    def _privilege_error(self, conn: Conn, exc: BaseException) -> SchemaPrivilegeError:
        """没有建表权限：第一行短——缺哪项权限、该运行什么；完整建表 SQL 在 ``ddl`` 属性里，不塞进消息。"""
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
            missing = f"schema {self._schema!r} 上的 CREATE 权限"
            grant = f"GRANT CREATE ON SCHEMA {q_schema} TO {q_role};"
        else:
            missing = f"数据库 {database!r} 上的 CREATE 权限（schema {self._schema!r} 还不存在）"
            grant = f"GRANT CREATE ON DATABASE {_schema.quote_ident(database)} TO {q_role};"
        # 第一行要短（命令行只显示第一行，≤ 300 字符）：缺什么、运行什么；schema 名只出现在 missing 里一次。
        message = (
            f"PostgreSQL 角色 {role!r} 没有建表权限，表还不存在：缺少{missing}；"
            f"请让有权限的账号执行 chongming-task schema-sql 打印的建表 SQL 再授权，或执行 {grant}"
            f"\n建表 SQL 也可以在代码里取：PostgresTaskStore.schema_sql({self._schema!r})"
            # 驱动的报错后面跟着出错语句的原文（LINE 1: CREATE TABLE …）：只留第一行。
            f"\n数据库报错：{(str(exc).strip().splitlines() or [''])[0]}"
            f"\n授权本角色读写（建表之后）：{' '.join(_schema.grant_sql(self._schema, role).split())}"
        )
        return SchemaPrivilegeError(
            message, ddl=_schema.schema_sql(self._schema), detail=_schema.grant_sql(self._schema, role)
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
            armed = self._arm(conn)
            try:
                try:
                    yield conn
                except BaseException:
                    _rollback_quietly(conn)
                    raise
                # 池里的连接是 autocommit：多语句事务都由 conn.transaction() 自己提交或回滚，平常退出时连接
                # 已是 IDLE，不必像 ``with conn:`` 那样每次调用都走一遍 commit()（加锁、造生成器，没有往返）。
                if conn.pgconn.transaction_status != _IDLE:
                    conn.commit()
            except psycopg.Error as exc:
                _discard_if_stale_plans(conn, exc)
                if armed is not None and armed[1].fired:
                    raise StoreNoReply(
                        f"{self._network_timeout:g} 秒内没有收到 PostgreSQL 的回复（{self._display}）："
                        "网络挂住或服务器无响应，连接已切断；若是写入，结果未知（会读回后再收敛）。"
                    ) from exc
                raise
            finally:
                if armed is not None:
                    self._deadlines.disarm(armed[0])
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
        except pg_errors.ReadOnlySqlTransaction as exc:
            raise StoreError(
                f"PostgresTaskStore（schema {self._schema!r}）是只读打开的（readonly=True）：不能写入；"
                "要写入请去掉 readonly"
            ) from exc
        except psycopg.Error as exc:
            raise StoreError(f"PostgreSQL 操作失败（{self._display}）：{str(exc).strip()}") from exc

    def _arm(self, conn: Conn) -> tuple[int, Any] | None:
        """给这次调用登记客户端期限（docs/distributed.md §7.1）；连接已坏时不登记，让语句自己失败。"""
        if self._network_timeout is None:
            return None
        try:
            fd = conn.pgconn.socket
        except psycopg.Error:
            return None
        # 套接字的 inode 按连接记一次（同一条连接的描述符与套接字不变）：每次调用一次 fstat 是一次让出 GIL 的
        # 系统调用，就在发语句之前——另一条执行槽线程趁机拿走 GIL，这条线程要等它跑完一段 Python 才发得出语句。
        known: tuple[int, int | None] | None = getattr(conn, _SOCKET, None)
        if known is None or known[0] != fd:
            known = (fd, socket_inode(fd))
            setattr(conn, _SOCKET, known)
        return self._deadlines.arm(fd, self._network_timeout, known[1])

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
            # PoolTimeout 也是 OperationalError，但它意味着已经等满了超时：再等一轮只会让调用方挂得更久；
            # 等回复等到了客户端上限（StoreNoReply）同理——上界是一次调用的，不因重试翻倍。
            if (
                not isinstance(cause, _CONNECTION_ERRORS)
                or isinstance(cause, PoolTimeout)
                or isinstance(exc, StoreNoReply)
                or self._closed
            ):
                raise
        logger.info("PostgreSQL 连接中断，重试一次只读操作")
        with self._connection() as conn:
            return fn(conn)

    # -- snapshots ------------------------------------------------------------------------------------

    def create(self, snapshot: TaskSnapshot, transitions: Sequence[Transition] = ()) -> None:
        self._run_one(self._create_statement(snapshot, transitions))

    def _save(self, request: v.SaveRequest) -> None:
        self._run_one(self._save_statement(request))

    def create_many(
        self, items: Sequence[tuple[TaskSnapshot, Sequence[Transition]]]
    ) -> list[TaskError | None]:
        """一次事务建一批任务（语义见 ``TaskStore.create_many``）。

        快路径：任务行与迁移记录各一次二进制 ``COPY``（``Sql.copy_tasks`` / ``copy_transitions``），放在一个
        SAVEPOINT 里。COPY 没有 ON CONFLICT：批里只要有一个 id 已存在，整条 COPY 以唯一约束冲突失败、
        什么也没写；这时回滚到 SAVEPOINT，改走按列数组 ``unnest`` 的那条语句（``Sql.create_many``）：已存在
        的 id 被跳过、不在 RETURNING 里，报成 DuplicateTaskId，它的迁移记录也不写。两条路写下的行相同；
        重复 id 只在"结果未知之后重试"这类少见情形出现，平常一批只走快路径。为什么用 COPY：十万个任务时
        ``INSERT … SELECT FROM unnest(…) ON CONFLICT … RETURNING`` 加上 ``jsonb_to_recordset`` 的迁移记录，
        客户端每任务约 20 µs（每列一个数组的编码、迁移记录的 JSON），服务器端也要逐行展开、转换；COPY 的
        二进制行由 psycopg 的 C 实现逐行编码，客户端约减半，服务器端也快一倍左右（bench/README.md）。
        同一批里重复的 id 以第一项为准，后面的不进语句。整批在一个事务里：事务失败时整批什么也没写
        （调用方按"结果未知"读回对照）。"""
        # 先逐项检查（检查不过的项是它自己的结果）；同一批里重复的 id 以第一项为准。只记 task_id → 下标，
        # 不为每项留元组与字典：一批一千个任务时那些临时容器活过整批，会被循环 GC 晋升到最老的一代、计入
        # "该做全量回收了"的账（十万个任务的 submit_many 因此多做几次全量扫描）。
        results: list[TaskError | None] = [None] * len(items)
        checked: list[TaskSnapshot | None] = [None] * len(items)
        first: dict[str, int] = {}
        for index, (snapshot, transitions) in enumerate(items):
            try:
                snapshot = checks.check_snapshot(snapshot)
                checks.check_transitions(snapshot.task_id, transitions)
            except TaskError as exc:
                results[index] = exc
                continue
            if snapshot.task_id in first:
                results[index] = _duplicate(snapshot.task_id)
                continue
            first[snapshot.task_id] = index
            checked[index] = snapshot
        # 按 task_id 排序编码、插入（与 _run_many 同理）：所有批量写按同一顺序拿唯一索引上的锁，不互相死锁。
        # 编码（JSON 值的校验）不过的项同样只是它自己的结果，不进事务。
        ordered: list[int] = []
        task_rows: list[tuple[Any, ...]] = []
        history: list[tuple[Any, ...]] = []
        for task_id in sorted(first):
            index = first[task_id]
            valid = checked[index]
            assert valid is not None
            try:
                row = _sql.copy_row(task_params(valid), _sql.TASK_COPY_JSONB)
                records = [
                    _sql.copy_row(TRANSITIONS.params(record), _sql.TRANSITION_COPY_JSONB)
                    for record in items[index][1]
                ]
            except TaskError as exc:
                results[index] = exc
                continue
            ordered.append(index)
            task_rows.append(row)
            history.extend(records)
        if not ordered:
            return results
        inserted: set[str] | None = None  # None：全部写进去了（快路径）
        with self._connection() as conn, conn.transaction():
            try:
                with conn.transaction(), conn.cursor() as cursor:  # SAVEPOINT：冲突时只撤销这两条 COPY
                    with cursor.copy(self._sql.copy_tasks) as copy:
                        copy.set_types(_sql.TASK_COPY_TYPES)
                        for task_row in task_rows:
                            copy.write_row(task_row)
                    if history:
                        with cursor.copy(self._sql.copy_transitions) as copy:
                            copy.set_types(_sql.TRANSITION_COPY_TYPES)
                            for history_row in history:
                                copy.write_row(history_row)
            except pg_errors.UniqueViolation:
                inserted = self._create_many_skipping_existing(
                    conn, [(checked[i], items[i][1]) for i in ordered]
                )
        created: list[TaskSnapshot] = []
        for index in ordered:
            valid = checked[index]
            assert valid is not None
            if inserted is not None and valid.task_id not in inserted:
                results[index] = _duplicate(valid.task_id)
            elif _claim.claimable(valid):
                created.append(valid)
        if created:
            # 其中待认领的持久任务：提交之后只通知 worker 一次（不是每行一次）。
            try:
                with self._connection() as conn:
                    _claim.notify_claimable(conn, self._channel, created)
            except StoreError as exc:  # 通知只是提示：丢了由 worker 的轮询兜底，不把已提交的建任务报成失败
                logger.warning("新建持久任务后通知 worker 失败（由轮询兜底）：%s", exc)
        return results

    def _create_many_skipping_existing(
        self, conn: Conn, items: Sequence[tuple[TaskSnapshot | None, Sequence[Transition]]]
    ) -> set[str]:
        """create_many 的慢路径（快路径的 COPY 撞了已存在的 id）：按列数组 ``unnest`` 成多行插入，已存在的
        id 被 ON CONFLICT 跳过、迁移记录只为真正插入的任务写（``Sql.create_many``）。返回插入了的 id。
        ``items`` 已检查、已按 task_id 排序（编码照快路径再做一遍：这条路很少走）。"""
        task_rows = [task_params(snapshot) for snapshot, _ in items if snapshot is not None]
        history = [TRANSITIONS.params(record) for _, transitions in items for record in transitions]
        params: dict[str, Any] = {f"k_{name}": [r[name] for r in task_rows] for name in TASK_COLUMNS}
        params["k_tags"] = [array_literal(tags) for tags in params["k_tags"]]
        params.update(rows_param(history))
        return {row[0] for row in conn.execute(self._sql.create_many, params).fetchall()}

    def save_many(self, requests: Sequence[v.SaveRequest]) -> list[TaskError | None]:
        """组提交：一次事务写一批 save（语义见 ``TaskStore.save_many``）。互不相同的任务、都不带租约条件
        （平常的组提交）时是一条语句（``Sql.save_batch``）；否则一个事务、一次管道发送，逐项一条语句。"""
        return self._run_many([partial(self._checked_save_statement, r) for r in requests])

    def _checked_save_statement(self, request: v.SaveRequest) -> _Prepared:
        # 迁移记录一律编成 JSON（t_rows）：一批能合成一条语句时，各项的记录拼成一个数组（见 _run_batch）。
        return self._save_statement(checks.check_save_request(request), scalar=False)

    def _run_one(self, prepared: _Prepared) -> None:
        text, params, judge = prepared
        with self._connection() as conn:
            error = judge(conn, _execute_hot(conn, text, params).fetchone())
        if error is not None:
            raise error

    def _run_many(self, prepare: Sequence[Callable[[], _Prepared]]) -> list[TaskError | None]:
        """一次事务执行多条写语句（管道发送：一次往返）。每条语句自带条件（版本、id 不重复），条件不满足的
        那条什么也不写、由 ``judge`` 报成它自己的异常，不连累同批其他项；入参检查不过的项根本不发。
        事务本身失败（连接断了、没有回复）照常抛出：整批按"这次写失败、结果未知"处理。"""
        results, work = prepare_batch(prepare)
        return self._run_work(results, work)

    def _run_work(
        self, results: list[TaskError | None], work: list[tuple[int, _Prepared]]
    ) -> list[TaskError | None]:
        """``_run_many`` 的执行一半（入参已逐项检查、准备好）。"""
        if not work:
            return results
        if len(work) == 1:
            # 只剩一项：一条自成事务的语句（不必 BEGIN / COMMIT 与管道）。
            index, (text, params, judge) = work[0]
            with self._connection() as conn:
                results[index] = judge(conn, conn.execute(text, params).fetchone())
            return results
        if self._batchable(work):
            return self._run_batch(results, work)
        # 按 task_id 排序执行（稳定排序：同一任务的几项仍按给出的顺序）：所有批量写都按同一顺序拿行锁，
        # 两个同时进行的批次不会互相死锁。
        work.sort(key=lambda item: item[1][1]["task_id"])
        with self._connection() as conn:
            with conn.pipeline(), conn.transaction():
                cursors = [conn.execute(text, params) for _, (text, params, _) in work]
            for (index, (_, _, judge)), cursor in zip(work, cursors, strict=True):
                results[index] = judge(conn, cursor.fetchone())
        return results

    def _batchable(self, work: list[tuple[int, _Prepared]]) -> bool:
        """这一批能合成一条语句（``Sql.save_batch``）：都是不带租约条件的 save，且任务互不相同（同一任务的
        几项要按先后链式写，一条 UPDATE 里一行只能改一次）。"""
        plain = (self._sql.save, self._sql.save_no_history)
        task_ids = set()
        for _, (text, params, _) in work:
            if text not in plain:
                return False
            task_ids.add(params["task_id"])
        return len(task_ids) == len(work)

    def _run_batch(
        self, results: list[TaskError | None], work: list[tuple[int, _Prepared]]
    ) -> list[TaskError | None]:
        """组提交的一批 save 合成一条语句执行（见 ``Sql.save_batch``），逐项判定与单项 save 相同。"""
        values: list[Any] = []
        history: list[str] = []
        for _, (_, params, _) in work:
            values.extend(params[name] for name, _ in _sql.SAVE_BATCH_COLUMNS)
            rows = params.get("t_rows")
            if rows is not None and rows != "[]":
                history.append(rows[1:-1])  # 每项的迁移记录是一个 JSON 数组：去掉方括号再拼成一个
        values.append("[" + ",".join(history) + "]")
        with self._connection() as conn:
            outcome = {
                task_id: (1 if written else 0, exists)
                for task_id, written, exists in _execute_batch(
                    conn, self._sql.save_batch(len(work)), values, len(work)
                )
            }
            for index, (_, params, judge) in work:
                results[index] = judge(conn, outcome.get(params["task_id"]))
        return results

    def write_many(
        self,
        creates: Sequence[tuple[TaskSnapshot, Sequence[Transition]]],
        saves: Sequence[v.SaveRequest],
    ) -> tuple[list[TaskError | None], list[TaskError | None]]:
        """组提交的混合批：几个 create 与几项 save 一个事务、平常一条语句一次往返（语义见
        ``TaskStore.write_many``；语句见 ``Sql.write_batch``）。

        为什么：提交线程的 create 原来自成一个事务；与同一时刻排着的 starting / 终态合进一个事务，服务器上
        少一次提交（一次 WAL 刷盘）、客户端少一次往返。逐项结果与单独写时相同：入参检查或编码不过的项是它
        自己的 ConfigurationError、根本不进事务；同一批里重复的 id 以第一项为准；已存在的 id 是
        DuplicateTaskId（它的迁移记录不写）；save 的冲突 / 不存在与 ``save_many`` 的判定相同。save 里有同一
        任务的几项（要链式写）或带租约条件时一条语句写不下：仍是一个事务，管道里逐条执行（先按 task_id 顺序
        插入新任务，再按 task_id 顺序写 save——与 ``Sql.write_batch`` 同一加锁顺序）。事务本身失败照常抛出
        StoreError（整批结果未知）。"""
        created: list[TaskError | None] = [None] * len(creates)
        fresh: list[_FreshCreate] = []
        first: set[str] = set()
        for index, (snapshot, transitions) in enumerate(creates):
            try:
                snapshot = checks.check_snapshot(snapshot)
                checks.check_transitions(snapshot.task_id, transitions)
                params = task_params(snapshot)
                history = [TRANSITIONS.params(record) for record in transitions]
            except TaskError as exc:
                created[index] = exc
                continue
            if snapshot.task_id in first:  # 同一批里重复的 id：以第一项为准（与 create_many 相同）
                created[index] = _duplicate(snapshot.task_id)
                continue
            first.add(snapshot.task_id)
            fresh.append((index, snapshot, transitions, params, history))
        saved, work = prepare_batch([partial(self._checked_save_statement, r) for r in saves])
        if not fresh:
            return created, self._run_work(saved, work)
        # 新任务按 task_id 顺序插入（与 create_many 的排序同一顺序）：并发的批次按同一顺序拿唯一索引上的锁。
        fresh.sort(key=lambda item: item[1].task_id)
        if not work or self._batchable(work):
            self._write_batch(created, fresh, saved, work)
        else:
            self._write_pipelined(created, fresh, saved, work)
        claimable = [item[1] for item in fresh if created[item[0]] is None and _claim.claimable(item[1])]
        if claimable:
            # 待认领的持久任务：提交之后通知 worker 一次（同 create_many；通知只是提示，丢了由轮询兜底）。
            try:
                with self._connection() as conn:
                    _claim.notify_claimable(conn, self._channel, claimable)
            except StoreError as exc:
                logger.warning("新建持久任务后通知 worker 失败（由轮询兜底）：%s", exc)
        return created, saved

    def _write_batch(
        self,
        created: list[TaskError | None],
        fresh: list[_FreshCreate],
        saved: list[TaskError | None],
        work: list[tuple[int, _Prepared]],
    ) -> None:
        """``write_many`` 的平常路径：一条语句（``Sql.write_batch``），逐项结果填进 created / saved。"""
        values: list[Any] = []
        create_history: list[dict[str, Any]] = []
        for _, _, _, params, history in fresh:
            values.extend(params.values())  # task_params 的键序即 TASK_COLUMNS（= TASK_BATCH_COLUMNS）
            create_history.extend(history)
        values.append(rows_param(create_history)["t_rows"])
        save_history: list[str] = []
        for _, (_, params, _) in work:
            values.extend(params[name] for name, _ in _sql.SAVE_BATCH_COLUMNS)
            rows = params.get("t_rows")
            if rows is not None and rows != "[]":
                save_history.append(rows[1:-1])  # 每项的迁移记录是一个 JSON 数组：去掉方括号再拼成一个
        if work:
            values.append("[" + ",".join(save_history) + "]")
        with self._connection() as conn:
            outcome = {
                (kind, task_id): (1 if written else 0, exists)
                for kind, task_id, written, exists in _execute_batch(
                    conn, self._sql.write_batch(len(fresh), len(work)), values, len(fresh) + len(work)
                )
            }
            for index, snapshot, _, _, _ in fresh:
                if outcome.get((0, snapshot.task_id), (0, True))[0] == 0:
                    created[index] = _duplicate(snapshot.task_id)
            for index, (_, params, judge) in work:
                saved[index] = judge(conn, outcome.get((1, params["task_id"])))

    def _write_pipelined(
        self,
        created: list[TaskError | None],
        fresh: list[_FreshCreate],
        saved: list[TaskError | None],
        work: list[tuple[int, _Prepared]],
    ) -> None:
        """``write_many`` 里的 save 一条语句写不下（同一任务几项、带租约条件）：一个事务、管道里逐条执行。
        先按 task_id 顺序插入全部新任务，再按 task_id 顺序（稳定：同一任务的几项保持先后）写 save。"""
        inserts = [
            self._create_statement(snapshot, transitions, notify=False)
            for _, snapshot, transitions, _, _ in fresh
        ]
        work.sort(key=lambda item: item[1][1]["task_id"])
        with self._connection() as conn:
            with conn.pipeline(), conn.transaction():
                create_cursors = [conn.execute(text, params) for text, params, _ in inserts]
                save_cursors = [conn.execute(text, params) for _, (text, params, _) in work]
            for (index, _, _, _, _), (_, _, judge), cursor in zip(
                fresh, inserts, create_cursors, strict=True
            ):
                created[index] = judge(conn, cursor.fetchone())
            for (index, (_, _, save_judge)), cursor in zip(work, save_cursors, strict=True):
                saved[index] = save_judge(conn, cursor.fetchone())

    def _create_statement(
        self, snapshot: TaskSnapshot, transitions: Sequence[Transition], *, notify: bool = True
    ) -> _Prepared:
        """``notify``：待认领的持久任务在同一条语句里通知 worker（单个 create；批量的由 create_many
        统一通知）。"""
        snapshot = checks.check_snapshot(snapshot)
        checks.check_transitions(snapshot.task_id, transitions)
        params = task_params(snapshot)
        task_id = snapshot.task_id
        # 迁移记录上面刚查过：编码时不再经 ``transition_params``（它会把 check_transitions 再跑一遍）。
        if len(transitions) == 1:
            # 最常见：只带 queued 那一条（enqueue() 也是）——迁移记录按标量参数写（见 one_transition_insert）。
            params.update(_sql.one_transition_params(transitions[0]))
            one = True
        else:
            params.update(_sql.checked_transition_params(transitions))
            one = False
        if notify and _claim.claimable(snapshot):
            statement = self._sql.create_one_notify if one else self._sql.create_notify
            params.update(_claim.notice_params(self._channel, snapshot))
        else:
            statement = self._sql.create_one if one else self._sql.create

        def judge(conn: Conn, row: Any) -> TaskError | None:
            if row is None or row[0] == 0:
                return _duplicate(task_id)
            return None

        return statement, params, judge

    def _save_statement(self, request: v.SaveRequest, *, scalar: bool = True) -> _Prepared:
        """一次 save 的语句与判定（入参已检查：``_save`` 由基类检查，``save_many`` 逐项检查）。

        ``scalar``：只有一条迁移记录时按标量参数写它（``Sql.save_one``）。"""
        snapshot, transitions = request.snapshot, request.transitions
        expect_version, lease_expired_before = request.expect_version, request.lease_expired_before
        # 只编码 save 写的列（``SNAPSHOTS.save_params``，与 SQLite 的 save 同一份）：配方是只在 create 时
        # 写的列，save 的语句根本不引用它，整份编码（``task_params``）每次 save 都白白把配方参数做一遍
        # JSON 编码与可存储性检查——worker 每个任务的终态 save 里最贵的一项。
        params = SNAPSHOTS.save_params(snapshot)
        params["task_id"] = snapshot.task_id
        params["expect_version"] = expect_version
        leased = lease_expired_before is not None
        if leased:
            params["lease_expired_before"] = lease_expired_before
        if scalar and not leased and len(transitions) == 1:
            params.update(_sql.one_transition_params(transitions[0]))
            statement = self._sql.save_one
        elif transitions:
            params.update(_sql.checked_transition_params(transitions))  # 入参已检查（见上）
            statement = self._sql.save_leased if leased else self._sql.save
        else:
            statement = self._sql.save_no_history_leased if leased else self._sql.save_no_history
        task_id = snapshot.task_id

        def judge(conn: Conn, row: Any) -> TaskError | None:
            if row is not None and row[0] == 1:
                return None
            if row is None or not row[1]:
                return TaskNotFound(f"任务 {task_id!r} 不存在，无法保存（先 create）")
            # 冲突是少见路径：多花一次往返读出当前版本（与租约），让报错说清楚差在哪。
            current = conn.execute(self._sql.current_lease, [task_id]).fetchone()
            actual = "?" if current is None else current[0]
            if current is not None and current[0] == expect_version and leased:
                if current[1] is None or current[1] < lease_expired_before:
                    # 版本与租约都符合，只是行正被别的会话锁着（SKIP LOCKED 跳过了它，见 Sql.save_leased）。
                    return ConcurrencyConflict(
                        f"任务 {task_id!r} 正被另一个会话写入（行锁未释放）：这一轮不作判定，"
                        "没有写入任何内容；锁释放后（对方提交，或服务器结束失联的会话）再判"
                    )
                return ConcurrencyConflict(v.lease_held_message(task_id, current[1]))
            return ConcurrencyConflict(
                f"任务 {task_id!r} 的版本冲突：期望 status_version={expect_version}，存储中为 {actual}；"
                "有别的写入者抢先改了它，请重新读取后再决定"
            )

        return statement, params, judge

    def get(self, task_id: str) -> TaskSnapshot | None:
        if "\x00" in checks.check_key("task_id", task_id):
            return None  # text 存不下 NUL：这样的任务不可能存在

        def run(conn: Conn) -> TaskSnapshot | None:
            row = conn.execute(self._sql.get, [task_id]).fetchone()
            return None if row is None else snapshot_from_row(row)

        return self._read(run)

    def query(self, query: v.TaskQuery | None = None) -> list[TaskSnapshot]:
        query = v.as_query(query)
        if query.limit == 0:
            return []
        text, params = self._sql.query(query)

        def run(conn: Conn) -> list[TaskSnapshot]:
            return [snapshot_from_row(row) for row in conn.execute(text, params).fetchall()]

        return self._read(run)

    def stats(self, query: v.TaskQuery | None = None) -> v.TaskStats:
        query = v.as_query(query)
        where, params = _sql.where_clause(query)
        text = f"SELECT status, count(*) FROM {self._sql.s}.tasks{where} GROUP BY status"

        def run(conn: Conn) -> v.TaskStats:
            # 连接上复用的游标（见 _cursor）：看板与探针每隔几毫秒到几秒就调一次 stats()，不必每次新建游标。
            rows = _cursor(conn).execute(text, params).fetchall()
            return v.TaskStats({TaskStatus(status): int(n) for status, n in rows})

        return self._read(run)

    def bucket_counts(self, query: v.TaskQuery | None = None) -> dict[int, int]:
        query = v.as_query(query)
        where, params = _sql.where_clause(query)
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
        if "\x00" in checks.check_key("task_id", task_id):
            return []

        def run(conn: Conn) -> list[Transition]:
            return [transition_from_row(row) for row in conn.execute(self._sql.history, [task_id]).fetchall()]

        return self._read(run)

    # -- side channel ---------------------------------------------------------------------------------

    @staticmethod
    def _touch_params(update: v.TouchUpdate) -> dict[str, Any] | None:
        """一项 touch 的参数（None：没有要改的字段）。值为 None 的字段表示"不改"。"""
        check_text(update.lease_owner, "lease_owner")
        progress, heartbeat_at = update.progress, update.heartbeat_at
        if (
            progress is None
            and heartbeat_at is None
            and update.lease_owner is None
            and update.lease_until is None
        ):
            return None
        params: dict[str, Any] = {"task_id": update.task_id, "lease_owner": update.lease_owner}
        params["progress"] = None if progress is None else json_text(progress.to_dict(), "progress")
        params["heartbeat_at"], params["heartbeat_at_off"] = split_dt(heartbeat_at)
        params["lease_until"], params["lease_until_off"] = split_dt(update.lease_until)
        return params

    def _touch(self, update: v.TouchUpdate) -> bool:
        task_id = update.task_id
        params = self._touch_params(update)
        if "\x00" in task_id:
            return False
        if params is None:

            def run(conn: Conn) -> bool:
                row = conn.execute(self._sql.exists, [task_id]).fetchone()
                return bool(row and row[0])

            return self._read(run)
        text = self._sql.touch(
            params["progress"] is not None,
            params["heartbeat_at"] is not None,
            params["lease_owner"] is not None,
            params["lease_until"] is not None,
        )
        with self._connection() as conn:
            return conn.execute(text, params).fetchone() is not None

    def touch_many(self, updates: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """一条语句、一次往返：控制器每轮续租几十个任务，不该付几十次往返。

        为什么不是"一个事务里逐条 UPDATE"（旧实现：管道里 BEGIN、UPDATE…、同步一次、再 COMMIT）：
        那样行锁要跨一次网络往返持有。网络恰好在两次发送之间挂住时，服务器上的会话拿着这些任务的行锁
        "idle in transaction"，而中间设备让服务器那一侧的 TCP 连接一直活着——同伴对这些任务的 reconcile
        要等到 TCP keepalive（几个小时）。``idle_in_transaction_session_timeout`` 救不了这种管道事务：
        psycopg 在 Sync 之后还发一个 Flush，PostgreSQL 收到任何消息都会关掉这个计时器，只在下一次
        ReadyForQuery 时才重新打开，而 COMMIT 永远不会来。一条语句则在服务器收到 Sync 时就提交（或者
        根本没执行），不把锁留在网络的另一头。同一任务出现多次时按先后合并字段，与逐条执行的结果相同。
        """
        merged: dict[str, dict[str, Any]] = {}
        for task_id, raw in updates:
            params = self._touch_params(checks.touch_many_update(task_id, raw))
            if params is None or "\x00" in task_id:  # 含 NUL 的任务不可能存在
                continue
            into = merged.setdefault(task_id, {})
            into.update({key: value for key, value in params.items() if value is not None})
        if not merged:
            return
        columns = _sql.TOUCH_MANY_COLUMNS
        arrays = {name: [fields.get(name) for fields in merged.values()] for name in columns}
        with self._connection() as conn:
            conn.execute(self._sql.touch_many, arrays)

    def _renew_leases(self, lease_owner: str, task_ids: frozenset[str], lease_until: datetime) -> None:
        """一条语句：id 以一个二进制传输的数组参数传入，行锁按 task_id 顺序拿（与 touch_many 同理）。"""
        check_text(lease_owner, "lease_owner")
        ids = sorted(task_id for task_id in task_ids if "\x00" not in task_id)  # 含 NUL 的任务不可能存在
        if not ids:
            self._check_open()
            return
        until, until_off = split_dt(lease_until)
        params = {"owner": lease_owner, "until": until, "until_off": until_off, "task_ids": ids}
        with self._connection() as conn:
            conn.execute(self._sql.renew_leases, params)

    # -- commands -------------------------------------------------------------------------------------

    def _submit_command(self, submission: v.CommandSubmission) -> v.Command:
        task_id, action = submission.task_id, submission.action
        issuer, reason, body = submission.issuer, submission.reason, submission.payload
        check_text(issuer, "指令的 issuer")
        check_text(reason, "指令的 reason")
        if "\x00" in task_id:
            raise TaskNotFound(f"任务 {task_id!r} 不存在，无法下发指令 {action.value}")  # text 存不下 NUL
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
        return submission.written(command_id, created_at, row[0], json.loads(payload_text))

    def _claim_commands(self, request: v.ClaimRequest) -> list[v.Command]:
        claimant, lease, limit = request.claimant, request.lease, request.limit
        wanted_tasks, wanted_buckets = request.task_ids, request.buckets
        check_text(claimant, "认领者 claimant")
        # text 存不下 NUL、integer 存不下 2**31 以上的桶号：这样的过滤值不可能匹配任何指令，直接去掉。
        ids = None if wanted_tasks is None else sorted(t for t in wanted_tasks if "\x00" not in t)
        bucket_list = None if wanted_buckets is None else sorted(b for b in wanted_buckets if b < 2**31)
        holder = request.holder
        if limit == 0 or ids == [] or bucket_list == [] or (holder is not None and "\x00" in holder):
            self._check_open()
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
            "holder": holder,
        }
        text = self._sql.claim(ids is not None, bucket_list is not None, holder is not None)
        with self._connection() as conn:
            rows = conn.execute(text, params).fetchall()
        # RETURNING 不保证顺序：按认领时用的同一键 (enqueued_at, command_id) 排好再交出。
        rows.sort(key=lambda row: (row[-1], row[0]))
        return [command_from_row(row[:-1]) for row in rows]

    def _claim_queued(self, request: QueuedClaim) -> list[TaskSnapshot]:
        if request.empty:
            self._check_open()
            return []
        with self._connection() as conn:
            return _claim.claim(conn, self._sql.s, request)

    claim_start_saves = True  # _claim_and_start 在同一个事务里先写 start.save（见 TaskStore.saves_on_claim）

    def _claim_and_start(self, request: QueuedClaim, start: ClaimStart) -> list[TaskSnapshot]:
        """认领与 starting 一条语句（``_claim.claim_start_sql``）：挑行、写持有者、推进到 starting、写迁移
        记录，一次往返、一次提交。状态机不让开始的行（尝试预算已用完）只认领，交回的仍是 queued。

        为什么不再是 ``BEGIN``、认领、各行 starting 的 save、``COMMIT``（上一版）：四次往返、四次 execute，
        worker 每任务客户端 CPU 的大半花在这里，同一行还要更新两次。为什么当初没写成一条：那时认为要先读回
        行才知道怎样开始它——其实 queued → starting 的改动只依赖行自己的 attempt / max_attempts，一条
        UPDATE 的 CASE 就能照状态机的规矩写出来（逐列对应关系与守着它的用例见 ``_claim.claim_start_sql``）。
        """
        statement = None if request.empty else _claim.claim_start_statement(self._sql.s, request, start)
        if start.save is not None:
            return self._save_claim_and_start(start.save, statement)
        if statement is None:
            self._check_open()
            return []
        with self._connection() as conn:
            return _claim.claimed_snapshots(_execute_hot(conn, *statement).fetchall())

    def _save_claim_and_start(
        self, save: v.SaveRequest, claim: tuple[str, dict[str, Any]] | None
    ) -> list[TaskSnapshot]:
        """``start.save`` 与认领并开始一条语句（``_claim.save_claim_start_sql``：save 改到了那一行才挑行），
        一次往返、一次提交。save 写不成时由它自己的判定报错（什么也没写：认领的挑行以 save 的 UPDATE 改到行
        为前提）；认领的过滤值不可能匹配任何任务时只发 save。"""
        text, params, judge = self._save_statement(save)
        if claim is None:
            self._run_one((text, params, judge))
            return []
        claim_params = claim[1]
        combined = _claim.save_claim_start_sql(
            self._sql.s, text, self._sql.save_result, by_bucket=claim_params["buckets"] is not None
        )
        with self._connection() as conn:
            rows = _execute_hot(
                conn, combined, _claim.save_claim_start_params(params, claim_params)
            ).fetchall()
            error = judge(conn, rows[0][:2] if rows else None)
        if error is not None:
            raise error
        return _claim.claimed_snapshots([row[2:] for row in rows if row[2] is not None])

    def complete_command(self, command_id: str, claimant: str) -> bool:
        checks.check_key("command_id", command_id)
        if "\x00" in command_id or not isinstance(claimant, str) or "\x00" in claimant:
            return False  # 这样的指令 / 持有者不可能存在
        at, at_off = split_dt(self._clock.now())
        params = {"command_id": command_id, "claimant": claimant, "at": at, "at_off": at_off}
        with self._connection() as conn:
            return conn.execute(self._sql.complete, params).fetchone() is not None

    def release_command(self, command_id: str, claimant: str) -> bool:
        checks.check_key("command_id", command_id)
        if "\x00" in command_id or not isinstance(claimant, str) or "\x00" in claimant:
            return False  # 这样的指令 / 持有者不可能存在
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

    def publish_node(self, record: v.NodeRecord) -> None:
        params = node_params(checks.check_node_record(record))
        try:
            with self._connection() as conn:
                conn.execute(self._sql.publish_node, params)
        except StoreError as exc:
            raise self._membership_error(exc) from exc.__cause__

    def list_nodes(self) -> list[v.NodeRecord]:
        def run(conn: Conn) -> list[v.NodeRecord]:
            return [node_from_row(row) for row in conn.execute(self._sql.list_nodes).fetchall()]

        try:
            return self._read(run)
        except StoreError as exc:
            raise self._membership_error(exc) from exc.__cause__

    def remove_node(self, owner: str) -> bool:
        checks.check_node_owner(owner)
        try:
            with self._connection() as conn:
                return conn.execute(self._sql.remove_node, [owner]).fetchone() is not None
        except StoreError as exc:
            raise self._membership_error(exc) from exc.__cause__

    # -- task logs (issue 18；实现在 _logs.py) ------------------------------------------------------

    def append_logs(self, lines: Sequence[v.LogLine]) -> None:
        _logs.append_logs(self, self._log_sql, lines)

    def read_logs(
        self, task_id: str, *, attempt: int | None = None, after_seq: int | None = None, limit: int = 1000
    ) -> list[v.LogLine]:
        return _logs.read_logs(self, self._log_sql, task_id, attempt, after_seq, limit)

    def log_stats(self, task_id: str) -> v.LogStats:
        return _logs.log_stats(self, self._log_sql, task_id)

    # -- upkeep ---------------------------------------------------------------------------------------

    def prune(self, keep_terminal: int) -> int:
        checks.check_count("keep_terminal", keep_terminal)
        params = {"terminal": _TERMINAL, "keep": keep_terminal}
        with self._connection() as conn:
            statement = self._sql.prune_with_logs if _logs.has_table(conn, self._log_sql) else self._sql.prune
            row = conn.execute(statement, params).fetchone()
        return 0 if row is None else int(row[0])

    # -- retention: 按月分区整块归档（实现在 _archive.py；另四个保留方法来自 RetentionByModule） --

    def _expired_partitions(self, before: datetime) -> list[str]:
        return _archive.expired_partitions(self, before)

    def _archive_partition(
        self, name: str, before: datetime, write: ArchiveWrite, batch: int
    ) -> v.PartitionArchived:
        return _archive.archive_partition(self, name, before, write, batch)

    def close(self) -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        listener = self._listener
        if listener is not None:
            listener.stop()
        self._pool.close()
        self._deadlines.close()


__all__ = ["PostgresTaskStore", "channel_for", "redact"]
