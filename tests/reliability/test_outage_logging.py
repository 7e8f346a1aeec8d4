"""存储故障期间的日志洪水（issue 22 第 13 条）：旧实现每个任务、每一轮后台循环打一行警告
（磁盘写满 25 秒 13.9 万行）。要求：每个时间间隔一行带计数的汇总，不是每任务每轮一行。

两种真实故障：SQLite 所在的 tmpfs 写满（挂不上 tmpfs 时改用另一条连接 BEGIN EXCLUSIVE 占库），
以及 Postgres 经 TCP 代理被切断（拒绝连接）。判据：故障期间 chongming_task 的 WARNING 行数
≤ 故障秒数 / 汇总间隔 + 4（首行立即出现，之后每个间隔至多一行汇总，恢复时补打一行），
且至少有一行（故障不静默），汇总行里带计数；persist_failures 照常记录。
"""

from __future__ import annotations

import contextlib
import logging
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from reliability_support import report
from test_store_outages import fill, tiny_tmpfs

from chongming_task import Controller, SqliteTaskStore, TaskStatus, open_store
from chongming_task.errors import StoreError

S = TaskStatus
OUTAGE_SECONDS = 3.0
TASKS = 30
# 汇总间隔（docs/distributed.md "存储故障期间的日志"）：故障期间每 5 秒至多一行汇总。
SUMMARY_INTERVAL = 5.0


def flood_workload(
    controller: Controller,
    inject: Callable[[], None],
    recover: Callable[[], None],
    caplog: pytest.LogCaptureFixture,
) -> dict[str, Any]:
    gate = threading.Event()

    def work(ctx: Any, n: int) -> int:
        i = 0
        while not gate.is_set():
            ctx.checkpoint()
            i += 1
            ctx.progress(i)
            time.sleep(0.01)
        return n

    controller.register("work", work)
    runs = [controller.submit("work", i, task_id=f"flood-{i}") for i in range(TASKS)]
    deadline = time.monotonic() + 15
    while not all(r.status is S.RUNNING for r in runs):
        assert time.monotonic() < deadline, "故障前任务没有全部开始运行"
        time.sleep(0.02)
    time.sleep(0.3)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="chongming_task"):
        inject()
        started = time.monotonic()
        # 故障期间：新提交被拒绝（首次落库必须成功，任务体才会执行，issue 16.6；拒绝不刷日志）、
        # 停几个（save 失败 → 落后），让每一轮都有很多任务要追写。
        for i in range(10):
            with pytest.raises(StoreError, match="已拒绝提交"):
                controller.submit("work", 100 + i, task_id=f"flood-late-{i}")
        for i in range(5):
            controller.stop(f"flood-{i}", reason="故障期间停止")
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - started)))
        seconds = time.monotonic() - started
        recover()
        # 恢复后的第一次成功写会补打未汇总的那部分（带计数）：把它也算进来。
        time.sleep(1.0)
        records = [
            r for r in caplog.records if r.name.startswith("chongming_task") and r.levelno >= logging.WARNING
        ]
    gate.set()
    controller.wait_all(timeout=30)
    lines = [r.getMessage() for r in records]
    return {
        "outage_seconds": round(seconds, 2),
        "tasks": len(runs),
        "warning_lines": len(lines),
        "warnings_per_second": round(len(lines) / seconds, 1),
        "samples": [line[:200] for line in lines[:3]],
        "persist_failures": len(controller.persist_failures),
        "lines": lines,
    }


def check(figures: dict[str, Any]) -> None:
    lines = figures.pop("lines")
    # 每个间隔一行汇总，加上每次故障至多四行一次性的：首次失败、恢复时补打的汇总、租约过期、指令监听中断。
    bound = int(figures["outage_seconds"] / SUMMARY_INTERVAL) + 4
    assert lines, "存储故障期间必须有警告（不静默）"
    assert len(lines) <= bound, f"故障期间 {len(lines)} 行警告，超过汇总的上限 {bound}：{figures}"
    assert any(re.search(r"\d+ 次", line) for line in lines), f"汇总行里要有计数：{figures['samples']}"
    assert figures["persist_failures"] > 0


@contextlib.contextmanager
def sqlite_outage(
    tmp_path: Path,
) -> Iterator[tuple[SqliteTaskStore, Callable[[], None], Callable[[], None], str]]:
    with tiny_tmpfs(tmp_path, "8m") as mount:
        if mount is not None:
            store = SqliteTaskStore(mount / "tasks.db", busy_timeout=0.5)
            filler = mount / "filler.bin"

            def inject() -> None:
                fill(filler)

            def recover() -> None:
                filler.unlink(missing_ok=True)

            try:
                yield store, inject, recover, "tmpfs 写满（SQLITE_FULL）"
            finally:
                recover()
            return
        db = tmp_path / "tasks.db"
        store = SqliteTaskStore(db, busy_timeout=0.01)
        holder = sqlite3.connect(db, isolation_level=None, timeout=10, check_same_thread=False)

        def inject_lock() -> None:
            holder.execute("BEGIN EXCLUSIVE")

        def recover_lock() -> None:
            if holder.in_transaction:
                holder.execute("ROLLBACK")

        try:
            yield store, inject_lock, recover_lock, "另一条连接 BEGIN EXCLUSIVE 占库（busy_timeout=0.01）"
        finally:
            recover_lock()
            holder.close()


@pytest.mark.slow
def test_sqlite_outage_logs_one_summary_per_interval(
    tmp_path: Path, figures_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with sqlite_outage(tmp_path) as (store, inject, recover, mode):
        controller = Controller(store=store, owner="flood", side_channel_interval=0.05, lease_ttl=3.0)
        try:
            figures = flood_workload(controller, inject, recover, caplog)
        finally:
            controller.close(timeout=10, close_store=True)
    figures["mode"] = mode
    report(figures_dir, "outage_log_flood_sqlite", {k: v for k, v in figures.items() if k != "lines"})
    check(figures)


@pytest.mark.slow
@pytest.mark.postgres
def test_postgres_outage_logs_one_summary_per_interval(
    proxied_schema: tuple[str, str], pg_proxy: Any, figures_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proxied_url, _direct = proxied_schema
    store = open_store(proxied_url, connect_timeout=2.0, pool_timeout=0.2, statement_timeout=1.0)
    controller = Controller(store=store, owner="flood", side_channel_interval=0.05, lease_ttl=3.0)

    def inject() -> None:
        pg_proxy.refuse()
        pg_proxy.cut_all()

    try:
        figures = flood_workload(controller, inject, pg_proxy.heal, caplog)
    finally:
        pg_proxy.heal()
        controller.close(timeout=10, close_store=True)
    figures["mode"] = "代理拒绝连接并切断现有连接"
    report(figures_dir, "outage_log_flood_postgres", {k: v for k, v in figures.items() if k != "lines"})
    check(figures)
