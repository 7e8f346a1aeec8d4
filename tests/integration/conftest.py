"""集成测试夹具：在独立 OS 进程里启动工作节点（真实进程，而不是线程假装）。"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prefork import python_popen

WORKER = Path(__file__).with_name("node_worker.py")


class WorkerProcess:
    def __init__(self, args: list[str]) -> None:
        # 经预导入的模板进程 fork（tests/support/prefork.py），省掉每个工作节点的解释器启动与导入。
        self.proc = python_popen(
            [str(WORKER), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("READY"):
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"工作节点没有就绪：{line!r}\n{err}")

    def final(self, timeout: float = 30.0) -> tuple[str, Any]:
        out, err = self.proc.communicate(timeout=timeout)
        for line in out.splitlines():
            if line.startswith("FINAL"):
                _, status, value = line.split(" ", 2)
                import json

                return status, json.loads(value)
        raise AssertionError(f"工作节点没有给出结果：{out!r}\n{err}")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def spawn_worker() -> Iterator[Any]:
    workers: list[WorkerProcess] = []

    def spawn(*args: str) -> WorkerProcess:
        worker = WorkerProcess(list(args))
        workers.append(worker)
        return worker

    yield spawn
    for worker in workers:
        if worker.proc.poll() is None:
            worker.kill()


def _wait_until(predicate: Any, timeout: float = 10.0, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("条件在超时内没有成立")
        time.sleep(interval)


@pytest.fixture
def wait_until() -> Any:
    """轮询直到条件成立（返回条件的值），超时则断言失败。"""
    return _wait_until
