"""写穿层在"结果未知"的写之后的收敛与隔离（docs/distributed.md §7.2、§7.3）——快速、确定性的版本。

真实网络上的同一组场景（TCP 代理丢回执、分区）在 tests/reliability/test_ambiguous_commit.py 与
test_split_brain.py；这里用一个"先提交、再报连接中断"的内存存储把规则钉死：它的 save / create 真的写进去了，
然后像丢了回执那样抛 StoreError。
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import pytest
from chongming_runtime_test_support import wait_until

from chongming_task import Controller, InMemoryTaskStore, TaskStatus
from chongming_task.errors import DuplicateTaskId, StoreError
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.runtime.taskrun import mark_lease_expired

S = TaskStatus


class LostReplyStore(InMemoryTaskStore):
    """``lose`` 里登记的 (操作, 目标状态) 各发生一次：照常写入，然后抛"连接中途断了"。"""

    def __init__(self) -> None:
        super().__init__()
        self.lose: set[tuple[str, TaskStatus]] = set()
        self.lost = 0

    def _maybe_lose(self, operation: str, status: TaskStatus) -> None:
        if (operation, status) in self.lose:
            self.lose.discard((operation, status))
            self.lost += 1
            raise StoreError("PostgreSQL 操作失败：server closed the connection unexpectedly")

    def create(self, snapshot: TaskSnapshot, transitions: Sequence[Transition] = ()) -> None:
        super().create(snapshot, transitions)
        self._maybe_lose("create", snapshot.status)

    def save(
        self,
        snapshot: TaskSnapshot,
        *,
        expect_version: int,
        transitions: Sequence[Transition] = (),
        lease_expired_before: datetime | None = None,
    ) -> None:
        super().save(
            snapshot,
            expect_version=expect_version,
            transitions=transitions,
            lease_expired_before=lease_expired_before,
        )
        self._maybe_lose("save", snapshot.status)


def in_sync(controller: Controller, store: InMemoryTaskStore, task_id: str) -> bool:
    run = next(r for r in controller.runs() if r.task_id == task_id)
    stored = store.get(task_id)
    return (
        stored is not None
        and (stored.status, stored.status_version) == (run.status, run.snapshot.status_version)
        and store.history(task_id) == list(run.transitions)
    )


def test_a_save_whose_reply_was_lost_is_read_back_not_replayed() -> None:
    store = LostReplyStore()
    store.lose = {("save", S.RUNNING), ("save", S.STARTING)}
    controller = Controller(store=store, owner="a", side_channel_interval=0.02)
    controller.register("work", lambda ctx: "ok")
    try:
        run = controller.submit("work", task_id="t-save")
        assert run.wait(timeout=5).status is S.SUCCEEDED
        assert wait_until(lambda: in_sync(controller, store, "t-save"))
        assert store.lost == 2
        operations = [f.operation for f in controller.persist_failures]
        assert operations == ["save", "save"], controller.persist_failures  # 只有那两次结果未知的写
        assert not any("ConcurrencyConflict" in f.error for f in controller.persist_failures)
    finally:
        controller.close(timeout=5)


def test_a_create_whose_reply_was_lost_is_not_recreated() -> None:
    store = LostReplyStore()
    store.lose = {("create", S.QUEUED)}
    controller = Controller(store=store, owner="a", side_channel_interval=0.02)
    controller.register("work", lambda ctx: "ok")
    try:
        run = controller.submit("work", task_id="t-create")  # 提交照常返回
        assert run.wait(timeout=5).status is S.SUCCEEDED
        assert wait_until(lambda: in_sync(controller, store, "t-create"))
        assert [f.operation for f in controller.persist_failures] == ["create"]
    finally:
        controller.close(timeout=5)


class LateCommitStore(InMemoryTaskStore):
    """第一次 create 报"连接中途断了"、当时什么也没写；读回（get）看不到它，紧接着那次 create 才落进来——
    就像服务器在客户端看到断线、读回之后才提交了那个事务。于是写穿层的重试撞上 DuplicateTaskId：
    撞的是它自己。"""

    def __init__(self) -> None:
        super().__init__()
        self.late: tuple[TaskSnapshot, Sequence[Transition]] | None = None
        self.failed_once = False

    def create(self, snapshot: TaskSnapshot, transitions: Sequence[Transition] = ()) -> None:
        if not self.failed_once:
            self.failed_once = True
            self.late = (snapshot, list(transitions))
            raise StoreError("PostgreSQL 操作失败：server closed the connection unexpectedly")
        super().create(snapshot, transitions)

    def get(self, task_id: str) -> TaskSnapshot | None:
        found = super().get(task_id)
        if self.late is not None and self.late[0].task_id == task_id:
            snapshot, transitions = self.late
            self.late = None
            super().create(snapshot, transitions)  # 读回之后才落地的那次提交
        return found


def test_a_retried_create_that_hits_its_own_late_commit_is_read_back_not_a_duplicate() -> None:
    """读回说"没有"→ 再建一次 → DuplicateTaskId：这时要再读回对照，是自己的就照常提交（如实记下那次失败）。

    原来 ``except ConfigurationError: raise`` 排在 ``except DuplicateTaskId`` 前面（后者是前者的子类），
    读回那一支永远走不到：用户自己的提交被报成"task_id 已存在"。"""
    store = LateCommitStore()
    controller = Controller(store=store, owner="a", side_channel_interval=0.02)
    controller.register("work", lambda ctx: "ok")
    try:
        run = controller.submit("work", task_id="t-late")
        assert run.wait(timeout=5).status is S.SUCCEEDED
        assert wait_until(lambda: in_sync(controller, store, "t-late"))
        assert [f.operation for f in controller.persist_failures] == ["create"]
    finally:
        controller.close(timeout=5)


def test_a_retried_create_that_hits_a_strangers_task_is_a_duplicate() -> None:
    """同一条路径的另一面：重试撞上的是别人的同名任务（读回对不上）→ 如实报 DuplicateTaskId，
    任务体一行也不跑。"""
    store = LateCommitStore()
    ran: list[str] = []
    controller = Controller(store=store, owner="a", side_channel_interval=0.02)
    controller.register("work", lambda ctx: ran.append(ctx.task_id))
    stranger = Controller(store=InMemoryTaskStore(), owner="b")
    stranger.register("work", lambda ctx: "theirs")
    try:
        theirs = stranger.submit("work", task_id="t-clash")
        assert theirs.wait(timeout=5).status is S.SUCCEEDED
        original = store.create

        def create_then_stranger(snapshot: TaskSnapshot, transitions: Sequence[Transition] = ()) -> None:
            try:
                original(snapshot, transitions)
            finally:
                store.late = (theirs.snapshot, list(theirs.transitions))  # 落地的是别人的那一份

        store.create = create_then_stranger  # type: ignore[method-assign]
        with pytest.raises(DuplicateTaskId):
            controller.submit("work", task_id="t-clash")
        assert ran == []
        assert controller.get("t-clash") is not None  # 存储里是别人的那一份，原样留着
    finally:
        controller.close(timeout=5)
        stranger.close(timeout=5)


def test_a_task_rewritten_by_someone_else_is_fenced_and_reported_as_stored() -> None:
    store = LostReplyStore()
    controller = Controller(store=store, owner="a", side_channel_interval=0.02)
    gate = threading.Event()

    def work(ctx: Any) -> str:
        while not gate.wait(0.01):
            ctx.checkpoint()
        return "done locally"

    controller.register("work", work)
    try:
        run = controller.submit("work", task_id="t-fenced")
        assert wait_until(lambda: in_sync(controller, store, "t-fenced") and run.status is S.RUNNING)
        # 别的节点判它丢失（就像 A 被隔离期间 peer 的 reconcile 做的那样）。
        stored = store.get("t-fenced")
        assert stored is not None
        lost = mark_lease_expired(stored, clock=controller.clock, actor="peer-b")
        store.save(lost.snapshot, expect_version=stored.status_version, transitions=lost.transitions)
        gate.set()
        assert run.wait(timeout=5).status is S.SUCCEEDED  # 本地句柄记着本进程的真实结果
        assert wait_until(lambda: any(f.operation == "fenced" for f in controller.persist_failures))
        fenced = next(f for f in controller.persist_failures if f.operation == "fenced")
        assert "peer-b" in fenced.error and "succeeded" in fenced.error
        reported = controller.get("t-fenced")
        assert reported is not None and reported.status is S.LOST  # 对外以存储为准
        assert [s.status for s in controller.list_tasks() if s.task_id == "t-fenced"] == [S.LOST]
        got = store.get("t-fenced")
        assert got is not None and got.status is S.LOST and got.status_version == stored.status_version + 1
    finally:
        gate.set()
        controller.close(timeout=5)
