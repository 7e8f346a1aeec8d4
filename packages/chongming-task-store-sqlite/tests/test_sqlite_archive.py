"""归档删除：回执的键合并成连续版本段（core 的 version_runs，SQL 后端共用）之后，SQLite 删的仍然正好是
回执列出的行（issue 20）。"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

from chongming_task.core.storage.retention import version_runs
from chongming_task.core.storage.values import ArchiveReceipt
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.states import TaskStatus as S
from chongming_task.stores.sqlite import SqliteTaskStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_version_runs_cover_exactly_the_keys_in_bounded_batches() -> None:
    rng = random.Random(7)
    for _ in range(200):
        keys: list[tuple[str, int]] = []
        for task in range(rng.randint(0, 12)):
            versions = sorted(rng.sample(range(1, 40), rng.randint(1, 20)))
            keys.extend((f"t{task}", v) for v in versions)
        rows = rng.randint(1, 30)
        batches = version_runs(keys, rows)
        flat = [(t, v) for batch in batches for t, lo, hi in batch for v in range(lo, hi + 1)]
        assert flat == keys
        assert all(0 < sum(hi - lo + 1 for _, lo, hi in batch) <= rows for batch in batches)


def test_delete_archived_removes_only_the_listed_versions(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "t.db")
    try:
        for name in ("a", "b"):
            records = [
                Transition(name, S.PENDING, S.QUEUED, "t", None, None, 1, T0),
                *(
                    Transition(
                        name,
                        S.RUNNING if v % 2 else S.PAUSED,
                        S.PAUSED if v % 2 else S.RUNNING,
                        "t",
                        None,
                        None,
                        v,
                        T0 + timedelta(days=v),
                    )
                    for v in range(2, 11)
                ),
            ]
            snap = TaskSnapshot(task_id=name, name="n", created_at=T0, status=S.RUNNING, status_version=10)
            store.create(snap, records)
        # 不连续的键：a 的 1-3 与 5，b 的 2、4-6
        receipt = ArchiveReceipt(
            transitions=(("a", 1), ("a", 2), ("a", 3), ("a", 5), ("b", 2), ("b", 4), ("b", 5), ("b", 6))
        )
        deleted = store.delete_archived(receipt)
        assert deleted.transitions == 8
        assert [r.version for r in store.history("a")] == [4, 6, 7, 8, 9, 10]
        assert [r.version for r in store.history("b")] == [1, 3, 7, 8, 9, 10]
        assert store.delete_archived(receipt).transitions == 0, "幂等"
    finally:
        store.close()
