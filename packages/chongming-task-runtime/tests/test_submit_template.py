"""逐个 submit() 的快照模板（controller._prepare 的 ``_submit_shapes``）：只是少走一遍逐字段校验与
一份快照拷贝，结果必须与不走模板时逐项相同——用户给的坏值照样报同一句错，每个任务的时间与租约是它自己提交那一刻的。
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from chongming_task import Controller, InMemoryTaskStore, TaskStatus
from chongming_task.errors import ConfigurationError
from chongming_task.testing import FakeClock

S = TaskStatus


def _block(ctx: Any, gate: threading.Event) -> None:
    gate.wait(5)


def noop(ctx: Any) -> None:
    return None


BAD_SUBMITS: list[dict[str, Any]] = [
    {"label": "x" * 600},
    {"label": "bad\x00label"},
    {"label": 5},
    {"tags": ["ok", ""]},
    {"tags": ["t" * 200]},
    {"priority": 2**53},
    {"priority": True},
    {"priority": 1.5},
    {"bucket_key": ["unhashable"]},
    {"bucket_key": ""},
    {"task_id": "bad\x00id"},
]


def _error_of(controller: Controller, fields: dict[str, Any]) -> str:
    with pytest.raises(ConfigurationError) as caught:
        controller.submit("noop", **fields)
    return str(caught.value)


@pytest.mark.parametrize("fields", BAD_SUBMITS)
def test_bad_submit_fields_raise_the_same_error_after_a_template_exists(fields: dict[str, Any]) -> None:
    """先提交过同名、同形状的好任务（模板已建好）之后，坏的 label / tags / priority 仍报与全新控制器
    相同的中文错误，且不留下任何任务。"""
    with Controller(max_parallel=1) as fresh, Controller(max_parallel=1, store=InMemoryTaskStore()) as warm:
        for c in (fresh, warm):
            c.register("noop", noop)
        for _ in range(3):
            warm.submit("noop", label="ok", tags=["ok"], priority=1)
            warm.submit("noop")
        warm.wait_all(timeout=5)
        before = len(warm.list_tasks())
        expected = _error_of(fresh, fields)
        assert any("\u4e00" <= ch <= "\u9fff" for ch in expected)  # 中文的报错
        assert _error_of(warm, fields) == expected
        assert len(warm.list_tasks()) == before


def test_each_single_submit_has_its_own_times_lease_and_fields() -> None:
    """命中模板的任务：created_at / queued_at / 迁移时间与租约都按它自己提交的时刻；label、标签、优先级是
    它自己的；存储里的与内存里的一致。"""
    clock = FakeClock()
    store = InMemoryTaskStore(clock=clock)
    gate = threading.Event()
    with Controller(max_parallel=1, store=store, clock=clock, lease_ttl=30.0) as c:
        c.register("block", _block)
        c.register("noop", noop)
        c.submit("block", gate=gate, task_id="gate")  # 占住唯一的槽：之后的都停在 queued
        runs = []
        for i in range(4):
            runs.append(c.submit("noop", task_id=f"n{i}", label="same", tags=["a"], priority=3))
            # 存储里的与内存里的一致——在拨钟之前比：拨过钟之后后台循环随时可能续租（只改存储里的租约）
            stored = store.get(f"n{i}")
            assert stored is not None and stored.lease_until == runs[-1].snapshot.lease_until
            clock.advance(7.0)
        other = c.submit("noop", task_id="other", label="different", priority=2)
        for i, run in enumerate(runs):
            snap = run.snapshot
            at = clock.now() - timedelta(seconds=7.0 * (4 - i))
            assert snap.task_id == f"n{i}" and snap.status is S.QUEUED
            assert snap.created_at == at and snap.queued_at == at
            assert snap.lease_owner == c.owner and snap.lease_until == at + timedelta(seconds=30.0)
            assert (snap.label, snap.tags, snap.priority) == ("same", frozenset({"a"}), 3)
            assert [(t.from_status, t.to_status, t.version, t.at) for t in run.machine.transitions] == [
                (S.PENDING, S.QUEUED, 1, at)
            ]
            stored = store.get(f"n{i}")
            assert stored is not None and stored.created_at == at
        assert (other.snapshot.label, other.snapshot.tags, other.snapshot.priority) == (
            "different",
            frozenset(),
            2,
        )
        gate.set()
        outcomes = c.wait_all(timeout=5)
        assert sorted(o.snapshot.task_id for o in outcomes) == ["gate", "n0", "n1", "n2", "n3", "other"]
        assert all(o.status is S.SUCCEEDED for o in outcomes)


def test_the_template_table_stays_bounded_with_a_distinct_label_per_task() -> None:
    """每个任务一个不同的 label（常见用法）：模板表有上限，不随提交数增长；每个任务仍是自己的 label。"""
    with Controller(max_parallel=2) as c:
        c.register("noop", noop)
        runs = [c.submit("noop", label=f"file {i}") for i in range(300)]
        c.wait_all(timeout=10)
        assert [r.snapshot.label for r in runs] == [f"file {i}" for i in range(300)]
        assert len(c._submit_shapes) <= 64
