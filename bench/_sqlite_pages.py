"""SQLite 一行每次提交写几页、写在哪棵 b 树上，以及每任务的 CPU（bench/README.md 第十六轮 sq16 一节的测法；
不是 make bench 直接运行的基准）。

``pages``：与 ``bench_sqlite.ours()`` 同一写法（Controller(max_parallel=2) + SqliteTaskStore，
逐个 submit 空任务，wait_all），但关掉后台检查点，于是每次提交写的每一帧都留在 WAL 里。跑完、关库之前把
库文件与 WAL 拷一份：逐帧读 WAL 的帧头（页号；"提交后库的页数"非零的帧是一次提交的最后一帧），再在
拷贝上用 ``dbstat`` 把页号对到 b 树。按 b 树分的数只作参考：页号按**跑完时**的归属记，跑的过程中被释放、
又被别的 b 树重新用上的页（排队区滑动时状态索引释放的页）会记到后来的主人头上，指针映射页等不属于任何
b 树的页记为 ``(其他)``。可靠的是总帧数（每任务多少帧）。

``cpu``：同一写法、检查点照常，打印每任务的进程 CPU（其中内核态）、上下文切换与墙钟速率。

``sim``：不经 Controller，单线程把一串合成的迁移记录写进只有一张表的新库（每任务 4 条：创建时 1 条，
``--lag`` 个任务之后再 3 条，每轮一个事务），比较几种表结构每任务写几帧——用来看清 b 树本身的代价
（索引型 b 树在右边缘追加也要三页重分，rowid 表追加走 ``balance_quick``）。

``commit-cost``：一个写事务改 0 / 1 / 2 / 4 / 8 / 16 页时本线程的 CPU（每档 N 个事务、三遍取最小）：
一帧值多少 CPU。

变体（``--variant``，可以给多个；都在新库建好之后、Controller 打开之前用普通 SQL 改表结构，产品代码不动，
只用来量"去掉 / 换掉某个结构能省几帧"，不是可以上线的表结构）：

* ``status-none``：删掉 tasks_by_status；``status-nosucc``：它只收 status <> 'succeeded' 的行；
  ``status-split``：拆成非终态、终态两个部分索引；
* ``history-skip``：迁移记录一条也不写（触发器 RAISE(IGNORE)）；``history-rowid``：迁移记录改成 rowid 表
  （按写入先后追加）+ (task_id, version) 唯一索引；``history-lanes``：主键 (lane, task_id, version)，
  lane = version > 1（创建时写的第 1 条与之后的记录各有一个右边缘），经视图与 INSTEAD OF 触发器写入；
* ``tasks-slack=N``：tasks 加一列 N 字节的预留（默认值），每次 save 把它清成 NULL——给行的增长留出位置。

对照两份代码时用各自 venv 的 python 运行同一份脚本（脚本只 import ``chongming_task``）：
    .venv/bin/python bench/_sqlite_pages.py pages 3000 /dev/shm
    .venv/bin/python bench/_sqlite_pages.py pages 3000 /dev/shm --variant status-nosucc
    /tmp/base/.venv/bin/python bench/_sqlite_pages.py cpu 4000 /tmp
    .venv/bin/python bench/_sqlite_pages.py sim 3000 /dev/shm
    .venv/bin/python bench/_sqlite_pages.py commit-cost 2000 /tmp
"""

from __future__ import annotations

import collections
import functools
import os
import resource
import shutil
import sqlite3
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chongming_task import Controller, SqliteTaskStore

_TERMINAL = "('cancelled', 'failed', 'lost', 'skipped', 'stopped', 'succeeded')"
_STATUS_INDEX = "INDEX tasks_by_status ON tasks (status, created_key, task_id)"
_TRANSITION_COLUMNS = (
    "task_id TEXT NOT NULL, version INTEGER NOT NULL, from_status TEXT NOT NULL, to_status TEXT NOT NULL, "
    "trigger TEXT NOT NULL, actor TEXT, reason TEXT, at TEXT NOT NULL"
)
VARIANTS: dict[str, tuple[str, ...]] = {
    "status-none": ("DROP INDEX tasks_by_status",),
    "status-nosucc": (
        "DROP INDEX tasks_by_status",
        f"CREATE {_STATUS_INDEX} WHERE status <> 'succeeded'",
    ),
    "status-split": (
        "DROP INDEX tasks_by_status",
        f"CREATE {_STATUS_INDEX} WHERE status NOT IN {_TERMINAL}",
        f"CREATE INDEX tasks_finished ON tasks (status, created_key, task_id) WHERE status IN {_TERMINAL}",
    ),
    "history-skip": (
        "CREATE TRIGGER history_skip BEFORE INSERT ON transitions BEGIN SELECT RAISE(IGNORE); END",
    ),
    "history-rowid": (
        "DROP TABLE transitions",
        f"CREATE TABLE transitions ({_TRANSITION_COLUMNS})",
        "CREATE UNIQUE INDEX transitions_by_task ON transitions (task_id, version)",
    ),
    "history-lanes": (
        "DROP TABLE transitions",
        (
            f"CREATE TABLE transitions_lanes (lane INTEGER NOT NULL, {_TRANSITION_COLUMNS}, "
            "PRIMARY KEY (lane, task_id, version)) WITHOUT ROWID"
        ),
        (
            "CREATE VIEW transitions AS SELECT task_id, version, from_status, to_status, trigger, actor, "
            "reason, at FROM transitions_lanes"
        ),
        (
            "CREATE TRIGGER transitions_lanes_insert INSTEAD OF INSERT ON transitions BEGIN "
            "INSERT OR IGNORE INTO transitions_lanes VALUES (NEW.version > 1, NEW.task_id, NEW.version, "
            "NEW.from_status, NEW.to_status, NEW.trigger, NEW.actor, NEW.reason, NEW.at); END"
        ),
    ),
}


def noop(ctx: Any) -> None:
    return None


def switches() -> int:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


def system_seconds() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def wal_frames(wal: bytes) -> tuple[list[list[int]], int]:
    """WAL → (每次提交写的页号（按帧的先后）, 帧数)。只认第一代帧（盐值与文件头相同的）：检查点关掉时 WAL 不会
    从头重写。"""
    page_size = struct.unpack(">I", wal[8:12])[0]
    salts = wal[16:24]
    commits: list[list[int]] = []
    current: list[int] = []
    offset = 32
    frames = 0
    while offset + 24 + page_size <= len(wal):
        page, size_after = struct.unpack(">II", wal[offset : offset + 8])
        if wal[offset + 8 : offset + 16] != salts:
            break
        frames += 1
        current.append(page)
        if size_after:
            commits.append(current)
            current = []
        offset += 24 + page_size
    return commits, frames


def page_owners(db: Path, wal: Path) -> dict[int, str]:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "copy.db"
        shutil.copyfile(db, copy)
        shutil.copyfile(wal, Path(f"{copy}-wal"))
        conn = sqlite3.connect(copy)
        try:
            return {int(page): str(name) for name, page in conn.execute("SELECT name, pageno FROM dbstat")}
        finally:
            conn.close()


def _with_slack(builder: Callable[..., str]) -> Callable[..., str]:
    @functools.wraps(builder)
    def build(*args: Any) -> str:
        return builder(*args).replace("UPDATE tasks SET ", "UPDATE tasks SET slack = NULL, ", 1)

    return build


def apply_variants(path: Path, variants: list[str]) -> None:
    """在刚建好的空库上改表结构（见模块说明）。"""
    statements: list[str] = []
    for variant in variants:
        if variant.startswith("tasks-slack="):
            size = int(variant.split("=", 1)[1])
            statements.append(f"ALTER TABLE tasks ADD COLUMN slack BLOB DEFAULT x'{'00' * size}'")
            from chongming_task.stores.sqlite import _sql

            # 只为量帧数：save 的两种 UPDATE 都顺手把预留清掉（save_update / guarded_save_update
            # 按模块属性的名字取这两个函数）。
            _sql._save_update_sql = _with_slack(_sql._save_update_sql)  # type: ignore[assignment]
            _sql._guarded_update_sql = _with_slack(_sql._guarded_update_sql)  # type: ignore[assignment]
        else:
            statements.extend(VARIANTS[variant])
    if not statements:
        return
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        for statement in statements:
            conn.execute(statement)
        conn.execute("COMMIT")
    finally:
        conn.close()


def run(
    n: int, workdir: Path, variants: list[str], *, keep_frames: bool
) -> tuple[float, float, float, float, Path]:
    if keep_frames:
        from chongming_task.stores.sqlite import _checkpoint

        _checkpoint.BackgroundCheckpointer.committed = lambda self: None  # type: ignore[method-assign]
    path = workdir / f"pages_{os.getpid()}.db"
    SqliteTaskStore(str(path)).close()
    apply_variants(path, variants)
    store = SqliteTaskStore(str(path))
    controller = Controller(max_parallel=2, store=store)
    controller.register("noop", noop)
    cs0, sys0, cpu0, wall0 = switches(), system_seconds(), time.process_time(), time.perf_counter()
    for _ in range(n):
        controller.submit("noop")
    controller.wait_all(timeout=900)
    wall1, cpu1, sys1, cs1 = time.perf_counter(), time.process_time(), system_seconds(), switches()
    snapshot = workdir / f"pages_{os.getpid()}_copy"
    if keep_frames:
        snapshot.mkdir()
        shutil.copyfile(path, snapshot / "db")
        shutil.copyfile(f"{path}-wal", snapshot / "wal")
    controller.close(close_store=True)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return (cpu1 - cpu0) / n, (sys1 - sys0) / n, (cs1 - cs0) / n, n / (wall1 - wall0), snapshot


# -- sim: 一张表、合成的写入流 -------------------------------------------------------------------------

_SIM_AT = "2026-12-07T04:39:59.110852+00:00"


def _full_row(task: str, version: int) -> tuple[Any, ...]:
    """一条完整的迁移记录（八列，与 transitions 表相同）。"""
    return (task, version, "queued", "starting", "scheduler:dispatched", None, None, _SIM_AT)


_SIM_LAYOUTS: dict[str, tuple[tuple[str, ...], str, Callable[[str, int], tuple[Any, ...]]]] = {
    # 现在的迁移记录表：索引型 b 树，主键 (task_id, version)。
    "without-rowid": (
        (f"CREATE TABLE t ({_TRANSITION_COLUMNS}, PRIMARY KEY (task_id, version)) WITHOUT ROWID",),
        "INSERT OR IGNORE INTO t VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        _full_row,
    ),
    # 同上，但行只有三列（task_id、version、整数时刻）：行的大小对拆页的影响。
    "without-rowid-narrow": (
        (
            (
                "CREATE TABLE t (task_id TEXT, version INTEGER, at INTEGER, PRIMARY KEY (task_id, version))"
                " WITHOUT ROWID"
            ),
        ),
        "INSERT OR IGNORE INTO t VALUES (?, ?, ?)",
        lambda task, version: (task, version, 1_796_000_000_000_000 + version),
    ),
    # 按写入先后追加的 rowid 表 + 按任务查的唯一索引。
    "rowid+index": (
        (
            f"CREATE TABLE t ({_TRANSITION_COLUMNS})",
            "CREATE UNIQUE INDEX t_by_task ON t (task_id, version)",
        ),
        "INSERT OR IGNORE INTO t VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        _full_row,
    ),
    # 只有 rowid 表（没有任何按任务查的办法）：下限。
    "rowid-only": (
        (f"CREATE TABLE t ({_TRANSITION_COLUMNS})",),
        "INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        _full_row,
    ),
}


def simulate(layout: str, n: int, lag: int, workdir: Path) -> float:
    """每任务写几帧：第 i 轮一个事务，写任务 i 的第 1 条与任务 i - lag 的第 2–4 条（与 ours() 里创建在前、
    执行落后队列长度那么多个任务的形状相同；ours() 里实测落后 p50 约 370 个）。"""
    ddl, insert, row = _SIM_LAYOUTS[layout]
    path = workdir / f"sim_{os.getpid()}.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA page_size = 2048")  # 与新文件相同（_schema.NEW_FILE_PAGE_SIZE、auto_vacuum）
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        for statement in ddl:
            conn.execute(statement)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        for i in range(n + lag):
            conn.execute("BEGIN IMMEDIATE")
            if i < n:
                conn.execute(insert, row(f"noop-9e10fb{i:06d}", 1))
            if 0 <= i - lag < n:
                for version in (2, 3, 4):
                    conn.execute(insert, row(f"noop-9e10fb{i - lag:06d}", version))
            conn.execute("COMMIT")
        _, frames = wal_frames(Path(f"{path}-wal").read_bytes())
    finally:
        conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    return frames / n


def commit_cost(workdir: Path, transactions: int) -> dict[int, list[float]]:
    """一个写事务改 k 页（k 张各只有一行的表各 UPDATE 一次，每张表的根页就是它唯一的叶子）时本线程的 CPU：
    截距是一次写事务的固定代价，斜率是每多写一帧（含那条 UPDATE）的代价。设置与新文件相同
    （2048 字节的页、WAL、synchronous=NORMAL、关自动检查点）；每档之间 TRUNCATE 检查点，WAL 从头写。"""
    path = workdir / f"commit_cost_{os.getpid()}.db"
    conn = sqlite3.connect(path, isolation_level=None)
    costs: dict[int, list[float]] = {}
    try:
        conn.execute("PRAGMA page_size = 2048")
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA wal_autocheckpoint = 0")
        for table in range(16):
            conn.execute(f"CREATE TABLE t{table} (x INTEGER)")
            conn.execute(f"INSERT INTO t{table} VALUES (0)")
        for _ in range(3):
            for pages in (0, 1, 2, 4, 8, 16):
                updates = [f"UPDATE t{table} SET x = x + 1" for table in range(pages)]
                started = time.thread_time()
                for _ in range(transactions):
                    conn.execute("BEGIN IMMEDIATE")
                    for update in updates:
                        conn.execute(update)
                    conn.execute("COMMIT")
                costs.setdefault(pages, []).append((time.thread_time() - started) / transactions)
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
    return costs


def main() -> int:
    args = sys.argv[1:]
    variants: list[str] = []
    while "--variant" in args:
        at = args.index("--variant")
        variants.append(args[at + 1])
        del args[at : at + 2]
    mode, n = args[0], int(args[1])
    workdir = Path(args[2]) if len(args) > 2 else Path(tempfile.gettempdir())
    if mode == "commit-cost":
        for pages, samples in commit_cost(workdir, n).items():
            shown = " / ".join(f"{sample * 1e6:.1f}" for sample in samples)
            print(f"一个写事务改 {pages:>2} 页：{min(samples) * 1e6:6.1f} µs（三遍 {shown}）")
        return 0
    if mode == "sim":
        for layout in _SIM_LAYOUTS:
            cells = [f"落后 {lag}：{simulate(layout, n, lag, workdir):.2f}" for lag in (0, 20, 370)]
            print(f"{layout:<22} 每任务帧数  {'  '.join(cells)}")
        return 0
    load = os.getloadavg()[0]
    cpu, system, cs, rate, snapshot = run(n, workdir, variants, keep_frames=mode == "pages")
    print(
        f"{mode}{' ' + '+'.join(variants) if variants else ''}：{n} 个任务，每任务 CPU {cpu * 1e6:.0f} µs"
        f"（其中内核 {system * 1e6:.0f} µs），上下文切换 {cs:.2f} 次，墙钟 {rate:,.0f} 任务/秒"
        f"（开始时负载 {load:.2f}）"
    )
    if mode != "pages":
        return 0
    try:
        commits, total = wal_frames((snapshot / "wal").read_bytes())
        owners = page_owners(snapshot / "db", snapshot / "wal")
    finally:
        shutil.rmtree(snapshot, ignore_errors=True)
    window = commits[len(commits) // 2 :]
    frames = sum(len(c) for c in window)
    per_tree: collections.Counter[str] = collections.Counter()
    for commit in window:
        for page in commit:
            per_tree[owners.get(page, "(其他)") if page != 1 else "(第 1 页)"] += 1
    print(
        f"  提交 {len(commits)} 次（每任务 {len(commits) / n:.2f} 次），WAL 共 {total} 帧"
        f"（每任务 {total / n:.2f} 帧）；后一半 {len(window)} 次提交每次 {frames / len(window):.2f} 帧"
    )
    for name, count in per_tree.most_common():
        print(f"    {name:<28} {count / len(window):5.2f} 帧/提交")
    return 0


if __name__ == "__main__":
    sys.exit(main())
