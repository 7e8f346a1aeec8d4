"""提交的任务（``Controller.submit``）上"结果未知"的写，遇到归档与删除（docs/distributed.md §7.2）：在内存、
SQLite 与 PostgreSQL 上各跑一遍。

* **早期历史已归档**：任务运行得比保留窗口还久，Archiver 把它最老的一段历史归档出了在线库，之后终态那次
  save 结果未知。修复之前读回对照按位置比整段历史，"缺头"的历史永远对不上：一次其实写成了的写也被判成
  别人的改写（fenced），存储停在 running 直到被判 lost。现在已确认落库的版本不要求仍在线，只核对结果未知的
  那次写带的记录：写成了就接着用，没写成就重写，都不记 fenced。
* **任务已被删除**：终态那次 save 写成了、回执丢了，而就在这时任务被清走了（``prune``、Archiver 整体归档
  终态任务）。修复之前读回看到"不存在"就重新 create，把一个已被清走的任务连同整段历史又写回存储；现在
  按隔离处理：记一条 fenced，绝不重建。

故障是确定的：存储替身在带着走到 ``target`` 的迁移记录的那次 save 上，先照常提交（"回执丢了"）或什么也不写
（"没写进去"），再执行 ``meanwhile``（模拟故障窗口里别人做的事），然后抛"连接中途断了"。
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from reliability_support import wait_until
from unknown_writes import Fault, faulty_saves

from chongming_task import Controller, TaskStatus
from chongming_task.core.archive import Archiver, merged_history
from chongming_task.runtime.taskrun import TaskRun
from chongming_task.storage import TaskStore
from chongming_task.stores.memory import InMemoryTaskStore
from chongming_task.stores.sqlite import SqliteTaskStore

S = TaskStatus
TASK = "t"
SETTLE = 15.0


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    kind = request.param
    if kind == "memory":
        opened = faulty_saves(InMemoryTaskStore)()
    elif kind == "sqlite":
        opened = faulty_saves(SqliteTaskStore)(str(tmp_path / "submitted.db"))
    else:
        from chongming_task.stores.postgres import PostgresTaskStore

        opened = faulty_saves(PostgresTaskStore).from_url(request.getfixturevalue("pg_url"))
    yield opened
    opened.close()


class Running:
    """一个在跑的提交任务：任务体等 ``finish`` 才返回。"""

    def __init__(self, store: TaskStore) -> None:
        self.gate = threading.Event()
        self.runs = 0
        self.controller = Controller(1, store=store, owner="a", side_channel_interval=0.02)

        def body(ctx: Any) -> str:
            self.runs += 1
            while not self.gate.wait(0.01):
                ctx.checkpoint()
            return "done"

        self.controller.register("body", body)
        self.run: TaskRun = self.controller.submit("body", task_id=TASK)
        stored = store.get  # 存储里也到了 running（v3）：早期历史已落库、可以归档
        assert wait_until(
            lambda: (s := stored(TASK)) is not None and (s.status, s.status_version) == (S.RUNNING, 3), SETTLE
        ), f"任务没有在存储里走到 running：{stored(TASK)}"

    def finish(self) -> None:
        self.gate.set()
        assert self.run.wait(timeout=SETTLE).status is S.SUCCEEDED  # 本地句柄记着本进程的真实结果

    def failures(self) -> list[tuple[str, str]]:
        return [(f.operation, f.task_id) for f in self.controller.persist_failures]

    def close(self) -> None:
        self.gate.set()
        self.controller.close(timeout=SETTLE)


def archive_everything_so_far(store: TaskStore, directory: Path) -> None:
    """Archiver 归档截止此刻的历史：这个任务已写下的 v1..v3 全部离开在线库（运行得比保留窗口还久的样子）。"""
    cutoff = datetime.now(UTC) + timedelta(milliseconds=1)
    summary = Archiver(store, directory).run(cutoff)
    assert summary.transitions >= 3, summary
    assert store.history(TASK) == [], "前提：早期历史已不在线"


@pytest.mark.parametrize("commit", [True, False], ids=["committed", "not-committed"])
def test_a_submitted_task_whose_early_history_was_archived_converges_after_an_unknown_write(
    store: Any, tmp_path: Path, commit: bool
) -> None:
    running = Running(store)
    try:
        archive_everything_so_far(store, tmp_path / "archive")
        store.fault = Fault(S.SUCCEEDED, commit=commit)
        running.finish()

        def converged() -> bool:
            stored = store.get(TASK)
            return stored is not None and (stored.status, stored.status_version) == (S.SUCCEEDED, 4)

        assert wait_until(converged, SETTLE), (
            f"存储没有追到 succeeded：{store.get(TASK)}，{running.controller.persist_failures}"
        )
        assert store.fault.fired == 1
        # 写成了的情形下存储一开始就是对的：先关掉控制器（关闭时最后追平一次），
        # 确保读回对照已经做过，再看它的结论
        running.close()
        assert running.failures() == [("save", TASK)], running.controller.persist_failures  # 没有 fenced
        # 归档 + 在线拼起来正是本进程的整段历史：写成了的那条没有重写，没写成的补上了
        assert merged_history(store, TASK, tmp_path / "archive") == list(running.run.transitions)
        assert [t.version for t in store.history(TASK)] == [4]
        assert running.runs == 1
    finally:
        running.close()


def pruned(store: TaskStore) -> None:
    """故障窗口里 prune 清掉了刚写成终态的它。"""
    assert store.prune(keep_terminal=0) >= 1
    assert store.get(TASK) is None


def archived_as_finished(directory: Path) -> Callable[[TaskStore], None]:
    """故障窗口里 Archiver 把刚结束的它整体归档、从在线库删除（保留清理）。"""

    def archive(store: TaskStore) -> None:
        summary = Archiver(store, directory).run(datetime.now(UTC) + timedelta(seconds=1))
        assert summary.tasks >= 1, summary
        assert store.get(TASK) is None

    return archive


@pytest.mark.parametrize("how", ["prune", "archiver"])
def test_a_submitted_task_deleted_during_an_unknown_write_is_fenced_never_recreated(
    store: Any, tmp_path: Path, how: str
) -> None:
    running = Running(store)
    try:
        meanwhile = pruned if how == "prune" else archived_as_finished(tmp_path / "archive")
        store.fault = Fault(S.SUCCEEDED, commit=True, meanwhile=meanwhile)
        running.finish()
        controller = running.controller
        assert wait_until(
            lambda: any(f.operation == "fenced" for f in controller.persist_failures), SETTLE
        ), f"没有记 fenced：存储 {store.get(TASK)}，persist_failures {controller.persist_failures}"
        fenced = next(f for f in controller.persist_failures if f.operation == "fenced")
        assert "删除" in fenced.error and "不会重建" in fenced.error, fenced
        # 再给后台循环几轮追写的机会：它不再写这个任务（不重建、不续租、不写进度）
        rounds = controller.persist_failures
        threading.Event().wait(0.3)
        assert store.get(TASK) is None and store.history(TASK) == [], "被删除的任务被重建了"
        # 对外的查询以存储为准：get 与 list_tasks 都说它不在了（本地结果只在 run 句柄上）
        assert controller.get(TASK) is None, controller.get(TASK)
        assert all(s.task_id != TASK for s in controller.list_tasks())
        assert controller.persist_failures == rounds
        assert running.failures() == [("save", TASK), ("fenced", TASK)], controller.persist_failures
        assert running.run.status is S.SUCCEEDED and running.runs == 1
    finally:
        running.close()
