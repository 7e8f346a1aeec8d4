"""真实进程：一个终端 run（任务的持有者），另一个终端 status / stop / pause；Ctrl-C 与 SIGTERM。"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

TASKS = "cli_test_tasks"


def test_two_terminals_run_then_stop_from_another(
    tmp_path: Path, spawn_cli: Any, run_cli: Any, status_of: Any, wait_until: Any
) -> None:
    """命令行控制台「两个终端：前台运行，另一个终端停止」：分区节点前台 run，另一个终端 status / stop。"""
    db = str(tmp_path / "tasks.db")
    node = spawn_cli(
        "--db", db, "--num-buckets", "64", "--owned-buckets", "0-15", "--owner", "node-a",
        "run", "--tasks", TASKS, "resident", "--task-id", "orders-worker", "--bucket-key", "orders",
    )  # fmt: skip
    node.wait_for_stderr("starting → running")
    # 终端打印"→ running"时这条迁移还在写穿的路上（先发事件、随后落库）：等存储里也是 running，再从另一个
    # 终端看。以前每条命令都是新起的解释器，约 0.3–1 秒的启动恰好盖住了这段间隙。
    wait_until(lambda: status_of(db, "orders-worker") == "running")
    status = run_cli("--db", db, "--owned-buckets", "0-15", "--json", "status", "orders-worker", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    snapshot = json.loads(status.stdout)
    assert (snapshot["status"], snapshot["bucket"], snapshot["owner"]) == ("running", 13, "node-a")
    stop = run_cli(
        "--db", db, "--owned-buckets", "0-15", "--owner", "ops",
        "stop", "orders-worker", "--reason", "发布窗口", cwd=tmp_path,
    )  # fmt: skip
    assert stop.returncode == 0, stop.stderr
    assert "已受理" in stop.stdout
    code, out, err = node.finish()
    assert code == 0, err  # resident 收到停止请求后正常返回 → succeeded
    assert "任务 orders-worker 成功（succeeded）" in out
    assert "running → stopping（发布窗口）" in err
    assert "日志 共处理" in err
    assert status_of(db, "orders-worker") == "succeeded"
    history = json.loads(run_cli("--db", db, "--json", "history", "orders-worker", cwd=tmp_path).stdout)
    stopping = next(t for t in history if t["to_status"] == "stopping")
    assert (stopping["actor"], stopping["reason"]) == ("ops", "发布窗口")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_the_task_and_exits_3(
    tmp_path: Path, spawn_cli: Any, status_of: Any, signum: signal.Signals
) -> None:
    db = str(tmp_path / "tasks.db")
    node = spawn_cli("--db", db, "run", "--tasks", TASKS, "spin", "--task-id", "spinner")
    node.wait_for_stderr("starting → running")
    node.signal(signum)
    code, out, err = node.finish()
    assert code == 3, err
    assert f"收到 {signum.name}：正在停止任务 spinner" in err
    assert f"running → stopping（命令行收到 {signum.name}）" in err
    assert "任务 spinner 没有成功，终态 stopped" in out
    assert "Traceback" not in err
    assert status_of(db, "spinner") == "stopped"  # close() 追平了存储才退出


def test_interrupt_of_a_graceful_task_reports_its_real_outcome(
    tmp_path: Path, spawn_cli: Any, status_of: Any
) -> None:
    db = str(tmp_path / "tasks.db")
    node = spawn_cli("--db", db, "run", "--tasks", TASKS, "resident", "--task-id", "graceful")
    node.wait_for_stderr("starting → running")
    node.signal(signal.SIGINT)
    code, out, err = node.finish()
    # 退出码跟着终态走：任务按停止请求正常返回，是 succeeded，不谎报成失败
    assert code == 0, err
    assert "收到 SIGINT 后，任务按停止请求优雅收尾并正常返回" in out
    assert status_of(db, "graceful") == "succeeded"


def test_exit_codes_and_messages_from_real_processes(tmp_path: Path, run_cli: Any) -> None:
    db = str(tmp_path / "tasks.db")
    ok = run_cli("--db", db, "--json", "run", "--tasks", TASKS, "count", "--task-id", "ok", cwd=tmp_path)
    assert ok.returncode == 0 and json.loads(ok.stdout)["status"] == "succeeded"
    failed = run_cli("--db", db, "run", "--tasks", TASKS, "boom", "--task-id", "bad", cwd=tmp_path)
    assert failed.returncode == 3 and "终态 failed" in failed.stdout
    for args, needle in (
        (["run", "--tasks", TASKS, "nosuch"], "任务名 'nosuch' 没有登记"),
        (["run", "--tasks", TASKS, "os.system", "--arg", "command=touch pwned"], "拒绝运行 'os.system'"),
        (["--owned-buckets", "0-15", "run", "--tasks", TASKS, "count"], "必须给出 --bucket-key"),
        (
            ["--owned-buckets", "0-15", "run", "--tasks", TASKS, "count", "--bucket-key", "tenant-B"],
            "桶 28（来自 bucket_key='tenant-B'）不属于本节点；本节点负责 [0, 1, ..., 15]",
        ),
        (["status", "nope"], "找不到任务 'nope'"),
        (["--owned-buckets", "60-70", "ps"], "超出 --num-buckets 64 的范围 0-63"),
    ):
        result = run_cli("--db", db, *args, cwd=tmp_path)
        assert result.returncode == 1, (args, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("错误：") and needle in lines[0], (args, result.stderr)
    assert not (tmp_path / "pwned").exists()
    listed = json.loads(run_cli("--db", db, "--json", "ps", cwd=tmp_path).stdout)
    assert [t["task_id"] for t in listed] == ["ok", "bad"]


def test_pause_across_processes_is_unconfirmed(
    tmp_path: Path, spawn_cli: Any, run_cli: Any, status_of: Any, wait_until: Any
) -> None:
    db = str(tmp_path / "tasks.db")
    node = spawn_cli("--db", db, "--owner", "node-a", "run", "--tasks", TASKS, "resident", "--task-id", "p")
    node.wait_for_stderr("starting → running")
    wait_until(lambda: status_of(db, "p") == "running")  # 同上：等"→ running"落库再从另一个终端暂停
    paused = run_cli("--db", db, "pause", "p", cwd=tmp_path)
    assert paused.returncode == 0 and "未确认" in paused.stdout
    wait_until(lambda: status_of(db, "p") == "paused")
    assert run_cli("--db", db, "resume", "p", cwd=tmp_path).returncode == 0
    wait_until(lambda: status_of(db, "p") == "running")
    assert run_cli("--db", db, "stop", "p", "--wait", "20", cwd=tmp_path).returncode == 0
    code, _out, err = node.finish()
    assert code == 0
    assert "running → pausing" in err and "paused → running" in err


def test_process_executor(tmp_path: Path, run_cli: Any) -> None:
    db = str(tmp_path / "tasks.db")
    result = run_cli("--db", db, "--json", "run", "--tasks", TASKS, "count", "--executor", "process",
                     "--arg", "n=2", "--task-id", "proc", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["status"], data["outcome"], data["executor"]) == ("succeeded", 2, "process")


def test_second_interrupt_stops_waiting(tmp_path: Path, spawn_cli: Any) -> None:
    """任务停不掉（从不 checkpoint）时，收尾要等优雅窗口；再按一次 Ctrl-C 就不再等，退出码仍是 3。"""
    db = str(tmp_path / "tasks.db")
    node = spawn_cli("--db", db, "run", "--tasks", TASKS, "deaf", "--task-id", "deaf")
    node.wait_for_stderr("starting → running")
    node.signal(signal.SIGINT)
    node.wait_for_stderr("收到 SIGINT：正在停止任务 deaf")
    second = time.monotonic()
    node.signal(signal.SIGINT)
    code, _out, err = node.finish(timeout=10)
    # 收尾最多等 graceful_stop + 2 秒（7 秒）：第二下不能等它用完。信号落在执行槽线程上时，主线程曾经要等满
    # 窗口才处理它（runtime/interruptible.py）。
    assert time.monotonic() - second < 3.0, err
    assert code == 3, err
    assert "再次中断：不再等待收尾。任务 deaf 可能停在 " in err  # running 或 stopping，取决于第二下来得多快
    assert "Traceback" not in err
