"""PostgresTaskStore 的表结构（DDL）与版本号。

DDL 只在这里写一次：建表（``ensure_schema``）与"给运维的建表 SQL"（``PostgresTaskStore.schema_sql``）
用的是同一份文本，两者不可能漂移。

几个刻意的选择：

* 不用任何序列（serial / identity）。只授予 SELECT/INSERT/UPDATE/DELETE 的运维角色没有序列的
  USAGE 权限，一用序列，提交指令就会失败。指令的先后顺序改由 (enqueued_at, command_id) 决定：
  enqueued_at 取数据库服务器的 ``clock_timestamp()``（所有节点共用一个钟，不受各机器时钟偏差
  影响，也与注入的 FakeClock 无关），并列时由 command_id 决胜——它在同一进程内严格递增
  （见 ``store._new_command_id``）。
* task_id / name 用 ``COLLATE "C"``：排序与前缀 LIKE 都按字节（UTF-8 下即码点）比较，与 Python
  的 ``str`` 比较逐条一致；数据库默认排序规则（如 en_US.UTF-8）会让大小写、标点的顺序与参照语义不同。
* 每个 timestamptz 旁边一个 ``*_off`` 列记下原始 UTC 偏移（微秒）。timestamptz 只存时刻、不存
  偏移，而契约要求带任意偏移的时间逐微秒、连同偏移一起往返。
* status / action 不用 enum：将来增加状态只需改约束，不必 ALTER TYPE。状态列（tasks.status、
  transitions.from_status / to_status）与 tasks.status_version 的类型是 schema 里带约束的域
  （``domain_ddl_statements``），action 是带 CHECK 的 text（commands 只在下发指令时写，不在热路径上）。
  为什么是域而不是表上的 CHECK：见 ``_codec.PostgresDialect``；旧库的换法见 ``domain_upgrade_statements``。
"""

from __future__ import annotations

from typing import Any

from chongming_task.core.storage.columns import LATER_COLUMNS
from chongming_task.core.storage.values import CommandAction
from chongming_task.states import TaskStatus
from chongming_task.stores.postgres import _codec, _logs
from chongming_task.stores.postgres._codec import NONNEGATIVE_DOMAIN, STATUS_DOMAIN, PostgresDialect, _in_list

SCHEMA_VERSION = 2
"""本程序写出、也只认得的表结构版本。数据库里的版本更高 → 明确报错，而不是按旧结构乱写。

* 第 1 版：迁移记录是一张普通表，主键 (task_id, version)。
* 第 2 版：迁移记录按 ``at`` 月度分区（``PARTITION BY RANGE``），过期的整月分区归档之后 DETACH + DROP
  （见 ``_partitions``）。分区表的主键必须包含分区键，所以主键是 (task_id, version, at)；"同一
  (task_id, version) 只留一条"由写入语句保证（见 ``_sql.transitions_insert``）。第 1 版的库在可写打开时
  原地升级（``migration_statements``）：旧表整张挂成一个分区，不搬数据。
"""

DEFAULT_SCHEMA = "chongming_task"

MAX_IDENTIFIER_BYTES = 63
"""PostgreSQL 标识符的长度上限（NAMEDATALEN - 1）：更长的名字会被静默截断，两个 schema 可能撞名。"""


def quote_ident(name: str) -> str:
    """按 SQL 标准给标识符加双引号（内部的双引号写两遍）。调用方保证 name 已通过校验。"""
    return '"' + name.replace('"', '""') + '"'


def node_ddl_statements(schema: str) -> list[str]:
    """节点成员表。它在第 1 版发布之前补进来：第 1 版的旧 schema 里可能没有，打开时补建（幂等）。

    owner 是主键（发布即按 owner 覆盖），``COLLATE "C"`` 让 ``ORDER BY owner`` 与 Python 的 str 排序一致。
    buckets 为 NULL 表示不限定桶，空数组表示一个也不负责。时间同样带 ``*_off`` 偏移列。
    """
    s = quote_ident(schema)
    return [
        f"""CREATE TABLE IF NOT EXISTS {s}.nodes (
    owner text COLLATE "C" PRIMARY KEY,
    buckets bigint[],
    num_buckets bigint NOT NULL CHECK (num_buckets > 0),
    heartbeat_at timestamptz NOT NULL,
    heartbeat_at_off bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    expires_at_off bigint NOT NULL,
    info jsonb NOT NULL DEFAULT '{{}}'
)""",
    ]


LATER_TASK_COLUMNS: tuple[str, ...] = tuple(c.name for c in LATER_COLUMNS)
"""第 1 版之后补进 tasks 的列（配方，issue 19）：不升版本号，旧 schema 在下一次可写打开时补（幂等）。"""


def later_ddl_statements(schema: str) -> list[str]:
    """后补的列、待认领持久任务的部分索引（worker 按 priority DESC, created_at, task_id 取前 N 个）与
    持久任务按时间的部分索引（持久筛选）。"""
    s = quote_ident(schema)
    return [
        *_codec.SNAPSHOTS.add_later_columns(f"{s}.tasks", if_not_exists=True),
        f"""CREATE INDEX IF NOT EXISTS tasks_claimable_idx ON {s}.tasks (priority DESC, created_at, task_id)
    WHERE status = 'queued' AND owner IS NULL AND recipe IS NOT NULL""",
        # TaskQuery(durable=True)（网页控制台的持久筛选）：最新的持久任务沿它倒着走，不扫普通任务。
        f"""CREATE INDEX IF NOT EXISTS tasks_durable_idx ON {s}.tasks (created_at, task_id)
    WHERE recipe IS NOT NULL""",
    ]


SETTLED_STATUS = TaskStatus.SUCCEEDED.value
"""状态索引不收的那个状态（见 ``slim_index_statements``）。"""

UNTAGGED = "tags <> '{}'"
"""标签索引的部分条件；``TaskQuery(tag=...)`` 的子句原样带上它（``_sql._FILTER_CLAUSES``），规划器才能证明
查询落在索引里（它不会自己从 ``tags @> ARRAY[...]`` 推出数组非空）。"""

DROPPED_INDEXES: tuple[str, ...] = (
    "tasks_status_idx",
    "tasks_tags_idx",
    "tasks_lease_idx",
    "tasks_finished_idx",
)
"""早先建在 tasks 上、换成了部分索引或删掉了的索引（见 ``slim_index_statements``）。"""

SLIM_INDEXES: tuple[str, ...] = ("tasks_unsucceeded_idx", "tasks_tagged_idx")
"""取代它们的部分索引的名字（可写打开旧库时补建，见 ``outdated_indexes``）。"""


def slim_index_statements(schema: str) -> list[str]:
    """tasks 上只收"有查询要找的那些行版本"的索引（issue 17 / 19：每个任务的每次状态变化都写一个新的行版本，
    它满足谓词的每个索引各插一项；状态、持有者、租约都在变，HOT 更新不可能。worker 路径每个任务两个行版本
    要插的索引项由 8 + 9 减到 6 + 5，服务器 CPU 约少 5–10 %，见 bench/README.md pg14 一节）。

    * 状态：``status <> 'succeeded'`` 的部分索引。状态过滤要找的是少数几种状态（在管的、失败的、失联的：
      reconcile、check_cluster、worker 找未复活的 lost、看板按状态筛选）；成功是绝大多数任务的最终状态，
      按它过滤时这个索引毫无选择性，规划器本来就沿时间索引走或顺序扫描。于是每个任务最后、也最多的那个
      行版本不再进状态索引。``status = ANY(常量数组)`` 只要数组里没有 succeeded，规划器就能证明它蕴含
      ``status <> 'succeeded'``（查询参数在规划时是常量），含终态与非终态混合的集合也一样。
    * 标签：GIN 对空数组也插一项"空"条目——每个没有标签的行版本都多一项。只收有标签的行；标签查询带上
      同一条件（``UNTAGGED``），才用得上它。
    * 不再有 ``lease_until`` 上的索引：产品里带"租约已过期"条件的查询全都同时按非终态或 lost 过滤，走状态
      索引；终态行留着过期的租约，单按租约过滤没有选择性。少了它，只改租约、心跳、进度的更新（续租、
      touch）不碰任何索引列，页内有空位时是 HOT 更新。
    * 不再有 ``finished_at`` 上的索引：没有查询用它（prune 按 finished_at DESC NULLS LAST 排全部终态行、
      归档沿主键按 task_id 分批、按 coalesce(finished_at, created_at) 过滤，都用不上），却让每个任务落终态时
      多插一项（SQLite 后端早已删掉同一个索引，见它的 ``_DROPPED_INDEXES``）。
    """
    s = quote_ident(schema)
    return [
        f"""CREATE INDEX IF NOT EXISTS tasks_unsucceeded_idx ON {s}.tasks (status)
    WHERE status <> '{SETTLED_STATUS}'""",
        f"CREATE INDEX IF NOT EXISTS tasks_tagged_idx ON {s}.tasks USING gin (tags) WHERE {UNTAGGED}",
    ]


def index_upgrade_statements(schema: str) -> list[str]:
    """把旧库 tasks 上的索引换成 ``slim_index_statements`` 的形状（幂等）：先建新的，再删旧的。

    不升版本号：索引的形状不影响任何语句的结果，只影响快慢——旧包照常读写新形状的库（它的查询不依赖索引，
    它也只在新库上建索引，不会把旧的补回来），新包只读打开旧形状的库也照常。升版本号反而会让旧包拒绝打开、
    让没有建表权限的运维角色在属主迁移之前启动不了。

    锁：CREATE INDEX（不是 CONCURRENTLY：它不能在事务里执行）对 tasks 持 SHARE 锁到事务提交——建索引的
    那几秒里别的会话能读、不能写（100 万行的表上整个换下来约 1.6 秒，见 bench/README.md pg14 一节）；
    DROP INDEX 要 ACCESS EXCLUSIVE 锁，放在最后，提交时一起放掉。
    """
    s = quote_ident(schema)
    return [*slim_index_statements(schema), *(f"DROP INDEX IF EXISTS {s}.{name}" for name in DROPPED_INDEXES)]


def outdated_indexes(conn: Any, schema: str) -> list[str]:
    """tasks 上还是旧形状的索引：该删而还在的、该有而还没有的（名字排序）；没有 tasks 表时为空。"""
    rows = conn.execute(
        "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND tablename = 'tasks'", [schema]
    ).fetchall()
    found = {str(row[0]) for row in rows}
    if not found:
        return []
    stale = [name for name in DROPPED_INDEXES if name in found]
    stale += [name for name in SLIM_INDEXES if name not in found]
    return sorted(stale)


def lock_ddl(conn: Any, schema: str) -> None:
    """在当前事务里拿 ``schema`` 的改表咨询锁（事务结束自动放）：建表、迁移、补列 / 补表、换索引、建分区
    都在它下面做，两个节点同时启动时只有一个在改、另一个等它提交后看到改好的结果。"""
    conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", ["chongming_task.ddl:" + schema])


def _domains() -> list[tuple[str, str, str]]:
    """(域名, 基础类型, 约束表达式)。约束名一律是 ``<域名>_check``。"""
    statuses = _in_list([status.value for status in TaskStatus])
    return [(STATUS_DOMAIN, "text", f"VALUE IN ({statuses})"), (NONNEGATIVE_DOMAIN, "bigint", "VALUE >= 0")]


def domain_ddl_statements(schema: str) -> list[str]:
    """建表之前建好两个域（见 ``_codec.PostgresDialect``）。

    CREATE DOMAIN 没有 IF NOT EXISTS：包在 DO 块里、已存在就跳过，建表脚本整体照旧幂等（运维重复执行
    ``schema_sql`` 不报错）。与 CREATE TABLE IF NOT EXISTS 一样，不核对已有同名对象的定义。
    """
    s = quote_ident(schema)
    return [
        f"""DO $domain$
BEGIN
    CREATE DOMAIN {s}.{name} AS {base} CONSTRAINT {name}_check CHECK ({check});
EXCEPTION WHEN duplicate_object THEN NULL;
END
$domain$"""
        for name, base, check in _domains()
    ]


TYPED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("tasks", "status", STATUS_DOMAIN),
    ("tasks", "status_version", NONNEGATIVE_DOMAIN),
    ("transitions", "from_status", STATUS_DOMAIN),
    ("transitions", "to_status", STATUS_DOMAIN),
)
"""(表, 列, 域)：用域类型代替表上 CHECK 约束的四列。"""


def domain_upgrade_statements(schema: str) -> list[str]:
    """把旧库（第 1 版，或域之前建的第 2 版）的四列从"text / bigint + 表上的 CHECK"换成域（一个事务内）。

    不能直接 ``ALTER COLUMN ... TYPE 带约束的域``：PostgreSQL 要逐行检查约束，于是整表重写（tasks、
    每个迁移记录分区、连同索引）。所以分三步：

    1. 先建**没有约束**的域。text → 以 text 为基础类型的无约束域是二进制兼容的转换，``ALTER COLUMN TYPE``
       只改目录，不重写表（分区表逐个分区同样）；索引能原样沿用，只有谓词里引用了 status 的两个部分索引
       （``tasks_unsucceeded_idx``、``tasks_claimable_idx``）会按定义重建。
    2. 同一条 ALTER TABLE 里先删掉表上的旧 CHECK（分区表上删，分区继承来的一并删掉）。
    3. 再给域加上约束：PostgreSQL 对用到这个域的每张表（每个分区）扫一遍核对已有的行——只读、不重写；
       有一行不合法就整个事务回滚，什么也没改。

    锁：ALTER TABLE 对 tasks、transitions 及其全部分区持 ACCESS EXCLUSIVE 锁到事务提交（读写都等），
    耗时是重建那两个部分索引加核对扫描的时间（bench/README.md 第十六轮 pg16 一节有实测）。

    **正在运行的进程**：列的类型变了，它们连接上已预备的、结果里有这几列的语句（读快照、认领、读历史）
    执行时 PostgreSQL 报 ``cached plan must not change result type``。psycopg 不把失败的预备语句移出缓存，
    所以旧版本（换域之前）的进程在这条连接上**每次**都失败，直到连接到龄被池换掉（psycopg_pool 默认 1 小时）；
    本版本的进程丢掉这条连接（``store._discard_if_stale_plans``），每条连接只失败一次。所以和第 1 → 2 版
    一样：升级前先停掉旧版本的进程。
    """
    s = quote_ident(schema)
    # 旧的 CHECK 是 PostgreSQL 自动起的名字 ``<表>_<列>_check``（第 2 版的分区表显式用了同样的名字）。
    drops: dict[str, list[str]] = {}
    alters: dict[str, list[str]] = {}
    for table, column, domain in TYPED_COLUMNS:
        drops.setdefault(table, []).append(f"DROP CONSTRAINT IF EXISTS {table}_{column}_check")
        alters.setdefault(table, []).append(f"ALTER COLUMN {column} TYPE {s}.{domain}")
    return [
        *(f"CREATE DOMAIN {s}.{name} AS {base}" for name, base, _ in _domains()),
        *(f"ALTER TABLE {s}.{table} " + ", ".join([*drops[table], *alters[table]]) for table in drops),
        *(
            f"ALTER DOMAIN {s}.{name} ADD CONSTRAINT {name}_check CHECK ({check})"
            for name, _, check in _domains()
        ),
    ]


def untyped_columns(conn: Any, schema: str) -> list[str]:
    """四列里还不是域类型的（``表.列``，按 ``TYPED_COLUMNS`` 的顺序）；表不存在时为空。"""
    s = quote_ident(schema)
    values = ", ".join(["(%s, %s, %s, %s)"] * len(TYPED_COLUMNS))
    params = [
        p
        for i, (table, column, domain) in enumerate(TYPED_COLUMNS)
        for p in (i, f"{s}.{table}", column, f"{s}.{domain}")
    ]
    rows = conn.execute(
        f"SELECT w.rel, w.col FROM (VALUES {values}) AS w(i, rel, col, typ) "
        "JOIN pg_attribute a ON a.attrelid = to_regclass(w.rel) AND a.attname = w.col AND NOT a.attisdropped "
        "WHERE a.atttypid IS DISTINCT FROM to_regtype(w.typ) ORDER BY w.i",
        params,
    ).fetchall()
    return [f"{str(rel).rsplit('.', 1)[-1]}.{col}" for rel, col in rows]


def live_nodes_below(conn: Any, schema: str, level: int, now: Any) -> list[str]:
    """``nodes`` 里此刻还活着（``expires_at`` 晚于 ``now``）、而 ``info.feature_level`` 低于 ``level`` 的
    节点（owner，排序）：它们跑的是承受不了某种原地升级的旧代码（``core.version.NODE_FEATURE_LEVEL``）。
    节点表不存在时为空。"""
    s = quote_ident(schema)
    if conn.execute("SELECT to_regclass(%s)", [f"{s}.nodes"]).fetchone()[0] is None:
        return []
    rows = conn.execute(
        f"SELECT owner FROM {s}.nodes WHERE expires_at > %s AND "
        "COALESCE(CASE WHEN jsonb_typeof(info -> 'feature_level') = 'number' "
        "THEN (info ->> 'feature_level')::numeric END, 0) < %s ORDER BY owner",
        [now, level],
    ).fetchall()
    return [str(row[0]) for row in rows]


def _transition_columns(s: str) -> str:
    return f"""    task_id text COLLATE "C" NOT NULL,
    version bigint NOT NULL,
    from_status {s}.{STATUS_DOMAIN} NOT NULL,
    to_status {s}.{STATUS_DOMAIN} NOT NULL,
    trigger text NOT NULL,
    actor text,
    reason text,
    at timestamptz NOT NULL,
    at_off bigint NOT NULL"""


def transitions_ddl_statements(schema: str) -> list[str]:
    """按月分区的迁移记录表与它的 DEFAULT 分区（兜底：还没建好月分区的时间落在这里，写入永不失败）。

    月分区不在这里：它们由可写打开与归档按需提前建（``_partitions.ensure_months``）。
    """
    s = quote_ident(schema)
    return [
        f"""CREATE TABLE IF NOT EXISTS {s}.transitions (
{_transition_columns(s)},
    PRIMARY KEY (task_id, version, at)
) PARTITION BY RANGE (at)""",
        f"CREATE TABLE IF NOT EXISTS {s}.{DEFAULT_PARTITION} PARTITION OF {s}.transitions DEFAULT",
    ]


DEFAULT_PARTITION = "transitions_default"
LEGACY_PARTITION = "transitions_v1"
"""第 1 版的旧表升级后的名字：整张挂成 ``[MINVALUE, 升级时的下一个月初)`` 这一个分区。"""


def migration_statements(schema: str) -> dict[int, list[str]]:
    """版本 N → N+1 的升级语句（同一事务内执行；``migration_sql`` 打印的也是这一份）。"""
    s = quote_ident(schema)
    legacy = quote_ident(LEGACY_PARTITION)
    legacy_pkey = quote_ident(LEGACY_PARTITION + "_pkey")
    literal = "'" + schema.replace("'", "''") + "'"
    # 旧表挂成一个分区：上界取"现在与表里最晚时间两者中较晚那个"的下一个月初（UTC），
    # 月分区从这里往后建。分区边界只能是常量，所以在 DO 块里算好再 EXECUTE。
    attach = f"""DO $migrate$
DECLARE bound timestamptz;
BEGIN
    SELECT (date_trunc('month', greatest(now(), coalesce(max(at), now())) AT TIME ZONE 'UTC')
            + interval '1 month') AT TIME ZONE 'UTC'
      INTO bound FROM {s}.{legacy};
    EXECUTE format('ALTER TABLE %I.transitions ATTACH PARTITION %I.%I FOR VALUES FROM (MINVALUE) TO (%L)',
                   {literal}, {literal}, '{LEGACY_PARTITION}', bound);
END
$migrate$"""
    return {
        1: [
            # 先在旧的普通表上把状态列换成域（不重写表，见 domain_upgrade_statements）：新的分区表按域建，
            # ATTACH 要求分区的列类型与分区表逐列相同。
            *domain_upgrade_statements(schema),
            f"ALTER TABLE {s}.transitions RENAME TO {legacy}",
            # 分区的主键必须与分区表的一致（含分区键 at）：换成 (task_id, version, at)，ATTACH 直接沿用。
            f"ALTER TABLE {s}.{legacy} DROP CONSTRAINT transitions_pkey",
            f"ALTER TABLE {s}.{legacy} ADD CONSTRAINT {legacy_pkey} PRIMARY KEY (task_id, version, at)",
            *transitions_ddl_statements(schema),
            attach,
            f"UPDATE {s}.schema_version SET version = 2",
        ],
    }


def migration_sql(schema: str, from_version: int) -> str:
    """把 ``from_version`` 版的 schema 升级到 ``SCHEMA_VERSION`` 的 SQL（含事务），交给表的属主执行。"""
    steps = migration_statements(schema)
    body = [statement for version in range(from_version, SCHEMA_VERSION) for statement in steps[version]]
    return "BEGIN;\n\n" + ";\n\n".join(body) + ";\n\nCOMMIT;\n"


def ddl_statements(schema: str) -> list[str]:
    """建表语句，按执行顺序。全部幂等（IF NOT EXISTS），在同一事务里执行。"""
    s = quote_ident(schema)
    actions = _in_list([action.value for action in CommandAction])
    return [
        f"CREATE SCHEMA IF NOT EXISTS {s}",
        f"""CREATE TABLE IF NOT EXISTS {s}.schema_version (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version integer NOT NULL,
    installed_at timestamptz NOT NULL DEFAULT now()
)""",
        *domain_ddl_statements(schema),
        # 列由列表推导（加字段 = 列表加一行 + 一次迁移）；状态与版本列是上面的域（方言按 schema 限定类型名）。
        _codec.SNAPSHOTS.create_table(f"{s}.tasks", PostgresDialect(s)),
        f"CREATE INDEX IF NOT EXISTS tasks_created_idx ON {s}.tasks (created_at, task_id)",
        f"CREATE INDEX IF NOT EXISTS tasks_name_idx ON {s}.tasks (name)",
        f"CREATE INDEX IF NOT EXISTS tasks_bucket_idx ON {s}.tasks (bucket) WHERE bucket IS NOT NULL",
        f"CREATE INDEX IF NOT EXISTS tasks_owner_idx ON {s}.tasks (owner) WHERE owner IS NOT NULL",
        f"""CREATE INDEX IF NOT EXISTS tasks_pipeline_idx ON {s}.tasks (pipeline_id)
    WHERE pipeline_id IS NOT NULL""",
        *slim_index_statements(schema),
        *later_ddl_statements(schema),
        *transitions_ddl_statements(schema),
        f"""CREATE TABLE IF NOT EXISTS {s}.commands (
    command_id text COLLATE "C" PRIMARY KEY,
    task_id text COLLATE "C" NOT NULL,
    action text NOT NULL CHECK (action IN ({actions})),
    issuer text,
    reason text,
    payload jsonb NOT NULL DEFAULT '{{}}',
    created_at timestamptz NOT NULL,
    created_at_off bigint NOT NULL,
    enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    bucket integer,
    claimant text,
    lease_until timestamptz,
    lease_until_off bigint,
    deliveries integer NOT NULL DEFAULT 0,
    completed_at timestamptz,
    completed_at_off bigint
)""",
        f"""CREATE INDEX IF NOT EXISTS commands_open_idx ON {s}.commands (enqueued_at, command_id)
    WHERE completed_at IS NULL""",
        f"CREATE INDEX IF NOT EXISTS commands_task_idx ON {s}.commands (task_id)",
        *node_ddl_statements(schema),
        *_logs.ddl_statements(s),
        f"""INSERT INTO {s}.schema_version (singleton, version) VALUES (true, {SCHEMA_VERSION})
    ON CONFLICT (singleton) DO NOTHING""",
    ]


def schema_sql(schema: str = DEFAULT_SCHEMA) -> str:
    """可直接交给 psql 执行的完整建表脚本（含事务）。"""
    body = ";\n\n".join(ddl_statements(schema))
    return f"BEGIN;\n\n{body};\n\nCOMMIT;\n"


def grant_sql(schema: str, role: str) -> str:
    """给只做读写、不建表的角色授权的 SQL（建表之后执行）。"""
    s = quote_ident(schema)
    r = quote_ident(role)
    return (
        f"GRANT USAGE ON SCHEMA {s} TO {r};\n"
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {r};\n"
    )


__all__ = [
    "DEFAULT_PARTITION",
    "DEFAULT_SCHEMA",
    "DROPPED_INDEXES",
    "LATER_TASK_COLUMNS",
    "LEGACY_PARTITION",
    "MAX_IDENTIFIER_BYTES",
    "SCHEMA_VERSION",
    "SETTLED_STATUS",
    "SLIM_INDEXES",
    "TYPED_COLUMNS",
    "UNTAGGED",
    "ddl_statements",
    "domain_ddl_statements",
    "domain_upgrade_statements",
    "grant_sql",
    "index_upgrade_statements",
    "later_ddl_statements",
    "lock_ddl",
    "migration_sql",
    "migration_statements",
    "node_ddl_statements",
    "outdated_indexes",
    "quote_ident",
    "schema_sql",
    "slim_index_statements",
    "transitions_ddl_statements",
    "untyped_columns",
]
