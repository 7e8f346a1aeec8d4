"""存储故障：运行中的存储突然不可用，然后恢复。

* Postgres：反复 ``pg_terminate_backend`` 掉本存储的所有连接；再用另一条连接 ``LOCK TABLE ... ACCESS
  EXCLUSIVE`` 占住任务表 2 秒（模拟"库还在、但谁也写不进去"）。不重启共享的 PostgreSQL 服务器——
  它同时被其他工程师使用，终止连接与表锁足以让每一次写都失败。
* SQLite：把数据库放在一个 4 MB 的 tmpfs 上，再用填充文件把它写满（真实的 SQLITE_FULL）；tmpfs 挂不上
  （没有 root / CAP_SYS_ADMIN）时改用第二种：另一条连接 ``BEGIN EXCLUSIVE`` 占住整个库 2 秒，
  存储的 busy_timeout 设得很短，写入在超时后以 StoreError 失败。两种都是真实的 sqlite3 错误，不是打桩。

判据：任务照常推进（内存里的进度在故障期间仍在增长）并正常落终态；``persist_failures`` 记下了故障；
恢复后存储收敛到与内存完全一致（状态、版本、整段历史）；整个过程有界——每个等待都有超时，
工作负载跑在看门线程里，超时就打印全部线程栈并判失败，而不是把 CI 挂住。
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from reliability_support import report

from chongming_task import Controller, SqliteTaskStore, TaskStatus, open_store
from chongming_task.errors import StoreError
from chongming_task.storage import TaskStore

S = TaskStatus
BOUND_SECONDS = 120.0


def bounded(fn: Callable[[], dict[str, Any]], seconds: float = BOUND_SECONDS) -> dict[str, Any]:
    """在看门线程里跑；超时说明有东西卡死了：打印全部线程栈并判失败。"""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # 原样交回主线程
            box["error"] = exc

    thread = threading.Thread(target=target, name="outage-workload", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        stacks = "\n".join(
            f"--- {tid}\n{''.join(traceback.format_stack(frame))}"
            for tid, frame in sys._current_frames().items()
        )
        pytest.fail(f"工作负载 {seconds} 秒没有结束（疑似死锁）。线程栈：\n{stacks}")
    if "error" in box:
        raise box["error"]
    return box["result"]  # type: ignore[no-any-return]


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{timeout} 秒内没有等到：{what}")
        time.sleep(0.02)


def converged(controller: Controller, store: TaskStore) -> bool:
    for run in controller.runs():
        stored = store.get(run.task_id)
        if stored is None or stored.status_version != run.snapshot.status_version:
            return False
        if stored.status is not run.status or store.history(run.task_id) != list(run.transitions):
            return False
    return True


def outage_workload(
    controller: Controller,
    verify_store: TaskStore,
    inject: Callable[[], None],
    recover: Callable[[], None],
    outage_seconds: float,
) -> dict[str, Any]:
    """在跑的任务 + 故障期间的提交/停止/暂停/恢复 + 故障结束后的收敛。"""
    gate = threading.Event()

    def work(ctx: Any, n: int) -> dict[str, int]:
        i = 0
        while not gate.is_set():
            ctx.checkpoint()
            i += 1
            ctx.progress(i, unit="步")
            time.sleep(0.005)
        return {"n": n, "steps": i}

    controller.register("work", work)
    runs = [controller.submit("work", i, task_id=f"before-{i}") for i in range(6)]
    wait_until(lambda: all(r.status is S.RUNNING for r in runs), 15, "故障前全部任务开始运行")
    wait_until(lambda: converged(controller, verify_store), 15, "故障前存储追平")

    inject()
    outage_started = time.monotonic()
    progress_at_start = {r.task_id: r.snapshot.progress.done if r.snapshot.progress else 0 for r in runs}
    # 故障期间的提交：首次落库必须成功任务才会执行（issue 16.6）。写不进去就抛 StoreError、任务不存在于
    # 控制器里；恰好写进去了（连接池已重连）就照常运行到底。两种都不许"跑了却在存储里看不见"。
    during, refused = [], []
    for i in range(3):
        try:
            during.append(controller.submit("work", 100 + i, task_id=f"during-{i}"))
        except StoreError as exc:
            assert "已拒绝提交" in str(exc)
            refused.append(f"during-{i}")
    assert not {r.task_id for r in controller.runs()} & set(refused), "被拒绝的提交不能留下在跑的任务"
    assert controller.stop("before-0", reason="故障期间停止") is True
    paused = controller.pause("before-1", timeout=5)
    time.sleep(max(0.0, outage_seconds - (time.monotonic() - outage_started)) / 2)
    if paused:
        controller.resume("before-1")
    time.sleep(max(0.0, outage_seconds - (time.monotonic() - outage_started)))
    moved = {
        r.task_id
        for r in runs[2:]
        if r.snapshot.progress is not None and r.snapshot.progress.done > progress_at_start[r.task_id]
    }
    assert moved == {r.task_id for r in runs[2:]}, "故障期间任务必须照常推进"
    failures = controller.persist_failures
    assert failures, "存储故障必须记进 persist_failures，而不是静默"
    outage_seconds_real = time.monotonic() - outage_started

    recover()
    recovered_at = time.monotonic()
    gate.set()
    controller.wait_all(timeout=30)
    assert runs[0].status is S.STOPPED
    others = [r for r in controller.runs() if r.task_id != "before-0"]
    assert all(r.status is S.SUCCEEDED for r in others), [(r.task_id, r.status) for r in others]
    wait_until(lambda: converged(controller, verify_store), 30, "恢复后存储与内存一致")
    convergence = time.monotonic() - recovered_at
    return {
        "tasks": len(runs) + len(during),
        "outage_seconds": round(outage_seconds_real, 2),
        "persist_failures": len(failures),
        "failure_ops": sorted({f.operation for f in failures}),
        "sample_error": failures[-1].error[:200],
        "pause_confirmed_during_outage": paused,
        "submits_refused_during_outage": len(refused),
        "seconds_to_converge_after_recovery": round(convergence, 2),
    }


# -- Postgres ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_backend_termination_and_locked_table(
    pg_url: str, postgres_dsn: str, figures_dir: Path
) -> None:
    psycopg = pytest.importorskip("psycopg")
    app = f"ct-outage-{uuid.uuid4().hex[:8]}"
    schema = pg_url.rsplit("schema=", 1)[1]
    # statement_timeout 让被表锁挡住的写在 0.4 秒后失败，而不是一直等下去（见报告：存储自己没有默认上限）。
    url = f"{pg_url}&options=-cstatement_timeout%3D400"
    store = open_store(url, application_name=app, pool_timeout=2.0)
    verify = open_store(pg_url)
    controller = Controller(store=store, owner="outage-node", side_channel_interval=0.05, lease_ttl=3.0)
    admin = psycopg.connect(postgres_dsn, autocommit=True)
    stop_killing = threading.Event()
    killed = [0]
    locker: list[Any] = []

    def terminate_loop() -> None:
        while not stop_killing.wait(0.1):
            rows = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name LIKE %s AND pid <> pg_backend_pid()",
                (app + "%",),
            ).fetchall()
            killed[0] += sum(1 for (ok,) in rows if ok)

    killer = threading.Thread(target=terminate_loop, daemon=True)

    def inject() -> None:
        killer.start()
        time.sleep(1.0)  # 先反复断连接……
        conn = psycopg.connect(postgres_dsn)  # ……再加上一个谁也写不进的任务表
        conn.execute(f'LOCK TABLE "{schema}".tasks IN ACCESS EXCLUSIVE MODE')
        locker.append(conn)

    def recover() -> None:
        stop_killing.set()
        killer.join(timeout=5)
        for conn in locker:
            conn.rollback()
            conn.close()
        locker.clear()

    try:
        figures = bounded(lambda: outage_workload(controller, verify, inject, recover, outage_seconds=3.0))
    finally:
        recover()
        controller.close(timeout=10)
        store.close()
        verify.close()
        admin.close()
    figures["backends_terminated"] = killed[0]
    assert killed[0] > 0
    report(figures_dir, "outage_postgres", figures)


# -- SQLite -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def tiny_tmpfs(where: Path, size: str) -> Iterator[Path | None]:
    """挂一个小 tmpfs；挂不上（非 root、容器没有 CAP_SYS_ADMIN）时交回 None。无论如何都卸载。"""
    mount_point = where / "tmpfs"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        yield None
        return
    try:
        yield mount_point
    finally:
        for _ in range(50):
            if subprocess.run(["umount", str(mount_point)], capture_output=True, check=False).returncode == 0:
                break
            time.sleep(0.1)
        else:
            # 5 秒后仍忙（还有打开的文件）：惰性卸载，最后一个文件关掉时内核再卸。否则挂载点留在 pytest 的
            # 临时目录里，之后每次清理旧目录都告警（设备忙），挂载越积越多。
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, check=False)


def fill(path: Path) -> None:
    """把文件系统写满（ENOSPC 为止）。"""
    chunk = b"\0" * 65536
    with open(path, "wb") as handle:
        with contextlib.suppress(OSError):
            while True:
                handle.write(chunk)
                handle.flush()
        with contextlib.suppress(OSError):
            os.fsync(handle.fileno())


@pytest.mark.slow
def test_sqlite_disk_full_on_tmpfs(tmp_path: Path, figures_dir: Path) -> None:
    with tiny_tmpfs(tmp_path, "4m") as mount:
        if mount is None:
            # 没有 mount 权限的环境：这一种故障做不出来；占库的那一种（下一个用例）照常覆盖 persist_failures。
            print("[reliability] tmpfs 挂不上，跳过磁盘写满变体（占库变体仍然运行）")
            return
        db = mount / "tasks.db"
        store = SqliteTaskStore(db, busy_timeout=2.0)
        verify = SqliteTaskStore(db, busy_timeout=5.0)
        controller = Controller(store=store, owner="disk-full", side_channel_interval=0.05, lease_ttl=3.0)
        filler = mount / "filler.bin"

        def inject() -> None:
            fill(filler)

        def recover() -> None:
            with contextlib.suppress(FileNotFoundError):
                filler.unlink()

        try:
            figures = bounded(
                lambda: outage_workload(controller, verify, inject, recover, outage_seconds=2.0)
            )
        finally:
            recover()
            controller.close(timeout=10)
            store.close()
            verify.close()
        figures["mode"] = "tmpfs 4 MB 写满（SQLITE_FULL）"
        assert any("满" in f or "full" in f.lower() for f in [figures["sample_error"]]), figures
        report(figures_dir, "outage_sqlite_disk_full", figures)


@pytest.mark.slow
def test_sqlite_database_held_exclusively_by_another_connection(tmp_path: Path, figures_dir: Path) -> None:
    import sqlite3

    db = tmp_path / "tasks.db"
    store = SqliteTaskStore(db, busy_timeout=0.3)
    verify = SqliteTaskStore(db, busy_timeout=10.0)
    controller = Controller(store=store, owner="locked-out", side_channel_interval=0.05, lease_ttl=3.0)
    holder = sqlite3.connect(db, isolation_level=None, timeout=10, check_same_thread=False)

    def inject() -> None:
        holder.execute("BEGIN EXCLUSIVE")

    def recover() -> None:
        if holder.in_transaction:
            holder.execute("ROLLBACK")

    try:
        figures = bounded(lambda: outage_workload(controller, verify, inject, recover, outage_seconds=2.0))
    finally:
        recover()
        holder.close()
        controller.close(timeout=10)
        store.close()
        verify.close()
    figures["mode"] = "另一条连接 BEGIN EXCLUSIVE 占库 2 秒，busy_timeout=0.3"
    # "database is locked" 不原样漏出：包装成 StoreError，并用中文说明该查什么。
    assert figures["sample_error"].startswith("StoreError") and "被其他连接锁定" in figures["sample_error"]
    report(figures_dir, "outage_sqlite_locked", figures)
