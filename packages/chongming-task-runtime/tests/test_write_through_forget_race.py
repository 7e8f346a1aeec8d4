"""写穿记账与 forget 擦肩而过：不能把已忘掉的任务的记账加回来（否则长跑的守护进程里每次撞上都漏一项）。

forget 不拿任务锁，只在 ``WriteThrough._lock`` 下 pop；``_written`` / ``_promote`` 由持有任务锁的线程调用，
"在不在"的判断与写回必须在同一把 ``_lock`` 下。这里用一个在第一次 ``get`` 之后就把键删掉的字典，确定性地
模拟"forget 恰好落在读与写之间"（去掉锁内的复查，两条用例都会失败）。
"""

from __future__ import annotations

from typing import Any

from chongming_task.runtime.persistence import WriteThrough
from chongming_task.stores.memory import InMemoryTaskStore
from chongming_task.testing import FakeClock


class _ForgottenAfterFirstGet(dict[str, Any]):
    """第一次 ``get`` 照常返回值，返回之前把键删掉：别的线程的 forget 正好发生在这一刻。"""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.raced = False

    def get(self, key: str, default: Any = None) -> Any:
        value = super().get(key, default)
        if not self.raced and key in self:
            self.raced = True
            del self[key]
        return value


def _write_through() -> WriteThrough:
    return WriteThrough(InMemoryTaskStore(), owner="node-a", lease_ttl=30, clock=FakeClock())


def test_written_does_not_resurrect_a_task_forgotten_mid_call() -> None:
    write = _write_through()
    tasks = _ForgottenAfterFirstGet({"t1": 3})
    write._tasks = tasks
    write._written("t1", 4)
    assert tasks.raced
    assert "t1" not in tasks


def test_promote_does_not_resurrect_a_task_forgotten_mid_call() -> None:
    write = _write_through()
    tasks = _ForgottenAfterFirstGet({"t1": 3})
    write._tasks = tasks
    assert write._promote("t1") is None
    assert tasks.raced
    assert "t1" not in tasks


def test_written_and_promote_still_update_a_task_under_management() -> None:
    write = _write_through()
    write._tasks["t1"] = 3
    write._written("t1", 4)
    assert write._tasks["t1"] == 4
    state = write._promote("t1")
    assert state is not None and state.persisted_version == 4
    assert write._tasks["t1"] is state
    write._written("t1", 5)  # 没有别的标记：换回 int
    assert write._tasks["t1"] == 5
