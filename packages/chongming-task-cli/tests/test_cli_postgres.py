"""--store postgresql://...：同一套命令换一个连接串。

需要真实数据库（CHONGMING_TEST_POSTGRES），CI 上跳过即失败。
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from chongming_task import open_store

pytestmark = pytest.mark.postgres
TASKS = "cli_test_tasks"


@pytest.fixture
def pg_url(postgres_dsn: str) -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg", reason="需要 psycopg 才能连 PostgreSQL")
    schema = f"ct_cli_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    separator = "&" if "?" in postgres_dsn else "?"
    yield f"{postgres_dsn}{separator}schema={schema}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _stored_status(url: str, task_id: str) -> str | None:
    with open_store(url) as store:
        snapshot = store.get(task_id)
    return None if snapshot is None else snapshot.status.value


def test_run_and_stop_across_processes_on_postgres(
    pg_url: str, tmp_path: Path, spawn_cli: Any, run_cli: Any, wait_until: Any
) -> None:
    node = spawn_cli(
        "--store", pg_url, "--owned-buckets", "0-15", "--owner", "pg-node",
        "run", "--tasks", TASKS, "resident", "--task-id", "pg-worker", "--bucket-key", "orders",
    )  # fmt: skip
    node.wait_for_stderr("starting → running")
    # 终端打印"→ running"时这条迁移还在写穿的路上：等 Postgres 里也是 running，再从另一个终端列出。
    wait_until(lambda: _stored_status(pg_url, "pg-worker") == "running")
    listed = run_cli("--store", pg_url, "--json", "ps", "--status", "running", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert [t["task_id"] for t in json.loads(listed.stdout)] == ["pg-worker"]
    stop = run_cli("--store", pg_url, "--owner", "ops", "stop", "pg-worker", "--reason", "换班", cwd=tmp_path)
    assert stop.returncode == 0, stop.stderr
    code, out, err = node.finish()
    assert code == 0, err
    assert "任务 pg-worker 成功（succeeded）" in out
    history = json.loads(run_cli("--store", pg_url, "--json", "history", "pg-worker", cwd=tmp_path).stdout)
    assert any(t["to_status"] == "stopping" and t["actor"] == "ops" for t in history)
    stats = json.loads(run_cli("--store", pg_url, "--json", "stats", cwd=tmp_path).stdout)
    assert stats["counts"]["succeeded"] == 1


def test_failed_task_exit_3_and_queries_in_process(pg_url: str, invoke: Any) -> None:
    result = invoke("--store", pg_url, "run", "--tasks", TASKS, "boom", "--task-id", "pg-bad")
    assert result.exit_code == 3
    status = invoke("--store", pg_url, "--json", "status", "pg-bad")
    assert json.loads(status.stdout)["status"] == "failed"
    assert invoke("--store", pg_url, "buckets").exit_code == 0
    assert "已清理 1 条" in invoke("--store", pg_url, "prune", "--keep-terminal", "0").stdout
