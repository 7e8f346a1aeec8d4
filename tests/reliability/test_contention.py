"""争用：4 个进程 × 2 条线程对同一个 SQLite 文件 / 同一个 Postgres schema 混合读写 20 秒。

判据（见 contention_worker.py 的说明）：

* 零错误：任何异常（尤其 "database is locked"）都不许逃到调用方；
* 零丢失更新：自有任务的最终版本与状态等于写者自己记下的；共享任务的最终版本 = 初始版本 +
  全体成功的 save 次数（touch 不动版本号，冲突的 save 什么也不写）；每个任务的历史无空洞；
* 指令恰好一次：每条提交过的指令至多被认领一次（长租约下），测试结束后剩下的都还能认领到；
* 报告各类写操作的 p50 / p99 / 最大延迟。
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prefork import python_popen
from reliability_support import check_history, percentile, report

from chongming_task import StateMachine, TaskStatus, open_store

S = TaskStatus
WORKER = Path(__file__).with_name("contention_worker.py")
PROCESSES = 4
THREADS = 2
SECONDS = 20.0
SHARED = [f"shared-{i}" for i in range(6)]


def run_contention(url: str, kind: str, workdir: Path, figures_dir: Path) -> dict[str, Any]:
    store = open_store(url)
    try:
        for task_id in SHARED:
            machine = StateMachine.create(task_id, "shared", tags={"shared"})
            machine.mark_queued()
            store.create(machine.snapshot, machine.transitions)
        initial = {task_id: store.get(task_id).status_version for task_id in SHARED}  # type: ignore[union-attr]

        procs: list[subprocess.Popen[str]] = []
        outs = [workdir / f"{kind}-proc{i}.json" for i in range(PROCESSES)]
        try:
            for i, out in enumerate(outs):
                procs.append(
                    # 经预导入的模板进程 fork（tests/support/prefork.py）；20 秒的争用从统一的起跑时刻算起。
                    python_popen(
                        [
                            str(WORKER),
                            url,
                            str(i),
                            str(SECONDS),
                            str(THREADS),
                            ",".join(SHARED),
                            str(out),
                        ],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                        env=dict(os.environ),
                    )
                )
            for proc in procs:
                assert proc.stdout is not None and proc.stdout.readline().startswith("READY")
            start_at = time.time() + 0.3
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(f"{start_at}\n")
                proc.stdin.flush()
            for proc in procs:
                _, err = proc.communicate(timeout=SECONDS + 90)
                assert proc.returncode == 0, f"争用进程异常退出：{err}"
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(timeout=10)

        results = [thread for out in outs for thread in json.loads(out.read_text(encoding="utf-8"))]
        errors = [e for r in results for e in r["errors"]]
        locked = [e for e in errors if "locked" in e.lower()]
        assert not errors, (
            f"{len(errors)} 个异常逃到了调用方（其中 database is locked：{len(locked)}）：\n"
            + ("\n".join(errors[:5]))
        )

        # 自有任务：只有一个写者，最终版本/状态必须与写者记下的一致。
        own_checked = 0
        for r in results:
            for task_id, (version, status) in r["own"].items():
                snapshot, history = check_history(store, task_id)
                assert (snapshot.status_version, snapshot.status.value) == (version, status), task_id
                assert len(history) == version
                own_checked += 1

        # 共享任务：版本号 = 初始 + 成功的 save 总数。
        shared_saves = 0
        for task_id in SHARED:
            successes = sum(r["shared_ok"][task_id] for r in results)
            snapshot, history = check_history(store, task_id)
            assert snapshot.status_version == initial[task_id] + successes, (
                f"{task_id}: 存储版本 {snapshot.status_version}，"
                f"应为 {initial[task_id]} + {successes}（丢了更新）"
            )
            shared_saves += successes

        # 指令：每条至多被认领一次；剩下的都还能认领。
        submitted = [c for r in results for c in r["commands_submitted"]]
        claimed = [c for r in results for c in r["commands_claimed"]]
        assert len(claimed) == len(set(claimed)), "同一条指令在租约内被认领了两次"
        leftover = [c.command_id for c in store.claim_commands("sweeper", lease=60.0, limit=1_000_000)]
        assert set(claimed).isdisjoint(leftover)
        assert set(claimed) | set(leftover) == set(submitted)

        latencies: dict[str, list[float]] = {}
        for r in results:
            for op, values in r["latencies"].items():
                latencies.setdefault(op, []).extend(values)
        writes = [v for op, values in latencies.items() for v in values]
        figures = {
            "store": kind,
            "processes": PROCESSES,
            "threads_per_process": THREADS,
            "seconds": SECONDS,
            "write_ops": len(writes),
            "reads": sum(r["reads"] for r in results),
            "own_tasks_checked": own_checked,
            "shared_saves": shared_saves,
            "shared_conflicts": sum(r["conflicts"] for r in results),
            "commands_submitted": len(submitted),
            "commands_claimed_once": len(claimed),
            "errors": len(errors),
            "database_is_locked_escaped": len(locked),
            "write_p50_ms": round(percentile(writes, 50) * 1000, 3),
            "write_p99_ms": round(percentile(writes, 99) * 1000, 3),
            "write_max_ms": round(max(writes) * 1000, 3),
            "p99_ms_by_op": {op: round(percentile(v, 99) * 1000, 3) for op, v in sorted(latencies.items())},
            "ops_by_kind": {op: len(v) for op, v in sorted(latencies.items())},
        }
        report(figures_dir, f"contention_{kind}", figures)
        assert own_checked > 100 and shared_saves > 100 and len(claimed) > 10
        return figures
    finally:
        store.close()


@pytest.mark.slow
def test_contention_sqlite(tmp_path: Path, figures_dir: Path) -> None:
    run_contention(f"sqlite:///{tmp_path}/contention.db", "sqlite", tmp_path, figures_dir)


@pytest.mark.slow
@pytest.mark.postgres
def test_contention_postgres(
    tmp_path: Path, pg_schema_factory: Callable[[str], str], figures_dir: Path
) -> None:
    run_contention(pg_schema_factory("contention"), "postgres", tmp_path, figures_dir)
