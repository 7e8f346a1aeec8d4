"""PostgresTaskStore：跨机器共用一套任务存储与控制指令通道（psycopg 3 + psycopg_pool）。

语义与 API 与 SqliteTaskStore 完全一致——两者跑的是同一套 ``StoreContract`` 契约用例——所以
跨机部署只需把 ``SqliteTaskStore("tasks.db")`` 换成 ``PostgresTaskStore("postgresql://...")``。

与 SQLite 后端的差异
--------------------

1. **连接池，而不是每线程一条连接。** SQLite 是本机文件，写入靠数据库级的写锁串行化；这里是
   ``psycopg_pool.ConnectionPool``（``min_size`` / ``max_size``），多个线程真正并发地读写。
   连接借出前做零往返的健康检查（空闲套接字上有数据 = 服务器已断开），坏连接由池丢弃并重建；
   数据库宕机期间的调用在 ``pool_timeout`` 秒内抛 StoreError（控制器把它记进 persist_failures，
   任务本身照跑），数据库恢复后自动重连，不需要重启进程。连接以 autocommit 运行：每个方法
   都是一条自成事务的语句，省掉 BEGIN/COMMIT 的往返。
2. **指令认领用 ``FOR UPDATE SKIP LOCKED``。** SQLite 只有一个写者，认领天然串行；这里多台
   机器同时认领，每个认领者跳过别人正锁着的行，互不等待、也绝不拿到同一条指令。租约过期后
   指令可被重新取走（deliveries 加一）。
3. **原生类型。** outcome / failure / progress / payload 是 jsonb，时间是 timestamptz，标签是
   带 GIN 索引的 ``text[]``，状态是 schema 里带约束的域（text + 15 个合法值）。timestamptz 只存时刻
   不存偏移，所以每个时间列旁有一个 ``*_off`` 列记下原始 UTC 偏移，带任意偏移的时间逐微秒连同偏移往返。
   jsonb 把数字存为 numeric：写成指数形式的大浮点（如 ``1e20``）读回来是数值相等的 int，
   ``-0.0`` 读回 ``0.0``——数值相等，但类型/符号与 SQLite（存原文）不同。
4. **即时指令（LISTEN/NOTIFY）。** ``submit_command`` 在同一条语句里 ``pg_notify``（频道由 schema
   推导）；持有任务的控制器用 ``store.listen(回调或 Event)`` 或 ``store.wait_for_commands(timeout)``
   立刻醒来去认领，而不是等下一轮轮询。监听走一条专用连接，不占连接池。通知只是提示：丢了
   最多多等一个轮询间隔，轮询始终是兜底。SQLite 没有这条通道，只能轮询。
5. **建表与权限。** 首次连接时在 ``pg_advisory_xact_lock`` 保护的事务里建表（两个节点同时启动
   不会撞车）；表已存在就直接用，所以只有 SELECT/INSERT/UPDATE/DELETE 权限的运维角色也能连
   （为此不使用任何序列）；表不存在又没有 CREATE 权限时，报错写明缺哪项权限，并附上要执行的
   SQL（``PostgresTaskStore.schema_sql(schema)``）。表结构带版本号（schema_version 表），遇到更新
   版本建的表会明确报错而不是乱写。
6. **一次往返的 save。** 版本校验的 ``UPDATE ... RETURNING`` 与迁移记录的 ``INSERT ... SELECT FROM
   unnest(...)`` 写在同一条带 CTE 的语句里：天然原子，版本不符（ConcurrencyConflict）时什么也不写。

跨进程并发用例（8 线程 × 2 进程抢同一批指令，租约内每条恰好投递一次）见
``packages/chongming-task-store-postgres/tests/test_postgres_concurrency.py``。

PostgreSQL 存不下的输入（text / jsonb 里的 NUL 字符、超出 bigint 的整数）一律抛
ConfigurationError，绝不写入一行被改写过的数据。

没有安装驱动时，``import chongming_task`` 照常工作；只有真正取用本模块才报错，并给出安装命令。
"""

from __future__ import annotations

try:
    import psycopg  # noqa: F401  - 只为尽早给出清楚的安装提示
    import psycopg_pool  # noqa: F401
except ImportError as exc:  # pragma: no cover - 由子进程测试覆盖
    raise ImportError(
        "PostgresTaskStore 需要 PostgreSQL 驱动 psycopg 3 与 psycopg-pool，但当前环境里没有"
        f'（{exc}）。请运行：pip install "chongming-task[postgres]"'
        "（没有系统 libpq 时再加 psycopg[binary]）"
    ) from exc

from chongming_task.stores.postgres._listener import CommandNotice
from chongming_task.stores.postgres._schema import SCHEMA_VERSION
from chongming_task.stores.postgres.store import PostgresTaskStore

__all__ = ["SCHEMA_VERSION", "CommandNotice", "PostgresTaskStore"]
