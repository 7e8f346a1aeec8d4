"""可靠性套件的夹具：隔离的 Postgres schema、图表输出目录，以及让测试能导入同目录的 reliability_support。

测试以 ``--import-mode=importlib`` 运行，pytest 不会把测试目录放进 sys.path；这里显式放进去，
子进程脚本（crash_worker.py 等）以脚本方式运行，本来就能导入同目录模块。
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def _schema_url(dsn: str, schema: str) -> str:
    separator = "&" if "?" in dsn else "?"
    return f"{dsn}{separator}schema={schema}"


@pytest.fixture
def pg_schema_factory(postgres_dsn: str) -> Iterator[Callable[[str], str]]:
    """按需建隔离 schema 的连接串（store 首次连接时自动建表）；测试结束一律 DROP，失败也不例外。"""
    psycopg = pytest.importorskip("psycopg", reason="需要 psycopg 才能连 PostgreSQL")
    created: list[str] = []

    def make(tag: str) -> str:
        schema = f"ct_rel_{tag}_{os.getpid()}_{time.monotonic_ns() % 10**9}"
        created.append(schema)
        return _schema_url(postgres_dsn, schema)

    yield make
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for schema in created:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def pg_url(pg_schema_factory: Callable[[str], str]) -> str:
    return pg_schema_factory("t")


@pytest.fixture
def figures_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """各测试把测得的数字写成 JSON 放在这里（路径会打印出来）。"""
    return tmp_path_factory.mktemp("reliability-figures")


# -- 私有 PostgreSQL 集群与故障代理（用户指南 §8 的分布式故障：切网、丢回执、分区）-------------------


@pytest.fixture(scope="session")
def throwaway_pg() -> Iterator[Any]:
    """整个会话只起一次的私有 PostgreSQL（另一个端口、trust 认证）；要杀服务器、切网络的测试用它。"""
    pytest.importorskip("psycopg", reason="需要 psycopg 才能连 PostgreSQL")
    from pg_cluster import ThrowawayCluster, find_bindir

    bindir = find_bindir()
    if bindir is None:
        pytest.skip("找不到 PostgreSQL 的 initdb / pg_ctl（/usr/lib/postgresql/*/bin）：无法起私有集群")
    cluster = ThrowawayCluster(bindir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def pg_proxy(throwaway_pg: Any) -> Iterator[Any]:
    """挡在私有集群前面的故障代理（每个测试一个，测试结束关闭）。"""
    from pg_proxy import PgFaultProxy

    proxy = PgFaultProxy(throwaway_pg.host, throwaway_pg.port)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def proxied_schema(throwaway_pg: Any, pg_proxy: Any) -> Iterator[tuple[str, str]]:
    """(经代理的连接串, 直连的连接串)：同一个新 schema；测试结束 DROP。"""
    import psycopg

    schema = f"ct_px_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    direct = _schema_url(throwaway_pg.dsn, schema)
    proxied = _schema_url(
        f"postgresql://postgres@{pg_proxy.host}:{pg_proxy.port}/postgres?sslmode=disable&gssencmode=disable",
        schema,
    )
    yield proxied, direct
    pg_proxy.heal()
    with psycopg.connect(throwaway_pg.dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
