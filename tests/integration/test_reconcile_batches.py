"""reconcile 成批判 LOST（issue 17 第 5 项）：失去监督者的任务每 ``SAVE_BATCH`` 个用一次 ``save_many`` 写完，
逐项语义与从前逐个 save 完全相同——同批里一个任务在读与写之间被原监督者抢先写了（版本冲突）、或租约刚被
续上，只有它自己报告为 skipped、什么也不写；同批其余照常判 LOST、迁移记录随快照写下。

内存、SQLite 与（有 CHONGMING_TEST_POSTGRES 时）真实 PostgreSQL 各跑一遍；PostgreSQL 上再加一项：
行正被别的会话锁着（SKIP LOCKED）的那个任务这一轮不作判定，同批其余不受影响，reconcile 也不等那把锁。
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from chongming_task import (
    Controller,
    InMemoryTaskStore,
    SqliteTaskStore,
    StateMachine,
    TaskStatus,
    open_store,
)
from chongming_task.runtime import reconcile
from chongming_task.storage import TaskStore
from chongming_task.testing import FakeClock

S = TaskStatus
TASKS = [f"t{i}" for i in range(8)]  # 按创建先后：reconcile 按最早创建的先判
REVIVED, RENEWED = "t4", "t6"  # 同一批里（批大小 3：t3-t5 一批、t6-t7 一批）的两个"有人抢先写了"的任务


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def make_store(request: Any, tmp_path: Path) -> Iterator[Callable[[FakeClock], TaskStore]]:
    cleanup: list[Callable[[], None]] = []

    def make(clock: FakeClock) -> TaskStore:
        if request.param == "memory":
            return InMemoryTaskStore(clock=clock)
        if request.param == "sqlite":
            return SqliteTaskStore(str(tmp_path / "r.db"), clock=clock)
        dsn = request.getfixturevalue("postgres_dsn")
        psycopg = pytest.importorskip("psycopg", reason="需要 psycopg 才能连 PostgreSQL")
        schema = f"ct_rb_{os.getpid()}_{time.monotonic_ns() % 10**9}"

        def drop() -> None:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

        cleanup.append(drop)
        return open_store(f"{dsn}{'&' if '?' in dsn else '?'}schema={schema}", clock=clock)

    yield make
    for step in cleanup:
        step()


def put_running(store: TaskStore, clock: FakeClock) -> None:
    """TASKS 个 running 任务，监督者 dead 的租约到 clock 此刻为止。"""
    for task_id in TASKS:
        machine = StateMachine.create(
            task_id, "job", clock=clock, lease_owner="dead", lease_until=clock.now()
        )
        machine.mark_queued()
        machine.mark_starting()
        machine.mark_running()
        store.create(machine.snapshot, machine.transitions)
        clock.advance(1)


def test_one_conflict_in_a_batch_leaves_the_rest_of_the_batch_lost(
    make_store: Callable[[FakeClock], TaskStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    store = make_store(clock)
    put_running(store, clock)
    clock.advance(60)
    monkeypatch.setattr(reconcile, "SAVE_BATCH", 3)
    batches: list[list[str]] = []
    original = store.save_many

    def racing_save_many(requests: Any) -> Any:
        ids = [r.snapshot.task_id for r in requests]
        batches.append(ids)
        if REVIVED in ids:
            # 原监督者在 reconcile 读与写之间活过来、先把任务跑完了（版本号 +1）。
            machine = StateMachine.from_snapshot(store.get(REVIVED), clock=clock)  # type: ignore[arg-type]
            machine.mark_succeeded(outcome="revived")
            store.save(
                machine.snapshot,
                expect_version=machine.snapshot.status_version - 1,
                transitions=machine.transitions[-1:],
            )
        if RENEWED in ids:
            # 持有者恰好续上了租约（续租不改版本号：只有租约条件挡得住这次误判）。
            store.touch(RENEWED, lease_owner="dead", lease_until=clock.now() + timedelta(seconds=30))
        return original(requests)

    monkeypatch.setattr(store, "save_many", racing_save_many)
    before = {task_id: store.get(task_id) for task_id in TASKS}
    c = Controller(store=store, clock=clock, owner="heir")
    report = c.reconcile()

    assert batches == [["t0", "t1", "t2"], ["t3", "t4", "t5"], ["t6", "t7"]]  # 三个事务，不是八次 save
    expected_lost = [t for t in TASKS if t not in (REVIVED, RENEWED)]
    assert [s.task_id for s in report.lost] == expected_lost
    assert [s.task_id for s in report.skipped] == [REVIVED, RENEWED]
    assert report.skipped == [before[REVIVED], before[RENEWED]]  # 报告的是读到的那份，与逐个 save 时一样
    assert report.adoptable == []
    for snapshot in report.lost:
        stored = store.get(snapshot.task_id)
        assert stored == snapshot and stored.status is S.LOST  # type: ignore[union-attr]
        last = store.history(snapshot.task_id)[-1]
        assert (last.to_status, last.trigger, last.actor) == (S.LOST, reconcile.TRIGGER_RECONCILE, "heir")
        assert last.version == snapshot.status_version
    revived = store.get(REVIVED)
    assert revived.status is S.SUCCEEDED and revived.outcome == "revived"  # type: ignore[union-attr]
    assert store.history(REVIVED)[-1].to_status is S.SUCCEEDED
    renewed = store.get(RENEWED)
    assert renewed.status is S.RUNNING  # type: ignore[union-attr]
    assert renewed.status_version == before[RENEWED].status_version  # type: ignore[union-attr]
    assert len(store.history(RENEWED)) == len(store.history("t7")) - 1  # 没有多出 LOST 那条记录
    # 下一轮：续上的租约到期后再判；已判的不再出现。
    monkeypatch.setattr(store, "save_many", original)  # 不再有人抢先
    clock.advance(60)
    again = c.reconcile()
    assert [s.task_id for s in again.lost] == [RENEWED] and again.skipped == []
    c.close(close_store=True)


@pytest.mark.postgres
def test_row_locked_by_another_session_is_skipped_alone(postgres_dsn: str, tmp_path: Path) -> None:
    psycopg = pytest.importorskip("psycopg", reason="需要 psycopg 才能连 PostgreSQL")
    schema = f"ct_rb_{os.getpid()}_{time.monotonic_ns() % 10**9}"
    clock = FakeClock()
    store = open_store(f"{postgres_dsn}{'&' if '?' in postgres_dsn else '?'}schema={schema}", clock=clock)
    try:
        put_running(store, clock)
        clock.advance(60)
        with psycopg.connect(postgres_dsn) as holder:
            # 失联节点留在服务器上的事务：锁着 t4 的行不放（reconcile 若排队等锁，这里永远回不来）。
            holder.execute(f'SELECT 1 FROM "{schema}".tasks WHERE task_id = %s FOR UPDATE', [REVIVED])
            c = Controller(store=store, clock=clock, owner="heir")
            report = c.reconcile()
            holder.rollback()
        assert [s.task_id for s in report.skipped] == [REVIVED]  # 这一轮不作判定
        assert [s.task_id for s in report.lost] == [t for t in TASKS if t != REVIVED]
        assert store.get(REVIVED).status is S.RUNNING  # type: ignore[union-attr]
        assert [s.task_id for s in c.reconcile().lost] == [REVIVED]  # 锁放了，下一轮照常判
        c.close(close_store=True)
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_other_item_errors_and_broken_backends_are_raised_not_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """不是"有人抢先写了"的逐项错误（任务不见了）与逐个 save 时一样抛出，不会被当成 skipped 或 lost 悄悄吞掉；
    后端交回的结果个数不对 → StoreError（这一批结果未知）。"""
    from chongming_task import StoreError, TaskNotFound

    clock = FakeClock()
    store = InMemoryTaskStore(clock=clock)
    put_running(store, clock)
    clock.advance(60)
    original = store.save_many

    def vanished(requests: Any) -> Any:
        kept = [r for r in requests if r.snapshot.task_id != "t2"]
        results = iter(original(kept))
        return [TaskNotFound("t2 不见了") if r.snapshot.task_id == "t2" else next(results) for r in requests]

    monkeypatch.setattr(store, "save_many", vanished)
    c = Controller(store=store, clock=clock, owner="heir")
    with pytest.raises(TaskNotFound, match="t2 不见了"):
        c.reconcile()
    assert store.get("t1").status is S.LOST  # type: ignore[union-attr]  # 同批已提交的照常提交
    monkeypatch.setattr(store, "save_many", lambda requests: [])
    with pytest.raises(StoreError, match="返回了 0 个结果"):
        c.reconcile()
    c.close(close_store=True)
