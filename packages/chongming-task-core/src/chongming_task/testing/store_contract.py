"""StoreContract：每个 TaskStore 后端都必须通过的契约套件。

用法（pytest 与 unittest 都能跑，本模块不依赖 pytest）::

    from chongming_task.testing.store_contract import StoreContract


    class TestMyStore(StoreContract):
        def make_store(self):
            return MyStore(...)

约定：

* ``make_store()`` 每次调用都必须返回一个**全新的空存储**。每个用例结束时套件会关闭它
  （``addCleanup``），清理数据库文件之类的事请在你自己的 ``addCleanup`` / ``tearDown`` 里做。
* 可选钩子 ``make_clocked_store(clock)``：若你的存储接受注入时钟，返回一个用 ``clock`` 的新存储；
  涉及租约到期的用例就用 FakeClock 推进时间，毫秒级完成。返回 None（默认）时这些用例改用真实的
  短租约，真实等待总计不到 2 秒。
* 基类本身带 ``__test__ = False``，pytest 不会收集它；直接用 unittest 运行基类时整体跳过。
  子类自动恢复收集。想再写一层抽象中间类，请在中间类里显式写 ``__test__ = False``。

语义的逐条说明见 docs/store-guide.md（持久层实现指南）。
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import threading
import time
import unittest
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, ClassVar

from chongming_task.errors import (
    ConcurrencyConflict,
    ConfigurationError,
    DuplicateTaskId,
    StoreError,
    TaskNotFound,
)
from chongming_task.models import Failure, FailureKind, Progress, TaskSnapshot, Transition
from chongming_task.states import TaskStatus
from chongming_task.storage import (
    Command,
    CommandAction,
    NodeRecord,
    QueryOrder,
    TaskQuery,
    TaskStats,
    TaskStore,
)
from chongming_task.testing.fake_clock import FakeClock

S = TaskStatus
T0 = datetime(2026, 3, 1, 8, 0, 0, tzinfo=UTC)
TZ_SHANGHAI = timezone(timedelta(hours=8))
TZ_ODD = timezone(timedelta(hours=-3, minutes=-30))

# 没有注入时钟时用的真实租约：足够长，让"认领后立刻检查不可见"在繁忙机器上也稳；足够短，让三个
# 需要等待的用例总共只睡 1.5 秒左右。
REAL_LEASE = 0.3
REAL_WAIT = 0.45
FAKE_LEASE = 30.0


def snap(task_id: str, *, at: datetime | None = None, name: str | None = None, **fields: Any) -> TaskSnapshot:
    """测试数据：一个合法的新快照。"""
    return TaskSnapshot(task_id=task_id, name=name or "contract-task", created_at=at or T0, **fields)


def step(
    snapshot: TaskSnapshot,
    to_status: TaskStatus,
    *,
    actor: str | None = "contract",
    reason: str | None = None,
    at: datetime | None = None,
    **changes: Any,
) -> tuple[TaskSnapshot, Transition]:
    """把快照推进一步：版本加一，并给出对应的迁移记录（存储契约不关心转移表，但这里只走合法边）。"""
    version = snapshot.status_version + 1
    when = at or (snapshot.created_at + timedelta(seconds=version))
    nxt = dataclasses.replace(snapshot, status=to_status, status_version=version, **changes)
    record = Transition(
        task_id=snapshot.task_id,
        from_status=snapshot.status,
        to_status=to_status,
        trigger=f"contract:{to_status.value}",
        actor=actor,
        reason=reason,
        version=version,
        at=when,
    )
    return nxt, record


def walk(snapshot: TaskSnapshot, *statuses: TaskStatus) -> tuple[TaskSnapshot, list[Transition]]:
    records: list[Transition] = []
    for status in statuses:
        snapshot, record = step(snapshot, status)
        records.append(record)
    return snapshot, records


def _failure_with_traceback() -> Failure:
    def inner() -> None:
        raise KeyError("缺少字段「租户」")

    try:
        try:
            inner()
        except KeyError as exc:
            raise RuntimeError("同步失败：上游返回了不完整的记录") from exc
    except RuntimeError as exc:
        return Failure.from_exception(exc, kind=FailureKind.EXCEPTION, retryable=True)
    raise AssertionError("unreachable")


def full_snapshot() -> TaskSnapshot:
    """每个字段都填上非默认值的快照：保真用例的主角。"""
    created = datetime(2026, 3, 1, 9, 15, 30, 123456, tzinfo=TZ_SHANGHAI)
    return TaskSnapshot(
        task_id="任务-全字段-001",
        name="同步/租户甲",
        created_at=created,
        status=S.FAILED,
        status_version=7,
        label="夜间同步 · 第二批",
        attempt=2,
        max_attempts=5,
        queued_at=created + timedelta(microseconds=1),
        started_at=datetime(2026, 3, 1, 1, 16, 0, 999999, tzinfo=UTC),
        finished_at=datetime(2026, 2, 28, 22, 0, 0, 1, tzinfo=TZ_ODD),
        last_heartbeat_at=created + timedelta(seconds=50, microseconds=7),
        progress=Progress(done=120.5, total=500.25, unit="分区", message="处理中……第 3/8 段"),
        failure=_failure_with_traceback(),
        outcome={
            "行数": 12,
            "nested": {"list": [1, 2.5, None, True, False, "文本", 0.1], "empty": {}, "blank": []},
            "big": 2**53 + 1,
            "负数": -7,
            "引号": "含 \"双引号\"、'单引号'、\\ 反斜杠、\n 换行与 \t 制表符",
        },
        tags=frozenset({"io", "夜间", "a b", "100%"}),
        priority=-3,
        bucket=42,
        bucket_key="tenant-甲",
        executor="thread",
        pid=4321,
        owner="node-a",
        lease_owner="node-a:4321",
        lease_until=created + timedelta(seconds=30),
        pipeline_id="nightly-etl",
        node_id="fetch_1",
        retry_at=datetime(2026, 3, 1, 9, 20, 0, 500000, tzinfo=TZ_SHANGHAI),
        description="多行描述\n第二行：Ünïcödé ✓ 🚀",
    )


def _query_dataset() -> list[TaskSnapshot]:
    """组合查询用的数据集：同一时刻的并列、不同时区写法的同一时刻、名字里的通配符字符、相似标签。"""
    names = [
        "extract",
        "extract_daily",
        "extract%daily",
        "extractXdaily",
        "ext_ract",
        "Extract",
        "load\\raw",
        "load\\\\raw",
        "加载-日报",
        "100%_done",
        "100x_done",
    ]
    statuses = [S.PENDING, S.QUEUED, S.RUNNING, S.SUCCEEDED, S.FAILED, S.PAUSED, S.STOPPED]
    tag_sets = [frozenset({"io"}), frozenset({"io", "cpu"}), frozenset({"iox"}), frozenset()]
    owners = ["node-a", "node-b", None]
    pipelines = ["p1", "p2", None, None]
    rows: list[TaskSnapshot] = []
    for i in range(33):
        created = T0 + timedelta(seconds=i // 3)  # 三个一组同一时刻：考验按 task_id 决胜
        if i % 2:
            created = created.astimezone(TZ_SHANGHAI)  # 同一时刻的另一种写法：排序比较的是时刻
        rows.append(
            TaskSnapshot(
                task_id=f"q-{(i * 7) % 33:02d}",  # task_id 的字典序与插入顺序无关
                name=names[i % len(names)],
                created_at=created,
                status=statuses[i % len(statuses)],
                tags=tag_sets[i % len(tag_sets)],
                bucket=None if i % 5 == 0 else i % 4,
                owner=owners[i % len(owners)],
                pipeline_id=pipelines[i % len(pipelines)],
                lease_until=None if i % 3 == 0 else T0 + timedelta(seconds=i),
            )
        )
    return rows


def node(
    owner: str,
    *,
    buckets: Iterable[int] | None = range(16),
    num_buckets: int = 64,
    heartbeat_at: datetime | None = None,
    ttl: float = 30.0,
    expires_at: datetime | None = None,
    info: dict[str, Any] | None = None,
) -> NodeRecord:
    """测试数据：一条节点记录（默认负责 0..15 号桶、心跳在 T0、30 秒后过期）。"""
    beat = T0 if heartbeat_at is None else heartbeat_at
    # 单个整数原样交给 NodeRecord：校验用例要看到它自己的报错，而不是 frozenset() 的 TypeError。
    chosen: Any = buckets if buckets is None or isinstance(buckets, (int, frozenset)) else frozenset(buckets)
    return NodeRecord(
        owner=owner,
        buckets=chosen,
        num_buckets=num_buckets,
        heartbeat_at=beat,
        expires_at=expires_at if expires_at is not None else beat + timedelta(seconds=ttl),
        info={"hostname": "test-host", "pid": 1} if info is None else info,
    )


def _ids(snapshots: Iterable[TaskSnapshot]) -> list[str]:
    return [s.task_id for s in snapshots]


class StoreContract(unittest.TestCase):
    """TaskStore 契约套件。子类实现 ``make_store()``；可选实现 ``make_clocked_store(clock)``。"""

    __test__: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # 子类默认参与收集；显式写了 __test__ 的（抽象中间类）尊重它自己的选择。
        if "__test__" not in cls.__dict__:
            cls.__test__ = True

    @classmethod
    def setUpClass(cls) -> None:
        if cls is StoreContract:
            raise unittest.SkipTest(
                "StoreContract 是给存储后端继承的抽象套件，本身不运行；"
                "请写 class TestMyStore(StoreContract) 并实现 make_store()"
            )
        super().setUpClass()

    # -- hooks for implementers ---------------------------------------------------------------------

    def make_store(self) -> TaskStore:
        """返回一个全新的空存储。子类必须实现。"""
        raise NotImplementedError(f"{type(self).__name__} 必须实现 make_store()，返回一个全新的空 TaskStore")

    def make_clocked_store(self, clock: FakeClock) -> TaskStore | None:
        """可选：返回一个使用 ``clock`` 的全新空存储；不支持注入时钟就返回 None。"""
        return None

    # -- plumbing -----------------------------------------------------------------------------------

    def open_store(self) -> TaskStore:
        store = self.make_store()
        self.assertIsInstance(store, TaskStore, "make_store() 必须返回 TaskStore 的实例")
        self.addCleanup(store.close)
        return store

    def open_timed_store(self) -> tuple[TaskStore, Callable[[float], None], float, FakeClock | None]:
        """(存储, 让时间前进的函数, 该用的租约秒数, 注入的时钟或 None)。"""
        clock = FakeClock(start=T0)
        store = self.make_clocked_store(clock)
        if store is not None:
            self.assertIsInstance(store, TaskStore, "make_clocked_store() 必须返回 TaskStore 或 None")
            self.addCleanup(store.close)
            return store, clock.advance, FAKE_LEASE, clock
        return self.open_store(), time.sleep, REAL_LEASE, None

    def run_threads(self, targets: list[Callable[[], None]], *, timeout: float = 60.0) -> None:
        """并发跑 targets，总共最多等 timeout 秒；到点还没结束的线程算失败（死锁或停不下来的循环）。"""
        threads = [threading.Thread(target=target, daemon=True) for target in targets]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [thread.name for thread in threads if thread.is_alive()]
        self.assertEqual(alive, [], f"{timeout} 秒后仍有线程没结束：存储死锁了，或者某个循环停不下来")

    def assertSnapshotEqual(self, got: TaskSnapshot | None, want: TaskSnapshot) -> None:
        self.assertIsNotNone(got, f"存储里找不到 {want.task_id!r}")
        assert got is not None
        for name in TaskSnapshot.FIELD_NAMES:
            self.assertEqual(getattr(got, name), getattr(want, name), f"字段 {name} 没有原样往返")
            if isinstance(getattr(want, name), datetime):
                value = getattr(got, name)
                self.assertIsInstance(value, datetime, f"字段 {name} 必须还原成 datetime")
                self.assertIsNotNone(value.utcoffset(), f"字段 {name} 必须还原成带时区的 datetime")
        self.assertIsInstance(got.tags, frozenset, "tags 必须还原成 frozenset")
        self.assertIsInstance(got.status, TaskStatus)

    def assertVersions(self, store: TaskStore, task_id: str, versions: list[int]) -> None:
        self.assertEqual([t.version for t in store.history(task_id)], versions, f"{task_id} 的历史版本号")

    # ===============================================================================================
    # create / get
    # ===============================================================================================

    def test_create_then_get(self) -> None:
        store = self.open_store()
        original = snap("c-1", name="first")
        store.create(original)
        self.assertSnapshotEqual(store.get("c-1"), original)
        self.assertEqual(store.history("c-1"), [])

    def test_get_unknown_returns_none(self) -> None:
        store = self.open_store()
        self.assertIsNone(store.get("nope"))

    def test_create_duplicate_raises_and_keeps_original(self) -> None:
        store = self.open_store()
        original = snap("dup", name="original", label="first")
        store.create(original)
        clash, records = walk(snap("dup", name="impostor", label="second"), S.QUEUED)
        with self.assertRaises(DuplicateTaskId):
            store.create(clash, records)
        self.assertSnapshotEqual(store.get("dup"), original)
        self.assertEqual(store.history("dup"), [], "被拒绝的 create 不能留下迁移记录")
        self.assertEqual(len(store.query()), 1)

    def test_create_with_existing_history(self) -> None:
        store = self.open_store()
        current, records = walk(snap("c-h"), S.QUEUED, S.STARTING, S.RUNNING)
        store.create(current, records)
        self.assertSnapshotEqual(store.get("c-h"), current)
        self.assertEqual(store.history("c-h"), records)

    def test_create_writes_initial_side_channel_fields(self) -> None:
        store = self.open_store()
        original = snap(
            "c-side",
            progress=Progress(done=1, total=3),
            last_heartbeat_at=T0 + timedelta(seconds=5),
            lease_owner="node-x",
            lease_until=T0 + timedelta(seconds=30),
        )
        store.create(original)
        self.assertSnapshotEqual(store.get("c-side"), original)

    # ===============================================================================================
    # fidelity
    # ===============================================================================================

    def test_fidelity_every_field_round_trips(self) -> None:
        store = self.open_store()
        original = full_snapshot()
        store.create(original)
        got = store.get(original.task_id)
        self.assertSnapshotEqual(got, original)
        assert got is not None
        self.assertEqual(got, original)
        self.assertEqual(got.failure, original.failure)
        assert got.failure is not None and original.failure is not None
        self.assertEqual(got.failure.traceback, original.failure.traceback)
        self.assertIn("KeyError", got.failure.traceback or "")
        self.assertIn("缺少字段「租户」", got.failure.traceback or "")
        self.assertEqual(got.created_at.microsecond, 123456)
        assert got.finished_at is not None
        self.assertEqual(got.finished_at.microsecond, 1)
        self.assertEqual(got.outcome["big"], 2**53 + 1, "大整数不能经浮点走样")
        self.assertIsInstance(got.outcome["big"], int)
        assert got.progress is not None
        self.assertEqual((got.progress.done, got.progress.total), (120.5, 500.25))

    def test_fidelity_minimal_snapshot_keeps_nones(self) -> None:
        store = self.open_store()
        original = snap("minimal")
        store.create(original)
        got = store.get("minimal")
        self.assertSnapshotEqual(got, original)
        assert got is not None
        self.assertEqual(got.tags, frozenset())
        self.assertIsNone(got.outcome)
        self.assertIsNone(got.bucket)

    def test_fidelity_scalar_and_list_outcomes(self) -> None:
        store = self.open_store()
        values: list[Any] = ["纯文本", 0, -1.5, True, False, [1, "二", [3.0]], {"": ""}, 10**30]
        for i, value in enumerate(values):
            store.create(snap(f"out-{i}", outcome=value))
        for i, value in enumerate(values):
            got = store.get(f"out-{i}")
            assert got is not None
            self.assertEqual(got.outcome, value, f"outcome {value!r} 没有原样往返")
            self.assertIs(type(got.outcome), type(value), f"outcome {value!r} 的类型变了")

    def test_fidelity_one_megabyte_outcome(self) -> None:
        store = self.open_store()
        rows = [{"id": i, "名称": f"记录-{i:06d}", "值": i * 0.5, "ok": i % 2 == 0} for i in range(16000)]
        outcome = {"rows": rows, "说明": "约 1 MB 的结果"}
        self.assertGreater(len(json.dumps(outcome, ensure_ascii=False).encode()), 1_000_000)
        base = snap("big")
        store.create(base)
        done, records = walk(base, S.QUEUED, S.STARTING, S.RUNNING)
        done, last = step(done, S.SUCCEEDED, outcome=outcome, finished_at=T0 + timedelta(hours=1))
        store.save(done, expect_version=0, transitions=[*records, last])
        got = store.get("big")
        assert got is not None
        self.assertEqual(got.outcome, outcome)
        self.assertEqual(_ids(store.query(TaskQuery(statuses=frozenset({S.SUCCEEDED})))), ["big"])

    def test_fidelity_through_query(self) -> None:
        store = self.open_store()
        original = full_snapshot()
        store.create(original)
        store.create(snap("other"))
        (got,) = store.query(TaskQuery(owner="node-a"))
        self.assertSnapshotEqual(got, original)

    def test_fidelity_transitions_round_trip(self) -> None:
        store = self.open_store()
        base = snap("tr", at=datetime(2026, 3, 1, 9, 0, 0, 654321, tzinfo=TZ_ODD))
        store.create(base)
        nxt, record = step(
            base, S.QUEUED, actor="运维·张三", reason='手动排队：发布窗口 "夜间"', at=base.created_at
        )
        nxt2, record2 = step(nxt, S.CANCELLED, actor=None, reason=None)
        store.save(nxt2, expect_version=0, transitions=[record, record2])
        history = store.history("tr")
        self.assertEqual(history, [record, record2])
        for got, want in zip(history, [record, record2], strict=True):
            self.assertIs(got.from_status, want.from_status)
            self.assertIs(got.to_status, want.to_status)
            self.assertEqual(got.at, want.at)
            self.assertIsNotNone(got.at.utcoffset())

    def test_outcome_must_be_json(self) -> None:
        store = self.open_store()
        with self.assertRaises(ConfigurationError):
            store.create(snap("bad-set", outcome={1, 2}))
        with self.assertRaises(ConfigurationError):
            store.create(snap("bad-nan", outcome={"x": math.nan}))
        self.assertIsNone(store.get("bad-set"))
        self.assertIsNone(store.get("bad-nan"))
        store.create(snap("ok"))
        bad, record = step(snap("ok"), S.QUEUED, outcome=object())
        with self.assertRaises(ConfigurationError):
            store.save(bad, expect_version=0, transitions=[record])
        got = store.get("ok")
        assert got is not None
        self.assertEqual(got.status_version, 0)
        self.assertEqual(store.history("ok"), [])

    # ===============================================================================================
    # copies
    # ===============================================================================================

    def test_returned_outcome_is_a_copy(self) -> None:
        store = self.open_store()
        store.create(snap("copy", outcome={"rows": [1, 2, 3], "meta": {"k": "v"}}))
        first = store.get("copy")
        assert first is not None
        first.outcome["rows"].append(4)
        first.outcome["meta"]["k"] = "changed"
        first.outcome["new"] = True
        (queried,) = store.query()
        queried.outcome["rows"].clear()
        again = store.get("copy")
        assert again is not None
        self.assertEqual(again.outcome, {"rows": [1, 2, 3], "meta": {"k": "v"}})

    def test_stored_outcome_is_copied_on_the_way_in(self) -> None:
        store = self.open_store()
        outcome: dict[str, Any] = {"rows": [1, 2]}
        store.create(snap("in", outcome=outcome))
        outcome["rows"].append(3)
        outcome["extra"] = 1
        got = store.get("in")
        assert got is not None
        self.assertEqual(got.outcome, {"rows": [1, 2]})

        later = {"total": [10]}
        nxt, record = step(snap("in", outcome={"rows": [1, 2]}), S.QUEUED, outcome=later)
        store.save(nxt, expect_version=0, transitions=[record])
        later["total"].append(20)
        got = store.get("in")
        assert got is not None
        self.assertEqual(got.outcome, {"total": [10]})

    def test_returned_history_is_a_copy(self) -> None:
        store = self.open_store()
        current, records = walk(snap("hist-copy"), S.QUEUED, S.STARTING)
        store.create(current, records)
        history = store.history("hist-copy")
        history.clear()
        self.assertEqual(store.history("hist-copy"), records)

    def test_command_payload_is_copied(self) -> None:
        store = self.open_store()
        store.create(snap("pay"))
        payload: dict[str, Any] = {"grace": 5, "list": [1]}
        submitted = store.submit_command("pay", CommandAction.STOP, payload=payload)
        payload["list"].append(2)
        submitted.payload["list"].append(3)
        (claimed,) = store.claim_commands("w", lease=60)
        self.assertEqual(dict(claimed.payload), {"grace": 5, "list": [1]})

    # ===============================================================================================
    # save
    # ===============================================================================================

    def test_save_bumps_version_and_appends_transitions(self) -> None:
        store = self.open_store()
        base = snap("s-1")
        store.create(base)
        queued, r1 = step(base, S.QUEUED)
        store.save(queued, expect_version=0, transitions=[r1])
        running, records = walk(queued, S.STARTING, S.RUNNING)
        store.save(running, expect_version=1, transitions=records)
        got = store.get("s-1")
        assert got is not None
        self.assertEqual((got.status, got.status_version), (S.RUNNING, 3))
        self.assertEqual(store.history("s-1"), [r1, *records])

    def test_save_version_mismatch_writes_nothing(self) -> None:
        store = self.open_store()
        base = snap("s-conf", label="v0")
        store.create(base)
        queued, r1 = step(base, S.QUEUED, label="v1")
        store.save(queued, expect_version=0, transitions=[r1])
        # 一个过时的写者：它以为版本还是 0。
        stale, stale_record = step(base, S.CANCELLED, label="stale", actor="stale-writer")
        with self.assertRaises(ConcurrencyConflict):
            store.save(stale, expect_version=0, transitions=[stale_record])
        # 一个来自未来的写者：期望版本比存储里的新。
        future, future_records = walk(queued, S.STARTING, S.RUNNING)
        with self.assertRaises(ConcurrencyConflict):
            store.save(future, expect_version=2, transitions=future_records[1:])
        got = store.get("s-conf")
        assert got is not None
        self.assertSnapshotEqual(got, queued)
        self.assertEqual(store.history("s-conf"), [r1], "冲突的 save 不能写入任何迁移记录")

    def test_save_unknown_task_raises_task_not_found(self) -> None:
        store = self.open_store()
        ghost, record = step(snap("ghost"), S.QUEUED)
        with self.assertRaises(TaskNotFound):
            store.save(ghost, expect_version=0, transitions=[record])
        self.assertIsNone(store.get("ghost"))
        self.assertEqual(store.history("ghost"), [])

    def test_save_rejects_inconsistent_transitions(self) -> None:
        store = self.open_store()
        base = snap("s-bad")
        store.create(base)
        nxt, records = walk(base, S.QUEUED, S.STARTING)
        with self.assertRaises(ConfigurationError):
            store.save(nxt, expect_version=0, transitions=records[1:])  # 缺了版本 1
        with self.assertRaises(ConfigurationError):
            store.save(nxt, expect_version=0, transitions=[records[0], records[0]])
        got = store.get("s-bad")
        assert got is not None
        self.assertEqual(got.status_version, 0)
        self.assertEqual(store.history("s-bad"), [])

    def test_save_without_version_bump(self) -> None:
        store = self.open_store()
        base, records = walk(snap("s-same"), S.QUEUED)
        store.create(base, records)
        edited = dataclasses.replace(base, description="只改描述，不改状态")
        store.save(edited, expect_version=1)
        got = store.get("s-same")
        assert got is not None
        self.assertEqual((got.status_version, got.description), (1, "只改描述，不改状态"))
        self.assertVersions(store, "s-same", [1])

    def test_save_does_not_clobber_side_channel_fields(self) -> None:
        store = self.open_store()
        base = snap("s-side", progress=Progress(done=0, total=10))
        store.create(base)
        store.touch(
            "s-side",
            progress=Progress(done=7, total=10, unit="批"),
            heartbeat_at=T0 + timedelta(seconds=70),
            lease_owner="node-b",
            lease_until=T0 + timedelta(seconds=100),
        )
        # 调用方手里那份快照的旁路字段是过时的（甚至是胡乱的）：save 一律不采用。
        stale = dataclasses.replace(
            base, progress=Progress(done=999), lease_owner="liar", lease_until=T0, last_heartbeat_at=T0
        )
        queued, record = step(stale, S.QUEUED, label="saved")
        store.save(queued, expect_version=0, transitions=[record])
        got = store.get("s-side")
        assert got is not None
        self.assertEqual(got.label, "saved")
        self.assertEqual(got.progress, Progress(done=7, total=10, unit="批"))
        self.assertEqual(got.last_heartbeat_at, T0 + timedelta(seconds=70))
        self.assertEqual(got.lease_owner, "node-b")
        self.assertEqual(got.lease_until, T0 + timedelta(seconds=100))

    def _race_round(
        self, store: TaskStore, current: TaskSnapshot, round_no: int, writers: int
    ) -> TaskSnapshot:
        """一轮竞争：writers 个线程拿同一个 expect_version 同时 save。返回赢家写下的快照。"""
        barrier = threading.Barrier(writers)
        results: list[object] = [None] * writers
        expect = current.status_version
        target = S.PAUSING if current.status is S.RUNNING else S.RUNNING

        def writer(i: int) -> None:
            nxt, record = step(current, target, actor=f"writer-{i}", label=f"round-{round_no}-writer-{i}")
            barrier.wait()
            try:
                store.save(nxt, expect_version=expect, transitions=[record])
                results[i] = "won"
            except ConcurrencyConflict:
                results[i] = "conflict"
            except BaseException as exc:  # 线程里的任何异常都要带回主线程报告
                results[i] = exc

        self.run_threads([functools.partial(writer, i) for i in range(writers)])
        self.assertEqual(results.count("won"), 1, f"第 {round_no} 轮：{results}")
        self.assertEqual(results.count("conflict"), writers - 1, f"第 {round_no} 轮：{results}")
        winner = results.index("won")
        got = store.get(current.task_id)
        assert got is not None
        self.assertEqual(got.status_version, expect + 1)
        self.assertEqual(got.label, f"round-{round_no}-writer-{winner}", "快照必须来自赢家")
        history = store.history(current.task_id)
        self.assertEqual([t.version for t in history], list(range(1, expect + 2)), "历史有空洞或重复")
        self.assertEqual(history[-1].actor, f"writer-{winner}", "迁移记录必须来自赢家")
        return got

    def test_race_same_expect_version_exactly_one_wins(self) -> None:
        store = self.open_store()
        current = snap("race", status=S.RUNNING)
        store.create(current)
        for round_no in range(4):
            current = self._race_round(store, current, round_no, writers=8)

    def test_race_retrying_writers_leave_a_gapless_history(self) -> None:
        store = self.open_store()
        store.create(snap("chain", status=S.RUNNING))
        writers, per_writer = 4, 15
        errors: list[BaseException] = []

        def writer(i: int) -> None:
            try:
                done, attempts = 0, 0
                while done < per_writer:
                    attempts += 1
                    if attempts > 100 * per_writer * writers:
                        raise AssertionError(f"w{i} 重试了 {attempts} 次仍未写完：save 似乎总在冲突")
                    current = store.get("chain")
                    assert current is not None
                    target = S.PAUSING if current.status is S.RUNNING else S.RUNNING
                    nxt, record = step(current, target, actor=f"w{i}")
                    try:
                        store.save(nxt, expect_version=current.status_version, transitions=[record])
                    except ConcurrencyConflict:
                        continue
                    done += 1
            except BaseException as exc:
                errors.append(exc)

        self.run_threads([functools.partial(writer, i) for i in range(writers)])
        self.assertEqual(errors, [])
        total = writers * per_writer
        got = store.get("chain")
        assert got is not None
        self.assertEqual(got.status_version, total)
        history = store.history("chain")
        self.assertEqual([t.version for t in history], list(range(1, total + 1)), "历史有空洞或重复")
        for before, after in itertools.pairwise(history):
            self.assertIs(after.from_status, before.to_status, f"版本 {after.version} 接不上上一条")
        self.assertIs(history[-1].to_status, got.status)
        counts = {f"w{i}": 0 for i in range(writers)}
        for record in history:
            counts[record.actor or ""] += 1
        self.assertEqual(set(counts.values()), {per_writer})

    def test_reads_never_see_a_torn_snapshot(self) -> None:
        store = self.open_store()
        store.create(snap("torn", status=S.RUNNING, label="v0", outcome={"v": 0}))
        saves = 60
        errors: list[BaseException] = []
        done = threading.Event()

        def writer() -> None:
            try:
                for n in range(1, saves + 1):
                    current = store.get("torn")
                    assert current is not None
                    target = S.PAUSING if current.status is S.RUNNING else S.RUNNING
                    nxt, record = step(current, target, label=f"v{n}", outcome={"v": n, "pad": [n] * 50})
                    store.save(nxt, expect_version=current.status_version, transitions=[record])
            except BaseException as exc:
                errors.append(exc)
            finally:
                done.set()

        def reader() -> None:
            try:
                while not done.is_set():
                    for got in [store.get("torn"), *store.query(TaskQuery(name_prefix="contract"))]:
                        assert got is not None
                        if got.label != f"v{got.outcome['v']}":
                            raise AssertionError(
                                f"读到了半新半旧的快照：label={got.label} outcome={got.outcome}"
                            )
                        if got.status_version != got.outcome["v"]:
                            raise AssertionError(
                                f"版本 {got.status_version} 与 outcome {got.outcome} 不属于同一次写入"
                            )
            except BaseException as exc:
                errors.append(exc)

        self.run_threads([writer, reader, reader])
        self.assertEqual(errors, [])

    # ===============================================================================================
    # query
    # ===============================================================================================

    def _loaded(self) -> tuple[TaskStore, list[TaskSnapshot]]:
        store = self.open_store()
        dataset = _query_dataset()
        for snapshot in dataset:
            store.create(snapshot)
        return store, dataset

    def assertQuery(self, store: TaskStore, dataset: list[TaskSnapshot], query: TaskQuery) -> list[str]:
        want = _ids(query.apply(dataset))
        got = _ids(store.query(query))
        self.assertEqual(got, want, f"查询结果与 TaskQuery.apply 的参照语义不一致：{query}")
        return got

    def test_query_without_filter_returns_all_newest_first(self) -> None:
        store, dataset = self._loaded()
        self.assertEqual(len(self.assertQuery(store, dataset, TaskQuery())), len(dataset))
        self.assertEqual(_ids(store.query()), _ids(store.query(TaskQuery())))
        self.assertEqual(_ids(store.query())[0], _ids(TaskQuery().apply(dataset))[0])

    def test_query_statuses(self) -> None:
        store, dataset = self._loaded()
        self.assertTrue(self.assertQuery(store, dataset, TaskQuery(statuses=frozenset({S.RUNNING}))))
        self.assertTrue(self.assertQuery(store, dataset, TaskQuery(statuses=frozenset({S.FAILED, S.PAUSED}))))
        self.assertEqual(store.query(TaskQuery(statuses=frozenset({S.LOST}))), [])

    def test_query_name_prefix_percent_is_literal(self) -> None:
        store, dataset = self._loaded()
        self.assertEqual(
            set(self.assertQuery(store, dataset, TaskQuery(name_prefix="extract%"))),
            {s.task_id for s in dataset if s.name == "extract%daily"},
        )
        got = self.assertQuery(store, dataset, TaskQuery(name_prefix="100%"))
        self.assertEqual({s.name for s in store.query(TaskQuery(name_prefix="100%"))}, {"100%_done"})
        self.assertTrue(got)

    def test_query_name_prefix_underscore_is_literal(self) -> None:
        store, dataset = self._loaded()
        self.assertEqual({s.name for s in store.query(TaskQuery(name_prefix="extract_"))}, {"extract_daily"})
        self.assertEqual({s.name for s in store.query(TaskQuery(name_prefix="ext_"))}, {"ext_ract"})
        self.assertQuery(store, dataset, TaskQuery(name_prefix="extract_"))

    def test_query_name_prefix_backslash_is_literal(self) -> None:
        store, dataset = self._loaded()
        self.assertEqual({s.name for s in store.query(TaskQuery(name_prefix="load\\r"))}, {"load\\raw"})
        self.assertEqual({s.name for s in store.query(TaskQuery(name_prefix="load\\\\"))}, {"load\\\\raw"})
        self.assertEqual(
            {s.name for s in store.query(TaskQuery(name_prefix="load\\"))}, {"load\\raw", "load\\\\raw"}
        )
        self.assertQuery(store, dataset, TaskQuery(name_prefix="load\\"))

    def test_query_name_prefix_is_case_sensitive_and_handles_cjk(self) -> None:
        store, dataset = self._loaded()
        self.assertEqual({s.name for s in store.query(TaskQuery(name_prefix="Extract"))}, {"Extract"})
        self.assertNotIn("Extract", {s.name for s in store.query(TaskQuery(name_prefix="extract"))})
        self.assertEqual({s.name for s in store.query(TaskQuery(name_prefix="加载"))}, {"加载-日报"})
        self.assertEqual(len(store.query(TaskQuery(name_prefix=""))), len(dataset))
        self.assertQuery(store, dataset, TaskQuery(name_prefix="extract"))

    def test_query_tag_matches_whole_tags_only(self) -> None:
        store, dataset = self._loaded()
        io = self.assertQuery(store, dataset, TaskQuery(tag="io"))
        self.assertTrue(io)
        for snapshot in store.query(TaskQuery(tag="io")):
            self.assertIn("io", snapshot.tags)
        self.assertTrue(self.assertQuery(store, dataset, TaskQuery(tag="iox")))
        self.assertTrue(self.assertQuery(store, dataset, TaskQuery(tag="cpu")))
        self.assertEqual(store.query(TaskQuery(tag="i")), [], "标签按整个字符串匹配，不是子串")

    def test_query_bucket(self) -> None:
        store, dataset = self._loaded()
        for bucket in (0, 1, 3):
            got = self.assertQuery(store, dataset, TaskQuery(bucket=bucket))
            self.assertTrue(got)
        self.assertEqual(store.query(TaskQuery(bucket=99)), [])

    def test_query_buckets(self) -> None:
        store, dataset = self._loaded()
        got = self.assertQuery(store, dataset, TaskQuery(buckets=frozenset({1, 2})))
        self.assertTrue(got)
        self.assertEqual(store.query(TaskQuery(buckets=frozenset())), [], "空的桶集合不匹配任何任务")

    def test_query_bucket_and_buckets_intersect(self) -> None:
        store, dataset = self._loaded()
        both = self.assertQuery(store, dataset, TaskQuery(bucket=1, buckets=frozenset({1, 2})))
        self.assertEqual(set(both), set(_ids(store.query(TaskQuery(bucket=1)))))
        self.assertEqual(store.query(TaskQuery(bucket=1, buckets=frozenset({2, 3}))), [])

    def test_query_owner(self) -> None:
        store, dataset = self._loaded()
        self.assertTrue(self.assertQuery(store, dataset, TaskQuery(owner="node-a")))
        self.assertEqual(store.query(TaskQuery(owner="node-z")), [])

    def test_query_pipeline_id(self) -> None:
        store, dataset = self._loaded()
        self.assertTrue(self.assertQuery(store, dataset, TaskQuery(pipeline_id="p1")))
        self.assertEqual(store.query(TaskQuery(pipeline_id="p9")), [])

    def test_query_created_after_is_strict(self) -> None:
        store, dataset = self._loaded()
        boundary = T0 + timedelta(seconds=5)
        got = self.assertQuery(store, dataset, TaskQuery(created_after=boundary))
        self.assertNotIn(
            True, [s.created_at == boundary for s in store.query(TaskQuery(created_after=boundary))]
        )
        self.assertEqual(len(got), sum(1 for s in dataset if s.created_at > boundary))
        # 同一时刻换个时区写法，结果不变：比较的是时刻。
        self.assertEqual(_ids(store.query(TaskQuery(created_after=boundary.astimezone(TZ_ODD)))), got)

    def test_query_created_before_is_strict(self) -> None:
        store, dataset = self._loaded()
        boundary = T0 + timedelta(seconds=4)
        got = self.assertQuery(store, dataset, TaskQuery(created_before=boundary))
        self.assertEqual(len(got), 12)  # 0..3 秒各三个；4 秒那三个不算
        window = self.assertQuery(
            store, dataset, TaskQuery(created_after=T0 + timedelta(seconds=2), created_before=boundary)
        )
        self.assertEqual(len(window), 3)
        self.assertEqual(store.query(TaskQuery(created_after=boundary, created_before=boundary)), [])

    def test_query_lease_expired_before(self) -> None:
        store, dataset = self._loaded()
        cutoff = T0 + timedelta(seconds=10)
        got = set(self.assertQuery(store, dataset, TaskQuery(lease_expired_before=cutoff)))
        no_lease = {s.task_id for s in dataset if s.lease_until is None}
        expired = {s.task_id for s in dataset if s.lease_until is not None and s.lease_until < cutoff}
        exactly = {s.task_id for s in dataset if s.lease_until == cutoff}
        self.assertTrue(no_lease and expired and exactly)
        self.assertEqual(got, no_lease | expired, "租约为空或早于该时刻的才算过期；恰好等于不算")

    def test_query_lease_expired_before_sees_touched_leases(self) -> None:
        store = self.open_store()
        store.create(snap("leased"))
        cutoff = T0 + timedelta(seconds=30)
        self.assertEqual(_ids(store.query(TaskQuery(lease_expired_before=cutoff))), ["leased"])
        store.touch("leased", lease_owner="n1", lease_until=cutoff + timedelta(seconds=1))
        self.assertEqual(store.query(TaskQuery(lease_expired_before=cutoff)), [])
        store.touch("leased", lease_until=cutoff - timedelta(microseconds=1))
        self.assertEqual(_ids(store.query(TaskQuery(lease_expired_before=cutoff))), ["leased"])

    def test_query_limit(self) -> None:
        store, dataset = self._loaded()
        self.assertEqual(len(self.assertQuery(store, dataset, TaskQuery(limit=5))), 5)
        self.assertEqual(len(store.query(TaskQuery(limit=1000))), len(dataset))
        self.assertEqual(len(self.assertQuery(store, dataset, TaskQuery(tag="io", limit=2))), 2)

    def test_query_limit_zero_returns_nothing(self) -> None:
        store, _ = self._loaded()
        self.assertEqual(store.query(TaskQuery(limit=0)), [])

    def test_query_oldest_first_breaks_ties_by_task_id(self) -> None:
        store = self.open_store()
        for task_id in ("b", "c", "a"):
            store.create(snap(task_id, at=T0))
        store.create(snap("z-early", at=T0 - timedelta(microseconds=1)))
        store.create(snap("0-late", at=T0 + timedelta(microseconds=1)))
        got = _ids(store.query(TaskQuery(order=QueryOrder.OLDEST_FIRST)))
        self.assertEqual(got, ["z-early", "a", "b", "c", "0-late"])
        self.assertEqual(
            _ids(store.query(TaskQuery(order=QueryOrder.OLDEST_FIRST, limit=2))), ["z-early", "a"]
        )

    def test_query_newest_first_breaks_ties_by_task_id(self) -> None:
        store = self.open_store()
        for task_id in ("b", "c", "a"):
            store.create(snap(task_id, at=T0))
        store.create(snap("z-early", at=T0 - timedelta(microseconds=1)))
        store.create(snap("0-late", at=T0 + timedelta(microseconds=1)))
        got = _ids(store.query(TaskQuery(order=QueryOrder.NEWEST_FIRST)))
        self.assertEqual(got, ["0-late", "c", "b", "a", "z-early"])
        self.assertEqual(_ids(store.query(TaskQuery(limit=2))), ["0-late", "c"])

    def test_query_orders_by_instant_across_utc_offsets(self) -> None:
        store = self.open_store()
        # 文本上 "09:00+08:00" 排在 "02:00+00:00" 之后，但它其实早一个钟头。
        store.create(snap("shanghai-0100utc", at=datetime(2026, 3, 1, 9, 0, tzinfo=TZ_SHANGHAI)))
        store.create(snap("utc-0200", at=datetime(2026, 3, 1, 2, 0, tzinfo=UTC)))
        store.create(snap("odd-0030utc", at=datetime(2026, 2, 28, 21, 0, tzinfo=TZ_ODD)))
        self.assertEqual(
            _ids(store.query(TaskQuery(order=QueryOrder.OLDEST_FIRST))),
            ["odd-0030utc", "shanghai-0100utc", "utc-0200"],
        )
        after = TaskQuery(created_after=datetime(2026, 3, 1, 1, 30, tzinfo=UTC))
        self.assertEqual(_ids(store.query(after)), ["utc-0200"])

    def test_query_filter_combinations(self) -> None:
        store, dataset = self._loaded()
        queries = [
            TaskQuery(statuses=frozenset({S.PENDING, S.QUEUED, S.RUNNING}), tag="io"),
            TaskQuery(
                statuses=frozenset({S.SUCCEEDED, S.FAILED, S.STOPPED}),
                bucket=1,
                order=QueryOrder.OLDEST_FIRST,
            ),
            TaskQuery(name_prefix="extract", owner="node-a"),
            TaskQuery(name_prefix="100%", tag="io", buckets=frozenset({0, 1, 2, 3})),
            TaskQuery(
                pipeline_id="p1",
                created_after=T0 + timedelta(seconds=2),
                lease_expired_before=T0 + timedelta(seconds=20),
            ),
            TaskQuery(owner="node-b", buckets=frozenset({1, 3}), limit=3, order=QueryOrder.OLDEST_FIRST),
            TaskQuery(tag="cpu", created_before=T0 + timedelta(seconds=8), limit=4),
            TaskQuery(bucket=2, buckets=frozenset({2, 3}), pipeline_id="p2", statuses=frozenset(S)),
            TaskQuery(
                statuses=frozenset({S.RUNNING, S.PAUSED, S.PENDING}),
                name_prefix="ext",
                tag="io",
                owner="node-a",
                created_after=T0 - timedelta(seconds=1),
                created_before=T0 + timedelta(seconds=100),
                lease_expired_before=T0 + timedelta(seconds=100),
                order=QueryOrder.OLDEST_FIRST,
                limit=10,
            ),
            TaskQuery(name_prefix="load\\", statuses=frozenset({S.SUCCEEDED, S.PAUSED, S.RUNNING}), limit=0),
        ]
        for query in queries:
            self.assertQuery(store, dataset, query)

    # ===============================================================================================
    # stats / bucket_counts
    # ===============================================================================================

    def test_stats_counts_by_status(self) -> None:
        store, dataset = self._loaded()
        stats = store.stats()
        self.assertIsInstance(stats, TaskStats)
        want = TaskStats({status: sum(1 for s in dataset if s.status is status) for status in S})
        self.assertEqual(stats.counts, want.counts)
        self.assertEqual(stats.total, len(dataset))
        self.assertEqual(store.stats(None).counts, want.counts)

    def test_stats_with_query_ignores_limit(self) -> None:
        store, dataset = self._loaded()
        query = TaskQuery(tag="io", limit=1)
        want = TaskStats(
            {status: sum(1 for s in dataset if s.status is status and query.matches(s)) for status in S}
        )
        self.assertEqual(store.stats(query).counts, want.counts)
        self.assertGreater(store.stats(query).total, 1)

    def test_stats_on_empty_store(self) -> None:
        store = self.open_store()
        stats = store.stats()
        self.assertEqual(stats.total, 0)
        self.assertEqual(stats[S.RUNNING], 0)

    def test_bucket_counts(self) -> None:
        store, dataset = self._loaded()
        want: dict[int, int] = {}
        for s in dataset:
            if s.bucket is not None:
                want[s.bucket] = want.get(s.bucket, 0) + 1
        self.assertEqual(store.bucket_counts(), want)
        self.assertNotIn(None, store.bucket_counts(), "无桶任务不计入")

    def test_bucket_counts_with_query_ignores_limit(self) -> None:
        store, dataset = self._loaded()
        query = TaskQuery(statuses=frozenset({S.PENDING, S.QUEUED, S.RUNNING, S.PAUSED}), limit=1)
        want: dict[int, int] = {}
        for s in dataset:
            if s.bucket is not None and query.matches(s):
                want[s.bucket] = want.get(s.bucket, 0) + 1
        self.assertEqual(store.bucket_counts(query), want)
        self.assertEqual(store.bucket_counts(TaskQuery(owner="nobody")), {})

    # ===============================================================================================
    # history
    # ===============================================================================================

    def test_append_is_idempotent_on_task_and_version(self) -> None:
        store = self.open_store()
        base = snap("ap")
        store.create(base)
        _, records = walk(base, S.QUEUED, S.STARTING)
        store.append(records)
        store.append(records)
        store.append(records[:1])
        duplicate = dataclasses.replace(records[0], reason="重放的另一份", actor="someone-else")
        store.append([duplicate])
        self.assertEqual(
            store.history("ap"), records, "已有 (task_id, version) 的记录必须被忽略，而不是覆盖或重复"
        )

    def test_history_is_ordered_by_version(self) -> None:
        store = self.open_store()
        base = snap("order")
        store.create(base)
        _, records = walk(base, S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED)
        store.append([records[2]])
        store.append([records[0], records[3]])
        store.append([records[1]])
        self.assertEqual(store.history("order"), records)

    def test_append_batch_spanning_tasks(self) -> None:
        store = self.open_store()
        store.create(snap("x"))
        store.create(snap("y"))
        _, rx = walk(snap("x"), S.QUEUED)
        _, ry = walk(snap("y"), S.QUEUED, S.CANCELLED)
        store.append([ry[1], rx[0], ry[0]])
        self.assertEqual(store.history("x"), rx)
        self.assertEqual(store.history("y"), ry)

    def test_append_for_unknown_task_raises_task_not_found(self) -> None:
        store = self.open_store()
        store.create(snap("known"))
        _, known = walk(snap("known"), S.QUEUED)
        _, ghost = walk(snap("ghost"), S.QUEUED)
        with self.assertRaises(TaskNotFound):
            store.append([*known, *ghost])
        self.assertEqual(store.history("ghost"), [])
        self.assertEqual(store.history("known"), [], "含未知任务的一批整批不写")

    def test_history_of_unknown_task_is_empty(self) -> None:
        store = self.open_store()
        self.assertEqual(store.history("nobody"), [])

    # ===============================================================================================
    # touch
    # ===============================================================================================

    def test_touch_updates_side_channel_without_bumping_version(self) -> None:
        store = self.open_store()
        base, records = walk(snap("t-1"), S.QUEUED, S.STARTING, S.RUNNING)
        store.create(base, records)
        progress = Progress(done=120, total=500, unit="partitions", message="第 2 段")
        ok = store.touch(
            "t-1",
            progress=progress,
            heartbeat_at=T0 + timedelta(seconds=9, microseconds=5),
            lease_owner="node-a",
            lease_until=datetime(2026, 3, 1, 16, 1, tzinfo=TZ_SHANGHAI),
        )
        self.assertIs(ok, True)
        got = store.get("t-1")
        assert got is not None
        self.assertEqual(got.status_version, 3, "touch 绝不能递增 status_version")
        self.assertIs(got.status, S.RUNNING)
        self.assertEqual(got.progress, progress)
        self.assertEqual(got.last_heartbeat_at, T0 + timedelta(seconds=9, microseconds=5))
        self.assertEqual(got.lease_owner, "node-a")
        self.assertEqual(got.lease_until, datetime(2026, 3, 1, 16, 1, tzinfo=TZ_SHANGHAI))
        self.assertVersions(store, "t-1", [1, 2, 3])

    def test_touch_none_means_unchanged(self) -> None:
        store = self.open_store()
        store.create(snap("t-partial"))
        store.touch("t-partial", progress=Progress(done=1), lease_owner="n1", lease_until=T0)
        store.touch("t-partial", heartbeat_at=T0 + timedelta(seconds=1))
        store.touch("t-partial")
        got = store.get("t-partial")
        assert got is not None
        self.assertEqual(got.progress, Progress(done=1))
        self.assertEqual((got.lease_owner, got.lease_until), ("n1", T0))
        self.assertEqual(got.last_heartbeat_at, T0 + timedelta(seconds=1))
        self.assertEqual(got.status_version, 0)

    def test_touch_unknown_task_returns_false(self) -> None:
        store = self.open_store()
        self.assertIs(store.touch("ghost", progress=Progress(done=1)), False)
        self.assertIsNone(store.get("ghost"), "touch 不能凭空创建任务")

    def test_touch_never_conflicts_with_save(self) -> None:
        store = self.open_store()
        base = snap("t-save")
        store.create(base)
        for i in range(3):
            store.touch("t-save", progress=Progress(done=i), heartbeat_at=T0 + timedelta(seconds=i))
        queued, record = step(base, S.QUEUED)
        store.save(queued, expect_version=0, transitions=[record])  # touch 之后旧版本号依然有效
        got = store.get("t-save")
        assert got is not None
        self.assertEqual((got.status, got.status_version), (S.QUEUED, 1))
        self.assertEqual(got.progress, Progress(done=2))

    def test_touch_many(self) -> None:
        store = self.open_store()
        store.create(snap("m-1"))
        store.create(snap("m-2", status_version=0))
        lease = T0 + timedelta(seconds=45)
        store.touch_many(
            [
                ("m-1", {"lease_owner": "node-a", "lease_until": lease}),
                ("m-2", {"progress": Progress(done=5, total=10), "heartbeat_at": lease}),
                ("ghost", {"lease_until": lease}),
            ]
        )
        one, two = store.get("m-1"), store.get("m-2")
        assert one is not None and two is not None
        self.assertEqual((one.lease_owner, one.lease_until, one.progress), ("node-a", lease, None))
        self.assertEqual(
            (two.progress, two.last_heartbeat_at, two.lease_owner), (Progress(done=5, total=10), lease, None)
        )
        self.assertEqual((one.status_version, two.status_version), (0, 0))
        self.assertIsNone(store.get("ghost"))

    def test_touch_and_save_interleaved_from_threads(self) -> None:
        store = self.open_store()
        store.create(snap("t-race", status=S.RUNNING))
        saves, touches = 40, 200
        errors: list[BaseException] = []
        start = threading.Barrier(2)

        def saver() -> None:
            try:
                start.wait()
                for _ in range(saves):
                    current = store.get("t-race")
                    assert current is not None
                    target = S.PAUSING if current.status is S.RUNNING else S.RUNNING
                    nxt, record = step(current, target)
                    store.save(nxt, expect_version=current.status_version, transitions=[record])
            except BaseException as exc:
                errors.append(exc)

        def toucher() -> None:
            try:
                start.wait()
                for i in range(1, touches + 1):
                    self.assertTrue(
                        store.touch(
                            "t-race", progress=Progress(done=i), heartbeat_at=T0 + timedelta(seconds=i)
                        )
                    )
            except BaseException as exc:
                errors.append(exc)

        self.run_threads([saver, toucher])
        self.assertEqual(errors, [], "touch 不能让 save 冲突，save 也不能让 touch 失败")
        got = store.get("t-race")
        assert got is not None
        self.assertEqual(got.status_version, saves)
        self.assertEqual(got.progress, Progress(done=touches), "save 不能用旧值覆盖 touch 写入的进度")
        self.assertEqual(got.last_heartbeat_at, T0 + timedelta(seconds=touches))
        self.assertVersions(store, "t-race", list(range(1, saves + 1)))

    # ===============================================================================================
    # commands
    # ===============================================================================================

    def test_submit_command_on_unknown_task_raises(self) -> None:
        store = self.open_store()
        with self.assertRaises(TaskNotFound):
            store.submit_command("ghost", CommandAction.STOP, issuer="ops")
        self.assertEqual(store.claim_commands("w", lease=60), [])

    def test_submit_command_records_fields_and_bucket(self) -> None:
        store, _, _, clock = self.open_timed_store()
        store.create(snap("cmd", bucket=7))
        store.create(snap("cmd-nobucket"))
        first = store.submit_command(
            "cmd", "pause", issuer="ops-console", reason="发布窗口", payload={"宽限": 5, "nested": {"a": [1]}}
        )
        self.assertIsInstance(first, Command)
        self.assertIs(first.action, CommandAction.PAUSE)
        self.assertEqual((first.task_id, first.issuer, first.reason), ("cmd", "ops-console", "发布窗口"))
        self.assertEqual(dict(first.payload), {"宽限": 5, "nested": {"a": [1]}})
        self.assertEqual(first.bucket, 7, "指令要记下任务当时的桶号")
        self.assertEqual(
            (first.claimant, first.lease_until, first.deliveries, first.completed_at), (None, None, 0, None)
        )
        self.assertIsNotNone(first.created_at.utcoffset())
        if clock is not None:
            self.assertEqual(first.created_at, clock.now(), "指令时间必须取自存储注入的时钟")
        second = store.submit_command("cmd-nobucket", CommandAction.STOP)
        self.assertIsNone(second.bucket)
        self.assertEqual(dict(second.payload), {})
        self.assertIsNone(second.issuer)
        self.assertIsInstance(first.command_id, str)
        self.assertNotEqual(first.command_id, second.command_id)
        with self.assertRaises(ValueError):
            store.submit_command("cmd", "explode")

    def test_claim_returns_oldest_first(self) -> None:
        # 注入 FakeClock 时所有指令的创建时间相同：先后只能靠存储自己的顺序号。
        store, _, lease, _ = self.open_timed_store()
        store.create(snap("a"))
        store.create(snap("b"))
        submitted = [
            store.submit_command(task_id, action).command_id
            for task_id, action in [
                ("b", "stop"),
                ("a", "pause"),
                ("b", "resume"),
                ("a", "stop"),
                ("a", "resume"),
            ]
        ]
        claimed = store.claim_commands("w", lease=lease)
        self.assertEqual([c.command_id for c in claimed], submitted)
        for command in claimed:
            self.assertEqual((command.claimant, command.deliveries), ("w", 1))
            self.assertIsNotNone(command.lease_until)

    def test_claim_sets_lease_from_store_clock(self) -> None:
        store, _, lease, clock = self.open_timed_store()
        store.create(snap("lc"))
        store.submit_command("lc", "stop")
        before = datetime.now(UTC)
        (command,) = store.claim_commands("w", lease=lease)
        assert command.lease_until is not None
        if clock is not None:
            self.assertEqual(command.lease_until, clock.now() + timedelta(seconds=lease))
        else:
            self.assertGreaterEqual(
                command.lease_until, before + timedelta(seconds=lease) - timedelta(seconds=1)
            )
            self.assertLessEqual(command.lease_until, datetime.now(UTC) + timedelta(seconds=lease + 1))

    def test_claimed_command_is_invisible_to_others_while_leased(self) -> None:
        store = self.open_store()
        store.create(snap("inv"))
        ids = {store.submit_command("inv", "stop").command_id for _ in range(3)}
        claimed = store.claim_commands("alpha", lease=60)
        self.assertEqual({c.command_id for c in claimed}, ids)
        self.assertEqual(store.claim_commands("beta", lease=60), [])
        self.assertEqual(store.claim_commands("alpha", lease=60), [], "自己持有中的指令也不会被重复取走")

    def test_expired_lease_is_redelivered_with_deliveries_incremented(self) -> None:
        store, advance, lease, _ = self.open_timed_store()
        store.create(snap("exp"))
        submitted = store.submit_command("exp", "stop", reason="维护")
        (first,) = store.claim_commands("crashed-worker", lease=lease)
        self.assertEqual(store.claim_commands("rescuer", lease=lease), [])
        advance(lease * 1.5 if lease == REAL_LEASE else lease + 1)
        (again,) = store.claim_commands("rescuer", lease=lease)
        self.assertEqual(again.command_id, submitted.command_id)
        self.assertEqual((again.claimant, again.deliveries), ("rescuer", 2))
        self.assertEqual(again.reason, "维护")
        assert first.lease_until is not None and again.lease_until is not None
        self.assertGreater(again.lease_until, first.lease_until)
        self.assertEqual(store.claim_commands("third", lease=lease), [])

    def test_completed_command_is_never_redelivered(self) -> None:
        store, advance, lease, _ = self.open_timed_store()
        store.create(snap("done"))
        store.submit_command("done", "stop")
        (command,) = store.claim_commands("w", lease=lease)
        self.assertIs(store.complete_command(command.command_id, "w"), True)
        advance(lease * 1.5 if lease == REAL_LEASE else lease * 10)
        self.assertEqual(store.claim_commands("w", lease=lease), [])
        self.assertEqual(store.claim_commands("other", lease=lease), [])

    def test_previous_holder_cannot_complete_after_redelivery(self) -> None:
        store, advance, lease, _ = self.open_timed_store()
        store.create(snap("steal"))
        store.submit_command("steal", "pause")
        (command,) = store.claim_commands("slow", lease=lease)
        advance(lease * 1.5 if lease == REAL_LEASE else lease + 1)
        (again,) = store.claim_commands("fast", lease=lease)
        self.assertEqual(again.command_id, command.command_id)
        self.assertIs(store.complete_command(command.command_id, "slow"), False, "租约已被别人接手")
        self.assertIs(store.release_command(command.command_id, "slow"), False)
        self.assertIs(store.complete_command(command.command_id, "fast"), True)

    def test_complete_is_idempotent_for_holder_and_false_for_others(self) -> None:
        store = self.open_store()
        store.create(snap("cp"))
        store.submit_command("cp", "stop")
        (command,) = store.claim_commands("holder", lease=60)
        self.assertIs(store.complete_command(command.command_id, "intruder"), False)
        self.assertIs(store.complete_command(command.command_id, "holder"), True)
        self.assertIs(store.complete_command(command.command_id, "holder"), True, "重复完成对持有者幂等")
        self.assertIs(store.complete_command(command.command_id, "intruder"), False)
        self.assertIs(store.complete_command("no-such-command", "holder"), False)
        self.assertIs(store.release_command(command.command_id, "holder"), False, "已完成的指令不能再交还")
        self.assertEqual(store.claim_commands("intruder", lease=60), [])

    def test_unclaimed_command_cannot_be_completed(self) -> None:
        store = self.open_store()
        store.create(snap("uc"))
        command = store.submit_command("uc", "stop")
        self.assertIs(store.complete_command(command.command_id, "anyone"), False)
        self.assertEqual([c.command_id for c in store.claim_commands("w", lease=60)], [command.command_id])

    def test_release_makes_command_immediately_claimable(self) -> None:
        store = self.open_store()
        store.create(snap("rel"))
        store.submit_command("rel", "stop", issuer="ops")
        (command,) = store.claim_commands("query-client", lease=600)
        self.assertIs(store.release_command(command.command_id, "someone-else"), False)
        self.assertEqual(store.claim_commands("owner", lease=600), [], "别人交还失败，指令仍被持有")
        self.assertIs(store.release_command(command.command_id, "query-client"), True)
        self.assertIs(store.release_command(command.command_id, "query-client"), False, "已经交还过了")
        (again,) = store.claim_commands("owner", lease=600)
        self.assertEqual(
            (again.command_id, again.claimant, again.deliveries), (command.command_id, "owner", 2)
        )
        self.assertIs(store.complete_command(command.command_id, "owner"), True)
        self.assertIs(store.release_command("no-such-command", "owner"), False)

    def test_claim_filtered_by_task_ids(self) -> None:
        store = self.open_store()
        for task_id in ("f-1", "f-2", "f-3"):
            store.create(snap(task_id))
            store.submit_command(task_id, "stop")
        got = store.claim_commands("w", lease=60, task_ids=["f-3", "f-1", "absent"])
        self.assertEqual([c.task_id for c in got], ["f-1", "f-3"])
        self.assertEqual(store.claim_commands("w", lease=60, task_ids=[]), [])
        self.assertEqual([c.task_id for c in store.claim_commands("w", lease=60)], ["f-2"])

    def test_claim_filtered_by_buckets(self) -> None:
        store = self.open_store()
        for task_id, bucket in (("b-1", 1), ("b-2", 2), ("b-none", None), ("b-1b", 1), ("b-3", 3)):
            store.create(snap(task_id, bucket=bucket))
            store.submit_command(task_id, "stop")
        got = store.claim_commands("node-1", lease=60, buckets={1})
        self.assertEqual([(c.task_id, c.bucket) for c in got], [("b-1", 1), ("b-1b", 1)])
        both = store.claim_commands("node-2", lease=60, buckets=[2, 3], task_ids=["b-3", "b-none"])
        self.assertEqual([c.task_id for c in both], ["b-3"], "task_ids 与 buckets 同时给出时取交集")
        self.assertEqual(store.claim_commands("node-x", lease=60, buckets=[0, 4, 5]), [])
        self.assertEqual([c.task_id for c in store.claim_commands("any", lease=60)], ["b-2", "b-none"])

    def test_claim_limit(self) -> None:
        store = self.open_store()
        store.create(snap("lim"))
        ids = [store.submit_command("lim", "stop").command_id for _ in range(7)]
        self.assertEqual(store.claim_commands("w", lease=60, limit=0), [])
        self.assertEqual([c.command_id for c in store.claim_commands("w", lease=60, limit=3)], ids[:3])
        self.assertEqual([c.command_id for c in store.claim_commands("w", lease=60, limit=3)], ids[3:6])
        self.assertEqual([c.command_id for c in store.claim_commands("w", lease=60, limit=3)], ids[6:])

    def test_claim_rejects_bad_lease(self) -> None:
        store = self.open_store()
        store.create(snap("bl"))
        store.submit_command("bl", "stop")
        for lease in (0, -1, math.nan, math.inf):
            with self.assertRaises(ConfigurationError):
                store.claim_commands("w", lease=lease)
        self.assertEqual(len(store.claim_commands("w", lease=60)), 1, "被拒绝的认领不能取走指令")

    def test_concurrent_claimers_never_share_a_command(self) -> None:
        store = self.open_store()
        store.create(snap("cc-a", bucket=0))
        store.create(snap("cc-b", bucket=1))
        ids = {store.submit_command("cc-a" if i % 2 else "cc-b", "stop").command_id for i in range(80)}
        claimers = 4
        got: list[list[Command]] = [[] for _ in range(claimers)]
        errors: list[BaseException] = []
        start = threading.Barrier(claimers)

        def claimer(i: int) -> None:
            try:
                start.wait()
                # 有上限的循环：坏掉的存储若反复交出同一批指令，用例要失败而不是永远转下去。
                for _ in range(len(ids) + 1):
                    batch = store.claim_commands(f"claimer-{i}", lease=600, limit=3)
                    if not batch:
                        return
                    got[i].extend(batch)
            except BaseException as exc:
                errors.append(exc)

        self.run_threads([functools.partial(claimer, i) for i in range(claimers)])
        self.assertEqual(errors, [])
        every = [c.command_id for batch in got for c in batch]
        self.assertEqual(len(every), len(set(every)), "同一条指令在租约内被两个认领者取走了")
        self.assertEqual(set(every), ids)
        for i, batch in enumerate(got):
            for command in batch:
                self.assertEqual((command.claimant, command.deliveries), (f"claimer-{i}", 1))

    # ===============================================================================================
    # membership (publish_node / list_nodes / remove_node)
    # ===============================================================================================

    def assertNodeEqual(self, got: NodeRecord, want: NodeRecord) -> None:
        self.assertEqual(got, want, f"节点 {want.owner!r} 的记录没有原样往返")
        self.assertIsInstance(got, NodeRecord)
        self.assertEqual(got.buckets is None, want.buckets is None, "buckets 的 None（不限定）与集合必须区分")
        if want.buckets is not None:
            self.assertIsInstance(got.buckets, frozenset, "buckets 必须还原成 frozenset")
        for name in ("heartbeat_at", "expires_at"):
            value, expected = getattr(got, name), getattr(want, name)
            self.assertIsInstance(value, datetime)
            # datetime 相等只比时刻：偏移要单独比，否则改写成 UTC 的后端也能蒙混过关。
            self.assertEqual(value.utcoffset(), expected.utcoffset(), f"{name} 的时区偏移变了")
            self.assertEqual(value.isoformat(), expected.isoformat(), f"{name} 没有逐字往返")
        self.assertEqual(json.dumps(got.info, sort_keys=True), json.dumps(want.info, sort_keys=True))

    def test_publish_node_round_trips_every_field(self) -> None:
        store = self.open_store()
        heartbeat = datetime(2026, 3, 1, 9, 15, 30, 123457, tzinfo=TZ_SHANGHAI)
        original = node(
            "节点-甲:4321",
            buckets={0, 5, 63, 17},
            num_buckets=64,
            heartbeat_at=heartbeat,
            expires_at=datetime(2026, 2, 28, 21, 46, 0, 1, tzinfo=TZ_ODD),
            info={
                "hostname": "机房-北京-07",
                "pid": 4321,
                "version": "0.1.0",
                "big": 2**53 + 1,
                "嵌套": {
                    "list": [1, 2.5, None, True, "文本"],
                    "empty": {},
                    "引号": '含 "双引号" 与 \\ 反斜杠',
                },
            },
        )
        self.assertIsNone(store.publish_node(original))
        got = store.list_nodes()
        self.assertEqual(len(got), 1)
        self.assertNodeEqual(got[0], original)
        self.assertEqual(got[0].expires_at.microsecond, 1)
        self.assertEqual(got[0].info["big"], 2**53 + 1, "大整数不能经浮点走样")
        self.assertIsInstance(got[0].info["big"], int)

    def test_node_buckets_none_and_empty_set_are_distinct(self) -> None:
        store = self.open_store()
        unlimited = node("unlimited", buckets=None)
        draining = node("draining", buckets=frozenset())
        single = node("single", buckets={7}, num_buckets=8)
        for record in (unlimited, draining, single):
            store.publish_node(record)
        got = {record.owner: record for record in store.list_nodes()}
        self.assertIsNone(got["unlimited"].buckets, "None 表示不限定桶，不能变成空集合")
        self.assertEqual(got["draining"].buckets, frozenset(), "空集合表示一个桶也不负责，不能变成 None")
        self.assertIsNotNone(got["draining"].buckets)
        for record in (unlimited, draining, single):
            self.assertNodeEqual(got[record.owner], record)

    def test_publish_node_same_owner_replaces_last_writer_wins(self) -> None:
        store = self.open_store()
        first = node("node-a", buckets=range(16), heartbeat_at=T0 + timedelta(seconds=60), info={"pid": 1})
        store.publish_node(first)
        store.publish_node(node("node-b", buckets=range(16, 32)))
        # 第二次写的心跳反而更早：仍然按写入先后覆盖，存储不比较时间。
        second = node(
            "node-a", buckets=None, num_buckets=32, heartbeat_at=T0, ttl=5.0, info={"pid": 2, "新": "值"}
        )
        store.publish_node(second)
        got = store.list_nodes()
        self.assertEqual([record.owner for record in got], ["node-a", "node-b"], "同一 owner 只能有一条记录")
        self.assertNodeEqual(got[0], second)
        self.assertNotIn("新", first.info)

    def test_remove_node(self) -> None:
        store = self.open_store()
        for owner in ("node-a", "node-b", "节点-丙"):
            store.publish_node(node(owner))
        self.assertIs(store.remove_node("node-b"), True)
        self.assertIs(store.remove_node("node-b"), False, "删第二次：本来就没有了")
        self.assertIs(store.remove_node("never-published"), False)
        self.assertIs(store.remove_node("Node-A"), False, "owner 区分大小写")
        self.assertEqual([record.owner for record in store.list_nodes()], ["node-a", "节点-丙"])
        store.publish_node(node("node-b"))  # 删掉之后可以重新发布
        self.assertEqual(len(store.list_nodes()), 3)

    def test_list_nodes_is_ordered_by_owner_code_points(self) -> None:
        store = self.open_store()
        owners = [
            "node-b",
            "Node-a",
            "node-a",
            "节点-甲",
            "node-10",
            "node-9",
            "a b",
            "node_a",
            "Ünïcödé",
            "z",
        ]
        for i, owner in enumerate(reversed(owners)):
            store.publish_node(node(owner, heartbeat_at=T0 + timedelta(seconds=i)))
        self.assertEqual([record.owner for record in store.list_nodes()], sorted(owners))

    def test_list_nodes_includes_expired_records(self) -> None:
        store = self.open_store()
        long_dead = node("crashed", heartbeat_at=T0 - timedelta(days=3), ttl=30.0)
        alive = node("alive", heartbeat_at=datetime.now(UTC), ttl=3600.0)
        store.publish_node(long_dead)
        store.publish_node(alive)
        got = {record.owner: record for record in store.list_nodes()}
        self.assertEqual(set(got), {"crashed", "alive"}, "过期的记录也要列出：判断死活是检查者的事")
        self.assertNodeEqual(got["crashed"], long_dead)
        self.assertFalse(got["crashed"].alive(T0))
        self.assertTrue(got["alive"].alive(datetime.now(UTC)))

    def test_node_record_and_membership_validation(self) -> None:
        store = self.open_store()
        naive = datetime(2026, 3, 1, 8, 0, 0)
        bad_records: list[tuple[str, Callable[[], object]]] = [
            ("空 owner", lambda: node("")),
            ("owner 非字符串", lambda: node(42)),  # type: ignore[arg-type]
            ("owner 含 NUL", lambda: node("node\x00a")),
            ("桶号越界", lambda: node("n", buckets={64}, num_buckets=64)),
            ("负桶号", lambda: node("n", buckets={-1})),
            ("布尔桶号", lambda: node("n", buckets={True})),
            ("桶集合写成单个整数", lambda: node("n", buckets=3)),  # type: ignore[arg-type]
            ("桶数为 0", lambda: node("n", buckets=None, num_buckets=0)),
            ("桶数为布尔", lambda: node("n", buckets=None, num_buckets=True)),
            ("心跳时间不带时区", lambda: node("n", heartbeat_at=naive)),
            ("到期时间不带时区", lambda: node("n", expires_at=naive)),
            ("到期早于心跳", lambda: node("n", ttl=-1.0)),
            ("info 不是对象", lambda: node("n", info=[1, 2])),  # type: ignore[arg-type]
            ("info 不可 JSON 序列化", lambda: node("n", info={"x": object()})),
            ("info 含 NaN", lambda: node("n", info={"x": math.nan})),
        ]
        for label, build in bad_records:
            with self.subTest(case=label), self.assertRaises(ConfigurationError):
                build()
        for bad in (None, "node-a", node("node-a").to_dict()):
            with self.subTest(record=type(bad).__name__), self.assertRaises(ConfigurationError):
                store.publish_node(bad)  # type: ignore[arg-type]
        for owner in ("", None, 42):
            with self.subTest(owner=owner), self.assertRaises(ConfigurationError):
                store.remove_node(owner)  # type: ignore[arg-type]
        self.assertEqual(store.list_nodes(), [], "被拒绝的写入不能留下任何记录")
        with self.assertRaises(ConfigurationError):
            node("n").alive(naive)

    def test_node_record_dict_round_trip(self) -> None:
        original = node(
            "节点-乙", buckets={1, 2, 3}, heartbeat_at=datetime(2026, 3, 1, 9, 0, 0, 5, tzinfo=TZ_ODD)
        )
        data = original.to_dict()
        self.assertEqual(json.loads(json.dumps(data)), data, "to_dict 必须是纯 JSON")
        self.assertEqual(data["buckets"], [1, 2, 3])
        again = NodeRecord.from_dict(json.loads(json.dumps(data, ensure_ascii=False)))
        self.assertNodeEqual(again, original)
        self.assertIsNone(NodeRecord.from_dict(node("n", buckets=None).to_dict()).buckets)
        odd: dict[Any, Any] = {"t": (1, 2), 3: "键"}
        normalized = node("n", info=odd)
        self.assertEqual(normalized.info, {"t": [1, 2], "3": "键"}, "info 在构造时就规范成 JSON 的样子")

    def test_node_info_is_copied_in_and_out(self) -> None:
        store = self.open_store()
        info: dict[str, Any] = {"tags": ["a"], "nested": {"k": 1}}
        record = node("node-a", info=info)
        store.publish_node(record)
        record.info["tags"].append("改了原对象")
        first = store.list_nodes()[0]
        self.assertEqual(first.info, {"tags": ["a"], "nested": {"k": 1}}, "存储里的那份不能跟着原对象变")
        first.info["nested"]["k"] = 999
        self.assertEqual(store.list_nodes()[0].info["nested"], {"k": 1}, "改返回的记录不能影响存储")

    def test_membership_is_independent_of_tasks(self) -> None:
        store = self._prune_fixture()
        store.publish_node(node("node-a", buckets={0}))
        self.assertEqual(store.stats().total, 11, "发布节点不能改动任务")
        self.assertEqual(store.prune(keep_terminal=0), 5)
        self.assertEqual([record.owner for record in store.list_nodes()], ["node-a"], "prune 不能删节点记录")
        store.remove_node("node-a")
        self.assertEqual(store.stats().unfinished, 6)

    def test_concurrent_publishers_from_threads(self) -> None:
        store = self.open_store()
        writers, rounds = 6, 20
        errors: list[BaseException] = []
        shared_versions: set[str] = set()
        start = threading.Barrier(writers)

        def publisher(i: int) -> None:
            try:
                start.wait()
                for r in range(rounds):
                    beat = T0 + timedelta(seconds=r)
                    store.publish_node(
                        node(f"w-{i}", buckets={i, r % 8}, heartbeat_at=beat, info={"round": r})
                    )
                    # 所有线程同时覆盖同一个 owner：最后只能剩一条，且是某一次完整的写入。
                    store.publish_node(
                        node("shared", buckets={i}, heartbeat_at=beat, info={"by": i, "round": r})
                    )
                    if r % 5 == 0:
                        self.assertIn(f"w-{i}", {record.owner for record in store.list_nodes()})
            except BaseException as exc:
                errors.append(exc)

        for i in range(writers):
            for r in range(rounds):
                shared_versions.add(json.dumps({"by": i, "round": r, "bucket": i}, sort_keys=True))
        self.run_threads([functools.partial(publisher, i) for i in range(writers)])
        self.assertEqual(errors, [])
        got = {record.owner: record for record in store.list_nodes()}
        self.assertEqual(set(got), {f"w-{i}" for i in range(writers)} | {"shared"})
        for i in range(writers):
            last = node(
                f"w-{i}",
                buckets={i, (rounds - 1) % 8},
                heartbeat_at=T0 + timedelta(seconds=rounds - 1),
                info={"round": rounds - 1},
            )
            self.assertNodeEqual(got[f"w-{i}"], last)
        shared = got["shared"]
        assert shared.buckets is not None
        self.assertEqual(len(shared.buckets), 1)
        torn = json.dumps({**shared.info, "bucket": next(iter(shared.buckets))}, sort_keys=True)
        self.assertIn(torn, shared_versions, "同一 owner 的记录被拼成了两次写入的混合体")
        self.assertEqual(shared.heartbeat_at, T0 + timedelta(seconds=shared.info["round"]))

    # ===============================================================================================
    # prune
    # ===============================================================================================

    def _prune_fixture(self) -> TaskStore:
        store = self.open_store()
        # 终态任务的 finished_at 顺序刻意与 created_at 顺序相反：按创建时间删就错了。
        paths = [
            (S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED),
            (S.QUEUED, S.STARTING, S.RUNNING, S.FAILED),
            (S.QUEUED, S.STOPPED),
            (S.CANCELLED,),
            (S.QUEUED, S.STARTING, S.LOST),
        ]
        for i, path in enumerate(paths):
            done, records = walk(snap(f"term-{i}", at=T0 + timedelta(seconds=i)), *path)
            done = dataclasses.replace(done, finished_at=T0 + timedelta(hours=10 - i))
            store.create(done, records)
            store.submit_command(done.task_id, "stop")
        # 非终态任务比所有终态任务都"旧"：prune 也绝不能碰它们。
        for i, status in enumerate([S.PENDING, S.QUEUED, S.RUNNING, S.PAUSED, S.RETRY_WAIT, S.BLOCKED]):
            store.create(snap(f"live-{i}", at=T0 - timedelta(days=30), status=status))
            store.submit_command(f"live-{i}", "stop")
        return store

    def test_prune_keeps_newest_terminal_tasks(self) -> None:
        store = self._prune_fixture()
        self.assertEqual(store.prune(keep_terminal=2), 3)
        terminal = {s.task_id for s in store.query() if s.is_terminal}
        self.assertEqual(terminal, {"term-0", "term-1"}, "按 finished_at 保留最新的 N 个")
        self.assertEqual(store.prune(keep_terminal=2), 0)
        self.assertEqual(store.stats().total, 8)

    def test_prune_never_deletes_non_terminal_tasks(self) -> None:
        store = self._prune_fixture()
        self.assertEqual(store.prune(keep_terminal=0), 5)
        remaining = {s.task_id for s in store.query()}
        self.assertEqual(remaining, {f"live-{i}" for i in range(6)})
        self.assertEqual(store.stats().unfinished, 6)

    def test_prune_removes_history_and_commands_of_pruned_tasks(self) -> None:
        store = self._prune_fixture()
        kept_history = store.history("term-0")
        self.assertTrue(kept_history)
        store.prune(keep_terminal=1)
        for i in range(1, 5):
            self.assertIsNone(store.get(f"term-{i}"))
            self.assertEqual(store.history(f"term-{i}"), [], "被删任务的历史也要删掉")
        self.assertEqual(store.history("term-0"), kept_history)
        claimed = {c.task_id for c in store.claim_commands("w", lease=60)}
        self.assertEqual(claimed, {"term-0"} | {f"live-{i}" for i in range(6)}, "被删任务的指令也要删掉")

    def test_prune_rejects_negative_keep(self) -> None:
        store = self._prune_fixture()
        with self.assertRaises(ConfigurationError):
            store.prune(keep_terminal=-1)
        self.assertEqual(store.stats().total, 11)

    # ===============================================================================================
    # close
    # ===============================================================================================

    def test_close_twice_is_fine(self) -> None:
        store = self.open_store()
        store.create(snap("cl"))
        store.close()
        store.close()

    def test_calls_after_close_raise_store_error(self) -> None:
        store = self.open_store()
        base = snap("closed")
        store.create(base)
        command = store.submit_command("closed", "stop")
        store.close()
        queued, record = step(base, S.QUEUED)
        calls: list[tuple[str, Callable[[], object]]] = [
            ("create", lambda: store.create(snap("new"))),
            ("save", lambda: store.save(queued, expect_version=0, transitions=[record])),
            ("get", lambda: store.get("closed")),
            ("query", lambda: store.query()),
            ("stats", lambda: store.stats()),
            ("bucket_counts", lambda: store.bucket_counts()),
            ("append", lambda: store.append([record])),
            ("history", lambda: store.history("closed")),
            ("touch", lambda: store.touch("closed", progress=Progress(done=1))),
            ("touch_many", lambda: store.touch_many([("closed", {"progress": Progress(done=1)})])),
            ("submit_command", lambda: store.submit_command("closed", "stop")),
            ("claim_commands", lambda: store.claim_commands("w", lease=60)),
            ("complete_command", lambda: store.complete_command(command.command_id, "w")),
            ("release_command", lambda: store.release_command(command.command_id, "w")),
            ("prune", lambda: store.prune(keep_terminal=0)),
            ("publish_node", lambda: store.publish_node(node("node-a"))),
            ("list_nodes", lambda: store.list_nodes()),
            ("remove_node", lambda: store.remove_node("node-a")),
        ]
        for name, call in calls:
            with self.subTest(method=name), self.assertRaises(StoreError):
                call()

    def test_context_manager_closes_the_store(self) -> None:
        store = self.open_store()
        with store as entered:
            self.assertIs(entered, store)
            store.create(snap("ctx"))
        with self.assertRaises(StoreError):
            store.get("ctx")


__all__ = ["StoreContract", "full_snapshot", "node", "snap", "step", "walk"]
