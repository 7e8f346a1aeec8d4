"""13 持久任务与 worker：一个提交者、两个 worker 进程，其中一个被 kill -9，活着的那个接手它的活。

演示并断言（真实的 OS 进程，共用一个 SQLite 文件，放在临时目录里）：
* 提交者 ``enqueue()`` 只入队：任务是 queued、没有持有者，提交者自己一行任务代码也不执行；
* 两个 worker（``serve()``）原子地认领，每个任务只被一个 worker 启动；
* worker-a 被 kill -9（不 drain、不交还、不下线）：租约过期后，worker-b 接手它手上排队的任务（历史里一条
  ``cluster:adopted``，状态不变），它在跑的任务先被判 lost，配方写了 ``on_lost="retry"``，于是经审计的
  ``retry()`` 重新排队、由 worker-b 重跑（at-least-once）；
* 最后每个任务都成功，普通任务的规则（§9.5）不受影响。

运行：python examples/13_durable_workers.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from chongming_task import Controller, RetryPolicy, SqliteTaskStore, TaskContext, TaskStatus, task
from chongming_task.policies import FixedBackoff

S = TaskStatus
TASKS = 40


@task(durable=True, on_lost="retry", retry=RetryPolicy(max_attempts=2, backoff=FixedBackoff(0.0)))
def resize_image(ctx: TaskContext, image: str, width: int) -> str:
    """一个要跑一会儿的持久任务（幂等：同一张图重复缩放结果相同，重跑无害）。"""
    for _ in range(5):
        ctx.checkpoint()
        time.sleep(0.02)
    return f"{image}@{width}px"


def run_worker(db: str, owner: str) -> None:
    """worker 进程：认领并执行，直到 SIGTERM。"""
    worker = Controller(2, store=SqliteTaskStore(db), owner=owner, lease_ttl=1.0)
    worker.register_all(resize_image)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("READY", flush=True)
    worker.serve(stop, poll_interval=0.05)
    worker.close(close_store=True)


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"等待超时：{what}")
        time.sleep(0.05)


def spawn(db: str, owner: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "worker", db, owner],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    return proc


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "tasks.db")
        store = SqliteTaskStore(db)
        submitter = Controller(store=store, owner="submitter")
        submitter.register_all(resize_image)
        ids = [
            submitter.enqueue("resize_image", f"img-{i}.png", 640, bucket_key=f"img-{i}")
            for i in range(TASKS)
        ]
        assert all((s := store.get(i)) is not None and (s.status, s.owner) == (S.QUEUED, None) for i in ids)

        worker_a, worker_b = spawn(db, "worker-a"), spawn(db, "worker-b")
        wait_until(
            lambda: any(s.owner == "worker-a" and s.status is S.RUNNING for s in store.query()), "a 在跑"
        )
        worker_a.kill()  # kill -9
        worker_a.wait()
        wait_until(lambda: all(store.get(i).status is S.SUCCEEDED for i in ids), "全部成功")  # type: ignore[union-attr]

        adopted = lost = 0
        for index, task_id in enumerate(ids):
            history = store.history(task_id)
            triggers = [t.trigger for t in history]
            assert triggers.count("scheduler:dispatched") <= 2, "至多重跑一次"
            if "reconcile:lease_expired" in triggers:
                lost += 1  # 在 a 上跑着的：判 lost → control:retry → 由 b 接手重跑
                at = triggers.index("reconcile:lease_expired")
                assert triggers[at + 1 : at + 3] == ["control:retry", "cluster:adopted"], triggers
                assert history[at + 2].actor == "worker-b"
            elif "cluster:adopted" in triggers:
                adopted += 1  # 被 a 认领、还没开始的：状态不变地换给 b
                record = next(t for t in history if t.trigger == "cluster:adopted")
                assert record.from_status is record.to_status and record.actor == "worker-b"
                assert record.reason is not None and "worker-a" in record.reason
            else:
                assert triggers.count("scheduler:dispatched") == 1, "没受崩溃影响的任务恰好执行一次"
            snapshot = store.get(task_id)
            assert snapshot is not None and snapshot.outcome == f"img-{index}.png@640px"
        assert lost >= 1, "kill -9 的那一刻 worker-a 手上应当有在跑的任务"
        print(f"worker-a 被杀时在跑的 {lost} 个任务被重跑，{adopted} 个排队中的被接手；全部 {TASKS} 个成功")

        worker_b.send_signal(signal.SIGTERM)  # 干净退出：不再认领，等在跑的跑完
        assert worker_b.wait(30) == 0
        submitter.close()
        store.close()
    print("13_durable_workers: OK")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        run_worker(sys.argv[2], sys.argv[3])
    else:
        main()
