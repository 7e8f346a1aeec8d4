"""契约用例：归档与时间窗口保留（export_transitions / export_finished / delete_archived / purge_commands）。

存储只负责"按批导出"与"按回执删除"；归档文件与水位线是 ``chongming_task.core.archive`` 的事。这里检查的
是归档器赖以保证"不丢、不重"的那几条存储语义（存储指南 §9）。
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import ClassVar

from chongming_task.core.storage.values import ArchiveDeleted, ArchivedTask, ArchiveReceipt
from chongming_task.errors import ConfigurationError, StoreError
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.storage import TaskStore
from chongming_task.testing.contract._base import T0, TZ_SHANGHAI, ContractBase, S, snap, step

DAY = timedelta(days=1)
CUTOFF = T0 + 10 * DAY


def _long_lived(store: TaskStore, task_id: str, cycles: int, *, start: datetime) -> TaskSnapshot:
    """常驻任务：RUNNING ⇄ PAUSED 反复，第 i 次迁移发生在 start + i 天（永远不是终态）。"""
    current, first = step(snap(task_id, at=start), S.QUEUED, at=start)
    store.create(current, [first])
    for i in range(1, cycles):
        target = S.RUNNING if current.status is not S.RUNNING else S.PAUSED
        nxt, record = step(current, target, at=start + i * DAY)
        store.save(nxt, expect_version=current.status_version, transitions=[record])
        current = nxt
    return current


def _finished(
    store: TaskStore, task_id: str, finished: datetime, *, commands: int = 1, complete: bool = True
) -> TaskSnapshot:
    """终态任务：三步走到 SUCCEEDED，全部迁移早于 finished；带几条指令（默认已完成）。"""
    current = snap(task_id, at=finished - 3 * DAY)
    records: list[Transition] = []
    for i, status in enumerate((S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED)):
        current, record = step(current, status, at=finished - timedelta(hours=3 - i))
        records.append(record)
    current = dataclasses.replace(current, finished_at=finished)
    store.create(current, records)
    for _ in range(commands):
        store.submit_command(task_id, "stop")
    if complete:
        for command in store.claim_commands("archiver-test", lease=60, task_ids=[task_id]):
            store.complete_command(command.command_id, "archiver-test")
    return current


class ArchiveCases(ContractBase):
    """先归档再删除：导出前缀、键集分页、按回执精确删除、幂等、指令清理。"""

    __test__: ClassVar[bool] = False

    # ===============================================================================================
    # export_transitions
    # ===============================================================================================

    def test_export_transitions_takes_the_old_prefix_of_every_task(self) -> None:
        store = self.open_store()
        _long_lived(store, "live", 20, start=T0)  # 版本 1..20 在 T0 + 0..19 天：前 10 条早于截止
        _long_lived(store, "young", 5, start=CUTOFF)  # 全部不早于截止：一条也不导出
        exported = store.export_transitions(CUTOFF)
        self.assertEqual([(t.task_id, t.version) for t in exported], [("live", v) for v in range(1, 11)])
        self.assertEqual(exported, store.history("live")[:10], "导出的记录逐字段等于 history() 的")
        self.assertEqual(len(store.history("live")), 20, "导出是只读的")

    def test_export_transitions_stops_a_task_at_its_first_recent_record(self) -> None:
        """乱序的时间（节点时钟偏差）不能在在线历史中间挖洞：只导出连续的前缀。"""
        store = self.open_store()
        base = snap("skew", at=T0)
        q, r1 = step(base, S.QUEUED, at=T0)
        s, r2 = step(q, S.STARTING, at=CUTOFF + timedelta(seconds=1))
        run, r3 = step(s, S.RUNNING, at=T0 + DAY)  # 比上一条"早"，但它在洞的后面
        store.create(run, [r1, r2, r3])
        self.assertEqual(store.export_transitions(CUTOFF), [r1])
        exact, r_exact = step(snap("edge", at=T0), S.QUEUED, at=CUTOFF)
        store.create(exact, [r_exact])
        self.assertNotIn(r_exact, store.export_transitions(CUTOFF), "恰好等于截止时刻的不算更早")

    def test_export_transitions_compares_instants_not_offsets(self) -> None:
        store = self.open_store()
        # 同一时刻的上海时间写法：文本上 "晚于" 截止（16:00+08:00），其实正好早一微秒。
        at = (CUTOFF - timedelta(microseconds=1)).astimezone(TZ_SHANGHAI)
        one, record = step(snap("tz", at=T0), S.QUEUED, at=at)
        store.create(one, [record])
        exported = store.export_transitions(CUTOFF)
        self.assertEqual(exported, [record])
        self.assertEqual(exported[0].at.utcoffset(), timedelta(hours=8), "原始时区偏移原样导出")

    def test_export_transitions_keyset_pages_cover_everything_once(self) -> None:
        store = self.open_store()
        for i in range(7):
            _long_lived(store, f"t-{i}", 6 + i, start=T0 + timedelta(hours=i))
        whole = store.export_transitions(CUTOFF, limit=10_000)
        paged: list[Transition] = []
        after: tuple[str, int] | None = None
        while True:
            batch = store.export_transitions(CUTOFF, after=after, limit=4)
            self.assertLessEqual(len(batch), 4)
            if not batch:
                break
            paged.extend(batch)
            after = (batch[-1].task_id, batch[-1].version)
        self.assertEqual(paged, whole, "按键集分页取到的与一次取完的逐条相同")
        keys = [(t.task_id, t.version) for t in whole]
        self.assertEqual(keys, sorted(keys), "按 (task_id, version) 升序")
        self.assertEqual(len(keys), len(set(keys)))
        self.assertEqual(len(whole), sum(min(6 + i, 10) for i in range(7)), "每个任务最多 10 天早于截止")

    # ===============================================================================================
    # delete_archived (transitions)
    # ===============================================================================================

    def test_delete_archived_removes_exactly_the_receipt_and_is_idempotent(self) -> None:
        store = self.open_store()
        _long_lived(store, "live", 20, start=T0)
        _long_lived(store, "other", 15, start=T0)
        batch = store.export_transitions(CUTOFF, limit=7)  # 只有 "live" 的前 7 条
        self.assertEqual({t.task_id for t in batch}, {"live"})
        receipt = ArchiveReceipt.of(batch)
        self.assertEqual(store.delete_archived(receipt), ArchiveDeleted(transitions=7))
        self.assertEqual(store.delete_archived(receipt), ArchiveDeleted(), "重放回执是空操作")
        self.assertVersions(store, "live", list(range(8, 21)))
        self.assertVersions(store, "other", list(range(1, 16)))
        self.assertEqual(store.get("live").status_version, 20)  # type: ignore[union-attr]
        # 继续导出：从 "live" 的第 8 条接着来，前缀性质仍然成立。
        rest = store.export_transitions(CUTOFF)
        self.assertEqual(
            [(t.task_id, t.version) for t in rest],
            [("live", v) for v in range(8, 11)] + [("other", v) for v in range(1, 11)],
        )

    def test_delete_archived_removes_scattered_keys_and_no_neighbours(self) -> None:
        """回执里的键不连续、乱序、跨任务：删的正好是列出的那些（SQL 后端按连续版本段删，段不能多删一条）。"""
        store = self.open_store()
        _long_lived(store, "a", 12, start=T0)
        _long_lived(store, "b", 12, start=T0)
        keys = (("b", 9), ("a", 1), ("a", 2), ("a", 3), ("a", 5), ("b", 2), ("b", 4), ("b", 5), ("a", 12))
        self.assertEqual(
            store.delete_archived(ArchiveReceipt(transitions=keys)), ArchiveDeleted(transitions=9)
        )
        self.assertVersions(store, "a", [4, *range(6, 12)])
        self.assertVersions(store, "b", [1, 3, 6, 7, 8, 10, 11, 12])

    def test_delete_archived_ignores_unknown_rows(self) -> None:
        store = self.open_store()
        _long_lived(store, "live", 3, start=T0)
        receipt = ArchiveReceipt(
            transitions=(("live", 99), ("ghost", 1)), tasks=(("ghost", 3),), commands=("x",)
        )
        self.assertEqual(store.delete_archived(receipt), ArchiveDeleted())
        self.assertVersions(store, "live", [1, 2, 3])

    # ===============================================================================================
    # export_finished / delete_archived (tasks)
    # ===============================================================================================

    def test_export_finished_returns_old_terminal_tasks_with_history_and_commands(self) -> None:
        store = self.open_store()
        old = _finished(store, "old-b", T0 + DAY, commands=2)
        _finished(store, "old-a", T0 + 2 * DAY, commands=1, complete=False)
        _finished(store, "recent", CUTOFF + DAY)
        _long_lived(store, "live", 3, start=T0 - 30 * DAY)  # 很旧，但不是终态
        exported = store.export_finished(CUTOFF)
        self.assertEqual([item.snapshot.task_id for item in exported], ["old-a", "old-b"])
        item = exported[1]
        self.assertIsInstance(item, ArchivedTask)
        self.assertSnapshotEqual(item.snapshot, old)
        self.assertEqual(list(item.history), store.history("old-b"))
        self.assertEqual(len(item.commands), 2)
        self.assertTrue(all(c.completed_at is not None and c.task_id == "old-b" for c in item.commands))
        self.assertEqual([c.completed_at for c in exported[0].commands], [None], "未完成的指令也一并导出")
        paged = store.export_finished(CUTOFF, limit=1)
        self.assertEqual([i.snapshot.task_id for i in paged], ["old-a"])
        paged = store.export_finished(CUTOFF, after="old-a", limit=1)
        self.assertEqual([i.snapshot.task_id for i in paged], ["old-b"])
        self.assertEqual(store.export_finished(CUTOFF, after="old-b"), [])

    def test_export_finished_uses_created_at_when_finished_at_is_missing(self) -> None:
        store = self.open_store()
        done, records = step(snap("legacy", at=T0), S.CANCELLED, at=T0)
        store.create(done, [records])  # 导入的旧数据：终态但没有 finished_at
        self.assertEqual([i.snapshot.task_id for i in store.export_finished(CUTOFF)], ["legacy"])
        self.assertEqual(store.export_finished(T0), [])

    def test_delete_archived_removes_whole_finished_tasks(self) -> None:
        store = self.open_store()
        _finished(store, "a", T0 + DAY, commands=2)
        _finished(store, "b", T0 + DAY, commands=1, complete=False)
        _finished(store, "keep", T0 + DAY)
        exported = [i for i in store.export_finished(CUTOFF) if i.snapshot.task_id != "keep"]
        deleted = store.delete_archived(ArchiveReceipt.of(tasks=exported))
        self.assertEqual(deleted, ArchiveDeleted(transitions=8, tasks=2, commands=3))
        for task_id in ("a", "b"):
            self.assertIsNone(store.get(task_id))
            self.assertEqual(store.history(task_id), [])
        self.assertEqual(store.claim_commands("w", lease=60), [], "被删任务的待执行指令随任务离开")
        self.assertIsNotNone(store.get("keep"))
        self.assertEqual(len(store.history("keep")), 4)
        self.assertEqual([i.snapshot.task_id for i in store.export_finished(CUTOFF)], ["keep"])
        self.assertEqual(store.delete_archived(ArchiveReceipt.of(tasks=exported)), ArchiveDeleted())

    def test_delete_archived_keeps_a_task_that_changed_after_export(self) -> None:
        """终态任务导出之后又被改写（版本前进）：快照与新历史都不能删，归档里那份只是它当时的样子。"""
        store = self.open_store()
        done = _finished(store, "again", T0 + DAY, commands=0)
        exported = store.export_finished(CUTOFF)
        retried, record = step(done, S.PENDING, at=CUTOFF + DAY, finished_at=None)
        store.save(retried, expect_version=done.status_version, transitions=[record])
        deleted = store.delete_archived(ArchiveReceipt.of(tasks=exported))
        self.assertEqual(deleted, ArchiveDeleted(transitions=4), "已归档的历史照删，快照留下")
        self.assertEqual(store.get("again").status_version, 5)  # type: ignore[union-attr]
        self.assertVersions(store, "again", [5])

    def test_delete_archived_keeps_a_task_with_unarchived_rows(self) -> None:
        store = self.open_store()
        _finished(store, "partial", T0 + DAY, commands=1)
        item = store.export_finished(CUTOFF)[0]
        # 回执只列出前两条历史：任务还有别的在线行，不能整体删掉（否则留下孤儿）。
        receipt = ArchiveReceipt(
            transitions=tuple((t.task_id, t.version) for t in item.history[:2]),
            tasks=(("partial", item.snapshot.status_version),),
            commands=tuple(c.command_id for c in item.commands),
        )
        self.assertEqual(store.delete_archived(receipt), ArchiveDeleted(transitions=2, commands=1))
        self.assertIsNotNone(store.get("partial"))
        self.assertVersions(store, "partial", [3, 4])

    def test_delete_archived_never_drops_a_pending_command_of_a_live_task(self) -> None:
        store = self.open_store()
        _long_lived(store, "live", 3, start=T0)
        pending = store.submit_command("live", "pause")
        receipt = ArchiveReceipt(commands=(pending.command_id,), tasks=(("live", 3),))
        self.assertEqual(store.delete_archived(receipt), ArchiveDeleted())
        self.assertEqual([c.command_id for c in store.claim_commands("w", lease=60)], [pending.command_id])
        self.assertIsNotNone(store.get("live"), "非终态任务绝不随回执删除")

    # ===============================================================================================
    # purge_commands
    # ===============================================================================================

    def test_purge_commands_deletes_only_completed_commands_older_than_the_window(self) -> None:
        store, advance, lease, clock = self.open_timed_store()
        _long_lived(store, "live", 2, start=T0)
        old = store.submit_command("live", "pause")
        store.claim_commands("w", lease=lease, task_ids=["live"])
        self.assertTrue(store.complete_command(old.command_id, "w"))
        advance(0.05)
        middle = datetime.now().astimezone() if clock is None else clock.now()
        advance(0.05)
        new = store.submit_command("live", "resume")
        store.claim_commands("w", lease=lease, task_ids=["live"])
        self.assertTrue(store.complete_command(new.command_id, "w"))
        waiting = store.submit_command("live", "stop")
        self.assertEqual(store.purge_commands(middle), 1)
        self.assertFalse(store.complete_command(old.command_id, "w"), "被清掉的指令不复存在")
        self.assertTrue(store.complete_command(new.command_id, "w"), "窗口内的已完成指令还在（幂等完成）")
        self.assertEqual(store.purge_commands(middle), 0)
        far = (datetime.now().astimezone() if clock is None else clock.now()) + timedelta(days=365)
        self.assertEqual(store.purge_commands(far), 1, "未完成的指令永远不删")
        self.assertEqual(
            [c.command_id for c in store.claim_commands("w2", lease=lease)], [waiting.command_id]
        )

    # ===============================================================================================
    # arguments and closed store
    # ===============================================================================================

    def test_retention_methods_check_their_arguments(self) -> None:
        store = self.open_store()
        _long_lived(store, "live", 3, start=T0)
        naive = datetime(2026, 3, 1)
        bad_calls: list[Callable[[], object]] = [
            lambda: store.export_transitions(naive),
            lambda: store.export_transitions(CUTOFF, limit=0),
            lambda: store.export_transitions(CUTOFF, limit=True),
            lambda: store.export_transitions(CUTOFF, after="live"),  # type: ignore[arg-type]
            lambda: store.export_transitions(CUTOFF, after=("live", "1")),  # type: ignore[arg-type]
            lambda: store.export_finished(naive),
            lambda: store.export_finished(CUTOFF, limit=-1),
            lambda: store.export_finished(CUTOFF, after=3),  # type: ignore[arg-type]
            lambda: store.delete_archived([("live", 1)]),  # type: ignore[arg-type]
            lambda: store.purge_commands(naive),
            lambda: ArchiveReceipt(transitions=(("live", "1"),)),  # type: ignore[arg-type]
            lambda: ArchiveReceipt(commands="abc"),  # type: ignore[arg-type]
        ]
        for i, call in enumerate(bad_calls):
            with self.subTest(call=i), self.assertRaises(ConfigurationError):
                call()
        self.assertVersions(store, "live", [1, 2, 3])

    def test_retention_methods_after_close_raise_store_error(self) -> None:
        store = self.open_store()
        _long_lived(store, "live", 3, start=T0)
        store.close()
        calls: dict[str, Callable[[], object]] = {
            "export_transitions": lambda: store.export_transitions(CUTOFF),
            "export_finished": lambda: store.export_finished(CUTOFF),
            "delete_archived": lambda: store.delete_archived(ArchiveReceipt(transitions=(("live", 1),))),
            "purge_commands": lambda: store.purge_commands(CUTOFF),
        }
        for name, call in calls.items():
            with self.subTest(method=name), self.assertRaises(StoreError):
                call()
