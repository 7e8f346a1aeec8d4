"""网页控制台测试夹具：临时 SQLite 存储、直接写入的快照（含恶意名字）、TestClient 工厂。"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

# starlette 的 TestClient 提示 "httpx 已弃用，请装 httpx2"：与被测行为无关。
warnings.filterwarnings("ignore", message=".*httpx.*")
# 测试模块按名字导入 web_testkit（importlib 导入模式下 tests/ 不是包，也不在 sys.path 上）。
sys.path.insert(0, str(Path(__file__).resolve().parent))

from starlette.testclient import TestClient  # noqa: E402
from web_testkit import T0, ClientFactory, MakeTask  # noqa: E402

from chongming_task import Progress, TaskSnapshot, TaskStatus  # noqa: E402
from chongming_task.stores.sqlite import SqliteTaskStore  # noqa: E402
from chongming_task.web import WebSettings  # noqa: E402
from chongming_task.web.app import WebConsole  # noqa: E402


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "tasks.db")


@pytest.fixture
def store(db_path: str) -> Iterator[SqliteTaskStore]:
    s = SqliteTaskStore(db_path)
    yield s
    s.close()


@pytest.fixture
def make_task(store: SqliteTaskStore) -> MakeTask:
    """直接在存储里写一个快照（不经运行时）：测试能造出任意状态、任意恶意字段。"""
    counter = iter(range(1, 1_000_000))

    def make(task_id: str | None = None, name: str = "demo.job", **fields: Any) -> TaskSnapshot:
        n = next(counter)
        fields.setdefault("created_at", T0 + timedelta(seconds=n))
        fields.setdefault("status", TaskStatus.RUNNING)
        if fields["status"] is not TaskStatus.PENDING and "started_at" not in fields:
            fields["started_at"] = None if fields["status"] is TaskStatus.QUEUED else fields["created_at"]
        if "progress" in fields and isinstance(fields["progress"], tuple):
            fields["progress"] = Progress(*fields["progress"])
        snapshot = TaskSnapshot(task_id=task_id or f"t{n:04d}", name=name, **fields)
        store.create(snapshot)
        return snapshot

    return make


@pytest.fixture
def client_for(store: SqliteTaskStore) -> Iterator[ClientFactory]:
    clients: list[TestClient] = []

    def factory(**settings: Any) -> TestClient:
        settings.setdefault("default_operator", "alice")
        console = WebConsole(store, WebSettings(**settings))
        client = TestClient(console.app, follow_redirects=False)
        client.__enter__()
        client.console = console  # type: ignore[attr-defined]
        clients.append(client)
        return client

    yield factory
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(client_for: ClientFactory) -> TestClient:
    return client_for()
