"""写穿交给 SqliteTaskStore 的 create（组提交的 ``_create_direct`` 与混合批的 ``_write_many_direct``）：
迁移记录是状态机的紧凑历史，存储直接编成行、不先现造 Transition。写下的行必须与公开的 create / write_many（先
``unpack_transition``）逐列相同，逐项结果（重复 id、存不下的快照、版本冲突）也相同。"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from chongming_task.core.records import unpack_transition
from chongming_task.core.state_machine import StateMachine
from chongming_task.errors import ConcurrencyConflict, ConfigurationError, DuplicateTaskId
from chongming_task.models import Transition
from chongming_task.states import TaskStatus
from chongming_task.storage import SaveRequest
from chongming_task.stores.sqlite import SqliteTaskStore
from chongming_task.stores.sqlite import _codec as codec

T0 = datetime(2026, 3, 1, 8, 0, 0, 123456, tzinfo=UTC)


@pytest.mark.parametrize(
    "at",
    [
        T0,
        T0.replace(microsecond=0),
        T0.astimezone(timezone(timedelta(hours=8))),
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=-5))),
    ],
)
@pytest.mark.parametrize("actor, reason", [(None, None), ("node-1", None), (None, "原因"), ("a", "b")])
def test_a_packed_transition_encodes_to_the_row_of_its_unpacked_record(
    at: datetime, actor: str | None, reason: str | None
) -> None:
    packed = ("queued", "starting", "start", actor, reason, 3, at)
    assert codec.packed_transition_row("t-1", packed) == codec.transition_row(
        unpack_transition("t-1", packed)
    )


def _machines(count: int, prefix: str) -> list[StateMachine]:
    machines = []
    for index in range(count):
        machine = StateMachine.create(
            f"{prefix}-{index}", "job", created_at=T0 + timedelta(seconds=index), tags=frozenset({"io"})
        )
        machine.mark_queued(actor="submitter" if index % 2 else None)
        machines.append(machine)
    return machines


def _dump(path: Path) -> dict[str, list[Any]]:
    conn = sqlite3.connect(path)
    try:
        return {
            table: conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
            for table in ("tasks", "transitions", "task_tags")
        }
    finally:
        conn.close()


def test_create_direct_writes_the_rows_create_writes(tmp_path: Path) -> None:
    direct = SqliteTaskStore(tmp_path / "direct.db")
    public = SqliteTaskStore(tmp_path / "public.db")
    try:
        for machine in _machines(3, "t"):
            snapshot, packed = machine.snapshot, machine.packed_transitions()
            assert len(packed) == 1
            direct._create_direct(snapshot, packed)
            public.create(snapshot, [unpack_transition(snapshot.task_id, record) for record in packed])
        with pytest.raises(DuplicateTaskId):
            direct._create_direct(snapshot, packed)
        assert direct.history("t-1") == public.history("t-1")
    finally:
        direct.close()
        public.close()
    assert _dump(tmp_path / "direct.db") == _dump(tmp_path / "public.db")


def test_a_mixed_batch_of_packed_creates_gives_the_results_and_rows_of_write_many(tmp_path: Path) -> None:
    direct = SqliteTaskStore(tmp_path / "direct.db")
    public = SqliteTaskStore(tmp_path / "public.db")
    try:
        existing = _machines(2, "old")
        for machine in existing:
            direct._create_direct(machine.snapshot, machine.packed_transitions())
            public._create_direct(machine.snapshot, machine.packed_transitions())
        fresh = _machines(2, "new")
        bad = fresh[1].snapshot.evolve(description="坏\x00")  # 存不下的快照：这一项自己的 ConfigurationError
        creates = [
            (fresh[0].snapshot, fresh[0].packed_transitions()),
            (bad, fresh[1].packed_transitions()),
            (existing[0].snapshot, existing[0].packed_transitions()),  # 重复 id
        ]
        old = existing[1].snapshot
        assert old.status_version == 1
        record = Transition(old.task_id, old.status, TaskStatus.STARTING, "start", None, None, 2, T0)
        started = old.evolve(status=TaskStatus.STARTING, status_version=2)
        skipped = Transition(old.task_id, old.status, TaskStatus.STARTING, "start", None, None, 8, T0)
        saves = [
            SaveRequest(started, 1, (record,)),
            SaveRequest(started, 7, (skipped,)),  # 记录的版本接不上：ConfigurationError
            SaveRequest(existing[0].snapshot.evolve(status_version=5), 5, ()),  # 存储里是 1：冲突
        ]
        got = direct._write_many_direct(creates, saves)
        want = public.write_many(
            [(s, [unpack_transition(s.task_id, p) for p in packed]) for s, packed in creates], saves
        )
    finally:
        direct.close()
        public.close()
    assert [[type(error) for error in column] for column in got] == [
        [type(error) for error in column] for column in want
    ]
    assert [type(error) for error in got[0]] == [type(None), ConfigurationError, DuplicateTaskId]
    assert [type(error) for error in got[1]] == [type(None), ConfigurationError, ConcurrencyConflict]
    assert [[str(error) for error in column] for column in got] == [
        [str(error) for error in column] for column in want
    ]
    assert _dump(tmp_path / "direct.db") == _dump(tmp_path / "public.db")


def test_group_commit_hands_packed_creates_to_the_store_without_making_transitions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """组提交的混合批把紧凑历史原样交给 ``_write_many_direct``：不先现造 Transition。"""
    from chongming_task.runtime import group_commit
    from chongming_task.stores.sqlite import store as store_module

    def refuse(task_id: str, packed: Any) -> Any:
        raise AssertionError("不该现造 Transition")

    monkeypatch.setattr(group_commit, "unpack_transition", refuse)
    monkeypatch.setattr(store_module, "unpack_transition", refuse)
    store = SqliteTaskStore(tmp_path / "tasks.db")
    try:
        commits = group_commit.GroupCommit(store)
        machines = _machines(2, "g")
        batch = [group_commit.Pending(None, (m.snapshot, m.packed_transitions())) for m in machines]
        commits._commit(batch)
        assert [item.error for item in batch] == [None, None]
        assert sorted(s.task_id for s in store.query()) == ["g-0", "g-1"]
        monkeypatch.undo()
        assert store.history("g-1") == list(machines[1].transitions)
    finally:
        store.close()


class _Wrapping:
    """排在存储之前的混入类：记下经过 write_many / create 的每一项（故障注入与记账的常见写法）。"""

    seen: list[str]

    def write_many(self, creates: Any, saves: Any) -> Any:
        self.seen.extend(f"write_many {s.task_id} {[t.version for t in records]}" for s, records in creates)
        return super().write_many(creates, saves)  # type: ignore[misc]

    def create(self, snapshot: Any, transitions: Any = ()) -> None:
        self.seen.append(f"create {snapshot.task_id} {[t.version for t in transitions]}")
        super().create(snapshot, transitions)  # type: ignore[misc]


class _WrappedStore(_Wrapping, SqliteTaskStore):
    pass


@pytest.mark.parametrize("how", ["mixin", "instance"])
def test_a_wrapped_write_many_or_create_still_sees_every_write_through_create(
    tmp_path: Path, how: str
) -> None:
    """``write_many`` / ``create`` 被包了一层（混入类、或实例上换掉的，如组提交崩溃试验的工作节点）时，
    组提交的混合批与单个 create 照旧经过它，收到的是 Transition。"""
    from chongming_task.runtime.group_commit import GroupCommit, Pending

    if how == "mixin":
        store: Any = _WrappedStore(tmp_path / "tasks.db")
        store.seen = []
    else:
        store = SqliteTaskStore(tmp_path / "tasks.db")
        store.seen = []
        real_write_many, real_create = store.write_many, store.create

        def write_many(creates: Any, saves: Any) -> Any:
            store.seen.extend(f"write_many {s.task_id} {[t.version for t in r]}" for s, r in creates)
            return real_write_many(creates, saves)

        def create(snapshot: Any, transitions: Any = ()) -> None:
            store.seen.append(f"create {snapshot.task_id} {[t.version for t in transitions]}")
            real_create(snapshot, transitions)

        store.write_many, store.create = write_many, create
    try:
        commits = GroupCommit(store)
        machines = _machines(3, "w")
        commits._commit([Pending(None, (m.snapshot, m.packed_transitions())) for m in machines[:2]])
        commits._commit([Pending(None, (machines[2].snapshot, machines[2].packed_transitions()))])
        assert store.seen == ["write_many w-0 [1]", "write_many w-1 [1]", "create w-2 [1]"]
        assert sorted(s.task_id for s in store.query()) == ["w-0", "w-1", "w-2"]
    finally:
        store.close()


@pytest.mark.parametrize("first_good", [False, True])
@pytest.mark.parametrize(
    "field, value",
    [("executor", "thr\x00ead"), ("description", "坏\ud800"), ("priority", True), ("label", "坏\x00")],
)
def test_the_snapshot_of_a_packed_create_is_checked(
    tmp_path: Path, first_good: bool, field: str, value: object
) -> None:
    """新任务的快照相对上一个查过的快照检查（只查不是同一个对象的字段）：存不下的值照样被拒绝，
    不论它是第一个还是紧跟在一个同模板的好快照之后。"""
    store = SqliteTaskStore(tmp_path / "tasks.db")
    try:
        good, bad = _machines(2, "c")
        if first_good:
            store._create_direct(good.snapshot, good.packed_transitions())
        with pytest.raises(ConfigurationError):
            store._create_direct(bad.snapshot.evolve(**{field: value}), bad.packed_transitions())
        assert store.get("c-1") is None
        with pytest.raises(ConfigurationError):
            store._create_direct("x", ())  # type: ignore[arg-type]
    finally:
        store.close()


def _transition_rows(count: int, actor_every: int = 0, reason_every: int = 0) -> list[tuple[Any, ...]]:
    rows = []
    for index in range(count):
        actor = "a" if actor_every and index % actor_every == 0 else None
        reason = "r" if reason_every and index % reason_every == 1 else None
        packed = ("queued", "starting", "start", actor, reason, index + 1, T0 + timedelta(microseconds=index))
        rows.append(codec.packed_transition_row(f"t-{index % 3}", packed))
    return rows


@pytest.mark.parametrize("count", [0, 1, 2, 3, 64, 65, 130])
@pytest.mark.parametrize("actor_every, reason_every", [(0, 0), (2, 0), (0, 3), (2, 3), (1, 0)])
def test_transition_inserts_are_the_generic_null_shaped_inserts(
    count: int, actor_every: int, reason_every: int
) -> None:
    from chongming_task.stores.sqlite import _sql

    rows = _transition_rows(count, actor_every, reason_every)
    assert _sql.transition_inserts(rows) == _sql.insert_rows_without_nulls(_sql.INSERT_TRANSITION_HEAD, rows)


def test_encoding_new_times_leaves_few_gc_tracked_containers_alive() -> None:
    """时间编码的记忆表不让每个新时刻的几个元组一直活着：它们在循环 GC 的账上是"活下来的新容器"，第 0 代
    攒够 700 个就回收一次（bench/README.md 第十九轮 sq19：原来 4,096 项的表让逐个 submit 的第 0 代回收多出
    约一半）。编一千个新时刻之后，活着的新容器（第 0 代的计数）只能是记忆表上限那么多项，不随时刻数增长；
    同一个时间对象紧接着再编照样命中（同一个结果对象）。"""
    import gc

    times = [T0 + timedelta(microseconds=i) for i in range(1_000)]  # datetime 不是 GC 追踪的容器
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for value in times:
            pair = codec._encode_keyed_time(value)
            assert codec._encode_keyed_time(value) is pair
            assert codec._encode_time(value) == pair[:1]
        alive = gc.get_count()[0] - before
    finally:
        gc.enable()
    # 与时刻数无关的一个小数（记忆表的上限乘每项三个元组）；原来每个新时刻留下三个，一千个就是三千。
    # （别的线程此刻的分配也记在这个计数上：留一百的余量。）
    assert alive <= 3 * codec._TIME_MEMO_SIZE + 100 < len(times) // 2, (
        f"编一千个新时刻留下了 {alive} 个活着的新容器"
    )
