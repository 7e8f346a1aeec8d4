"""契约用例：命令队列：提交、按租约认领、过期重投、完成与释放、并发认领者互不重叠。"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from chongming_task.errors import ConfigurationError, TaskNotFound
from chongming_task.states import TaskStatus
from chongming_task.storage import Command, CommandAction, TaskStore
from chongming_task.testing.contract._base import REAL_LEASE, ContractBase, snap, step


class CommandCases(ContractBase):
    """命令队列。"""

    # ===============================================================================================
    # commands
    # ===============================================================================================

    def test_submit_command_on_unknown_task_raises(self) -> None:
        store = self.open_store()
        with self.assertRaises(TaskNotFound):
            store.submit_command("ghost", CommandAction.STOP, issuer="ops")
        self.assertEqual(store.claim_commands("w", lease=60), [])

    def test_submit_command_refuses_too_deep_payload_cleanly(self) -> None:
        # 5,000 层嵌套的 payload：标准库编码器递归到底会抛 RecursionError；后端必须先量深度，给出
        # ConfigurationError，而且什么都不写（之后仍能正常提交与认领）。
        store = self.open_store()
        store.create(snap("deep-cmd"))
        deep: list[object] = []
        for _ in range(5_000):
            deep = [deep]
        with self.assertRaises(ConfigurationError) as caught:
            store.submit_command("deep-cmd", CommandAction.STOP, payload={"x": deep})
        self.assertIn("嵌套", str(caught.exception))
        self.assertEqual(store.claim_commands("w", lease=60), [])
        store.submit_command("deep-cmd", CommandAction.STOP, payload={"ok": [1]})
        self.assertEqual(len(store.claim_commands("w", lease=60)), 1)

    def test_submit_command_records_fields_and_bucket(self) -> None:
        store, _, _, clock = self.open_timed_store()
        store.create(snap("cmd", bucket=7))
        store.create(snap("cmd-nobucket"))
        first = store.submit_command(
            "cmd", "pause", issuer="ops-console", reason="发布窗口", payload={"宽限": 5, "nested": {"a": [1]}}
        )
        self.assertIsInstance(first, Command)
        self.assertIs(first.action, CommandAction.PAUSE)
        self.assertEqual((first.task_id, first.issuer, first.reason), ("cmd", "ops-console", "发布窗口"))
        self.assertEqual(dict(first.payload), {"宽限": 5, "nested": {"a": [1]}})
        self.assertEqual(first.bucket, 7, "指令要记下任务当时的桶号")
        self.assertEqual(
            (first.claimant, first.lease_until, first.deliveries, first.completed_at), (None, None, 0, None)
        )
        self.assertIsNotNone(first.created_at.utcoffset())
        if clock is not None:
            self.assertEqual(first.created_at, clock.now(), "指令时间必须取自存储注入的时钟")
        second = store.submit_command("cmd-nobucket", CommandAction.STOP)
        self.assertIsNone(second.bucket)
        self.assertEqual(dict(second.payload), {})
        self.assertIsNone(second.issuer)
        self.assertIsInstance(first.command_id, str)
        self.assertNotEqual(first.command_id, second.command_id)
        with self.assertRaises(ValueError):
            store.submit_command("cmd", "explode")

    def test_claim_returns_oldest_first(self) -> None:
        # 注入 FakeClock 时所有指令的创建时间相同：先后只能靠存储自己的顺序号。
        store, _, lease, _ = self.open_timed_store()
        store.create(snap("a"))
        store.create(snap("b"))
        submitted = [
            store.submit_command(task_id, action).command_id
            for task_id, action in [
                ("b", "stop"),
                ("a", "pause"),
                ("b", "resume"),
                ("a", "stop"),
                ("a", "resume"),
            ]
        ]
        claimed = store.claim_commands("w", lease=lease)
        self.assertEqual([c.command_id for c in claimed], submitted)
        for command in claimed:
            self.assertEqual((command.claimant, command.deliveries), ("w", 1))
            self.assertIsNotNone(command.lease_until)

    def test_claim_sets_lease_from_store_clock(self) -> None:
        store, _, lease, clock = self.open_timed_store()
        store.create(snap("lc"))
        store.submit_command("lc", "stop")
        before = datetime.now(UTC)
        (command,) = store.claim_commands("w", lease=lease)
        assert command.lease_until is not None
        if clock is not None:
            self.assertEqual(command.lease_until, clock.now() + timedelta(seconds=lease))
        else:
            self.assertGreaterEqual(
                command.lease_until, before + timedelta(seconds=lease) - timedelta(seconds=1)
            )
            self.assertLessEqual(command.lease_until, datetime.now(UTC) + timedelta(seconds=lease + 1))

    def test_claimed_command_is_invisible_to_others_while_leased(self) -> None:
        store = self.open_store()
        store.create(snap("inv"))
        ids = {store.submit_command("inv", "stop").command_id for _ in range(3)}
        claimed = store.claim_commands("alpha", lease=60)
        self.assertEqual({c.command_id for c in claimed}, ids)
        self.assertEqual(store.claim_commands("beta", lease=60), [])
        self.assertEqual(store.claim_commands("alpha", lease=60), [], "自己持有中的指令也不会被重复取走")

    def test_expired_lease_is_redelivered_with_deliveries_incremented(self) -> None:
        store, advance, lease, _ = self.open_timed_store()
        store.create(snap("exp"))
        submitted = store.submit_command("exp", "stop", reason="维护")
        (first,) = store.claim_commands("crashed-worker", lease=lease)
        self.assertEqual(store.claim_commands("rescuer", lease=lease), [])
        advance(lease * 1.5 if lease == REAL_LEASE else lease + 1)
        (again,) = store.claim_commands("rescuer", lease=lease)
        self.assertEqual(again.command_id, submitted.command_id)
        self.assertEqual((again.claimant, again.deliveries), ("rescuer", 2))
        self.assertEqual(again.reason, "维护")
        assert first.lease_until is not None and again.lease_until is not None
        self.assertGreater(again.lease_until, first.lease_until)
        self.assertEqual(store.claim_commands("third", lease=lease), [])

    def _claimed_command(
        self, task_id: str, action: str, claimant: str
    ) -> tuple[TaskStore, Callable[[float], None], float, Command]:
        """一个任务、一条指令、已被 ``claimant`` 认领：返回 (store, advance, lease, 认领到的指令)。"""
        store, advance, lease, _ = self.open_timed_store()
        store.create(snap(task_id))
        store.submit_command(task_id, action)
        (command,) = store.claim_commands(claimant, lease=lease)
        return store, advance, lease, command

    def test_completed_command_is_never_redelivered(self) -> None:
        store, advance, lease, command = self._claimed_command("done", "stop", "w")
        self.assertIs(store.complete_command(command.command_id, "w"), True)
        advance(lease * 1.5 if lease == REAL_LEASE else lease * 10)
        self.assertEqual(store.claim_commands("w", lease=lease), [])
        self.assertEqual(store.claim_commands("other", lease=lease), [])

    def test_previous_holder_cannot_complete_after_redelivery(self) -> None:
        store, advance, lease, command = self._claimed_command("steal", "pause", "slow")
        advance(lease * 1.5 if lease == REAL_LEASE else lease + 1)
        (again,) = store.claim_commands("fast", lease=lease)
        self.assertEqual(again.command_id, command.command_id)
        self.assertIs(store.complete_command(command.command_id, "slow"), False, "租约已被别人接手")
        self.assertIs(store.release_command(command.command_id, "slow"), False)
        self.assertIs(store.complete_command(command.command_id, "fast"), True)

    def test_complete_is_idempotent_for_holder_and_false_for_others(self) -> None:
        store = self.open_store()
        store.create(snap("cp"))
        store.submit_command("cp", "stop")
        (command,) = store.claim_commands("holder", lease=60)
        self.assertIs(store.complete_command(command.command_id, "intruder"), False)
        self.assertIs(store.complete_command(command.command_id, "holder"), True)
        self.assertIs(store.complete_command(command.command_id, "holder"), True, "重复完成对持有者幂等")
        self.assertIs(store.complete_command(command.command_id, "intruder"), False)
        self.assertIs(store.complete_command("no-such-command", "holder"), False)
        self.assertIs(store.release_command(command.command_id, "holder"), False, "已完成的指令不能再交还")
        self.assertEqual(store.claim_commands("intruder", lease=60), [])

    def test_unclaimed_command_cannot_be_completed(self) -> None:
        store = self.open_store()
        store.create(snap("uc"))
        command = store.submit_command("uc", "stop")
        self.assertIs(store.complete_command(command.command_id, "anyone"), False)
        self.assertEqual([c.command_id for c in store.claim_commands("w", lease=60)], [command.command_id])

    def test_release_makes_command_immediately_claimable(self) -> None:
        store = self.open_store()
        store.create(snap("rel"))
        store.submit_command("rel", "stop", issuer="ops")
        (command,) = store.claim_commands("query-client", lease=600)
        self.assertIs(store.release_command(command.command_id, "someone-else"), False)
        self.assertEqual(store.claim_commands("owner", lease=600), [], "别人交还失败，指令仍被持有")
        self.assertIs(store.release_command(command.command_id, "query-client"), True)
        self.assertIs(store.release_command(command.command_id, "query-client"), False, "已经交还过了")
        (again,) = store.claim_commands("owner", lease=600)
        self.assertEqual(
            (again.command_id, again.claimant, again.deliveries), (command.command_id, "owner", 2)
        )
        self.assertIs(store.complete_command(command.command_id, "owner"), True)
        self.assertIs(store.release_command("no-such-command", "owner"), False)

    def test_claim_filtered_by_task_ids(self) -> None:
        store = self.open_store()
        for task_id in ("f-1", "f-2", "f-3"):
            store.create(snap(task_id))
            store.submit_command(task_id, "stop")
        got = store.claim_commands("w", lease=60, task_ids=["f-3", "f-1", "absent"])
        self.assertEqual([c.task_id for c in got], ["f-1", "f-3"])
        self.assertEqual(store.claim_commands("w", lease=60, task_ids=[]), [])
        self.assertEqual([c.task_id for c in store.claim_commands("w", lease=60)], ["f-2"])

    def test_claim_filtered_by_holder_follows_the_task_row(self) -> None:
        # 持有者按名字认领（不带 task_id 清单）：只取任务行此刻 owner 是它的任务的指令；任务换了持有者
        # （adopt）之后，指令归新持有者，旧持有者再也取不到——每条指令只交给当前持有者。
        store = self.open_store()
        for task_id, owner in (("h-1", "alpha"), ("h-2", "beta"), ("h-3", None), ("h-4", "alpha")):
            store.create(snap(task_id, owner=owner))
        for task_id in ("h-1", "h-2", "h-3", "h-4"):
            store.submit_command(task_id, "stop")
        moved, record = step(store.get("h-4") or snap("h-4"), TaskStatus.QUEUED, owner="beta")
        store.save(moved, expect_version=0, transitions=[record])
        self.assertEqual([c.task_id for c in store.claim_commands("x", lease=60, holder="alpha")], ["h-1"])
        self.assertEqual(store.claim_commands("x", lease=60, holder="alpha"), [], "已取走的不再给")
        got = store.claim_commands("y", lease=60, holder="beta", task_ids=["h-2", "h-1", "h-3"])
        self.assertEqual([c.task_id for c in got], ["h-2"], "holder 与 task_ids 同时给出时取交集")
        self.assertEqual([c.task_id for c in store.claim_commands("y", lease=60, holder="beta")], ["h-4"])
        self.assertEqual(store.claim_commands("z", lease=60, holder="nobody"), [])
        self.assertEqual([c.task_id for c in store.claim_commands("any", lease=60)], ["h-3"])
        for bad in ("", 7):
            with self.assertRaises(ConfigurationError):
                store.claim_commands("w", lease=60, holder=bad)  # type: ignore[arg-type]

    def test_claim_filtered_by_buckets(self) -> None:
        store = self.open_store()
        for task_id, bucket in (("b-1", 1), ("b-2", 2), ("b-none", None), ("b-1b", 1), ("b-3", 3)):
            store.create(snap(task_id, bucket=bucket))
            store.submit_command(task_id, "stop")
        got = store.claim_commands("node-1", lease=60, buckets={1})
        self.assertEqual([(c.task_id, c.bucket) for c in got], [("b-1", 1), ("b-1b", 1)])
        both = store.claim_commands("node-2", lease=60, buckets=[2, 3], task_ids=["b-3", "b-none"])
        self.assertEqual([c.task_id for c in both], ["b-3"], "task_ids 与 buckets 同时给出时取交集")
        self.assertEqual(store.claim_commands("node-x", lease=60, buckets=[0, 4, 5]), [])
        self.assertEqual([c.task_id for c in store.claim_commands("any", lease=60)], ["b-2", "b-none"])

    def test_claim_limit(self) -> None:
        store = self.open_store()
        store.create(snap("lim"))
        ids = [store.submit_command("lim", "stop").command_id for _ in range(7)]
        self.assertEqual(store.claim_commands("w", lease=60, limit=0), [])
        self.assertEqual([c.command_id for c in store.claim_commands("w", lease=60, limit=3)], ids[:3])
        self.assertEqual([c.command_id for c in store.claim_commands("w", lease=60, limit=3)], ids[3:6])
        self.assertEqual([c.command_id for c in store.claim_commands("w", lease=60, limit=3)], ids[6:])

    def test_claim_rejects_bad_lease(self) -> None:
        store = self.open_store()
        store.create(snap("bl"))
        store.submit_command("bl", "stop")
        for lease in (0, -1, math.nan, math.inf):
            with self.assertRaises(ConfigurationError):
                store.claim_commands("w", lease=lease)
        for claimant in ("w\x00", "\ud800", "w" * 10_000):  # 存不下的认领者（与快照文本同一份规则）
            with self.assertRaises(ConfigurationError):
                store.claim_commands(claimant, lease=60)
        self.assertEqual(len(store.claim_commands("w", lease=60)), 1, "被拒绝的认领不能取走指令")

    def test_concurrent_claimers_never_share_a_command(self) -> None:
        store = self.open_store()
        store.create(snap("cc-a", bucket=0))
        store.create(snap("cc-b", bucket=1))
        ids = {store.submit_command("cc-a" if i % 2 else "cc-b", "stop").command_id for i in range(80)}
        claimers = 4
        got: list[list[Command]] = [[] for _ in range(claimers)]
        errors: list[BaseException] = []
        start = threading.Barrier(claimers)

        def claimer(i: int) -> None:
            try:
                start.wait()
                # 有上限的循环：坏掉的存储若反复交出同一批指令，用例要失败而不是永远转下去。
                for _ in range(len(ids) + 1):
                    batch = store.claim_commands(f"claimer-{i}", lease=600, limit=3)
                    if not batch:
                        return
                    got[i].extend(batch)
            except BaseException as exc:
                errors.append(exc)

        self.run_threads([functools.partial(claimer, i) for i in range(claimers)])
        self.assertEqual(errors, [])
        every = [c.command_id for batch in got for c in batch]
        self.assertEqual(len(every), len(set(every)), "同一条指令在租约内被两个认领者取走了")
        self.assertEqual(set(every), ids)
        for i, batch in enumerate(got):
            for command in batch:
                self.assertEqual((command.claimant, command.deliveries), (f"claimer-{i}", 1))
