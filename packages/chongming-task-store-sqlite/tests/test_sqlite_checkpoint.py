"""WAL 检查点在后台线程上做（``_checkpoint``）：提交的线程不做检查点，WAL 仍然有界，数据照样拷回主文件。"""

from __future__ import annotations

import gc
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from chongming_task.models import TaskSnapshot, Transition
from chongming_task.states import TaskStatus
from chongming_task.stores.sqlite import SqliteTaskStore

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
S = TaskStatus
PAGE = 4096

# 朴素做法（只在后台做 PASSIVE、从不占写者队列）在下面的负载里把 WAL 撑到 90 MB 以上，而且随任务数线性
# 增长；默认的自动检查点在 4 MB 左右。界取得宽（2 核机器重负载时一次 fsync 可能要几十毫秒，期间 WAL 照长）。
WAL_BOUND = 16_000 * PAGE


def _checkpoint_threads(db: Path | None = None) -> list[threading.Thread]:
    """后台检查点线程（``db``：只要这个文件的那条；同一进程里别的测试没关的存储各有各的）。"""
    prefix = "chongming-sqlite-checkpoint[" if db is None else f"chongming-sqlite-checkpoint[{db}]"
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


def _run_tasks(store: SqliteTaskStore, prefix: str, count: int, wal: Path, sizes: list[int]) -> None:
    """像 Controller 一样写：create（queued）→ starting → running → succeeded，每次一个写事务。"""
    steps = ((S.QUEUED, S.STARTING), (S.STARTING, S.RUNNING), (S.RUNNING, S.SUCCEEDED))
    for index in range(count):
        task_id = f"{prefix}-{index}"
        snapshot = TaskSnapshot(task_id=task_id, name="job", created_at=T0, status=S.QUEUED, status_version=1)
        store.create(snapshot, [Transition(task_id, S.PENDING, S.QUEUED, "submit", None, None, 1, T0)])
        for old, new in steps:
            version = snapshot.status_version + 1
            snapshot = TaskSnapshot(
                task_id=task_id, name="job", created_at=T0, status=new, status_version=version
            )
            record = Transition(task_id, old, new, "bench", None, None, version, T0)
            store.save(snapshot, expect_version=version - 1, transitions=[record])
        if index % 50 == 0 and wal.exists():
            sizes.append(wal.stat().st_size)


def test_commits_leave_checkpoints_to_a_background_thread_and_the_wal_stays_bounded(tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    wal = tmp_path / "tasks.db-wal"
    store = SqliteTaskStore(db)
    try:
        autocheckpoint = store._run(
            "probe", lambda c: c.execute("PRAGMA wal_autocheckpoint").fetchone()[0], "none"
        )
        assert autocheckpoint == 0  # 提交的线程不做检查点
        initial = db.stat().st_size
        sizes: list[int] = []
        writers = [
            threading.Thread(target=_run_tasks, args=(store, f"w{i}", 1_500, wal, sizes)) for i in range(2)
        ]
        for writer in writers:
            writer.start()
        for writer in writers:
            writer.join(timeout=300)
        assert not any(writer.is_alive() for writer in writers)
        threads = _checkpoint_threads(db)
        assert len(threads) == 1 and threads[0].daemon  # 解释器随时可以退出
        assert max(sizes) <= WAL_BOUND, f"WAL 涨到了 {max(sizes) / 1e6:.1f} MB"
        # 检查点真的做了：主文件在存储还开着的时候就长大了（没有检查点时新页全在 WAL 里）。
        deadline = time.monotonic() + 30
        while db.stat().st_size <= initial and time.monotonic() < deadline:
            time.sleep(0.05)
        assert db.stat().st_size > initial
        assert len(store.history("w1-1499")) == 4
    finally:
        store.close()
    assert not any(t.is_alive() for t in threads)  # close() 停掉后台线程
    # 别的程序（默认开着自动检查点）照常读到全部数据。
    raw = sqlite3.connect(db)
    try:
        assert raw.execute("SELECT count(*) FROM tasks WHERE status = 'succeeded'").fetchone()[0] == 3_000
    finally:
        raw.close()


def test_a_store_that_was_never_closed_is_collected_and_its_thread_exits(tmp_path: Path) -> None:
    db = tmp_path / "forgotten.db"
    store = SqliteTaskStore(db)
    for index in range(400):  # 够多的写事务，让后台线程起来
        store.create(TaskSnapshot(task_id=f"f{index}", name="job", created_at=T0))
    deadline = time.monotonic() + 30
    while not _checkpoint_threads(db) and time.monotonic() < deadline:
        time.sleep(0.02)
    threads = _checkpoint_threads(db)
    assert len(threads) == 1
    gone = threading.Event()
    weakref.finalize(store, gone.set)
    del store
    # 线程可能正在做一次检查点（那一刻它经弱引用取到了存储）：做完就放手，所以多收几次。
    deadline = time.monotonic() + 10
    while not gone.is_set() and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.02)
    assert gone.is_set(), "后台检查点线程不该让忘了关的存储一直活着"
    threads[0].join(10)
    assert not threads[0].is_alive()


def test_memory_and_readonly_stores_start_no_checkpoint_thread(tmp_path: Path) -> None:
    before = set(_checkpoint_threads())
    with SqliteTaskStore(":memory:") as memory:
        for index in range(300):
            memory.create(TaskSnapshot(task_id=f"m{index}", name="job", created_at=T0))
    db = tmp_path / "tasks.db"
    SqliteTaskStore(db).close()
    with SqliteTaskStore(db, readonly=True) as readonly:
        assert readonly.get("missing") is None
    assert set(_checkpoint_threads()) == before
    assert os.path.exists(db)


def test_a_forced_checkpoint_catches_up_without_the_writer_queue_first() -> None:
    """WAL 超过 FORCE_FRAMES 时，占写者队列的那一次之前先不占队列地追几遍，直到某一遍只拷了几十页：
    占队列时只剩那一遍期间追加的页（bench/README.md 第十七轮 sq17）。只在拷得比写得快时追（每一遍拷的页
    不到上一遍的一半），否则照原来的做法直接占队列——追下去 WAL 只会更长。占队列的那一次照样恰好一次。"""
    from chongming_task.stores.sqlite import _checkpoint as ck

    logs: Iterator[int] = iter(())
    calls: list[tuple[bool, int]] = []

    def checkpoint(exclusive: bool) -> tuple[int, int, int]:
        log = calls[-1][1] if exclusive else next(logs)
        calls.append((exclusive, log))
        return (0, log, log)

    def kinds() -> list[bool]:
        return [exclusive for exclusive, _ in calls]

    # 每一遍 PASSIVE 返回它开始那一刻的 WAL 页数：第一遍 2,400 页，之后每遍期间追加的越来越少。
    logs = iter([2_400, 2_900, 3_050, 3_090, 3_100])
    checkpointer = ck.BackgroundCheckpointer(checkpoint, "test")
    assert checkpointer._checkpoint_once() == 2_400
    # 2,400 → 2,900（+500）→ 3,050（+150）→ 3,090（+40 ≤ CATCH_UP_LEFT，停）→ 占队列拷完
    assert calls == [(False, 2_400), (False, 2_900), (False, 3_050), (False, 3_090), (True, 3_090)]
    assert checkpointer._last_log == 0  # 占队列拷完之后，下一轮从 0 数起（与原来相同）

    # 没有减半（写得比拷得快）：不再追，占队列拷完。WAL 不因为追而一直变长。
    calls.clear()
    logs = iter([2_500 + 400 * i for i in range(10)])
    assert ck.BackgroundCheckpointer(checkpoint, "test")._checkpoint_once() == 2_500
    assert kinds() == [False, False, False, True]  # +400（不到 2,500 的一半，接着追）、+400（没减半，停）

    # 第一遍期间的写事务估计追加了不少于它拷的一半（200 次 × 每次 10 页 × 2 > 2,400）：一遍也不追。
    calls.clear()
    logs = iter([2_400, 2_900])
    slow = ck.BackgroundCheckpointer(checkpoint, "test")
    slow._commits = 200  # _loop 在第一遍之前清零，第一遍期间照常由 committed() 数上来
    assert slow._checkpoint_once() == 2_400
    assert calls == [(False, 2_400), (True, 2_400)]

    # 追的某一遍没做成（-1：别的连接正在做检查点）：不再追，直接占队列。
    calls.clear()

    def busy(exclusive: bool) -> tuple[int, int, int]:
        calls.append((exclusive, 0))
        if exclusive:
            return (0, 10, 10)
        return (0, 2_500, 2_500) if len(calls) == 1 else (1, -1, -1)

    assert ck.BackgroundCheckpointer(busy, "test")._checkpoint_once() == 2_500
    assert kinds() == [False, False, True]

    # 没超过 FORCE_FRAMES：一遍 PASSIVE 就完，不追也不占队列（与原来相同）。
    calls.clear()
    logs = iter([1_200])
    assert ck.BackgroundCheckpointer(checkpoint, "test")._checkpoint_once() == 1_200
    assert calls == [(False, 1_200)]
