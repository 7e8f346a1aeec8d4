"""SQLite 表结构与版本管理。

版本号记在 ``schema_version`` 表里（单行）。打开文件时：

* 表不存在 → 新库，建表并写入 ``SCHEMA_VERSION``；
* 版本等于 ``SCHEMA_VERSION`` 且表都在 → 直接用（只读检查，不抢写锁，多进程同时打开不互相阻塞）；
  版本相同但缺表（节点表、日志表加入之前建的文件）→ 在写事务里补建缺的表（只读打开不补建）；
* 版本更高 → 文件是更新的包写的，拒绝打开并提示升级——旧代码按旧结构写入会悄悄损坏新数据；
* 版本更低 → 依次执行 ``MIGRATIONS``（目前只有第 1 版，尚无迁移）。

时间列成对出现：``*_at`` 存 ISO-8601 原文（保留原始时区偏移与微秒，往返逐字节一致），
``*_key`` 存 UTC 微秒整数（按"时刻"排序与过滤）。两个不同偏移的同一时刻，原文不同、key 相同——
排序与比较必须按时刻，而不是按字符串。
"""

from __future__ import annotations

import re
import sqlite3
import textwrap
from collections.abc import Callable

from chongming_task.core.storage.columns import LATER_COLUMNS
from chongming_task.errors import StoreError
from chongming_task.stores.sqlite import _codec

SCHEMA_VERSION = 1
"""本包写出的表结构版本。改表结构时加一，并在 MIGRATIONS 里登记从上一版升级的步骤。"""

TASK_COLUMNS: tuple[str, ...] = _codec.SNAPSHOTS.names
"""tasks 表的全部列（由列表 ``chongming_task.core.storage.columns`` 推导，含时间的 ``*_key`` 排序列）。"""

SIDE_CHANNEL_COLUMNS: frozenset[str] = _codec.SNAPSHOTS.side_channel
"""旁路字段对应的列（含租约的排序键）：save 不写它们，只有 create 与 touch 写。"""

SAVE_COLUMNS: tuple[str, ...] = _codec.SNAPSHOTS.save_columns

TRANSITION_COLUMNS: tuple[str, ...] = _codec.TRANSITIONS.names

COMMAND_COLUMNS: tuple[str, ...] = _codec.COMMANDS.names

NODE_COLUMNS: tuple[str, ...] = _codec.NODES.names

# 节点成员表是在第 1 版发布之前补进来的：第 1 版的旧文件里可能没有它。它只用 CREATE ... IF NOT EXISTS，
# 打开文件时发现缺表就补建（见 ``missing_tables``），不必为此升版本号。
# owner 是主键：发布即按 owner 覆盖。TEXT 的默认排序（BINARY）按 UTF-8 字节比较，也就是按码点，
# 与 Python 的 str 排序一致。buckets 是升序的 JSON 数组；NULL 表示不限定桶，'[]' 表示一个也不负责。
_DDL_NODES: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS nodes (
        owner        TEXT PRIMARY KEY NOT NULL,
        buckets      TEXT,
        num_buckets  INTEGER NOT NULL,
        heartbeat_at TEXT NOT NULL,
        expires_at   TEXT NOT NULL,
        info         TEXT NOT NULL
    ) WITHOUT ROWID
    """,
)

# 任务日志表（issue 18）同样是后补的：旧文件里没有就在下一次可写打开时补建（IF NOT EXISTS，不升版本号——
# 升版本号会让还在跑旧包的节点拒绝打开文件，而旧包根本不碰这张表）。只读打开绝不补建：读方法把缺表
# 当作"没有日志"。(task_id, seq) 主键：按任务聚簇，续读（seq > ?）沿主键走；seq 的分配见 ``_logs``。
# task_log_writers 是重试幂等的水位线（每任务每写入者一行：已接受的最大 writer_seq，见
# ``values.unseen_log_lines``）；它比 task_logs 晚一步加入，同样缺了就补建——旧包不碰它，它删任务时留下的
# 水位线行无害（写入者标识是随机的，不会被新写入者撞上），下一次新包 prune 同名任务时一并删掉。
_DDL_LOGS: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS task_logs (
        task_id   TEXT NOT NULL,
        seq       INTEGER NOT NULL,
        attempt   INTEGER NOT NULL,
        at        TEXT NOT NULL,
        level     TEXT NOT NULL,
        message   TEXT NOT NULL,
        truncated INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (task_id, seq)
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE IF NOT EXISTS task_log_writers (
        task_id    TEXT NOT NULL,
        writer     TEXT NOT NULL,
        writer_seq INTEGER NOT NULL,
        PRIMARY KEY (task_id, writer)
    ) WITHOUT ROWID
    """,
)

_LATER_TABLES: tuple[str, ...] = (*_DDL_NODES, *_DDL_LOGS)
"""第 1 版之后补进来的表：打开可写的旧文件时补建（见 ``create_or_migrate``）。"""

# 第 1 版之后补进 tasks 的列（配方，issue 19）：同样不升版本号——旧包照常读写（它的 INSERT 不写这一列，
# 得到 NULL = 普通任务；它的 UPDATE 也不碰它）。SQLite 没有 ADD COLUMN IF NOT EXISTS：先查再加。
LATER_TASK_COLUMNS: tuple[str, ...] = tuple(c.name for c in LATER_COLUMNS)
_ADD_LATER_COLUMNS: tuple[str, ...] = tuple(_codec.SNAPSHOTS.add_later_columns("tasks", if_not_exists=False))
# 待认领的持久任务（queued、无人持有、带配方）：worker 按 (priority DESC, created_key, task_id) 取前 N 个。
_LATER_INDEXES: tuple[str, ...] = (
    (
        "CREATE INDEX IF NOT EXISTS tasks_claimable ON tasks (priority DESC, created_key, task_id) "
        "WHERE status = 'queued' AND owner IS NULL AND recipe IS NOT NULL"
    ),
    # TaskQuery(durable=True)（网页控制台的持久筛选）：持久任务只占少数时，"最新 50 个持久任务"沿这个
    # 部分索引倒着走 50 步，而不是沿时间索引扫过全部普通任务。配方只在 create 时写，索引项从不改写。
    "CREATE INDEX IF NOT EXISTS tasks_durable ON tasks (created_key, task_id) WHERE recipe IS NOT NULL",
)

_REQUIRED_TABLES = frozenset(
    {
        "schema_version",
        "tasks",
        "task_tags",
        "transitions",
        "commands",
        "nodes",
        "task_logs",
        "task_log_writers",
    }
)

# 每条写入都要为 tasks 上的每个索引插一项（create）或删一项再插一项（改到索引列的 save），这是 SQLite 一次
# 写入里除提交之外最大的开销。桶号与流水线 id 在大多数任务上是 NULL（不分桶的部署、不属于流水线的任务），
# 所以这两个索引只收非 NULL 的行：``bucket = ?`` / ``bucket IN (...)`` / ``pipeline_id = ?`` 本身就蕴含
# IS NOT NULL，规划器照样用它们；NULL 的行不再各占一项。第 1 版最初建的是全量索引，打开可写的旧文件时
# 换成部分索引（见 ``outdated_indexes``）；旧包打开新文件不受影响（它的查询不依赖索引的形状）。
_PARTIAL_INDEXES: dict[str, str] = {
    "tasks_by_bucket": (
        "CREATE INDEX IF NOT EXISTS tasks_by_bucket ON tasks (bucket, created_key, task_id) "
        "WHERE bucket IS NOT NULL"
    ),
    "tasks_by_pipeline": (
        "CREATE INDEX IF NOT EXISTS tasks_by_pipeline ON tasks (pipeline_id, created_key, task_id) "
        "WHERE pipeline_id IS NOT NULL"
    ),
}

# 第 1 版最初还建过 finished_key 上的索引：没有任何查询用它（归档沿主键按 task_id 分批，保留清理按
# coalesce(finished_key, created_key) 排序，都用不上它），却让每个任务落终态时多维护一项。
#
# lease_key 上的索引（tasks_by_lease）同理：产品里带"租约已过期"条件的查询（reconcile、check_cluster、worker
# 找未复活的 lost）全都同时按状态过滤，规划器走的是 tasks_by_status（有没有这个索引，执行计划一字不差，
# test_lease_filters_the_product_runs_use_the_status_index 守着），它只服务于"只按租约过滤"这种产品从不发出
# 的查询。代价却在热路径上：每个 create 要在它的最右页插一项（逐个 submit 时每次提交多写一帧 WAL，约占
# 一成），每次续租（touch_many）要为每个在管任务删一项、插一项。
#
# 打开可写的旧文件时删掉（不升版本号：旧包打开新文件照常读写——它的查询不依赖索引的形状，它也只在新库上
# 建索引，不会把它补回来）。只读打开不动。
_DROPPED_INDEXES: tuple[str, ...] = ("tasks_by_finished", "tasks_by_lease")

_DDL_V1: tuple[str, ...] = (
    "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)",
    # 列由列表推导（加字段 = 列表加一行 + 在 MIGRATIONS 里登记 ALTER TABLE）。
    "\n    " + _codec.SNAPSHOTS.create_table("tasks").replace("\n)", "\n    )\n    "),
    # 每个 TaskQuery 过滤条件一个索引。等值过滤的索引带上排序键 (created_key, task_id)：最常见的
    # "某状态 / 某桶 / 某节点最新 50 条"直接沿索引倒序走 50 步，不必把匹配的行全取出来再排序。
    "CREATE INDEX IF NOT EXISTS tasks_by_status ON tasks (status, created_key, task_id)",
    "CREATE INDEX IF NOT EXISTS tasks_by_created ON tasks (created_key, task_id)",
    "CREATE INDEX IF NOT EXISTS tasks_by_name ON tasks (name)",
    _PARTIAL_INDEXES["tasks_by_bucket"],
    "CREATE INDEX IF NOT EXISTS tasks_by_owner ON tasks (owner, created_key, task_id)",
    _PARTIAL_INDEXES["tasks_by_pipeline"],
    # 标签放进旁表，tag= 查询从这里出发再联到 tasks。旁表带上任务的排序键：主键
    # (tag, created_key, task_id) 本身就是有序的，"带某标签的最新 50 条"沿主键走 50 步即止，
    # 而不是取出该标签的全部任务再排序。快照里另存一份排序后的 JSON 列表，读快照不必联表。
    """
    CREATE TABLE IF NOT EXISTS task_tags (
        tag         TEXT NOT NULL,
        created_key INTEGER NOT NULL,
        task_id     TEXT NOT NULL,
        PRIMARY KEY (tag, created_key, task_id)
    ) WITHOUT ROWID
    """,
    "CREATE INDEX IF NOT EXISTS task_tags_by_task ON task_tags (task_id)",
    # (task_id, version) 主键让 append 幂等：INSERT OR IGNORE 重放同一条记录是空操作。
    """
    CREATE TABLE IF NOT EXISTS transitions (
        task_id     TEXT NOT NULL,
        version     INTEGER NOT NULL,
        from_status TEXT NOT NULL,
        to_status   TEXT NOT NULL,
        trigger     TEXT NOT NULL,
        actor       TEXT,
        reason      TEXT,
        at          TEXT NOT NULL,
        PRIMARY KEY (task_id, version)
    ) WITHOUT ROWID
    """,
    # seq 决定认领顺序（按提交先后）；AUTOINCREMENT 保证删掉的号不会被复用，顺序永远单调。
    """
    CREATE TABLE IF NOT EXISTS commands (
        seq          INTEGER PRIMARY KEY AUTOINCREMENT,
        command_id   TEXT NOT NULL UNIQUE,
        task_id      TEXT NOT NULL,
        action       TEXT NOT NULL,
        issuer       TEXT,
        reason       TEXT,
        payload      TEXT NOT NULL,
        created_at   TEXT NOT NULL,
        bucket       INTEGER,
        claimant     TEXT,
        lease_until  TEXT,
        lease_key    INTEGER,
        deliveries   INTEGER NOT NULL DEFAULT 0,
        completed_at TEXT
    )
    """,
    # 部分索引只收未完成的指令：已完成的越积越多，也不拖慢轮询。
    "CREATE INDEX IF NOT EXISTS commands_pending ON commands (seq) WHERE completed_at IS NULL",
    "CREATE INDEX IF NOT EXISTS commands_by_task ON commands (task_id)",
    *_LATER_TABLES,
)

MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {}
"""``MIGRATIONS[n]`` 把第 n 版升级到第 n+1 版（在写事务内执行）。"""


def _indexed_save_columns() -> tuple[str, ...]:
    # 每条建索引语句里 "ON tasks" 之后出现的列名（键列与部分索引 WHERE 里的列）：
    # 由语句推导，改索引不必改这里。
    statements = [*_DDL_V1, *_LATER_INDEXES]
    text = " ".join(
        statement.split(" ON tasks ", 1)[1] for statement in statements if " ON tasks " in statement
    )
    return tuple(column for column in SAVE_COLUMNS if re.search(rf"\b{column}\b", text))


INDEXED_SAVE_COLUMNS: tuple[str, ...] = _indexed_save_columns()
"""save 写的列里被 tasks 上某个索引用到的（键列，或部分索引的 WHERE 条件）。SET 这些列哪怕值没变，SQLite
也要删一项、插一项地维护索引，所以 save 只在它们真的变了时才 SET；其余的列每次照写，不必先读出来比较。"""

PLAIN_SAVE_COLUMNS: tuple[str, ...] = tuple(c for c in SAVE_COLUMNS if c not in INDEXED_SAVE_COLUMNS)
"""save 写的列里没有任何索引用到的：整行本来就要重写，多 SET 几列几乎不花钱。"""


NEW_FILE_PAGE_SIZE = 2048
"""新文件的页大小（字节）。SQLite 默认 4096。

为什么更小：WAL 里每次提交把它改过的每一页整页写一遍（外加 24 字节帧头，各一次 ``pwrite``），并对整页算
校验和。逐个 submit 的热路径上每次提交改的是十来棵 b 树各自最右边的那一页（任务表、几个索引、迁移记录），
每页只改了一两行——写出去的字节几乎全是没变的旧内容。页减半，每次提交写进 WAL、算校验和、之后检查点再拷回
主文件的字节也差不多减半，页数基本不变（任务行约 280 字节、迁移记录约 90 字节，一页照样放得下好几行）。
实测（bench/README.md 的 sq12 一节，13 对交替）每任务进程 CPU 均值少约 7 %（逐对中位数少约 3 %），
其中 sys 少约 19 %；1024 不比 2048 更省（行数少了，拆页变多）。

代价：同样的数据页数翻倍，b 树深一层左右；大的 outcome / 配方更早溢出到溢出页；整批插入（``create_many``，
页写满才换页）反而要多拆页、多写帧：``submit_many`` 每任务的用户态指令多约 5 %（callgrind）。百万行的列表查询
与网页控制台的基准仍在目标之内（同一节）。

只对新文件生效：页大小只能在建第一张表之前设定（WAL 模式下 ``VACUUM`` 也改不了它），已有的文件保持原来的
页大小照常读写，不需要迁移；旧包打开新文件也不受影响（页大小记在文件头里，SQLite 自己按它读）。"""


def is_new_file(conn: sqlite3.Connection) -> bool:
    """文件里还没有任何表：只有这时页大小与 auto_vacuum 还能设定（见 ``NEW_FILE_PAGE_SIZE``、
    ``_archive.use_incremental_vacuum``）。"""
    return bool(conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0)


def use_small_pages(conn: sqlite3.Connection) -> None:
    """新文件以 ``NEW_FILE_PAGE_SIZE`` 建库。必须在 auto_vacuum、切到 WAL 与建表之前、事务之外执行。"""
    conn.execute(f"PRAGMA page_size = {NEW_FILE_PAGE_SIZE}")


def read_version(conn: sqlite3.Connection) -> int | None:
    """文件里的表结构版本；新库（还没有 schema_version 表）返回 None。"""
    row = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone()
    if row is None:
        return None
    version = conn.execute("SELECT max(version) FROM schema_version").fetchone()
    if version is None or version[0] is None:
        return None
    return int(version[0])


def missing_tables(conn: sqlite3.Connection) -> bool:
    """当前版本的文件是否要在可写打开时补一步：缺表（例如节点表加入之前建的第 1 版文件）、缺后补的列
    （配方列），或索引还是旧的形状（``outdated_indexes``）。"""
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    if not {row[0] for row in rows} >= _REQUIRED_TABLES:
        return True
    return bool(missing_columns(conn)) or bool(outdated_indexes(conn))


def outdated_indexes(conn: sqlite3.Connection) -> list[str]:
    """tasks 上要换成部分索引的全量索引、要删掉的索引（名字排序）。只影响性能：只读打开照常使用旧形状。"""
    rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'tasks'")
    found = {str(name): str(sql or "") for name, sql in rows.fetchall()}
    stale = [name for name in _PARTIAL_INDEXES if name in found and " WHERE " not in found[name].upper()]
    stale.extend(name for name in _DROPPED_INDEXES if name in found)
    return sorted(stale)


def _upgrade_indexes(conn: sqlite3.Connection) -> None:
    for name in outdated_indexes(conn):
        conn.execute(f"DROP INDEX IF EXISTS {name}")
        if name in _PARTIAL_INDEXES:
            conn.execute(_PARTIAL_INDEXES[name])


def missing_columns(conn: sqlite3.Connection) -> list[str]:
    """tasks 表缺的后补列（没有 tasks 表时为空：那是缺表，另有判断）。"""
    present = {str(row[1]) for row in conn.execute("PRAGMA table_info(tasks)").fetchall()}
    if not present:
        return []
    return [name for name in LATER_TASK_COLUMNS if name not in present]


def _add_later_columns(conn: sqlite3.Connection) -> None:
    missing = set(missing_columns(conn))
    for name, statement in zip(LATER_TASK_COLUMNS, _ADD_LATER_COLUMNS, strict=True):
        if name in missing:
            conn.execute(statement)
    for statement in _LATER_INDEXES:
        conn.execute(statement)


def foreign_tables(conn: sqlite3.Connection) -> list[str]:
    """库里不属于 chongming-task 的表（按名字排序；SQLite 内部表除外）。非空说明这是别的应用的库。"""
    rows = conn.execute(
        "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite_%' "
        "ORDER BY name"
    ).fetchall()
    return [str(row[0]) for row in rows if row[0] not in _REQUIRED_TABLES]


def schema_sql() -> str:
    """可直接交给 sqlite3 命令行执行的完整建表脚本（含事务）——与新库建表执行的是同一份语句。"""
    statements = [
        textwrap.dedent(statement).strip() for statement in (*_DDL_V1, *_ADD_LATER_COLUMNS, *_LATER_INDEXES)
    ]
    statements.append(f"INSERT INTO schema_version (version) VALUES ({SCHEMA_VERSION})")
    return "BEGIN;\n" + ";\n".join(statements) + ";\nCOMMIT;\n"


def check_not_newer(version: int | None, where: str) -> None:
    if version is not None and version > SCHEMA_VERSION:
        raise StoreError(
            f"数据库 {where} 的表结构版本是 {version}，而当前安装的 chongming-task-store-sqlite 只认识到第 "
            f"{SCHEMA_VERSION} 版：它是由更新版本的包写出的。请升级 chongming-task-store-sqlite"
            "（pip install -U chongming-task-store-sqlite），不要用旧包写它。"
        )


def create_or_migrate(conn: sqlite3.Connection, where: str) -> None:
    """在已开启的写事务内建表或升级。调用方负责 BEGIN IMMEDIATE / COMMIT。"""
    version = read_version(conn)
    check_not_newer(version, where)
    if version is None:
        for statement in (*_DDL_V1, *_ADD_LATER_COLUMNS, *_LATER_INDEXES):
            conn.execute(statement)
        conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        return
    while version < SCHEMA_VERSION:
        MIGRATIONS[version](conn)
        version += 1
        conn.execute("UPDATE schema_version SET version = ?", (version,))
    # 同一版本内后补的表（节点表、日志表；全是 IF NOT EXISTS，已有就是空操作）。
    for statement in _LATER_TABLES:
        conn.execute(statement)
    _add_later_columns(conn)  # 同一版本内后补的列（配方）与它的认领索引
    _upgrade_indexes(conn)  # 全量索引换成部分索引、删掉没人用的索引


__all__ = [
    "COMMAND_COLUMNS",
    "INDEXED_SAVE_COLUMNS",
    "LATER_TASK_COLUMNS",
    "NEW_FILE_PAGE_SIZE",
    "NODE_COLUMNS",
    "PLAIN_SAVE_COLUMNS",
    "SAVE_COLUMNS",
    "SCHEMA_VERSION",
    "SIDE_CHANNEL_COLUMNS",
    "TASK_COLUMNS",
    "TRANSITION_COLUMNS",
    "check_not_newer",
    "create_or_migrate",
    "foreign_tables",
    "is_new_file",
    "missing_columns",
    "missing_tables",
    "outdated_indexes",
    "read_version",
    "schema_sql",
    "use_small_pages",
]
