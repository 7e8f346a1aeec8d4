"""可靠性套件自己的检查工具（reliability_support.check_history）：它认得的历史正是核心会写下的历史。

持久任务的持有者失联后，活着的 worker 接手它（``cluster:adopted``，起止状态相同，用户指南 §9.9）。这条记录
不是转移表里的边，也不是三个审计入口之一；``check_history`` 修复之前把它当成非法迁移，任何经历过接手的
任务都过不了检查。这里经公开 API 真的走一遍接手，再用同一个检查看存储；伪造的"原地迁移"仍然被拒绝。
"""

from __future__ import annotations

import dataclasses
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from reliability_support import check_history, is_adoption, wait_until

from chongming_task import Controller, TaskStatus
from chongming_task.core.recipes import Recipe
from chongming_task.core.state_machine import StateMachine
from chongming_task.core.triggers import TRIGGER_ADOPTED
from chongming_task.models import Failure, FailureKind
from chongming_task.storage import TaskStore
from chongming_task.stores.memory import InMemoryTaskStore
from chongming_task.stores.sqlite import SqliteTaskStore

S = TaskStatus


def held_by_dead(store: TaskStore, task_id: str, status: TaskStatus) -> None:
    """存储里放一个由已死的 "dead" 持有、租约早已过期的持久任务（排队中或重试等待中）。"""
    recipe = Recipe(name="job", args=(task_id,), max_attempts=2)
    machine = StateMachine.create(task_id, "job", max_attempts=2, owner="dead", recipe=recipe)
    machine.mark_queued()
    if status is S.RETRY_WAIT:
        machine.mark_starting()
        machine.mark_running()
        failure = Failure(FailureKind.EXCEPTION, "第一次失败", retryable=True)
        machine.mark_retry_wait(failure=failure, retry_at=datetime.now(UTC) + timedelta(seconds=0.2))
    machine.update_side(lease_owner="dead", lease_until=datetime.now(UTC) - timedelta(minutes=5))
    store.create(machine.snapshot, machine.transitions)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    opened: TaskStore = (
        InMemoryTaskStore() if request.param == "memory" else SqliteTaskStore(str(tmp_path / "adopt.db"))
    )
    yield opened
    opened.close()


def test_check_history_accepts_a_real_adoption(store: TaskStore) -> None:
    held_by_dead(store, "q", S.QUEUED)
    held_by_dead(store, "rw", S.RETRY_WAIT)
    worker = Controller(1, store=store, owner="alive", side_channel_interval=0.02)
    worker.register("job", lambda ctx, task_id: task_id)
    stop = threading.Event()
    serving = threading.Thread(target=worker.serve, args=(stop,), kwargs={"poll_interval": 0.02}, daemon=True)
    serving.start()
    try:
        done = wait_until(
            lambda: all((s := store.get(t)) is not None and s.status is S.SUCCEEDED for t in ("q", "rw")), 15
        )
    finally:
        stop.set()
        serving.join(30)
        worker.close()
    assert done, [store.get(t) for t in ("q", "rw")]
    for task_id, status in (("q", S.QUEUED), ("rw", S.RETRY_WAIT)):
        snapshot, history = check_history(store, task_id)  # 修复前：接手那条被当成非法迁移
        adopted = [t for t in history if t.trigger == TRIGGER_ADOPTED]
        assert len(adopted) == 1 and is_adoption(adopted[0]), history
        assert (adopted[0].from_status, adopted[0].to_status, adopted[0].actor) == (status, status, "alive")
        assert snapshot.owner == "alive" and snapshot.outcome == task_id


def test_check_history_still_rejects_forged_in_place_records() -> None:
    """只放行接手本身：别的触发源的"原地迁移"、占着资源的状态上的"接手"都不是核心会写的记录。"""
    recipe = Recipe(name="job", max_attempts=2)
    for status, trigger in ((S.QUEUED, "scheduler:queued"), (S.RUNNING, TRIGGER_ADOPTED)):
        machine = StateMachine.create(f"forged-{status.value}", "job", max_attempts=2, recipe=recipe)
        machine.mark_queued()
        if status is S.RUNNING:
            machine.mark_starting()
            machine.mark_running()
        last = machine.transitions[-1]
        forged = dataclasses.replace(
            last, version=last.version + 1, from_status=status, to_status=status, trigger=trigger
        )
        assert not is_adoption(forged)
        store = InMemoryTaskStore()
        snapshot = machine.snapshot.evolve(status_version=forged.version)
        store.create(snapshot, [*machine.transitions, forged])
        with pytest.raises(AssertionError, match="不是转移表里的边"):
            check_history(store, snapshot.task_id)
