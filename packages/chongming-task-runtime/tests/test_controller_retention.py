"""Controller(retention=Retention(...))：后台循环定期归档（默认关闭；issue 20）。时间全由 FakeClock 推进。"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

from chongming_task.core.archive import ArchiveSummary, Retention, merged_history
from chongming_task.errors import ConfigurationError
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.runtime.controller import Controller
from chongming_task.states import TaskStatus as S
from chongming_task.stores.memory import InMemoryTaskStore
from chongming_task.testing.fake_clock import FakeClock

HOUR = 3600.0


def _cycles(task_id: str, clock: FakeClock, first: int, count: int) -> list[Transition]:
    """从版本 first 起 count 条 RUNNING ⇄ PAUSED，第 v 条在"现在 - (first+count-v) 小时"。"""
    out = []
    for version in range(first, first + count):
        frm, to = (S.PAUSED, S.RUNNING) if version % 2 else (S.RUNNING, S.PAUSED)
        at = clock.now() - timedelta(hours=first + count - version)
        out.append(Transition(task_id, frm, to, "test:cycle", "test", None, version, at))
    return out


def _wait_for_runs(controller: Controller, seen: list[ArchiveSummary], count: int) -> None:
    limit = time.monotonic() + 10
    while len(seen) < count:
        summary = controller.last_retention
        if summary is not None and (not seen or summary is not seen[-1]):
            seen.append(summary)
            continue
        assert time.monotonic() < limit, f"等了 10 秒，定期归档只跑了 {len(seen)} 次（期望 {count}）"
        time.sleep(0.01)


def test_retention_runs_at_start_and_then_every_interval(tmp_path: Path) -> None:
    clock = FakeClock()
    store = InMemoryTaskStore()
    first = [
        Transition("svc", S.PENDING, S.QUEUED, "test:q", "test", None, 1, clock.now() - timedelta(days=3))
    ]
    first += _cycles("svc", clock, 2, 47)  # 版本 2..48，最后一条在一小时前
    store.create(
        TaskSnapshot(task_id="svc", name="svc", created_at=first[0].at, status=S.PAUSED, status_version=48),
        first,
    )
    retention = Retention(older_than=timedelta(hours=10), to=tmp_path / "archive", every=HOUR)
    seen: list[ArchiveSummary] = []
    with Controller(store=store, clock=clock, retention=retention) as controller:
        _wait_for_runs(controller, seen, 1)  # 启动后立刻跑第一次
        online = store.history("svc")
        assert all(r.at >= clock.now() - timedelta(hours=10) for r in online)
        assert online[0].version == 39 and seen[0].transitions == 38
        clock.wait_for_sleepers(1)
        clock.advance(HOUR / 2)
        time.sleep(0.05)
        assert len(seen) == 1 and controller.last_retention is seen[0], "间隔没到，不跑"
        clock.advance(HOUR / 2)  # 一小时到了：窗口又往前挪一小时
        _wait_for_runs(controller, seen, 2)
        assert seen[1].transitions == 1
        assert store.history("svc")[0].version == 40
        assert merged_history(store, "svc", tmp_path / "archive") == first


def test_retention_is_off_by_default(tmp_path: Path) -> None:
    clock = FakeClock()
    store = InMemoryTaskStore()
    with Controller(store=store, clock=clock) as controller:
        assert controller.retention is None
        clock.advance(10 * HOUR)
        assert controller.last_retention is None


def test_retention_settings_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="需要存储"):
        Controller(retention=Retention(older_than=60, to="x"))
    with pytest.raises(ConfigurationError, match="至少 1 秒"):
        Retention(older_than=60, to="x", every=0.5)
    with pytest.raises(ConfigurationError, match="正的时长"):
        Retention(older_than=timedelta(0), to="x")
    with pytest.raises(ConfigurationError, match="Retention"):
        Controller(store=InMemoryTaskStore(), retention="90d")  # type: ignore[arg-type]
