"""契约用例：批量写（save_many / create_many / write_many，组提交与 submit_many 用）：逐项语义与单次写相同，
一项冲突 / 重复不连累同批其他项，冲突项什么也不写；多线程同时批量写同一批任务时恰好一个赢家、历史无空洞。"""

from __future__ import annotations

import dataclasses
import functools
import threading

from chongming_task.errors import ConcurrencyConflict, ConfigurationError, DuplicateTaskId, TaskNotFound
from chongming_task.models import MAX_PRIORITY, MAX_TAGS, TaskSnapshot
from chongming_task.storage import SaveRequest
from chongming_task.testing.contract._base import ContractBase, S, full_snapshot, snap, step, walk
from chongming_task.testing.contract.durable import recipe


class BatchCases(ContractBase):
    """save_many / create_many / write_many。"""

    def test_save_many_commits_every_item_with_its_history(self) -> None:
        store = self.open_store()
        bases = [snap(f"b-{i}") for i in range(5)]
        self.assertEqual(store.create_many([(b, ()) for b in bases]), [None] * 5)
        requests = []
        expected = {}
        for base in bases:
            running, records = walk(base, S.QUEUED, S.STARTING, S.RUNNING)
            requests.append(SaveRequest(running, 0, records))
            expected[base.task_id] = (running, records)
        self.assertEqual(store.save_many(requests), [None] * 5)
        for task_id, (running, records) in expected.items():
            self.assertSnapshotEqual(store.get(task_id), running)
            self.assertEqual(store.history(task_id), records)

    def test_save_many_conflict_writes_nothing_for_that_item_only(self) -> None:
        store = self.open_store()
        good, stale, missing = snap("b-good"), snap("b-stale"), snap("b-missing")
        store.create(good)
        store.create(stale)
        queued, r1 = step(stale, S.QUEUED, label="first")
        store.save(queued, expect_version=0, transitions=[r1])
        good_next, good_record = step(good, S.QUEUED)
        stale_next, stale_record = step(stale, S.CANCELLED, actor="stale-writer")  # 以为版本还是 0
        missing_next, missing_record = step(missing, S.QUEUED)
        results = store.save_many(
            [
                SaveRequest(stale_next, 0, [stale_record]),
                SaveRequest(good_next, 0, [good_record]),
                SaveRequest(missing_next, 0, [missing_record]),
            ]
        )
        self.assertIsInstance(results[0], ConcurrencyConflict)
        self.assertIsNone(results[1], "同批里别的项冲突不能连累这一项")
        self.assertIsInstance(results[2], TaskNotFound)
        self.assertSnapshotEqual(store.get("b-stale"), queued)
        self.assertEqual(store.history("b-stale"), [r1], "冲突的那一项不能写入任何迁移记录")
        self.assertSnapshotEqual(store.get("b-good"), good_next)
        self.assertEqual(store.history("b-good"), [good_record])
        self.assertIsNone(store.get("b-missing"))

    def test_save_many_two_steps_of_one_task_in_one_batch(self) -> None:
        """同一任务的两次迁移排在同一批里（前一项提交之后后一项的期望版本才对）：按给出的顺序执行。"""
        store = self.open_store()
        base = snap("b-twice")
        store.create(base)
        queued, r1 = step(base, S.QUEUED)
        starting, r2 = step(queued, S.STARTING)
        self.assertEqual(
            store.save_many([SaveRequest(queued, 0, [r1]), SaveRequest(starting, 1, [r2])]), [None, None]
        )
        self.assertVersions(store, "b-twice", [1, 2])

    def test_save_many_bad_item_is_refused_alone(self) -> None:
        store = self.open_store()
        good, bad = snap("b-ok"), snap("b-bad")
        store.create(good)
        store.create(bad)
        good_next, good_record = step(good, S.QUEUED)
        bad_next, bad_record = step(bad, S.QUEUED)
        results = store.save_many(
            [SaveRequest(bad_next, 5, [bad_record]), SaveRequest(good_next, 0, [good_record])]
        )  # 期望版本与随附迁移自相矛盾
        self.assertIsInstance(results[0], ConfigurationError)
        self.assertIsNone(results[1])
        self.assertVersions(store, "b-ok", [1])
        self.assertNeverSaved(store, "b-bad")

    def test_save_many_empty_batch(self) -> None:
        self.assertEqual(self.open_store().save_many([]), [])
        self.assertEqual(self.open_store().create_many([]), [])

    def test_create_many_duplicate_is_refused_alone(self) -> None:
        store = self.open_store()
        original = snap("c-dup", label="original")
        store.create(original)
        fresh = snap("c-fresh")
        queued, record = step(fresh, S.QUEUED)
        results = store.create_many([(snap("c-dup", label="impostor"), ()), (queued, [record])])
        self.assertIsInstance(results[0], DuplicateTaskId)
        self.assertIsNone(results[1])
        self.assertSnapshotEqual(store.get("c-dup"), original)
        self.assertSnapshotEqual(store.get("c-fresh"), queued)
        self.assertEqual(store.history("c-fresh"), [record])

    def test_create_many_duplicate_inside_one_batch(self) -> None:
        store = self.open_store()
        first, second = snap("c-twin", label="first"), snap("c-twin", label="second")
        results = store.create_many([(first, ()), (second, ())])
        self.assertIsNone(results[0])
        self.assertIsInstance(results[1], DuplicateTaskId)
        self.assertSnapshotEqual(store.get("c-twin"), first)

    def test_create_many_round_trips_every_field_like_create(self) -> None:
        """批量建的任务与逐个 create 的逐字段一致（批量路径可能按列另行编码：标签里的引号、反斜杠、逗号、
        花括号，空标签，JSON outcome 与带偏移的时间都要原样读回），历史也一样。形状（哪些字段为空）交替出现：
        后端可能按形状分组插入，每一行仍须是它自己的值。"""
        store = self.open_store()
        odd_tags = frozenset({'a"b', "c\\d", "x,y", " sp ", "{}", "NULL"})
        plain = snap("cm-plain")
        tagged, record = step(snap("cm-tagged", tags=odd_tags, label="标签"), S.QUEUED)
        plain_again = snap("cm-plain-2", max_attempts=3)  # 与 plain 同形状，排在另一形状之后
        full = dataclasses.replace(full_snapshot(), recipe=recipe())  # 每个字段（含全部 JSON 列）都有值
        self.assertEqual(
            store.create_many([(plain, ()), (tagged, [record]), (full, ()), (plain_again, ())]),
            [None, None, None, None],
        )
        self.assertSnapshotEqual(store.get(full.task_id), full)
        self.assertSnapshotEqual(store.get("cm-plain"), plain)
        self.assertSnapshotEqual(store.get("cm-tagged"), tagged)
        self.assertSnapshotEqual(store.get("cm-plain-2"), plain_again)
        self.assertEqual(store.history("cm-tagged"), [record])
        self.assertEqual(store.history("cm-plain"), [])
        self.assertEqual(store.history("cm-plain-2"), [])

    def test_create_many_checks_every_item_not_just_the_first_of_a_shape(self) -> None:
        """同一批里形状相同（同一个模板复制出来）的快照，后端可能只查与上一项不同的字段：绕过构造校验
        （``evolve``）塞进来的存不下的值照样只让那一项被拒绝（ConfigurationError），前后的项照常写入。"""
        store = self.open_store()
        base = snap("cm-shape-0", label="批")
        bad_fields: list[dict[str, object]] = [
            {"label": "批\x00"},
            {"priority": MAX_PRIORITY + 1},
            {"tags": frozenset(f"t{i}" for i in range(MAX_TAGS + 1))},
        ]
        items: list[tuple[TaskSnapshot, tuple[()]]] = [(base, ())]
        for index, fields in enumerate(bad_fields, start=1):
            items.append((base.evolve(task_id=f"cm-shape-bad-{index}", **fields), ()))
            items.append((base.evolve(task_id=f"cm-shape-{index}"), ()))
        results = store.create_many(items)
        for (snapshot, _), result in zip(items, results, strict=True):
            with self.subTest(task_id=snapshot.task_id):
                if "bad" in snapshot.task_id:
                    self.assertIsInstance(result, ConfigurationError)
                    self.assertIsNone(store.get(snapshot.task_id), "存不下的那一项不能写进去")
                else:
                    self.assertIsNone(result)
                    self.assertSnapshotEqual(store.get(snapshot.task_id), snapshot)

    def test_write_many_commits_creates_and_saves_each_with_its_history(self) -> None:
        """组提交的混合批：新任务的 create 与别的任务的 save 一次写完，每一项都与单独写时一字不差。"""
        store = self.open_store()
        existing = [snap(f"wm-old-{i}") for i in range(3)]
        self.assertEqual(store.create_many([(b, ()) for b in existing]), [None] * 3)
        fresh = [step(snap(f"wm-new-{i}", tags=frozenset({"批"})), S.QUEUED) for i in range(2)]
        saves = []
        expected = {}
        for base in existing:
            running, records = walk(base, S.QUEUED, S.STARTING, S.RUNNING)
            saves.append(SaveRequest(running, 0, records))
            expected[base.task_id] = (running, records)
        created, saved = store.write_many([(queued, [record]) for queued, record in fresh], saves)
        self.assertEqual((list(created), list(saved)), ([None, None], [None] * 3))
        for queued, record in fresh:
            self.assertSnapshotEqual(store.get(queued.task_id), queued)
            self.assertEqual(store.history(queued.task_id), [record])
        for task_id, (running, records) in expected.items():
            self.assertSnapshotEqual(store.get(task_id), running)
            self.assertEqual(store.history(task_id), records)
        self.assertEqual(store.write_many([], []), ([], []))

    def test_write_many_refuses_a_duplicate_or_a_conflict_alone(self) -> None:
        """混合批里一项 create 撞了已有的 id、一项 save 版本过时：只有它们自己被拒绝、什么也不写，同批的
        其余 create 与 save 照常提交。"""
        store = self.open_store()
        original = snap("wm-dup", label="original")
        store.create(original)
        stale = snap("wm-stale")
        store.create(stale)
        stale_queued, r1 = step(stale, S.QUEUED, label="first")
        store.save(stale_queued, expect_version=0, transitions=[r1])
        good = snap("wm-good")
        store.create(good)
        good_next, good_record = step(good, S.QUEUED)
        stale_next, stale_record = step(stale, S.CANCELLED, actor="stale-writer")  # 以为版本还是 0
        fresh, fresh_record = step(snap("wm-fresh"), S.QUEUED)
        impostor, impostor_record = step(snap("wm-dup", label="impostor"), S.QUEUED)
        created, saved = store.write_many(
            [(impostor, [impostor_record]), (fresh, [fresh_record])],
            [SaveRequest(stale_next, 0, [stale_record]), SaveRequest(good_next, 0, [good_record])],
        )
        self.assertIsInstance(created[0], DuplicateTaskId)
        self.assertIsNone(created[1], "同批里别的 create 重复不能连累这一项")
        self.assertIsInstance(saved[0], ConcurrencyConflict)
        self.assertIsNone(saved[1], "同批里别的项被拒绝不能连累这一项")
        self.assertSnapshotEqual(store.get("wm-dup"), original)
        self.assertEqual(store.history("wm-dup"), [], "重复的那一项不能写入任何迁移记录")
        self.assertSnapshotEqual(store.get("wm-fresh"), fresh)
        self.assertEqual(store.history("wm-fresh"), [fresh_record])
        self.assertSnapshotEqual(store.get("wm-stale"), stale_queued)
        self.assertEqual(store.history("wm-stale"), [r1])
        self.assertSnapshotEqual(store.get("wm-good"), good_next)
        self.assertEqual(store.history("wm-good"), [good_record])

    def test_racing_save_many_one_winner_per_task_and_no_gap(self) -> None:
        """几个线程同时用同一期望版本批量写同一批任务：每个任务恰好一个赢家，历史是赢家的那一条。"""
        store = self.open_store()
        bases = [snap(f"race-{i}") for i in range(6)]
        store.create_many([(b, ()) for b in bases])
        writers = 4
        outcomes: list[list[object]] = [[] for _ in range(writers)]
        barrier = threading.Barrier(writers)

        def writer(k: int) -> None:
            requests = []
            for base in reversed(bases) if k % 2 else bases:  # 不同顺序：后端不能因此死锁
                nxt, record = step(base, S.QUEUED, actor=f"writer-{k}")
                requests.append(SaveRequest(nxt, 0, [record]))
            barrier.wait()
            outcomes[k] = list(store.save_many(requests))

        self.run_threads([functools.partial(writer, k) for k in range(writers)])
        for index, base in enumerate(bases):
            per_writer = [
                outcomes[k][index if k % 2 == 0 else len(bases) - 1 - index] for k in range(writers)
            ]
            winners = [k for k, result in enumerate(per_writer) if result is None]
            self.assertEqual(len(winners), 1, f"{base.task_id}：{per_writer}")
            for k, result in enumerate(per_writer):
                if k not in winners:
                    self.assertIsInstance(result, ConcurrencyConflict)
            history = store.history(base.task_id)
            self.assertEqual([t.version for t in history], [1])
            self.assertEqual(history[0].actor, f"writer-{winners[0]}")
            got = store.get(base.task_id)
            assert isinstance(got, TaskSnapshot)
            self.assertEqual(got.status_version, 1)
