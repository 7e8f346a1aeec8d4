"""PostgresTaskStore 测试的夹具：每个用例自己的 schema（用完即删），管理员连接，子进程辅助。

DSN 来自根目录 conftest 的 ``postgres_dsn``（环境变量 CHONGMING_TEST_POSTGRES，没有就跳过；
CI 上跳过即失败）。
"""

from __future__ import annotations

import itertools
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

psycopg = pytest.importorskip(
    "psycopg", reason='Postgres 用例需要 psycopg 3（pip install "chongming-task[postgres]"）'
)
from psycopg import sql  # noqa: E402
from psycopg.conninfo import make_conninfo  # noqa: E402

HERE = Path(__file__).resolve().parent
_RUN = f"{os.getpid()}_{secrets.token_hex(3)}"
_counter = itertools.count()


def drop_schema(dsn: str, schema: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def new_schema(postgres_dsn: str) -> Iterator[Callable[[], str]]:
    """返回一个生成"本用例专用 schema 名"的函数；用例结束时把生成过的全部删掉。"""
    made: list[str] = []

    def make() -> str:
        name = f"ct_pg_{_RUN}_{next(_counter)}"
        made.append(name)
        return name

    yield make
    for schema in made:
        drop_schema(postgres_dsn, schema)


@pytest.fixture
def schema(new_schema: Callable[[], str]) -> str:
    return new_schema()


@pytest.fixture
def admin(postgres_dsn: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """一条 autocommit 的管理员连接（建角色、查系统视图、终止后端）。"""
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def worker_script() -> Path:
    return HERE / "_pg_worker.py"


@pytest.fixture
def limited_role(admin: Any, postgres_dsn: str) -> Iterator[tuple[str, str]]:
    """(角色名, 以该角色连接的 DSN)。角色只有 LOGIN，没有任何 CREATE 权限；用例结束时删掉。"""
    role = f"ct_ro_{secrets.token_hex(4)}"
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        yield role, make_conninfo(postgres_dsn, user=role)
    finally:
        # DROP OWNED 撤销本库里授予它的全部权限（否则 DROP ROLE 会因"仍有依赖"失败）。
        admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
