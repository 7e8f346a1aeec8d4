"""节点成员表 nodes 的建表细节：节点表加入之前建的第 1 版文件（表都在、唯独没有 nodes）照样能用。

契约语义（往返、覆盖、排序、并发发布）由 tests-contract 的 StoreContract 覆盖；这里只测本后端
独有的"补建缺的表"路径。
"""

from __future__ import annotations

import sqlite3
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

from chongming_task.storage import NodeRecord
from chongming_task.stores.sqlite import SqliteTaskStore
from chongming_task.testing.store_contract import snap

T0 = datetime(2026, 3, 1, 8, 0, 0, tzinfo=UTC)


def _record(owner: str) -> NodeRecord:
    return NodeRecord(
        owner=owner,
        buckets=frozenset({1, 2}),
        num_buckets=64,
        heartbeat_at=T0,
        expires_at=T0 + timedelta(seconds=30),
    )


def _old_file(path: Path) -> None:
    """一份节点表加入之前的文件：第 1 版、已有任务、没有 nodes 表。"""
    store = SqliteTaskStore(path)
    store.create(snap("old-task", bucket=3))
    store.close()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE nodes")
    conn.close()


def _tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()


def test_old_file_without_nodes_table_gets_it_on_open(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _old_file(path)
    assert "nodes" not in _tables(path)
    store = SqliteTaskStore(path)
    try:
        assert "nodes" in _tables(path), "打开旧文件时要补建节点表"
        assert store.get("old-task") is not None, "补建节点表不能动已有的任务"
        store.publish_node(_record("node-a"))
        assert [record.owner for record in store.list_nodes()] == ["node-a"]
    finally:
        store.close()
    version = sqlite3.connect(path)
    try:
        assert version.execute("SELECT version FROM schema_version").fetchall() == [(1,)], "不升版本号"
    finally:
        version.close()


def test_several_stores_opening_an_old_file_at_once(tmp_path: Path) -> None:
    """几个连接同时打开旧文件：补建在 BEGIN IMMEDIATE 里进行，谁都不会报错。"""
    path = tmp_path / "old.db"
    _old_file(path)
    stores: list[SqliteTaskStore] = []
    errors: list[BaseException] = []
    gate = threading.Barrier(4)

    def open_one() -> None:
        try:
            gate.wait()
            stores.append(SqliteTaskStore(path))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        assert errors == []
        for i, store in enumerate(stores):
            store.publish_node(_record(f"node-{i}"))
        assert [record.owner for record in stores[0].list_nodes()] == [f"node-{i}" for i in range(4)]
    finally:
        for store in stores:
            store.close()


def test_membership_is_shared_between_connections_to_one_file(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    first, second = SqliteTaskStore(path), SqliteTaskStore(path)
    try:
        first.publish_node(_record("node-a"))
        (seen,) = second.list_nodes()
        assert seen == _record("node-a")
        assert second.remove_node("node-a") is True
        assert first.list_nodes() == []
    finally:
        first.close()
        second.close()
