"""两个"结果未知的写"可靠性文件共用的故障替身（test_submitted_unknown_writes.py、test_claimed_unknown_writes.py）。

``Fault`` 是一次性的故障：下一次带着走到 ``target`` 的迁移记录的 save（``owner`` 给了时只看这个持有者写的）
先照常提交（``commit=True``，"回执丢了"）或什么也不写（"没写进去"），再执行 ``meanwhile``（模拟故障窗口里
别人做的事），然后抛"连接中途断了"。``faulty_saves(存储类)`` 给一个存储类套上它：写穿的每次 save（内存存储
直接写的、SQL 后端经组提交的 ``save_many``）都经过这里。
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from chongming_task import TaskStatus
from chongming_task.errors import StoreError
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.storage import SaveRequest, TaskStore


class Fault:
    """一次性的故障（见模块说明）。"""

    def __init__(
        self,
        target: TaskStatus,
        *,
        commit: bool,
        meanwhile: Callable[[TaskStore], None] | None = None,
        owner: str | None = None,
    ) -> None:
        self.target = target
        self.commit = commit
        self.meanwhile = meanwhile
        self.owner = owner
        self.fired = 0
        self._lock = threading.Lock()

    def take(self, requests: Sequence[SaveRequest]) -> bool:
        with self._lock:
            if self.fired:
                return False
            for request in requests:
                if self.owner is not None and request.snapshot.owner != self.owner:
                    continue
                if any(t.to_status is self.target for t in request.transitions):
                    self.fired += 1
                    return True
            return False

    def fire(self, store: TaskStore, write: Callable[[], Any]) -> Any:
        if self.commit:
            write()
        if self.meanwhile is not None:
            self.meanwhile(store)
        raise StoreError("注入的故障：连接在提交中途断了（server closed the connection unexpectedly）")


def faulty_saves(base: type[Any]) -> type[Any]:
    """覆盖 save / save_many，故障打在 ``fault`` 选中的那一次上（见模块说明）。"""

    class FaultySaves(base):  # type: ignore[misc, valid-type]
        fault: Fault | None = None

        def save(
            self,
            snapshot: TaskSnapshot,
            *,
            expect_version: int,
            transitions: Sequence[Transition] = (),
            lease_expired_before: datetime | None = None,
        ) -> None:
            def write() -> None:
                super(FaultySaves, self).save(
                    snapshot,
                    expect_version=expect_version,
                    transitions=transitions,
                    lease_expired_before=lease_expired_before,
                )

            fault = self.fault
            if fault is not None and fault.take([SaveRequest(snapshot, expect_version, tuple(transitions))]):
                fault.fire(self, write)
            write()

        def save_many(self, requests: Sequence[SaveRequest]) -> list[Any]:
            fault = self.fault
            if fault is not None and fault.take(requests):
                return fault.fire(self, lambda: super(FaultySaves, self).save_many(requests))  # type: ignore[no-any-return]
            return super().save_many(requests)  # type: ignore[no-any-return]

    return FaultySaves
