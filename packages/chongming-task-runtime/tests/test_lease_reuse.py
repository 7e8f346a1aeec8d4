"""逐个提交的租约时刻（runtime/persistence.py 的 ``WriteThrough.lease_fields``）：``LEASE_REUSE`` 之内的
提交共用同一个时刻（存储不必为每个任务再编一个新时间），过了这段时间、或时钟往回拨时重算；共用的租约仍被
create 原样采用（不另复制快照）。"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

from chongming_task import Controller, SqliteTaskStore
from chongming_task.core.state_machine import StateMachine
from chongming_task.runtime.persistence import LEASE_REUSE, WriteThrough


class FakeClock:
    def __init__(self) -> None:
        self.at = datetime(2026, 12, 7, 18, 0, tzinfo=UTC)
        self.mono = 1000.0

    def now(self) -> datetime:
        return self.at

    def monotonic(self) -> float:
        return self.mono

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        return event.wait(timeout)


def test_submits_within_the_reuse_window_share_one_lease_instant(tmp_path: Path) -> None:
    clock = FakeClock()
    store = SqliteTaskStore(str(tmp_path / "l.db"))
    write = WriteThrough(store, owner="me", lease_ttl=30.0, clock=clock)  # type: ignore[arg-type]
    first = write.lease_fields()
    assert first["lease_owner"] == "me" and first["lease_until"] == clock.at + timedelta(seconds=30)
    clock.at += timedelta(seconds=LEASE_REUSE / 2)
    again = write.lease_fields()
    assert again["lease_until"] is first["lease_until"], "窗口之内共用同一个时刻对象"
    clock.at += timedelta(seconds=LEASE_REUSE)
    later = write.lease_fields()
    assert later["lease_until"] == clock.at + timedelta(seconds=30), "过了窗口重算"
    clock.at -= timedelta(seconds=5)  # 时钟往回拨：不再用"未来"算的那一个
    back = write.lease_fields()
    assert back["lease_until"] == clock.at + timedelta(seconds=30)

    # 共用的租约仍被 create 原样采用：落库的快照就是状态机手里那一份，租约没有被重算。
    clock.at += timedelta(seconds=LEASE_REUSE / 2)
    machine = StateMachine.create("t", "noop", clock=clock, lock=threading.RLock(), **write.lease_fields())  # type: ignore[arg-type]
    machine.mark_queued()
    before = machine.snapshot
    write.create(machine)
    assert machine.snapshot is before
    stored = store.get("t")
    assert stored is not None and stored.lease_until == back["lease_until"]
    store.close()


def test_a_short_lease_ttl_shortens_the_reuse_window(tmp_path: Path) -> None:
    clock = FakeClock()
    store = SqliteTaskStore(str(tmp_path / "l.db"))
    write = WriteThrough(store, owner="me", lease_ttl=0.2, clock=clock)  # type: ignore[arg-type]
    first = write.lease_fields()
    clock.at += timedelta(seconds=0.2 / 20)
    assert write.lease_fields()["lease_until"] == clock.at + timedelta(seconds=0.2), (
        "窗口是 lease_ttl 的 1/20"
    )
    assert first["lease_until"] != clock.at + timedelta(seconds=0.2)
    store.close()


def test_quick_submits_store_one_shared_lease_instant(tmp_path: Path) -> None:
    store = SqliteTaskStore(str(tmp_path / "s.db"))
    controller = Controller(max_parallel=1, store=store)
    controller.register("noop", lambda ctx: None)
    runs = [controller.submit("noop") for _ in range(20)]
    assert all(run.wait(timeout=30).ok for run in runs)
    leases = [run.machine.snapshot.lease_until for run in runs]
    # 20 个连着的提交远不到 LEASE_REUSE × 20：至多几个不同的时刻（负载下可能跨过几个窗口）。
    assert len({id(lease) for lease in leases}) <= 10
    controller.close(close_store=True)
