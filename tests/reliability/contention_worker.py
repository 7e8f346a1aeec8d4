"""争用测试的一个进程：N 条线程对同一个存储混合地 create / save / touch / query / 指令读写。

用法：python contention_worker.py <store-url> <proc-index> <seconds> <threads> <shared-ids> <out.json>

* 自有任务：每条线程自己创建、自己推进（pending → queued → starting → running ⇄ pausing → succeeded）。
  只有它写，所以任何 ConcurrencyConflict 都说明存储丢了或错配了一次更新。
* 共享任务：所有进程的所有线程一起"读-改-写"（queued ⇄ paused），带 expect_version。成功一次
  记一次；最后存储里的版本必须正好等于初始版本 + 所有成功次数之和（丢一次更新就对不上）。
* touch：随机任务的进度与租约；不许动版本号（共享任务的计数会因此对不上）。
* 指令：随机给共享任务写指令；各线程以长租约认领并完成——每条指令恰好被认领一次。

任何异常（尤其是 "database is locked"）都记下来写进结果文件，由测试进程判定失败。
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
import traceback
from datetime import UTC, datetime, timedelta
from typing import Any

from chongming_task import ConcurrencyConflict, Progress, StateMachine, TaskQuery, TaskStatus, open_store
from chongming_task.storage import TaskStore

S = TaskStatus


def advance(machine: StateMachine) -> None:
    """自有任务的下一步：走一条覆盖暂停往返的生命周期，最后成功。"""
    status = machine.status
    if status is S.PENDING:
        machine.mark_queued()
    elif status is S.QUEUED:
        machine.mark_starting(executor="thread")
    elif status is S.STARTING:
        machine.mark_running(pid=1)
    elif status is S.RUNNING:
        if machine.snapshot.status_version < 8:
            machine.mark_pausing()
        else:
            machine.mark_succeeded(outcome={"version": machine.snapshot.status_version, "text": "完成'%_\\"})
    elif status is S.PAUSING:
        machine.abort_pause()


def worker(
    store: TaskStore,
    proc: int,
    thread: int,
    deadline: float,
    shared: list[str],
    result: dict[str, Any],
) -> None:
    rng = random.Random(proc * 100 + thread)
    own: dict[str, StateMachine] = {}
    shared_ok: dict[str, int] = dict.fromkeys(shared, 0)
    conflicts = 0
    latencies: dict[str, list[float]] = {}
    errors: list[str] = []
    commands_submitted: list[str] = []
    commands_claimed: list[str] = []
    reads = 0
    claimant = f"p{proc}t{thread}"
    counter = 0

    def timed(op: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            latencies.setdefault(op, []).append(round(time.perf_counter() - started, 6))

    while time.monotonic() < deadline:
        roll = rng.random()
        try:
            if roll < 0.12 or not own:
                counter += 1
                machine = StateMachine.create(
                    f"own-{proc}-{thread}-{counter:05d}",
                    "争用'; DROP TABLE tasks;--",
                    tags={"contention", f"p{proc}"},
                    bucket=rng.randrange(8),
                )
                timed("create", store.create, machine.snapshot, machine.transitions)
                own[machine.task_id] = machine
            elif roll < 0.35:
                live = [m for m in own.values() if not m.snapshot.is_terminal]
                if live:
                    machine = rng.choice(live)
                    before = machine.snapshot.status_version
                    advance(machine)
                    timed(
                        "save",
                        store.save,
                        machine.snapshot,
                        expect_version=before,
                        transitions=machine.transitions_since(before),
                    )
            elif roll < 0.55:
                task_id = rng.choice(shared)
                current = store.get(task_id)
                assert current is not None
                machine = StateMachine.from_snapshot(current)
                if current.status is S.QUEUED:
                    machine.mark_paused()
                else:
                    machine.mark_queued()
                try:
                    timed(
                        "shared_save",
                        store.save,
                        machine.snapshot,
                        expect_version=current.status_version,
                        transitions=machine.transitions,
                    )
                    shared_ok[task_id] += 1
                except ConcurrencyConflict:
                    conflicts += 1
            elif roll < 0.70:
                task_id = rng.choice(shared + list(own)[-20:])
                lease_until = datetime.now(UTC) + timedelta(seconds=30)
                ok = timed(
                    "touch",
                    store.touch,
                    task_id,
                    progress=Progress(done=rng.randrange(1000), total=1000, unit="行"),
                    lease_owner=claimant,
                    lease_until=lease_until,
                )
                assert ok, f"touch {task_id} 返回 False"
            elif roll < 0.82:
                query = rng.choice(
                    [
                        TaskQuery(statuses=frozenset({S.RUNNING, S.PAUSING}), limit=20),
                        TaskQuery(tag=f"p{rng.randrange(4)}", limit=10),
                        TaskQuery(name_prefix="争用'; DROP", bucket=rng.randrange(8), limit=5),
                        TaskQuery(name_prefix="%", limit=5),
                    ]
                )
                rows = store.query(query)
                if query.name_prefix == "%":
                    assert rows == [], "name_prefix='%' 必须按字面匹配"
                reads += 1
                if rng.random() < 0.2:
                    store.stats()
            elif roll < 0.91:
                command = timed(
                    "submit_command",
                    store.submit_command,
                    rng.choice(shared),
                    rng.choice(["stop", "pause", "resume"]),
                    issuer=claimant,
                    reason="争用",
                )
                commands_submitted.append(command.command_id)
            else:
                claimed = timed("claim", store.claim_commands, claimant, lease=600.0, limit=5)
                for command in claimed:
                    commands_claimed.append(command.command_id)
                    ok = timed("complete", store.complete_command, command.command_id, claimant)
                    assert ok, f"complete_command {command.command_id} 返回 False"
        except Exception as exc:  # 全部记下来：测试进程判定失败
            errors.append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}")
            if len(errors) > 50:
                break
    result.update(
        own={task_id: [m.snapshot.status_version, m.status.value] for task_id, m in own.items()},
        shared_ok=shared_ok,
        conflicts=conflicts,
        latencies=latencies,
        errors=errors,
        commands_submitted=commands_submitted,
        commands_claimed=commands_claimed,
        reads=reads,
    )


def main() -> int:
    url, proc_text, seconds_text, threads_text, shared_text, out_path = sys.argv[1:7]
    proc = int(proc_text)
    store = open_store(url)
    shared = shared_text.split(",")
    print("READY", flush=True)
    # 所有进程在同一个墙钟时刻开始，才是真正的争用。
    start_at = float(sys.stdin.readline())
    time.sleep(max(0.0, start_at - time.time()))
    deadline = time.monotonic() + float(seconds_text)
    results: list[dict[str, Any]] = [{} for _ in range(int(threads_text))]
    threads = [
        threading.Thread(target=worker, args=(store, proc, i, deadline, shared, results[i]))
        for i in range(int(threads_text))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    store.close()
    with open(out_path, "w", encoding="utf-8") as handle:
        json.dump(results, handle, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
