"""主线程里的等待按片等（runtime/interruptible.py）：信号被内核交给了别的线程时，Ctrl-C 也立刻生效。

``signal.pthread_kill`` 把 SIGINT 精确地投给一条辅助线程——这正是真实进程里时有时无的情形（进程收到的信号
由内核交给任意一条没屏蔽它的线程）。改之前，主线程阻塞在 ``wait_all`` / ``wait`` 里要等到超时才处理它。
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from chongming_task import Controller, Pipeline, TaskContext, task
from chongming_task.runtime.interruptible import MAIN_THREAD_WAIT_SLICE, wait_event, wait_slice

TIMEOUT = 10.0
"""等待的超时：改之前 KeyboardInterrupt 要等满它才出现。"""
PROMPT = 3.0
"""信号之后多久之内必须抛出（一片是 0.1 秒；留足负载下的余量，仍远小于 TIMEOUT）。"""

gate = threading.Event()


@pytest.fixture(autouse=True)
def _sigint_raises_keyboard_interrupt() -> Iterator[None]:
    """在 SIGINT 被忽略的环境里启动的解释器（后台作业、nohup、某些 CI 执行器）不装 Python 的默认处理函数，
    投出去的 SIGINT 石沉大海，这些测试就会等满超时、甚至卡住。这里显式装上、测完恢复。"""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@task
def blocked(ctx: TaskContext) -> None:
    """不 checkpoint、只等闸门：任务不会自己结束。"""
    gate.wait(30)


@pytest.fixture
def controller() -> Iterator[Controller]:
    gate.clear()
    c = Controller(max_parallel=2)
    c.register_all(blocked)
    try:
        yield c
    finally:
        gate.set()
        c.close()


def _interrupt_from_another_thread(delay: float) -> threading.Thread:
    """``delay`` 秒后向一条辅助线程自己投 SIGINT：C 层记下信号，只有主线程执行 Python 的处理函数。"""

    def kick() -> None:
        time.sleep(delay)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    thread = threading.Thread(target=kick, daemon=True)
    thread.start()
    return thread


def _elapsed_until_interrupt(wait: Callable[[], object]) -> float:
    assert threading.current_thread() is threading.main_thread()
    kicker = _interrupt_from_another_thread(0.2)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        wait()
    elapsed = time.monotonic() - started
    kicker.join(5)
    return elapsed


def test_wait_all_is_interrupted_promptly_when_the_signal_lands_on_another_thread(
    controller: Controller,
) -> None:
    controller.submit("blocked", task_id="a")
    assert _elapsed_until_interrupt(lambda: controller.wait_all(timeout=TIMEOUT)) < PROMPT


def test_wait_of_one_task_is_interrupted_promptly(controller: Controller) -> None:
    run = controller.submit("blocked", task_id="b")
    assert _elapsed_until_interrupt(lambda: run.wait(timeout=TIMEOUT)) < PROMPT
    assert not run.status.is_terminal  # 打断的是等待，不是任务


def test_pipeline_wait_is_interrupted_promptly(controller: Controller) -> None:
    pipeline = Pipeline("p")
    pipeline.node("blocked", node_id="only")
    handle = controller.submit_pipeline(pipeline)
    assert _elapsed_until_interrupt(lambda: handle.wait(timeout=TIMEOUT)) < PROMPT


def test_the_waits_keep_their_results_and_timeouts() -> None:
    event = threading.Event()
    started = time.monotonic()
    assert wait_event(event.wait, 0.35) is False  # 等满超时（跨好几片）仍未置位
    assert time.monotonic() - started >= 0.35
    event.set()
    assert wait_event(event.wait, None) is True
    assert wait_event(event.wait, 0) is True


def test_only_the_main_thread_waits_in_slices() -> None:
    assert wait_slice(None) == MAIN_THREAD_WAIT_SLICE
    assert wait_slice(5.0) == MAIN_THREAD_WAIT_SLICE
    assert wait_slice(0.03) == 0.03
    seen: list[float | None] = []
    worker = threading.Thread(target=lambda: seen.extend([wait_slice(None), wait_slice(5.0)]))
    worker.start()
    worker.join()
    assert seen == [None, 5.0]  # 别的线程不执行信号处理函数：切片只会让它白醒


left = threading.Event()


@task
def spinning(ctx: TaskContext) -> None:
    """一直 checkpoint：停止请求一到，checkpoint 抛出（BaseException），任务收尾时记下。"""
    try:
        while True:
            ctx.checkpoint()
            time.sleep(0.01)
    finally:
        left.set()


def test_run_task_stops_the_task_and_raises_promptly() -> None:
    """用户指南 §3.1：等待期间按 Ctrl-C，先请求停止任务再抛 KeyboardInterrupt——信号落在别的线程上也一样。"""
    from chongming_task import run_task

    left.clear()
    assert _elapsed_until_interrupt(lambda: run_task(spinning)) < PROMPT
    assert left.wait(10)  # 停止请求真的送到了任务


def test_close_waiting_for_a_slow_listener_is_interrupted_promptly() -> None:
    """close() 先把已发生的事件送完（最多 5 秒）：监听器卡住时，主线程等的是事件交付——同样要按片等。"""
    release = threading.Event()
    in_listener = threading.Event()

    def stuck(event: object) -> None:
        in_listener.set()
        release.wait(30)

    c = Controller()
    c.add_listener(stuck)
    c.register("quick", lambda ctx: None)
    try:
        c.submit("quick", task_id="q").wait(timeout=5)
        assert in_listener.wait(5)
        assert _elapsed_until_interrupt(lambda: c.close(timeout=0)) < PROMPT
    finally:
        release.set()
        c.close()


def test_join_thread_keeps_the_timeout_and_returns_when_the_thread_ends() -> None:
    from chongming_task.runtime.interruptible import join_thread

    stop = threading.Event()
    worker = threading.Thread(target=lambda: stop.wait(30), daemon=True)
    worker.start()
    started = time.monotonic()
    join_thread(worker, 0.35)  # 跨好几片仍等满超时
    assert time.monotonic() - started >= 0.35 and worker.is_alive()
    stop.set()
    join_thread(worker, None)
    assert not worker.is_alive()
    sleeper = threading.Thread(target=time.sleep, args=(TIMEOUT,), daemon=True)
    sleeper.start()
    assert _elapsed_until_interrupt(lambda: join_thread(sleeper, TIMEOUT)) < PROMPT
