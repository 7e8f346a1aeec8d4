"""PostgresTaskStore 的持久任务（issue 19）：认领（``claim_queued``）、新任务的 NOTIFY 与后补列的补建。

认领是一条语句：``FOR UPDATE SKIP LOCKED`` 挑出前 N 个可认领的行（别的认领者正锁着的行直接跳过，不排队
等它），同一语句里写上持有者与租约并 RETURNING 整行。UPDATE 再核对一次 ``owner IS NULL``：READ COMMITTED 下
被别人先提交认领的行不会被第二次取走。判据与顺序见 ``core/storage/claiming.py``。认领并开始
（``claim_queued(..., start=...)``）也是一条语句（``claim_start_sql``）：同样挑行、写持有者，同时推进到
starting 并插入 queued → starting 的迁移记录。

新建的无人持有的持久任务在同一事务里 ``pg_notify`` 到指令频道（载荷带 ``"queued"``）：worker 用
``listen`` 等通知，通知只是"快来看"的提示，丢了由轮询兜底。单个 create（``enqueue()``）把通知并进建任务的
那条语句（``create_notify_sql``：插入成功才通知，一次往返）；一批 create 每个事务只通知一次
（``notify_claimable``），不是每行一次——通知只说"有新的"，worker 反正要去认领才知道是哪几个。
"""

from __future__ import annotations

import functools
import json
import re
from typing import TYPE_CHECKING, Any

from chongming_task.core.storage.claiming import ClaimStart, QueuedClaim
from chongming_task.core.triggers import TRIGGER_STARTING
from chongming_task.models import TaskSnapshot
from chongming_task.states import TaskStatus
from chongming_task.stores.postgres import _schema
from chongming_task.stores.postgres._codec import (
    TASK_COLUMNS,
    TRANSITION_COLUMNS,
    array_literal,
    split_dt,
    trusted_snapshot_from_row,
)

if TYPE_CHECKING:
    import psycopg

    Conn = psycopg.Connection[Any]

QUEUED_NOTICE = "queued"
"""NOTIFY 载荷里 ``kind`` 的值：有新的待认领持久任务（指令通知没有 kind）。"""


def _recheck(condition: str) -> str:
    """认领的 UPDATE 对挑中的行的复查条件，包成 ``(...) IS TRUE``：在 WHERE 里与原条件逐行等价（这几列
    不为 NULL 时真假相同，为 NULL 时两者都不取这一行），写法上却既不是可走索引的条件、也推不出任何部分索引
    的谓词——规划器只能经 ``t.task_id = picked.task_id`` 按主键找这一两行，复查只作过滤。

    为什么（issue 19）：没有统计信息时（新建的表、``autovacuum = off`` 的服务器、一次灌进大量任务之后
    autoanalyze 还没来得及跑），``status = 'queued' AND owner IS NULL`` 按默认选择率估成一行，规划器于是
    拿 ``tasks_unsucceeded_idx`` 位图扫描出**全部**排队中的任务、再与挑中的那一行做连接过滤——每次认领
    都把整个队列读一遍（1,000 个排队任务时 ``Rows Removed by Join Filter: 950``，一次认领约 1 ms 服务器
    时间），worker 的吞吐随队列变长而下降。复查本身照旧：READ COMMITTED 下被别人先提交认领的行，
    UPDATE 按最新版本重新核对整个 WHERE（EvalPlanQual），不会被第二次取走。"""
    return f"({condition}) IS TRUE"


@functools.lru_cache(maxsize=64)
def claim_sql(s: str, *, by_bucket: bool) -> str:
    """认领语句的文本（按 schema 与有无桶过滤缓存：worker 每认领一次都要它，不每次重新拼）。"""
    bucket = " AND bucket = ANY(%(buckets)s::integer[])" if by_bucket else ""
    returning = ", ".join(f"t.{c}" for c in TASK_COLUMNS)
    return (
        f"WITH picked AS (SELECT task_id FROM {s}.tasks "
        "WHERE status = 'queued' AND owner IS NULL AND recipe IS NOT NULL AND name = ANY(%(names)s::text[])"
        f"{bucket} ORDER BY priority DESC, created_at, task_id LIMIT %(limit)s FOR UPDATE SKIP LOCKED) "
        f"UPDATE {s}.tasks AS t SET owner = %(holder)s, lease_owner = %(holder)s, "
        "lease_until = %(until)s, lease_until_off = %(until_off)s "
        f"FROM picked WHERE t.task_id = picked.task_id AND {_recheck('t.owner IS NULL')} "
        f"RETURNING {returning}"
    )


_STARTS = "t.attempt < t.max_attempts"
"""状态机 ``mark_starting`` 肯开始的行（``attempt + 1 > max_attempts`` 时它抛 AttemptsExhausted）。"""


def _on_start(value: str, column: str) -> str:
    return f"{column} = CASE WHEN {_STARTS} THEN {value} ELSE t.{column} END"


_START_SETS = ", ".join(
    _on_start(value, column)
    for column, value in (
        ("status", f"'{TaskStatus.STARTING.value}'"),
        ("status_version", "t.status_version + 1"),
        ("attempt", "t.attempt + 1"),
        ("started_at", "%(at)s"),
        ("started_at_off", "%(at_off)s"),
        ("retry_at", "NULL"),
        ("retry_at_off", "NULL"),
        ("failure", "NULL"),
        ("pid", "NULL"),
        ("executor", "COALESCE(%(executor)s, t.executor)"),
    )
)
"""queued → starting 在行上的改动，逐列照搬 ``StateMachine.mark_starting``（attempt + 1、started_at、清掉
retry_at / failure / pid、给了执行器名才写它）与 ``_apply``（版本 + 1）。状态机不肯开始的行（尝试预算已用完）
每列保持原值：只认领。"""


_HISTORY = {
    "task_id": "task_id",
    "version": "status_version",
    "from_status": f"'{TaskStatus.QUEUED.value}'",
    "to_status": f"'{TaskStatus.STARTING.value}'",
    "trigger": "%(trigger)s",
    "actor": "NULL",
    "reason": "NULL",
    "at": "%(at)s",
    "at_off": "%(at_off)s",
}
"""queued → starting 的迁移记录：列 → 取值（读 upd 的新值：version 是开始之后的版本）。与
``Transition._trusted(task_id, queued, starting, TRIGGER_STARTING, None, None, version, at)`` 逐项相同。"""
assert set(_HISTORY) == set(TRANSITION_COLUMNS), "迁移记录表的列变了：认领并开始的语句要跟着改"


@functools.lru_cache(maxsize=64)
def claim_start_sql(s: str, *, by_bucket: bool) -> str:
    """认领并开始（``claim_queued(..., start=...)``）的一条语句：挑行、写持有者与租约、推进到 starting、
    插入 queued → starting 的迁移记录，全在一条语句的隐式事务里（一次往返、一次提交）。

    为什么不照认领 + save 的样子分开发（旧实现：``BEGIN``、认领、每行一条 save、``COMMIT``，四次往返）：
    每次认领多三次往返与三次 execute 的客户端开销，worker 一侧每任务的客户端 CPU 大半花在这里；同一行
    还要被更新两次（两个新元组、两遍索引维护）。迁移规则仍只有状态机那一份：这里的改动逐列对应
    ``mark_starting``（见 ``_START_SETS``），契约用例（``test_claim_and_start_writes_starting_exactly_as_the_
    state_machine_would``）与 PostgreSQL 的专门用例（逐字段对照 ``claiming.start_claimed`` 的结果）盯着两边
    一致——状态机那边改了，它们会失败。

    判据、顺序与并发语义与 ``claim_sql`` 相同（``FOR UPDATE SKIP LOCKED``，UPDATE 再核对 ``owner IS NULL``
    与 queued）：同一任务无论多少认领者同时来取，只有一个开始它。迁移记录只为真的开始了的行写（hist 读 upd
    的新值：版本即开始之后的版本），与任务行同一语句提交：历史没有空洞，任务体开始之前 starting 已落库。
    """
    return (
        "WITH "
        + _claim_start_ctes(s, by_bucket=by_bucket)
        + " SELECT "
        + ", ".join(TASK_COLUMNS)
        + " FROM upd"
    )


def _claim_start_ctes(
    s: str, *, by_bucket: bool, prefix: str = "", guard: str = "", history: bool = True
) -> str:
    """``claim_start_sql`` 的三个 CTE（挑行、写持有者并开始、写迁移记录）。``prefix`` 加在 CTE 名字与
    占位参数的名字前面（与 save 的 CTE / 参数拼进同一条语句时不重名，见 ``save_claim_start_sql``）；
    ``guard`` 是挑行的附加条件；``history=False`` 时不要第三个（迁移记录由调用方并进别的 INSERT，
    见 ``_history_rows``）。"""
    bucket = " AND bucket = ANY(%(buckets)s::integer[])" if by_bucket else ""
    returning = ", ".join(f"t.{c}" for c in TASK_COLUMNS)
    queued, starting = TaskStatus.QUEUED.value, TaskStatus.STARTING.value
    picked, upd, hist = f"{prefix}picked", f"{prefix}upd", f"{prefix}hist"
    recheck = _recheck(f"t.owner IS NULL AND t.status = '{queued}'")
    ctes = (
        f"{picked} AS (SELECT task_id FROM {s}.tasks "
        f"WHERE status = '{queued}' AND owner IS NULL AND recipe IS NOT NULL "
        f"AND name = ANY(%(names)s::text[]){bucket}{guard} "
        "ORDER BY priority DESC, created_at, task_id LIMIT %(limit)s FOR UPDATE SKIP LOCKED), "
        f"{upd} AS (UPDATE {s}.tasks AS t SET owner = %(holder)s, lease_owner = %(holder)s, "
        f"lease_until = %(until)s, lease_until_off = %(until_off)s, {_START_SETS} "
        f"FROM {picked} WHERE t.task_id = {picked}.task_id "
        f"AND {recheck} "
        f"RETURNING {returning})"
    )
    if history:
        ctes += (
            f", {hist} AS (INSERT INTO {s}.transitions ({', '.join(_HISTORY)}) "
            f"SELECT {', '.join(_HISTORY.values())} FROM {upd} WHERE status = '{starting}')"
        )
    if prefix:
        ctes = re.sub(r"%\((\w+)\)s", rf"%({prefix}\1)s", ctes)
    return ctes


_SAVED_PREFIX = "c_"
"""``save_claim_start_sql`` 里认领那一半的 CTE 与参数名的前缀（save 那一半照用它自己的名字）。"""


@functools.lru_cache(maxsize=64)
def save_claim_start_sql(s: str, save_sql: str, save_result: str, *, by_bucket: bool) -> str:
    """``claim_queued(..., start=ClaimStart(save=...))`` 的一条语句：先 save（``save_sql``，即
    ``Sql.save`` / ``save_one`` / ``save_no_history`` 及带租约条件的变体），再认领并开始，一条语句的隐式
    事务、一次往返、一次提交。

    ``save_sql`` 以 ``save_result``（"改到几行、任务在不在"的那句 SELECT）结尾：去掉它，接上认领并开始的
    CTE（名字与参数加 ``c_`` 前缀；save 带迁移记录时认领的那条并进 save 的 ``hist``，只接挑行与写行两个，
    见下面的注释），最后一句照旧交回 save 的两列，后面跟认领到的行（LEFT JOIN：一行也没认领到时仍有一行，
    认领的列为 NULL）。

    为什么 save 是认领的前提、怎样做到：挑行带 ``EXISTS (SELECT 1 FROM upd)``——save 的 UPDATE 改到了那一行
    才挑（版本不符时 upd 为空，认领什么也不挑，整条语句什么也不写，与单独一次失败的 save 相同）。同一条语句
    里各 CTE 看到的是同一个快照，所以挑行还排除被 save 的那个任务本身（``task_id <> %(task_id)s``）：它在
    快照里可能还是 queued、无人持有，同一条语句里改同一行两次是 PostgreSQL 不允许的。"""
    assert save_sql.endswith(save_result), save_sql
    head = save_sql[: -len(save_result)].rstrip()
    guard = " AND task_id <> %(task_id)s AND EXISTS (SELECT 1 FROM upd)"
    # save 写迁移记录时（它的最后一个 CTE 是 hist），认领的那条 queued → starting 并进同一条 INSERT
    # （UNION ALL），不再自成一个 CTE：服务器上每条语句少一个写表节点（一次 INSERT 的执行器准备、
    # 分区路由与索引插入的准备）。认领的 CTE 不能被前面的 CTE 引用（非 RECURSIVE 的 WITH 只能引用在它
    # 之前的），所以 hist 挪到认领的 CTE 之后；同一条语句里各 CTE 的执行先后不由书写顺序决定，语义不变。
    merged = f", hist AS ({_HISTORY_INSERT_OPEN.format(s=s)}"
    at = head.rfind(merged)
    conflict = " ON CONFLICT DO NOTHING)"
    merge = at >= 0 and head.endswith(conflict)
    history = head[at + len(", hist AS (") : -len(conflict)] if merge else ""
    if merge:
        head = head[:at]
    # guard 里的 %(task_id)s 是 save 的参数：先拼好认领的 CTE（它们的占位参数加前缀），再把 guard 放进去。
    marker = "\x00guard\x00"
    ctes = _claim_start_ctes(
        s, by_bucket=by_bucket, prefix=_SAVED_PREFIX, guard=marker, history=not merge
    ).replace(marker, guard)
    if merge:
        ctes += f", hist AS ({history} UNION ALL {_history_rows(_SAVED_PREFIX)}{conflict}"
    return (
        f"{head}, {ctes} {save_result}, c.* FROM (SELECT 1) AS one LEFT JOIN {_SAVED_PREFIX}upd AS c ON true"
    )


_HISTORY_INSERT_OPEN = "INSERT INTO {s}.transitions (" + ", ".join(TRANSITION_COLUMNS) + ") SELECT "
"""save 的迁移记录 INSERT 的开头（``_sql.transitions_insert`` / ``one_transition_insert``：列按
``TRANSITION_COLUMNS`` 的顺序）：据此在 save 的语句里认出它，把认领的那条并进去。"""

_HISTORY_TYPES = {
    "trigger": "text",
    "actor": "text",
    "reason": "text",
    "at": "timestamptz",
    "at_off": "bigint",
}
"""并进 UNION ALL 时，``_HISTORY`` 里参数与 NULL 的显式类型（与 save 那一半的列类型一致，不靠推断）。"""


def _history_rows(prefix: str) -> str:
    """认领并开始的那条迁移记录（``_HISTORY``），作为并进 save 的迁移记录 INSERT 的 UNION ALL 一支：
    列按 ``TRANSITION_COLUMNS`` 的顺序，参数加 ``prefix``，只为真的开始了的行写（与 ``hist`` CTE
    同一条件）。"""
    values = []
    for column in TRANSITION_COLUMNS:
        value = _HISTORY[column]
        if column in _HISTORY_TYPES:
            value = f"{value}::{_HISTORY_TYPES[column]}"
        values.append(re.sub(r"%\((\w+)\)s", rf"%({prefix}\1)s", value))
    starting = TaskStatus.STARTING.value
    return f"SELECT {', '.join(values)} FROM {prefix}upd WHERE status = '{starting}'"


def claim_start_statement(
    s: str, request: QueuedClaim, start: ClaimStart
) -> tuple[str, dict[str, Any]] | None:
    """``claim_start_sql`` 的语句与参数；过滤值不可能匹配任何任务时返回 None。"""
    statement = claim_statement(s, request)
    if statement is None:
        return None
    params = statement[1]
    params["at"], params["at_off"] = split_dt(start.at)
    params["executor"] = start.executor
    params["trigger"] = TRIGGER_STARTING
    return claim_start_sql(s, by_bucket=params["buckets"] is not None), params


def save_claim_start_params(save_params: dict[str, Any], claim_params: dict[str, Any]) -> dict[str, Any]:
    """``save_claim_start_sql`` 的参数：save 的原样，认领并开始的加 ``c_`` 前缀。"""
    params = dict(save_params)
    params.update({f"{_SAVED_PREFIX}{name}": value for name, value in claim_params.items()})
    return params


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
        # 名字集合以数组的文本字面量传（语句里 ::text[]）：列表参数每次执行都要 psycopg 逐个元素找 dumper
        # （纯 Python），worker 每认领一次就付一遍；一段文本直接发出去，服务器按 text[] 的输入函数解析。
        "names": _names_literal(tuple(names)),
        "buckets": buckets,
        "limit": request.limit,
        "holder": request.holder,
        "until": until,
        "until_off": until_off,
    }
    return claim_sql(s, by_bucket=buckets is not None), params


@functools.lru_cache(maxsize=64)
def _names_literal(names: tuple[str, ...]) -> str:
    """升序的任务名 → ``text[]`` 的文本字面量（``array_literal``：每个元素加引号、转义）。worker 每次认领的
    名字集合都一样：按它缓存。"""
    literal = array_literal(names)
    assert literal is not None
    return literal


def claimed_snapshots(rows: list[Any]) -> list[TaskSnapshot]:
    # 行出自本库的快照表（写入时已逐字段校验）：不再走快照构造与配方参数的校验（见 trusted_from_row）。
    snapshots = [trusted_snapshot_from_row(row) for row in rows]
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


_json_string = json.encoder.encode_basestring_ascii


def notice_params(channel: str, snapshot: TaskSnapshot) -> dict[str, str]:
    """``create_notify_sql`` 的两个参数。"""
    # 与 json.dumps({"kind": ..., "task_id": ..., "bucket": ...}) 逐字相同，只是不为每次入队新建一个
    # C 编码器：task_id 按 JSON 字符串转义（ASCII），桶号是整数或 null。
    bucket = snapshot.bucket
    payload = (
        f'{{"kind": "{QUEUED_NOTICE}", "task_id": {_json_string(snapshot.task_id)}, '
        f'"bucket": {"null" if bucket is None else int(bucket)}}}'
    )
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
    "claim_start_sql",
    "claim_start_statement",
    "claim_statement",
    "claimable",
    "claimed_snapshots",
    "create_notify_sql",
    "missing_columns",
    "notice_params",
    "notify_claimable",
    "save_claim_start_params",
    "save_claim_start_sql",
]
