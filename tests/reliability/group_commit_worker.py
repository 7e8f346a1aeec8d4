"""组提交崩溃试验的工作节点（test_group_commit_crash.py 启动它，之后 SIGKILL）。

``python group_commit_worker.py <store url> <ack 文件> <任务数> [<第 K 批停住>]``

16 个并行的空任务不停地迁移（starting → running → succeeded，每步一次写穿），写穿经组提交合批；同时另一个
线程逐个 ``submit`` 新任务（c 开头的 id）：存储设了 ``group_commit_creates`` 时（SQLite）它们的 create 也经
组提交，与排着的 save 同一个事务（``write_many``）。每当组提交告诉一个调用方"你这一项已提交"
（``GroupCommit.save`` 正常返回；单个提交则是 ``submit`` 返回，记它的第 1 版），就往 ack 文件追加一行
``A <task_id> <version>`` 并 fsync——父进程据此核对：被告知已提交的，存储里必须有。每个事务开始写之前
追加一行 ``B <项数>``（同样 fsync），父进程据此知道被杀那一刻有没有一批正在提交。

给了 K 时，第 K 个多项批次的 ``save_many`` / ``write_many`` 提交之后、告诉调用方之前写一行 ``S <项数>``
并停住，等父进程 SIGKILL：随机时刻的杀在 2 核满载的机器上未必正好落在多项批次里，这一次试验确定地测
"已提交、还没告诉任何调用方"那一刻被杀。
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import NoReturn

from chongming_task import Controller, Submit, open_store
from chongming_task.models import TaskSnapshot
from chongming_task.runtime import group_commit
from chongming_task.storage import SaveRequest

url, ack_path, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
stall_at = int(sys.argv[4]) if len(sys.argv) > 4 else 0
multi_batches = 0
ready = threading.Event()
fd = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
lock = threading.Lock()


def note(line: str) -> None:
    with lock:
        os.write(fd, line.encode() + b"\n")
        os.fsync(fd)


original_save = group_commit.GroupCommit.save
original_commit = group_commit.GroupCommit._commit


def acked_save(self: group_commit.GroupCommit, request: SaveRequest) -> None:
    original_save(self, request)  # 抛异常 = 没有告诉调用方"已提交"
    note(f"A {request.snapshot.task_id} {request.snapshot.status_version}")


def noted_commit(self: group_commit.GroupCommit, batch: list[group_commit._Pending]) -> None:
    global multi_batches
    note(f"B {len(batch)}")
    # 只在 READY 之后停：之前停住会卡住 submit_many。create 也经组提交的存储上只数带 create 的混合批：
    # 停住的那一批里就有一个 submit 还没返回、存储里却已有的任务。
    mixed = any(item.create is not None for item in batch) or not self._store.group_commit_creates
    if len(batch) > 1 and ready.is_set() and mixed:
        multi_batches += 1
        if multi_batches == stall_at:
            store = self._store
            real_save_many, real_write_many = store.save_many, store.write_many

            def stall(members: list[str]) -> NoReturn:
                note(f"S {len(batch)} {','.join(members)}")
                while True:  # 等 SIGKILL：这一批已提交，没有一个调用方被告知
                    time.sleep(1)

            def save_then_stall(requests: list[SaveRequest]) -> object:
                results = real_save_many(requests)
                stall(committed(requests, results))

            def write_then_stall(
                creates: list[tuple[TaskSnapshot, object]], saves: list[SaveRequest]
            ) -> object:
                created, saved = real_write_many(creates, saves)  # type: ignore[arg-type]
                new = [
                    f"{s.task_id}:{s.status_version}"
                    for (s, _), e in zip(creates, created, strict=True)
                    if e is None
                ]
                stall(new + committed(saves, saved))

            store.save_many = save_then_stall  # type: ignore[method-assign,assignment]
            store.write_many = write_then_stall  # type: ignore[method-assign,assignment]
    original_commit(self, batch)


def committed(requests: list[SaveRequest], results: list[object]) -> list[str]:
    return [
        f"{r.snapshot.task_id}:{r.snapshot.status_version}"
        for r, error in zip(requests, results, strict=True)
        if error is None
    ]


group_commit.GroupCommit.save = acked_save  # type: ignore[method-assign]
group_commit.GroupCommit._commit = noted_commit  # type: ignore[method-assign]


def noop(ctx: object) -> None:
    return None


controller = Controller(max_parallel=16, store=open_store(url), owner="gc-worker")
controller.register("noop", noop)
controller.submit_many([Submit("noop", task_id=f"g{i:05d}") for i in range(count)], batch_size=200)
ready.set()
print("READY", flush=True)


def submit_singles() -> None:
    for i in range(count):
        run = controller.submit("noop", task_id=f"c{i:05d}")  # 抛异常 = 没有告诉调用方"已提交"
        note(f"A {run.task_id} 1")


singles = threading.Thread(target=submit_singles, daemon=True)
singles.start()
singles.join(300)
controller.wait_all(timeout=300)
print("DONE", flush=True)
