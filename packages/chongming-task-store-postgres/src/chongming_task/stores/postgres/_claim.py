"""PostgresTaskStore 的持久任务（issue 19）：认领（``claim_queued``）、新任务的 NOTIFY 与后补列的补建。

认领是一条语句：``FOR UPDATE SKIP LOCKED`` 挑出前 N 个可认领的行（别的认领者正锁着的行直接跳过，不排队
等它），同一语句里写上持有者与租约并 RETURNING 整行。UPDATE 再核对一次 ``owner IS NULL``：READ COMMITTED 下
被别人先提交认领的行不会被第二次取走。判据与顺序见 ``core/storage/claiming.py``。

新建的无人持有的持久任务在同一事务里 ``pg_notify`` 到指令频道（载荷带 ``"queued"``）：worker 用
``listen`` 等通知，通知只是"快来看"的提示，丢了由轮询兜底。单个 create（``enqueue()``）把通知并进建任务的
那条语句（``create_notify_sql``：插入成功才通知，一次往返）；一批 create 每个事务只通知一次
（``notify_claimable``），不是每行一次——通知只说"有新的"，worker 反正要去认领才知道是哪几个。
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from chongming_task.core.storage.claiming import QueuedClaim
from chongming_task.models import TaskSnapshot
from chongming_task.stores.postgres import _schema
from chongming_task.stores.postgres._codec import TASK_COLUMNS, snapshot_from_row, split_dt

if TYPE_CHECKING:
    import psycopg

    Conn = psycopg.Connection[Any]

QUEUED_NOTICE = "queued"
"""NOTIFY 载荷里 ``kind`` 的值：有新的待认领持久任务（指令通知没有 kind）。"""


def claim_sql(s: str, *, by_bucket: bool) -> str:
    bucket = " AND bucket = ANY(%(buckets)s::integer[])" if by_bucket else ""
    returning = ", ".join(f"t.{c}" for c in TASK_COLUMNS)
    return (
        f"WITH picked AS (SELECT task_id FROM {s}.tasks "
        "WHERE status = 'queued' AND owner IS NULL AND recipe IS NOT NULL AND name = ANY(%(names)s::text[])"
        f"{bucket} ORDER BY priority DESC, created_at, task_id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) "
        f"UPDATE {s}.tasks AS t SET owner = %(holder)s, lease_owner = %(holder)s, "
        "lease_until = %(until)s, lease_until_off = %(until_off)s "
        f"FROM picked WHERE t.task_id = picked.task_id AND t.owner IS NULL RETURNING {returning}"
    )


def claim(conn: Conn, s: str, request: QueuedClaim) -> list[TaskSnapshot]:
    statement = claim_statement(s, request)
    if statement is None:
        return []
    return claimed_snapshots(conn.execute(*statement).fetchall())


def claim_statement(s: str, request: QueuedClaim) -> tuple[str, dict[str, Any]] | None:
    """认领语句与参数；过滤值不可能匹配任何任务时返回 None（什么也不用发）。"""
    # text 存不下 NUL、integer 存不下 2**31 以上的桶号：这样的过滤值不可能匹配任何任务，直接去掉。
    names = sorted(name for name in request.names if "\x00" not in name)
    buckets = None if request.buckets is None else sorted(b for b in request.buckets if b < 2**31)
    if not names or buckets == []:
        return None
    until, until_off = split_dt(request.lease_until)
    params = {
        "names": names,
        "buckets": buckets,
        "limit": request.limit,
        "holder": request.holder,
        "until": until,
        "until_off": until_off,
    }
    return claim_sql(s, by_bucket=buckets is not None), params


def claimed_snapshots(rows: list[Any]) -> list[TaskSnapshot]:
    snapshots = [snapshot_from_row(row) for row in rows]
    # RETURNING 不保证顺序：按认领时用的同一顺序排好再交出。
    snapshots.sort(key=lambda snapshot: (-snapshot.priority, snapshot.created_at, snapshot.task_id))
    return snapshots


def claimable(snapshot: TaskSnapshot) -> bool:
    """新建的快照是不是待认领的持久任务（有配方、无人持有）：建好之后要通知 worker。"""
    return snapshot.recipe is not None and snapshot.owner is None


def create_notify_sql(create_sql: str) -> str:
    """建任务并（只在真的插入了时）通知 worker 的一条语句：``create_sql`` 末尾的
    ``SELECT count(*) FROM ins`` 换成对 ins 的每一行调一次 ``pg_notify`` 再计数。通知随这条语句的隐式事务
    一起提交才送达，重复 id（ins 为空）不通知；比"建好再单发一条 pg_notify"少一次往返
    （enqueue → worker 开始的时延与入队吞吐都在这上面）。

    ``pg_notify`` 是 volatile 函数，放在 FROM 里子查询的目标列表中不会被规划器省掉（子查询不会被上提）。
    """
    tail = "SELECT count(*) FROM ins"
    assert create_sql.endswith(tail), create_sql
    return (
        create_sql[: -len(tail)]
        + "SELECT count(*) FROM (SELECT pg_notify(%(notice_channel)s, %(notice_payload)s) FROM ins) AS sent"
    )


def notice_params(channel: str, snapshot: TaskSnapshot) -> dict[str, str]:
    """``create_notify_sql`` 的两个参数。"""
    payload = json.dumps({"kind": QUEUED_NOTICE, "task_id": snapshot.task_id, "bucket": snapshot.bucket})
    return {"notice_channel": channel, "notice_payload": payload}


def notify_claimable(conn: Conn, channel: str, created: list[TaskSnapshot]) -> None:
    """一批 create 提交之后：其中有待认领的持久任务就通知一次（一个事务一条通知，不是每行一条）。"""
    if not created:
        return
    buckets = {snapshot.bucket for snapshot in created}
    bucket = buckets.pop() if len(buckets) == 1 else None
    payload = json.dumps({"kind": QUEUED_NOTICE, "task_id": created[0].task_id, "bucket": bucket})
    conn.execute("SELECT pg_notify(%s, %s)", [channel, payload])


def missing_columns(conn: Conn, schema: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND table_name = 'tasks'",
        [schema],
    ).fetchall()
    present = {str(row[0]) for row in rows}
    if not present:
        return []
    return [name for name in _schema.LATER_TASK_COLUMNS if name not in present]


def add_later_columns(conn: Conn, schema: str) -> None:
    """给持久任务加入之前建的 schema 补列与认领索引（幂等；调用方持有建表的咨询锁）。"""
    for statement in _schema.later_ddl_statements(schema):
        conn.execute(statement)


__all__ = [
    "QUEUED_NOTICE",
    "add_later_columns",
    "claim",
    "claim_sql",
    "claim_statement",
    "claimable",
    "claimed_snapshots",
    "create_notify_sql",
    "missing_columns",
    "notice_params",
    "notify_claimable",
]
