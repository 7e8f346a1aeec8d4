"""组提交（runtime/group_commit.py）与批量提交（Controller.submit_many）。"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from chongming_task import Controller, SqliteTaskStore, Submit, TaskStatus
from chongming_task.core.storage import commit_hooks
from chongming_task.errors import (
    ConcurrencyConflict,
    ConfigurationError,
    DuplicateTaskId,
    StoreError,
    TaskError,
)
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.runtime import group_commit
from chongming_task.runtime.group_commit import GroupCommit, Pending
from chongming_task.storage import SaveRequest
from chongming_task.stores.memory import InMemoryTaskStore
from chongming_task.testing.contract._base import S, snap, step


class GatedStore(InMemoryTaskStore):
    """第一次 save 停在闸门上（让别的调用方排进同一批），记下每个事务写了哪些任务。"""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.transactions: list[list[str]] = []
        self.fail_batches = False

    def save(self, snapshot: TaskSnapshot, **kwargs: Any) -> None:
        if not self.entered.is_set():
            self.entered.set()
            assert self.gate.wait(10)
        self.transactions.append([snapshot.task_id])
        super().save(snapshot, **kwargs)

    def save_many(self, requests: Sequence[SaveRequest]) -> list[TaskError | None]:
        if self.fail_batches:
            raise StoreError("写事务失败（测试）")
        self.transactions.append([r.snapshot.task_id for r in requests])
        out: list[TaskError | None] = []
        for r in requests:
            try:
                super().save(r.snapshot, expect_version=r.expect_version, transitions=r.transitions)
            except TaskError as exc:
                out.append(exc)
            else:
                out.append(None)
        return out


def _queued(store: InMemoryTaskStore, task_id: str) -> tuple[SaveRequest, TaskSnapshot, Transition]:
    base = snap(task_id)
    store.create(base)
    queued, record = step(base, S.QUEUED)
    return SaveRequest(queued, 0, [record]), queued, record


def _save_each(store: InMemoryTaskStore, requests: Sequence[SaveRequest]) -> list[TaskError | None]:
    """测试存储的 save_many / write_many：逐项按内存存储的 save 写（不经子类的闸门与记账），
    逐项的错误按位置返回。"""
    out: list[TaskError | None] = []
    for r in requests:
        try:
            InMemoryTaskStore.save(
                store, r.snapshot, expect_version=r.expect_version, transitions=r.transitions
            )
        except TaskError as exc:
            out.append(exc)
        else:
            out.append(None)
    return out


def _join_all(threads: Iterable[threading.Thread]) -> None:
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive(), "调用方不能永远等下去"


def _run_followers(
    commits: GroupCommit, requests: list[SaveRequest]
) -> tuple[dict[str, object], list[threading.Thread]]:
    results: dict[str, object] = {}

    def call(request: SaveRequest) -> None:
        try:
            commits.save(request)
        except TaskError as exc:
            results[request.snapshot.task_id] = exc
        else:
            results[request.snapshot.task_id] = "committed"

    threads = [threading.Thread(target=call, args=(r,)) for r in requests]
    for thread in threads:
        thread.start()
    return results, threads


def _wait_pending(commits: GroupCommit, count: int) -> None:
    for _ in range(1000):
        with commits._lock:
            if len(commits._pending) >= count:
                return
        threading.Event().wait(0.005)
    raise AssertionError("调用方没有排进队列")


def _behind_a_stuck_leader(
    store: GatedStore, leader_request: SaveRequest, followers: list[SaveRequest]
) -> tuple[GroupCommit, dict[str, object], dict[str, object]]:
    """一个写者卡在闸门上（它自己的事务里），followers 全部排进队列，然后开闸。返回 (组提交, 写者的结果,
    排队者的结果)。排队者在开闸之前一个也不能返回：它们那一项还没提交。"""
    commits = GroupCommit(store, writers=1)
    leader, threads = _run_followers(commits, [leader_request])
    assert store.entered.wait(10)
    results, follower_threads = _run_followers(commits, followers)
    _wait_pending(commits, len(followers))
    assert results == {}, "自己那一项还没提交，调用方不能返回"
    store.gate.set()
    _join_all([*threads, *follower_threads])
    assert leader == {leader_request.snapshot.task_id: "committed"}
    return commits, leader, results


def test_pending_saves_share_one_transaction_and_each_caller_waits_for_its_own() -> None:
    store = GatedStore()
    leader_request, _, _ = _queued(store, "lead")
    others = [_queued(store, f"t{i}")[0] for i in range(4)]
    commits, _, follower_results = _behind_a_stuck_leader(store, leader_request, others)
    assert follower_results == dict.fromkeys(["t0", "t1", "t2", "t3"], "committed")
    assert [sorted(t) for t in store.transactions] == [["lead"], ["t0", "t1", "t2", "t3"]]
    assert (commits.batches, commits.items) == (2, 5)
    for task_id in ["lead", "t0", "t1", "t2", "t3"]:
        got = store.get(task_id)
        assert got is not None and got.status is TaskStatus.QUEUED
        assert [t.version for t in store.history(task_id)] == [1]


class CountingSleeps(GroupCommit):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sleeps: dict[str, int] = {}

    def _sleep_locked(self, item: Pending) -> None:
        assert item.request is not None
        task_id = item.request.snapshot.task_id
        self.sleeps[task_id] = self.sleeps.get(task_id, 0) + 1
        super()._sleep_locked(item)


class SlowBatches(GatedStore):
    """每个多项事务多花 50 ms：被错误叫醒的排队者有足够的时间醒来、发现还轮不到自己、再睡回去。"""

    def save_many(self, requests: Sequence[SaveRequest]) -> list[TaskError | None]:
        time.sleep(0.05)
        return super().save_many(requests)


def test_a_commit_wakes_only_its_own_callers_and_the_next_writer() -> None:
    """一次提交之后只叫醒这一批的调用方、外加一个接着当写者的排队者：排在后面几批的调用方一直睡着，
    不会每提交一批就全部醒来查一遍再睡回去（每个调用方只睡一次；与时序无关——慢事务只是让错误的
    全部叫醒一定露出来）。"""
    store = SlowBatches()
    leader_request, _, _ = _queued(store, "lead")
    others = [_queued(store, f"w{i}")[0] for i in range(6)]
    commits = CountingSleeps(store, writers=1, max_batch=2)
    leader, threads = _run_followers(commits, [leader_request])
    assert store.entered.wait(10)
    results, follower_threads = _run_followers(commits, others)
    _wait_pending(commits, len(others))
    store.gate.set()
    _join_all([*threads, *follower_threads])
    assert leader == {"lead": "committed"}
    assert results == {f"w{i}": "committed" for i in range(6)}
    # 排队的先后由线程调度决定：只看批次的形状（写者在前，之后三批各两项，每项恰好一次）
    assert store.transactions[0] == ["lead"] and [len(t) for t in store.transactions[1:]] == [2, 2, 2]
    assert sorted(x for t in store.transactions[1:] for x in t) == [f"w{i}" for i in range(6)]
    assert commits.sleeps == {f"w{i}": 1 for i in range(6)}, commits.sleeps


class HeldStore(InMemoryTaskStore):
    """内存存储（提交只要几微秒）；``hold()`` 之后的下一次写停在闸门上，记下每个事务写了哪些任务。"""

    def __init__(self) -> None:
        super().__init__()
        self.gate: threading.Event | None = None
        self.holding = threading.Event()
        self.transactions: list[list[str]] = []

    def hold(self) -> threading.Event:
        self.gate = threading.Event()
        self.holding.clear()
        return self.gate

    def _pass_gate(self) -> None:
        gate, self.gate = self.gate, None
        if gate is not None:
            self.holding.set()
            assert gate.wait(10)

    def save(self, snapshot: TaskSnapshot, **kwargs: Any) -> None:
        self._pass_gate()
        self.transactions.append([snapshot.task_id])
        super().save(snapshot, **kwargs)

    def save_many(self, requests: Sequence[SaveRequest]) -> list[TaskError | None]:
        self._pass_gate()
        self.transactions.append(sorted(r.snapshot.task_id for r in requests))
        return _save_each(self, requests)  # 不经 self.save：这一批已记成一个事务


class CountingWakes(CountingSleeps):
    """另记下一次提交叫醒了几个还没写完的排队者（"接着当写者"的那一下）。"""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.successor_wakes = 0

    def _wake(self, item: Pending) -> None:  # type: ignore[override]
        if not item.done and item.waiter is not None:
            self.successor_wakes += 1
        GroupCommit._wake(item)


def _short_commit_group(
    monkeypatch: pytest.MonkeyPatch, store: HeldStore, *, grace: float, short_commit: float
) -> CountingWakes:
    """给定宽限与"短提交"门槛的组提交，先写几次（内存存储的提交只要几微秒）：它量到的提交墙钟很短。"""
    monkeypatch.setattr(group_commit, "SUCCESSOR_GRACE", grace)
    monkeypatch.setattr(group_commit, "_SHORT_COMMIT", short_commit)
    commits = CountingWakes(store, writers=1)
    for i in range(3):
        commits.save(_queued(store, f"warm{i}")[0])
    assert commits._commit_seconds < group_commit._SHORT_COMMIT
    return commits


def _wait_asleep(commits: GroupCommit, task_id: str) -> Pending:
    for _ in range(1000):
        with commits._lock:
            for item in commits._pending:
                if item.request is not None and item.request.snapshot.task_id == task_id and item.waiter:
                    return item
        threading.Event().wait(0.002)
    raise AssertionError(f"{task_id} 没有排进队列睡下")


def test_after_a_short_commit_the_queued_caller_is_not_woken_and_leads_by_itself_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """提交一向很短时，一次提交之后不叫醒还没被捎走的排队者（它要等 GIL、回来的写者多半已捎走它，白醒一次）；
    没人回来时它自己到点醒来当写者。旧做法在这里叫醒它（successor_wakes == 1）。宽限放大到 0.5 秒：开闸
    之前它不会先到点（与机器负载无关）。"""
    store = HeldStore()
    commits = _short_commit_group(monkeypatch, store, grace=0.5, short_commit=0.25)
    gate = store.hold()
    leader, leader_threads = _run_followers(commits, [_queued(store, "lead")[0]])
    assert store.holding.wait(10)
    follower, follower_threads = _run_followers(commits, [_queued(store, "w")[0]])
    _wait_asleep(commits, "w")
    started = time.monotonic()
    gate.set()
    _join_all([*leader_threads, *follower_threads])
    assert leader == {"lead": "committed"} and follower == {"w": "committed"}
    assert commits.successor_wakes == 0
    assert commits.sleeps["w"] == 1  # 定时睡一次，醒来时没有写者在写：自己当写者
    assert store.transactions[-2:] == [["lead"], ["w"]]
    assert time.monotonic() - started < 5


def test_the_writer_coming_back_takes_the_queued_item_and_its_caller_sleeps_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """逐个 submit 的形状：写者（提交线程）提交完马上带着下一项回来，把提交期间排进来的项捎进自己的下一批；
    那个排队者只睡一次、只被它自己那一批叫醒。宽限放大到 5 秒，与线程调度无关。"""
    store = HeldStore()
    commits = _short_commit_group(monkeypatch, store, grace=5.0, short_commit=2.5)
    first, second, queued = _queued(store, "lead1")[0], _queued(store, "lead2")[0], _queued(store, "w")[0]
    gate = store.hold()
    outcome: list[str] = []

    def submitter() -> None:
        commits.save(first)
        commits.save(second)
        outcome.append("done")

    thread = threading.Thread(target=submitter)
    thread.start()
    assert store.holding.wait(10)
    follower, follower_threads = _run_followers(commits, [queued])
    _wait_asleep(commits, "w")
    gate.set()
    _join_all([thread, *follower_threads])
    assert outcome == ["done"] and follower == {"w": "committed"}
    assert store.transactions[-2:] == [["lead1"], ["lead2", "w"]]
    assert commits.successor_wakes == 0
    assert commits.sleeps["w"] == 1


def test_a_queued_caller_whose_grace_ends_during_a_long_commit_waits_for_that_commit_to_wake_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """宽限到点时写者还在写（这次提交比平常长）：排队者改为不定时睡，由那次提交叫醒、接着当写者——定时醒来
    至多一次，不在长提交里每隔一个宽限空转一次（到点之后提交又停了 10 个宽限，它只睡了两次）。"""
    store = HeldStore()
    commits = _short_commit_group(monkeypatch, store, grace=0.05, short_commit=0.025)
    gate = store.hold()
    leader, leader_threads = _run_followers(commits, [_queued(store, "lead")[0]])
    assert store.holding.wait(10)
    follower, follower_threads = _run_followers(commits, [_queued(store, "w")[0]])
    item = _wait_asleep(commits, "w")
    for _ in range(1000):
        if item.patient:
            break
        threading.Event().wait(0.002)
    assert item.patient
    threading.Event().wait(0.5)  # 再停 10 个宽限：不定时睡着，不会每个宽限醒一次
    assert follower == {} and commits.sleeps["w"] == 2
    gate.set()
    _join_all([*leader_threads, *follower_threads])
    assert leader == {"lead": "committed"} and follower == {"w": "committed"}
    assert commits.successor_wakes == 1  # 那次提交叫醒了它
    assert commits.sleeps["w"] == 2
    assert store.transactions[-2:] == [["lead"], ["w"]]


class HookedStore(HeldStore):
    """提交之前调用 ``commit_hooks.before_commit()`` 的存储（``calls_before_commit``，与 SQLite 相同）；记下
    每次调用时刚写的是哪个事务。"""

    calls_before_commit = True

    def __init__(self) -> None:
        super().__init__()
        self.hooked: list[list[str]] = []

    def _before_commit(self) -> None:
        self.hooked.append(self.transactions[-1])
        commit_hooks.before_commit()

    def save(self, snapshot: TaskSnapshot, **kwargs: Any) -> None:
        super().save(snapshot, **kwargs)
        self._before_commit()

    def save_many(self, requests: Sequence[SaveRequest]) -> list[TaskError | None]:
        out = super().save_many(requests)
        self._before_commit()
        return out


def _carried_by_the_writer(
    store: HookedStore, commits: GroupCommit
) -> tuple[dict[str, object], list[threading.Thread], dict[str, list[list[str]]]]:
    """提交线程的形状：写者写 lead1 时 w 排进来睡下，写者带着 lead2 回来把 w 捎进自己的下一批。返回 w 的结果、
    要 join 的线程、w 返回那一刻存储已调用过回调的事务（``hooked`` 的复制）。"""
    first, second, queued = _queued(store, "lead1")[0], _queued(store, "lead2")[0], _queued(store, "w")[0]
    gate = store.hold()
    writer_done = threading.Event()

    def writer() -> None:
        commits.save(first)
        commits.save(second)
        writer_done.set()

    results: dict[str, object] = {}
    seen_at_return: dict[str, list[list[str]]] = {}

    def follower() -> None:
        commits.save(queued)
        seen_at_return["w"] = list(store.hooked)
        results["w"] = "committed"

    threads = [threading.Thread(target=writer), threading.Thread(target=follower)]
    threads[0].start()
    assert store.holding.wait(10)
    threads[1].start()
    _wait_asleep(commits, "w")
    gate.set()
    assert writer_done.wait(10)
    assert store.transactions[-2:] == [["lead1"], ["lead2", "w"]]
    return results, threads, seen_at_return


def test_a_carried_caller_is_woken_just_before_the_next_transaction_commits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """存储在 COMMIT 之前调用回调时，写完 w 的那次提交不叫醒 w（写者线程接下来持着 GIL 跑 Python，w 醒来
    只能在 GIL 上再睡一次），由下一个写事务在它的 COMMIT 之前叫醒。w 那一项早已提交；它只睡一次，醒在
    lead3 那个事务的回调里。旧做法在 lead2 + w 提交之后立刻叫醒它。宽限放大到 5 秒：w 不会先到点自己醒。"""
    store = HookedStore()
    commits = _short_commit_group(monkeypatch, store, grace=5.0, short_commit=2.5)
    results, threads, seen_at_return = _carried_by_the_writer(store, commits)
    threading.Event().wait(0.2)
    assert results == {}, "推迟叫醒：下一个写事务之前 w 还睡着"
    commits.save(_queued(store, "lead3")[0])
    _join_all(threads)
    assert results == {"w": "committed"}
    assert seen_at_return["w"][-1] == ["lead3"], "w 由 lead3 那个事务 COMMIT 之前的回调叫醒"
    assert commits.sleeps["w"] == 1


def test_a_carried_caller_whose_wake_was_deferred_wakes_by_itself_if_no_transaction_follows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """推迟叫醒之后再没有写事务（提交线程不再提交）：w 到自己的定时点醒来、发现那一项已写完、返回——不会一直
    睡下去，也只睡一次。"""
    store = HookedStore()
    commits = _short_commit_group(monkeypatch, store, grace=0.3, short_commit=0.15)
    results, threads, _ = _carried_by_the_writer(store, commits)
    _join_all(threads)
    assert results == {"w": "committed"}
    assert commits.sleeps["w"] == 1
    assert commits._deferred == [] or all(item.waiter is None for item in commits._deferred)


def test_a_store_without_the_commit_hook_wakes_carried_callers_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """存储不调用回调（``calls_before_commit`` 为假，Postgres 与第三方后端的默认）：写完就叫醒，不推迟——否则
    没人会在下一个 COMMIT 之前叫醒它，每个被捎带的调用方都要睡满宽限。"""
    store = HookedStore()
    store.calls_before_commit = False  # type: ignore[misc]
    commits = _short_commit_group(monkeypatch, store, grace=5.0, short_commit=2.5)
    results, threads, _ = _carried_by_the_writer(store, commits)
    _join_all(threads)
    assert results == {"w": "committed"}
    assert commits.sleeps["w"] == 1


def test_a_conflict_is_reported_to_its_own_caller_only() -> None:
    store = GatedStore()
    leader_request, _, _ = _queued(store, "lead")
    good = _queued(store, "good")[0]
    stale_request, stale_queued, _ = _queued(store, "stale")
    # 别人抢先写了（绕过闸门直接写）
    InMemoryTaskStore.save(store, stale_queued, expect_version=0, transitions=stale_request.transitions)
    store.transactions.clear()
    _, _, follower_results = _behind_a_stuck_leader(store, leader_request, [good, stale_request])
    assert follower_results["good"] == "committed"
    assert isinstance(follower_results["stale"], ConcurrencyConflict)
    assert [t.version for t in store.history("stale")] == [1]


def test_a_failed_batch_fails_every_member_like_a_failed_save() -> None:
    store = GatedStore()
    store.fail_batches = True
    leader_request, _, _ = _queued(store, "lead")
    others = [_queued(store, f"f{i}")[0] for i in range(3)]
    _, _, follower_results = _behind_a_stuck_leader(store, leader_request, others)
    assert set(follower_results) == {"f0", "f1", "f2"}
    assert all(isinstance(error, StoreError) for error in follower_results.values())
    for task_id in follower_results:
        assert store.history(task_id) == [], "没提交的项在存储里什么也没有"


class GatedMixedStore(GatedStore):
    """GatedStore，另能把 create 与 save 合进一个事务（write_many）；write_many 也记下它写了哪些任务。"""

    group_commit_creates = True

    def write_many(
        self, creates: Sequence[tuple[TaskSnapshot, Sequence[Transition]]], saves: Sequence[SaveRequest]
    ) -> tuple[list[TaskError | None], list[TaskError | None]]:
        if self.fail_batches:
            raise StoreError("写事务失败（测试）")
        self.transactions.append([s.task_id for s, _ in creates] + [r.snapshot.task_id for r in saves])
        created = InMemoryTaskStore.create_many(self, creates)
        # 绕过 GatedStore.save（闸门、逐项记账）：这一批已记成一个事务
        return created, _save_each(self, saves)


def _run_creators(
    commits: GroupCommit, snapshots: list[TaskSnapshot]
) -> tuple[dict[str, object], list[threading.Thread]]:
    results: dict[str, object] = {}

    def call(snapshot: TaskSnapshot) -> None:
        try:
            commits.create(snapshot, ())
        except TaskError as exc:
            results[snapshot.task_id] = exc
        else:
            results[snapshot.task_id] = "committed"

    threads = [threading.Thread(target=call, args=(s,)) for s in snapshots]
    for thread in threads:
        thread.start()
    return results, threads


def _mixed_behind_a_stuck_leader(
    store: GatedMixedStore, creates: list[TaskSnapshot], saves: list[SaveRequest]
) -> tuple[dict[str, object], dict[str, object]]:
    """一个写者卡在闸门上，几个 create 与几个 save 排进队列，然后开闸。返回 (create 的结果, save 的结果)。"""
    leader_request, _, _ = _queued(store, "lead")
    store.transactions.clear()
    commits = GroupCommit(store, writers=1)
    _, threads = _run_followers(commits, [leader_request])
    assert store.entered.wait(10)
    saved, save_threads = _run_followers(commits, saves)
    _wait_pending(commits, len(saves))
    created, create_threads = _run_creators(commits, creates)
    _wait_pending(commits, len(saves) + len(creates))
    assert created == {} and saved == {}, "自己那一项还没提交，调用方不能返回"
    store.gate.set()
    _join_all([*threads, *save_threads, *create_threads])
    return created, saved


def test_a_create_rides_in_the_same_transaction_as_the_pending_saves() -> None:
    """单个提交的 create 排在组提交里（存储能把混合批写成一个事务时）：与排着的 save 同一个事务，
    每个调用方仍只在自己那一项提交之后返回。"""
    store = GatedMixedStore()
    saves = [_queued(store, f"s{i}")[0] for i in range(2)]
    created, saved = _mixed_behind_a_stuck_leader(store, [snap("c0"), snap("c1")], saves)
    assert created == {"c0": "committed", "c1": "committed"}
    assert saved == {"s0": "committed", "s1": "committed"}
    assert [sorted(t) for t in store.transactions] == [["lead"], ["c0", "c1", "s0", "s1"]]
    for task_id in ["c0", "c1"]:
        assert store.get(task_id) is not None


def test_a_duplicate_create_in_a_mixed_batch_is_refused_alone() -> None:
    store = GatedMixedStore()
    store.create(snap("taken", label="original"))
    saves = [_queued(store, "s0")[0]]
    created, saved = _mixed_behind_a_stuck_leader(store, [snap("taken", label="impostor"), snap("ok")], saves)
    assert isinstance(created["taken"], DuplicateTaskId)
    assert created["ok"] == "committed" and saved == {"s0": "committed"}
    got = store.get("taken")
    assert got is not None and got.label == "original"


def test_a_failed_mixed_batch_fails_the_create_like_a_failed_create() -> None:
    store = GatedMixedStore()
    saves = [_queued(store, "s0")[0]]
    store.fail_batches = True
    created, saved = _mixed_behind_a_stuck_leader(store, [snap("c0")], saves)
    assert isinstance(created["c0"], StoreError) and isinstance(saved["s0"], StoreError)
    assert store.get("c0") is None, "没提交的 create 在存储里什么也没有"


class ShortMixedStore(GatedMixedStore):
    """坏掉的第三方 write_many：少返回一个 create 的结果。"""

    def write_many(
        self, creates: Sequence[tuple[TaskSnapshot, Sequence[Transition]]], saves: Sequence[SaveRequest]
    ) -> tuple[list[TaskError | None], list[TaskError | None]]:
        created, saved = super().write_many(creates, saves)
        return created[:-1], saved


def test_a_write_many_with_the_wrong_number_of_results_fails_the_batch_instead_of_hanging() -> None:
    store = ShortMixedStore()
    created, saved = _mixed_behind_a_stuck_leader(store, [snap("c0")], [_queued(store, "s0")[0]])
    assert isinstance(created["c0"], StoreError) and isinstance(saved["s0"], StoreError)


class OneWriterMixedStore(GatedMixedStore):
    """像 SQLite 那样一次一个写者、create 也经组提交的内存存储（写穿因此经组提交，而不是直接 save）。"""

    group_commit = True
    group_commit_writers = 1


def test_submit_writes_its_create_through_the_group_commit_when_the_store_asks_for_it() -> None:
    """Controller.submit 的 create 在存储设了 group_commit_creates 时经组提交：另一个任务的 starting 卡在
    事务里时，新提交的 create 排在它后面、与它之后排着的写同一批提交；submit 在那之前不返回。"""
    store = OneWriterMixedStore()
    with Controller(max_parallel=2, store=store) as c:
        c.register("noop", noop)
        first = threading.Thread(target=c.submit, args=("noop",), kwargs={"task_id": "first"})
        first.start()  # 提交线程就地启动它：starting 卡在闸门上（GatedStore 的第一次 save）
        assert store.entered.wait(10)
        second: list[object] = []
        submitter = threading.Thread(target=lambda: second.append(c.submit("noop", task_id="second")))
        submitter.start()
        commits = c._link._write.commits  # type: ignore[attr-defined]
        _wait_pending(commits, 1)  # 它的 create 排在组提交的队列里（不是直接 create）
        assert second == [] and store.get("second") is None, "create 还没提交，submit 不能返回"
        store.gate.set()
        _join_all((first, submitter))
        assert c.wait_all(timeout=10)
    assert [t.to_status for t in store.history("second")] == [S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED]


def noop(ctx: Any, x: int = 0) -> int:
    return x


class CountingSqlite(SqliteTaskStore):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.create_batches: list[int] = []
        self.single_creates = 0

    def create_many(
        self, items: Sequence[tuple[TaskSnapshot, Sequence[Transition]]]
    ) -> list[TaskError | None]:
        self.create_batches.append(len(items))
        return super().create_many(items)

    def create(self, snapshot: TaskSnapshot, transitions: Sequence[Transition] = ()) -> None:
        self.single_creates += 1
        super().create(snapshot, transitions)


def test_submit_many_writes_one_transaction_per_batch_and_runs_everything(tmp_path: Path) -> None:
    store = CountingSqlite(str(tmp_path / "t.db"))
    with Controller(max_parallel=2, store=store) as c:
        c.register("noop", noop)
        runs = c.submit_many(
            [Submit("noop", i, task_id=f"m{i}", label="batch") for i in range(25)], batch_size=10
        )
        assert [r.task_id for r in runs] == [f"m{i}" for i in range(25)]
        assert c.wait_all(timeout=30)
        assert [r.wait(timeout=5).value for r in runs] == list(range(25))
        assert store.create_batches == [10, 10, 5] and store.single_creates == 0
        for i in range(25):
            got = store.get(f"m{i}")
            assert got is not None and got.status is TaskStatus.SUCCEEDED and got.label == "batch"
            history = store.history(f"m{i}")
            assert [t.version for t in history] == list(range(1, len(history) + 1)), "历史不能有空洞"


def test_submit_many_checks_everything_before_writing(tmp_path: Path) -> None:
    store = CountingSqlite(str(tmp_path / "t.db"))
    with Controller(max_parallel=2, store=store) as c:
        c.register("noop", noop)
        with pytest.raises(DuplicateTaskId):
            c.submit_many([Submit("noop", task_id="same"), Submit("noop", task_id="same")])
        with pytest.raises(ConfigurationError, match="不是 Submit"):
            c.submit_many([Submit("noop"), ("noop",)])  # type: ignore[list-item]
        with pytest.raises(ConfigurationError):
            c.submit_many([Submit("noop"), Submit("unregistered")])
        assert store.create_batches == [] and store.query() == []


def test_submit_many_stops_at_a_store_duplicate_but_keeps_what_was_written(tmp_path: Path) -> None:
    path = str(tmp_path / "t.db")
    with Controller(store=SqliteTaskStore(path), owner="other") as other:
        other.register("noop", noop)
        other.submit("noop", task_id="taken").wait(timeout=10)
    with Controller(max_parallel=2, store=SqliteTaskStore(path)) as c:
        c.register("noop", noop)
        specs = [Submit("noop", task_id=t) for t in ["a", "taken", "b", "c"]]
        with pytest.raises(DuplicateTaskId, match="批量提交已停止：3 个任务已提交"):
            c.submit_many(specs, batch_size=4)
        assert c.wait_all(timeout=10)
        assert sorted(s.task_id for s in c.list_tasks() if s.owner != "other") == ["a", "b", "c"]


def test_pipeline_nodes_are_created_in_one_transaction(tmp_path: Path) -> None:
    from chongming_task import Pipeline

    store = CountingSqlite(str(tmp_path / "t.db"))
    with Controller(max_parallel=2, store=store) as c:
        c.register("noop", noop)
        p = Pipeline("etl")
        first = p.node("noop", node_id="a")
        p.node("noop", node_id="b", depends_on=[first])
        p.node("noop", node_id="c", depends_on=[first])
        run = c.submit_pipeline(p)
        run.wait(timeout=30)
        assert store.create_batches == [3] and store.single_creates == 0


class ShortStore(GatedStore):
    """坏掉的第三方 save_many：少返回一个结果。"""

    def save_many(self, requests: Sequence[SaveRequest]) -> list[TaskError | None]:
        return super().save_many(requests)[:-1]


def test_a_save_many_with_the_wrong_number_of_results_fails_the_batch_instead_of_hanging() -> None:
    store = ShortStore()
    leader_request, _, _ = _queued(store, "lead")
    others = [_queued(store, f"s{i}")[0] for i in range(2)]
    _, _, follower_results = _behind_a_stuck_leader(store, leader_request, others)
    assert all(isinstance(follower_results[k], StoreError) for k in ("s0", "s1"))


class BarrierStore(InMemoryTaskStore):
    """save 在一个两方屏障上等：两次 save 不是同时进行就会超时失败。"""

    def __init__(self) -> None:
        super().__init__()
        self.barrier = threading.Barrier(2, timeout=10)

    def save(self, snapshot: TaskSnapshot, **kwargs: Any) -> None:
        self.barrier.wait()
        super().save(snapshot, **kwargs)


def test_two_writers_commit_side_by_side_instead_of_queueing() -> None:
    """能并发提交的存储（group_commit_writers > 1）：两个线程同时写时并行提交，组提交不把它们排成一队。"""
    store = BarrierStore()
    assert store.group_commit_writers >= 2
    commits = GroupCommit(store)
    requests = [_queued(store, f"p{i}")[0] for i in range(2)]
    results, threads = _run_followers(commits, requests)
    for thread in threads:
        thread.join(15)
    assert results == {"p0": "committed", "p1": "committed"}
    assert commits.batches == 2


def test_sqlite_group_commit_has_one_writer(tmp_path: Path) -> None:
    store = SqliteTaskStore(str(tmp_path / "one.db"))
    try:
        assert store.group_commit_writers == 1
    finally:
        store.close()


class FlakyBatchStore(InMemoryTaskStore):
    """create_many 抛 StoreError（结果未知）；committed=True 时其实已经写进去了（回执丢了）。"""

    def __init__(self, *, committed: bool, readable: bool) -> None:
        super().__init__()
        self.committed = committed
        self.readable = readable
        self.reads = 0

    def create_many(
        self, items: Sequence[tuple[TaskSnapshot, Sequence[Transition]]]
    ) -> list[TaskError | None]:
        if self.committed:
            super().create_many(items)
        raise StoreError("连接在提交中途断了（测试）")

    def get(self, task_id: str) -> TaskSnapshot | None:
        self.reads += 1
        if not self.readable:
            raise StoreError("存储不可用（测试）")
        return super().get(task_id)


def test_submit_many_after_a_lost_reply_reads_back_and_keeps_what_was_written() -> None:
    store = FlakyBatchStore(committed=True, readable=True)
    with Controller(max_parallel=2, store=store) as c:
        c.register("noop", noop)
        runs = c.submit_many([Submit("noop", i, task_id=f"lost-{i}") for i in range(5)])
        assert c.wait_all(timeout=10)
        assert [r.wait(timeout=5).value for r in runs] == list(range(5))
        assert len(c.persist_failures) == 5, "回执丢了也要如实记下"


def test_submit_many_while_the_store_is_down_refuses_without_reading_back_every_task() -> None:
    store = FlakyBatchStore(committed=False, readable=False)
    with Controller(max_parallel=2, store=store) as c:
        c.register("noop", noop)
        with pytest.raises(StoreError, match="批量提交已停止：0 个任务已提交"):
            c.submit_many([Submit("noop", task_id=f"down-{i}") for i in range(50)])
        assert store.reads == 1, "读不到一次之后其余不再逐个去撞"
        assert c.list_tasks() == []


class TouchCounting(InMemoryTaskStore):
    def __init__(self) -> None:
        super().__init__()
        self.touch_batches: list[int] = []
        self.renew_batches: list[int] = []

    def touch_many(self, updates: Sequence[tuple[str, dict[str, Any]]]) -> None:
        self.touch_batches.append(len(updates))
        super().touch_many(updates)

    def _renew_leases(self, lease_owner: str, task_ids: frozenset[str], lease_until: Any) -> None:
        self.renew_batches.append(len(task_ids))
        super()._renew_leases(lease_owner, task_ids, lease_until)


def test_lease_renewal_of_many_queued_tasks_is_written_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """十万个排队任务续一次租：只需续租的任务走 ``renew_leases``（一批一条语句、同一组值），不逐个造字段
    字典走 touch_many；也不能是一个十万行的语句（会超过一次调用的时限、租约随之过期）：按 RENEW_BATCH 分批。
    进度变了的任务照旧走 touch_many，租约与进度一起写。"""
    from chongming_task.core.state_machine import StateMachine
    from chongming_task.models import Progress
    from chongming_task.runtime import persistence
    from chongming_task.runtime.persistence import WriteThrough
    from chongming_task.testing import FakeClock

    monkeypatch.setattr(persistence, "RENEW_BATCH", 100)
    clock = FakeClock()
    store = TouchCounting()
    write = WriteThrough(store, owner="node-a", lease_ttl=30, clock=clock)
    machines = [StateMachine.create(f"q{i}", "noop", clock=clock) for i in range(2 * 100 + 6)]
    assert write.create_many(machines) == [None] * len(machines)
    clock.advance(20)
    moving = machines[-1].snapshot.evolve(progress=Progress(done=1, total=2))
    write.flush_side_channel([m.snapshot for m in machines[:-1]] + [moving], renew_lease=True)
    assert store.renew_batches == [100, 100, 5]
    assert store.touch_batches == [1], "只有进度变了的那一个走 touch_many"
    for task_id in ("q0", f"q{len(machines) - 1}"):
        got = store.get(task_id)
        assert got is not None and got.lease_owner == "node-a"
        assert got.lease_until == clock.now() + timedelta(seconds=30)
    moved = store.get(f"q{len(machines) - 1}")
    assert moved is not None and moved.progress == Progress(done=1, total=2)
    got = store.get("q0")
    assert got is not None and got.lease_until == clock.now() + timedelta(seconds=30)


def test_create_many_keeps_the_submit_time_lease_until_the_node_renews() -> None:
    """提交时带上的租约（``lease_fields``）原样写进存储，只要它不短于本节点自己认定的租约——十万个任务的
    submit_many 先造完全部任务、几秒后才逐批落库，不该为每个任务再复制一份快照。续过一次租之后（本节点
    认定的租约变长了）、或本节点的租约已过期时，换上新租约：存储里的租约不能比本节点以为的短。"""
    from chongming_task.core.state_machine import StateMachine
    from chongming_task.runtime.persistence import WriteThrough
    from chongming_task.testing import FakeClock

    clock = FakeClock()
    store = InMemoryTaskStore()
    write = WriteThrough(store, owner="node-a", lease_ttl=30, clock=clock)
    submitted_at = clock.now()

    def machines(prefix: str, **fields: Any) -> list[StateMachine]:
        return [
            StateMachine.create(f"{prefix}{i}", "noop", clock=clock, **{**write.lease_fields(), **fields})
            for i in range(3)
        ]

    early = machines("early-")
    foreign = machines("foreign-", lease_owner="node-b")
    clock.advance(5)  # 比"一秒之内"旧，但本节点还没续过租
    kept = [m.snapshot for m in early]
    assert write.create_many(early + foreign) == [None] * 6
    for machine, snapshot in zip(early, kept, strict=True):
        assert machine.snapshot is snapshot, "租约够用：不复制快照"
        got = store.get(machine.task_id)
        assert got is not None and got.lease_until == submitted_at + timedelta(seconds=30)
    for machine in foreign:
        got = store.get(machine.task_id)
        assert got is not None and got.lease_owner == "node-a"
        assert got.lease_until == clock.now() + timedelta(seconds=30)

    stale = machines("stale-")
    clock.advance(5)
    write.flush_side_channel([m.snapshot for m in early], renew_lease=True)  # 本节点认定的租约延到 t+40
    assert write.create_many(stale) == [None] * 3
    for machine in stale:
        got = store.get(machine.task_id)
        assert got is not None and got.lease_until == clock.now() + timedelta(seconds=30)

    late = machines("late-")
    clock.advance(31)  # 一直没续上：本节点的租约已过期，只认一秒之内算出的租约
    assert write.create_many(late) == [None] * 3
    for machine in late:
        got = store.get(machine.task_id)
        assert got is not None and got.lease_until == clock.now() + timedelta(seconds=30)


def test_the_node_never_believes_its_lease_longer_than_the_one_it_wrote() -> None:
    """续租一轮要先走一遍全部在管任务（十万个时几十毫秒）：本节点相信的租约从这一轮开始算，不从循环之后算，
    否则它会比写进存储的 lease_until 多信循环那么久（别的节点按存储里的值判它过期）。"""
    from collections.abc import Iterator

    from chongming_task.core.state_machine import StateMachine
    from chongming_task.runtime.persistence import WriteThrough
    from chongming_task.stores.memory import InMemoryTaskStore
    from chongming_task.testing import FakeClock

    clock = FakeClock()
    store = InMemoryTaskStore()
    write = WriteThrough(store, owner="node-a", lease_ttl=30, clock=clock)
    machines = [StateMachine.create(f"t{i}", "noop", clock=clock) for i in range(5)]
    assert write.create_many(machines) == [None] * len(machines)
    clock.advance(20)

    class SlowToWalk(list[Any]):
        """每走过一个任务，时间过去 1 秒（把循环的耗时放大到看得见）。"""

        def __iter__(self) -> Iterator[Any]:
            for item in super().__iter__():
                clock.advance(1)
                yield item

    renewed_at = clock.now()
    write.flush_side_channel(SlowToWalk(m.snapshot for m in machines), renew_lease=True)
    written = store.get("t0")
    assert written is not None and written.lease_until is not None
    assert written.lease_until == renewed_at + timedelta(seconds=30)
    believed_until = clock.now() + timedelta(seconds=write.lease.valid_for(clock.monotonic()))
    assert believed_until <= written.lease_until, (believed_until, written.lease_until)
