"""PostgreSQL 存储跑完整的持久层契约套件（真实服务器，DSN 取自 CHONGMING_TEST_POSTGRES）。

每个用例一个全新的 schema（名字带进程号与随机串，多个测试进程、多次运行互不相撞），用例结束
先关存储、再 DROP SCHEMA ... CASCADE。两份：注入 FakeClock 的（租约用例毫秒级完成）与真实时钟的。
"""

from __future__ import annotations

import itertools
import os
import secrets
import unittest

import pytest

psycopg = pytest.importorskip(
    "psycopg", reason='Postgres 契约用例需要 psycopg 3（pip install "chongming-task[postgres]"）'
)

from chongming_task import open_store  # noqa: E402
from chongming_task.stores.postgres import PostgresTaskStore  # noqa: E402
from chongming_task.testing import FakeClock  # noqa: E402
from chongming_task.testing.store_contract import StoreContract, snap  # noqa: E402

DSN_ENV = "CHONGMING_TEST_POSTGRES"
_RUN = f"{os.getpid()}_{secrets.token_hex(3)}"
_counter = itertools.count()


def _dsn() -> str:
    dsn = os.environ.get(DSN_ENV, "").strip()
    if not dsn:
        raise unittest.SkipTest(f"需要真实 PostgreSQL：请设置 {DSN_ENV}=postgresql://user@host:5432/db")
    return dsn


def _drop_schema(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(psycopg.sql.Identifier(schema))
        )


class _PostgresMixin(unittest.TestCase):
    """每次 make_store 一个空 schema。

    建表 + 删 schema 每次要一两百毫秒，170 个用例就是半分钟：用过的 schema 在用例结束时清空
    （TRUNCATE，毫秒级）放回空闲列表，下一个用例直接复用；整个类结束时统一删除。同一用例里
    多次 make_store 各拿一个不同的 schema，互相看不见。
    """

    __test__ = False
    dsn: str
    _free: list[str]
    _all: list[str]
    _admin: psycopg.Connection[tuple[object, ...]]

    @classmethod
    def setUpClass(cls) -> None:
        cls.dsn = _dsn()
        cls._free = []
        cls._all = []
        cls._admin = psycopg.connect(cls.dsn, autocommit=True)  # 清空 schema 用，整个类共用一条
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        cls._admin.close()
        for schema in cls._all:
            _drop_schema(cls.dsn, schema)

    def _new_schema(self) -> str:
        cls = type(self)
        if cls._free:
            schema = cls._free.pop()
        else:
            schema = f"ct_contract_{_RUN}_{next(_counter)}"
            cls._all.append(schema)
        # addCleanup 先进后出：套件在 make_store 之后登记的 store.close 先执行，然后才清空并归还。
        self.addCleanup(self._recycle, schema)
        return schema

    def _recycle(self, schema: str) -> None:
        s = psycopg.sql.Identifier(schema)
        admin = type(self)._admin
        exists = admin.execute("SELECT to_regclass(%s) IS NOT NULL", [f'"{schema}".tasks']).fetchone()
        if not (exists and exists[0]):
            return  # 构造失败的存储没建成表：不复用，类结束时删掉
        # 小表上 DELETE 比 TRUNCATE 快（TRUNCATE 要换新的数据文件）；一个事务里清空全部数据表。
        with admin.transaction():
            for table in ("transitions", "commands", "tasks", "nodes", "task_logs"):
                admin.execute(psycopg.sql.SQL("DELETE FROM {}.{}").format(s, psycopg.sql.Identifier(table)))
        type(self)._free.append(schema)


@pytest.mark.postgres
class TestPostgresStore(_PostgresMixin, StoreContract):
    def make_store(self) -> PostgresTaskStore:
        return PostgresTaskStore(self.dsn, schema=self._new_schema(), max_size=4)

    def make_clocked_store(self, clock: FakeClock) -> PostgresTaskStore:
        return PostgresTaskStore(self.dsn, schema=self._new_schema(), max_size=4, clock=clock)


@pytest.mark.postgres
class TestPostgresStoreRealClock(_PostgresMixin, StoreContract):
    def make_store(self) -> PostgresTaskStore:
        return PostgresTaskStore(self.dsn, schema=self._new_schema(), max_size=4)


@pytest.mark.postgres
def test_open_store_resolves_postgres_urls(postgres_dsn: str) -> None:
    """open_store 经入口点（或内置兜底）找到本后端；postgresql:// 与 postgres:// 都可以，?schema= 被摘下。"""
    schema = f"ct_contract_{_RUN}_url"
    try:
        first = open_store(f"{postgres_dsn}{'&' if '?' in postgres_dsn else '?'}schema={schema}")
        try:
            assert isinstance(first, PostgresTaskStore)
            assert first.schema == schema
            first.create(snap("via-url"))
        finally:
            first.close()
        alias = "postgres://" + postgres_dsn.split("://", 1)[1]
        second = open_store(alias, schema=schema)
        try:
            assert second.get("via-url") is not None
        finally:
            second.close()
    finally:
        _drop_schema(postgres_dsn, schema)
