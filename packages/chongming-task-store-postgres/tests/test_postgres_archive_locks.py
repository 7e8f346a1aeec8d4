"""归档维护流量的锁（存储指南 §9、docs/distributed.md §7.5）：

* ``delete_archived`` 整体删除任务时，``FOR UPDATE`` 核对与删除在同一个事务里：与之并发的 ``save``（终态任务
  被重试，写一个新版本）要么先提交（我们不删），要么等我们提交之后失败——不会出现"新版本的迁移记录写进去了，
  任务却被删了"。原先连接池连接是 autocommit，锁在核对那条语句结束时就放了。
* ``archive_partition`` 在 DETACH 之后的那几次往返里，会话在事务中空等的上限是存储的 ``network_timeout``。
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from chongming_task.core.storage.values import ArchiveReceipt
from chongming_task.errors import ConcurrencyConflict, TaskNotFound
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.states import TaskStatus as S
from chongming_task.stores.postgres import PostgresTaskStore, _archive, _partitions

pytestmark = pytest.mark.postgres

OLD = datetime(2026, 1, 5, tzinfo=UTC)
GATE = 7_700_431  # 测试持有的咨询锁：让 delete_archived 停在"核对完、删除前"


def _failed_task(task_id: str) -> tuple[TaskSnapshot, list[Transition]]:
    records = [
        Transition(task_id, S.PENDING, S.QUEUED, "test:queued", "test", None, 1, OLD),
        Transition(task_id, S.QUEUED, S.FAILED, "test:cycle", "test", None, 2, OLD + timedelta(minutes=1)),
    ]
    snapshot = TaskSnapshot(
        task_id=task_id,
        name="t",
        created_at=OLD,
        status=S.FAILED,
        status_version=2,
        finished_at=OLD + timedelta(minutes=1),
    )
    return snapshot, records


class _GatedSql:
    """与真实的 ``ArchiveSql`` 相同，只是删除任务的指令之前先等测试手里的咨询锁（真实的服务器锁）。"""

    def __init__(self, real: _archive.ArchiveSql) -> None:
        self.__dict__.update(real.__dict__)
        self.drop_task_commands = (
            f"WITH gate AS (SELECT pg_advisory_xact_lock({GATE})) "
            f"{real.drop_task_commands} AND EXISTS (SELECT 1 FROM gate)"
        )


def _waiting_on_lock(admin: Any, application_name: str) -> bool:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
        [application_name],
    ).fetchone()
    return bool(row[0])


def _wait(predicate: Any, seconds: float) -> bool:
    event = threading.Event()
    for _ in range(int(seconds / 0.02)):
        if predicate():
            return True
        event.wait(0.02)
    return bool(predicate())


def test_concurrent_save_cannot_slip_between_the_check_and_the_delete(
    postgres_dsn: str, schema: str, admin: Any
) -> None:
    archiver = PostgresTaskStore(postgres_dsn, schema=schema, application_name="ct-archiver")
    writer = PostgresTaskStore(postgres_dsn, schema=schema, application_name="ct-writer")
    outcome: dict[str, Any] = {}
    try:
        snapshot, records = _failed_task("retried")
        writer.create(snapshot, records)
        exported = archiver.export_finished(OLD + timedelta(days=1))
        assert [t.snapshot.task_id for t in exported] == ["retried"]
        receipt = ArchiveReceipt.of(list(exported[0].history), exported)
        archiver._archive_sql = _GatedSql(archiver._archive_sql)  # type: ignore[assignment]

        def delete() -> None:
            outcome["deleted"] = archiver.delete_archived(receipt)

        def retry() -> None:
            again = Transition(
                "retried", S.FAILED, S.QUEUED, "test:cycle", "test", None, 3, datetime.now(UTC)
            )
            try:
                writer.save(
                    TaskSnapshot(
                        task_id="retried", name="t", created_at=OLD, status=S.QUEUED, status_version=3
                    ),
                    expect_version=2,
                    transitions=[again],
                )
                outcome["save"] = "committed"
            except (TaskNotFound, ConcurrencyConflict) as exc:
                outcome["save"] = type(exc).__name__

        admin.execute("SELECT pg_advisory_lock(%s)", [GATE])
        try:
            deleting = threading.Thread(target=delete, daemon=True)
            deleting.start()
            # delete_archived 已核对完（FOR UPDATE 锁过了快照行），正等在删除之前。
            assert _wait(lambda: _waiting_on_lock(admin, "ct-archiver"), 10), "delete_archived 没有停在闸门上"
            saving = threading.Thread(target=retry, daemon=True)
            saving.start()
            # 修复之后：save 等快照行的锁；修复之前：锁早已放掉，save 直接提交。
            assert _wait(lambda: "save" in outcome or _waiting_on_lock(admin, "ct-writer"), 10)
        finally:
            admin.execute("SELECT pg_advisory_unlock(%s)", [GATE])
        deleting.join(15)
        saving.join(15)
        assert not deleting.is_alive() and not saving.is_alive(), outcome

        stored = writer.get("retried")
        versions = [t.version for t in writer.history("retried")]
        assert outcome["save"] in ("TaskNotFound", "ConcurrencyConflict"), outcome
        assert stored is None and versions == [], (outcome, stored, versions)
        assert outcome["deleted"].tasks == 1 and outcome["deleted"].transitions == 2, outcome
    finally:
        archiver.close()
        writer.close()


def test_archive_partition_limits_idle_time_after_detach(
    postgres_dsn: str, schema: str, tmp_path: Path
) -> None:
    """DETACH 之后同一连接、同一事务里看到的空等与等锁上限（见 ``_partitions.archive_partition``）。"""
    store = PostgresTaskStore(postgres_dsn, schema=schema, network_timeout=3.5)
    seen: dict[str, str] = {}
    real = store._maintenance_connection

    class Watch:
        """包住维护连接：DETACH 一执行完，就在同一个事务里读一次这两个设置。"""

        def __init__(self, conn: Any) -> None:
            self._conn = conn

        def __getattr__(self, name: str) -> Any:
            return getattr(self._conn, name)

        def __enter__(self) -> Watch:
            self._conn.__enter__()
            return self

        def __exit__(self, *exc: Any) -> None:
            self._conn.__exit__(*exc)

        def execute(self, query: str, *args: Any) -> Any:
            cur = self._conn.execute(query, *args)
            if "DETACH PARTITION" in query:
                for name in ("idle_in_transaction_session_timeout", "lock_timeout"):
                    seen[name] = str(self._conn.execute(f"SHOW {name}").fetchone()[0])
                seen["in_transaction"] = self._conn.info.transaction_status.name
            return cur

    store._maintenance_connection = lambda: Watch(real())  # type: ignore[method-assign]
    try:
        with store._connection() as conn:
            _partitions.ensure_months(conn, store.schema, OLD, OLD)
        snapshot, records = _failed_task("old")
        store.create(snapshot, records)
        written: list[Transition] = []
        result = store.archive_partition(
            "transitions_p202601", datetime(2026, 2, 1, tzinfo=UTC), written.extend
        )
        assert result.dropped and len(written) == 2, result
        assert seen["idle_in_transaction_session_timeout"] == "3500ms", seen
        assert seen["lock_timeout"] == "2s", seen
        assert seen["in_transaction"] == "INTRANS", seen
        # 事务结束后 SET LOCAL 失效：维护连接本身（会话级）仍没有这个上限。
        with real() as conn:
            assert conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()[0] == "0"
    finally:
        store.close()
