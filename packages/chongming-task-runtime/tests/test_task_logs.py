"""任务日志持久化（issue 18；用户指南 §15）：存储后端的 Controller 把 ctx.log 的行写进存储。"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from chongming_runtime_test_tasks import chatty

from chongming_task import Controller, FixedBackoff, RetryPolicy
from chongming_task.errors import StoreError
from chongming_task.runtime.executors import ProcessExecutor
from chongming_task.stores.memory import InMemoryTaskStore


def test_every_line_is_in_the_store_when_wait_returns() -> None:
    store = InMemoryTaskStore()
    # 旁路间隔拉长：行能及时落库靠的是"尝试结束、落终态之前 flush"，而不是后台循环碰巧先到。
    with Controller(store=store, side_channel_interval=60.0) as controller:
        controller.register("chatty", chatty)
        assert controller.submit("chatty", 50, task_id="t").wait(timeout=10).ok
        lines = store.read_logs("t")
    assert [line.message for line in lines] == [f"第 {i} 行（尝试 1）" for i in range(1, 51)]
    assert [line.seq for line in lines] == list(range(1, 51))
    assert {line.level for line in lines} == {"INFO"}
    assert all(line.attempt == 1 for line in lines)


def test_lines_of_every_attempt_are_kept_and_readable_by_attempt() -> None:
    store = InMemoryTaskStore()
    with Controller(store=store) as controller:
        controller.register("chatty", chatty, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0.01)))
        assert controller.submit("chatty", 3, True, task_id="t").wait(timeout=10).ok
    assert [line.message for line in store.read_logs("t", attempt=2)] == [
        f"第 {i} 行（尝试 2）" for i in range(1, 4)
    ]
    assert len(store.read_logs("t")) == 6


def test_persist_logs_false_keeps_logs_in_memory_only() -> None:
    store = InMemoryTaskStore()
    with Controller(store=store, persist_logs=False) as controller:
        controller.register("chatty", chatty)
        handle = controller.submit("chatty", 3, task_id="t")
        assert handle.wait(timeout=10).ok
        assert len(handle.logs) == 3, "ctx.logs 照旧在内存里"
    assert store.read_logs("t") == []


def test_persist_logs_must_be_a_bool() -> None:
    from chongming_task.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="persist_logs"):
        Controller(persist_logs="yes")  # type: ignore[arg-type]


def test_process_executor_lines_are_persisted() -> None:
    store = InMemoryTaskStore()
    with Controller(store=store, executor=ProcessExecutor()) as controller:
        controller.register("chatty", chatty)
        assert controller.submit("chatty", 5, task_id="t").wait(timeout=30).ok
    assert [line.seq for line in store.read_logs("t")] == [1, 2, 3, 4, 5]


class FlakyLogStore(InMemoryTaskStore):
    def __init__(self) -> None:
        super().__init__()
        self.fail = True
        self.calls = 0

    def append_logs(self, lines: Any) -> None:
        self.calls += 1
        if self.fail:
            raise StoreError("日志写不进去")
        super().append_logs(lines)


def test_store_failure_never_fails_the_task_and_lines_arrive_after_recovery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = FlakyLogStore()
    with (
        caplog.at_level(logging.WARNING, logger="chongming_task"),
        Controller(store=store, side_channel_interval=0.05) as controller,
    ):
        controller.register("chatty", chatty)
        assert controller.submit("chatty", 4, task_id="t").wait(timeout=10).ok
        failures = controller.persist_failures
        assert any(f.operation.startswith("append_logs") for f in failures)
        assert store.read_logs("t") == []
        store.fail = False
        # 下一次旁路回写把积压的行补上，顺序不变、一行不重。
        import time

        deadline = time.monotonic() + 10
        while len(store.read_logs("t")) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
    assert [line.message for line in store.read_logs("t")] == [f"第 {i} 行（尝试 1）" for i in range(1, 5)]
    assert "写存储失败（任务照常运行" in caplog.text  # 限流的故障日志（OutageLog）的首行


def test_nul_and_lone_surrogates_are_escaped_not_dropped() -> None:
    store = InMemoryTaskStore()

    def weird(ctx: Any) -> None:
        ctx.log("含 NUL\x00 与 \ud800")

    with Controller(store=store) as controller:
        controller.register("weird", weird)
        assert controller.submit("weird", task_id="t").wait(timeout=10).ok
        assert not controller.persist_failures
    (line,) = store.read_logs("t")
    assert line.message == "含 NUL\\x00 与 \\ud800"


class CommitThenLoseReply(InMemoryTaskStore):
    """append_logs 真的写进去了，调用方却收到异常：Postgres 的 COMMIT 回执丢了、客户端超时时就是这样。"""

    def __init__(self, lose: int) -> None:
        super().__init__()
        self.lose = lose
        self.calls = 0

    def append_logs(self, lines: Any) -> None:
        self.calls += 1
        super().append_logs(lines)
        if self.lose > 0:
            self.lose -= 1
            raise StoreError("连接在语句中途断了：结果未知")


def test_retry_after_a_lost_acknowledgement_writes_every_line_exactly_once() -> None:
    store = CommitThenLoseReply(lose=3)
    with Controller(store=store, side_channel_interval=0.02) as controller:
        controller.register("chatty", chatty, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0.01)))
        assert controller.submit("chatty", 20, True, task_id="t").wait(timeout=10).ok
        assert sum(f.operation.startswith("append_logs") for f in controller.persist_failures) >= 1
        # 后台旁路循环重试放回缓冲的那几批；等到不再丢回执、两次尝试的 40 行都已落库（多了就是重复）。
        deadline = time.monotonic() + 10
        while (store.lose or len(store.read_logs("t")) < 40) and time.monotonic() < deadline:
            time.sleep(0.02)
    lines = store.read_logs("t")
    want = [f"第 {i} 行（尝试 1）" for i in range(1, 21)] + [f"第 {i} 行（尝试 2）" for i in range(1, 21)]
    assert [line.message for line in lines] == want, "每行恰好一次、按产生的顺序"
    assert [line.seq for line in lines] == list(range(1, 41))
    assert store.log_stats("t").dropped == 0, "重复的行不算丢弃"


def varied_lines(ctx: Any) -> None:
    ctx.log("plain ascii")
    ctx.log("中文一行")
    ctx.log("x" * 5000)  # 超过 4 KB：截断并带标记
    ctx.log("长" * 1400)  # 1,400 字 = 4,200 字节：按字节截断
    ctx.log("a\x00b")  # NUL 存不下：转义成可见文本
    ctx.log("bad \ud800 surrogate")  # 孤立代理项编码不成 UTF-8：转义
    ctx.log("自定义级别", level=25)  # 级别名 "Level 25"


def test_stored_lines_are_what_the_validating_constructor_builds() -> None:
    # 日志缓冲对常见的行跳过 LogLine 的逐字段校验（快路径）：存下的每一行都必须与走构造函数校验、截断的
    # 那一行完全相同，长行、NUL、代理项、自定义级别都走到各自该走的那条路。
    from chongming_task.storage import LOG_TRUNCATED_MARKER, MAX_LOG_MESSAGE_BYTES, LogLine

    store = InMemoryTaskStore()
    with Controller(store=store) as controller:
        controller.register("varied", varied_lines)
        handle = controller.submit("varied", task_id="t")
        assert handle.wait(timeout=10).ok
        entries = handle.logs
    lines = store.read_logs("t")
    assert len(lines) == len(entries) == 7
    for line, entry in zip(lines, entries, strict=True):
        message = entry.message.replace("\x00", "\\x00")
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        expected = LogLine(
            task_id="t", attempt=entry.attempt, at=entry.at, level=entry.level_name[:16], message=message
        )
        assert (line.message, line.truncated, line.level, line.at, line.attempt) == (
            expected.message,
            expected.truncated,
            expected.level,
            expected.at,
            expected.attempt,
        )
    assert [line.truncated for line in lines] == [False, False, True, True, False, False, False]
    assert lines[2].message.endswith(LOG_TRUNCATED_MARKER)
    assert all(len(line.message.encode("utf-8")) <= MAX_LOG_MESSAGE_BYTES for line in lines)
    assert lines[4].message == "a\\x00b"
    assert lines[5].message == "bad \\ud800 surrogate"
    assert lines[6].level == "Level 25"


class CountingLogStore(InMemoryTaskStore):
    def __init__(self) -> None:
        super().__init__()
        self.append_calls = 0

    def append_logs(self, lines: Any) -> None:
        self.append_calls += 1
        super().append_logs(lines)


def test_a_task_that_logs_nothing_costs_no_store_call() -> None:
    # 落终态之前的 flush 只在缓冲里真有行时才写：不写日志的任务（绝大多数）不为日志多一次存储调用。
    store = CountingLogStore()
    with Controller(store=store, max_parallel=2, side_channel_interval=0.01) as controller:
        controller.register("quiet", lambda ctx: 1)
        controller.register("chatty", chatty)
        for _ in range(20):
            controller.submit("quiet")
        controller.wait_all(timeout=10)
        time.sleep(0.05)  # 旁路节拍也转过几轮：空缓冲的 flush 同样不调存储
        assert store.append_calls == 0
        assert controller.submit("chatty", 2, task_id="t").wait(timeout=10).ok
    assert store.append_calls >= 1
    assert [line.message for line in store.read_logs("t")] == ["第 1 行（尝试 1）", "第 2 行（尝试 1）"]
