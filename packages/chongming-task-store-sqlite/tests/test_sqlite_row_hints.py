"""SqliteTaskStore 的行提示（``store._RowHints``）：同一任务上一次准备好的快照与 save 行只是"照抄哪些字段
的编码"的提示，结果必须与每次整份编码、整份检查一样——无论那次写有没有提交、调用方之后就地改了什么。这里
经公开的 save / save_many / write_many / create 验证，再看内存上限与 fork。"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from chongming_task.errors import ConcurrencyConflict, ConfigurationError
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.states import TaskStatus
from chongming_task.storage import SaveRequest, TaskQuery
from chongming_task.stores.sqlite import SqliteTaskStore
from chongming_task.stores.sqlite import store as store_module
from chongming_task.stores.sqlite._fork import FORKS

S = TaskStatus
T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    opened = SqliteTaskStore(tmp_path / "tasks.db")
    yield opened
    opened.close()


def _step(snapshot: TaskSnapshot, status: TaskStatus, **changes: Any) -> SaveRequest:
    """``snapshot`` 的下一版（``evolve``：与上一版共用其余字段对象，正是写穿交给存储的形状）。"""
    version = snapshot.status_version + 1
    record = Transition(snapshot.task_id, snapshot.status, status, "test", None, None, version, T0)
    return SaveRequest(
        snapshot.evolve(status=status, status_version=version, **changes), version - 1, (record,)
    )


def _created(store: SqliteTaskStore, task_id: str) -> TaskSnapshot:
    snapshot = TaskSnapshot(task_id=task_id, name="job", created_at=T0, tags=frozenset({"io"}))
    store.create(snapshot)
    return snapshot


def _saved(store: SqliteTaskStore, request: SaveRequest) -> TaskSnapshot:
    store.save(request.snapshot, expect_version=request.expect_version, transitions=request.transitions)
    return request.snapshot


_UNSTORABLE = {
    "executor": "thr\x00ead",  # NUL
    "description": "坏\ud800",  # 孤立代理项
    "priority": True,  # bool 不是合法的 priority，哪怕它"等于" 1
}


@pytest.mark.parametrize("field", sorted(_UNSTORABLE))
@pytest.mark.parametrize("via", ["save", "save_many", "write_many"])
def test_changed_field_with_unstorable_value_is_refused_alone(
    store: SqliteTaskStore, field: str, via: str
) -> None:
    """上一版整份查过、成了提示；下一版与它共用其余字段对象，只有一个变了的字段存不下：照样
    ConfigurationError，这一项什么也没写，同批的另一项照常提交。"""
    a = _saved(store, _step(_created(store, "a"), S.QUEUED))
    b = _saved(store, _step(_created(store, "b"), S.QUEUED))
    bad = _step(a, S.STARTING, **{field: _UNSTORABLE[field]})
    good = _step(b, S.STARTING, executor="thread")
    if via == "save":
        with pytest.raises(ConfigurationError):
            _saved(store, bad)
        _saved(store, good)
    else:
        if via == "save_many":
            results = store.save_many([bad, good])
        else:
            _, results = store.write_many([], [bad, good])
        assert isinstance(results[0], ConfigurationError)
        assert results[1] is None
    stored_a, stored_b = store.get("a"), store.get("b")
    assert stored_a is not None and stored_b is not None
    assert (stored_a.status, stored_a.status_version, stored_a.executor) == (S.QUEUED, 1, None)
    assert (stored_b.status, stored_b.executor) == (S.STARTING, "thread")
    assert len(store.history("a")) == 1
    # 存不下的那一版没有成为提示：之后一个合法的下一版照常写进去，逐字段就是它。
    fixed = _saved(store, _step(a, S.STARTING, executor="process"))
    assert store.get("a") == fixed


def test_outcome_mutated_in_place_is_reencoded_and_rechecked(store: SqliteTaskStore) -> None:
    """outcome 是调用方的字典：两次 save 之间就地改过，下一次 save 带着同一个对象——存下的是改过的值；
    改成存不下的值（NaN）就 ConfigurationError、什么也不写。"""
    outcome: dict[str, Any] = {"n": 1}
    running = _saved(
        store, _step(_saved(store, _step(_created(store, "t"), S.QUEUED)), S.RUNNING, outcome=outcome)
    )
    outcome["n"] = 2
    pausing = _saved(store, _step(running, S.PAUSING))
    assert pausing.outcome is outcome
    stored = store.get("t")
    assert stored is not None and stored.outcome == {"n": 2}
    outcome["bad"] = float("nan")
    with pytest.raises(ConfigurationError):
        _saved(store, _step(pausing, S.RUNNING))
    stored = store.get("t")
    assert stored is not None and stored.status is S.PAUSING and stored.outcome == {"n": 2}


def test_tag_set_mutated_in_place_is_rewritten(store: SqliteTaskStore) -> None:
    """evolve 不校验，标签可能是一个可变的 set：就地加了一个标签之后的 save 照样改写标签列与标签旁表。"""
    tags = {"io"}
    queued = _saved(store, _step(_created(store, "t"), S.QUEUED, tags=tags))
    tags.add("gpu")
    _saved(store, _step(queued, S.STARTING))
    stored = store.get("t")
    assert stored is not None and stored.tags == frozenset({"io", "gpu"})
    assert [s.task_id for s in store.query(TaskQuery(tag="gpu"))] == ["t"]


def test_hint_from_a_write_that_did_not_commit_is_still_a_correct_hint(store: SqliteTaskStore) -> None:
    """提示来自一次版本冲突（什么也没写）的 save：下一次与它共用字段对象的 save 存下的仍是它自己的值。"""
    queued = _saved(store, _step(_created(store, "t"), S.QUEUED))
    starting = _step(queued, S.STARTING, executor="thread", description="说明")
    first = _saved(store, starting)  # 版本 2
    # 又一次从版本 1 出发的写（晚到的另一个写者）→ 冲突，什么也没写；它的快照成了这个任务的提示。
    late = SaveRequest(starting.snapshot.evolve(owner="other", executor="process"), 1, starting.transitions)
    assert isinstance(store.save_many([late])[0], ConcurrencyConflict)
    # 下一版由真正存下的 first 演变而来：owner / executor 与提示里的不是同一个对象，照常编码。
    following = _saved(store, _step(first, S.RUNNING, started_at=T0 + timedelta(seconds=1)))
    assert store.get("t") == following
    stored = store.get("t")
    assert stored is not None and (stored.owner, stored.executor) == (None, "thread")


def test_hints_are_bounded_and_dropped_at_terminal(
    store: SqliteTaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """在管的任务再多，提示也只记 ``HINT_TASKS`` 个；任务到终态时它的那一项就丢掉。"""
    monkeypatch.setattr(store_module, "HINT_TASKS", 4)
    snapshots = [_saved(store, _step(_created(store, f"t{i}"), S.QUEUED)) for i in range(10)]
    assert 0 < len(store._hints.saved) <= 4
    last = snapshots[-1]
    assert last.task_id in store._hints.saved
    _saved(store, _step(last, S.CANCELLED, finished_at=T0))
    assert last.task_id not in store._hints.saved


@pytest.mark.skipif(not hasattr(os, "fork"), reason="需要 os.fork")
def test_forked_child_gets_its_own_connections_and_writer_queue(store: SqliteTaskStore) -> None:
    """fork 的代数（``_fork``）代替每个事务一次 os.getpid()：子进程里代数加一，连接池丢掉父进程的连接、写者
    队列换新锁，照常读写；父进程看得到子进程写下的任务，自己的连接照常可用。"""
    _created(store, "parent")  # 池里留着一条父进程的连接
    generation = FORKS.generation
    pid = os.fork()
    if pid == 0:  # pragma: no cover - 子进程（结果经退出码交回）
        code = 1
        try:
            if FORKS.generation == generation + 1:
                _saved(store, _step(_created(store, "child"), S.QUEUED))
                code = 0 if store._pool._idle and store._writers.turn() is not None else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert FORKS.generation == generation
    child = store.get("child")
    assert child is not None and child.status is S.QUEUED


@pytest.mark.parametrize("field", sorted(_UNSTORABLE))
@pytest.mark.parametrize("via", ["create", "write_many"])
def test_create_copied_from_the_previous_one_with_an_unstorable_field_is_refused(
    store: SqliteTaskStore, field: str, via: str
) -> None:
    """连续的 submit 来自同一个模板、共用字段对象：下一个只有一个变了的字段存不下——照样
    ConfigurationError，什么也没写；再下一个合法的照常写进去、逐字段是它自己（create 的行也成为这个任务
    第一次 save 的提示，见 _RowHints）。"""
    first = _created(store, "first")
    bad = first.evolve(task_id="bad", **{field: _UNSTORABLE[field]})
    good = first.evolve(task_id="good", created_at=T0 + timedelta(seconds=1))
    if via == "create":
        with pytest.raises(ConfigurationError):
            store.create(bad)
        store.create(good)
    else:
        results, _ = store.write_many([(bad, ()), (good, ())], [])
        assert isinstance(results[0], ConfigurationError) and results[1] is None
    assert store.get("bad") is None
    assert store.get("good") == good
    assert {s.task_id for s in store.query(TaskQuery(tag="io"))} == {"first", "good"}


def _bad_requests(a: TaskSnapshot) -> dict[str, SaveRequest]:
    good = _step(a, S.STARTING, executor="thread")
    record = good.transitions[0]
    other = Transition("b", S.QUEUED, S.STARTING, "test", None, None, record.version, T0)
    skipped = Transition("a", S.QUEUED, S.STARTING, "test", None, None, record.version + 1, T0)
    return {
        "wrong_version": SaveRequest(good.snapshot, good.expect_version, (skipped,)),
        "other_task": SaveRequest(good.snapshot, good.expect_version, (other,)),
        "not_a_record": SaveRequest(good.snapshot, good.expect_version, ("x",)),  # type: ignore[arg-type]
        "last_status": SaveRequest(good.snapshot.evolve(status=S.RUNNING), good.expect_version, (record,)),
        "no_records_but_newer": SaveRequest(good.snapshot, good.expect_version, ()),
        "negative_expect": SaveRequest(good.snapshot, -1, (record,)),
        "bool_expect": SaveRequest(good.snapshot, True, (record,)),
        "lease_naive": SaveRequest(
            good.snapshot, good.expect_version, (record,), lease_expired_before=datetime(2026, 1, 1)
        ),
        "text_too_long": SaveRequest(
            good.snapshot.evolve(label="x" * 100_000), good.expect_version, (record,)
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "wrong_version",
        "other_task",
        "not_a_record",
        "last_status",
        "no_records_but_newer",
        "negative_expect",
        "bool_expect",
        "lease_naive",
        "text_too_long",
    ],
)
def test_save_many_with_a_hint_refuses_exactly_like_the_full_check(store: SqliteTaskStore, case: str) -> None:
    """组提交的 save 有提示时相对提示检查入参（``check_save_since``）：拒绝的入参、报错的类型与原文都与整份
    检查（``check_save_request``）一字不差，这一项什么也没写。"""
    from chongming_task.core.storage import checks

    a = _saved(store, _step(_created(store, "a"), S.QUEUED))
    assert store._hints.save_hint(a) is not None  # 有提示：走的正是相对提示的检查
    bad = _bad_requests(a)[case]
    with pytest.raises(ConfigurationError) as full:
        checks.check_save_request(bad)
    (result,) = store.save_many([bad])
    assert isinstance(result, ConfigurationError)
    assert str(result) == str(full.value)
    stored = store.get("a")
    assert stored is not None and (stored.status, stored.status_version) == (S.QUEUED, 1)
    assert len(store.history("a")) == 1
