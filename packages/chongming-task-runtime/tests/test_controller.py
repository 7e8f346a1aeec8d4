"""Controller（进程内）：白名单、调度、额度、查询、控制与收尾——全部经公开 API 验证。"""

from __future__ import annotations

import gc
import random
import threading
import time
import weakref
from collections.abc import Iterator

import pytest
from chongming_runtime_test_support import wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wcwidth import wcswidth

from chongming_task import (
    BucketPolicy,
    ConcurrencyPolicy,
    ConfigurationError,
    Controller,
    FailureKind,
    FixedBackoff,
    RetryPolicy,
    TaskStatus,
    Timeout,
    render_table,
    task,
)
from chongming_task.runtime.executors import thread as thread_executor
from chongming_task.testing import FakeClock

S = TaskStatus


class Gate:
    """让测试精确控制任务何时结束：任务在 checkpoint 循环里等闸门打开。"""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.started: list[str] = []

    def body(self, ctx: object, name: str = "") -> str:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
            self.started.append(name)
        try:
            while not self.opened.wait(0.002):
                ctx.checkpoint()  # type: ignore[attr-defined]
            return name
        finally:
            with self.lock:
                self.running -= 1


@pytest.fixture
def gate() -> Iterator[Gate]:
    g = Gate()
    yield g
    g.opened.set()


@pytest.fixture
def controller() -> Iterator[Controller]:
    c = Controller(max_parallel=2, graceful_stop=1.0)
    yield c
    c.close(timeout=5)


# -- registry and submit guards ----------------------------------------------------------------------


def test_submit_accepts_only_registered_names(controller: Controller) -> None:
    def extract(ctx: object) -> int:
        return 1

    with pytest.raises(ConfigurationError, match="没有登记"):
        controller.submit("extract")
    with pytest.raises(ConfigurationError, match="远程代码执行"):
        controller.submit(extract)  # type: ignore[arg-type]
    controller.register("extract", extract)
    assert controller.wait(controller.submit("extract").task_id, timeout=5).value == 1


def test_duplicate_registration_is_refused(controller: Controller) -> None:
    controller.register("a", lambda ctx: 1)
    with pytest.raises(ConfigurationError, match="已经登记"):
        controller.register("a", lambda ctx: 2)


def test_duplicate_task_id_and_non_string_tags_refused(controller: Controller, gate: Gate) -> None:
    controller.register("g", gate.body)
    controller.submit("g", task_id="same")
    with pytest.raises(ConfigurationError, match="已存在"):
        controller.submit("g", task_id="same")
    with pytest.raises(ConfigurationError, match="tags"):
        controller.submit("g", tags=[1, 2])  # type: ignore[list-item]


@task(tags={"io"}, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0)))
def decorated_extract(ctx: object, x: int) -> int:
    """从某处抽取数据。"""
    return x + 1


def test_register_all_and_module_use_task_spec(controller: Controller) -> None:
    import sys

    (definition,) = controller.register_all(decorated_extract)
    assert definition.name == "decorated_extract"
    assert definition.tags == frozenset({"io"})
    assert definition.description == "从某处抽取数据。"
    run = controller.submit("decorated_extract", 1)
    assert run.snapshot.max_attempts == 2
    assert "io" in run.snapshot.tags
    assert controller.wait(run.task_id, timeout=5).value == 2
    other = Controller()
    try:
        found = other.register_module(sys.modules[__name__])
        assert [d.name for d in found] == ["decorated_extract"]
    finally:
        other.close()


# -- scheduling ---------------------------------------------------------------------------------------


def test_never_more_than_max_parallel_running(gate: Gate) -> None:
    c = Controller(max_parallel=3)
    c.register("g", gate.body)
    for i in range(10):
        c.submit("g", f"t{i}", task_id=f"t{i}")
    wait_until(lambda: gate.running == 3)
    assert c.active_count == 3 and c.queued_count == 7
    queued = c.list_tasks(status=S.QUEUED)
    assert len(queued) == 7
    assert all(s.started_at is None for s in queued)
    gate.opened.set()
    outcomes = c.wait_all(timeout=10)
    assert all(o.ok for o in outcomes)
    assert gate.peak == 3
    assert c.active_count == 0 and c.queued_count == 0
    c.close()


def test_priority_higher_first_fifo_within_equal(gate: Gate) -> None:
    c = Controller(concurrency=ConcurrencyPolicy(max_parallel=1, priority=0))
    c.register("g", gate.body)
    c.submit("g", "blocker", task_id="blocker")
    wait_until(lambda: gate.running == 1)
    c.submit("g", "low-1")
    c.submit("g", "high-1", priority=10)
    c.submit("g", "low-2")
    c.submit("g", "high-2", priority=10)
    gate.opened.set()
    c.wait_all(timeout=10)
    assert gate.started == ["blocker", "high-1", "high-2", "low-1", "low-2"]
    c.close()


def test_full_bucket_does_not_block_other_buckets(gate: Gate) -> None:
    c = Controller(max_parallel=10, max_parallel_per_bucket=1)
    c.register("g", gate.body)
    a0 = c.submit("g", "a0", bucket_key="tenant-A")
    a1 = c.submit("g", "a1", bucket_key="tenant-A")
    b0 = c.submit("g", "b0", bucket_key="tenant-B")
    wait_until(lambda: gate.running == 2)
    assert a0.status is S.RUNNING and b0.status is S.RUNNING
    assert a1.status is S.QUEUED
    bucket_a = BucketPolicy().bucket_for("tenant-A")
    assert a1.snapshot.bucket == bucket_a and a1.snapshot.bucket_key == "tenant-A"
    assert c.active_in_bucket(bucket_a) == 1
    assert c.bucket_counts()[bucket_a] == 2
    assert [s.task_id for s in c.list_tasks(bucket=bucket_a)] == [a0.task_id, a1.task_id]
    gate.opened.set()
    c.wait_all(timeout=10)
    c.close()


def test_named_limits_and_pause_keeps_slot_and_limit(gate: Gate) -> None:
    c = Controller(concurrency=ConcurrencyPolicy(max_parallel=20, limits={"db": 1}))
    c.register("g", gate.body)
    first = c.submit("g", "db-1", tags=["db"])
    second = c.submit("g", "db-2", tags=["db"])
    free = c.submit("g", "free", tags=["io"])
    wait_until(lambda: gate.running == 2)
    assert second.status is S.QUEUED and free.status is S.RUNNING
    assert c.pause(first.task_id, timeout=2) is True
    assert first.status is S.PAUSED
    time.sleep(0.05)
    # 暂停不释放执行槽，也就不释放资源名额：第二个 db 任务仍在排队。
    assert second.status is S.QUEUED
    assert c.active_count == 2
    assert c.resume(first.task_id) is True
    gate.opened.set()
    c.wait_all(timeout=10)
    assert second.snapshot.status is S.SUCCEEDED
    c.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.sampled_from(["ok", "raise", "stop", "retry_then_ok", "bad_result"]), min_size=1, max_size=12)
)
def test_slots_released_on_every_terminal_path(outcomes: list[str]) -> None:
    c = Controller(
        max_parallel=2,
        concurrency=ConcurrencyPolicy(limits={"db": 1}),
        max_parallel_per_bucket=1,
        graceful_stop=2.0,
    )
    attempts: dict[str, int] = {}
    lock = threading.Lock()

    def body(ctx, kind: str, key: str):  # type: ignore[no-untyped-def]
        with lock:
            attempts[key] = attempts.get(key, 0) + 1
            n = attempts[key]
        ctx.checkpoint()
        if kind == "raise":
            raise RuntimeError("boom")
        if kind == "retry_then_ok" and n == 1:
            raise RuntimeError("first attempt fails")
        if kind == "stop":
            while True:
                ctx.checkpoint()
                time.sleep(0.001)
        if kind == "bad_result":
            return {1, 2}
        return kind

    c.register(
        "body", body, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0), give_up_on=(RuntimeError,))
    )
    c.register("retrying", body, retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0)))
    runs = []
    rng = random.Random(len(outcomes))
    for i, kind in enumerate(outcomes):
        name = "retrying" if kind == "retry_then_ok" else "body"
        tags = ["db"] if rng.random() < 0.5 else []
        runs.append(c.submit(name, kind, f"k{i}", tags=tags, bucket_key=f"b{rng.randint(0, 2)}"))
    # 停止类任务一跑起来就停掉（它们可能要排队等额度，所以轮询着停，而不是按顺序死等）。
    pending_stops = {run.task_id: run for kind, run in zip(outcomes, runs, strict=True) if kind == "stop"}
    deadline = time.monotonic() + 20
    while pending_stops:
        assert time.monotonic() < deadline, "停止类任务迟迟没有开始运行"
        for task_id, run in list(pending_stops.items()):
            if run.status is S.RUNNING:
                c.stop(task_id, reason="测试停止")
                del pending_stops[task_id]
        time.sleep(0.002)
    c.wait_all(timeout=20)
    expected = {
        "ok": S.SUCCEEDED,
        "raise": S.FAILED,
        "stop": S.STOPPED,
        "retry_then_ok": S.SUCCEEDED,
        "bad_result": S.FAILED,
    }
    for kind, run in zip(outcomes, runs, strict=True):
        assert run.status is expected[kind], (kind, run.transitions)
    assert c.active_count == 0 and c.queued_count == 0
    c.close()


def test_stop_queued_task_takes_effect_at_once(gate: Gate, controller: Controller) -> None:
    controller.register("g", gate.body)
    controller.submit("g", task_id="a")
    controller.submit("g", task_id="b")
    queued = controller.submit("g", task_id="c")
    wait_until(lambda: gate.running == 2)
    assert controller.stop("c", reason="不要了") is True
    assert queued.status is S.STOPPED  # 不占槽的任务：立即生效，没有 stopping
    assert [t.to_status for t in queued.transitions] == [S.QUEUED, S.STOPPED]
    assert controller.stop("no-such-task") is False
    assert controller.queued_count == 0


def test_pause_and_resume_queued_task_returns_to_queue(gate: Gate, controller: Controller) -> None:
    controller.register("g", gate.body)
    controller.submit("g", task_id="a")
    controller.submit("g", task_id="b")
    c = controller.submit("g", task_id="c")
    wait_until(lambda: gate.running == 2)
    assert controller.pause("c") is True
    assert c.status is S.PAUSED and controller.queued_count == 0
    assert controller.resume("c") is True
    assert c.status is S.QUEUED and controller.queued_count == 1
    gate.opened.set()
    controller.wait_all(timeout=10)
    assert c.status is S.SUCCEEDED


def test_stop_all_counts_requests_and_wait_timeout_leaves_state(gate: Gate, controller: Controller) -> None:
    controller.register("g", gate.body)
    for i in range(3):
        controller.submit("g", task_id=f"t{i}")
    wait_until(lambda: gate.running == 2)
    with pytest.raises(TimeoutError):
        controller.wait("t0", timeout=0.05)
    assert controller.get("t0").status is S.RUNNING  # type: ignore[union-attr]
    assert controller.stop_all(reason="收工") == 3
    outcomes = controller.wait_all(timeout=10)
    assert sorted(o.status.value for o in outcomes) == ["stopped", "stopped", "stopped"]
    assert controller.stop_all() == 0


def test_close_stops_queued_tasks_without_running_their_body(gate: Gate) -> None:
    c = Controller(max_parallel=1, graceful_stop=1.0)
    c.register("g", gate.body)
    first = c.submit("g", "first")
    queued = [c.submit("g", f"q{i}") for i in range(3)]
    wait_until(lambda: gate.running == 1)
    c.close(reason="下班")
    assert first.status is S.STOPPED
    assert all(r.status is S.STOPPED for r in queued)
    assert gate.started == ["first"]
    assert all(r.snapshot.failure.kind is FailureKind.CANCELLED for r in queued)  # type: ignore[union-attr]
    with pytest.raises(ConfigurationError, match="已关闭"):
        c.submit("g", "late")
    c.close()  # 幂等


def test_context_manager_closes() -> None:
    with Controller(max_parallel=1) as c:
        c.register("one", lambda ctx: 1)
        run = c.submit("one")
        c.wait(run.task_id, timeout=5)
    assert c.closed


def test_start_timeout_counts_from_submit_with_fake_clock(gate: Gate) -> None:
    clock = FakeClock()
    c = Controller(max_parallel=1, clock=clock)
    c.register("g", gate.body)
    c.register("quick", lambda ctx: "ok", timeout=Timeout(start=10))
    c.submit("g", "holder")
    wait_until(lambda: gate.running == 1)
    starving = c.submit("quick")
    clock.advance(5)
    time.sleep(0.02)
    assert starving.status is S.QUEUED
    clock.advance(6)
    wait_until(lambda: starving.status.is_terminal)
    assert starving.status is S.STOPPED
    assert starving.snapshot.failure.kind is FailureKind.TIMEOUT_START  # type: ignore[union-attr]
    assert c.queued_count == 0
    gate.opened.set()
    c.close()


# -- queries ------------------------------------------------------------------------------------------


def test_queries_stats_and_list_filters(controller: Controller) -> None:
    controller.register("extract", lambda ctx, n: n, tags={"io"})
    controller.register("load", lambda ctx, n: n)
    for i in range(3):
        controller.submit("extract", i, task_id=f"e{i}")
    # 两个并行槽上 e2 与 l0 谁先落地本来就没有定数：等 e* 全部落地再提交 l0，下面 prune 的"最新"才确定。
    controller.wait_all(timeout=10)
    controller.submit("load", 9, task_id="l0", tags=["nightly"])
    controller.wait_all(timeout=10)
    assert [s.task_id for s in controller.list_tasks(name_prefix="ext")] == ["e0", "e1", "e2"]
    assert [s.task_id for s in controller.list_tasks(tag="nightly")] == ["l0"]
    assert len(controller.list_tasks(limit=2)) == 2
    assert controller.list_tasks(status="succeeded", order="newest")[0].task_id == "l0"
    stats = controller.stats()
    assert stats[S.SUCCEEDED] == 4 and stats.unfinished == 0
    assert controller.get("missing") is None
    assert len(controller.runs()) == 4
    assert controller.prune(keep_terminal=1) == 3
    assert [r.task_id for r in controller.runs()] == ["l0"]


# -- owned buckets --------------------------------------------------------------------------------------


def test_owned_buckets_rules() -> None:
    policy = BucketPolicy(64)
    with pytest.raises(ConfigurationError, match="越界"):
        Controller(owned_buckets=[0, 64])
    node = Controller(owned_buckets=range(16))
    try:
        node.register("sync", lambda ctx: 1)
        assert not node.owns_all_buckets
        with pytest.raises(ConfigurationError, match="必须给出 bucket_key"):
            node.submit("sync")
        foreign = next(k for k in (f"tenant-{i}" for i in range(100)) if policy.bucket_for(k) >= 16)
        with pytest.raises(ConfigurationError) as info:
            node.submit("sync", bucket_key=foreign)
        message = str(info.value)
        assert (
            f"桶 {policy.bucket_for(foreign)}" in message
            and foreign in message
            and "[0, 1, ..., 15]" in message
        )
        own = next(k for k in (f"tenant-{i}" for i in range(100)) if policy.bucket_for(k) < 16)
        node.wait(node.submit("sync", bucket_key=own).task_id, timeout=5)
    finally:
        node.close()
    everything = Controller(owned_buckets=range(64))
    try:
        everything.register("sync", lambda ctx: 1)
        assert everything.owns_all_buckets
        everything.wait(everything.submit("sync").task_id, timeout=5)  # 覆盖全部桶不算划分
    finally:
        everything.close()


# -- render_table -----------------------------------------------------------------------------------------


def test_render_table_aligns_cjk_and_shows_dash_for_never_started(gate: Gate) -> None:
    c = Controller(max_parallel=1)
    c.register("transform", gate.body)
    c.submit("transform", task_id="t0", label="转换-1")
    c.submit("transform", task_id="t1", label="很长的中文标签名字")
    wait_until(lambda: gate.running == 1)
    text = render_table(c.list_tasks())
    lines = text.splitlines()
    assert lines[0].split() == [
        "TASK_ID",
        "NAME",
        "STATUS",
        "ATTEMPT",
        "ELAPSED",
        "PROGRESS",
        "BUCKET",
        "FAILURE",
    ]
    # 每一列在每一行的起始显示列都相同（按显示宽度，而不是字符数）。
    header = lines[0]
    starts = [wcswidth(header[: header.index(col)]) for col in lines[0].split()]
    for line in lines[2:]:
        cells = line.split()
        cursor = 0
        for col_index, cell in enumerate(cells):
            position = line.index(cell, cursor)
            assert wcswidth(line[:position]) == starts[col_index], (line, cell)
            cursor = position + len(cell)
    queued_line = next(line for line in lines if line.startswith("t1"))
    assert queued_line.split()[4] == "-"  # 从未执行：ELAPSED 显示 -
    gate.opened.set()
    c.close()


def test_stop_all_does_not_count_tasks_already_stopping() -> None:
    c = Controller(max_parallel=2, graceful_stop=5.0)
    release = threading.Event()

    def slow_to_stop(ctx: object) -> None:
        try:
            while True:
                ctx.checkpoint()  # type: ignore[attr-defined]
                time.sleep(0.002)
        finally:
            release.wait(5)  # 收尾很慢：任务在 stopping 里停留一会儿

    c.register("slow", slow_to_stop)
    run = c.submit("slow")
    wait_until(lambda: run.status is S.RUNNING)
    assert c.stop_all(reason="第一轮") == 1
    wait_until(lambda: run.status is S.STOPPING)
    assert c.stop_all(reason="第二轮") == 0  # 请求已在途，不重复计数
    release.set()
    c.wait_all(timeout=10)
    assert run.status is S.STOPPED
    c.close()


def test_concurrent_submits_of_one_task_id_admit_exactly_one() -> None:
    from chongming_task import DuplicateTaskId, InMemoryTaskStore

    c = Controller(max_parallel=2, store=InMemoryTaskStore())
    c.register("quick", lambda ctx: 1)
    barrier = threading.Barrier(8)
    results: list[str] = []
    lock = threading.Lock()

    def racer() -> None:
        barrier.wait()
        try:
            c.submit("quick", task_id="contested")
            outcome = "ok"
        except DuplicateTaskId:
            outcome = "duplicate"
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=racer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert sorted(results) == ["duplicate"] * 7 + ["ok"]
    c.wait_all(timeout=5)
    assert len(c.store.history("contested")) == 4  # type: ignore[union-attr]
    c.close()


def test_finished_worker_thread_relays_the_next_queued_task() -> None:
    """让出额度的那条线程直接接着跑下一个排队任务：不为每个任务新建线程，也不经任何线程交接。"""
    c = Controller(max_parallel=1)
    gate = threading.Event()
    idents: list[int] = []

    def step(ctx: object, i: int) -> int:
        if i == 0:
            gate.wait(5)
        idents.append(threading.get_ident())
        return i

    c.register("step", step)
    runs = [c.submit("step", i) for i in range(20)]
    wait_until(lambda: runs[0].status is S.RUNNING)
    gate.set()
    outcomes = c.wait_all(timeout=10)
    assert [o.value for o in outcomes] == list(range(20))
    assert len(set(idents)) == 1  # 一条线程接力跑完了整条队列
    c.close()


def test_tasks_released_together_by_one_settlement_run_in_parallel() -> None:
    """一次结算同时放出几个排队任务（一个任务占着两个限流标签，落地时两边各放出一个）：只接力一个，另一个交给
    别的线程——两个同时跑（互相等到对方才返回）。都接力到落地的那一条线程上就排成一串，栅栏等不齐。"""
    c = Controller(concurrency=ConcurrencyPolicy(max_parallel=4, limits={"a": 1, "b": 1}))
    gate = threading.Event()
    together = threading.Barrier(2, timeout=5)

    def hold(ctx: object) -> None:
        gate.wait(5)

    def meet(ctx: object, i: int) -> int:
        together.wait()  # 两个不同时在跑就等不齐：BrokenBarrierError，任务失败
        return i

    c.register("hold", hold)
    c.register("meet", meet)
    try:
        first = c.submit("hold", tags={"a", "b"})
        wait_until(lambda: first.status is S.RUNNING)
        runs = [c.submit("meet", 0, tags={"a"}), c.submit("meet", 1, tags={"b"})]
        assert [r.status for r in runs] == [S.QUEUED, S.QUEUED]
        gate.set()
        outcomes = c.wait_all(timeout=10)
        assert [o.status for o in outcomes] == [S.SUCCEEDED] * 3, [o.failure for o in outcomes]
        assert [o.value for o in outcomes[1:]] == [0, 1]
    finally:
        gate.set()
        c.close()


def _thread(ident: int) -> threading.Thread | None:
    return next((t for t in threading.enumerate() if t.ident == ident), None)


def test_idle_worker_thread_takes_the_next_submit() -> None:
    """干净跑完、没有接力活的线程在空闲栈里等着：下一次提交直接交给它，不新建线程（§7.3：它是守护线程）。"""
    c = Controller(max_parallel=1)
    idents: list[int] = []
    c.register("who", lambda ctx: idents.append(threading.get_ident()))
    for _ in range(5):
        c.wait(c.submit("who").task_id, timeout=5)
        # 等它进了空闲栈（栈后进先出：下一次提交取到的正是它）
        wait_until(lambda: getattr(_thread(idents[-1]), "name", None) == thread_executor.IDLE_THREAD_NAME)
    assert len(set(idents)) == 1
    worker = _thread(idents[0])
    assert worker is not None and worker.daemon
    c.close()


class _Payload:
    """任务参数：能被弱引用，用来看它什么时候被释放。"""


def test_an_idle_worker_thread_keeps_no_task_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """空闲等待的工作线程不引用它跑过的尝试：控制器关掉、没人再引用之后，它的任务连同参数马上就能回收，
    不必等这条线程接到下一个活或空闲超时（issue 17：否则整个控制器与它在管的全部任务要多活到那时，
    再由某一次全量回收整片扫掉）。两个任务都看：第一个是新建线程时交给它的，第二个是交接给空闲线程的
    （第一个跑完的线程已在空闲栈里）。"""
    monkeypatch.setattr(thread_executor, "IDLE_WORKER_TIMEOUT", 60.0)  # 测量期间线程一定还在空闲栈里
    c = Controller(max_parallel=1)
    idents: list[int] = []

    def take(ctx: object, payload: _Payload) -> None:
        idents.append(threading.get_ident())

    c.register("take", take)
    refs = []
    for _ in range(2):
        payload = _Payload()
        refs.append(weakref.ref(payload))
        c.wait(c.submit("take", payload).task_id, timeout=5)
        del payload
        wait_until(lambda: getattr(_thread(idents[-1]), "name", None) == thread_executor.IDLE_THREAD_NAME)
    c.close()
    del c
    gc.collect()
    assert [ref() for ref in refs] == [None, None]
    for ident in set(idents):  # 跑过它们的线程仍在空闲等待（所以上面看的不是"线程已退出"）
        worker = _thread(ident)
        assert worker is not None and worker.name == thread_executor.IDLE_THREAD_NAME


def test_abandoned_thread_is_never_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    """不响应停止的任务被判 lost、线程被放弃；它之后的任务照常在别的线程里跑。被放弃的线程哪天返回了
    也直接退出：不进空闲栈（空闲等待拉长到 60 秒，进了栈就会一直活着），也不接力。"""
    monkeypatch.setattr(thread_executor, "IDLE_WORKER_TIMEOUT", 60.0)
    c = Controller(max_parallel=1, graceful_stop=0.2)
    release = threading.Event()
    idents: dict[str, int] = {}

    def stubborn(ctx: object) -> None:
        idents["stubborn"] = threading.get_ident()
        release.wait(10)  # 从不调 checkpoint：停不下来

    def after(ctx: object) -> str:
        idents["after"] = threading.get_ident()
        return "ok"

    c.register("stubborn", stubborn)
    c.register("after", after)
    stuck = c.submit("stubborn")
    follow = c.submit("after")
    wait_until(lambda: stuck.status is S.RUNNING)
    c.stop(stuck.task_id)
    assert c.wait(follow.task_id, timeout=10).value == "ok"
    assert stuck.status is S.LOST
    assert idents["after"] != idents["stubborn"]
    abandoned = _thread(idents["stubborn"])
    assert abandoned is not None
    release.set()
    abandoned.join(timeout=10)
    assert not abandoned.is_alive()
    c.close()


def test_keep_finished_bounds_the_handles_kept_in_memory() -> None:
    from chongming_task import InMemoryTaskStore

    store = InMemoryTaskStore()
    c = Controller(max_parallel=2, store=store, keep_finished=10)
    c.register("quick", lambda ctx, i: i)
    for i in range(200):
        c.submit("quick", i, task_id=f"q{i}")
    c.wait_all(timeout=30)
    wait_until(lambda: len(c.runs()) <= 10 + 16)
    assert c.get("q0") is not None and c.get("q0").outcome == 0  # type: ignore[union-attr]  # 旧的仍可从存储查到
    assert len(store.query()) == 200  # 存储不动
    c.close()
    with pytest.raises(ConfigurationError, match="keep_finished"):
        Controller(keep_finished=-1)
