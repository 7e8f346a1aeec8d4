"""LISTEN/NOTIFY：指令一提交，另一个存储实例（另一台机器上的控制器）立刻被叫醒。

时延的正式数字在 bench/bench_postgres_store.py 里；这里的上限故意放宽（远小于任何轮询间隔、
远大于正常的几毫秒），只证明"是通知叫醒的，不是碰巧轮询到的"，在繁忙的 CI 机器上也不会抖。
"""

from __future__ import annotations

import secrets
import statistics
import threading
import time
from typing import Any

import pytest

from chongming_task.errors import ConfigurationError, DuplicateTaskId
from chongming_task.storage import CommandAction
from chongming_task.stores.postgres import CommandNotice, PostgresTaskStore
from chongming_task.testing.contract.durable import durable
from chongming_task.testing.store_contract import snap

pytestmark = pytest.mark.postgres

WAKE_LIMIT = 1.0


def test_wait_for_commands_wakes_on_submit_from_another_store(postgres_dsn: str, schema: str) -> None:
    holder = PostgresTaskStore(postgres_dsn, schema=schema)
    console = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        holder.create(snap("n-1", bucket=5))
        assert holder.wait_for_commands(0.05) is False  # 建立监听；此时没有指令
        assert holder.listening
        latencies = []
        for _ in range(5):
            woke = threading.Event()
            stamps: dict[str, float] = {}

            def waiter(stamps: dict[str, float], woke: threading.Event) -> None:
                if holder.wait_for_commands(10):
                    stamps["woke"] = time.perf_counter()
                    woke.set()

            thread = threading.Thread(target=waiter, args=(stamps, woke))
            thread.start()
            time.sleep(0.05)  # 让等待者先睡下
            stamps["sent"] = time.perf_counter()
            console.submit_command("n-1", "stop", issuer="console")
            thread.join(10)
            assert woke.is_set(), "提交指令之后等待者没有被叫醒"
            latencies.append(stamps["woke"] - stamps["sent"])
        assert max(latencies) < WAKE_LIMIT, latencies
        print(f"NOTIFY 唤醒时延 p50={statistics.median(latencies) * 1000:.1f} ms")
        assert len(holder.claim_commands("holder", lease=30)) == 5
    finally:
        console.close()
        holder.close()


def test_notification_between_claim_and_wait_is_not_lost(postgres_dsn: str, schema: str) -> None:
    """按线程记账："取指令 → 等待"之间到达的通知会让下一次等待立刻返回。"""
    holder = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        holder.create(snap("n-2"))
        holder.wait_for_commands(0)  # 建立监听并设好本线程的基准
        holder.submit_command("n-2", "pause")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if holder.wait_for_commands(0.2):
                break
        else:
            raise AssertionError("通知一直没有到达")
        started = time.monotonic()
        assert holder.wait_for_commands(0.3) is False, "同一条通知不能叫醒同一个线程两次"
        assert time.monotonic() - started >= 0.25
    finally:
        holder.close()


def test_listen_callback_and_event_receive_notices(postgres_dsn: str, schema: str) -> None:
    holder = PostgresTaskStore(postgres_dsn, schema=schema)
    console = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        holder.create(snap("n-3", bucket=9))
        notices: list[CommandNotice | None] = []
        got = threading.Event()
        event = threading.Event()

        def on_notice(notice: CommandNotice | None) -> None:
            notices.append(notice)
            got.set()

        unsubscribe = holder.listen(on_notice)
        holder.listen(event)
        submitted = console.submit_command("n-3", CommandAction.RESUME)
        assert got.wait(WAKE_LIMIT * 5) and event.wait(WAKE_LIMIT * 5)
        assert notices == [CommandNotice(submitted.command_id, "n-3", CommandAction.RESUME, 9)]

        # 交还指令同样发通知：别的节点可以马上接手，而不是等轮询。
        (claimed,) = holder.claim_commands("wrong-node", lease=60)
        got.clear()
        assert holder.release_command(claimed.command_id, "wrong-node")
        assert got.wait(WAKE_LIMIT * 5)
        assert notices[-1] is not None and notices[-1].command_id == submitted.command_id

        unsubscribe()
        got.clear()
        event.clear()
        console.submit_command("n-3", "stop")
        assert event.wait(WAKE_LIMIT * 5)
        assert not got.is_set(), "取消订阅之后回调不应再被调用"
    finally:
        console.close()
        holder.close()


def test_a_failing_callback_does_not_kill_the_listener(postgres_dsn: str, schema: str) -> None:
    holder = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        holder.create(snap("n-4"))
        event = threading.Event()

        def broken(_: CommandNotice | None) -> None:
            raise RuntimeError("回调里的 bug")

        holder.listen(broken)
        holder.listen(event)
        for _ in range(2):
            event.clear()
            holder.submit_command("n-4", "stop")
            assert event.wait(WAKE_LIMIT * 5)
        with pytest.raises(ConfigurationError):
            holder.listen("not callable")  # type: ignore[arg-type]
    finally:
        holder.close()


def test_listener_reconnects_and_signals_a_possible_gap(postgres_dsn: str, schema: str, admin: Any) -> None:
    app = f"ct-listen-{secrets.token_hex(4)}"
    holder = PostgresTaskStore(postgres_dsn, schema=schema, application_name=app)
    try:
        holder.create(snap("n-5"))
        notices: list[CommandNotice | None] = []
        gap = threading.Event()
        arrived = threading.Event()

        def on_notice(notice: CommandNotice | None) -> None:
            notices.append(notice)
            (gap if notice is None else arrived).set()

        holder.listen(on_notice)
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
            [f"{app}:listen"],
        )
        assert gap.wait(10), "监听连接重连之后要发一次'可能漏了'（None）的唤醒"
        deadline = time.monotonic() + 5
        while not holder.listening and time.monotonic() < deadline:
            time.sleep(0.01)
        holder.submit_command("n-5", "stop")
        assert arrived.wait(WAKE_LIMIT * 5), "重连之后的通知没有送到"
    finally:
        holder.close()


def test_channel_is_per_schema(postgres_dsn: str, new_schema: Any) -> None:
    first, second = new_schema(), new_schema()
    a = PostgresTaskStore(postgres_dsn, schema=first)
    b = PostgresTaskStore(postgres_dsn, schema=second)
    try:
        assert a.channel != b.channel
        a.create(snap("only-a"))
        b.wait_for_commands(0)
        a.submit_command("only-a", "stop")
        assert b.wait_for_commands(0.3) is False, "别的 schema 的指令不应叫醒本 schema 的监听者"
    finally:
        a.close()
        b.close()


def test_close_stops_the_listener_promptly(postgres_dsn: str, schema: str) -> None:
    holder = PostgresTaskStore(postgres_dsn, schema=schema)
    holder.listen(threading.Event())
    started = time.monotonic()
    holder.close()
    assert time.monotonic() - started < 2
    assert not holder.listening


def test_claimable_create_notifies_once_per_transaction_and_not_for_a_duplicate(
    postgres_dsn: str, schema: str
) -> None:
    """待认领的持久任务：单个 create 的通知并在建任务的语句里（重复 id 没插入就不通知）；
    create_many / write_many 一批只通知一次，不是每行一次。通知只是"快来看"：worker 收到后去 claim_queued。"""
    worker = PostgresTaskStore(postgres_dsn, schema=schema)
    submitter = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        notices: list[CommandNotice | None] = []
        got = threading.Event()

        def on_notice(notice: CommandNotice | None) -> None:
            notices.append(notice)
            got.set()

        worker.listen(on_notice)
        time.sleep(0.3)  # 监听（重新）建立时的"可能漏了"唤醒先过去
        notices.clear()
        got.clear()

        submitter.create(durable("q-1"))
        assert got.wait(WAKE_LIMIT * 5), "建了待认领的持久任务，worker 没有被叫醒"
        time.sleep(0.3)
        assert len(notices) == 1, notices

        with pytest.raises(DuplicateTaskId):
            submitter.create(durable("q-1"))
        time.sleep(0.5)
        assert len(notices) == 1, "重复 id 什么也没插入，不应通知"

        results = submitter.create_many([(durable(f"q-batch-{i}", seconds=i), ()) for i in range(5)])
        assert results == [None] * 5
        deadline = time.monotonic() + WAKE_LIMIT * 5
        while len(notices) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)
        assert len(notices) == 2, f"一批 5 个待认领任务应只通知一次，收到 {len(notices) - 1} 次"

        # 组提交的混合批（write_many）同 create_many：提交之后一批只通知一次；只有重复 id 的一批不通知。
        created, saved = submitter.write_many(
            [(durable("q-mixed-0"), ()), (durable("q-mixed-1", seconds=1), ()), (durable("q-1"), ())], []
        )
        assert created[:2] == [None, None] and isinstance(created[2], DuplicateTaskId) and saved == []
        deadline = time.monotonic() + WAKE_LIMIT * 5
        while len(notices) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)
        assert len(notices) == 3, f"混合批里 2 个新的待认领任务应只通知一次，收到 {len(notices) - 2} 次"
        created, _ = submitter.write_many([(durable("q-1"), ())], [])
        assert isinstance(created[0], DuplicateTaskId)
        time.sleep(0.5)
        assert len(notices) == 3, "重复 id 什么也没插入，不应通知"

        submitter.create(snap("held-1"))  # 普通任务（没有配方）不通知
        time.sleep(0.5)
        assert len(notices) == 3
    finally:
        submitter.close()
        worker.close()


def test_a_closed_controller_that_listened_is_freed_without_the_cycle_collector(
    postgres_dsn: str, schema: str
) -> None:
    """订阅了指令通知的控制器关掉、丢掉之后，控制器与存储都由引用计数当场释放：链接存着的取消订阅函数引用着
    回调，回调若是链接自己的绑定方法，链接连同写穿与存储就成了只有循环 GC 才收得走的环。"""
    import gc
    import weakref

    from chongming_task import Controller

    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        store = PostgresTaskStore(postgres_dsn, schema=schema)
        controller = Controller(max_parallel=2, store=store)
        controller.register("noop", lambda ctx: None)
        for _ in range(20):
            controller.submit("noop")
        assert all(outcome.ok for outcome in controller.wait_all(timeout=30))
        assert store.listening, "控制器持有任务时订阅了指令通知（这条用例要证明的正是这条路径）"
        freed = weakref.ref(controller), weakref.ref(store)
        controller.close(close_store=True)
        del controller, store
        deadline = time.monotonic() + 5
        while any(ref() is not None for ref in freed) and time.monotonic() < deadline:
            time.sleep(0.05)  # 载体线程放开最后一次尝试、后台线程退出
        assert [ref() for ref in freed] == [None, None], "关掉的控制器或它的存储还在某个环里"
    finally:
        if was_enabled:
            gc.enable()
