"""契约用例：touch：进度、心跳、租约这些旁路字段的写入不抬版本、不与 save 冲突。"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import ClassVar

from chongming_task.models import Progress
from chongming_task.testing.contract._base import (
    T0,
    TZ_SHANGHAI,
    ContractBase,
    S,
    snap,
    step,
    walk,
)


class TouchCases(ContractBase):
    """touch：旁路字段。"""

    __test__: ClassVar[bool] = False

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
