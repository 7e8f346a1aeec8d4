"""归档器：先归档再删除、崩溃续跑、kill -9、长寿任务（issue 20；存储指南 §9）。

时间一律是显式时间戳（迁移的 ``at`` 由测试给定），不等真实时间。
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from prefork import python_popen

from chongming_task.core.archive import (
    ArchiveError,
    Archiver,
    _receipt_of,
    load_manifest,
    merged_history,
    read_segment,
    read_task,
    verify_archive,
)
from chongming_task.core.storage.values import ArchiveReceipt
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.states import TaskStatus as S
from chongming_task.storage import TaskStore
from chongming_task.stores.memory import InMemoryTaskStore
from chongming_task.stores.sqlite import SqliteTaskStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)
DAY = timedelta(days=1)
CUTOFF = T0 + 20 * DAY


def _record(task_id: str, version: int, frm: S, to: S, at: datetime) -> Transition:
    return Transition(task_id, frm, to, f"test:{to.value}", "test", None, version, at)


def _long_lived(task_id: str, cycles: int, *, step: timedelta) -> tuple[TaskSnapshot, list[Transition]]:
    """常驻任务：QUEUED 之后 RUNNING ⇄ PAUSED 反复 cycles 次，第 i 条在 T0 + i*step。"""
    records = [_record(task_id, 1, S.PENDING, S.QUEUED, T0)]
    status = S.QUEUED
    for version in range(2, cycles + 2):
        target = S.RUNNING if status is not S.RUNNING else S.PAUSED
        records.append(_record(task_id, version, status, target, T0 + (version - 1) * step))
        status = target
    snap = TaskSnapshot(
        task_id=task_id, name="long", created_at=T0, status=status, status_version=len(records)
    )
    return snap, records


def _finished(task_id: str, finished: datetime) -> tuple[TaskSnapshot, list[Transition]]:
    path = [(S.PENDING, S.QUEUED), (S.QUEUED, S.STARTING), (S.STARTING, S.RUNNING), (S.RUNNING, S.SUCCEEDED)]
    records = [
        _record(task_id, i + 1, a, b, finished - timedelta(minutes=4 - i)) for i, (a, b) in enumerate(path)
    ]
    snap = TaskSnapshot(
        task_id=task_id,
        name="done",
        created_at=finished - DAY,
        status=S.SUCCEEDED,
        status_version=4,
        finished_at=finished,
    )
    return snap, records


def _populate(
    store: TaskStore, *, live: int = 30, done: int = 30, cycles: int = 40
) -> dict[str, list[Transition]]:
    """live 个常驻任务（每天一条迁移，40 天）+ done 个早已结束的任务；返回每个任务的完整历史。"""
    expected: dict[str, list[Transition]] = {}
    for i in range(live):
        snap, records = _long_lived(f"live-{i:03d}", cycles, step=DAY)
        store.create(snap, records)
        expected[snap.task_id] = records
    for i in range(done):
        snap, records = _finished(f"done-{i:03d}", T0 + timedelta(days=1 + i % 10))
        store.create(snap, records)
        store.submit_command(snap.task_id, "stop")
        expected[snap.task_id] = records
    return expected


def _assert_complete(store: TaskStore, directory: Path, expected: dict[str, list[Transition]]) -> None:
    verify_archive(directory)  # 校验和都对、没有一行出现在两个段里
    for task_id, records in expected.items():
        assert merged_history(store, task_id, directory) == records, task_id
        online = store.history(task_id)
        assert all(r.at >= CUTOFF for r in online), f"{task_id} 的在线历史里还有窗口外的记录"
    assert store.export_transitions(CUTOFF) == []
    assert store.export_finished(CUTOFF) == []


# -------------------------------------------------------------------------------------------------------


def test_archive_moves_old_history_out_and_reads_it_back(tmp_path: Path) -> None:
    store = InMemoryTaskStore()
    expected = _populate(store)
    progress: list[int] = []
    summary = Archiver(
        store, tmp_path, batch_size=100, task_batch=7, progress=lambda s: progress.append(s.segments)
    ).run(CUTOFF)
    assert summary.transitions == 30 * 20 + 30 * 4  # 常驻任务的前 20 天 + 结束任务的全部历史
    assert summary.tasks == 30 and summary.commands == 30
    assert summary.segments == len(progress) == len(load_manifest(tmp_path)["segments"])
    assert all(e["state"] == "deleted" for e in load_manifest(tmp_path)["segments"])
    for i in range(30):
        assert store.get(f"done-{i:03d}") is None
        assert store.history(f"live-{i:03d}")[0].version == 21, "在线只留窗口内的后缀"
    _assert_complete(store, tmp_path, expected)
    view = read_task(tmp_path, "done-003")
    assert view.snapshot is not None and view.snapshot.status is S.SUCCEEDED
    assert [c.action.value for c in view.commands] == ["stop"]
    again = Archiver(store, tmp_path).run(CUTOFF)
    assert (again.transitions, again.tasks, again.segments) == (0, 0, 0), "重跑是空操作"


def test_dry_run_counts_without_touching_anything(tmp_path: Path) -> None:
    store = InMemoryTaskStore()
    _populate(store, live=3, done=2)
    summary = Archiver(store, tmp_path / "a", batch_size=7).run(CUTOFF, dry_run=True)
    assert (summary.transitions, summary.tasks, summary.commands) == (3 * 20 + 2 * 4, 2, 2)
    assert not (tmp_path / "a").exists()
    assert len(store.history("live-000")) == 41


def test_long_lived_task_keeps_only_its_window_online(tmp_path: Path) -> None:
    """暂停/恢复 10,000 次的常驻任务：在线只留窗口，归档 + 在线 = 完整的 1..10001。"""
    store = InMemoryTaskStore()
    snap, records = _long_lived("forever", 10_000, step=timedelta(minutes=5))
    store.create(snap, records)
    cutoff = T0 + timedelta(minutes=5 * 9_000)
    Archiver(store, tmp_path, batch_size=2000).run(cutoff)
    online = store.history("forever")
    assert online[0].version == 9_001 and len(online) == 1_001
    assert merged_history(store, "forever", tmp_path) == records
    assert store.get("forever") is not None and store.get("forever").status_version == 10_001  # type: ignore[union-attr]


def test_segment_written_but_not_recorded_is_reconciled_by_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """崩溃在"段已落盘、清单与删除都没做"：重跑按内容补记孤儿段并删除，同一行不会进第二个段。"""
    store = InMemoryTaskStore()
    expected = _populate(store, live=4, done=3)
    archiver = Archiver(store, tmp_path, batch_size=30)

    def crash(manifest: object) -> None:
        raise KeyboardInterrupt("模拟 kill：清单还没写")

    monkeypatch.setattr(archiver, "_save_manifest", crash)
    with pytest.raises(KeyboardInterrupt):
        archiver.run(CUTOFF)
    monkeypatch.undo()
    assert len(list(tmp_path.glob("seg-*.jsonl.gz"))) == 1 and not (tmp_path / "manifest.json").exists()
    summary = Archiver(store, tmp_path, batch_size=30).run(CUTOFF)
    assert summary.reconciled_segments == 1
    _assert_complete(store, tmp_path, expected)


def test_gap_in_the_archive_is_reported(tmp_path: Path) -> None:
    store = InMemoryTaskStore()
    expected = _populate(store, live=2, done=0)
    Archiver(store, tmp_path, batch_size=5).run(CUTOFF)
    first = sorted(tmp_path.glob("seg-*.jsonl.gz"))[0]
    first.unlink()
    with pytest.raises(ArchiveError, match="读不了"):
        merged_history(store, "live-000", tmp_path)
    with pytest.raises(ArchiveError, match="缺失"):
        verify_archive(tmp_path)
    # 连清单里的记录也丢了：拼接时发现版本空洞。
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["segments"] = [e for e in manifest["segments"] if e["name"] != first.name]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArchiveError, match="空洞"):
        merged_history(store, "live-000", tmp_path)
    assert len(merged_history(store, "live-001", tmp_path)) == len(expected["live-001"])


def _full_checkpoint(store: SqliteTaskStore) -> None:
    """把 WAL 全部拷回主文件并截短。存储自己的后台检查点线程可能正在做一次 PASSIVE：那时 TRUNCATE 返回
    busy=1、什么也没拷（结果行的第一列），所以重试到 busy=0 为止——文件大小只有在这之后才说明问题。"""
    for _ in range(500):
        busy = store._run(
            "checkpoint", lambda c: c.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone(), "none"
        )
        if busy[0] == 0:
            return
        time.sleep(0.01)
    raise AssertionError("WAL 检查点一直 busy")


def test_sqlite_new_file_uses_incremental_vacuum_and_shrinks(tmp_path: Path) -> None:
    path = tmp_path / "tasks.db"
    store = SqliteTaskStore(path)
    try:
        _populate(store, live=50, done=200, cycles=60)
        import sqlite3

        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2, "新文件以 INCREMENTAL 建库"
        _full_checkpoint(store)
        before = path.stat().st_size
        Archiver(store, tmp_path / "archive", batch_size=500).run(CUTOFF)
        _full_checkpoint(store)
        assert path.stat().st_size < before, "删除之后文件变小（incremental_vacuum）"
    finally:
        store.close()


# -- kill -9 at random instants ---------------------------------------------------------------------------

_CHILD = """
import sys
from datetime import datetime
from chongming_task.core.archive import Archiver
from chongming_task.store_registry import open_store
store = open_store(sys.argv[1])
archiver = Archiver(store, sys.argv[2], batch_size=int(sys.argv[4]), task_batch=5)
print("ready", flush=True)
archiver.run(datetime.fromisoformat(sys.argv[3]))
store.close()
"""


def _archive_in_child(url: str, directory: Path, kill_after: float | None) -> tuple[int, float]:
    """在子进程里归档；``kill_after`` 秒后（从子进程报"就绪"起算）kill -9，None = 让它跑完。

    返回退出码与从"就绪"到退出的秒数。从"就绪"（导入与打开存储之后）起算，而不是从启动起算：负载高时
    解释器启动本身就可能超过固定的等待，那样一次也杀不到归档中途。
    """
    # 经预导入的模板进程 fork（tests/support/prefork.py）：每次试验省掉解释器启动与导入（42 次）。
    child = python_popen(
        ["-c", _CHILD, url, str(directory), CUTOFF.isoformat(), "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == b"ready", child.stderr and child.stderr.read()[-2000:]
    ready = time.perf_counter()
    if kill_after is not None:
        time.sleep(kill_after)
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
    child.wait(30)
    took = time.perf_counter() - ready
    _, err = child.communicate()
    # 被杀（-9）或自己跑完（0）；别的退出码说明子进程根本没在归档（这个检验就成了空转）。
    assert child.returncode in (0, -signal.SIGKILL), err.decode(errors="replace")[-2000:]
    return child.returncode, took


def _kill_trials(url: str, open_: type[TaskStore] | None, make, tmp_path: Path, trials: int) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(20)
    killed = started = 0
    window = 0.4
    # 第 0 轮不杀，量出这台机器此刻跑完一次要多久：之后在 [0, 这个时长) 里随机杀。固定的窗口在归档变快
    # 之后大半落在子进程已经跑完之后（试验就白做了），机器忙的时候又可能总杀在开头。
    for trial in range(trials + 1):
        store, url_t = make(trial)
        try:
            expected = _populate(store, live=25, done=25, cycles=40)
            directory = tmp_path / f"archive-{trial}"
            # 杀在导出、写段、删除的任意时刻
            code, took = _archive_in_child(url_t, directory, None if trial == 0 else rng.uniform(0.0, window))
            if trial == 0:
                window = max(took, 0.02)
            killed += code == -signal.SIGKILL
            started += (directory / "manifest.jsonl").exists() or any(directory.glob("seg-*"))
            summary = Archiver(store, directory, batch_size=20, task_batch=5).run(CUTOFF)  # 续跑
            _assert_complete(store, directory, expected)
            assert summary.segments >= 0
        finally:
            store.close()
    assert killed >= 1 and started >= 1, f"{trials} 次里被杀在归档中途的 {killed} 次、已写出段的 {started} 次"


# 每个后端 20 次（issue 20）：负载 14 的 2 核共享机器上 SQLite 约 20 秒、PostgreSQL 约 17 秒。
# 本地快速迭代可以用 CHONGMING_KILL_TRIALS 调小。
def test_kill_9_during_archive_on_sqlite(tmp_path: Path) -> None:
    def make(trial: int) -> tuple[TaskStore, str]:
        path = tmp_path / f"kill-{trial}.db"
        return SqliteTaskStore(path), f"sqlite:///{path}"

    _kill_trials("sqlite", None, make, tmp_path, trials=int(os.environ.get("CHONGMING_KILL_TRIALS", "20")))


def test_kill_9_during_archive_on_postgres(tmp_path: Path) -> None:
    dsn = os.environ.get("CHONGMING_TEST_POSTGRES")
    if not dsn:
        pytest.skip("需要 CHONGMING_TEST_POSTGRES")
    from chongming_task.stores.postgres import PostgresTaskStore

    schemas: list[str] = []

    def make(trial: int) -> tuple[TaskStore, str]:
        schema = f"archive_kill_{uuid.uuid4().hex[:10]}"
        schemas.append(schema)
        sep = "&" if "?" in dsn else "?"
        return PostgresTaskStore(dsn, schema=schema), f"{dsn}{sep}schema={schema}"

    try:
        _kill_trials(
            "postgres", None, make, tmp_path, trials=int(os.environ.get("CHONGMING_KILL_TRIALS", "20"))
        )
    finally:
        import psycopg

        with psycopg.connect(dsn, autocommit=True) as conn:
            for schema in schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_snapshot_round_trip_in_segment(tmp_path: Path) -> None:
    store = InMemoryTaskStore()
    snap, records = _finished("fancy", T0 + DAY)
    snap = dataclasses.replace(snap, outcome={"行": [1, 2]}, tags=frozenset({"a", "b"}))
    store.create(snap, records)
    Archiver(store, tmp_path).run(CUTOFF)
    view = read_task(tmp_path, "fancy")
    assert view.snapshot == snap


# -- manifest journal and the format written before it -----------------------------------------------

FORMAT1 = Path(__file__).parent / "data" / "archive-format1"
"""清单日志出现之前的归档器写出的目录（每一步都以 ``indent=1`` 重写 ``manifest.json``，没有
``manifest.jsonl``）：``_format1_store`` 的 3 个常驻任务 + 2 个结束任务，batch_size=25、task_batch=1，
截止 CUTOFF。由提交 aeac917 的 core/archive.py 生成。"""


def _format1_store(store: TaskStore) -> dict[str, list[Transition]]:
    expected: dict[str, list[Transition]] = {}
    for i in range(3):
        snap, records = _long_lived(f"live-{i:03d}", 40, step=DAY)
        store.create(snap, records)
        expected[snap.task_id] = records
    for i in range(2):
        snap, records = _finished(f"done-{i:03d}", T0 + timedelta(days=1 + i))
        store.create(snap, records)
        expected[snap.task_id] = records
    return expected


def _as_left_by_the_old_run(tmp_path: Path) -> tuple[InMemoryTaskStore, Path, dict[str, list[Transition]]]:
    """把样本目录复制到 tmp_path，并把存储弄成那次旧运行结束时的样子（归档过的行已删除）。"""
    directory = tmp_path / "old"
    shutil.copytree(FORMAT1, directory)
    store = InMemoryTaskStore()
    expected = _format1_store(store)
    for entry in json.loads((directory / "manifest.json").read_text())["segments"]:
        store.delete_archived(_receipt_of(read_segment(directory / entry["name"])))
    return store, directory, expected


def test_directory_in_the_format_before_the_journal_reads_back(tmp_path: Path) -> None:
    store, directory, expected = _as_left_by_the_old_run(tmp_path)
    assert not (directory / "manifest.jsonl").exists()
    assert store.get("done-000") is None and store.history("live-000")[0].version == 21
    assert len(load_manifest(directory)["segments"]) == 5
    assert verify_archive(directory)["transitions"] == 3 * 20 + 2 * 4
    for task_id, records in expected.items():
        assert merged_history(store, task_id, directory) == records, task_id
    view = read_task(directory, "done-001")
    assert view.snapshot is not None and view.snapshot.status is S.SUCCEEDED
    assert len(view.transitions) == 4


def test_archiving_continues_in_a_directory_of_the_old_format(tmp_path: Path) -> None:
    store, directory, expected = _as_left_by_the_old_run(tmp_path)
    later = CUTOFF + 10 * DAY
    summary = Archiver(store, directory, batch_size=7).run(later)
    assert summary.transitions == 3 * 10 and summary.reconciled_segments == 0
    names = [e["name"] for e in load_manifest(directory)["segments"]]
    assert len(names) == 5 + summary.segments and names[5].startswith("seg-000006-"), names
    assert not (directory / "manifest.jsonl").exists(), "运行结束时压实"
    verify_archive(directory)
    for task_id, records in expected.items():
        assert merged_history(store, task_id, directory) == records, task_id
        assert all(r.at >= later for r in store.history(task_id))


class _Crash(Exception):
    pass


def _crashed_in_delete(
    directory: Path, monkeypatch: pytest.MonkeyPatch, at_call: int
) -> tuple[InMemoryTaskStore, dict[str, list[Transition]]]:
    """一次在第 ``at_call`` 次 ``delete_archived`` 时"崩溃"的运行（每段 20 条）：返回存储与完整历史。"""
    store = InMemoryTaskStore()
    expected = _populate(store, live=4, done=3)
    real = store.delete_archived
    calls = {"n": 0}

    def deleting(receipt: ArchiveReceipt) -> object:
        calls["n"] += 1
        if calls["n"] == at_call:
            raise _Crash
        return real(receipt)

    monkeypatch.setattr(store, "delete_archived", deleting)
    with pytest.raises(_Crash):
        Archiver(store, directory, batch_size=20).run(CUTOFF)
    monkeypatch.undo()
    return store, expected


def test_interrupted_run_leaves_a_journal_that_readers_merge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, expected = _crashed_in_delete(tmp_path, monkeypatch, at_call=3)
    assert not (tmp_path / "manifest.json").exists() and (tmp_path / "manifest.jsonl").exists()
    states = [e["state"] for e in load_manifest(tmp_path)["segments"]]
    assert states == ["deleted", "deleted", "recorded"], "此刻清单只在日志里"
    # 前两段的行已经从在线库删掉：读者经日志找到它们
    for task_id, records in expected.items():
        assert merged_history(store, task_id, tmp_path) == records, task_id
    summary = Archiver(store, tmp_path, batch_size=20).run(CUTOFF)
    assert summary.reconciled_segments == 1
    assert not (tmp_path / "manifest.jsonl").exists()
    _assert_complete(store, tmp_path, expected)


def test_half_written_last_journal_line_is_ignored_and_its_segment_reexamined(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, expected = _crashed_in_delete(tmp_path, monkeypatch, at_call=2)
    journal = tmp_path / "manifest.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    assert len(lines) == 3  # 记入第 1 段、第 1 段已删、记入第 2 段
    # 崩溃在写"记入第 2 段"那一行的中途：只有半行落了盘
    journal.write_bytes(b"".join(lines[:2]) + lines[2][: len(lines[2]) // 2])
    assert [e["state"] for e in load_manifest(tmp_path)["segments"]] == ["deleted"]
    summary = Archiver(store, tmp_path, batch_size=20).run(CUTOFF)
    assert summary.reconciled_segments == 1, "第 2 段又成了孤儿段：按内容补记、重放删除"
    _assert_complete(store, tmp_path, expected)


def test_damaged_journal_line_in_the_middle_is_an_error(tmp_path: Path) -> None:
    store = InMemoryTaskStore()
    _populate(store, live=2, done=0)
    Archiver(store, tmp_path, batch_size=20).run(CUTOFF)
    (tmp_path / "manifest.jsonl").write_bytes(b'{"deleted": ["x"]}\nnot json\n{"deleted": []}\n')
    with pytest.raises(ArchiveError, match="第 2 行损坏"):
        load_manifest(tmp_path)


def test_fast_transition_line_is_byte_for_byte_the_generic_encoding() -> None:
    """段里迁移记录的快速编码与 ``Transition.to_dict()`` 经 JSON 编码器的结果逐字节相同。"""
    from chongming_task.core.archive import _ENCODER, _transition_line

    east8 = timezone(timedelta(hours=8))
    samples = [
        _record("t-1", 1, S.PENDING, S.QUEUED, T0),
        Transition('任务/"引号"\\反斜杠', S.RUNNING, S.PAUSED, "op:暂停", "节点\n甲", "原因\t\u2028x", 7, T0),
        Transition(
            "t-2", S.RUNNING, S.FAILED, "t", None, "r" * 300, 2**40, datetime(2026, 5, 1, 8, tzinfo=east8)
        ),
        Transition("t-3", S.QUEUED, S.RUNNING, "t", "a", None, 3, T0 + timedelta(microseconds=7)),
    ]
    for record in samples:
        line = _transition_line(record)
        assert line == _ENCODER.encode({"kind": "transition", "record": record.to_dict()})
        assert Transition.from_dict(json.loads(line)["record"]) == record
