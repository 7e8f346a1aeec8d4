"""logs TASK [--attempt N] [--follow] [--json]（docs/cli.md "日志：logs"）：真实的两个进程。

一个终端 run（持有者，任务每隔几毫秒记一行），另一个终端 ``logs --follow``：每一行都到、按顺序、不重复，
任务落终态后自己退出。SQLite 与 PostgreSQL 各跑一遍。
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TASKS = "cli_log_tasks"
EXPECTED = [f"第 {i:03d} 行" for i in range(1, 201)]


def _follow_every_line(store_args: list[str], tmp_path: Path, spawn_cli: Any, run_cli: Any) -> None:
    holder = spawn_cli(*store_args, "run", "--tasks", TASKS, "narrate", "--task-id", "story")
    holder.wait_for_stderr("starting → running")
    follower = spawn_cli(*store_args, "--json", "logs", "story", "--follow", "--interval", "0.05")
    code, out, err = follower.finish(timeout=60)
    assert code == 0, err
    lines = [json.loads(text) for text in out.splitlines()]
    assert [line["message"] for line in lines] == EXPECTED, "每一行都到、按顺序、不重复"
    assert [line["seq"] for line in lines] == list(range(1, 201))
    assert {line["attempt"] for line in lines} == {1}
    holder_code, _, holder_err = holder.finish()
    assert holder_code == 0, holder_err
    # 之后再读（不 follow）：同样的 200 行，文本格式带级别与尝试序号。
    text = run_cli(*store_args, "logs", "story", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    rendered = text.stdout.splitlines()
    assert len(rendered) == 200
    assert "INFO" in rendered[0] and "#1" in rendered[0] and rendered[0].endswith("第 001 行")
    only = run_cli(*store_args, "--json", "logs", "story", "--attempt", "2", cwd=tmp_path)
    assert json.loads(only.stdout) == []


def test_logs_follow_across_processes_on_sqlite(tmp_path: Path, spawn_cli: Any, run_cli: Any) -> None:
    _follow_every_line(["--db", str(tmp_path / "tasks.db")], tmp_path, spawn_cli, run_cli)


@pytest.fixture
def pg_url(postgres_dsn: str) -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg", reason="需要 psycopg 才能连 PostgreSQL")
    schema = f"ct_logs_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    separator = "&" if "?" in postgres_dsn else "?"
    yield f"{postgres_dsn}{separator}schema={schema}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.postgres
def test_logs_follow_across_processes_on_postgres(
    pg_url: str, tmp_path: Path, spawn_cli: Any, run_cli: Any
) -> None:
    _follow_every_line(["--store", pg_url], tmp_path, spawn_cli, run_cli)


def test_logs_follow_ctrl_c_exits_130_quietly(tmp_path: Path, spawn_cli: Any, run_cli: Any) -> None:
    db = str(tmp_path / "tasks.db")
    holder = spawn_cli(
        "--db", db, "run", "--tasks", TASKS, "narrate", "--arg", "lines=100000", "--arg", "delay=0.02",
        "--task-id", "forever",
    )  # fmt: skip
    holder.wait_for_stderr("starting → running")
    follower = spawn_cli("--db", db, "logs", "forever", "--follow", "--interval", "0.05")
    first = follower.proc.stdout.readline()  # 已经在续读循环里了，再按 Ctrl-C
    assert first.endswith("第 001 行\n"), first
    follower.signal(signal.SIGINT)
    code, _out, err = follower.finish()
    assert code == 130, err
    assert err == "", "Ctrl-C 安静退出：不打印堆栈，也不打印报错"
    holder.signal(signal.SIGINT)
    holder.finish()


def test_logs_of_unknown_task_is_one_line_exit_1(tmp_path: Path, run_cli: Any) -> None:
    db = str(tmp_path / "tasks.db")
    assert (
        run_cli("--db", db, "run", "--tasks", TASKS, "quiet", "--task-id", "ok", cwd=tmp_path).returncode == 0
    )
    result = run_cli("--db", db, "--json", "logs", "ghost", cwd=tmp_path)
    assert result.returncode == 1
    assert json.loads(result.stderr)["error"] == "task_not_found"
