"""pytest 插件：测试自己的任务时常用的夹具（用户指南 §14.4）。

经 core 的 ``pytest11`` 入口点登记，装了 chongming-task-core 的环境里 pytest 自动加载，不用在 conftest 里写
``pytest_plugins``。提供：

* ``fake_clock``：一个新的 :class:`~chongming_task.testing.FakeClock`；
* ``task_context``：``make_context()`` 造的真 TaskContext（产物根目录在本测试的 tmp_path 下），控制把手在
  ``task_context.test_handle``；
* ``memory_store``：一个新的内存存储，测试结束关闭；
* ``controller``：一个不带存储的 Controller，测试结束 ``close()``；没装运行时就跳过并给出安装命令；
* ``task_store``：按**已安装的**每个存储后端参数化（``chongming_task.stores`` 入口点）：内存、SQLite
  临时文件、设置了 ``CHONGMING_TEST_POSTGRES`` 时的 PostgreSQL（独立 schema，结束后删除）。
  第三方后端从环境变量 ``CHONGMING_TEST_STORE_<SCHEME>``（连接串）打开，没设就跳过。

设计约束：

* core 没有任何运行时依赖，``import chongming_task`` 永远不 import pytest，也不 import 本模块——它只由 pytest
  经入口点加载；
* core 不依赖运行时：``controller`` 夹具在用到时才 import ``chongming_task.controller``；
* 夹具都是函数级（每个测试一份新的），不在测试之间共享状态。项目自己的 conftest 里同名的夹具优先于
  插件（pytest 的就近规则），所以插件不会悄悄改掉已有的测试。
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from chongming_task.store_registry import ENTRY_POINT_GROUP, open_store
from chongming_task.stores.memory import InMemoryTaskStore
from chongming_task.testing.context import make_context
from chongming_task.testing.fake_clock import FakeClock

if TYPE_CHECKING:
    from chongming_task.context import TaskContext
    from chongming_task.storage import TaskStore

POSTGRES_ENV = "CHONGMING_TEST_POSTGRES"
"""PostgreSQL 测试库的连接串（与本仓库自己的测试用同一个变量）。"""

RUNTIME_HINT = (
    "controller 夹具需要运行时：pip install chongming-task-runtime（或 pip install chongming-task）"
)


def _installed_backends() -> list[str]:
    """已安装的存储后端，每个实现类只取一个名字（postgres 与 postgresql 指向同一个类，取短的）。"""
    by_target: dict[str, str] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        current = by_target.get(ep.value)
        if current is None or (len(ep.name), ep.name) < (len(current), current):
            by_target[ep.value] = ep.name
    order = {"memory": 0, "sqlite": 1, "postgres": 2}
    return sorted(by_target.values(), key=lambda name: (order.get(name, 3), name))


def _env_name(scheme: str) -> str:
    return "CHONGMING_TEST_STORE_" + re.sub(r"[^A-Z0-9]", "_", scheme.upper())


@pytest.fixture
def fake_clock() -> FakeClock:
    """确定性时钟：``advance(秒)`` 推进，``wait_for_sleepers(n)`` 等看门狗睡下（用户指南 §14.2）。"""
    return FakeClock()


@pytest.fixture
def task_context(tmp_path: Path) -> TaskContext:
    """真 TaskContext（用户指南 §14.1），``ctx.artifact_dir`` 落在本测试的临时目录下。"""
    return make_context(artifact_dir=tmp_path / "artifacts")


@pytest.fixture
def memory_store() -> Iterator[InMemoryTaskStore]:
    store = InMemoryTaskStore()
    yield store
    store.close()


@pytest.fixture
def controller() -> Iterator[Any]:
    """不带存储的 Controller，测试结束时 ``close()``（排队的直接 stopped，在跑的优雅停止）。"""
    try:
        from chongming_task.controller import Controller
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.startswith("chongming_task"):
            pytest.skip(RUNTIME_HINT)
        raise
    instance = Controller()
    yield instance
    instance.close()


@pytest.fixture(params=_installed_backends())
def task_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TaskStore]:
    """每个已安装的存储后端各跑一遍本测试；拿到的是一个空的、只属于本测试的存储。"""
    scheme: str = request.param
    cleanup: list[Any] = []
    if scheme == "memory":
        store: TaskStore = InMemoryTaskStore()
    elif scheme == "sqlite":
        store = open_store(f"sqlite:///{tmp_path / 'tasks.db'}")
    elif scheme == "postgres":
        dsn = os.environ.get(POSTGRES_ENV, "").strip()
        if not dsn:
            pytest.skip(f"设置 {POSTGRES_ENV}=postgresql://user@host:5432/db 才会在 PostgreSQL 上跑")
        schema = f"ct_plugin_{os.getpid()}_{time.monotonic_ns() % 10**12}"
        store = open_store(f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}")
        cleanup.append((dsn, schema))
    else:
        url = os.environ.get(_env_name(scheme), "").strip()
        if not url:
            pytest.skip(f"设置 {_env_name(scheme)}=<连接串> 才会在后端 {scheme!r} 上跑")
        store = open_store(url)
    try:
        yield store
    finally:
        store.close()
        for dsn, schema in cleanup:
            import psycopg  # postgres 后端的依赖：能走到这里说明它已安装

            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


__all__ = ["controller", "fake_clock", "memory_store", "task_context", "task_store"]
