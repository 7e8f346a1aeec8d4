"""doctor：读各节点发布的桶声明，报告重复、空洞与孤儿任务；不健康退出码 3。"""

from __future__ import annotations

import json
from typing import Any

from chongming_task import Controller, SqliteTaskStore


def test_doctor_reports_duplicates_and_holes_then_healthy(invoke: Any, db: str) -> None:
    # 空库、没有任何节点：每个桶都是空洞。
    SqliteTaskStore(db).close()
    empty = invoke("--db", db, "--num-buckets", "8", "doctor")
    assert empty.exit_code == 3
    assert "没有活着的节点" in empty.output

    a = Controller(store=SqliteTaskStore(db), owner="node-a", owned_buckets=range(5), num_buckets=8)
    b = Controller(store=SqliteTaskStore(db), owner="node-b", owned_buckets=range(4, 7), num_buckets=8)
    try:
        bad = invoke("--db", db, "--num-buckets", "8", "doctor")
        assert bad.exit_code == 3
        assert "node-a" in bad.output and "node-b" in bad.output
        assert "✗" in bad.output
        report = json.loads(invoke("--db", db, "--num-buckets", "8", "doctor", "--json").output)
        assert report["healthy"] is False
        assert report["holes"] == [7]
        assert {int(k) for k in report["duplicates"]} == {4}
        assert report["problems"]
    finally:
        b.close(close_store=True)
    c = Controller(store=SqliteTaskStore(db), owner="node-c", owned_buckets=range(5, 8), num_buckets=8)
    try:
        good = invoke("--db", db, "--num-buckets", "8", "doctor")
        assert good.exit_code == 0, good.output
        assert "集群健康" in good.output
    finally:
        c.close(close_store=True)
        a.close(close_store=True)


def test_doctor_with_unreachable_store_exits_1(invoke: Any, tmp_path: Any) -> None:
    missing = str(tmp_path / "nope" / "tasks.db")
    result = invoke("--db", missing, "doctor")
    assert result.exit_code == 1
