"""多进程测试的子进程端。不是测试模块（文件名不以 test_ 开头），pytest 不收集它。

测试以 ``--import-mode=importlib`` 运行，tests/ 目录不在 sys.path 上，子进程按模块名导入不到
这个文件。所以父进程用 ``multiprocessing``（spawn）启动 ``runpy.run_path(本文件, init_globals=
{"JOB": ...}, run_name="__chongming_worker__")``：目标是标准库函数，可以按引用序列化；本文件
在子进程里按路径执行，底部按 ``JOB["role"]`` 分派。

每个角色把结果写进 ``result_path``（JSON），父进程读取并断言；任何异常都记进结果而不是吞掉。
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
import traceback
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from chongming_task.errors import ConcurrencyConflict
from chongming_task.models import Progress, Transition
from chongming_task.states import TaskStatus
from chongming_task.stores.sqlite import SqliteTaskStore


def _now() -> datetime:
    return datetime.now(UTC)


def _write(result_path: str, payload: dict[str, Any]) -> None:
    tmp = Path(result_path + ".tmp")
    tmp.write_text(json.dumps(payload, ensure_ascii=False), encoding="utf-8")
    tmp.replace(result_path)  # 原子替换：父进程不会读到半个文件


def hammer(
    db: str, name: str, task_ids: list[str], duration: float, start: Any, result_path: str, seed: int
) -> None:
    """乐观并发地反复 save（冲突就重读重试）并穿插 touch，记下自己成功写入的每个版本号。"""
    rng = random.Random(seed)
    saved: dict[str, list[int]] = {task_id: [] for task_id in task_ids}
    conflicts = 0
    phantom_conflicts = 0  # 冲突后重读发现版本其实没变：那就是假冲突，等于丢了一次写入
    touches = 0
    errors: list[str] = []
    store = SqliteTaskStore(db, busy_timeout=30)
    try:
        start.wait(60)
        deadline = time.monotonic() + duration
        while time.monotonic() < deadline:
            task_id = rng.choice(task_ids)
            if rng.random() < 0.35:
                touches += 1
                now = _now()
                found = store.touch(
                    task_id,
                    progress=Progress(done=touches, unit="touch", message=name),
                    heartbeat_at=now,
                    lease_owner=name,
                    lease_until=now + timedelta(seconds=30),
                )
                if not found:
                    errors.append(f"touch({task_id}) 说任务不存在")
                continue
            current = store.get(task_id)
            if current is None:
                errors.append(f"get({task_id}) 返回 None")
                continue
            version = current.status_version + 1
            target = TaskStatus.PAUSING if current.status is TaskStatus.RUNNING else TaskStatus.RUNNING
            record = Transition(task_id, current.status, target, "hammer", name, None, version, _now())
            try:
                store.save(
                    current.evolve(status=target, status_version=version, description=f"{name}@{version}"),
                    expect_version=version - 1,
                    transitions=[record],
                )
            except ConcurrencyConflict:
                conflicts += 1
                latest = store.get(task_id)
                if latest is None or latest.status_version < version:
                    phantom_conflicts += 1
                continue
            saved[task_id].append(version)
    except BaseException:
        errors.append(traceback.format_exc())
    finally:
        store.close()
    _write(
        result_path,
        {
            "name": name,
            "saved": saved,
            "conflicts": conflicts,
            "phantom_conflicts": phantom_conflicts,
            "touches": touches,
            "errors": errors,
        },
    )


def claim(db: str, name: str, start: Any, result_path: str, seed: int, first: Any) -> None:
    """反复认领（每次 1–5 条、长租约）并完成，直到连续几轮取不到为止。

    第一次取到之后在屏障 ``first`` 上等另一个认领者也取到：2 核机器满载时 SQLite 的忙等待不公平，先拿到
    写锁的进程可能一口气把全部指令取完，另一个一条也没碰到——那样测的就不是并发认领了。"""
    rng = random.Random(seed)
    claimed: list[dict[str, Any]] = []
    errors: list[str] = []
    store = SqliteTaskStore(db, busy_timeout=30)
    try:
        start.wait(60)
        empty_rounds = 0
        while empty_rounds < 5:
            batch = store.claim_commands(name, lease=120, limit=rng.randint(1, 5))
            if not batch:
                empty_rounds += 1
                time.sleep(0.01)
                continue
            empty_rounds = 0
            if not claimed:
                first.wait(60)
            for command in batch:
                claimed.append({"id": command.command_id, "deliveries": command.deliveries})
                if not store.complete_command(command.command_id, name):
                    errors.append(f"complete_command({command.command_id}) 返回 False")
    except BaseException:
        errors.append(traceback.format_exc())
    finally:
        store.close()
    _write(result_path, {"name": name, "claimed": claimed, "errors": errors})


def claim_then_hang(db: str, name: str, lease: float, result_path: str) -> None:
    """认领后不完成，再开一个写事务不提交，然后挂起——等父进程 SIGKILL。

    验证两件事：崩溃者手里的指令在租约到期后会被重新投递；被杀时攥着写锁的进程不会把文件锁死。
    """
    store = SqliteTaskStore(db, busy_timeout=30)
    commands = store.claim_commands(name, lease=lease)
    raw = sqlite3.connect(db, isolation_level=None)
    raw.execute("BEGIN IMMEDIATE")
    raw.execute("UPDATE tasks SET description = 'uncommitted' WHERE 1")
    _write(result_path, {"name": name, "claimed": [c.command_id for c in commands], "pid": os.getpid()})
    while True:
        time.sleep(1)


ROLES = {"hammer": hammer, "claim": claim, "claim_then_hang": claim_then_hang}

if __name__ == "__chongming_worker__":
    _job = globals()["JOB"]
    ROLES[_job["role"]](**_job["args"])
