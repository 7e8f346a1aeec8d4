"""不经组提交的写穿（内存存储）的快路径：单个 create 的租约判定、每次迁移直接写下一条
（runtime/persistence.py）。

快路径只是少走几步，结果必须与通用路径逐项相同：租约能不能原样落库与 ``_lease_floor`` 的规则一致；下一条
写撞了别的写者时照样读回、隔离，不覆盖存储里别人的版本。
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from chongming_task import Controller, InMemoryTaskStore, TaskStatus
from chongming_task.core.state_machine import StateMachine
from chongming_task.runtime.persistence import WriteThrough
from chongming_task.testing import FakeClock

S = TaskStatus


@pytest.mark.parametrize("renewed_ago", [0.0, 5.0, 29.5, 31.0])
@pytest.mark.parametrize("lease_in", [-1.0, 0.0, 0.5, 1.0, 2.0, 28.0, 29.0, 29.5, 30.0, 31.0])
def test_the_single_create_lease_check_agrees_with_the_lease_floor(
    renewed_ago: float, lease_in: float
) -> None:
    """``_lease_fresh`` 是 ``_lease_usable(s, _lease_floor())`` 的省事写法：本节点租约还剩多少（上次续租离现在
    多久）、快照里的租约离现在多远，两者的判定处处相同；别的节点的租约从不原样落库。"""
    clock = FakeClock()
    write = WriteThrough(InMemoryTaskStore(clock=clock), owner="me", lease_ttl=30.0, clock=clock)
    clock.advance(renewed_ago)  # LeaseWatch 从构造时起算：推进时间 = 本节点的租约少了这么多
    lease_until = clock.now() + timedelta(seconds=lease_in)
    for owner in ("me", "other"):
        snapshot = StateMachine.create(
            "t", "work", clock=clock, lease_owner=owner, lease_until=lease_until
        ).snapshot
        assert write._lease_fresh(snapshot) is write._lease_usable(snapshot, write._lease_floor())
        if owner == "other":
            assert not write._lease_fresh(snapshot)


def test_a_foreign_write_between_two_transitions_is_read_back_and_fenced_not_overwritten() -> None:
    """任务在跑时别的写者改写了存储里的它（版本前进了）：下一条写撞了冲突，读回对照后认定被隔离（fenced），
    存储里保留别人的版本，本地结果如实记下。"""
    store = InMemoryTaskStore()
    gate = threading.Event()
    started = threading.Event()

    def work(ctx: object) -> str:
        started.set()
        gate.wait(5)
        return "ok"

    controller = Controller(store=store, owner="a")
    controller.register("work", work)
    try:
        run = controller.submit("work", task_id="t-foreign")
        assert started.wait(5)
        stored = store.get("t-foreign")
        assert stored is not None and stored.status is S.RUNNING
        history = store.history("t-foreign")
        foreign = StateMachine.from_snapshot(stored, history)
        foreign.mark_stopping(actor="别的节点", reason="抢先改写")
        store.save(
            foreign.snapshot,
            expect_version=stored.status_version,
            transitions=foreign.transitions_since(stored.status_version),
        )
        gate.set()
        assert run.wait(timeout=5).status is S.SUCCEEDED  # 本地的真实结果
        kept = store.get("t-foreign")
        assert kept is not None and (kept.status, kept.status_version) == (
            S.STOPPING,
            stored.status_version + 1,
        )
        assert [f.operation for f in controller.persist_failures] == ["fenced"]
    finally:
        gate.set()
        controller.close()
