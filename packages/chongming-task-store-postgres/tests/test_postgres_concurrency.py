"""跨进程并发：多台"机器"（这里是多个进程，各自一个连接池）同时抢同一批指令、同时首次建表。

这些用例证明 PostgresTaskStore 与 SQLite 后端语义相同：租约有效期内每条指令恰好投递一次；
两个节点同时启动不会在建表上撞车。
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prefork import python_popen

from chongming_task.stores.postgres import PostgresTaskStore, _schema
from chongming_task.testing.store_contract import snap

pytestmark = pytest.mark.postgres


def _run_together(commands: list[list[str]], timeout: float = 120.0) -> list[dict[str, Any]]:
    """启动全部子进程，等它们都 ready 后同时放行，收集每个进程最后一行 JSON。"""
    # 经预导入的模板进程 fork（tests/support/prefork.py），省掉解释器启动与导入。
    procs = [
        python_popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cmd in commands
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            if line != "ready":
                _, err = proc.communicate(timeout=timeout)
                raise AssertionError(f"子进程没有就绪（{line!r}）：{err}")
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, f"子进程失败（退出码 {proc.returncode}）：{err}"
            results.append(json.loads(out.strip().splitlines()[-1]))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_eight_threads_times_two_processes_claim_every_command_exactly_once(
    postgres_dsn: str, schema: str, worker_script: Path
) -> None:
    store = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        for i in range(40):
            store.create(snap(f"race-{i:02d}", bucket=i % 4))
        submitted = [
            store.submit_command(f"race-{i % 40:02d}", ("stop", "pause", "resume")[i % 3]).command_id
            for i in range(600)
        ]
    finally:
        store.close()

    worker = [str(worker_script), "claim", postgres_dsn, schema, "8", "120"]
    results = _run_together([worker, worker])

    errors = [e for r in results for e in r["errors"]]
    assert errors == []
    claimed = [c for r in results for c in r["claimed"]]
    counts = Counter(c["command_id"] for c in claimed)
    duplicated = {cid: n for cid, n in counts.items() if n > 1}
    assert duplicated == {}, f"租约有效期内同一条指令被投递了多次：{duplicated}"
    assert set(counts) == set(submitted), "有指令没被任何认领者取到"
    assert all(c["deliveries"] == 1 and c["completed"] for c in claimed)
    # 两个进程、十六个线程都真的参与了竞争（否则这个用例什么也没证明）。
    claimants = Counter(c["claimant"] for c in claimed)
    processes = {name.split("-")[0] for name in claimants}
    assert len(processes) == 2, f"只有一个进程取到了指令：{claimants}"
    assert len(claimants) >= 10, f"参与认领的线程太少：{claimants}"

    check = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        assert check.claim_commands("late", lease=60) == [], "全部完成的指令不应再被取到"
    finally:
        check.close()


def test_threads_in_one_process_share_the_pool_without_double_delivery(
    postgres_dsn: str, schema: str
) -> None:
    """同一进程内 8 个线程共用一个连接池（max_size 小于线程数，逼出借连接的等待）。"""
    store = PostgresTaskStore(postgres_dsn, schema=schema, max_size=3)
    try:
        store.create(snap("pool-race"))
        submitted = {store.submit_command("pool-race", "stop").command_id for _ in range(200)}
        seen: list[str] = []
        lock = threading.Lock()
        barrier = threading.Barrier(8)

        def run(index: int) -> None:
            barrier.wait()
            while True:
                batch = store.claim_commands(f"t{index}", lease=60, limit=2)
                if not batch:
                    return
                with lock:
                    seen.extend(c.command_id for c in batch)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sorted(seen) == sorted(submitted)
    finally:
        store.close()


def test_concurrent_first_connection_ddl_does_not_race(
    postgres_dsn: str, schema: str, worker_script: Path, admin: Any
) -> None:
    worker = [str(worker_script), "ddl", postgres_dsn, schema]
    results = _run_together([worker] * 5)
    assert [r for r in results if not r["ok"]] == []
    rows = admin.execute(f'SELECT version FROM "{schema}".schema_version').fetchall()
    assert rows == [(_schema.SCHEMA_VERSION,)]
    store = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        store.create(snap("after-race"))
        assert store.get("after-race") is not None
    finally:
        store.close()
