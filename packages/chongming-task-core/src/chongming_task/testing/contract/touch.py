"""契约用例：touch：进度、心跳、租约这些旁路字段的写入不抬版本、不与 save 冲突。"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta

from chongming_task.errors import ConfigurationError
from chongming_task.models import Progress
from chongming_task.testing.contract._base import T0, TZ_SHANGHAI, ContractBase, S, snap, step, walk


class TouchCases(ContractBase):
    """touch：旁路字段。"""

    # ===============================================================================================
    # touch
    # ===============================================================================================

    def test_touch_updates_side_channel_without_bumping_version(self) -> None:
        store = self.open_store()
        base, records = walk(snap("t-1"), S.QUEUED, S.STARTING, S.RUNNING)
        store.create(base, records)
        progress = Progress(done=120, total=500, unit="partitions", message="第 2 段")
        ok = store.touch(
            "t-1",
            progress=progress,
            heartbeat_at=T0 + timedelta(seconds=9, microseconds=5),
            lease_owner="node-a",
            lease_until=datetime(2026, 3, 1, 16, 1, tzinfo=TZ_SHANGHAI),
        )
        self.assertIs(ok, True)
        got = store.get("t-1")
        assert got is not None
        self.assertEqual(got.status_version, 3, "touch 绝不能递增 status_version")
        self.assertIs(got.status, S.RUNNING)
        self.assertEqual(got.progress, progress)
        self.assertEqual(got.last_heartbeat_at, T0 + timedelta(seconds=9, microseconds=5))
        self.assertEqual(got.lease_owner, "node-a")
        self.assertEqual(got.lease_until, datetime(2026, 3, 1, 16, 1, tzinfo=TZ_SHANGHAI))
        self.assertVersions(store, "t-1", [1, 2, 3])

    def test_touch_none_means_unchanged(self) -> None:
        store = self.open_store()
        store.create(snap("t-partial"))
        store.touch("t-partial", progress=Progress(done=1), lease_owner="n1", lease_until=T0)
        store.touch("t-partial", heartbeat_at=T0 + timedelta(seconds=1))
        store.touch("t-partial")
        got = store.get("t-partial")
        assert got is not None
        self.assertEqual(got.progress, Progress(done=1))
        self.assertEqual((got.lease_owner, got.lease_until), ("n1", T0))
        self.assertEqual(got.last_heartbeat_at, T0 + timedelta(seconds=1))
        self.assertEqual(got.status_version, 0)

    def test_touch_unknown_task_returns_false(self) -> None:
        store = self.open_store()
        self.assertIs(store.touch("ghost", progress=Progress(done=1)), False)
        self.assertIsNone(store.get("ghost"), "touch 不能凭空创建任务")

    def test_touch_never_conflicts_with_save(self) -> None:
        store = self.open_store()
        base = snap("t-save")
        store.create(base)
        for i in range(3):
            store.touch("t-save", progress=Progress(done=i), heartbeat_at=T0 + timedelta(seconds=i))
        queued, record = step(base, S.QUEUED)
        store.save(queued, expect_version=0, transitions=[record])  # touch 之后旧版本号依然有效
        got = store.get("t-save")
        assert got is not None
        self.assertEqual((got.status, got.status_version), (S.QUEUED, 1))
        self.assertEqual(got.progress, Progress(done=2))

    def test_touch_many(self) -> None:
        store = self.open_store()
        store.create(snap("m-1"))
        store.create(snap("m-2", status_version=0))
        lease = T0 + timedelta(seconds=45)
        store.touch_many(
            [
                ("m-1", {"lease_owner": "node-a", "lease_until": lease}),
                ("m-2", {"progress": Progress(done=5, total=10), "heartbeat_at": lease}),
                ("ghost", {"lease_until": lease}),
            ]
        )
        one, two = store.get("m-1"), store.get("m-2")
        assert one is not None and two is not None
        self.assertEqual((one.lease_owner, one.lease_until, one.progress), ("node-a", lease, None))
        self.assertEqual(
            (two.progress, two.last_heartbeat_at, two.lease_owner), (Progress(done=5, total=10), lease, None)
        )
        self.assertEqual((one.status_version, two.status_version), (0, 0))
        self.assertIsNone(store.get("ghost"))

    def test_renew_leases_writes_one_lease_to_the_listed_tasks_only(self) -> None:
        # 续租一批：只写 lease_owner / lease_until，不抬版本、不碰进度与心跳；没列出的任务与不存在的 id 不动；
        # 时间的时区偏移与微秒原样往返；它与 save 不冲突（续租之后按原版本 save 照样成功）。
        store = self.open_store()
        progress = Progress(done=3, total=9)
        for task_id in ("r-1", "r-2", "r-3"):
            store.create(snap(task_id, lease_owner="old", lease_until=T0, progress=progress))
        until = datetime(2026, 3, 1, 16, 1, 2, 345678, tzinfo=TZ_SHANGHAI)
        store.renew_leases("node-a", ["r-3", "r-1", "ghost", "r-1"], until)
        one, two, three = store.get("r-1"), store.get("r-2"), store.get("r-3")
        assert one is not None and two is not None and three is not None
        for renewed in (one, three):
            self.assertEqual((renewed.lease_owner, renewed.lease_until), ("node-a", until))
            self.assertEqual(renewed.lease_until.utcoffset(), until.utcoffset())  # type: ignore[union-attr]
            self.assertEqual((renewed.status_version, renewed.progress), (0, progress))
        self.assertEqual((two.lease_owner, two.lease_until), ("old", T0), "没列出的任务不续")
        self.assertIsNone(store.get("ghost"))
        store.renew_leases("node-a", [], until)  # 空集合：什么也不做
        nxt, record = step(one, S.QUEUED)
        store.save(nxt, expect_version=0, transitions=[record])
        after = store.get("r-1")
        assert after is not None
        self.assertEqual((after.status_version, after.lease_owner, after.lease_until), (1, "node-a", until))
        refused: list[Callable[[], None]] = [
            lambda: store.renew_leases("", ["r-1"], until),
            lambda: store.renew_leases("node-a", "r-1", until),
            lambda: store.renew_leases("node-a", ["r-1"], datetime(2026, 3, 1)),
            lambda: store.renew_leases("node-a", None, until),  # type: ignore[arg-type]
        ]
        for bad in refused:
            with self.assertRaises(ConfigurationError):
                bad()
        untouched = store.get("r-2")
        assert untouched is not None
        self.assertEqual(untouched.lease_owner, "old", "被拒绝的续租什么也不写")

    def test_touch_and_save_interleaved_from_threads(self) -> None:
        store = self.open_store()
        store.create(snap("t-race", status=S.RUNNING))
        saves, touches = 40, 200
        errors: list[BaseException] = []
        start = threading.Barrier(2)

        def saver() -> None:
            try:
                start.wait()
                for _ in range(saves):
                    current = store.get("t-race")
                    assert current is not None
                    target = S.PAUSING if current.status is S.RUNNING else S.RUNNING
                    nxt, record = step(current, target)
                    store.save(nxt, expect_version=current.status_version, transitions=[record])
            except BaseException as exc:
                errors.append(exc)

        def toucher() -> None:
            try:
                start.wait()
                for i in range(1, touches + 1):
                    self.assertTrue(
                        store.touch(
                            "t-race", progress=Progress(done=i), heartbeat_at=T0 + timedelta(seconds=i)
                        )
                    )
            except BaseException as exc:
                errors.append(exc)

        self.run_threads([saver, toucher])
        self.assertEqual(errors, [], "touch 不能让 save 冲突，save 也不能让 touch 失败")
        got = store.get("t-race")
        assert got is not None
        self.assertEqual(got.status_version, saves)
        self.assertEqual(got.progress, Progress(done=touches), "save 不能用旧值覆盖 touch 写入的进度")
        self.assertEqual(got.last_heartbeat_at, T0 + timedelta(seconds=touches))
        self.assertVersions(store, "t-race", list(range(1, saves + 1)))
