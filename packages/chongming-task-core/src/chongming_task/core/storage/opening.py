"""打开存储时"建不建表"的约定：``readonly`` 与 ``create_schema``（SQLite、Postgres 与第三方后端共用）。

为什么要有它（issue 16.5）：打开存储原先总是"缺表就建"，于是 ``ps --db 别的应用.db`` 把我们的六张表写进了
别人的文件，``?schema=拼错的名字`` 悄悄建出一个新 schema。规则是：

* ``readonly=True``：只读打开。绝不建表、不迁移、不改文件（SQLite 连 journal 模式都不动），连接本身也设成
  只读（SQLite ``PRAGMA query_only``、Postgres ``default_transaction_read_only``），写方法一律失败。
  目标里没有 chongming-task 的表（文件不存在、0 字节、别的应用的库、拼错的 schema）→ ``SchemaMissing``。
* ``create_schema="auto"``（默认）：只在**新的或空的**存储上建表——文件不存在、0 字节、库里一张表也没有；
  Postgres 的 schema 不存在或里面没有任何表。库里已有别的表、唯独没有我们的 → ``SchemaMissing``，
  提示用 ``chongming-task init`` 或 ``create_schema="always"`` 明确表示"就建在这里"。
* ``create_schema="always"``：缺表就建，哪怕库里已有别的应用的表（有的用户就是想把任务表放进自己应用的文件）。
* ``create_schema="never"``：从不建表（表由 DBA 按 ``schema_sql()`` 手工建好）；缺表 → ``SchemaMissing``。

``readonly=True`` 与 ``create_schema="always"`` 互相矛盾，构造时就拒绝。
"""

from __future__ import annotations

from typing import Literal, cast

from chongming_task.errors import ConfigurationError, StoreError

CreateSchema = Literal["auto", "always", "never"]
CREATE_SCHEMA_MODES: tuple[str, ...] = ("auto", "always", "never")


class OpensReadonly:
    """混入类：存储的 ``readonly`` 属性（构造时定下、之后不变；见模块说明）。子类构造时设 ``_readonly``。"""

    _readonly: bool

    @property
    def readonly(self) -> bool:
        return self._readonly


class SchemaMissing(StoreError):
    """目标存储里没有 chongming-task 的表，而这次打开不允许（或不应该）建表。

    ``ddl``：后端能给出建表 SQL 时附上（Postgres：交给有权限的账号执行）；消息本身只有一行，不含 DDL。
    """

    def __init__(self, message: str, *, ddl: str | None = None) -> None:
        super().__init__(message)
        self.ddl = ddl


class SchemaPrivilegeError(StoreError):
    """要建表，但当前账号没有建表权限。消息只有一行（缺什么、该做什么），完整建表 SQL 在 ``ddl`` 里。"""

    def __init__(self, message: str, *, ddl: str | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.ddl = ddl
        self.detail = detail


def check_opening(readonly: object, create_schema: object) -> CreateSchema:
    """校验两个参数并返回实际生效的建表方式（只读时一律 ``"never"``）。"""
    if not isinstance(readonly, bool):
        raise ConfigurationError(f"readonly 必须是 True 或 False，收到 {readonly!r}")
    if create_schema not in CREATE_SCHEMA_MODES:
        raise ConfigurationError(
            f"create_schema 只能是 {' / '.join(repr(m) for m in CREATE_SCHEMA_MODES)}，收到 {create_schema!r}"
        )
    if readonly and create_schema == "always":
        raise ConfigurationError(
            "readonly=True 与 create_schema='always' 互相矛盾：只读打开绝不建表；要建表请去掉 readonly"
        )
    return "never" if readonly else cast(CreateSchema, create_schema)


__all__ = ["CREATE_SCHEMA_MODES", "CreateSchema", "SchemaMissing", "SchemaPrivilegeError", "check_opening"]
