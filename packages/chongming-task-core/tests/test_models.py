"""快照、迁移记录、失败、进度：校验与 to_dict / from_dict 的逐字段精确往返。

存储后端都靠这个往返：这里不只比较 ``==``（带时区的 datetime 按时刻比较，+08:00 与 UTC 的
同一时刻也"相等"），还逐字段比较 UTC 偏移与类型，并且让字典真的经过一遍 JSON 文本。
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chongming_task.errors import ConfigurationError
from chongming_task.models import (
    MAX_ID_LENGTH,
    Failure,
    FailureKind,
    Outcome,
    Progress,
    TaskSnapshot,
    Transition,
    normalize_tags,
    validate_task_id,
)
from chongming_task.states import TaskStatus

UTC = timezone.utc  # noqa: UP017 - 与 timezone(offset) 并列时更清楚
T0 = datetime(2026, 10, 2, 8, 30, 15, 123456, tzinfo=timezone(timedelta(hours=8)))

# -- strategies ----------------------------------------------------------------------------------------

CJK = st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF)
# 孤立代理项不是合法的 Unicode 文本；NUL 任何存储都不接受（用户指南 §13）——可存储的文本里两者都没有。
ANY_CHAR = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
TEXT = st.text(st.one_of(CJK, ANY_CHAR), max_size=30)
IDENT = st.text(
    st.one_of(CJK, st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")), min_size=1
)
IDENT = IDENT.filter(lambda s: len(s) <= MAX_ID_LENGTH)
# 偏移取整秒（含 +05:45:07 这种历史上的秒级偏移）；秒以下的偏移在入口处就被拒绝，见下面的用例。
OFFSETS = st.integers(min_value=-(24 * 3600 - 1), max_value=24 * 3600 - 1).map(lambda s: timedelta(seconds=s))
ZONES = st.one_of(st.just(UTC), OFFSETS.map(timezone))
AWARE = st.datetimes(
    min_value=datetime(1970, 1, 2), max_value=datetime(9998, 12, 30), timezones=ZONES, allow_imaginary=False
)
MAYBE_AWARE = st.one_of(st.none(), AWARE)
JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63),
        st.floats(allow_nan=False, allow_infinity=False),
        TEXT,
    ),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(TEXT, children, max_size=4)),
    max_leaves=12,
)
AMOUNT = st.one_of(
    st.integers(min_value=0, max_value=10**12), st.floats(min_value=0, allow_nan=False, allow_infinity=False)
)
PROGRESS = st.builds(
    Progress,
    done=AMOUNT,
    total=st.one_of(st.none(), AMOUNT),
    unit=st.one_of(st.none(), TEXT),
    message=st.one_of(st.none(), TEXT),
)
FAILURE = st.builds(
    Failure,
    kind=st.sampled_from(FailureKind),
    message=TEXT,
    retryable=st.booleans(),
    exc_type=st.one_of(st.none(), st.just("builtins.ValueError"), TEXT),
    traceback=st.one_of(
        st.none(), TEXT, st.just('Traceback (most recent call last):\n  File "x.py"\n失败\n')
    ),
)
TAGS = st.frozensets(st.text(st.one_of(CJK, ANY_CHAR.filter(lambda c: c != "\x00")), min_size=1, max_size=8))
OPT_TEXT = st.one_of(st.none(), TEXT)
OPT_INT = st.one_of(st.none(), st.integers(min_value=0, max_value=2**31))

SNAPSHOT = st.builds(
    TaskSnapshot,
    task_id=IDENT,
    name=IDENT,
    created_at=AWARE,
    status=st.sampled_from(TaskStatus),
    status_version=st.integers(min_value=0, max_value=10**9),
    label=OPT_TEXT,
    attempt=st.integers(min_value=0, max_value=1000),
    max_attempts=st.integers(min_value=1, max_value=1000),
    queued_at=MAYBE_AWARE,
    started_at=MAYBE_AWARE,
    finished_at=MAYBE_AWARE,
    last_heartbeat_at=MAYBE_AWARE,
    progress=st.one_of(st.none(), PROGRESS),
    failure=st.one_of(st.none(), FAILURE),
    outcome=JSON,
    tags=TAGS,
    priority=st.integers(min_value=-(2**31), max_value=2**31),
    bucket=OPT_INT,
    bucket_key=OPT_TEXT,
    executor=OPT_TEXT,
    pid=OPT_INT,
    owner=OPT_TEXT,
    lease_owner=OPT_TEXT,
    lease_until=MAYBE_AWARE,
    pipeline_id=OPT_TEXT,
    node_id=OPT_TEXT,
    retry_at=MAYBE_AWARE,
    description=OPT_TEXT,
)


def assert_exactly_equal(left: Any, right: Any, path: str = "") -> None:
    """比 == 更严：类型一致、datetime 的 UTC 偏移一致、int 与 float 不混淆、容器逐项比较。"""
    assert type(left) is type(right), f"{path}: {type(left).__name__} != {type(right).__name__}"
    if isinstance(left, datetime):
        assert left == right and left.utcoffset() == right.utcoffset(), path
        assert left.isoformat() == right.isoformat(), path
    elif isinstance(left, (TaskSnapshot, Failure, Progress, Transition)):
        for name in left.__dataclass_fields__:
            assert_exactly_equal(getattr(left, name), getattr(right, name), f"{path}.{name}")
    elif isinstance(left, dict):
        assert list(left) == list(right), path
        for key in left:
            assert_exactly_equal(left[key], right[key], f"{path}[{key!r}]")
    elif isinstance(left, list):
        assert len(left) == len(right), path
        for index, (a, b) in enumerate(zip(left, right, strict=True)):
            assert_exactly_equal(a, b, f"{path}[{index}]")
    else:
        assert left == right, path


# -- round trips ----------------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(SNAPSHOT)
def test_snapshot_round_trip_through_json_is_exact(snapshot: TaskSnapshot) -> None:
    data = snapshot.to_dict()
    assert set(data) == set(TaskSnapshot.FIELD_NAMES)
    text = json.dumps(data, ensure_ascii=False, allow_nan=False)
    back = TaskSnapshot.from_dict(json.loads(text))
    assert back == snapshot
    assert_exactly_equal(back, snapshot)
    assert isinstance(back.tags, frozenset)
    assert back.to_dict() == data


@settings(max_examples=50, deadline=None)
@given(SNAPSHOT)
def test_snapshot_round_trip_without_json(snapshot: TaskSnapshot) -> None:
    assert_exactly_equal(TaskSnapshot.from_dict(snapshot.to_dict()), snapshot)


@settings(max_examples=200, deadline=None)
@given(
    task_id=IDENT,
    source=st.sampled_from(TaskStatus),
    target=st.sampled_from(TaskStatus),
    trigger=st.text(min_size=1, max_size=20),
    actor=OPT_TEXT,
    reason=OPT_TEXT,
    version=st.integers(min_value=1, max_value=10**9),
    at=AWARE,
)
def test_transition_round_trip(
    task_id: str,
    source: TaskStatus,
    target: TaskStatus,
    trigger: str,
    actor: str | None,
    reason: str | None,
    version: int,
    at: datetime,
) -> None:
    record = Transition(task_id, source, target, trigger, actor, reason, version, at)
    back = Transition.from_dict(json.loads(json.dumps(record.to_dict(), ensure_ascii=False)))
    assert_exactly_equal(back, record)


def test_trusted_transition_equals_validated_one() -> None:
    args = ("t", TaskStatus.PENDING, TaskStatus.QUEUED, "scheduler:queued", None, None, 1, T0)
    assert Transition._trusted(*args) == Transition(*args)
    assert hash(Transition._trusted(*args)) == hash(Transition(*args))


def test_a_trusted_transition_is_a_frozen_transition_like_any_other() -> None:
    # _trusted 先按不冻结的孪生类造、再换上 Transition（records._TransitionFields）：出来的必须就是
    # Transition，照样冻结、照样能 pickle / 复制，孪生类不外露。
    import copy
    import dataclasses
    import pickle

    args = ("t", TaskStatus.QUEUED, TaskStatus.STARTING, "runtime:starting", "me", "why", 2, T0)
    record = Transition._trusted(*args)
    assert type(record) is Transition
    assert not hasattr(record, "__dict__")
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.version = 3  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(record)) == record
    assert copy.copy(record) == record
    assert dataclasses.astuple(record) == args
    assert dataclasses.replace(record, version=3) == Transition(*args[:6], 3, T0)


@pytest.mark.parametrize(
    "offset",
    [
        timedelta(0),
        timedelta(hours=8),
        timedelta(hours=-5, minutes=-30),
        timedelta(hours=5, minutes=45, seconds=7),
    ],
)
@pytest.mark.parametrize("microsecond", [0, 1, 999999])
def test_datetime_offsets_and_microseconds_survive(offset: timedelta, microsecond: int) -> None:
    moment = datetime(2026, 3, 1, 12, 0, 0, microsecond, tzinfo=timezone(offset))
    snapshot = TaskSnapshot("t", "n", created_at=moment, started_at=moment, lease_until=moment)
    back = TaskSnapshot.from_dict(json.loads(json.dumps(snapshot.to_dict())))
    for name in ("created_at", "started_at", "lease_until"):
        value = getattr(back, name)
        assert value == moment
        assert value.utcoffset() == offset
        assert value.microsecond == microsecond


def test_failure_from_exception_keeps_type_and_traceback() -> None:
    try:
        try:
            raise KeyError("分区-7")
        except KeyError as inner:
            raise RuntimeError("写入失败") from inner
    except RuntimeError as exc:
        failure = Failure.from_exception(exc)
    assert failure.kind is FailureKind.EXCEPTION
    assert failure.message == "写入失败"
    assert failure.exc_type == "RuntimeError"
    assert failure.retryable is True
    assert failure.traceback is not None
    assert "KeyError" in failure.traceback and "写入失败" in failure.traceback
    assert Failure.from_dict(failure.to_dict()) == failure


def test_failure_from_exception_qualifies_non_builtin_types() -> None:
    failure = Failure.from_exception(
        ConfigurationError("x"), kind=FailureKind.RESULT_INVALID, retryable=False
    )
    assert failure.exc_type == "chongming_task.errors.ConfigurationError"
    assert failure.kind is FailureKind.RESULT_INVALID and failure.retryable is False
    empty = Failure.from_exception(ValueError())
    assert empty.message == "ValueError"


def test_failure_kinds_exactly() -> None:
    assert [k.value for k in FailureKind] == [
        "exception",
        "nonzero_exit",
        "timeout_start",
        "timeout_attempt",
        "timeout_idle",
        "cancelled",
        "lost",
        "dependency_failed",
        "condition_false",
        "result_invalid",
    ]
    assert str(FailureKind.TIMEOUT_IDLE) == "timeout_idle"


def test_failure_validation() -> None:
    assert Failure("lost", "x").kind is FailureKind.LOST  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="未知的失败类型"):
        Failure("timeout", "x")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="retryable"):
        Failure(FailureKind.LOST, "x", retryable="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="traceback"):
        Failure(FailureKind.LOST, "x", traceback=3)  # type: ignore[arg-type]


# -- progress ------------------------------------------------------------------------------------------


def test_progress_describe_and_fraction() -> None:
    assert Progress(120, total=500, unit="partitions").describe() == "120/500 partitions"
    assert Progress(42, unit="batch").describe() == "42 batch"
    assert Progress(2.5).describe() == "2.5"
    assert Progress(3.0, total=4).describe() == "3/4"
    assert Progress(1, total=4).fraction == 0.25
    assert Progress(9, total=4).fraction == 1.0
    assert Progress(1, total=0).fraction is None
    assert Progress(1).fraction is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"done": -1},
        {"done": float("nan")},
        {"done": float("inf")},
        {"done": True},
        {"done": "3"},
        {"done": 1, "total": -2},
        {"done": 1, "unit": 3},
        {"done": 1, "message": b"x"},
    ],
)
def test_progress_validation(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="Progress"):
        Progress(**kwargs)


# -- snapshot validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tags", [{1}, frozenset({1}), ["io", 2], {b"io"}, {""}, frozenset({"a\x00b"}), "io", 5]
)
def test_non_string_tags_refused(tags: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"tags|标签"):
        TaskSnapshot("t", "n", created_at=T0, tags=tags)


def test_tags_from_dict_with_bad_items_is_a_configuration_error() -> None:
    data = TaskSnapshot("t", "n", created_at=T0).to_dict()
    for bad in ([1], [["nested"]], [None]):
        data["tags"] = bad
        with pytest.raises(ConfigurationError):
            TaskSnapshot.from_dict(data)


def test_tags_accept_any_iterable_of_strings() -> None:
    assert TaskSnapshot("t", "n", created_at=T0, tags=["io", "db", "io"]).tags == frozenset({"io", "db"})  # type: ignore[arg-type]
    assert normalize_tags(None) == frozenset()
    assert normalize_tags(("a",)) == frozenset({"a"})


@pytest.mark.parametrize(
    "name",
    ["created_at", "queued_at", "started_at", "finished_at", "last_heartbeat_at", "lease_until", "retry_at"],
)
def test_naive_datetimes_refused(name: str) -> None:
    kwargs: dict[str, Any] = {"created_at": T0, name: datetime(2026, 1, 1, 12, 0)}
    with pytest.raises(ConfigurationError, match="带时区"):
        TaskSnapshot("t", "n", **kwargs)


def test_sub_second_utc_offsets_refused() -> None:
    odd = datetime(2000, 1, 1, tzinfo=timezone(timedelta(microseconds=1)))
    with pytest.raises(ConfigurationError, match="秒以下"):
        TaskSnapshot("t", "n", created_at=odd)


def test_naive_datetime_text_refused_from_dict() -> None:
    data = TaskSnapshot("t", "n", created_at=T0).to_dict()
    data["started_at"] = "2026-01-01T12:00:00"
    with pytest.raises(ConfigurationError, match="带时区"):
        TaskSnapshot.from_dict(data)
    data["started_at"] = "yesterday"
    with pytest.raises(ConfigurationError, match="ISO-8601"):
        TaskSnapshot.from_dict(data)


@pytest.mark.parametrize(
    ("task_id", "message"),
    [
        ("", "非空"),
        ("a\x00b", "NUL"),
        ("x" * (MAX_ID_LENGTH + 1), "过长"),
        (None, "非空"),
        (42, "非空"),
    ],
)
def test_bad_task_ids_refused(task_id: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        TaskSnapshot(task_id, "n", created_at=T0)
    with pytest.raises(ConfigurationError, match=message):
        TaskSnapshot("t", task_id, created_at=T0)
    with pytest.raises(ConfigurationError, match=message):
        validate_task_id(task_id)


def test_longest_allowed_id_and_cjk_ids() -> None:
    assert TaskSnapshot("x" * MAX_ID_LENGTH, "抽取", created_at=T0).task_id == "x" * MAX_ID_LENGTH
    assert TaskSnapshot("任务-一", "抽取", created_at=T0).name == "抽取"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("status", "done"),
        ("status_version", -1),
        ("attempt", -1),
        ("max_attempts", 0),
        ("attempt", 1.5),
        ("priority", "high"),
        ("status_version", True),
        ("bucket", -1),
        ("bucket", "3"),
        ("pid", 1.0),
        ("progress", {"done": 1}),
        ("failure", "boom"),
        ("label", 3),
        ("owner", b"node"),
    ],
)
def test_snapshot_field_validation(field: str, value: Any) -> None:
    with pytest.raises(ConfigurationError):
        TaskSnapshot("t", "n", created_at=T0, **{field: value})


def test_status_accepts_values() -> None:
    assert TaskSnapshot("t", "n", created_at=T0, status="running").status is TaskStatus.RUNNING  # type: ignore[arg-type]


def test_from_dict_refuses_unknown_and_missing_fields() -> None:
    data = TaskSnapshot("t", "n", created_at=T0).to_dict()
    with pytest.raises(ConfigurationError, match="未知字段"):
        TaskSnapshot.from_dict({**data, "colour": "red"})
    for required in ("task_id", "name", "created_at"):
        partial = dict(data)
        del partial[required]
        with pytest.raises(ConfigurationError, match="缺少"):
            TaskSnapshot.from_dict(partial)


def test_from_dict_accepts_minimal_dict_and_native_datetimes() -> None:
    snapshot = TaskSnapshot.from_dict({"task_id": "t", "name": "n", "created_at": T0})
    assert snapshot.created_at is T0
    assert snapshot.status is TaskStatus.PENDING and snapshot.tags == frozenset()


def test_evolve_is_a_cheap_copy() -> None:
    snapshot = TaskSnapshot("t", "n", created_at=T0, tags=frozenset({"io"}))
    changed = snapshot.evolve(priority=5)
    assert changed.priority == 5 and snapshot.priority == 0
    assert changed.tags is snapshot.tags
    assert changed == TaskSnapshot("t", "n", created_at=T0, tags=frozenset({"io"}), priority=5)


def test_a_copied_snapshot_is_a_frozen_snapshot_like_any_other() -> None:
    # copy_with（evolve 与状态机每次迁移的复制）先造一个不冻结的空壳、换上字典、再换成 TaskSnapshot
    # （records._SnapshotShell）：出来的必须就是 TaskSnapshot，照样冻结、能 pickle / 弱引用，空壳不外露。
    import copy
    import dataclasses
    import pickle
    import weakref

    from chongming_task.core.state_machine import StateMachine

    snapshot = TaskSnapshot("t", "n", created_at=T0)
    machine = StateMachine(snapshot)
    for changed in (snapshot.evolve(priority=5), machine.mark_queued()):
        assert type(changed) is TaskSnapshot
        with pytest.raises(dataclasses.FrozenInstanceError):
            changed.priority = 6  # type: ignore[misc]
        assert pickle.loads(pickle.dumps(changed)) == changed
        assert copy.copy(changed) == changed
        assert weakref.ref(changed)() is changed
        assert dataclasses.replace(changed, label="x").label == "x"


def test_a_plain_snapshot_instance_dict_is_never_tracked_by_the_cycle_collector() -> None:
    # status（枚举成员）与 tags（frozenset）在槽里（records._SnapshotSlots）：其余字段都是 str / int / None /
    # datetime 时，实例字典从造出来起就不被循环 GC 追踪——构造、evolve、状态机的每次迁移、sibling 都一样。
    # 积压 5 万个排队任务时每个任务少一个要晋升、要在全量回收里遍历的对象（issue 17）。
    import gc

    from chongming_task.core.state_machine import StateMachine

    snapshot = TaskSnapshot("t", "n", created_at=T0, tags=frozenset({"io"}), label="x", lease_until=T0)
    machine = StateMachine(snapshot)
    copies = [
        snapshot,
        snapshot.evolve(priority=5),
        snapshot.evolve(status=TaskStatus.QUEUED, tags=frozenset({"db"})),
        machine.mark_queued(),
        machine.sibling("t2").snapshot,
        machine.mark_starting(executor="thread"),
        machine.mark_running(),
        machine.mark_succeeded(outcome=3),
        TaskSnapshot.from_dict(snapshot.to_dict()),
    ]
    for copied in copies:
        assert "status" not in copied.__dict__ and "tags" not in copied.__dict__
        assert not gc.is_tracked(copied.__dict__), copied
    assert [c.status for c in copies[3:8]] == [TaskStatus.QUEUED] * 2 + [
        TaskStatus.STARTING,
        TaskStatus.RUNNING,
        TaskStatus.SUCCEEDED,
    ]
    assert all(c.tags == frozenset({"io"}) for c in copies if c is not copies[2])
    assert copies[2].status is TaskStatus.QUEUED and copies[2].tags == frozenset({"db"})
    assert snapshot.status is TaskStatus.PENDING  # evolve 不改原来那份
    # 装着循环 GC 管的对象的字段（progress、failure、容器 outcome）照常让字典被追踪：那是对的，它们要被遍历。
    assert gc.is_tracked(snapshot.evolve(outcome={"rows": 1}).__dict__)


def test_snapshot_fields_behave_as_declared_with_status_and_tags_in_slots() -> None:
    import dataclasses

    assert [f.name for f in dataclasses.fields(TaskSnapshot)][3] == "status"
    assert dataclasses.fields(TaskSnapshot)[3].default is TaskStatus.PENDING
    snapshot = TaskSnapshot("t", "n", created_at=T0)
    assert snapshot.status is TaskStatus.PENDING and snapshot.tags == frozenset()
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.status = TaskStatus.QUEUED  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.tags = frozenset()  # type: ignore[misc]
    other = TaskSnapshot("t", "n", created_at=T0, status="queued", tags=["b", "a"])  # type: ignore[arg-type]
    assert other.status is TaskStatus.QUEUED and other.tags == frozenset({"a", "b"})
    assert other != snapshot
    assert other == dataclasses.replace(snapshot, status=TaskStatus.QUEUED, tags={"a", "b"})
    assert hash(other) == hash(dataclasses.replace(other))
    assert "status=<TaskStatus.QUEUED: 'queued'>" in repr(other) and "tags=frozenset(" in repr(other)
    assert dataclasses.asdict(other)["status"] is TaskStatus.QUEUED
    assert TaskSnapshot.from_dict(other.to_dict()) == other


def test_snapshot_pickles_read_both_ways_across_the_slot_change() -> None:
    # pickle / copy 的状态仍是按声明顺序的全部字段的一个字典（与 status / tags 还在实例字典里时的
    # __dict__ 一样），所以以前的 pickle（状态就是整个实例字典）照样读得回，以前的版本也读得懂现在的。
    import copy
    import copyreg
    import gc
    import io
    import pickle

    snapshot = TaskSnapshot("t", "n", created_at=T0, status=TaskStatus.FAILED, tags={"io"}, outcome=[1])
    state = snapshot.__getstate__()
    assert list(state) == list(TaskSnapshot.FIELD_NAMES)
    assert state["status"] is TaskStatus.FAILED and state["tags"] == frozenset({"io"})

    def old_pickle(protocol: int) -> bytes:
        """以前的 TaskSnapshot 在 pickle 里的样子：类加上整个实例字典（协议 2 起经 __newobj__）。"""

        class OldPickler(pickle.Pickler):
            def reducer_override(self, obj: object) -> object:
                if type(obj) is not TaskSnapshot:
                    return NotImplemented
                if protocol < 2:
                    return copyreg._reconstructor, (TaskSnapshot, object, None), dict(state)  # type: ignore[attr-defined]
                return copyreg.__newobj__, (TaskSnapshot,), dict(state)

        buffer = io.BytesIO()
        OldPickler(buffer, protocol).dump(snapshot)
        return buffer.getvalue()

    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        for data in (old_pickle(protocol), pickle.dumps(snapshot, protocol)):
            loaded = pickle.loads(data)
            assert type(loaded) is TaskSnapshot and loaded == snapshot
            assert "status" not in loaded.__dict__ and "tags" not in loaded.__dict__
    plain = TaskSnapshot("t", "n", created_at=T0)
    for copied in (copy.copy(plain), copy.deepcopy(plain), pickle.loads(pickle.dumps(plain))):
        assert copied == plain and copied is not plain
        assert not gc.is_tracked(copied.__dict__)


def test_transition_validation() -> None:
    with pytest.raises(ConfigurationError, match="trigger"):
        Transition("t", TaskStatus.PENDING, TaskStatus.QUEUED, "", None, None, 1, T0)
    with pytest.raises(ConfigurationError, match="version"):
        Transition("t", TaskStatus.PENDING, TaskStatus.QUEUED, "x", None, None, 0, T0)
    with pytest.raises(ConfigurationError, match="带时区"):
        Transition("t", TaskStatus.PENDING, TaskStatus.QUEUED, "x", None, None, 1, T0.replace(tzinfo=None))
    with pytest.raises(ConfigurationError, match="at"):
        Transition("t", TaskStatus.PENDING, TaskStatus.QUEUED, "x", None, None, 1, None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="未知的任务状态"):
        Transition("t", "nope", TaskStatus.QUEUED, "x", None, None, 1, T0)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="缺少"):
        Transition.from_dict({"task_id": "t"})


def test_outcome_from_snapshot() -> None:
    done = TaskSnapshot("t", "n", created_at=T0, status=TaskStatus.SUCCEEDED, outcome={"rows": 3})
    outcome = Outcome.from_snapshot(done)
    assert outcome.ok and outcome.value == {"rows": 3} and outcome.failure is None
    lost_failure = Failure(FailureKind.LOST, "未知")
    lost = TaskSnapshot("t", "n", created_at=T0, status=TaskStatus.LOST, outcome=7, failure=lost_failure)
    outcome = Outcome.from_snapshot(lost)
    assert not outcome.ok and outcome.value is None and outcome.failure is lost_failure
    assert outcome.snapshot is lost


def test_outcome_from_snapshot_is_an_ordinary_frozen_outcome() -> None:
    # from_snapshot 不走 __init__（热路径直接填实例字典）：造出来的必须与 cls(...) 造的毫无二致——按值相等、
    # 同一个 repr 与 hash 行为、仍是 frozen（不能改字段）、dataclasses.replace 照常可用。
    import dataclasses

    lost_failure = Failure(FailureKind.LOST, "未知")
    for snapshot, value in (
        (
            TaskSnapshot("t", "n", created_at=T0, status=TaskStatus.SUCCEEDED, outcome={"rows": 3}),
            {"rows": 3},
        ),
        (
            TaskSnapshot("t", "n", created_at=T0, status=TaskStatus.LOST, outcome=7, failure=lost_failure),
            None,
        ),
    ):
        fast = Outcome.from_snapshot(snapshot)
        built = Outcome(status=snapshot.status, value=value, failure=snapshot.failure, snapshot=snapshot)
        assert fast == built and repr(fast) == repr(built)
        assert dataclasses.asdict(fast) == dataclasses.asdict(built)
        with pytest.raises(dataclasses.FrozenInstanceError):
            fast.value = 1  # type: ignore[misc]
        assert dataclasses.replace(fast, value=5).value == 5
    # 与 cls(...) 一样每个结果只有一个被循环 GC 追踪的对象（没有被物化出来的实例字典）。
    import gc

    gc.collect()
    before = len(gc.get_objects())
    kept = [Outcome.from_snapshot(snapshot) for _ in range(1000)]
    gc.collect()
    per_outcome = (len(gc.get_objects()) - before) / len(kept)
    assert per_outcome < 1.5, f"每个 Outcome 有 {per_outcome:.2f} 个被追踪的对象"


def test_recipe_trusted_from_dict_equals_from_dict_and_still_refuses_unknown_fields() -> None:
    """``Recipe.trusted_from_dict``（认领时解码存储里的配方）与 ``from_dict`` 逐项、连类型相同，只是不再逐个
    检查参数；未知字段、缺 name、坏的 on_lost / timeout 仍然报错。"""
    from chongming_task.core.recipes import OnLost, Recipe

    samples = [
        Recipe("r", args=(1, 2.0, "三", [True, None], {"k": [1.5, 2**63 + 1]}), kwargs={"a": {}, "b": []}),
        Recipe(
            "r",
            max_attempts=4,
            timeout={"start": 1, "per_attempt": None, "idle": 2.5},
            tags=("z", "a", "z"),
            priority=-3,
            bucket_key="租户",
            on_lost=OnLost.RETRY,
        ),
        Recipe("r"),
    ]
    for sample in samples:
        data = json.loads(json.dumps(sample.to_dict()))
        want = Recipe.from_dict(data)
        got = Recipe.trusted_from_dict(json.loads(json.dumps(sample.to_dict())))
        assert got == want
        for name in Recipe.__dataclass_fields__:
            assert type(getattr(got, name)) is type(getattr(want, name)), name
            assert getattr(got, name) == getattr(want, name), name
        assert got.timeout == want.timeout and (
            got.timeout is None or all(type(v) is type(want.timeout[k]) for k, v in got.timeout.items())  # type: ignore[index]
        )
    minimal = Recipe.trusted_from_dict({"name": "r"})
    assert minimal == Recipe("r") and minimal.on_lost is OnLost.FAIL and minimal.tags == ()
    for bad in (
        {"name": "r", "future": 1},
        {"args": []},
        {"name": "r", "on_lost": "maybe"},
        {"name": "r", "timeout": {"x": 1}},
    ):
        with pytest.raises(ConfigurationError):
            Recipe.trusted_from_dict(bad)
