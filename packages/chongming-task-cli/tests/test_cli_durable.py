"""持久任务的命令（docs/cli.md「持久任务：submit、worker、retry」）：CliRunner 与真实的 worker 进程。"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

from chongming_task.stores.sqlite import SqliteTaskStore

TASKS = "cli_durable_tasks"


def test_submit_enqueues_prints_the_id_and_ps_shows_it_unheld(invoke: Any, db: str) -> None:
    result = invoke("--db", db, "submit", "add", "--tasks", TASKS, "--arg", "a=2", "--arg", "b=3",
                    "--task-id", "sum-1", "--bucket-key", "k", "--priority", "4")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "sum-1"
    with SqliteTaskStore(db) as store:
        snapshot = store.get("sum-1")
    assert snapshot is not None and snapshot.recipe is not None
    assert (snapshot.status.value, snapshot.owner, snapshot.priority) == ("queued", None, 4)
    assert snapshot.recipe.kwargs == {"a": 2, "b": 3}
    ps = invoke("--db", db, "ps")
    assert "queued(持久·待认领)" in ps.stdout
    listed = json.loads(invoke("--db", db, "--json", "ps").stdout)
    assert listed[0]["recipe"]["name"] == "add"


def test_submit_refuses_unregistered_names_and_bad_arguments(invoke: Any, db: str) -> None:
    missing = invoke("--db", db, "--json", "submit", "nope", "--tasks", TASKS)
    assert missing.exit_code == 1
    assert json.loads(missing.stderr)["error"] == "not_registered"
    bad = invoke("--db", db, "submit", "add", "--tasks", TASKS, "--arg", "c=1")
    assert bad.exit_code == 1 and "对不上" in bad.stderr
    no_store = invoke("submit", "add", "--tasks", TASKS, "--arg", "a=1")
    assert no_store.exit_code == 1
    clash = invoke("--db", db, "submit", "add", "--tasks", TASKS, "--arg", "a=1", "--arg", "on_lost=retry")
    assert clash.exit_code == 1 and "--on-lost" in clash.stderr


def test_worker_runs_submitted_tasks_and_exits_0_on_sigterm(
    tmp_path: Path, spawn_cli: Any, run_cli: Any, status_of: Any, wait_until: Any
) -> None:
    db = str(tmp_path / "tasks.db")
    for index in range(3):
        done = run_cli("--db", db, "submit", "add", "--tasks", TASKS, "--arg", f"a={index}",
                       "--task-id", f"t{index}", cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr
    worker = spawn_cli("--db", db, "--owner", "w1", "worker", "--tasks", TASKS, "--max-parallel", "2",
                       "--poll-interval", "0.05")  # fmt: skip
    worker.wait_for_stderr("已启动")
    wait_until(lambda: all(status_of(db, f"t{i}") == "succeeded" for i in range(3)))
    worker.signal(signal.SIGTERM)
    code, _, err = worker.finish()
    assert code == 0, err
    assert "认领 3" in err


def test_drain_timeout_stops_running_tasks_exit_3_and_retry_requeues(
    tmp_path: Path, spawn_cli: Any, run_cli: Any, status_of: Any, wait_until: Any
) -> None:
    db = str(tmp_path / "tasks.db")
    assert run_cli("--db", db, "submit", "spin_durable", "--tasks", TASKS, "--task-id", "s1",
                   cwd=tmp_path).returncode == 0  # fmt: skip
    worker = spawn_cli("--db", db, "worker", "--tasks", TASKS, "--poll-interval", "0.05",
                       "--drain-timeout", "0.2")  # fmt: skip
    worker.wait_for_stderr("已启动")
    wait_until(lambda: status_of(db, "s1") == "running")
    worker.signal(signal.SIGINT)
    code, _, err = worker.finish()
    assert code == 3, err
    assert status_of(db, "s1") == "stopped"
    retried = run_cli("--db", db, "retry", "s1", "--reason", "发布后重跑", cwd=tmp_path)
    assert retried.returncode == 0, retried.stderr
    with SqliteTaskStore(db) as store:
        snapshot = store.get("s1")
        history = store.history("s1")
    assert snapshot is not None and (snapshot.status.value, snapshot.owner) == ("queued", None)
    assert (history[-1].trigger, history[-1].reason) == ("control:retry", "发布后重跑")


def test_second_interrupt_stops_waiting_even_for_a_task_that_ignores_stop(
    tmp_path: Path, spawn_cli: Any, run_cli: Any, status_of: Any, wait_until: Any
) -> None:
    """文档：第二次中断"不再等，立刻停"。原来第二下仍按优雅停止的整个窗口（graceful_stop + 2 = 7 秒）关。"""
    db = str(tmp_path / "tasks.db")
    assert run_cli("--db", db, "submit", "deaf_durable", "--tasks", TASKS, "--task-id", "d1",
                   cwd=tmp_path).returncode == 0  # fmt: skip
    worker = spawn_cli("--db", db, "worker", "--tasks", TASKS, "--poll-interval", "0.05",
                       "--drain-timeout", "60")  # fmt: skip
    worker.wait_for_stderr("已启动")
    wait_until(lambda: status_of(db, "d1") == "running")
    worker.signal(signal.SIGINT)
    worker.wait_for_stderr("不再认领")
    started = time.monotonic()
    worker.signal(signal.SIGINT)
    code, _, err = worker.finish()
    elapsed = time.monotonic() - started
    assert code == 3, err
    assert elapsed < 3.0, f"第二次中断之后还等了 {elapsed:.1f} 秒"
    assert "再次中断" in err and "d1" in err and "reconcile" in err
    assert "Traceback" not in err


def test_retry_refuses_non_durable_and_unfinished_tasks(invoke: Any, db: str) -> None:
    assert invoke("--db", db, "run", "plain", "--tasks", TASKS, "--task-id", "p1").exit_code == 0
    plain = invoke("--db", db, "--json", "retry", "p1")
    assert plain.exit_code == 1 and json.loads(plain.stderr)["error"] == "retry_rejected"
    assert "不是持久任务" in json.loads(plain.stderr)["message"]
    invoke("--db", db, "submit", "add", "--tasks", TASKS, "--arg", "a=1", "--task-id", "q1")
    queued = invoke("--db", db, "--json", "retry", "q1")
    assert queued.exit_code == 1 and json.loads(queued.stderr)["error"] == "retry_rejected"
    ghost = invoke("--db", db, "--json", "retry", "ghost")
    assert ghost.exit_code == 1 and json.loads(ghost.stderr)["error"] == "task_not_found"
