"""run --metrics-port：抓一个真实 run 进程的 /metrics，计数与存储里的迁移历史逐条对得上（用户指南 §15.2）。"""

from __future__ import annotations

import json
import socket
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client.parser import text_string_to_metric_families

TASKS = "cli_test_tasks"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def transitions_from(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float],
) -> Counter[tuple[str, str]]:
    got: Counter[tuple[str, str]] = Counter()
    for (name, labels), value in samples.items():
        if name == "chongming_task_transitions_total" and value:
            label = dict(labels)
            assert label["task"] == "resident"
            got[(label["from_status"], label["to_status"])] += int(value)
    return got


def test_scrape_a_real_run_process_and_check_counters_against_history(
    tmp_path: Path, spawn_cli: Any, run_cli: Any, status_of: Any, wait_until: Any
) -> None:
    db = str(tmp_path / "tasks.db")
    port = free_port()
    node = spawn_cli(
        "--db", db, "run", "--tasks", TASKS, "resident", "--task-id", "metered", "--metrics-port", str(port)
    )  # fmt: skip
    node.wait_for_stderr("starting → running")
    wait_until(lambda: status_of(db, "metered") == "running")  # "→ running" 落库之后再从另一个终端暂停
    assert run_cli("--db", db, "pause", "metered", cwd=tmp_path).returncode == 0
    wait_until(lambda: status_of(db, "metered") == "paused")
    assert run_cli("--db", db, "resume", "metered", cwd=tmp_path).returncode == 0
    wait_until(lambda: status_of(db, "metered") == "running")

    def history() -> Counter[tuple[str, str]]:
        result = run_cli("--db", db, "--json", "history", "metered", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return Counter((t["from_status"], t["to_status"]) for t in json.loads(result.stdout))

    expected = history()
    assert expected[("paused", "running")] == 1
    # 事件异步交付：等指标追上存储里的历史，然后逐条相等
    wait_until(lambda: transitions_from(scrape(port)) == expected)
    samples = scrape(port)
    assert samples[("chongming_task_tasks", (("status", "running"),))] == 1
    assert samples[("chongming_task_slots", (("kind", "used"),))] == 1
    assert samples[("chongming_task_queue_wait_seconds_count", (("task", "resident"),))] == 1
    assert not any(name == "chongming_task_store_errors_total" and v for (name, _), v in samples.items())
    assert run_cli("--db", db, "stop", "metered", cwd=tmp_path).returncode == 0
    code, _out, err = node.finish()
    assert code == 0, err
    assert f"指标：http://127.0.0.1:{port}/metrics" in err
    with pytest.raises(OSError):  # 命令退出时端点一起关掉
        scrape(port)


def test_metrics_port_in_use_is_a_one_line_error(tmp_path: Path, run_cli: Any) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli(
            "--db", str(tmp_path / "t.db"), "run", "--tasks", TASKS, "count", "--metrics-port", str(port),
            cwd=tmp_path,
        )  # fmt: skip
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--metrics-port {port}" in lines[0] and "换一个端口" in lines[0]
