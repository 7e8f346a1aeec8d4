"""契约用例：save：版本检查、随附迁移、不覆盖旁路字段，以及多线程竞争下恰好一个赢家、历史无空洞、读不到撕裂的快照。"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import threading
import types
from datetime import timedelta

from chongming_task.core.records import pack_transition
from chongming_task.errors import ConcurrencyConflict, ConfigurationError, TaskNotFound
from chongming_task.models import Progress, TaskSnapshot
from chongming_task.storage import SaveRequest, TaskQuery, TaskStore
from chongming_task.testing.contract._base import T0, ContractBase, S, snap, step, walk


class SaveCases(ContractBase):
    """save：乐观并发与竞争。"""

    # ===============================================================================================
    # save
    # ===============================================================================================

    def test_save_bumps_version_and_appends_transitions(self) -> None:
        store = self.open_store()
        base = snap("s-1")
        store.create(base)
        queued, r1 = step(base, S.QUEUED)
        store.save(queued, expect_version=0, transitions=[r1])
        running, records = walk(queued, S.STARTING, S.RUNNING)
        store.save(running, expect_version=1, transitions=records)
        got = store.get("s-1")
        assert got is not None
        self.assertEqual((got.status, got.status_version), (S.RUNNING, 3))
        self.assertEqual(store.history("s-1"), [r1, *records])

    def test_save_version_mismatch_writes_nothing(self) -> None:
        store = self.open_store()
        base = snap("s-conf", label="v0")
        store.create(base)
        queued, r1 = step(base, S.QUEUED, label="v1")
        store.save(queued, expect_version=0, transitions=[r1])
        # 一个过时的写者：它以为版本还是 0。
        stale, stale_record = step(base, S.CANCELLED, label="stale", actor="stale-writer")
        with self.assertRaises(ConcurrencyConflict):
            store.save(stale, expect_version=0, transitions=[stale_record])
        # 一个来自未来的写者：期望版本比存储里的新。
        future, future_records = walk(queued, S.STARTING, S.RUNNING)
        with self.assertRaises(ConcurrencyConflict):
            store.save(future, expect_version=2, transitions=future_records[1:])
        got = store.get("s-conf")
        assert got is not None
        self.assertSnapshotEqual(got, queued)
        self.assertEqual(store.history("s-conf"), [r1], "冲突的 save 不能写入任何迁移记录")

    def test_save_lease_expired_before_refuses_a_held_lease(self) -> None:
        """reconcile 判 LOST 的写以"租约此刻仍已过期"为条件（docs/distributed.md §7.3）：续租不改版本号，
        所以版本条件挡不住"持有者恰好在 reconcile 读与写之间续上了租约"——这个条件挡得住。"""
        store = self.open_store()
        base = snap("s-lease", lease_owner="node-a", lease_until=T0 + timedelta(seconds=60))
        store.create(base)
        running, records = walk(base, S.QUEUED, S.STARTING, S.RUNNING)
        store.save(running, expect_version=0, transitions=records)
        lost, lost_record = step(running, S.LOST, actor="peer-b")

        def save_lost(seconds: int) -> None:
            """以"租约在 T0+seconds 时已过期"为条件写 LOST。"""
            lease_expired_before = T0 + timedelta(seconds=seconds)
            store.save(
                lost, expect_version=3, transitions=[lost_record], lease_expired_before=lease_expired_before
            )

        # 租约到 T0+60 秒仍有效：在 T0+30 秒判它过期的写必须被拒绝，什么也不写。
        with self.assertRaises(ConcurrencyConflict):
            save_lost(30)
        got = store.get("s-lease")
        assert got is not None
        self.assertEqual((got.status, got.status_version), (S.RUNNING, 3))
        self.assertEqual(store.history("s-lease"), records, "被拒绝的 save 不能写入任何迁移记录")
        # 恰好等于 lease_until 也算仍有效（与 TaskQuery.lease_expired_before 同一判据：严格早于才算过期）。
        with self.assertRaises(ConcurrencyConflict):
            save_lost(60)
        # 过了有效期：写入成功；过期与否只看租约，不改变版本条件。
        save_lost(61)
        got = store.get("s-lease")
        assert got is not None
        self.assertEqual((got.status, got.status_version), (S.LOST, 4))
        self.assertEqual(store.history("s-lease"), [*records, lost_record])

    def test_save_lease_expired_before_without_a_lease_and_bad_values(self) -> None:
        store = self.open_store()
        base = snap("s-nolease")
        store.create(base)
        queued, record = step(base, S.QUEUED)
        with self.assertRaises(ConfigurationError):  # naive 时间：不同机器会按不同时区解释
            store.save(
                queued, expect_version=0, transitions=[record], lease_expired_before=T0.replace(tzinfo=None)
            )
        self.assertEqual(store.history("s-nolease"), [])
        store.save(
            queued, expect_version=0, transitions=[record], lease_expired_before=T0
        )  # 从未续租：算过期
        got = store.get("s-nolease")
        assert got is not None
        self.assertEqual(got.status_version, 1)

    def test_save_unknown_task_raises_task_not_found(self) -> None:
        store = self.open_store()
        ghost, record = step(snap("ghost"), S.QUEUED)
        with self.assertRaises(TaskNotFound):
            store.save(ghost, expect_version=0, transitions=[record])
        self.assertIsNone(store.get("ghost"))
        self.assertEqual(store.history("ghost"), [])

    def test_save_rejects_inconsistent_transitions(self) -> None:
        store = self.open_store()
        base = snap("s-bad")
        store.create(base)
        nxt, records = walk(base, S.QUEUED, S.STARTING)
        with self.assertRaises(ConfigurationError):
            store.save(nxt, expect_version=0, transitions=records[1:])  # 缺了版本 1
        with self.assertRaises(ConfigurationError):
            store.save(nxt, expect_version=0, transitions=[records[0], records[0]])
        self.assertNeverSaved(store, "s-bad")

    def test_save_rejects_records_that_are_not_its_own(self) -> None:
        """随 save 提交的每一条都必须是这个任务的 Transition：别的任务的记录（版本号、起止状态都接得上）、
        长得像记录却不是 Transition 的对象，都是 ConfigurationError、什么也不写——单独的 save 与 save_many
        的一项都一样。否则一个任务的历史里会混进别的任务的迁移（或一个后端读回时才炸的对象）。"""
        store = self.open_store()
        base = snap("s-own")
        store.create(base)
        nxt, (record,) = walk(base, S.QUEUED)
        foreign = dataclasses.replace(record, task_id="s-other")
        lookalike = types.SimpleNamespace(
            **{f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
        )
        for bad in (foreign, lookalike):
            with self.assertRaises(ConfigurationError):
                store.save(nxt, expect_version=0, transitions=[bad])  # type: ignore[list-item]
            (result,) = store.save_many([SaveRequest(nxt, 0, (bad,))])  # type: ignore[arg-type]
            self.assertIsInstance(result, ConfigurationError)
        self.assertNeverSaved(store, "s-own")

    def test_save_refuses_a_version_jump_without_records(self) -> None:
        """快照版本前进了、却一条迁移记录也不带：ConfigurationError，什么也不写。否则存储里快照到了 v2、历史却
        是空的——"历史没有空洞，每一版都有记录说明它从哪来"（持久层实现指南 §2.2）就破了。单独的 save、
        save_many 与混合批里的一项、写穿入口 ``_save_direct`` 都一样；版本不变、不带记录的 save 照常合法
        （``test_save_without_version_bump``）。"""
        store = self.open_store()
        base = snap("s-jump")
        store.create(base)
        nxt, records = walk(base, S.QUEUED, S.STARTING)
        for expect in (0, 1):
            with self.subTest(expect=expect), self.assertRaises(ConfigurationError) as caught:
                store.save(nxt, expect_version=expect)
            self.assertIn("迁移记录", str(caught.exception))
        (result,) = store.save_many([SaveRequest(nxt, 0, ())])
        self.assertIsInstance(result, ConfigurationError)
        created, (mixed,) = store.write_many([], [SaveRequest(nxt, 0, ())])
        self.assertEqual(created, [])
        self.assertIsInstance(mixed, ConfigurationError)
        with self.assertRaises(ConfigurationError):
            store._save_direct(nxt, 0, ())
        self.assertNeverSaved(store, "s-jump")
        # 拦下之后，带上那两条记录的同一次写照常成功。
        store.save(nxt, expect_version=0, transitions=records)
        self.assertVersions(store, "s-jump", [1, 2])

    def test_save_without_version_bump(self) -> None:
        store = self.open_store()
        base, records = walk(snap("s-same"), S.QUEUED)
        store.create(base, records)
        edited = dataclasses.replace(base, description="只改描述，不改状态")
        store.save(edited, expect_version=1)
        got = store.get("s-same")
        assert got is not None
        self.assertEqual((got.status_version, got.description), (1, "只改描述，不改状态"))
        self.assertVersions(store, "s-same", [1])

    def test_save_rewrites_indexed_fields_and_tags_that_changed(self) -> None:
        """save 改了被查询用到的字段（名字、优先级、桶、持有者、管道、标签、创建时间、状态）：读回与按新值
        的查询都看得到新值，按旧值的查询不再命中。SQL 后端为了省写常常"只 SET 真变了的列"，又为了省读
        常常"假定这些列没变、写进 UPDATE 的前提"——哪一列判错了，都会留下旧值（或旧的标签旁表）。所以
        每次只改一个字段，三种写法轮流：带一条改变状态的迁移记录；不带迁移记录、不加版本号；迁移记录
        兜一圈回到原状态（running → pausing → running）。"""
        store = self.open_store()
        base = snap(
            "s-index", tags=frozenset({"tag-0"}), priority=0, bucket=0, owner="node-0", pipeline_id="p-0"
        )
        store.create(base)
        current, r1 = step(base, S.QUEUED)
        store.save(current, expect_version=0, transitions=[r1])
        current, records = walk(current, S.STARTING, S.RUNNING)
        store.save(current, expect_version=1, transitions=records)
        later = T0 + timedelta(hours=1)

        def found(query: TaskQuery) -> list[str]:
            return [s.task_id for s in store.query(query)]

        # (字段的新值, 按新值应命中的查询, 按旧值不应再命中的查询；优先级没有查询条件，只看读回)
        changes: list[tuple[dict[str, object], TaskQuery | None, TaskQuery | None]] = [
            ({"name": "renamed-1"}, TaskQuery(name_prefix="renamed-1"), TaskQuery(name_prefix="contract")),
            ({"priority": 7}, None, None),
            ({"bucket": 5}, TaskQuery(bucket=5), TaskQuery(bucket=0)),
            ({"owner": "node-1"}, TaskQuery(owner="node-1"), TaskQuery(owner="node-0")),
            ({"pipeline_id": "p-1"}, TaskQuery(pipeline_id="p-1"), TaskQuery(pipeline_id="p-0")),
            ({"tags": frozenset({"tag-1"})}, TaskQuery(tag="tag-1"), TaskQuery(tag="tag-0")),
            (
                {"created_at": later},
                TaskQuery(tag="tag-1", created_after=later - timedelta(seconds=1)),
                TaskQuery(tag="tag-1", created_before=later - timedelta(seconds=1)),
            ),
            ({"name": "renamed-2"}, TaskQuery(name_prefix="renamed-2"), TaskQuery(name_prefix="renamed-1")),
            ({"priority": -3}, None, None),
            ({"bucket": None}, None, TaskQuery(bucket=5)),
            ({"owner": None}, None, TaskQuery(owner="node-1")),
            ({"pipeline_id": None}, None, TaskQuery(pipeline_id="p-1")),
            ({"tags": frozenset()}, None, TaskQuery(tag="tag-1")),
            ({"owner": "node-2"}, TaskQuery(owner="node-2"), None),
        ]
        for index, (fields, hit, miss) in enumerate(changes):
            style = index % 3
            version = current.status_version
            if style == 0:  # 一条改变状态的迁移记录
                target = S.PAUSING if current.status is S.RUNNING else S.RUNNING
                current, record = step(current, target)
                current = dataclasses.replace(current, **fields)  # type: ignore[arg-type]
                store.save(current, expect_version=version, transitions=[record])
            elif style == 1:  # 不带迁移记录、不加版本号
                current = dataclasses.replace(current, **fields)  # type: ignore[arg-type]
                store.save(current, expect_version=version)
            else:  # 兜一圈回到原状态
                there = S.PAUSING if current.status is S.RUNNING else S.RUNNING
                current, loop = walk(current, there, current.status)
                current = dataclasses.replace(current, **fields)  # type: ignore[arg-type]
                store.save(current, expect_version=version, transitions=loop)
            self.assertSnapshotEqual(store.get("s-index"), current)
            if hit is not None:
                self.assertEqual(found(hit), ["s-index"], f"{fields} 之后按新值查询 {hit} 应命中")
            if miss is not None:
                self.assertEqual(found(miss), [], f"{fields} 之后按旧值查询 {miss} 不应再命中")
            self.assertEqual(found(TaskQuery(statuses=frozenset({current.status}))), ["s-index"])

        # 不带迁移记录、不加版本号地只改状态（存储不查转移表）：状态照样改写。
        stopping = dataclasses.replace(current, status=S.STOPPING)
        store.save(stopping, expect_version=stopping.status_version)
        self.assertSnapshotEqual(store.get("s-index"), stopping)
        self.assertEqual(found(TaskQuery(statuses=frozenset({S.STOPPING}))), ["s-index"])
        self.assertEqual(found(TaskQuery(statuses=frozenset({S.RUNNING, S.PAUSING}))), [])
        self.assertVersions(store, "s-index", list(range(1, stopping.status_version + 1)))

    def test_save_does_not_clobber_side_channel_fields(self) -> None:
        store = self.open_store()
        base = snap("s-side", progress=Progress(done=0, total=10))
        store.create(base)
        store.touch(
            "s-side",
            progress=Progress(done=7, total=10, unit="批"),
            heartbeat_at=T0 + timedelta(seconds=70),
            lease_owner="node-b",
            lease_until=T0 + timedelta(seconds=100),
        )
        # 调用方手里那份快照的旁路字段是过时的（甚至是胡乱的）：save 一律不采用。
        stale = dataclasses.replace(
            base, progress=Progress(done=999), lease_owner="liar", lease_until=T0, last_heartbeat_at=T0
        )
        queued, record = step(stale, S.QUEUED, label="saved")
        store.save(queued, expect_version=0, transitions=[record])
        got = store.get("s-side")
        assert got is not None
        self.assertEqual(got.label, "saved")
        self.assertEqual(got.progress, Progress(done=7, total=10, unit="批"))
        self.assertEqual(got.last_heartbeat_at, T0 + timedelta(seconds=70))
        self.assertEqual(got.lease_owner, "node-b")
        self.assertEqual(got.lease_until, T0 + timedelta(seconds=100))

    # ===============================================================================================
    # _save_direct：写穿不经组提交时的 save 入口（默认就是 save；内存存储相对存储里的上一版检查）
    # ===============================================================================================

    def test_direct_save_writes_exactly_like_save(self) -> None:
        store = self.open_store()
        base = snap("s-direct", label="v0")
        store.create(base)
        store.touch("s-direct", progress=Progress(done=3, total=10), lease_owner="node-b")
        queued, r1 = step(base, S.QUEUED)
        store._save_direct(queued, 0, (r1,))
        running, records = walk(queued, S.STARTING, S.RUNNING)
        store._save_direct(running.evolve(executor="thread"), 1, tuple(records))
        got = store.get("s-direct")
        assert got is not None
        self.assertEqual((got.status, got.status_version, got.executor), (S.RUNNING, 3, "thread"))
        self.assertEqual(store.history("s-direct"), [r1, *records])
        # 旁路字段照样只归 touch：调用方快照里的（空的）进度与租约不采用。
        self.assertEqual((got.progress, got.lease_owner), (Progress(done=3, total=10), "node-b"))
        stale, stale_record = step(queued, S.CANCELLED)  # 过时的写者：以为版本还是 1
        with self.assertRaises(ConcurrencyConflict):
            store._save_direct(stale, 1, (stale_record,))
        self.assertVersions(store, "s-direct", [1, 2, 3])
        ghost, record = step(snap("s-direct-ghost"), S.QUEUED)
        with self.assertRaises(TaskNotFound):
            store._save_direct(ghost, 0, (record,))

    def test_direct_save_refuses_what_save_refuses(self) -> None:
        """只查变了的字段也一项不少：改成存不下的文本、接不上的迁移记录、错误的版本号，都与 save 一样
        ConfigurationError、什么也不写。"""
        store = self.open_store()
        base = snap("s-direct-bad", label="ok")
        store.create(base)
        queued, record = step(base, S.QUEUED)
        for bad in (
            queued.evolve(executor="bad\x00executor"),  # evolve 不校验：只有写入检查拦得住
            queued.evolve(label="x" * 10_000),
            queued.evolve(owner="\ud800"),
            queued.evolve(priority=2**60),
            queued.evolve(tags=frozenset(f"t{i}" for i in range(1000))),
        ):
            with self.subTest(bad=bad), self.assertRaises(ConfigurationError):
                store._save_direct(bad, 0, (record,))
        nxt, records = walk(base, S.QUEUED, S.STARTING)
        for expect, transitions in (
            (0, (records[1],)),  # 缺了版本 1
            (0, (records[0], records[0])),
            (0, (records[0],)),  # 快照已是版本 2，记录只到 1
            (-1, tuple(records)),
            (True, tuple(records)),
        ):
            with self.subTest(expect=expect), self.assertRaises(ConfigurationError):
                store._save_direct(nxt, expect, transitions)
        self.assertNeverSaved(store, "s-direct-bad")
        # 拦下之后，同一个写者照常写对的那份。
        store._save_direct(queued, 0, (record,))
        self.assertVersions(store, "s-direct-bad", [1])

    # ===============================================================================================
    # _save_next：写穿最常见的那一次写（存储正好落后一条；默认就是 _save_direct；内存存储直接存下紧凑记录）
    # ===============================================================================================

    def test_next_save_writes_exactly_like_save(self) -> None:
        store = self.open_store()
        base = snap("s-next", label="v0")
        store.create(base)
        store.touch("s-next", progress=Progress(done=3, total=10), lease_owner="node-b")
        current, history = base, []
        for status in (S.QUEUED, S.STARTING, S.RUNNING):
            current, record = step(current, status)
            if status is S.STARTING:
                current = current.evolve(executor="thread")
            store._save_next(current, record, pack_transition(record))
            history.append(record)
        got = store.get("s-next")
        assert got is not None
        self.assertEqual((got.status, got.status_version, got.executor), (S.RUNNING, 3, "thread"))
        self.assertEqual(store.history("s-next"), history)
        # 旁路字段照样只归 touch：调用方快照里的（空的）进度与租约不采用。
        self.assertEqual((got.progress, got.lease_owner), (Progress(done=3, total=10), "node-b"))
        stale, stale_record = step(snap("s-next", label="v0"), S.CANCELLED)  # 过时的写者：以为版本还是 0
        with self.assertRaises(ConcurrencyConflict):
            store._save_next(stale, stale_record, pack_transition(stale_record))
        self.assertVersions(store, "s-next", [1, 2, 3])
        ghost, record = step(snap("s-next-ghost"), S.QUEUED)
        with self.assertRaises(TaskNotFound):
            store._save_next(ghost, record, pack_transition(record))

    def test_next_save_refuses_what_save_refuses(self) -> None:
        """存不下的文本、不是这一版的迁移记录，都与 save 一样 ConfigurationError、什么也不写。"""
        store = self.open_store()
        base = snap("s-next-bad", label="ok")
        store.create(base)
        queued, record = step(base, S.QUEUED)
        for bad in (
            queued.evolve(executor="bad\x00executor"),  # evolve 不校验：只有写入检查拦得住
            queued.evolve(label="x" * 10_000),
            queued.evolve(owner="\ud800"),
            queued.evolve(priority=2**60),
        ):
            with self.subTest(bad=bad), self.assertRaises(ConfigurationError):
                store._save_next(bad, record, pack_transition(record))
        nxt, records = walk(base, S.QUEUED, S.STARTING)  # 快照已是版本 2，记录只是版本 1 的那条
        with self.assertRaises(ConfigurationError):
            store._save_next(nxt, records[0], pack_transition(records[0]))
        self.assertNeverSaved(store, "s-next-bad")
        store._save_next(queued, record, pack_transition(record))  # 拦下之后，同一个写者照常写对的那份
        self.assertVersions(store, "s-next-bad", [1])

    def _race_round(
        self, store: TaskStore, current: TaskSnapshot, round_no: int, writers: int
    ) -> TaskSnapshot:
        """一轮竞争：writers 个线程拿同一个 expect_version 同时 save。返回赢家写下的快照。"""
        barrier = threading.Barrier(writers)
        results: list[object] = [None] * writers
        expect = current.status_version
        target = S.PAUSING if current.status is S.RUNNING else S.RUNNING

        def writer(i: int) -> None:
            nxt, record = step(current, target, actor=f"writer-{i}", label=f"round-{round_no}-writer-{i}")
            barrier.wait()
            try:
                store.save(nxt, expect_version=expect, transitions=[record])
                results[i] = "won"
            except ConcurrencyConflict:
                results[i] = "conflict"
            except BaseException as exc:  # 线程里的任何异常都要带回主线程报告
                results[i] = exc

        self.run_threads([functools.partial(writer, i) for i in range(writers)])
        self.assertEqual(results.count("won"), 1, f"第 {round_no} 轮：{results}")
        self.assertEqual(results.count("conflict"), writers - 1, f"第 {round_no} 轮：{results}")
        winner = results.index("won")
        got = store.get(current.task_id)
        assert got is not None
        self.assertEqual(got.status_version, expect + 1)
        self.assertEqual(got.label, f"round-{round_no}-writer-{winner}", "快照必须来自赢家")
        history = store.history(current.task_id)
        self.assertEqual([t.version for t in history], list(range(1, expect + 2)), "历史有空洞或重复")
        self.assertEqual(history[-1].actor, f"writer-{winner}", "迁移记录必须来自赢家")
        return got

    def test_race_same_expect_version_exactly_one_wins(self) -> None:
        store = self.open_store()
        current = snap("race", status=S.RUNNING)
        store.create(current)
        for round_no in range(4):
            current = self._race_round(store, current, round_no, writers=8)

    def test_race_retrying_writers_leave_a_gapless_history(self) -> None:
        store = self.open_store()
        store.create(snap("chain", status=S.RUNNING))
        writers, per_writer = 4, 15
        errors: list[BaseException] = []

        def writer(i: int) -> None:
            try:
                done, attempts = 0, 0
                while done < per_writer:
                    attempts += 1
                    if attempts > 100 * per_writer * writers:
                        raise AssertionError(f"w{i} 重试了 {attempts} 次仍未写完：save 似乎总在冲突")
                    current = store.get("chain")
                    assert current is not None
                    target = S.PAUSING if current.status is S.RUNNING else S.RUNNING
                    nxt, record = step(current, target, actor=f"w{i}")
                    try:
                        store.save(nxt, expect_version=current.status_version, transitions=[record])
                    except ConcurrencyConflict:
                        continue
                    done += 1
            except BaseException as exc:
                errors.append(exc)

        self.run_threads([functools.partial(writer, i) for i in range(writers)])
        self.assertEqual(errors, [])
        total = writers * per_writer
        got = store.get("chain")
        assert got is not None
        self.assertEqual(got.status_version, total)
        history = store.history("chain")
        self.assertEqual([t.version for t in history], list(range(1, total + 1)), "历史有空洞或重复")
        for before, after in itertools.pairwise(history):
            self.assertIs(after.from_status, before.to_status, f"版本 {after.version} 接不上上一条")
        self.assertIs(history[-1].to_status, got.status)
        counts = {f"w{i}": 0 for i in range(writers)}
        for record in history:
            counts[record.actor or ""] += 1
        self.assertEqual(set(counts.values()), {per_writer})

    def test_reads_never_see_a_torn_snapshot(self) -> None:
        store = self.open_store()
        store.create(snap("torn", status=S.RUNNING, label="v0", outcome={"v": 0}))
        saves = 60
        errors: list[BaseException] = []
        done = threading.Event()

        def writer() -> None:
            try:
                for n in range(1, saves + 1):
                    current = store.get("torn")
                    assert current is not None
                    target = S.PAUSING if current.status is S.RUNNING else S.RUNNING
                    nxt, record = step(current, target, label=f"v{n}", outcome={"v": n, "pad": [n] * 50})
                    store.save(nxt, expect_version=current.status_version, transitions=[record])
            except BaseException as exc:
                errors.append(exc)
            finally:
                done.set()

        def reader() -> None:
            try:
                while not done.is_set():
                    for got in [store.get("torn"), *store.query(TaskQuery(name_prefix="contract"))]:
                        assert got is not None
                        if got.label != f"v{got.outcome['v']}":
                            raise AssertionError(
                                f"读到了半新半旧的快照：label={got.label} outcome={got.outcome}"
                            )
                        if got.status_version != got.outcome["v"]:
                            raise AssertionError(
                                f"版本 {got.status_version} 与 outcome {got.outcome} 不属于同一次写入"
                            )
            except BaseException as exc:
                errors.append(exc)

        self.run_threads([writer, reader, reader])
        self.assertEqual(errors, [])
