"""CLI archive 与 history --archive（issue 20；docs/cli.md "归档：archive"）。时间是显式的旧时间戳。"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from chongming_task.models import TaskSnapshot, Transition
from chongming_task.states import TaskStatus as S
from chongming_task.stores.sqlite import SqliteTaskStore

OLD = datetime.now(UTC) - timedelta(days=400)


def _populate(path: str) -> None:
    """一个常驻任务（400 天前起每天一条迁移，共 380 条，最后一条在 20 天前）+ 一个 380 天前结束的任务。"""
    store = SqliteTaskStore(path)
    status = S.QUEUED
    records = [Transition("long", S.PENDING, S.QUEUED, "t", None, None, 1, OLD)]
    for version in range(2, 381):
        target = S.RUNNING if status is not S.RUNNING else S.PAUSED
        records.append(
            Transition("long", status, target, "t", None, None, version, OLD + timedelta(days=version))
        )
        status = target
    store.create(TaskSnapshot("long", "long", OLD, status=status, status_version=380), records)
    done = [
        Transition("done", S.PENDING, S.QUEUED, "t", None, None, 1, OLD),
        Transition("done", S.QUEUED, S.CANCELLED, "t", None, None, 2, OLD + timedelta(days=20)),
    ]
    store.create(
        TaskSnapshot(
            "done", "done", OLD, status=S.CANCELLED, status_version=2, finished_at=OLD + timedelta(days=20)
        ),
        done,
    )
    store.close()


def test_archive_then_history_with_archive(invoke: Any, db: str, tmp_path: Path) -> None:
    _populate(db)
    archive = str(tmp_path / "archive")
    dry = invoke("--db", db, "archive", "--older-than", "90d", "--to", archive, "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert dry.stdout.startswith("将归档 ") and not Path(archive).exists()
    result = invoke("--json", "--db", db, "archive", "--older-than", "90d", "--to", archive)
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["tasks"] == 1 and summary["transitions"] > 200 and summary["segments"] >= 2
    assert result.stderr == "", "不是终端时不画进度"
    online = json.loads(invoke("--json", "--db", db, "history", "long").stdout)
    assert online[0]["version"] > 1, "在线只留窗口"
    full = json.loads(invoke("--json", "--db", db, "history", "long", "--archive", archive).stdout)
    assert [d["version"] for d in full] == list(range(1, 381))
    gone = json.loads(invoke("--json", "--db", db, "history", "done", "--archive", archive).stdout)
    assert [d["to_status"] for d in gone] == ["queued", "cancelled"], "整体归档的任务从归档里读回"
    again = invoke("--db", db, "archive", "--older-than", "90d", "--to", archive)
    assert again.exit_code == 0 and again.stdout.startswith("已归档 0 条迁移记录")


def test_archive_rejects_bad_age_and_broken_archive(invoke: Any, db: str, tmp_path: Path) -> None:
    _populate(db)
    bad = invoke("--db", db, "archive", "--older-than", "ninety", "--to", str(tmp_path / "a"))
    assert bad.exit_code == 1 and "--older-than" in bad.stderr and len(bad.stderr.splitlines()) == 1
    archive = tmp_path / "a"
    assert invoke("--db", db, "archive", "--older-than", "90d", "--to", str(archive)).exit_code == 0
    (archive / "manifest.json").write_text(json.dumps({"format": 1, "segments": []}))
    broken = invoke("--json", "--db", db, "history", "long", "--archive", str(archive))
    assert broken.exit_code == 1
    assert json.loads(broken.stderr)["error"] == "archive_error"
    missing = invoke("--db", db, "history", "long", "--archive", str(tmp_path / "nope"))
    assert missing.exit_code == 1 and "归档目录" in missing.stderr


def test_task_paused_and_resumed_10000_times_keeps_only_its_window_online(
    invoke: Any, db: str, tmp_path: Path
) -> None:
    """常驻任务暂停/恢复 10,000 次（每 10 分钟一次，迁移经存储直接写入）：archive 之后在线只留 30 天的
    窗口，``history --archive`` 给出从版本 1 起完整的 10,001 条。"""
    start = datetime.now(UTC) - timedelta(minutes=10 * 10_001)
    records = [Transition("forever", S.PENDING, S.QUEUED, "t", None, None, 1, start)]
    status = S.QUEUED
    for version in range(2, 10_002):
        target = S.PAUSED if status is S.RUNNING else S.RUNNING
        at = start + timedelta(minutes=10 * (version - 1))
        records.append(Transition("forever", status, target, "t", None, None, version, at))
        status = target
    store = SqliteTaskStore(db)
    store.create(TaskSnapshot("forever", "forever", start, status=status, status_version=10_001), records)
    store.close()
    archive = str(tmp_path / "archive")
    result = invoke("--json", "--db", db, "archive", "--older-than", "30d", "--to", archive)
    assert result.exit_code == 0, result.stderr
    cutoff = datetime.now(UTC) - timedelta(days=30)
    expected_online = [r for r in records if r.at >= cutoff]
    assert json.loads(result.stdout)["transitions"] == 10_001 - len(expected_online)
    online = json.loads(invoke("--json", "--db", db, "history", "forever").stdout)
    assert len(online) == len(expected_online) and 4_000 < len(online) < 4_400, "在线只留 30 天"
    assert online[0]["version"] == expected_online[0].version
    full = json.loads(invoke("--json", "--db", db, "history", "forever", "--archive", archive).stdout)
    assert [d["version"] for d in full] == list(range(1, 10_002))
    assert full[-1] == records[-1].to_dict() and full[0] == records[0].to_dict()


def test_history_reads_an_archive_written_before_the_manifest_journal(
    invoke: Any, db: str, tmp_path: Path
) -> None:
    """清单日志出现之前的归档目录（只有 indent=1 的 manifest.json，见 tests/integration/data/archive-format1）
    照样能被 history --archive 读回：整体归档的终态任务只在归档里。"""
    import shutil

    fixture = Path(__file__).resolve().parents[3] / "tests" / "integration" / "data" / "archive-format1"
    archive = tmp_path / "old"
    shutil.copytree(fixture, archive)
    SqliteTaskStore(db).close()  # 空库：这个任务在线上早就没有了
    result = invoke("--json", "--db", db, "history", "done-001", "--archive", str(archive))
    assert result.exit_code == 0, result.stderr
    records = json.loads(result.stdout)
    assert [d["version"] for d in records] == [1, 2, 3, 4]
    assert records[-1]["to_status"] == "succeeded"
    assert not (archive / "manifest.jsonl").exists(), "读不写"
