"""08 持久化与跨进程控制（SQLite）：一个进程跑任务，另一个进程看、暂停、恢复、停止；
进程被 kill -9 之后如何如实恢复。

两个真实的 OS 进程共用一个 SQLite 文件（写在临时目录里）：

* 工作进程（本脚本以 ``worker`` 参数运行）：Controller(store=SqliteTaskStore(文件), owner="worker-1")，
  提交一个常驻任务，直到它落终态才退出；
* 控制台进程（本脚本的主进程）：Controller(store=同一个文件, owner="ops-console")，它不持有任务，
  list_tasks / get 看得到别人的任务；pause / resume / stop 写成指令，由持有者取走执行。

演示并断言：
* 跨进程的 pause() 返回 False（没有回执通道 = 未确认），要靠轮询 get() 观察结果；
* stop() / resume() 返回 True 表示"请求已受理"；
* 迁移历史里记着是谁按的停止（actor = 控制台的 owner）；
* 工作进程被 kill -9：租约未过期前 reconcile 不动它；租约过期后它被判 lost（不是"还在跑"，也不会被
  重新执行）；
* 存储里的结果在进程退出后仍然可读。

运行：python examples/08_persistence_sqlite.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from chongming_task import Controller, FailureKind, SqliteTaskStore, TaskContext, TaskStatus, render_table

S = TaskStatus


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "条件") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}在 {timeout} 秒内没有成立")
        time.sleep(0.02)


def sync_orders(ctx: TaskContext, source: str) -> int:
    """常驻同步：每轮 checkpoint，报进度。收到停止请求时在 checkpoint() 里抛 TaskCancelled → stopped。"""
    batches = 0
    while True:
        ctx.checkpoint()
        batches += 1
        ctx.progress(batches, unit="batch")
        time.sleep(0.02)


def worker(db: str, task_id: str, lease_ttl: float) -> None:
    """工作进程：提交一个任务，等它落终态后收尾退出。"""
    controller = Controller(store=SqliteTaskStore(db), owner="worker-1", max_parallel=2, lease_ttl=lease_ttl)
    controller.register("sync_orders", sync_orders)
    controller.submit("sync_orders", "kafka://orders", task_id=task_id, bucket_key="tenant-A")
    outcome = controller.wait(task_id)
    assert not controller.persist_failures, controller.persist_failures
    controller.close(close_store=True)
    print(f"[worker] {task_id} -> {outcome.status.value}", flush=True)


def status_of(console: Controller, task_id: str) -> TaskStatus | None:
    snap = console.get(task_id)
    return None if snap is None else snap.status


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "tasks.db")
        console = Controller(store=SqliteTaskStore(db), owner="ops-console")

        # -- 1) 另一个进程里的任务：看得到、管得了 -----------------------------------------------------
        proc = subprocess.Popen([sys.executable, __file__, "worker", db, "job-1", "30"])
        try:
            wait_until(lambda: status_of(console, "job-1") is S.RUNNING, what="job-1 进入 running")
            snap = console.get("job-1")
            assert snap is not None and snap.owner == "worker-1" and snap.lease_owner == "worker-1"
            print(render_table(console.list_tasks()))

            assert console.pause("job-1", timeout=5) is False  # 跨进程：未确认，不是失败
            wait_until(lambda: status_of(console, "job-1") is S.PAUSED, what="job-1 被暂停")
            assert console.resume("job-1") is True  # 请求已受理
            wait_until(lambda: status_of(console, "job-1") is S.RUNNING, what="job-1 恢复")
            assert console.stop("job-1", reason="运维停止") is True
            outcome = console.wait("job-1", timeout=10)  # 不持有的任务：轮询存储直到终态
            assert outcome.status is S.STOPPED
            assert proc.wait(timeout=15) == 0
        finally:
            if proc.poll() is None:
                proc.kill()

        history = SqliteTaskStore(db)
        records = history.history("job-1")
        for record in records:
            print(f"  v{record.version} {record.from_status} -> {record.to_status}  by {record.actor or '-'}")
        path = [r.to_status.value for r in records]
        assert path == [
            "queued",
            "starting",
            "running",
            "pausing",
            "paused",
            "running",
            "stopping",
            "stopped",
        ]
        stopping = next(r for r in records if r.to_status is S.STOPPING)
        assert stopping.actor == "ops-console" and stopping.reason == "运维停止"
        history.close()

        # -- 2) kill -9：租约过期之后 reconcile 如实判 lost -------------------------------------------
        proc = subprocess.Popen([sys.executable, __file__, "worker", db, "job-2", "1"])
        try:
            wait_until(lambda: status_of(console, "job-2") is S.RUNNING, what="job-2 进入 running")
        finally:
            proc.kill()  # SIGKILL：finally、atexit 都来不及跑
            proc.wait(timeout=10)
        assert status_of(console, "job-2") is S.RUNNING  # 存储里它"看着像在跑"

        recovery = Controller(store=SqliteTaskStore(db), owner="worker-2")
        report = recovery.reconcile(dry_run=True)  # 先看一眼，不写任何状态
        print("kill 之后立刻 dry_run：lost =", [s.task_id for s in report.lost])
        wait_until(
            lambda: any(s.task_id == "job-2" for s in recovery.reconcile(dry_run=True).lost),
            timeout=10,
            what="job-2 的租约过期",
        )
        report = recovery.reconcile()
        assert [s.task_id for s in report.lost] == ["job-2"]
        snap = console.get("job-2")
        assert snap is not None and snap.status is S.LOST
        assert snap.failure is not None and snap.failure.kind is FailureKind.LOST and snap.failure.retryable
        print("job-2:", snap.status.value, "|", snap.failure.message)
        assert recovery.reconcile().total == 0  # 幂等：再跑一次什么都不做

        recovery.close(close_store=True)
        console.close(close_store=True)
    print("08_persistence_sqlite: OK")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3], float(sys.argv[4]))
    else:
        main()
