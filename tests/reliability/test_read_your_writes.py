"""读自己的写：run.wait() / controller.wait() 返回时，终态必须已经写进存储。

这条套件跑出来过（200 次里 161 次读到旧行）：TaskRun 唤醒等待者的监听器排在写穿监听器之前。
已在 165f726 修好；这里留作回归——同一进程 wait() 之后立刻读存储（CLI、脚本、看板都这么做）。
"""

from __future__ import annotations

from pathlib import Path

from chongming_task import Controller, SqliteTaskStore


def test_wait_returns_only_after_the_terminal_state_is_in_the_store(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "t.db")
    controller = Controller(store=store, owner="reader")
    controller.register("quick", lambda ctx: 1)
    controller.register("boom", lambda ctx: 1 / 0)
    stale: list[str] = []
    try:
        for i in range(200):
            name = "boom" if i % 5 == 0 else "quick"
            run = controller.submit(name, task_id=f"q{i}")
            if i % 2:
                run.wait(timeout=20)
            else:
                controller.wait(run.task_id, timeout=20)
            stored = store.get(run.task_id)
            if stored is None or (stored.status, stored.status_version) != (
                run.status,
                run.snapshot.status_version,
            ):
                stale.append(run.task_id)
    finally:
        controller.close(close_store=True)
    assert stale == [], f"{len(stale)}/200 次 wait() 之后立刻读存储，读到的不是终态：{stale[:5]}"
