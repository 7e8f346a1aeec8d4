"""组提交进行中被 SIGKILL（issue 17）：没有任何调用方被告知"已提交"而存储里却没有那次迁移。

工作节点（group_commit_worker.py）每收到一次"已提交"就把 (task_id, 版本) fsync 进 ack 文件，
每个事务开始之前也记一行。父进程在随机时刻 kill -9 它，然后重新打开存储逐条核对：

1. ack 文件里的每一条 (task_id, 版本)，存储里该任务的版本 ≥ 它，且历史里有那一版；
2. 每个任务的历史无空洞、每步都是转移表里的边、末条等于快照（与崩溃矩阵同一检查）；
3. 至少有一次试验被杀时正有一批（多于一项的）组提交在写（B 行之后那一批的成员没全部 ack）。随机时刻
   在满载的 2 核机器上未必碰得上，所以最后一次试验让工作节点停在某个多项批次"已提交、未告知"处
   （``S`` 行）再杀：那一批的成员一个都不在 ack 里，却都在存储里。
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prefork import python_popen
from reliability_support import check_history

from chongming_task import open_store

WORKER = Path(__file__).with_name("group_commit_worker.py")
TRIALS = 4
TASKS = 3000


def read_ack(path: Path) -> tuple[list[tuple[str, int]], bool, list[tuple[str, int]]]:
    """返回 (被告知已提交的 (task_id, 版本), 被杀时最后一批多项组提交是否还没全部 ack,
    停住的那一批已提交的成员)。"""
    acks: list[tuple[str, int]] = []
    open_batch = 0  # 最近一个多项批次还差几个 ack
    stalled: list[tuple[str, int]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "A":
            acks.append((parts[1], int(parts[2])))
            open_batch = max(0, open_batch - 1)
        elif len(parts) == 2 and parts[0] == "B":
            open_batch = int(parts[1]) if int(parts[1]) > 1 else 0
        elif len(parts) == 3 and parts[0] == "S":
            stalled = [(m.split(":")[0], int(m.split(":")[1])) for m in parts[2].split(",")]
    return acks, bool(stalled) or open_batch > 0, stalled


def run_trial(url: str, ack: Path, rng: random.Random, stall: bool = False) -> tuple[int, bool]:
    stall_at = rng.randrange(5, 40) if stall else 0
    # 经预导入的模板进程 fork（tests/support/prefork.py），省掉每次试验的解释器启动与导入。
    proc = python_popen(
        [str(WORKER), url, str(ack), str(TASKS), str(stall_at)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read() if proc.stderr else ""
        target = rng.randrange(100, 1500)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            data = ack.read_bytes() if ack.exists() else b""
            if b"\nS " in data if stall else data.count(b"\nA ") >= target:
                break
            time.sleep(0.002)
        assert proc.poll() is None, "工作节点在被杀之前就退出了：" + (
            proc.stderr.read() if proc.stderr else ""
        )
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    acks, in_flight, stalled = read_ack(ack)
    assert bool(stalled) == stall, "工作节点没有停在多项批次里" if stall else "不该停住的试验停住了"
    store = open_store(url)
    try:
        # Postgres：被杀进程最后一条已发出的 COMMIT 仍可能在服务器上完成——先等它落定。
        time.sleep(0.3)
        seen: dict[str, list[int]] = {}
        for task_id, version in acks:
            if task_id not in seen:
                snapshot, history = check_history(store, task_id)
                seen[task_id] = [t.version for t in history]
                assert snapshot.status_version == len(history)
            assert version in seen[task_id], (
                f"{task_id} 的 v{version} 已告知调用方'已提交'，存储里却没有（存储的历史：{seen[task_id]}）"
            )
        for task_id, version in stalled:
            # 已提交、却没有告诉任何调用方：不在 ack 里，但存储里有那一版。
            assert (task_id, version) not in acks
            assert version in [t.version for t in check_history(store, task_id)[1]]
        for snapshot in store.query():
            check_history(store, snapshot.task_id)
    finally:
        store.close()
    return len(acks), in_flight


def run_trials(make_url: Callable[[int], str], tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("CHONGMING_CRASH_SEED", "17")))
    in_flight_trials = 0
    acked = []
    for index in range(TRIALS):
        stall = index == TRIALS - 1
        count, in_flight = run_trial(make_url(index), tmp_path / f"ack-{index}.txt", rng, stall)
        acked.append(count)
        in_flight_trials += in_flight
    assert min(acked) > 0
    assert in_flight_trials >= 1, f"{TRIALS} 次试验没有一次杀在多项组提交进行中：{acked}"


@pytest.mark.slow
def test_kill_during_group_commit_sqlite(tmp_path: Path) -> None:
    run_trials(lambda index: f"sqlite:///{tmp_path}/gc-{index}.db", tmp_path)


@pytest.mark.slow
@pytest.mark.postgres
def test_kill_during_group_commit_postgres(pg_schema_factory: Callable[[str], str], tmp_path: Path) -> None:
    run_trials(lambda index: pg_schema_factory(f"gc{index}"), tmp_path)
