"""真实的多进程用例：几个 OS 进程同时读写同一个 SQLite 文件（不是用线程假装）。

子进程用 spawn 启动（与 macOS / Windows 的默认方式一致，也不会把父进程的连接带过去），
执行 tests/_mp_workers.py 里的角色函数（加载方式见该文件的模块说明）。
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import runpy
import signal
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from chongming_task.models import TaskSnapshot, Transition
from chongming_task.states import TaskStatus
from chongming_task.stores.sqlite import SqliteTaskStore

WORKERS = Path(__file__).with_name("_mp_workers.py")
CTX = multiprocessing.get_context("spawn")
T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


def _spawn(role: str, **args: Any) -> multiprocessing.process.BaseProcess:
    process = CTX.Process(
        target=runpy.run_path,
        args=(str(WORKERS),),
        kwargs={"init_globals": {"JOB": {"role": role, "args": args}}, "run_name": "__chongming_worker__"},
        daemon=True,
    )
    process.start()
    return process


def _join_all(processes: list[multiprocessing.process.BaseProcess], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(0.1, deadline - time.monotonic()))
    stuck = [p.pid for p in processes if p.is_alive()]
    for process in processes:
        if process.is_alive():
            process.kill()
    assert not stuck, f"子进程没有按时结束：{stuck}"
    assert [p.exitcode for p in processes] == [0] * len(processes)


def _running(task_id: str) -> tuple[TaskSnapshot, list[Transition]]:
    snapshot = TaskSnapshot(
        task_id=task_id, name="hammered", created_at=T0, status=TaskStatus.RUNNING, status_version=1
    )
    record = Transition(task_id, TaskStatus.STARTING, TaskStatus.RUNNING, "launched", "setup", None, 1, T0)
    return snapshot, [record]


def _hammer(tmp_path: Path, duration: float) -> None:
    db = str(tmp_path / "hammer.db")
    task_ids = ["hot-1", "hot-2", "hot-3"]  # 任务少、进程多：冲突是常态，正是要测的
    with SqliteTaskStore(db) as store:
        for task_id in task_ids:
            store.create(*_running(task_id))
    start = CTX.Event()
    names = [f"proc-{n}" for n in range(4)]
    results = [tmp_path / f"{name}.json" for name in names]
    processes = [
        _spawn(
            "hammer",
            db=db,
            name=name,
            task_ids=task_ids,
            duration=duration,
            start=start,
            result_path=str(result),
            seed=n,
        )
        for n, (name, result) in enumerate(zip(names, results, strict=True))
    ]
    start.set()
    _join_all(processes, timeout=duration + 60)
    reports = [json.loads(result.read_text(encoding="utf-8")) for result in results]

    for report in reports:
        assert report["errors"] == [], report["errors"]
        assert report["phantom_conflicts"] == 0, report
        assert sum(len(v) for v in report["saved"].values()) > 0, f"{report['name']} 一次也没写成功"
        assert report["touches"] > 0
    assert sum(r["conflicts"] for r in reports) > 0, "四个进程抢三个任务却从没冲突：测试没有测到并发"

    with SqliteTaskStore(db) as store:
        for task_id in task_ids:
            final = store.get(task_id)
            assert final is not None
            history = store.history(task_id)
            versions = [t.version for t in history]
            # 历史无空洞、无重复，且与快照版本一致。
            assert versions == list(range(1, final.status_version + 1))
            # 零丢失：每一次报告成功的 save 都在历史里，记在写它的进程名下，反之亦然。
            successes = sum(len(r["saved"][task_id]) for r in reports)
            assert final.status_version == 1 + successes
            for report in reports:
                mine = sorted(t.version for t in history if t.actor == report["name"])
                assert mine == sorted(report["saved"][task_id])
            # 迁移链首尾相接：每条记录的 from 是上一条的 to。
            for previous, record in itertools.pairwise(history):
                assert record.from_status is previous.to_status
            assert history[-1].to_status is final.status
            assert final.description == f"{history[-1].actor}@{final.status_version}"
            # 旁路字段由 touch 写、save 从不覆盖：最后的租约持有者是某个进程。
            assert final.lease_owner in {r["name"] for r in reports}
            assert final.progress is not None and final.progress.unit == "touch"


def test_four_processes_hammering_one_file_lose_no_update(tmp_path: Path) -> None:
    _hammer(tmp_path, duration=2.5)


@pytest.mark.slow
def test_four_processes_hammering_one_file_for_ten_seconds(tmp_path: Path) -> None:
    _hammer(tmp_path, duration=10.0)


def test_two_processes_claiming_never_get_the_same_command(tmp_path: Path) -> None:
    db = str(tmp_path / "claims.db")
    with SqliteTaskStore(db) as store:
        for n in range(20):
            store.create(TaskSnapshot(task_id=f"t{n}", name="target", created_at=T0))
        submitted = {store.submit_command(f"t{n % 20}", "stop").command_id for n in range(1500)}
    # 两个认领者都就绪（高负载下 spawn 一个进程可能要好几秒）之后才一起开始：用屏障而不是父进程的事件，
    # 否则先起来的那个可能在另一个还在导入模块时就把 1500 条全取完，测试就没测到并发。
    start = CTX.Barrier(2)
    first = CTX.Barrier(2)
    results = [tmp_path / "claimer-a.json", tmp_path / "claimer-b.json"]
    processes = [
        _spawn(
            "claim", db=db, name=f"claimer-{tag}", start=start, result_path=str(result), seed=n, first=first
        )
        for n, (tag, result) in enumerate(zip("ab", results, strict=True))
    ]
    _join_all(processes, timeout=120)
    reports = [json.loads(result.read_text(encoding="utf-8")) for result in results]
    for report in reports:
        assert report["errors"] == [], report["errors"]
    first = [c["id"] for c in reports[0]["claimed"]]
    second = [c["id"] for c in reports[1]["claimed"]]
    assert len(first) == len(set(first)) and len(second) == len(set(second))
    assert set(first).isdisjoint(second)
    assert set(first) | set(second) == submitted
    assert all(c["deliveries"] == 1 for r in reports for c in r["claimed"])
    assert first and second, "两个认领进程里有一个一条也没取到：测试没有测到并发"


def test_killed_claimer_commands_are_redelivered_and_its_write_lock_is_freed(tmp_path: Path) -> None:
    db = str(tmp_path / "killed.db")
    lease = 1.0
    store = SqliteTaskStore(db, busy_timeout=10)
    try:
        store.create(TaskSnapshot(task_id="victim", name="target", created_at=T0))
        command = store.submit_command("victim", "pause", issuer="console")
        result = tmp_path / "hang.json"
        process = _spawn("claim_then_hang", db=db, name="doomed", lease=lease, result_path=str(result))
        deadline = time.monotonic() + 60
        while not result.exists():
            assert process.is_alive() and time.monotonic() < deadline, "子进程没有报告认领结果"
            time.sleep(0.02)
        report = json.loads(result.read_text(encoding="utf-8"))
        assert report["claimed"] == [command.command_id]
        claimed_at = time.monotonic()

        assert process.pid is not None
        os.kill(process.pid, signal.SIGKILL)
        process.join(10)
        assert process.exitcode == -signal.SIGKILL

        # 被杀进程攥着的写锁随进程消失；它没提交的写入被丢弃。
        assert store.touch("victim", heartbeat_at=datetime.now(UTC))
        victim = store.get("victim")
        assert victim is not None and victim.description is None

        if time.monotonic() - claimed_at < lease * 0.8:
            assert store.claim_commands("survivor", lease=30) == [], "租约未到期就被重新投递了"
        time.sleep(max(0.0, claimed_at + lease + 0.1 - time.monotonic()))
        redelivered = store.claim_commands("survivor", lease=30)
        assert [c.command_id for c in redelivered] == [command.command_id]
        assert redelivered[0].deliveries == 2 and redelivered[0].claimant == "survivor"
        assert store.complete_command(command.command_id, "survivor")
        assert not store.complete_command(command.command_id, "doomed")
    finally:
        store.close()
