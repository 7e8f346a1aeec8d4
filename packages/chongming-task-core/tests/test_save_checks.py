"""save 的入参检查（core/storage/checks.py 的 ``check_save``）：随附的迁移记录逐条只查一遍，拒绝的入参、报错与
先后都与原来的 ``check_transitions`` + ``validate_save``（逐条查三遍）一字不差。"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

import pytest

from chongming_task.core.storage import _base_checks, checks
from chongming_task.errors import ConfigurationError
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.states import TaskStatus
from chongming_task.testing.contract._base import snap, walk

S = TaskStatus
BASE = snap("t")
STARTED, RECORDS = walk(BASE, S.QUEUED, S.STARTING)


def three_passes(snapshot: TaskSnapshot, expect_version: Any, transitions: Sequence[Any]) -> None:
    """修改之前 check_save 的那一半：``check_transitions`` 之后再 ``validate_save``（它自己又逐条查两遍）。"""
    checks.check_transitions(snapshot.task_id, transitions)
    checks.validate_save(snapshot, expect_version, transitions)


def once(snapshot: TaskSnapshot, expect_version: Any, transitions: Sequence[Any]) -> None:
    checks.check_save(snapshot, expect_version, transitions, None)


def since(snapshot: TaskSnapshot, expect_version: Any, transitions: Sequence[Any]) -> None:
    """内存存储写穿的入口（相对上一版检查）：不寻常的入参退回同一组完整检查。"""
    _base_checks.check_save_since(BASE, snapshot, expect_version, transitions)


def outcome(check: Callable[..., None], *args: Any) -> str | None:
    try:
        check(*args)
    except ConfigurationError as exc:
        return str(exc)
    return None


first, second = RECORDS
foreign = dataclasses.replace(second, task_id="other")
lookalike = types.SimpleNamespace(**{f.name: getattr(second, f.name) for f in dataclasses.fields(second)})
CASES: dict[str, tuple[TaskSnapshot, Any, Sequence[Any]]] = {
    "ok": (STARTED, 0, RECORDS),
    "ok-no-records": (BASE.evolve(description="只改描述"), 0, ()),
    "foreign-record": (STARTED, 0, [first, foreign]),
    "not-a-transition": (STARTED, 0, [first, lookalike]),
    "foreign-and-gap": (STARTED, 0, [foreign]),  # 归属先于版本号
    "not-a-transition-and-gap": (STARTED, 0, [lookalike]),
    "gap": (STARTED, 0, [second]),
    "duplicate": (STARTED, 0, [first, first]),
    "last-status": (STARTED.evolve(status=S.RUNNING), 0, RECORDS),
    "negative-expect": (STARTED, -1, RECORDS),
    "bool-expect": (STARTED, True, RECORDS),
    "str-expect": (STARTED, "0", RECORDS),
    "expect-ahead": (STARTED, 3, ()),
    "expect-ahead-with-foreign": (STARTED, 3, [foreign]),  # 归属先于 expect_version
    "versions-not-covered": (STARTED, 1, RECORDS),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("check", [once, since], ids=["check_save", "check_save_since"])
def test_the_single_pass_refuses_exactly_what_the_three_passes_refused(
    case: str, check: Callable[..., None]
) -> None:
    args = CASES[case]
    expected = outcome(three_passes, *args)
    assert outcome(check, *args) == expected
    assert (expected is None) is case.startswith("ok")


def test_check_save_checks_each_record_once() -> None:
    calls: list[str | None] = []
    real = _base_checks.check_transitions

    def counting(task_id: str | None, transitions: Sequence[Transition]) -> None:
        calls.append(task_id)
        real(task_id, transitions)

    with (
        mock.patch.object(checks, "check_transitions", counting),
        mock.patch.object(_base_checks, "check_transitions", counting),
    ):
        checks.check_save(STARTED, 0, RECORDS, None)
        assert calls == ["t"], "逐条检查只跑一遍（原来是三遍：check_save 一遍、validate_save 里两遍）"
        calls.clear()
        checks.validate_save(STARTED, 0, RECORDS)
        assert calls == [None, "t"], "公开的 validate_save 单独调用时仍自己查记录（第三方后端直接用它）"


def test_the_write_through_save_request_equals_the_constructed_one_and_stays_frozen() -> None:
    """``SaveRequest._write_through``（写穿热路径，不经冻结 dataclass 的 __init__）造出的一项与构造函数造出的
    逐字段相等（租约条件是 None）、同样改不了字段、同样能 ``dataclasses.replace``。"""
    from chongming_task.core.storage.values import SaveRequest

    snapshot, transitions = walk(snap("t"), TaskStatus.QUEUED, TaskStatus.STARTING)
    fast = SaveRequest._write_through(snapshot, 1, tuple(transitions[1:]))
    made = SaveRequest(snapshot, 1, tuple(transitions[1:]))
    assert fast == made
    assert dataclasses.astuple(fast) == dataclasses.astuple(made)
    assert fast.lease_expired_before is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.expect_version = 2  # type: ignore[misc]
    assert dataclasses.replace(fast, expect_version=2).expect_version == 2
