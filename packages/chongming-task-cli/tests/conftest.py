"""CLI 测试夹具：CliRunner 调用、真实子进程（另一个终端）、测试任务模块的导入路径。"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from prefork import python_popen, python_run

from chongming_task.cli import cli

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parents[2]
TASKS_MODULE = "cli_test_tasks"

# 子进程入口：显式恢复 SIGINT 的默认处理。从非交互 shell 的后台作业里启动的 pytest，其子进程
# 继承"忽略 SIGINT"，那样 Ctrl-C 测试就测不到东西了。
_ENTRY = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from chongming_task.cli import main; main(sys.argv[1:])"
)


def cli_env(extra_path: Sequence[str | Path] = ()) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_TASK_")}
    paths = [str(p) for p in (TESTS_DIR, *extra_path)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-c", _ENTRY, *args]


@pytest.fixture
def cli_process_tools() -> tuple[Callable[..., list[str]], Callable[..., dict[str, str]]]:
    """(cli_argv, cli_env)：自己起子进程的测试用（文档走查）。"""
    return cli_argv, cli_env


class Invoke:
    """在本进程里用 CliRunner 跑一条命令（看到的就是用户看到的：退出码、stdout、stderr）。"""

    def __init__(self) -> None:
        self.runner = CliRunner()

    def __call__(self, *args: str, env: dict[str, str] | None = None, input: str | None = None) -> Result:
        return self.runner.invoke(cli, list(args), env=env, input=input, catch_exceptions=False)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("CHONGMING_TASK_"):
            monkeypatch.delenv(key)


@pytest.fixture
def invoke(monkeypatch: pytest.MonkeyPatch) -> Invoke:
    monkeypatch.syspath_prepend(str(TESTS_DIR))
    return Invoke()


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "tasks.db")


class CliProcess:
    """另一个终端里的 chongming-task（真实 OS 进程）。stderr 逐行读，用来等"→ running"。"""

    def __init__(self, args: Sequence[str], cwd: Path, env: dict[str, str]) -> None:
        # 经预导入的模板进程 fork（tests/support/prefork.py）：省掉每条命令的解释器启动与导入。
        self.proc = python_popen(
            cli_argv(*args)[1:], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.stderr_lines: list[str] = []

    def wait_for_stderr(self, needle: str, timeout: float = 20.0) -> str:
        assert self.proc.stderr is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.stderr_lines.append(line)
            if needle in line:
                return line
        raise AssertionError(f"子进程没有输出 {needle!r}：{''.join(self.stderr_lines)}")

    def signal(self, signum: signal.Signals) -> None:
        self.proc.send_signal(signum)

    def finish(self, timeout: float = 30.0) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, "".join(self.stderr_lines) + err


@pytest.fixture
def spawn_cli(tmp_path: Path) -> Iterator[Callable[..., CliProcess]]:
    procs: list[CliProcess] = []

    def spawn(*args: str, cwd: Path | None = None) -> CliProcess:
        proc = CliProcess(args, cwd or tmp_path, cli_env())
        procs.append(proc)
        return proc

    yield spawn
    for proc in procs:
        if proc.proc.poll() is None:
            proc.proc.kill()
            proc.proc.wait(timeout=10)


def _run_cli(*args: str, cwd: Path, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return python_run(
        cli_argv(*args)[1:], cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def run_cli() -> Callable[..., subprocess.CompletedProcess[str]]:
    """另一个终端里的一次性命令：跑到结束，返回退出码与输出。"""
    return _run_cli


def _wait_until(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("条件在超时内没有成立")
        time.sleep(interval)


@pytest.fixture
def wait_until() -> Callable[..., Any]:
    """轮询直到条件成立（返回条件的值），超时则断言失败。"""
    return _wait_until


def snapshot_status(db: str, task_id: str) -> str | None:
    from chongming_task.stores.sqlite import SqliteTaskStore

    with SqliteTaskStore(db) as store:
        snapshot = store.get(task_id)
    return None if snapshot is None else snapshot.status.value


@pytest.fixture
def status_of() -> Callable[[str, str], str | None]:
    """直接读 SQLite 文件里的任务状态（不经 CLI，用来等待条件）。"""
    return snapshot_status
