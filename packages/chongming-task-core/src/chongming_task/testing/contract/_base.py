"""契约套件的共用部分：测试数据、钩子与管道（plumbing）。

各类流量的用例在同目录的兄弟模块里，每个模块一个 mixin；``chongming_task.testing.store_contract``
把它们组合成 ``StoreContract``。这里的一切都不是用例本身，只是用例共用的工具。
"""

from __future__ import annotations

import dataclasses
import threading
import time
import unittest
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, ClassVar

from chongming_task.models import Failure, FailureKind, Progress, TaskSnapshot, Transition
from chongming_task.states import TaskStatus
from chongming_task.storage import NodeRecord, TaskStore
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


_ABSTRACT_MODULES = ("chongming_task.testing.contract.", "chongming_task.testing.store_contract")


class ContractBase(unittest.TestCase):
    """所有契约 mixin 的共同基类：实现者的钩子与用例共用的断言。

    本身与各 mixin 都不是可运行的套件（``__test__ = False``，unittest 直接跑时整体跳过）；
    只有实现者写的子类才会被收集。
    """

    __test__: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # 显式写了 __test__ 的（抽象中间类）尊重它自己的选择；否则本包里定义的类（各 mixin）与
        # setUpClass 的跳过规则一致，都是抽象的、不收集，实现者写的子类默认参与收集。规则只写在这里，
        # 各 mixin 不必各自重申 ``__test__ = False``。
        if "__test__" not in cls.__dict__:
            cls.__test__ = not cls.__module__.startswith(_ABSTRACT_MODULES)

    @classmethod
    def setUpClass(cls) -> None:
        # 本包里定义的类（ContractBase、各 mixin、StoreContract）都是抽象的：它们没有 make_store()，
        # 直接用 unittest 跑只会得到一屏 NotImplementedError，所以整体跳过并说明该怎么用。
        if cls.__module__.startswith(_ABSTRACT_MODULES):
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

    def assertNeverSaved(self, store: TaskStore, task_id: str) -> None:
        """被拒绝的 save 什么都没留下：快照仍是 create 时的版本 0，历史为空（整笔写入要么全有要么全无）。"""
        got = store.get(task_id)
        assert got is not None
        self.assertEqual(got.status_version, 0)
        self.assertEqual(store.history(task_id), [])

    def _prune_fixture(self) -> TaskStore:
        """prune 用例与成员表用例共用：5 个终态任务与 6 个未结束的任务。"""
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
