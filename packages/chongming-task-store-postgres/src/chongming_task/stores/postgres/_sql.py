"""PostgresTaskStore 的 SQL 文本：由列清单推导的语句（一个 schema 渲染一次），以及 TaskQuery → WHERE。"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from chongming_task.core.compact_json import acyclic_encoder
from chongming_task.core.storage.checks import check_transitions
from chongming_task.core.storage.sql import RowCodec, escape_like
from chongming_task.core.storage.values import QueryOrder, TaskQuery
from chongming_task.models import Transition
from chongming_task.states import TaskStatus
from chongming_task.stores.postgres import _schema
from chongming_task.stores.postgres._claim import create_notify_sql
from chongming_task.stores.postgres._codec import (
    COMMAND_COLUMNS,
    DIALECT,
    NODE_COLUMNS,
    NODES,
    SAVE_COLUMNS,
    SNAPSHOTS,
    TASK_COLUMNS,
    TRANSITION_COLUMNS,
    TRANSITIONS,
    check_text,
    unnest_element,
)


def _cols(columns: Iterable[str], prefix: str = "") -> str:
    return ", ".join(prefix + c for c in columns)


def _values(codec: RowCodec) -> list[tuple[str, str]]:
    """(物理列名, 占位符) 对：INSERT 的 VALUES 与 UPDATE 的 SET 都由它生成。"""
    return [(name, DIALECT.value_expr(c, name)) for c in codec.logical for name in DIALECT.physical(c)]


_ROW_TYPES = ", ".join(
    f"{name} {DIALECT.array_type(column, name).removesuffix('[]')}"
    for column in TRANSITIONS.logical
    for name in DIALECT.physical(column)
)
"""``jsonb_to_recordset`` 的列定义：迁移记录的每个物理列与它的类型。"""


def transitions_insert(s: str, guard: str) -> str:
    """从一个 JSON 数组（``%(t_rows)s``，每项一条迁移记录）展开出多行插入；同一行已存在则跳过（幂等）。

    为什么是一个 JSON 参数而不是每列一个数组：psycopg 为每个列表参数逐个元素找转换器（纯 Python），
    九个数组占了一次 save 客户端 CPU 的大半；一段 JSON 文本由 json.dumps（C 实现）一次编好，服务器端
    ``jsonb_to_recordset`` 按上面的类型逐列转换（时间戳带偏移的 ISO 文本，整数按 numeric 精确转换）。

    迁移记录表按 ``at`` 分区（第 2 版），主键只能是 (task_id, version, at)：重放同一条记录撞主键、
    被 ``ON CONFLICT DO NOTHING`` 跳过。"同一 (task_id, version) 只留一条"对 create / save 天然成立
    （任务行的版本校验挡住了重复写），``append`` 另加一个按 (task_id, version) 的 NOT EXISTS（见 ``Sql``）。
    ``fmt``：参数的传输格式（``"b"`` = 二进制：上千个元素的数组按二进制编码，客户端快几倍）。
    """
    return (
        f"INSERT INTO {s}.transitions ({_cols(TRANSITION_COLUMNS)}) "
        f"SELECT {_cols(TRANSITION_COLUMNS, 'x.')} "
        f"FROM jsonb_to_recordset(%(t_rows)s::jsonb) AS x({_ROW_TYPES}) "
        f"{guard} ON CONFLICT DO NOTHING"
    )


ONE_TRANSITION_PARAMS = tuple(f"t_{name}" for name in TRANSITION_COLUMNS)
"""只写一条迁移记录时它的每个物理列的参数名（``one_transition_insert``）。"""


def one_transition_insert(s: str, guard: str) -> str:
    """只写一条迁移记录时的插入（建任务的 queued、一次 save 只前进一步——最常见的两种写）：每列一个标量
    参数 ``%(t_<列>)s``，不必先 json.dumps 成一段文本（时间戳逐个经回调格式化）、服务器再
    ``jsonb_to_recordset`` 展开。写下的行与 :func:`transitions_insert` 相同（同样
    ``ON CONFLICT DO NOTHING``）。"""
    types = dict(item.split(" ", 1) for item in _ROW_TYPES.split(", "))
    values = ", ".join(
        f"%({param})s::{types[name]}"
        for param, name in zip(ONE_TRANSITION_PARAMS, TRANSITION_COLUMNS, strict=True)
    )
    columns = _cols(TRANSITION_COLUMNS)
    return f"INSERT INTO {s}.transitions ({columns}) SELECT {values} {guard} ON CONFLICT DO NOTHING"


def one_transition_params(record: Transition) -> dict[str, Any]:
    """一条迁移记录 → ``one_transition_insert`` 的参数（记录已经过检查）。"""
    return dict(zip(ONE_TRANSITION_PARAMS, TRANSITIONS.params(record).values(), strict=True))


def _json_value(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"迁移记录里有 JSON 写不下的值：{value!r}")  # pragma: no cover - 列只有文本、整数、时间戳


def tasks_unnest() -> tuple[str, str]:
    """create_many 的任务行：每个物理列一个数组参数 ``%(k_<列>)s``，``unnest`` 成多行。

    返回 (FROM 里的 unnest(...) AS x(...)，SELECT 里逐列的表达式)。jsonb 与 text[] 列以文本数组传入、
    在 SELECT 里逐行转换（多维数组不能按行 unnest）。数组按二进制传输（``%(...)b``）：一千个时间戳的数组，
    文本格式在客户端要逐个格式化，二进制快一个数量级。"""
    arrays: list[str] = []
    selects: list[str] = []
    for column in SNAPSHOTS.logical:
        for name in DIALECT.physical(column):
            element, convert = unnest_element(column, name)
            arrays.append(f"%(k_{name})b::{element}[]")
            selects.append(convert.format(f"x.{name}"))
    return f"unnest({', '.join(arrays)}) AS x({_cols(TASK_COLUMNS)})", ", ".join(selects)


_JSONB_BINARY_VERSION = b"\x01"


def copy_types(codec: RowCodec) -> tuple[list[str], tuple[int, ...]]:
    """二进制 COPY 时每个物理列交给 psycopg 的类型（``Copy.set_types``），以及 jsonb 列的位置。

    jsonb 列声明成 bytea：值由 :func:`copy_row` 换成 jsonb 的二进制格式（版本字节 1 + JSON 文本，文本已经过
    ``json_text`` 校验），psycopg 原样发出字节——声明成 jsonb 的话它会把已编好的文本再 json.dumps 一遍。
    标签、桶号按数组类型；其余与 ``unnest`` 的元素类型相同。"""
    types: list[str] = []
    jsonb: list[int] = []
    for column in codec.logical:
        for name in DIALECT.physical(column):
            element, convert = unnest_element(column, name)
            if convert == "{}::jsonb":
                jsonb.append(len(types))
                element = "bytea"
            elif convert != "{}":
                element = convert.removeprefix("{}::")
            types.append(element)
    return types, tuple(jsonb)


def copy_row(params: dict[str, Any], jsonb: tuple[int, ...]) -> tuple[Any, ...]:
    """``RowCodec.params`` 的结果（键序即列序）→ COPY 的一行：jsonb 列换成二进制格式（见 ``copy_types``）。
    元组：只含标量的行循环 GC 扫到一次就不再追踪（一批的行要活到 COPY 发完）。"""
    row = tuple(params.values())
    for index in jsonb:
        if row[index] is not None:
            break
    else:
        return row  # 最常见：没有 JSON 值（排队中的任务、迁移记录）
    values = list(row)
    for index in jsonb:
        text = values[index]
        if text is not None:
            values[index] = _JSONB_BINARY_VERSION + text.encode()
    return tuple(values)


TASK_COPY_TYPES, TASK_COPY_JSONB = copy_types(SNAPSHOTS)
TRANSITION_COPY_TYPES, TRANSITION_COPY_JSONB = copy_types(TRANSITIONS)


def transition_params(transitions: Sequence[Transition]) -> dict[str, Any]:
    """迁移记录 → ``{"t_rows": JSON 文本}``（见 ``transitions_insert``）。文本的合法性（NUL 等）先检查；
    ensure_ascii=False：孤立的代理项在编码成 UTF-8 时报错，与别的文本参数走同一条"存不下"的路径。"""
    check_transitions(None, transitions)
    return checked_transition_params(transitions)


def checked_transition_params(transitions: Sequence[Transition]) -> dict[str, Any]:
    """``transition_params`` 去掉检查：给刚 ``check_transitions`` 过这些记录的调用方（create、save），
    不再把同样的检查跑第二遍。"""
    return rows_param([TRANSITIONS.params(record) for record in transitions])


def rows_param(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """已编好的迁移记录行（``TRANSITIONS.params``）→ ``{"t_rows": JSON 文本}``。"""
    return {"t_rows": _encode_rows(rows)}


# 与 ``json.dumps(rows, ensure_ascii=False, default=_json_value, separators=(",", ":"))`` 逐字相同，复用一个
# C 编码器（worker 每个任务的终态 save 编一次，见 core/compact_json.py）。不查循环引用：行是
# ``TRANSITIONS.params`` 刚编出的一层字典，值只有文本、整数与时间，不可能有环。
_encode_rows = acyclic_encoder(_json_value, allow_nan=True)


TOUCH_MANY_COLUMNS = {
    "task_id": "text",
    "progress": "text",
    "heartbeat_at": "timestamptz",
    "heartbeat_at_off": "bigint",
    "lease_owner": "text",
    "lease_until": "timestamptz",
    "lease_until_off": "bigint",
}
"""touch_many 按列传入的数组：参数名 → 元素类型（进度以 JSON 文本传入，语句里转 jsonb）。"""


_APPEND_GUARD = (
    "WHERE NOT EXISTS (SELECT 1 FROM missing) AND NOT EXISTS (SELECT 1 FROM {s}.transitions o "
    "WHERE o.task_id = x.task_id AND o.version = x.version)"
)
"""append 的写入条件：批里没有未知任务，且这个 (task_id, version) 还没有（哪怕 ``at`` 不同）。"""


def numbered(text: str) -> str:
    """``%s`` 占位符的语句 → 按出现顺序编号的 ``$1, $2, …``（交给 ``psycopg.RawCursor`` 原样发出）。

    为什么：psycopg 的普通游标每次执行都要把 ``%s`` 语句切开、换成 ``$n``——只有不长于 4,096 字节且参数
    不多于 50 个的语句才缓存转换结果。组提交的批量语句（``save_batch`` 两项起、``write_batch``）两条都
    超过：每次执行在客户端用正则把五六千字节重新切一遍（py-spy 的 GIL 剖面里占客户端 CPU 的近两成）。
    这里在渲染语句时换好一次，执行时不再转换。语句里不能有别的 ``%``（有就是渲染错了，直接报错）。"""
    parts = text.split("%s")
    assert all("%" not in part for part in parts), "批量语句里只能有 %s 占位符"
    return parts[0] + "".join(f"${index}{part}" for index, part in enumerate(parts[1:], start=1))


def lock_rows(s: str, source: str, guard: str = "") -> str:
    """组提交的批量写里"先按 task_id 顺序锁住这几行"的子查询（``locked`` CTE 的正文）：``source`` 里的每个
    task_id 逐个按主键查找、加 ``FOR NO KEY UPDATE`` 锁，返回锁住了的 task_id 与一个常量列 ``k``（恒为 0）。

    为什么逐个（LATERAL）而不是 ``WHERE t.task_id IN (SELECT task_id FROM u)``：这些语句是预备语句，
    psycopg 执行第 5 次起服务器用一份通用计划（generic plan）一直用到连接关闭。计划在表还小的时候定下
    （新建的库、从没 ANALYZE 过——本机 autovacuum 关着——规划器按 10 页、约 110 行估），对 2 项以上的批
    它选"顺序扫描整张 tasks 建哈希表"，之后表长到几千、几百万行也照用：每批扫全表（2,000 个任务的基准
    里一批要 1 ms 服务器 CPU，是整轮服务器 CPU 的大半，且随表长大而线性变慢）。LATERAL 子查询里带锁定子句，
    规划器不能把它展平成连接，只能对外层每一行做一次主键查找：与表的大小、有没有统计信息都无关。
    外层按 ``COLLATE "C"`` 排好序，嵌套循环按这个顺序加锁——与 ``touch_many``、``renew_leases``、
    ``save_many`` 的管道同一顺序（按 task_id 的码点序），并发的批量写不互相死锁。``guard`` 是加在外层的
    额外条件（``write_batch`` 用它让插入先于加锁）。

    ``k``：见 ``LOCKED_FILTER``。"""
    return (
        f"SELECT v.task_id, 0 AS k FROM (SELECT task_id FROM {source}{guard} "
        'ORDER BY task_id COLLATE "C") AS v, '
        f"LATERAL (SELECT 1 FROM {s}.tasks t WHERE t.task_id = v.task_id FOR NO KEY UPDATE) AS l"
    )


LOCKED_FILTER = "t.task_id IN (SELECT task_id FROM locked WHERE k = 0)"
"""UPDATE 只写 ``locked`` 里的行。``k = 0`` 恒真，只为计划：CTE 的输出没有统计信息，规划器给这个等值条件
默认的 0.5 % 选择度，把 ``locked`` 估成 1 行——于是它从这 1 行出发、按主键嵌套循环找到 UPDATE 的目标行，
而不是（估 2 行以上时）顺序扫描整张 tasks 做哈希连接（原因同 ``lock_rows``）。正确性与计划无关：
无论怎么连接，写的都是同样几行。"""


def exists_row(s: str, alias: str) -> str:
    """批量写的结果列"这个任务在不在"（判定冲突还是不存在）。``OFFSET 0`` 让它留作逐行的主键查找——
    不加时，2 项以上的批里规划器把 ``EXISTS`` 换成"哈希子计划"，先顺序扫描整张表建哈希表
    （见 ``lock_rows``）。"""
    return f"EXISTS (SELECT 1 FROM {s}.tasks e WHERE e.task_id = {alias}.task_id OFFSET 0)"


class Sql:
    """一个 schema 下的全部语句，构造时渲染一次（schema 名已转义）。"""

    def __init__(self, schema: str) -> None:
        s = _schema.quote_ident(schema)
        self.s = s
        task_cols = _cols(TASK_COLUMNS)
        self.task_cols = task_cols
        self.create = (
            f"WITH ins AS (INSERT INTO {s}.tasks ({task_cols}) "
            f"VALUES ({', '.join(expr for _, expr in _values(SNAPSHOTS))}) "
            "ON CONFLICT (task_id) DO NOTHING RETURNING task_id), "
            f"hist AS ({transitions_insert(s, 'WHERE EXISTS (SELECT 1 FROM ins)')}) "
            "SELECT count(*) FROM ins"
        )
        # 最常见的建任务（只带 queued 那一条迁移记录）：迁移记录按标量参数写（见 one_transition_insert）。
        self.create_one = self.create.replace(
            transitions_insert(s, "WHERE EXISTS (SELECT 1 FROM ins)"),
            one_transition_insert(s, "WHERE EXISTS (SELECT 1 FROM ins)"),
        )
        # 待认领的持久任务：同一条语句里插入成功才 pg_notify（见 _claim.create_notify_sql）。
        self.create_notify = create_notify_sql(self.create)
        # enqueue() 的建任务（待认领、只带 queued 那一条迁移记录）：通知 + 迁移记录按标量参数写。
        self.create_one_notify = create_notify_sql(self.create_one)
        # create_many：一批任务一条语句（一次往返、一次事务）。任务行按列数组 unnest，已存在的 id 被
        # ON CONFLICT 跳过、不出现在 RETURNING 里（它们是 DuplicateTaskId）；迁移记录只为真正插入的任务写入，
        # 与逐个 create 的 "WHERE EXISTS (SELECT 1 FROM ins)" 同一规则：重复的那一项什么也不写。
        rows, selects = tasks_unnest()
        self.create_many = (
            f"WITH ins AS (INSERT INTO {s}.tasks ({task_cols}) SELECT {selects} FROM {rows} "
            "ON CONFLICT (task_id) DO NOTHING RETURNING task_id), "
            f"hist AS ({transitions_insert(s, 'WHERE x.task_id IN (SELECT task_id FROM ins)')}) "
            "SELECT task_id FROM ins"
        )
        # create_many 的快路径：两张表各一次二进制 COPY（见 PostgresTaskStore.create_many）。
        self.copy_tasks = f"COPY {s}.tasks ({task_cols}) FROM STDIN (FORMAT BINARY)"
        self.copy_transitions = (
            f"COPY {s}.transitions ({_cols(TRANSITION_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
        )
        # 热路径：版本校验的 UPDATE 与迁移记录的 INSERT 在同一条语句里，一次往返、天然原子。
        # 版本不符时 upd 为空，hist 的 WHERE EXISTS 也就不插入任何一行——冲突时什么也不写。
        saved = frozenset(SAVE_COLUMNS)
        assignments = ", ".join(f"{c} = {expr}" for c, expr in _values(SNAPSHOTS) if c in saved)
        guard = "task_id = %(task_id)s AND status_version = %(expect_version)s"

        def update(where: str) -> str:
            return f"UPDATE {s}.tasks SET {assignments} WHERE {where} RETURNING 1"

        hist = f"hist AS ({transitions_insert(s, 'WHERE EXISTS (SELECT 1 FROM upd)')}) "
        # 第二列"任务在不在"只在没改到行时才有用（判定据它分辨不存在与版本冲突）：改到了行，任务当然在。
        # OR 先看 upd，真时短路，按主键查 tasks 的那个 InitPlan 不执行（EXPLAIN ANALYZE 里是 never
        # executed）——每次成功的 save 少一次索引下探与取堆元组（issue 19：worker 每个任务一次 save）。
        # 结果与原来的 EXISTS 逐值相同：UPDATE 找得到的行，同一语句快照里的 EXISTS 也看得到。
        result = (
            "SELECT (SELECT count(*) FROM upd), EXISTS (SELECT 1 FROM upd) "
            f"OR EXISTS (SELECT 1 FROM {s}.tasks WHERE task_id = %(task_id)s)"
        )
        self.save_result = result  # 各种 save 语句共同的最后一句（认领并开始拼在它前面，见 _claim）
        self.save = f"WITH upd AS ({update(guard)}), {hist}{result}"
        self.save_no_history = f"WITH upd AS ({update(guard)}) {result}"
        # 只前进一步的 save（一条迁移记录）：同上，迁移记录按标量参数写。
        self.save_one = (
            f"WITH upd AS ({update(guard)}), "
            f"hist AS ({one_transition_insert(s, 'WHERE EXISTS (SELECT 1 FROM upd)')}) {result}"
        )
        # save(lease_expired_before=...)：版本之外还要求租约此刻仍已过期（与查询条件同一判据）。
        # 行先以 SKIP LOCKED 锁住：别的会话正锁着它（写到一半，或是一个失联节点留在服务器上的事务）时
        # 不排队等锁，这一次什么也不写、当作冲突报告（reconcile 记为 skipped，下一轮再判）。接管别人的
        # 任务时有人正在写这一行，本来就说明它还有人管；而等锁可能要等到那条死连接的 TCP keepalive。
        # READ COMMITTED 下被别人刚提交改过的行，锁定时按最新版本复查 WHERE，版本与租约的判据照旧。
        target = (
            f"WITH target AS (SELECT task_id FROM {s}.tasks WHERE {guard} "
            "AND (lease_until IS NULL OR lease_until < %(lease_expired_before)s) "
            "FOR NO KEY UPDATE SKIP LOCKED), "
            f"upd AS ({update('task_id IN (SELECT task_id FROM target)')})"
        )
        self.save_leased = f"{target}, {hist}{result}"
        self.save_no_history_leased = f"{target} {result}"
        self.current_version = f"SELECT status_version FROM {s}.tasks WHERE task_id = %s"
        self.current_lease = f"SELECT status_version, lease_until FROM {s}.tasks WHERE task_id = %s"
        self.get = f"SELECT {task_cols} FROM {s}.tasks WHERE task_id = %s"
        # 批里有不存在的任务 → 整批不写（否则留下 prune 永远删不掉的孤儿历史），并报出是哪些。
        self.append = (
            "WITH missing AS (SELECT DISTINCT m.task_id "
            "FROM jsonb_to_recordset(%(t_rows)s::jsonb) AS m(task_id text) "
            f"WHERE NOT EXISTS (SELECT 1 FROM {s}.tasks t WHERE t.task_id = m.task_id)), "
            f"ins AS ({transitions_insert(s, _APPEND_GUARD.format(s=s))}) "
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
        # 有日志表时（见 _logs）在同一条语句里连同日志一起删；第 1 版旧 schema 可能还没有这张表。
        self.prune_with_logs = self.prune.replace(
            "dt AS (",
            f"dl AS (DELETE FROM {s}.task_logs WHERE task_id IN (SELECT task_id FROM victims)), dt AS (",
        )
        node_cols = _cols(NODE_COLUMNS)
        node_values = ", ".join(expr for _, expr in _values(NODES))
        # ON CONFLICT DO UPDATE 在并发下也不会撞唯一约束：同一 owner 的并发发布按提交先后覆盖。
        self.publish_node = (
            f"INSERT INTO {s}.nodes ({node_cols}) VALUES ({node_values}) ON CONFLICT (owner) DO UPDATE SET "
            + ", ".join(f"{c} = EXCLUDED.{c}" for c in NODE_COLUMNS if c != "owner")
        )
        self.list_nodes = f"SELECT {node_cols} FROM {s}.nodes ORDER BY owner"
        self.remove_node = f"DELETE FROM {s}.nodes WHERE owner = %s RETURNING 1"
        # touch_many：一条语句更新一批任务（为什么不用多语句事务见 PostgresTaskStore.touch_many）。
        # 每一项没给的字段是 NULL，COALESCE 保留原值——与 touch 的"None 表示不改"一致。
        # 行锁按 task_id 顺序拿（locked：ORDER BY 之后才加锁）：组提交的 save_many 也按 task_id 顺序写，
        # 续租与一个多项的组提交同时碰到同一批任务时不会互相死锁（UPDATE … FROM 的加锁顺序取决于连接计划）。
        # renew_leases：一批任务写同一组租约字段；行锁同样按 task_id 顺序拿（理由同下面的 touch_many）。
        # 锁行与 UPDATE 都按主键逐个找（lock_rows / LOCKED_FILTER）：通用计划在表小的时候定下，否则一直是
        # 顺序扫描整张表。
        self.renew_leases = (
            f"WITH locked AS ({lock_rows(s, 'unnest(%(task_ids)b::text[]) AS u(task_id)')}) "
            f"UPDATE {s}.tasks AS t SET lease_owner = %(owner)s, lease_until = %(until)s, "
            f"lease_until_off = %(until_off)s WHERE {LOCKED_FILTER}"
        )
        unnest = ", ".join(f"%({name})s::{kind}[]" for name, kind in TOUCH_MANY_COLUMNS.items())
        self.touch_many = (
            f"WITH u AS (SELECT * FROM unnest({unnest}) AS u({_cols(TOUCH_MANY_COLUMNS)})), "
            f"locked AS ({lock_rows(s, 'u')}) "
            f"UPDATE {s}.tasks AS t SET progress = COALESCE(u.progress::jsonb, t.progress), "
            "last_heartbeat_at = COALESCE(u.heartbeat_at, t.last_heartbeat_at), "
            "last_heartbeat_at_off = COALESCE(u.heartbeat_at_off, t.last_heartbeat_at_off), "
            "lease_owner = COALESCE(u.lease_owner, t.lease_owner), "
            "lease_until = COALESCE(u.lease_until, t.lease_until), "
            "lease_until_off = COALESCE(u.lease_until_off, t.lease_until_off) "
            f"FROM u WHERE t.task_id = u.task_id AND {LOCKED_FILTER}"
        )
        self._claim: dict[tuple[bool, bool, bool], str] = {}
        self._touch: dict[tuple[bool, bool, bool, bool], str] = {}
        self._save_batch: dict[int, str] = {}
        self._write_batch: dict[tuple[int, int], str] = {}

    def query(self, query: TaskQuery) -> tuple[str, dict[str, Any]]:
        """``query()`` 的语句与参数：过滤条件（``where_clause``）、按 (created_at, task_id) 排序、LIMIT。"""
        where, params = where_clause(query)
        direction = "DESC" if query.order is QueryOrder.NEWEST_FIRST else "ASC"
        text = (
            f"SELECT {self.task_cols} FROM {self.s}.tasks{where} "
            f"ORDER BY created_at {direction}, task_id {direction}"
        )
        if query.limit is not None:
            text += " LIMIT %(limit)s"
            params["limit"] = query.limit
        return text, params

    def save_batch(self, count: int) -> str:
        """组提交的 ``count`` 项 save（互不相同的任务、都不带租约条件）合成的一条语句（按项数渲染一次）。

        为什么：管道里逐条执行是 BEGIN、每项一条语句、COMMIT（服务器上执行四条语句，客户端为每条语句
        各走一遍游标与结果处理）；合成一条之后是一条自成事务的语句、一次往返。语义与逐条 ``save`` 相同：
        每一项按自己的 ``expect_version`` 校验，不符的那项什么也不写（它的迁移记录也不写，与单项
        ``save`` 的 ``WHERE EXISTS (SELECT 1 FROM upd)`` 同一规则），不连累别的项。行锁先按 task_id
        顺序逐个按主键拿（``locked``，见 ``lock_rows``：与表多大、有没有统计信息无关），与管道里按
        task_id 排序执行、``touch_many``、``renew_leases`` 同一顺序，并发的批量写不互相死锁。

        参数按位置（``$n``，用 ``psycopg.RawCursor`` 执行，见 ``numbered``）：``SAVE_BATCH_COLUMNS`` 的值逐项
        排开，最后是全部迁移记录合成的一个 JSON 数组。
        返回每项一行：(task_id, 是否写入, 任务是否存在)。"""
        text = self._save_batch.get(count)
        if text is None:
            row = "(" + ", ".join(f"%s::{kind}" for _, kind in SAVE_BATCH_COLUMNS) + ")"
            names = _cols(name for name, _ in SAVE_BATCH_COLUMNS)
            sets = ", ".join(f"{name} = u.{name}" for name, _ in SAVE_BATCH_COLUMNS[2:])
            s = self.s
            text = (
                f"WITH u ({names}) AS (VALUES {', '.join([row] * count)}), "
                f"locked AS ({lock_rows(s, 'u')}), "
                f"upd AS (UPDATE {s}.tasks AS t SET {sets} FROM u WHERE t.task_id = u.task_id "
                f"AND t.status_version = u.expect_version AND {LOCKED_FILTER} "
                "RETURNING t.task_id), "
                f"hist AS ({transitions_insert(s, 'WHERE x.task_id IN (SELECT task_id FROM upd)')}) "
                "SELECT u.task_id, EXISTS (SELECT 1 FROM upd WHERE upd.task_id = u.task_id), "
                f"{exists_row(s, 'u')} FROM u"
            ).replace("%(t_rows)s", "%s")
            text = numbered(text)
            self._save_batch[count] = text
        return text

    def write_batch(self, creates: int, saves: int) -> str:
        """组提交的混合批（``write_many``）：``creates`` 个新任务的 create 与 ``saves`` 项 save（互不相同的
        任务、都不带租约条件）合成的一条语句——一次往返、一个事务（按项数渲染一次）。

        create 一段与逐个 ``create`` 同一规则：已存在的 id 被 ``ON CONFLICT`` 跳过、不在 ``ins`` 里（它是
        DuplicateTaskId），它的迁移记录也不写（只为 ``ins`` 里的 id 插入）。save 一段与 ``save_batch``
        相同。两段的迁移记录是两个 JSON 参数、各自按自己那一段的结果过滤（有 save 时写成同一条 INSERT）：
        同一批里一项 create 撞上了同批正被 save 的那个任务时，冒名者的记录不能因为那个 id 在 ``upd`` 里
        就被写进去。

        加锁顺序（并发的批次不互相死锁）：新行按 task_id（``COLLATE "C"``，与 ``create_many`` 在 Python 里的
        排序同一顺序）插入，**先于**任何行锁——``locked`` 的条件里引用 ``ins``（一个不相关子查询，算出
        ``ins`` 的全部结果之后才开始扫描、加锁）：data-modifying CTE 之间本来没有先后。插入新 id 只会与另一个
        插入同一 id 的事务互等（别的事务看不见未提交的新行，不会去锁它）；所有批次都是"先按序插入、再按序
        锁行"，等待图里没有环。

        参数按位置（``$n``，用 ``psycopg.RawCursor`` 执行，见 ``numbered``）：每项 create 的
        ``TASK_BATCH_COLUMNS`` 值，create 的迁移记录（一个 JSON 数组），每项 save 的
        ``SAVE_BATCH_COLUMNS`` 值，save 的迁移记录（一个 JSON 数组）。返回每项一行：
        (0 = create / 1 = save, task_id, 是否写入, 任务是否存在)。"""
        key = (creates, saves)
        text = self._write_batch.get(key)
        if text is None:
            s = self.s
            task_cols = self.task_cols
            c_row = "(" + ", ".join(f"%s::{kind}" for _, kind in TASK_BATCH_COLUMNS) + ")"
            insert = (
                f"INSERT INTO {s}.tasks ({task_cols}) SELECT {task_cols} FROM c "
                'ORDER BY c.task_id COLLATE "C" ON CONFLICT (task_id) DO NOTHING RETURNING task_id'
            )
            create_history = transitions_insert(s, "WHERE x.task_id IN (SELECT task_id FROM ins)")
            parts = [
                f"c ({task_cols}) AS (VALUES {', '.join([c_row] * creates)})",
                f"ins AS ({insert})",
                # 有 save 时这里只展开 create 的迁移记录（参数按位置，文本里的先后就是参数的先后），
                # 与 save 的记录在最后一条 INSERT 里一起写（见下面的 hist）。
                f"chist AS ({create_history.replace('%(t_rows)s', '%s')})"
                if not saves
                else f"cx AS (SELECT * FROM jsonb_to_recordset(%s::jsonb) AS x({_ROW_TYPES}))",
            ]
            result = (
                "SELECT 0, c.task_id, EXISTS (SELECT 1 FROM ins WHERE ins.task_id = c.task_id), true FROM c"
            )
            if saves:
                s_row = "(" + ", ".join(f"%s::{kind}" for _, kind in SAVE_BATCH_COLUMNS) + ")"
                names = _cols(name for name, _ in SAVE_BATCH_COLUMNS)
                sets = ", ".join(f"{name} = u.{name}" for name, _ in SAVE_BATCH_COLUMNS[2:])
                # "AND (SELECT count(*) FROM ins) >= 0"：恒真，只为让 ins 先执行完、再开始锁行（见上）。
                lock = lock_rows(s, "u", " WHERE (SELECT count(*) FROM ins) >= 0")
                update = (
                    f"UPDATE {s}.tasks AS t SET {sets} FROM u WHERE t.task_id = u.task_id "
                    f"AND t.status_version = u.expect_version AND {LOCKED_FILTER} "
                    "RETURNING t.task_id"
                )
                # 两段的迁移记录一条 INSERT：迁移记录表每被一条 INSERT 写一次，服务器都要为它（与路由到的
                # 分区）重新搭一遍写入状态——CHECK 约束每次执行都从系统目录里的文本重新解析、编译（两个
                # 15 个状态的 IN 列表约 14 µs），分区路由也要重新建。两条并成一条，每批省约 18 µs 服务器 CPU。
                # 两段仍各按自己那一段的结果过滤（create 的按 ins，save 的按 upd，理由见上）。
                hist = (
                    f"INSERT INTO {s}.transitions ({_cols(TRANSITION_COLUMNS)}) "
                    f"SELECT {_cols(TRANSITION_COLUMNS, 'cx.')} FROM cx "
                    "WHERE cx.task_id IN (SELECT task_id FROM ins) UNION ALL "
                    f"SELECT {_cols(TRANSITION_COLUMNS, 'x.')} "
                    f"FROM jsonb_to_recordset(%s::jsonb) AS x({_ROW_TYPES}) "
                    "WHERE x.task_id IN (SELECT task_id FROM upd) ON CONFLICT DO NOTHING"
                )
                parts += [
                    f"u ({names}) AS (VALUES {', '.join([s_row] * saves)})",
                    f"locked AS ({lock})",
                    f"upd AS ({update})",
                    f"hist AS ({hist})",
                ]
                result += (
                    " UNION ALL SELECT 1, u.task_id, "
                    "EXISTS (SELECT 1 FROM upd WHERE upd.task_id = u.task_id), "
                    f"{exists_row(s, 'u')} FROM u"
                )
            text = numbered("WITH " + ", ".join(parts) + " " + result)
            self._write_batch[key] = text
        return text

    def claim(self, by_task: bool, by_bucket: bool, by_holder: bool) -> str:
        key = (by_task, by_bucket, by_holder)
        text = self._claim.get(key)
        if text is None:
            filters = ""
            if by_task:
                # 二进制传输：在管任务上万个时，这个数组每个轮询间隔都要编码一次（文本格式逐个转义，是二进制的
                # 几倍慢，积压 10 万个排队任务时能把后台循环占满）。
                filters += " AND task_id = ANY(%(task_ids)b::text[])"
            if by_bucket:
                filters += " AND bucket = ANY(%(buckets)s::integer[])"
            if by_holder:
                # 任务行此刻的持有者（主键查找）：adopt 换了持有者，指令随任务归新持有者。
                filters += (
                    f" AND EXISTS (SELECT 1 FROM {self.s}.tasks t"
                    f" WHERE t.task_id = {self.s}.commands.task_id AND t.owner = %(holder)s)"
                )
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


def _save_batch_columns() -> tuple[tuple[str, str], ...]:
    saved = frozenset(SAVE_COLUMNS)
    columns = [("task_id", "text"), ("expect_version", "bigint")]
    for column in SNAPSHOTS.logical:
        for name in DIALECT.physical(column):
            if name in saved:
                columns.append((name, DIALECT.array_type(column, name).removesuffix("[]")))
    return tuple(columns)


SAVE_BATCH_COLUMNS = _save_batch_columns()
"""``Sql.save_batch`` 每一项的 (参数名, 类型)：task_id、expect_version，然后是 save 改写的每个物理列。"""

TASK_BATCH_COLUMNS = tuple(
    (name, DIALECT.array_type(column, name).removesuffix("[]"))
    for column in SNAPSHOTS.logical
    for name in DIALECT.physical(column)
)
"""``Sql.write_batch`` 每一项 create 的 (参数名, 类型)：任务行的每个物理列，顺序即 ``TASK_COLUMNS``。"""


def _as_is(value: Any) -> Any:
    return value


_EQUAL_FILTERS = ("bucket", "owner", "pipeline_id")
"""列名与 ``TaskQuery`` 字段同名的等值过滤。"""

_FILTER_CLAUSES: dict[str, str] = {
    "statuses": "status = ANY(%(statuses)s::text[])",
    # 标签索引只收有标签的行（_schema.UNTAGGED）：子句带上同一条件，规划器才能用它（语义不变）。
    "tag": f"tags @> ARRAY[%(tag)s::text] AND {_schema.UNTAGGED}",
    **{name: f"{name} = %({name})s" for name in _EQUAL_FILTERS},
    "buckets": "bucket = ANY(%(buckets)s::bigint[])",
    "created_after": "created_at > %(created_after)s",
    "created_before": "created_at < %(created_before)s",
    "lease_expired_before": "(lease_until IS NULL OR lease_until < %(lease_expired_before)s)",
}
"""``TaskQuery`` 字段 → 子句（参数名即字段名）。字段为 None 表示不限，不出现在 WHERE 里。"""

_FILTER_PARAMS: dict[str, Callable[[Any], Any]] = {
    "statuses": lambda statuses: sorted(s.value for s in statuses),
    "buckets": sorted,
}
"""需要换个形状才能绑定的参数（集合 → 排好序的数组）；其余字段原样绑定。"""


def where_clause(query: TaskQuery) -> tuple[str, dict[str, Any]]:
    """TaskQuery → WHERE 子句。每一条都与 ``TaskQuery.matches`` 的参照语义逐条对应。"""
    clauses: list[str] = []
    params: dict[str, Any] = {}
    for name, clause in _FILTER_CLAUSES.items():
        value = getattr(query, name)
        if value is not None:
            clauses.append(clause)
            params[name] = _FILTER_PARAMS.get(name, _as_is)(value)
    if query.durable is not None:
        clauses.append("recipe IS NOT NULL" if query.durable else "recipe IS NULL")
    if query.awaiting_claim is not None:
        # 与 values.awaits_claim 同一判据；三项都不会是 NULL，NOT 取反没有三值逻辑的坑。
        awaiting = "(status = %(awaiting_status)s AND recipe IS NOT NULL AND owner IS NULL)"
        clauses.append(awaiting if query.awaiting_claim else f"NOT {awaiting}")
        params["awaiting_status"] = TaskStatus.QUEUED.value
    if query.name_prefix is not None:
        # 前缀按字面匹配：escape_like 转义 % _ 与转义符本身（列是 COLLATE "C"，按码点比较）。
        clauses.append("name LIKE %(name_like)s ESCAPE '\\'")
        params["name_like"] = escape_like(query.name_prefix)
    for name in ("name_like", "tag", "owner", "pipeline_id"):
        if name in params:
            check_text(params[name], f"TaskQuery.{name}")
    where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
    return where, params


__all__ = [
    "ONE_TRANSITION_PARAMS",
    "SAVE_BATCH_COLUMNS",
    "TASK_BATCH_COLUMNS",
    "TASK_COPY_JSONB",
    "TASK_COPY_TYPES",
    "TOUCH_MANY_COLUMNS",
    "TRANSITION_COPY_JSONB",
    "TRANSITION_COPY_TYPES",
    "Sql",
    "checked_transition_params",
    "copy_row",
    "copy_types",
    "numbered",
    "one_transition_insert",
    "one_transition_params",
    "transition_params",
    "transitions_insert",
    "where_clause",
]
