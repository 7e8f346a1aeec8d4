"""契约用例：持久任务（issue 19）：配方随 create 原样落库、save 从不改写它；``claim_queued`` 的判据、
顺序、数量与原子性（多线程争抢时每个任务只被取走一次）；``claim_queued(..., start=...)`` 认领的同时
写下与状态机 ``mark_starting`` 一模一样的 starting（快照字段与迁移记录），状态机不让开始的只认领；
``ClaimStart(save=...)`` 的 save 与认领同一次提交、以 save 写成为前提（写不成什么也不写），认领扑空时
save 照样提交。"""

from __future__ import annotations

import functools
import threading
from datetime import timedelta

from chongming_task.core.recipes import OnLost, Recipe
from chongming_task.core.storage.claiming import ClaimStart
from chongming_task.core.triggers import TRIGGER_STARTING
from chongming_task.errors import ConcurrencyConflict, ConfigurationError, TaskNotFound
from chongming_task.models import TaskSnapshot
from chongming_task.storage import SaveRequest, TaskQuery, TaskStore
from chongming_task.testing.contract._base import T0, TZ_SHANGHAI, ContractBase, S, snap, step

LEASE = T0 + timedelta(seconds=30)


def recipe(name: str = "contract-task", **changes: object) -> Recipe:
    fields: dict[str, object] = {
        "name": name,
        "args": (1, 2.0, "三", [True, None], {"k": [1.5, 2**63 + 1]}),
        "kwargs": {"租户": "甲", "limit": 0, "ratio": 1.0, "flags": {}, "items": []},
        "max_attempts": 3,
        "timeout": {"start": None, "per_attempt": 60.0, "idle": 5.5},
        "tags": ("io", "夜间"),
        "priority": 2,
        "bucket_key": "tenant-甲",
        "on_lost": OnLost.RETRY,
    }
    fields.update(changes)
    return Recipe(**fields)  # type: ignore[arg-type]


def durable(task_id: str, *, seconds: int = 0, **fields: object) -> TaskSnapshot:
    """一个待认领的持久任务：queued、无人持有、带配方。"""
    values: dict[str, object] = {"status": S.QUEUED, "status_version": 1, "recipe": recipe()}
    values.update(fields)
    at = values.pop("created_at", T0 + timedelta(seconds=seconds))
    return snap(task_id, at=at, **values)  # type: ignore[arg-type]


class DurableCases(ContractBase):
    """持久任务：配方与认领。"""

    # -- recipes ------------------------------------------------------------------------------------

    def test_recipe_round_trips_exactly(self) -> None:
        store = self.open_store()
        want = recipe()
        store.create(durable("d-1", recipe=want))
        for got in (store.get("d-1"), *store.query()):
            assert got is not None and got.recipe is not None
            self.assertEqual(got.recipe, want)  # Recipe 的相等连类型一起比：1 与 1.0 不同
            self.assertIs(type(got.recipe.args[1]), float, "2.0 读回必须仍是 float")
            self.assertIs(type(got.recipe.kwargs["limit"]), int, "0 读回必须仍是 int")
            self.assertEqual(got.recipe.args[4], {"k": [1.5, 2**63 + 1]})
            self.assertIs(got.recipe.on_lost, OnLost.RETRY)
            self.assertTrue(got.durable)

    def test_task_without_recipe_reads_back_none(self) -> None:
        store = self.open_store()
        store.create(snap("plain"))
        got = store.get("plain")
        assert got is not None
        self.assertIsNone(got.recipe)
        self.assertFalse(got.durable)

    def test_query_and_stats_filter_by_durable(self) -> None:
        store = self.open_store()
        store.create(durable("d-a", seconds=1))
        store.create(snap("plain-b", at=T0 + timedelta(seconds=2)))
        store.create(durable("d-c", seconds=3, status=S.FAILED, status_version=2))
        store.create(snap("plain-d", at=T0 + timedelta(seconds=4), status=S.FAILED, status_version=1))

        def ids(query: TaskQuery) -> list[str]:
            return [s.task_id for s in store.query(query)]

        self.assertEqual(ids(TaskQuery(durable=True)), ["d-c", "d-a"])
        self.assertEqual(ids(TaskQuery(durable=False)), ["plain-d", "plain-b"])
        self.assertEqual(len(ids(TaskQuery(durable=None))), 4)
        self.assertEqual(ids(TaskQuery(durable=True, statuses=frozenset({S.FAILED}))), ["d-c"])
        self.assertEqual(ids(TaskQuery(durable=False, limit=1)), ["plain-d"])
        self.assertEqual(store.stats(TaskQuery(durable=True)).total, 2)
        self.assertEqual(store.stats(TaskQuery(durable=False, statuses=frozenset({S.FAILED}))).total, 1)
        with self.assertRaises(ConfigurationError):
            TaskQuery(durable="yes")  # type: ignore[arg-type]

    def test_query_and_stats_filter_by_awaiting_claim(self) -> None:
        """``awaiting_claim`` 与 ``awaits_claim`` 逐条一致：只有 queued + 配方 + 无人持有三者同时成立才算。"""
        store = self.open_store()
        store.create(durable("await-a", seconds=1))
        store.create(durable("held-b", seconds=2, owner="node-1"))  # 有持有者
        store.create(durable("paused-c", seconds=3, status=S.PAUSED, status_version=2))  # 不是 queued
        store.create(snap("plain-d", at=T0 + timedelta(seconds=4), status=S.QUEUED, status_version=1))
        store.create(durable("await-e", seconds=5, bucket=3))

        def ids(query: TaskQuery) -> list[str]:
            return [s.task_id for s in store.query(query)]

        self.assertEqual(ids(TaskQuery(awaiting_claim=True)), ["await-e", "await-a"])
        self.assertEqual(ids(TaskQuery(awaiting_claim=False)), ["plain-d", "paused-c", "held-b"])
        self.assertEqual(len(ids(TaskQuery(awaiting_claim=None))), 5)
        self.assertEqual(ids(TaskQuery(awaiting_claim=True, bucket=3)), ["await-e"])
        self.assertEqual(ids(TaskQuery(awaiting_claim=False, durable=True)), ["paused-c", "held-b"])
        self.assertEqual(store.stats(TaskQuery(awaiting_claim=True)).total, 2)
        self.assertEqual(
            store.stats(TaskQuery(awaiting_claim=False, statuses=frozenset({S.QUEUED}))).total, 2
        )
        self.assertEqual(sum(store.bucket_counts(TaskQuery(awaiting_claim=True)).values()), 1)
        with self.assertRaises(ConfigurationError):
            TaskQuery(awaiting_claim=1)  # type: ignore[arg-type]

    def test_save_never_rewrites_the_recipe(self) -> None:
        store = self.open_store()
        original = recipe()
        base = durable("d-keep", recipe=original, status=S.PENDING, status_version=0)
        store.create(base)
        queued, record = step(base, S.QUEUED, recipe=None)  # 调用方手里那份丢了配方
        store.save(queued, expect_version=0, transitions=[record])
        started, record = step(queued, S.STARTING, recipe=recipe(args=(99,)))
        store.save(started, expect_version=1, transitions=[record])
        got = store.get("d-keep")
        assert got is not None
        self.assertEqual(got.status, S.STARTING)
        self.assertEqual(got.recipe, original, "配方只由 create 写入：save 不能清掉或改写它")

    # -- claim_queued -------------------------------------------------------------------------------

    def test_claim_takes_priority_then_fifo_and_only_limit(self) -> None:
        self._check_priority_then_fifo(None)

    def test_claim_and_start_takes_priority_then_fifo_and_only_limit(self) -> None:
        """认领并开始是另一条写法（PostgreSQL 上是另一条语句）：顺序与数量的规矩一条不少。"""
        self._check_priority_then_fifo(ClaimStart(at=LEASE, executor="thread"))

    def _check_priority_then_fifo(self, start: ClaimStart | None) -> None:
        store = self.open_store()
        claim = functools.partial(store.claim_queued, names=["contract-task"], lease_until=LEASE, start=start)
        store.create(durable("low-old", seconds=0, priority=0))
        store.create(durable("high-new", seconds=9, priority=5))
        store.create(durable("low-new", seconds=5, priority=0))
        store.create(durable("high-old", seconds=1, priority=5))
        # 同一时刻、不同时区写法：按时刻排，再按 task_id
        store.create(durable("tie-b", priority=-1, created_at=T0.astimezone(TZ_SHANGHAI)))
        store.create(durable("tie-a", priority=-1))
        first = claim("w1", limit=3)
        self.assertEqual([s.task_id for s in first], ["high-old", "high-new", "low-old"])
        rest = claim("w2", limit=10)
        self.assertEqual([s.task_id for s in rest], ["low-new", "tie-a", "tie-b"])
        self.assertEqual(claim("w3", limit=10), [])
        want = S.QUEUED if start is None else S.STARTING
        self.assertEqual({s.status for s in first + rest}, {want})

    def test_claim_sets_holder_and_lease_without_bumping_version(self) -> None:
        store = self.open_store()
        store.create(durable("d-h"))
        until = LEASE.astimezone(TZ_SHANGHAI)
        (got,) = store.claim_queued("worker-a", names={"contract-task"}, limit=1, lease_until=until)
        self.assertEqual((got.owner, got.lease_owner, got.lease_until), ("worker-a", "worker-a", until))
        self.assertEqual((got.status, got.status_version), (S.QUEUED, 1), "认领不改状态、不改版本号")
        self.assertEqual(got.recipe, recipe())
        stored = store.get("d-h")
        assert stored is not None
        self.assertEqual(
            (stored.owner, stored.lease_owner, stored.lease_until), ("worker-a", "worker-a", until)
        )
        self.assertVersions(store, "d-h", [])

    def test_claim_only_unheld_queued_durable_tasks_of_the_given_names_and_buckets(self) -> None:
        self._check_claim_criteria(None)

    def test_claim_and_start_only_unheld_queued_durable_tasks_of_the_given_names_and_buckets(
        self,
    ) -> None:
        """认领并开始同样只取登记了名字的、本节点的桶里的、无人持有的 queued 持久任务。"""
        self._check_claim_criteria(ClaimStart(at=LEASE))

    def _check_claim_criteria(self, start: ClaimStart | None) -> None:
        store = self.open_store()
        claim = functools.partial(store.claim_queued, lease_until=LEASE, start=start)
        store.create(durable("ok", bucket=3))
        store.create(durable("ok-no-bucket"))
        store.create(snap("plain", status=S.QUEUED, status_version=1))  # 没有配方
        store.create(durable("held", bucket=3, owner="someone"))
        store.create(durable("running", bucket=3, status=S.RUNNING, status_version=3))
        store.create(durable("paused", bucket=3, status=S.PAUSED, status_version=2))
        store.create(durable("other-name", bucket=3, name="other"))
        store.create(durable("other-bucket", bucket=4))
        got = claim("w", names=["contract-task"], buckets=[3], limit=100)
        self.assertEqual([s.task_id for s in got], ["ok"], "给了桶集合时，没有桶的任务与别的桶的任务都不取")
        got = claim("w", names=["contract-task"], limit=100)
        self.assertEqual(sorted(s.task_id for s in got), ["ok-no-bucket", "other-bucket"])
        self.assertEqual(claim("w", names=[], limit=5), [])
        self.assertEqual(claim("w", names=["other"], buckets=[], limit=5), [])
        self.assertEqual(claim("w", names=["other"], limit=0), [])
        untouched = store.get("other-name")
        assert untouched is not None
        self.assertEqual((untouched.owner, untouched.status, untouched.status_version), (None, S.QUEUED, 1))
        for task_id, status, version in (
            ("held", S.QUEUED, 1),
            ("running", S.RUNNING, 3),
            ("paused", S.PAUSED, 2),
            ("plain", S.QUEUED, 1),
        ):
            kept = store.get(task_id)
            assert kept is not None
            self.assertEqual((kept.status, kept.status_version), (status, version), task_id)
            self.assertVersions(store, task_id, [])

    def test_claim_rejects_bad_arguments(self) -> None:
        store = self.open_store()
        for kwargs in (
            {"holder": "", "names": ["x"], "limit": 1, "lease_until": LEASE},
            # 认领者写进任务的 owner / lease_owner：与快照文本同一份可存储性规则
            {"holder": "w\x00", "names": ["x"], "limit": 1, "lease_until": LEASE},
            {"holder": "\ud800", "names": ["x"], "limit": 1, "lease_until": LEASE},
            {"holder": "w" * 10_000, "names": ["x"], "limit": 1, "lease_until": LEASE},
            {"holder": "w", "names": "x", "limit": 1, "lease_until": LEASE},
            {"holder": "w", "names": ["x"], "limit": -1, "lease_until": LEASE},
            {"holder": "w", "names": ["x"], "limit": True, "lease_until": LEASE},
            {"holder": "w", "names": ["x"], "limit": 1, "lease_until": LEASE.replace(tzinfo=None)},
            {"holder": "w", "names": ["x"], "buckets": 3, "limit": 1, "lease_until": LEASE},
            {"holder": "w", "names": ["x"], "buckets": [-1], "limit": 1, "lease_until": LEASE},
        ):
            with self.subTest(kwargs=kwargs), self.assertRaises(ConfigurationError):
                holder = kwargs.pop("holder")
                store.claim_queued(holder, **kwargs)  # type: ignore[arg-type]

    def test_concurrent_claimers_take_every_task_exactly_once(self) -> None:
        store = self.open_store()
        total = 120
        for index in range(total):
            store.create(durable(f"race-{index:03d}", seconds=index % 7, priority=index % 3))
        taken: dict[str, list[str]] = {}
        wrong_owner: list[str] = []
        lock = threading.Lock()

        def worker(holder: str) -> None:
            # 线程里不断言（断言失败只会杀掉线程）；总认领数有上限：坏的存储可能永远取得到"空闲"任务。
            while True:
                got = store.claim_queued(holder, names=["contract-task"], limit=3, lease_until=LEASE)
                with lock:
                    for snapshot in got:
                        taken.setdefault(snapshot.task_id, []).append(holder)
                        if snapshot.owner != holder:
                            wrong_owner.append(snapshot.task_id)
                    if not got or sum(map(len, taken.values())) > 2 * total:
                        return

        self.run_threads([functools.partial(worker, f"w{i}") for i in range(6)])
        doubles = {task_id: holders for task_id, holders in taken.items() if len(holders) != 1}
        self.assertEqual(doubles, {}, "同一个任务被不止一个认领者取走")
        self.assertEqual(wrong_owner, [], "认领交回的快照的 owner 必须是认领者")
        self.assertEqual(len(taken), total, "有任务没有被任何认领者取走")
        for snapshot in store.query():
            self.assertEqual(snapshot.owner, taken[snapshot.task_id][0])

    # -- claim_queued(start=...) -------------------------------------------------------------------

    def test_claim_and_start_writes_starting_exactly_as_the_state_machine_would(self) -> None:
        store = self.open_store()
        store.create(durable("d-s", max_attempts=3))
        at = (T0 + timedelta(seconds=7)).astimezone(TZ_SHANGHAI)
        start = ClaimStart(at=at, executor="thread")
        (got,) = store.claim_queued(
            "worker-a", names=["contract-task"], limit=5, lease_until=LEASE, start=start
        )
        # 状态机的 mark_starting：版本 + 1、attempt + 1、started_at、执行器名；持有者与租约是认领写的
        self.assertEqual((got.status, got.status_version, got.attempt), (S.STARTING, 2, 1))
        self.assertEqual((got.started_at, got.executor), (at, "thread"))
        self.assertEqual((got.owner, got.lease_owner, got.lease_until), ("worker-a", "worker-a", LEASE))
        self.assertEqual(got.recipe, recipe(), "开始不改配方")
        self.assertSnapshotEqual(store.get("d-s"), got)
        (record,) = store.history("d-s")
        self.assertEqual(
            (record.from_status, record.to_status, record.version, record.trigger, record.at),
            (S.QUEUED, S.STARTING, 2, TRIGGER_STARTING, at),
            "queued → starting 的迁移记录与快照同一次写入：历史没有空洞",
        )
        again = store.claim_queued(
            "worker-b", names=["contract-task"], limit=5, lease_until=LEASE, start=start
        )
        self.assertEqual(again, [], "开始了的任务不再可认领")

    def test_claim_and_start_only_claims_a_task_the_state_machine_will_not_start(self) -> None:
        store = self.open_store()
        store.create(durable("spent", seconds=0, attempt=2, max_attempts=2))
        store.create(durable("fresh", seconds=1))
        start = ClaimStart(at=T0 + timedelta(seconds=3))
        got = store.claim_queued("w", names=["contract-task"], limit=5, lease_until=LEASE, start=start)
        self.assertEqual(
            [(s.task_id, s.status, s.status_version) for s in got],
            [
                ("spent", S.QUEUED, 1),
                ("fresh", S.STARTING, 2),
            ],
        )
        spent = store.get("spent")
        assert spent is not None
        self.assertEqual(
            (spent.status, spent.status_version, spent.owner, spent.attempt), (S.QUEUED, 1, "w", 2)
        )
        self.assertVersions(store, "spent", [])
        self.assertVersions(store, "fresh", [2])

    def test_concurrent_claim_and_start_starts_every_task_exactly_once(self) -> None:
        store = self.open_store()
        total = 60
        for index in range(total):
            store.create(durable(f"go-{index:03d}", seconds=index % 5))
        taken: dict[str, list[str]] = {}
        lock = threading.Lock()

        def worker(holder: str) -> None:
            start = ClaimStart(at=LEASE, executor=holder)
            while True:
                got = store.claim_queued(
                    holder, names=["contract-task"], limit=2, lease_until=LEASE, start=start
                )
                with lock:
                    for snapshot in got:
                        taken.setdefault(snapshot.task_id, []).append(holder)
                    if not got or sum(map(len, taken.values())) > 2 * total:
                        return

        self.run_threads([functools.partial(worker, f"w{i}") for i in range(4)])
        doubles = {task_id: holders for task_id, holders in taken.items() if len(holders) != 1}
        self.assertEqual(doubles, {}, "同一个任务被不止一个认领者开始")
        self.assertEqual(len(taken), total, "有任务没有被任何认领者开始")
        for snapshot in store.query():
            (holder,) = taken[snapshot.task_id]
            self.assertEqual(
                (
                    snapshot.status,
                    snapshot.status_version,
                    snapshot.attempt,
                    snapshot.owner,
                    snapshot.executor,
                ),
                (S.STARTING, 2, 1, holder, holder),
            )
            self.assertVersions(store, snapshot.task_id, [2])

    # -- claim_queued(start=ClaimStart(save=...)) -------------------------------------------------------

    def _running(self, store: TaskStore, task_id: str, holder: str, *, seconds: int = 0) -> TaskSnapshot:
        """一个由 ``holder`` 认领并开始、已在跑（running，版本 3）的持久任务。"""
        store.create(durable(task_id, seconds=seconds, bucket_key=None, recipe=recipe(bucket_key=None)))
        (started,) = store.claim_queued(
            holder,
            names=["contract-task"],
            limit=1,
            lease_until=LEASE,
            start=ClaimStart(at=T0 + timedelta(seconds=seconds)),
        )
        running, record = step(started, S.RUNNING)
        store.save(running, expect_version=2, transitions=[record])
        return running

    def test_claim_after_save_commits_the_save_and_starts_the_next_task(self) -> None:
        """worker 的执行槽：刚跑完的任务的终态与下一个任务的认领 + starting 同一次调用。"""
        store = self.open_store()
        running = self._running(store, "done", "worker-a")
        store.create(durable("next", seconds=5))
        store.create(durable("later", seconds=6))
        done, record = step(running, S.SUCCEEDED, outcome={"n": [1, "二"]})
        at = T0 + timedelta(seconds=9)
        got = store.claim_queued(
            "worker-a",
            names=["contract-task"],
            limit=1,
            lease_until=LEASE,
            start=ClaimStart(at=at, executor="thread", save=SaveRequest(done, 3, (record,))),
        )
        self.assertEqual([(s.task_id, s.status, s.status_version) for s in got], [("next", S.STARTING, 2)])
        self.assertSnapshotEqual(store.get("next"), got[0])
        self.assertEqual((got[0].owner, got[0].started_at, got[0].executor), ("worker-a", at, "thread"))
        self.assertVersions(store, "next", [2])
        saved = store.get("done")
        assert saved is not None
        self.assertEqual(
            (saved.status, saved.status_version, saved.outcome), (S.SUCCEEDED, 4, {"n": [1, "二"]})
        )
        self.assertEqual(store.history("done")[-1], record, "终态的迁移记录随 save 一起落库")
        later = store.get("later")
        assert later is not None
        self.assertEqual((later.status, later.owner), (S.QUEUED, None), "只认领 limit 个")

    def test_claim_after_save_commits_the_save_when_nothing_is_claimable(self) -> None:
        store = self.open_store()
        running = self._running(store, "done", "worker-a")
        done, record = step(running, S.FAILED)
        start = ClaimStart(at=T0, save=SaveRequest(done, 3, (record,)))
        got = store.claim_queued("worker-a", names=["contract-task"], limit=1, lease_until=LEASE, start=start)
        self.assertEqual(got, [])
        saved = store.get("done")
        assert saved is not None
        self.assertEqual((saved.status, saved.status_version), (S.FAILED, 4), "认领扑空时 save 照样提交")
        self.assertVersions(store, "done", [2, 3, 4])
        # 过滤值匹配不到任何任务（名字集合为空、limit 为 0）也一样：save 不因认领"什么也不用做"而被跳过
        again, record = step(saved, S.QUEUED, recipe=None)
        again = again.evolve(owner="worker-a")
        start = ClaimStart(at=T0, save=SaveRequest(again, 4, (record,)))
        self.assertEqual(
            store.claim_queued("worker-a", names=[], limit=0, lease_until=LEASE, start=start), []
        )
        self.assertVersions(store, "done", [2, 3, 4, 5])

    def test_claim_after_a_failed_save_writes_nothing(self) -> None:
        """save 是认领的前提：它写不成（版本冲突、任务不存在、不合规）就什么也不写，抛出那次 save 的异常——
        否则调用方以为下一个任务没认领到，它却已在存储里是本节点的 starting，没人去跑。"""
        store = self.open_store()
        running = self._running(store, "done", "worker-a")
        store.create(durable("next", seconds=5))
        # 按存储里上一版（starting，版本 2）写的终态：存储已是 3，版本冲突
        started = running.evolve(status=S.STARTING, status_version=2)
        late, record = step(started, S.SUCCEEDED)
        stale = ClaimStart(at=T0, save=SaveRequest(late, 2, (record,)))
        missing, gone = step(durable("ghost", status=S.RUNNING, status_version=3), S.SUCCEEDED)
        claimable, back = step(running, S.QUEUED, owner=None)  # 写完仍是待认领的：入参检查拒绝
        for start, error in (
            (stale, ConcurrencyConflict),
            (ClaimStart(at=T0, save=SaveRequest(missing, 3, (gone,))), TaskNotFound),
            (
                ClaimStart(at=T0, save=SaveRequest(claimable.evolve(owner=None), 3, (back,))),
                ConfigurationError,
            ),
        ):
            with self.subTest(error=error.__name__), self.assertRaises(error):
                store.claim_queued(
                    "worker-a", names=["contract-task"], limit=1, lease_until=LEASE, start=start
                )
            nxt = store.get("next")
            assert nxt is not None
            self.assertEqual((nxt.status, nxt.owner, nxt.status_version), (S.QUEUED, None, 1))
            self.assertVersions(store, "next", [])
            self.assertVersions(store, "done", [2, 3])
        self.assertIsNone(store.get("ghost"))

    def test_concurrent_claim_after_save_starts_every_task_exactly_once(self) -> None:
        """几个 worker 的执行槽各自"结束手上的、认领下一个"：每个任务只被开始一次，每个终态都落库。"""
        store = self.open_store()
        total = 40
        holders = [f"w{i}" for i in range(4)]
        current = {holder: self._running(store, f"first-{holder}", holder) for holder in holders}
        for index in range(total):
            store.create(durable(f"go-{index:03d}", seconds=10 + index % 5))
        taken: dict[str, list[str]] = {}
        lock = threading.Lock()

        def worker(holder: str) -> None:
            task = current[holder]
            while True:
                done, record = step(task, S.SUCCEEDED)
                start = ClaimStart(
                    at=LEASE, executor=holder, save=SaveRequest(done, task.status_version, (record,))
                )
                got = store.claim_queued(
                    holder, names=["contract-task"], limit=1, lease_until=LEASE, start=start
                )
                with lock:
                    for snapshot in got:
                        taken.setdefault(snapshot.task_id, []).append(holder)
                if not got:
                    return
                (task,) = got
                task, record = step(task, S.RUNNING)
                store.save(task, expect_version=2, transitions=[record])

        self.run_threads([functools.partial(worker, holder) for holder in holders])
        doubles = {task_id: who for task_id, who in taken.items() if len(who) != 1}
        self.assertEqual(doubles, {}, "同一个任务被不止一个认领者开始")
        self.assertEqual(len(taken), total, "有任务没有被任何认领者开始")
        for snapshot in store.query():
            self.assertEqual((snapshot.status, snapshot.status_version), (S.SUCCEEDED, 4), snapshot.task_id)
            self.assertVersions(store, snapshot.task_id, [2, 3, 4])


__all__ = ["DurableCases", "durable", "recipe"]
