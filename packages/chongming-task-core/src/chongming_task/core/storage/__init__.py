"""给后端作者的存储工具箱（core 所有，标准库即可）。

* ``contract``：``TaskStore`` 抽象基类——每个后端要实现的 25 个方法与它们的语义；
* ``retention``：时间窗口保留的共用算法（哪些迁移记录可以归档）；
* ``values``：查询条件、统计、控制指令、节点记录等值类型；
* ``checks``：唯一的入参校验模块（内存、SQLite、Postgres 与第三方后端共用，措辞一致）；
* ``columns``：快照的声明式列表——DDL 与 codec 都由它推导；
* ``sql``：SQL 后端共用的推导与编解码基类（``SqlDialect``）与 ``escape_like``。
* ``commit_hooks``：写事务 COMMIT 之前的回调（组提交登记、声明了 ``calls_before_commit`` 的存储调用）。

逐条语义见 docs/store-guide.md（持久层实现指南）。
"""
