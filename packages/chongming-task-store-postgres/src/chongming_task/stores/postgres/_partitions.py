"""迁移记录表的月度分区（issue 20；存储指南 §9）。

* **布局**：``transitions`` 按 ``at`` ``PARTITION BY RANGE``，每个 UTC 自然月一个分区
  ``transitions_pYYYYMM``，外加 ``transitions_default`` 兜底（还没建好月分区的时间落在这里，写入永不因
  为缺分区而失败）；从第 1 版升级来的库还有一个 ``transitions_v1``（旧表整张挂上，不搬数据）。
* **提前建**：可写打开与每次归档时建好"本月 + 之后 ``AHEAD_MONTHS`` 个月"（``ensure_months``）。
  建分区要表的属主权限；没有权限只告警——行落进 DEFAULT，逐行归档照常可用。DEFAULT 里已有某个月的
  行时，先把它们搬进新分区再挂上（否则 PostgreSQL 拒绝建这个分区）。
* **整块丢弃**（``archive_partition``）：一个整月都早于截止时刻的分区，把其中属于"可归档前缀"的行按批
  交给归档器写成段，然后 ``DETACH`` + ``DROP``——元数据操作，不逐行删除、不留死元组。不属于前缀的行
  （时钟偏差让同一任务更早的版本落在更晚的月份里）在 DETACH 之后移回在线表（落进 DEFAULT）。
  导出期间不锁分区（迟到的写入不被挡住）；DETACH 拿到锁之后再核对分区内容与导出的是否一致（条数、
  版本和、时刻和），不一致——有并发写入或删除——就整个回滚，由归档器逐行删除已经写出的段。
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import psycopg
from psycopg import errors as pg_errors

from chongming_task.core.storage.values import PartitionArchived
from chongming_task.models import Transition
from chongming_task.stores.postgres import _schema
from chongming_task.stores.postgres._codec import TRANSITION_COLUMNS, TRANSITIONS

logger = logging.getLogger("chongming_task.stores.postgres")

AHEAD_MONTHS = 2
"""除本月之外再提前建几个月的分区。"""

LOCK_TIMEOUT = "2s"
"""DETACH 等锁的上限：等不到就放弃整块丢弃（改为逐行删除），不让写穿的监督进程排在它后面久等。"""

EXPORT_IDLE_LIMIT_MS = 600_000
"""导出阶段会话在事务里空等的上限（10 分钟）：两次取批之间客户端在写归档段（压缩、fsync），时间不由我们定，
所以只设一个宽的上限——一批（最多 10 万条）写 10 分钟的客户端已经死了。这时只拿着 ACCESS SHARE 锁（不挡
写入），但一个永远不结束的事务会让 vacuum 清不掉任何死元组。"""

DETACHED_IDLE_FALLBACK_MS = 30_000
"""存储没有 ``network_timeout``（``statement_timeout=None`` 且没给它）时，DETACH 之后空等的上限。"""

_MONTH = re.compile(r"^transitions_p(\d{4})(\d{2})$")
_BOUND = re.compile(r"FOR VALUES FROM \((.+?)\) TO \((.+?)\)")


class PartitionedStore(Protocol):
    """本模块用到的存储管道（协议，不导入 store.py）。"""

    _schema: str
    _network_timeout: float | None

    def _maintenance_connection(self) -> Any: ...


def idle_limit_ms(store: PartitionedStore) -> int:
    """短事务（客户端不在其间做自己的工作）里会话空等的上限（毫秒）：等于存储的 ``network_timeout``。"""
    timeout = store._network_timeout
    return DETACHED_IDLE_FALLBACK_MS if timeout is None else max(1, math.ceil(timeout * 1000))


def set_local_limits(conn: Any, idle_ms: int) -> None:
    """本事务的 ``idle_in_transaction_session_timeout`` 与 ``lock_timeout``（``SET LOCAL``，一次往返）。"""
    conn.execute(
        "SELECT set_config('idle_in_transaction_session_timeout', %s, true), "
        "set_config('lock_timeout', %s, true)",
        [str(idle_ms), LOCK_TIMEOUT],
    )


@dataclass(frozen=True)
class Partition:
    name: str
    lower: datetime | None  # None = MINVALUE
    upper: datetime | None  # None = MAXVALUE / DEFAULT


def month_start(value: datetime) -> datetime:
    value = value.astimezone(UTC)
    return datetime(value.year, value.month, 1, tzinfo=UTC)


def add_months(month: datetime, n: int) -> datetime:
    index = month.year * 12 + month.month - 1 + n
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC)


def month_name(month: datetime) -> str:
    return f"transitions_p{month.year:04d}{month.month:02d}"


def _bound(text: str) -> datetime | None:
    text = text.strip()
    if text in ("MINVALUE", "MAXVALUE"):
        return None
    return datetime.fromisoformat(text.strip("'"))


def list_partitions(conn: Any, schema: str) -> list[Partition]:
    """挂在 ``transitions`` 上的分区（DEFAULT 的上下界都是 None），按下界从旧到新。"""
    rows = conn.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%s)",
        [f"{_schema.quote_ident(schema)}.transitions"],
    ).fetchall()
    out: list[Partition] = []
    for name, bound in rows:
        match = _BOUND.search(bound or "")
        if match is None:
            out.append(Partition(str(name), None, None))
        else:
            out.append(Partition(str(name), _bound(match.group(1)), _bound(match.group(2))))
    floor = datetime.min.replace(tzinfo=UTC)
    return sorted(out, key=lambda p: (p.lower or floor, p.name))


def _range(lower: datetime, upper: datetime) -> str:
    # 分区边界必须是常量（不能绑定参数）；isoformat 的文本只含数字与 -:+T，直接拼接是安全的。
    return f"FOR VALUES FROM ('{lower.isoformat()}') TO ('{upper.isoformat()}')"


def _create_month(conn: Any, schema: str, month: datetime) -> None:
    """在一个事务里建 ``month`` 的分区；DEFAULT 里已有这个月的行就先搬过去（见模块说明）。"""
    s = _schema.quote_ident(schema)
    name = _schema.quote_ident(month_name(month))
    default = f"{s}.{_schema.quote_ident(_schema.DEFAULT_PARTITION)}"
    lower, upper = month, add_months(month, 1)
    with conn.transaction():
        conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        _schema.lock_ddl(conn, schema)
        if conn.execute("SELECT to_regclass(%s)", [f"{s}.{name}"]).fetchone()[0] is not None:
            return
        stray = conn.execute(
            f"SELECT EXISTS (SELECT 1 FROM {default} WHERE at >= %s AND at < %s)", [lower, upper]
        ).fetchone()[0]
        if not stray:
            conn.execute(f"CREATE TABLE {s}.{name} PARTITION OF {s}.transitions {_range(lower, upper)}")
            return
        columns = ", ".join(TRANSITION_COLUMNS)
        conn.execute(
            f"CREATE TABLE {s}.{name} (LIKE {s}.transitions INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        conn.execute(
            f"WITH moved AS (DELETE FROM {default} WHERE at >= %s AND at < %s RETURNING {columns}) "
            f"INSERT INTO {s}.{name} ({columns}) SELECT {columns} FROM moved",
            [lower, upper],
        )
        conn.execute(f"ALTER TABLE {s}.transitions ATTACH PARTITION {s}.{name} {_range(lower, upper)}")


def ensure_months(conn: Any, schema: str, first: datetime, last: datetime) -> int:
    """建好 ``first`` 所在月到 ``last`` 所在月之间缺的月分区（已被别的分区覆盖的月份跳过）。返回新建数。

    没有属主权限 → ``psycopg.errors.InsufficientPrivilege``（调用方决定告警还是报错）。
    """
    existing = list_partitions(conn, schema)
    created = 0
    month = month_start(first)
    while month <= last:
        end = add_months(month, 1)
        covered = any(
            p.upper is not None and (p.lower is None or p.lower < end) and month < p.upper for p in existing
        )
        if not covered:
            _create_month(conn, schema, month)
            created += 1
        month = end
    return created


def ensure_ahead(conn: Any, schema: str) -> int:
    """本月与之后 ``AHEAD_MONTHS`` 个月（按数据库服务器的时钟）。"""
    now = conn.execute("SELECT now()").fetchone()[0]
    return ensure_months(conn, schema, now, add_months(month_start(now), AHEAD_MONTHS))


def ensure_ahead_or_warn(conn: Any, schema: str, *, at_open: bool = False) -> None:
    """没有建表权限时不报错（行落进 DEFAULT，功能不受影响）。

    ``at_open=True``（可写打开时）只记 DEBUG：用户指南 §9.1 推荐应用角色只有 DML 权限，每次打开都走到这里，
    告警就成了每个进程启动时的一行噪音（CLI 的错误输出也因此不再是一行）；建月分区是属主跑
    ``chongming-task archive`` 时的事，那里仍然告警。
    """
    try:
        ensure_ahead(conn, schema)
    except (pg_errors.InsufficientPrivilege, pg_errors.LockNotAvailable) as exc:
        logger.log(
            logging.DEBUG if at_open else logging.WARNING,
            "没能提前建迁移记录的月分区（schema %r）：%s。写入照常（落进 DEFAULT 分区），但过期历史只能逐行"
            "删除；请让表的属主定期运行 chongming-task archive（它会建好后面的月分区）",
            schema,
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
        )


def expired(conn: Any, schema: str, before: datetime) -> list[str]:
    """上界不晚于 ``before`` 的分区名（从旧到新）；DEFAULT 从不算过期。"""
    return [p.name for p in list_partitions(conn, schema) if p.upper is not None and p.upper <= before]


def _micros(value: datetime) -> int:
    return (value - datetime(1970, 1, 1, tzinfo=UTC)) // _MICRO


_MICRO = datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)


def archive_partition(
    store: PartitionedStore,
    name: str,
    before: datetime,
    write: Callable[[list[Transition]], None],
    batch: int,
) -> PartitionArchived:
    """见模块说明与 ``TaskStore.archive_partition``。"""
    schema = store._schema
    s = _schema.quote_ident(schema)
    conn = store._maintenance_connection()
    with conn:
        found = {p.name: p for p in list_partitions(conn, schema)}
        part = found.get(name)
        if part is None or part.upper is None or part.upper > before:
            return PartitionArchived(reason=f"分区 {name!r} 不存在或还没有整体过期")
        p = f"{s}.{_schema.quote_ident(name)}"
        # 分区之外（更晚的月份与 DEFAULT）每个任务的最小在线版本：分区里版本不低于它的行不属于前缀。
        outside = "t.at >= %(upper)s OR t.at < %(lower)s" if part.lower is not None else "t.at >= %(upper)s"
        floor = datetime(1, 1, 1, tzinfo=UTC)
        params = {"upper": part.upper, "lower": part.lower or floor}
        exported = 0
        sums = [0, 0]
        try:
            with conn.transaction():
                conn.execute("SET LOCAL statement_timeout = 0")
                # 维护连接不是池里的会话，没有服务器端的空等上限（docs/distributed.md §7.5）：这里逐段给。
                conn.execute(f"SET LOCAL idle_in_transaction_session_timeout = {EXPORT_IDLE_LIMIT_MS}")
                conn.execute(
                    f"CREATE TEMP TABLE archive_keep ON COMMIT DROP AS SELECT d.task_id, m.v "
                    f"FROM (SELECT DISTINCT task_id FROM {p}) d CROSS JOIN LATERAL "
                    f"(SELECT min(t.version) AS v FROM {s}.transitions t "
                    f"WHERE t.task_id = d.task_id AND ({outside})) m WHERE m.v IS NOT NULL",
                    params,
                )
                conn.execute("CREATE UNIQUE INDEX ON archive_keep (task_id)")
                cols = ", ".join(f"r.{c}" for c in TRANSITION_COLUMNS)
                archivable = "(k.v IS NULL OR r.version < k.v)"
                with conn.cursor(name="chongming_archive_partition") as cur:
                    cur.itersize = batch
                    cur.execute(
                        f"SELECT {cols} FROM {p} r LEFT JOIN archive_keep k ON k.task_id = r.task_id "
                        f"WHERE {archivable} ORDER BY r.task_id, r.version"
                    )
                    while rows := cur.fetchmany(batch):
                        records = [TRANSITIONS.trusted_from_row(row) for row in rows]
                        write(records)
                        exported += len(records)
                        sums[0] += sum(r.version for r in records)
                        sums[1] += sum(_micros(r.at) for r in records)
                # DETACH 拿到 transitions 上的 ACCESS EXCLUSIVE 锁，一直持有到 COMMIT：其间每个节点写历史的
                # save 都排在它后面。之后还有核对、移回、DROP 几次往返，归档器恰好在这时失联（网络挂住而不是
                # 断开），服务器上的会话就拿着这把锁停在 "idle in transaction"，直到 TCP keepalive（几个小时）
                # ——整个集群的写穿都挂住。这几次往返之间客户端不做任何自己的工作，活着的客户端空等不会超过
                # 它等回复的上限 network_timeout，所以从这里起空等上限收紧到它：到期由服务器结束会话、回滚
                # （DETACH 一并撤销，什么也没丢），放掉锁。等锁的上限 LOCK_TIMEOUT 一并设上（DETACH 等锁最多
                # 2 秒，之后的语句不再等别的锁）。
                set_local_limits(conn, idle_limit_ms(store))
                conn.execute(f"ALTER TABLE {s}.transitions DETACH PARTITION {p}")
                # DETACH 之后分区不再接收写入：核对它现在的内容正是导出的那些（加上要留下的）。
                row = conn.execute(
                    f"SELECT count(*), coalesce(sum(r.version), 0), "
                    f"coalesce(sum((extract(epoch FROM r.at) * 1000000)::numeric), 0) "
                    f"FROM {p} r LEFT JOIN archive_keep k ON k.task_id = r.task_id WHERE {archivable}"
                ).fetchone()
                if (int(row[0]), int(row[1]), int(row[2])) != (exported, sums[0], sums[1]):
                    raise _Changed
                kept = conn.execute(
                    f"INSERT INTO {s}.transitions ({', '.join(TRANSITION_COLUMNS)}) SELECT {cols} FROM {p} r "
                    f"JOIN archive_keep k ON k.task_id = r.task_id WHERE r.version >= k.v"
                ).rowcount
                conn.execute(f"DROP TABLE {p}")
        except _Changed:
            return PartitionArchived(exported=exported, reason="导出期间分区被并发改动（迟到的写入或删除）")
        except pg_errors.InsufficientPrivilege as exc:
            return PartitionArchived(
                exported=exported,
                reason=f"角色没有 DETACH/DROP 分区的权限（需要表的属主）：{_first_line(exc)}",
            )
        except (pg_errors.LockNotAvailable, pg_errors.DeadlockDetected) as exc:
            return PartitionArchived(exported=exported, reason=f"没拿到分区的锁：{_first_line(exc)}")
    return PartitionArchived(exported=exported, kept=int(kept), dropped=True)


class _Changed(Exception):
    pass


def _first_line(exc: psycopg.Error) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = [
    "AHEAD_MONTHS",
    "Partition",
    "add_months",
    "archive_partition",
    "ensure_ahead",
    "ensure_ahead_or_warn",
    "ensure_months",
    "expired",
    "list_partitions",
    "month_name",
    "month_start",
    "set_local_limits",
]
