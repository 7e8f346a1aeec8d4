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
* **WAL 检查点**：文件库的连接关掉自动检查点，由每个存储一条后台 daemon 线程做 PASSIVE 检查点（见
  ``_checkpoint``）：提交的线程不再在 COMMIT 里拷页、fsync，本进程的其他写者也不用排在它后面。每次提交
  照旧在 COMMIT 返回前写进 WAL，持久性语义不变（synchronous=NORMAL：进程崩溃不丢，断电可能丢最近一次
  检查点之后的事务）。
* **索引**：save 只为真正变了的被索引列 SET（SET 一个被索引的列，哪怕值没变，SQLite 也要维护那个索引），
  多数任务是 NULL 的桶号、流水线 id 只建部分索引（见 ``_schema``）。
* **时间**：ISO 原文保留原始时区偏移与微秒，另存 UTC 微秒整数作排序与过滤键（见 ``_schema``）。
* 每个 sqlite3.Error 都包装成 StoreError（``__cause__`` 保留原异常）；契约自己的异常原样抛出。
"""

from __future__ import annotations

from chongming_task.stores.sqlite._schema import SCHEMA_VERSION
from chongming_task.stores.sqlite.store import MEMORY, SqliteTaskStore, parse_url

__all__ = ["MEMORY", "SCHEMA_VERSION", "SqliteTaskStore", "parse_url"]
