"""跨进程用例的子进程（直接按路径运行，不是测试模块）。

协议：子进程准备好（导入完毕、连接池建好）后打印一行 ``ready``，然后阻塞读 stdin；父进程等
所有子进程都 ready 之后各写一行 ``go``，于是它们在同一时刻开抢。结果以一行 JSON 打印到 stdout。

    python _pg_worker.py claim DSN SCHEMA THREADS LEASE
    python _pg_worker.py ddl DSN SCHEMA
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any


def _ready_then_wait_for_go() -> None:
    print("ready", flush=True)
    line = sys.stdin.readline().strip()
    if line != "go":
        raise SystemExit(f"期望父进程发来 go，收到 {line!r}")


def claim(dsn: str, schema: str, threads: int, lease: float) -> dict[str, Any]:
    from chongming_task.stores.postgres import PostgresTaskStore

    store = PostgresTaskStore(dsn, schema=schema, min_size=threads, max_size=threads)
    claimed: list[dict[str, Any]] = []
    lock = threading.Lock()
    errors: list[str] = []
    barrier = threading.Barrier(threads)

    def run(index: int) -> None:
        claimant = f"p{os.getpid()}-t{index}"
        barrier.wait()
        empty_rounds = 0
        try:
            while empty_rounds < 3:
                batch = store.claim_commands(claimant, lease=lease, limit=3)
                if not batch:
                    empty_rounds += 1
                    continue
                empty_rounds = 0
                for command in batch:
                    completed = store.complete_command(command.command_id, claimant)
                    with lock:
                        claimed.append(
                            {
                                "command_id": command.command_id,
                                "claimant": claimant,
                                "deliveries": command.deliveries,
                                "completed": completed,
                            }
                        )
        except Exception as exc:  # 报告给父进程，让用例失败时看得到原因
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}")

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    _ready_then_wait_for_go()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    store.close()
    return {"claimed": claimed, "errors": errors}


def ddl(dsn: str, schema: str) -> dict[str, Any]:
    from chongming_task.stores.postgres import PostgresTaskStore

    _ready_then_wait_for_go()
    try:
        store = PostgresTaskStore(dsn, schema=schema)
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    store.close()
    return {"ok": True}


def main(argv: list[str]) -> None:
    mode = argv[1]
    if mode == "claim":
        result = claim(argv[2], argv[3], int(argv[4]), float(argv[5]))
    elif mode == "ddl":
        result = ddl(argv[2], argv[3])
    else:
        raise SystemExit(f"未知模式 {mode!r}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv)
