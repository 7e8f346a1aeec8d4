"""SQLite 存储跑完整的持久层契约套件：文件库与内存库各一份，都注入 FakeClock（租约用例毫秒级完成），
另有一份文件库不注入时钟，走套件的"真实短租约"路径。"""

from __future__ import annotations

import tempfile
import unittest
from pathlib import Path

from chongming_task import open_store
from chongming_task.stores.sqlite import SqliteTaskStore
from chongming_task.testing import FakeClock
from chongming_task.testing.store_contract import StoreContract, snap


def _new_path(case: unittest.TestCase) -> str:
    """每个用例一个新的临时目录与数据库文件。addCleanup 先进后出：套件先关存储，之后才删目录。"""
    directory = tempfile.TemporaryDirectory(prefix="chongming-sqlite-contract-")
    case.addCleanup(directory.cleanup)
    return str(Path(directory.name) / "tasks.db")


class TestSqliteFileStore(StoreContract):
    def make_store(self) -> SqliteTaskStore:
        return SqliteTaskStore(_new_path(self))

    def make_clocked_store(self, clock: FakeClock) -> SqliteTaskStore:
        return SqliteTaskStore(_new_path(self), clock=clock)


class TestSqliteFileStoreRealClock(StoreContract):
    def make_store(self) -> SqliteTaskStore:
        return SqliteTaskStore(_new_path(self))


class TestSqliteMemoryStore(StoreContract):
    def make_store(self) -> SqliteTaskStore:
        return SqliteTaskStore(":memory:")

    def make_clocked_store(self, clock: FakeClock) -> SqliteTaskStore:
        return SqliteTaskStore(":memory:", clock=clock)


def test_open_store_resolves_sqlite_urls(tmp_path: Path) -> None:
    """open_store 经入口点（或内置兜底）找到本后端，三种写法都指向同一个文件。"""
    target = tmp_path / "via-url.db"
    first = open_store(f"sqlite://{target}")
    try:
        assert isinstance(first, SqliteTaskStore)
        first.create(snap("via-url"))
    finally:
        first.close()
    second = open_store(str(target))  # 裸路径按 SQLite 文件处理
    try:
        assert second.get("via-url") is not None
    finally:
        second.close()
    memory = open_store("sqlite:///:memory:")
    try:
        assert memory.get("via-url") is None
    finally:
        memory.close()
