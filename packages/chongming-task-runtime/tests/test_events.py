"""公开事件钩子（用户指南 §15.1）：Controller(listeners=[...]) / add_listener，全部经公开 API 验证。"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from chongming_task import ConfigurationError, Controller, FailureKind, FixedBackoff, RetryPolicy, TaskStatus
from chongming_task.events import ProgressEvent, StoreErrorEvent, TransitionEvent
from chongming_task.stores.memory import InMemoryTaskStore

S = TaskStatus


class Recorder:
    def __init__(self) -> None:
        self.events: list[Any] = []
        self.lock = threading.Lock()

    def __call__(self, event: Any) -> None:
        with self.lock:
            self.events.append(event)

    def transitions(self, task_id: str) -> list[TransitionEvent]:
        return [e for e in self.events if isinstance(e, TransitionEvent) and e.task_id == task_id]


def counting(ctx: Any, n: int) -> int:
    for i in range(n):
        ctx.progress(i + 1, total=n)
        ctx.checkpoint()
    return n


def boom(ctx: Any) -> None:
    raise ValueError("坏输入")


def test_every_transition_arrives_in_version_order_with_the_documented_fields() -> None:
    recorder = Recorder()
    with Controller(max_parallel=2, listeners=[recorder]) as controller:
        controller.register("counting", counting)
        run = controller.submit("counting", 3, task_id="t-ok")
        assert run.wait(timeout=10).ok
        assert controller.flush_events(timeout=5)
        events = recorder.transitions("t-ok")
    history = run.transitions
    # 和任务自己的迁移历史一一对应：从 pending → queued 起，一条不少、一条不多、按版本顺序。
    assert [(e.from_status, e.to_status, e.trigger, e.version) for e in events] == [
        (t.from_status, t.to_status, t.trigger, t.version) for t in history
    ]
    assert events[0].from_status is S.PENDING and events[0].to_status is S.QUEUED
    assert events[-1].to_status is S.SUCCEEDED
    last = events[-1]
    assert last.name == "counting" and last.attempt == 1 and last.failure_kind is None
    assert last.at == history[-1].at and last.snapshot.status is S.SUCCEEDED
    with pytest.raises(dataclasses.FrozenInstanceError):
        last.task_id = "x"  # type: ignore[misc]
    progress = [e for e in recorder.events if isinstance(e, ProgressEvent)]
    assert [p.progress.done for p in progress] == [1, 2, 3]
    assert all(p.task_id == "t-ok" and p.attempt == 1 and p.name == "counting" for p in progress)


def test_failure_kind_and_attempt_on_retries() -> None:
    recorder = Recorder()
    with Controller(listeners=[recorder]) as controller:
        controller.register("boom", boom, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0.01)))
        assert not controller.submit("boom", task_id="t-bad").wait(timeout=10).ok
        controller.flush_events(timeout=5)
        events = recorder.transitions("t-bad")
    retry_wait = [e for e in events if e.to_status is S.RETRY_WAIT]
    assert [e.attempt for e in retry_wait] == [1]
    assert retry_wait[0].failure_kind is FailureKind.EXCEPTION
    assert events[-1].to_status is S.FAILED and events[-1].attempt == 2
    assert events[-1].failure_kind is FailureKind.EXCEPTION
    # 失败分类只挂在失败类迁移上，不会被带到后面的 queued / starting 上
    assert all(e.failure_kind is None for e in events if e.to_status in (S.QUEUED, S.STARTING, S.RUNNING))


def test_listener_is_never_called_under_a_task_lock_and_may_call_back_into_the_controller() -> None:
    seen: list[tuple[str, TaskStatus | None]] = []
    threads: set[str] = set()
    controller = Controller(max_parallel=1)
    gate = threading.Event()

    def gated(ctx: Any) -> str:
        while not gate.wait(0.002):
            ctx.checkpoint()
        return "a"

    def reentrant(event: Any) -> None:
        # 在任务锁内调用的话，这里去读别的任务、停别的任务都可能死锁；交付线程里随便调。
        threads.add(threading.current_thread().name)
        if isinstance(event, TransitionEvent):
            other = "t-b" if event.task_id == "t-a" else "t-a"
            snap = controller.get(other)
            seen.append((event.task_id, None if snap is None else snap.status))
            if event.task_id == "t-b" and event.to_status is S.QUEUED:
                controller.stop("t-b", reason="监听器停掉排队的兄弟")
                gate.set()

    controller.add_listener(reentrant)
    with controller:
        controller.register("counting", counting)
        controller.register("gated", gated)
        a = controller.submit("gated", task_id="t-a")
        b = controller.submit("counting", 1, task_id="t-b")
        assert a.wait(timeout=10).ok
        assert b.wait(timeout=10).status is S.STOPPED
    assert seen
    assert all(name.startswith("chongming-events") for name in threads)


def run_two_tasks_beside_a_broken_listener(
    caplog: pytest.LogCaptureFixture, broken: Any, recorder: Any
) -> None:
    """两个任务跑完（任务本身不受监听器的 bug 影响），之后 ``broken`` 已被摘掉。"""
    with (
        caplog.at_level(logging.ERROR, logger="chongming_task.events"),
        Controller(listeners=[broken, recorder]) as controller,
    ):
        controller.register("counting", counting)
        assert controller.submit("counting", 2, task_id="t1").wait(timeout=10).ok
        assert controller.submit("counting", 2, task_id="t2").wait(timeout=10).ok
        controller.flush_events(timeout=5)
        assert controller.remove_listener(broken) is False  # 已经被摘掉了


def test_a_raising_listener_is_logged_once_removed_and_the_task_is_unharmed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[Any] = []
    recorder = Recorder()

    def broken(event: Any) -> None:
        calls.append(event)
        raise RuntimeError("监听器里的 bug")

    run_two_tasks_beside_a_broken_listener(caplog, broken, recorder)
    assert len(calls) == 1
    assert len([r for r in caplog.records if "已被移除" in r.getMessage()]) == 1
    # 其他监听器照常收到全部事件
    assert recorder.transitions("t2")[-1].to_status is S.SUCCEEDED


def test_a_slow_listener_does_not_slow_the_tasks() -> None:
    release = threading.Event()

    def slow(event: Any) -> None:
        release.wait(10)

    with Controller(max_parallel=4, listeners=[slow]) as controller:
        controller.register("counting", counting)
        started = time.monotonic()
        runs = [controller.submit("counting", 1) for _ in range(20)]
        for run in runs:
            assert run.wait(timeout=5).ok
        assert time.monotonic() - started < 5
        release.set()


def test_add_and_remove_listener_and_configuration_errors() -> None:
    recorder = Recorder()
    with Controller() as controller:
        controller.register("counting", counting)
        controller.submit("counting", 1, task_id="before").wait(timeout=10)
        controller.add_listener(recorder)
        controller.submit("counting", 1, task_id="after").wait(timeout=10)
        controller.flush_events(timeout=5)
        assert controller.remove_listener(recorder) is True
        controller.submit("counting", 1, task_id="removed").wait(timeout=10)
        controller.flush_events(timeout=5)
        with pytest.raises(ConfigurationError, match="可调用"):
            controller.add_listener("not callable")  # type: ignore[arg-type]
    ids = {e.task_id for e in recorder.events if isinstance(e, TransitionEvent)}
    assert ids == {"after"}
    with pytest.raises(ConfigurationError, match="listeners"):
        Controller(listeners=recorder)  # type: ignore[arg-type]


def test_close_delivers_pending_events_before_returning() -> None:
    recorder = Recorder()
    controller = Controller(listeners=[recorder])
    controller.register("counting", counting)
    controller.submit("counting", 1, task_id="t").wait(timeout=10)
    controller.close()
    assert recorder.transitions("t")[-1].to_status is S.SUCCEEDED
    with pytest.raises(ConfigurationError):
        controller.add_listener(recorder)


class FlakyStore(InMemoryTaskStore):
    def __init__(self) -> None:
        super().__init__()
        self.fail = True

    def save(self, *args: Any, **kwargs: Any) -> Any:
        if self.fail:
            from chongming_task.errors import StoreError

            raise StoreError("磁盘满了")
        return super().save(*args, **kwargs)


def test_store_errors_are_events_and_the_task_still_succeeds() -> None:
    recorder = Recorder()
    store = FlakyStore()
    with Controller(store=store, listeners=[recorder]) as controller:
        controller.register("counting", counting)
        assert controller.submit("counting", 1, task_id="t").wait(timeout=10).ok
        store.fail = False
        controller.flush_events(timeout=5)
    errors = [e for e in recorder.events if isinstance(e, StoreErrorEvent)]
    assert errors and errors[0].task_id == "t" and "磁盘满了" in errors[0].error
    assert errors[0].operation == "save"


class BatchRecorder:
    """类上有 on_event_batch：交付线程一次交来整批，不再逐个调用 __call__。"""

    def __init__(self, *, fail: bool = False) -> None:
        self.batches: list[list[Any]] = []
        self.single_calls = 0
        self.fail = fail

    def __call__(self, event: Any) -> None:
        self.single_calls += 1

    def on_event_batch(self, events: Any) -> None:
        self.batches.append(list(events))
        if self.fail:
            raise RuntimeError("批量监听器里的 bug")


def test_a_batch_listener_gets_every_event_in_order_through_its_batch_entry() -> None:
    batch = BatchRecorder()
    recorder = Recorder()
    with Controller(listeners=[batch, recorder]) as controller:
        controller.register("counting", counting)
        assert controller.submit("counting", 3, task_id="t1").wait(timeout=10).ok
        controller.flush_events(timeout=5)
        seen = [e for b in batch.batches for e in b]
        assert batch.single_calls == 0
        assert seen == recorder.events  # 同样的事件、同样的顺序
        assert [e.version for e in seen if isinstance(e, TransitionEvent)] == [
            e.version for e in recorder.transitions("t1")
        ]


def test_a_raising_batch_listener_is_logged_once_removed_and_others_still_get_events(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broken = BatchRecorder(fail=True)
    recorder = Recorder()
    run_two_tasks_beside_a_broken_listener(caplog, broken, recorder)
    assert len(broken.batches) == 1
    assert len([r for r in caplog.records if "已被移除" in r.getMessage()]) == 1
    assert recorder.transitions("t2")[-1].to_status is S.SUCCEEDED


def test_bursts_from_many_threads_are_all_delivered_and_flush_never_hangs() -> None:
    # 入队不拿锁，只在交付线程睡着时叫醒它：一阵一阵地从几个线程提交（每阵之间交付线程都会睡下），
    # 每阵之后 flush 必须很快返回 True、且每个任务的每次迁移都已送到——漏一次叫醒，flush 就会等到超时。
    recorder = Recorder()
    with Controller(max_parallel=4, listeners=[recorder]) as controller:
        controller.register("counting", counting)
        runs: list[Any] = []
        runs_lock = threading.Lock()

        def burst(n: int) -> None:
            mine = [controller.submit("counting", 0) for _ in range(n)]
            with runs_lock:
                runs.extend(mine)

        for size in (1, 3, 17, 1, 40, 2):
            threads = [threading.Thread(target=burst, args=(size,)) for _ in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for run in runs:
                assert run.wait(timeout=10).ok
            assert controller.flush_events(timeout=5)
            for run in runs:
                assert [(e.from_status, e.to_status) for e in recorder.transitions(run.task_id)] == [
                    (S.PENDING, S.QUEUED),
                    (S.QUEUED, S.STARTING),
                    (S.STARTING, S.RUNNING),
                    (S.RUNNING, S.SUCCEEDED),
                ]
            time.sleep(0.02)  # 让交付线程睡下：下一阵的第一条事件必须把它叫醒
    assert len(recorder.events) == 4 * len(runs) == 4 * 3 * 64


def test_flush_does_not_wait_out_the_coalescing_window(monkeypatch: pytest.MonkeyPatch) -> None:
    # 交付线程被第一条事件叫醒后先攒一会儿批（COALESCE_SECONDS）；flush 叫醒它、让它不再攒批——
    # 攒批窗口调到 60 秒，flush 仍在 10 秒的时限内等到每一条迁移都送到（不叫醒的话它会等到超时、返回 False）。
    from chongming_task.runtime import events

    monkeypatch.setattr(events, "COALESCE_SECONDS", 60.0)
    recorder = Recorder()
    with Controller(max_parallel=2, listeners=[recorder]) as controller:
        controller.register("counting", counting)
        for round_no in range(3):
            runs = [controller.submit("counting", round_no) for _ in range(5)]
            for run in runs:
                assert run.wait(timeout=10).ok
            assert controller.flush_events(timeout=10)
            for run in runs:
                assert recorder.transitions(run.task_id)[-1].to_status is S.SUCCEEDED


def test_close_wakes_a_delivery_thread_that_is_coalescing_and_delivers_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 攒批窗口调到 60 秒：close() 必须叫醒正在攒批的交付线程（而不是等满窗口），送完已发生的事件、停掉线程。
    from chongming_task.runtime import events

    monkeypatch.setattr(events, "COALESCE_SECONDS", 60.0)
    recorder = Recorder()
    controller = Controller(max_parallel=2, listeners=[recorder])
    controller.register("counting", counting)
    runs = [controller.submit("counting", 1) for _ in range(4)]
    for run in runs:
        assert run.wait(timeout=10).ok
    started = time.monotonic()
    controller.close()
    assert time.monotonic() - started < 10
    for run in runs:
        assert recorder.transitions(run.task_id)[-1].to_status is S.SUCCEEDED
    assert not [t for t in threading.enumerate() if t.name.startswith("chongming-events[") and t.is_alive()]


def test_flush_and_submit_racing_from_many_threads_never_lose_a_wakeup() -> None:
    # 叫醒靠"一把被占着的锁放一次"：入队、flush、攒批超时三方同时抢叫醒时，锁既不能被放两次（会抛
    # RuntimeError，从 submit 或 flush 里冒出来），也不能一次都不放（flush 超时）。
    # 几个线程一边提交一边 flush。
    recorder = Recorder()
    errors: list[BaseException] = []
    with Controller(max_parallel=4, listeners=[recorder]) as controller:
        controller.register("counting", counting)
        runs: list[Any] = []
        runs_lock = threading.Lock()

        def work(seed: int) -> None:
            try:
                for i in range(60):
                    run = controller.submit("counting", 0)
                    with runs_lock:
                        runs.append(run)
                    if (i + seed) % 7 == 0:
                        assert controller.flush_events(timeout=10)
                    if (i + seed) % 11 == 0:
                        time.sleep(0.004)  # 让交付线程有机会睡下或正在攒批
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        for run in runs:
            assert run.wait(timeout=10).ok
        assert controller.flush_events(timeout=10)
        assert len(recorder.events) == 4 * len(runs) == 4 * 240


def test_submit_context_is_still_copied_for_a_plain_listener_next_to_the_metrics() -> None:
    # 内置指标声明了不读 submit_context（只有它在听时提交不拷贝上下文）；旁边只要还有一个普通监听器，
    # 第一条迁移就照文档带着提交者那一刻的 contextvars。
    pytest.importorskip("prometheus_client")
    import contextvars

    from prometheus_client import CollectorRegistry

    from chongming_task.metrics import instrument

    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
    recorder = Recorder()
    with Controller() as controller:
        metrics = instrument(controller, registry=CollectorRegistry())
        controller.add_listener(recorder)
        controller.register("counting", counting)
        token = request_id.set("req-42")
        try:
            assert controller.submit("counting", 1, task_id="t").wait(timeout=10).ok
        finally:
            request_id.reset(token)
        controller.flush_events(timeout=5)
        metrics.close()
    first, *rest = recorder.transitions("t")
    assert (first.from_status, first.to_status) == (S.PENDING, S.QUEUED)
    assert first.submit_context is not None and first.submit_context.run(request_id.get) == "req-42"
    assert all(event.submit_context is None for event in rest)


def test_the_queue_is_bounded_counts_drops_and_ignores_events_after_close(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # 有界（§15.1）：监听器卡住时，积压（含交付线程手里正在送的那一批）到上限后新事件被丢弃、计数、警告一次；
    # 监听器放开之后又能入队；close() 之后的事件被忽略，不算丢弃。入队方只比一次"队列长度 ≥ 余量"，余量随
    # 交付线程手里那一批变化，关闭时变成 -1——这个测试守着这三种情形。
    from chongming_task.runtime import events

    monkeypatch.setattr(events, "MAX_PENDING_EVENTS", 6)
    monkeypatch.setattr(events, "COALESCE_SECONDS", 0.0)
    entered, release = threading.Event(), threading.Event()
    seen: list[Any] = []

    def stuck(event: Any) -> None:
        seen.append(event)
        entered.set()
        release.wait(10)

    hub = events.EventHub(name="bounded-test")
    hub.add(stuck)
    store_error = StoreErrorEvent("t", "save", "坏", datetime.now(UTC))
    hub.emit(store_error)
    assert entered.wait(10)  # 交付线程拿着一条（1 条在手）卡在监听器里
    with caplog.at_level(logging.WARNING, logger="chongming_task.events"):
        for _ in range(8):
            hub.emit(store_error)
    assert hub.dropped == 3, "上限 6 条、手里 1 条：队列里再放 5 条，其余 3 条丢弃"
    assert len([r for r in caplog.records if "跟不上" in r.getMessage()]) == 1
    release.set()
    assert hub.flush(timeout=10)
    assert len(seen) == 6
    hub.emit(store_error)  # 送完之后余量恢复
    assert hub.flush(timeout=10) and len(seen) == 7 and hub.dropped == 3
    hub.close()
    hub.emit(store_error)
    assert hub.dropped == 3 and len(seen) == 7, "关闭之后的事件被忽略、不算丢弃"
