"""任务日志的"回执丢失的提交"（issue 18）：append_logs 在服务器上已经 COMMIT，客户端却只看到连接断了。

真实的私有 PostgreSQL + 真实的 TCP 故障代理（pg_proxy.PgFaultProxy，与 test_ambiguous_commit 同一套）：
代理认出"插入 task_logs"的那一批消息，放行它，再把同一连接上紧接着的 COMMIT 交给服务器、等它提交之后
切断连接（``at_commit=True``），回执一个字节也不放回。

判据（经公开 API：PostgresTaskStore / Controller；核对走另一条直连）：

* 存储层：丢回执的那一次确实已经提交（直连读得到），调用方原样重试同一批之后每行仍只有一份，序号连续，
  ``dropped`` 为 0。
* 运行时：Controller 的日志缓冲把结果未知的几批放回去重试；任务结束、收敛之后，两次尝试的每一行恰好一次、
  按产生的顺序。
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from reliability_support import report, wait_until

from chongming_task import Controller, FixedBackoff, RetryPolicy, open_store
from chongming_task.errors import StoreError
from chongming_task.storage import LogLine, LogStats, TaskStore
from chongming_task.testing.store_contract import snap

pytestmark = pytest.mark.postgres

PROXIED_OPTIONS: dict[str, Any] = {"connect_timeout": 2.0, "pool_timeout": 2.0, "statement_timeout": 2.0}
T0 = datetime(2026, 3, 1, 8, 0, 0, tzinfo=UTC)
# append_logs 的写入那一批：插入日志行、记水位线与裁剪（见 postgres/_logs.py）；之后的 COMMIT 单独一批。
LOG_INSERT = ("INSERT INTO", ".task_logs")


def messages(store: TaskStore, task_id: str) -> list[tuple[int, str]]:
    return [(line.seq, line.message) for line in store.read_logs(task_id)]


def test_store_retry_after_a_lost_commit_reply_keeps_each_line_once(
    proxied_schema: tuple[str, str], pg_proxy: Any, figures_dir: Path
) -> None:
    proxied_url, direct_url = proxied_schema
    store = open_store(proxied_url, **PROXIED_OPTIONS)
    verify = open_store(direct_url)
    try:
        store.create(snap("t"))
        batch = [
            LogLine(task_id="t", attempt=1, at=T0, level="INFO", message=f"m{n}", writer="w", writer_seq=n)
            for n in range(1, 6)
        ]
        pg_proxy.lose_reply(*LOG_INSERT, "m3", at_commit=True)
        with pytest.raises(StoreError):
            store.append_logs(batch)
        assert pg_proxy.lost_replies == 1, "代理没有吞掉那次回执：故障没有注入"
        committed = messages(verify, "t")
        store.append_logs(batch)  # 调用方只知道"结果未知"：原样重试
        store.append_logs(batch[2:])  # 再来一次部分重叠的
        figures = {"lost_replies": pg_proxy.lost_replies, "after_lost_reply": len(committed)}
        figures["after_retry"] = len(messages(verify, "t"))
        report(figures_dir, "log_lost_commit_reply", figures)
        assert committed == [(n, f"m{n}") for n in range(1, 6)], f"丢回执的那次其实已经提交：{figures}"
        assert messages(verify, "t") == committed, f"重试不能把行写第二遍：{figures}"
        assert verify.log_stats("t") == LogStats(kept=5, dropped=0, last_seq=5)
    finally:
        pg_proxy.heal()
        store.close()
        verify.close()


def test_controller_log_lines_survive_lost_commit_replies_exactly_once(
    proxied_schema: tuple[str, str], pg_proxy: Any, figures_dir: Path
) -> None:
    proxied_url, direct_url = proxied_schema
    verify = open_store(direct_url)
    controller = Controller(
        store=open_store(proxied_url, **PROXIED_OPTIONS), owner="node-a", side_channel_interval=0.05
    )

    def chatty(ctx: Any, lines: int) -> int:
        for i in range(1, lines + 1):
            ctx.log(f"第 {i} 行（尝试 {ctx.attempt}）")
            if i % 10 == 0:
                time.sleep(0.06)  # 让行分几批写：每一批都可能撞上丢回执
        if ctx.attempt == 1:
            raise RuntimeError("第一次故意失败")
        return lines

    controller.register("chatty", chatty, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0.05)))
    task_id = "chatty-lost-ack"
    want = [f"第 {i} 行（尝试 {a}）" for a in (1, 2) for i in range(1, 41)]
    try:
        pg_proxy.lose_reply(*LOG_INSERT, task_id, count=3, at_commit=True)
        run = controller.submit("chatty", 40, task_id=task_id)
        assert run.wait(timeout=30).ok
        lost = wait_until(lambda: pg_proxy.lost_replies == 3, 10)
        converged = wait_until(lambda: len(verify.read_logs(task_id)) >= len(want), 10)
        time.sleep(0.3)  # 再给后台循环几轮：若有重复，它们会在这里出现
        got = verify.read_logs(task_id)
        failures = [f for f in controller.persist_failures if f.operation.startswith("append_logs")]
        figures = {
            "lost_replies": pg_proxy.lost_replies,
            "append_logs_failures": len(failures),
            "lines_logged": len(want),
            "lines_stored": len(got),
            "distinct_stored": len({line.message for line in got}),
        }
        report(figures_dir, "log_lost_ack_controller", figures)
        assert lost, f"代理没有吞掉三次日志回执：{figures}"
        assert failures, f"结果未知的写应当如实记进 persist_failures：{figures}"
        assert converged, f"日志没有追平：{figures}"
        assert [line.message for line in got] == want, f"每行恰好一次、按产生的顺序：{figures}"
        assert [line.seq for line in got] == list(range(1, len(want) + 1))
        assert verify.log_stats(task_id).dropped == 0
    finally:
        pg_proxy.heal()
        controller.close(timeout=10, close_store=True)
        verify.close()
