"""bench/bench_archive.py 灌数据的那一段直接用了存储的内部语句（为了快：executemany / COPY），存储改了
内部写法它就会坏——坏了也没人知道，因为基准不进 ``make test``（SQLite 的 ``_sql.INSERT_TASK`` 没了之后它
坏了好几轮）。这里用几十个任务跑同样的灌法，再经公开 API 读回：任务与完整历史都在，和灌进去的一样。"""

from __future__ import annotations

import importlib.util
import sys
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from chongming_task import PostgresTaskStore, SqliteTaskStore, TaskStatus

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_archive.py"


@pytest.fixture
def bench_archive(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_archive_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "TASKS", 30)
    return module


def _check_filled(store: SqliteTaskStore | PostgresTaskStore, bench: ModuleType) -> None:
    tasks = store.query()
    assert sorted(t.task_id for t in tasks) == [f"task-{i:07d}" for i in range(30)]
    for i in (0, 17, 29):
        snapshot = store.get(f"task-{i:07d}")
        assert snapshot is not None
        assert snapshot.status is TaskStatus.RUNNING
        assert snapshot.status_version == bench.VERSIONS
        expected = bench._records(i, range(1, bench.VERSIONS + 1))
        assert store.history(f"task-{i:07d}") == expected


def test_the_sqlite_fill_writes_tasks_and_history_the_store_reads_back(
    bench_archive: ModuleType, tmp_path: Path
) -> None:
    path = tmp_path / "fill.db"
    bench_archive._sqlite_fill(path, range(1, bench_archive.VERSIONS + 1))
    store = SqliteTaskStore(str(path))
    try:
        _check_filled(store, bench_archive)
    finally:
        store.close()


@pytest.mark.postgres
def test_the_postgres_fill_writes_tasks_and_history_the_store_reads_back(
    bench_archive: ModuleType, postgres_dsn: str
) -> None:
    import psycopg

    schema = f"bench_fill_{uuid.uuid4().hex[:10]}"
    store = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        bench_archive._postgres_fill(postgres_dsn, store, schema)
        _check_filled(store, bench_archive)
    finally:
        store.close()
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
