"""崩溃矩阵的工作节点：在独立 OS 进程里跑一个持久化 Controller，持续制造各种生命周期阶段，
直到被测试进程 SIGKILL。

用法：python crash_worker.py <store-url> <owner> <prefix> <seed> <lease_ttl> [thread|process:<start_method>]

第六个参数选执行器：默认线程执行器；``process:spawn`` / ``process:forkserver`` 让任务跑在 ProcessExecutor 的
子进程里（崩溃矩阵的"进程执行器监督进程"车道：监督进程被杀后，子进程一个都不许活下来）。

它做的事（都在一个循环里，随机交错）：

* 不停地提交新任务（submit 中途被杀）；每次提交前打印 ``SUBMIT <task_id>``；
* 任务种类覆盖各个阶段：很快成功的、抛异常失败的、带重试退避的（retry_wait）、常驻的、
  收到停止后还要收尾一阵的（stopping）；
* 本进程自己暂停/恢复常驻任务（paused），自己停止一些任务（stopping → stopped）；
* 测试进程从外面写指令（stop/pause/resume），本进程认领后**故意拖一会儿**才标记完成
  （持有已认领指令时被杀）；认领时打印 ``HELD <command_id>``，完成后打印 ``DONE <command_id>``。

每次状态迁移都写穿到存储，所以随机时刻的 SIGKILL 有相当概率落在一次 save 的事务中间。
"""

from __future__ import annotations

import random
import sys
import threading
import time
from typing import Any

from chongming_task import (
    Controller,
    FixedBackoff,
    ProcessExecutor,
    RetryPolicy,
    TaskCancelled,
    ThreadExecutor,
    open_store,
)

COMMAND_HOLD_SECONDS = 0.12
MAX_TASKS = 36


def quick(ctx: Any, n: int) -> dict[str, int]:
    ctx.checkpoint()
    time.sleep(0.005)
    return {"n": n}


def boom(ctx: Any) -> None:
    ctx.checkpoint()
    raise ValueError("注入的失败")


def flaky(ctx: Any) -> str:
    ctx.checkpoint()
    if ctx.attempt < 3:
        raise RuntimeError(f"第 {ctx.attempt} 次尝试注入失败")
    return "third time lucky"


def resident(ctx: Any) -> int:
    done = 0
    while not ctx.is_stop_requested:
        ctx.checkpoint()
        done += 1
        ctx.progress(done, unit="batch")
        time.sleep(0.01)
    return done


def slow_stop(ctx: Any) -> None:
    """收到停止后还要收尾 0.4 秒：让 stopping 这个中间态持续得足够久，好被杀在里面。"""
    try:
        while True:
            ctx.checkpoint()
            time.sleep(0.01)
    except TaskCancelled:
        time.sleep(0.4)
        raise


def main() -> int:
    url, owner, prefix, seed_text, lease_text = sys.argv[1:6]
    executor_spec = sys.argv[6] if len(sys.argv) > 6 else "thread"
    if executor_spec.startswith("process:"):
        executor: ThreadExecutor | ProcessExecutor = ProcessExecutor(start_method=executor_spec[8:])
    else:
        executor = ThreadExecutor()
    rng = random.Random(int(seed_text))
    store = open_store(url)
    print_lock = threading.Lock()

    def emit(line: str) -> None:
        with print_lock:
            print(line, flush=True)

    claim = store.claim_commands
    complete = store.complete_command

    def claim_and_announce(*args: Any, **kwargs: Any) -> Any:
        commands = claim(*args, **kwargs)
        for command in commands:
            emit(f"HELD {command.command_id}")
        return commands

    def slow_complete(command_id: str, claimant: str) -> bool:
        time.sleep(COMMAND_HOLD_SECONDS)  # 持有已认领、未完成的指令一段时间
        ok = complete(command_id, claimant)
        emit(f"DONE {command_id}")
        return ok

    # 实例属性覆盖：只包装这一个存储对象的两个方法，不改存储类本身。
    store.claim_commands = claim_and_announce  # type: ignore[method-assign]
    store.complete_command = slow_complete  # type: ignore[method-assign]

    controller = Controller(
        store=store,
        owner=owner,
        max_parallel=4,
        lease_ttl=float(lease_text),
        side_channel_interval=0.1,
        command_poll_interval=0.03,
        graceful_stop=5.0,
        executor=executor,
    )
    controller.register("quick", quick)
    controller.register("boom", boom)
    controller.register("flaky", flaky, retry=RetryPolicy(max_attempts=3, backoff=FixedBackoff(0.3)))
    controller.register("resident", resident)
    controller.register("slow_stop", slow_stop)
    kinds = ["quick", "quick", "boom", "flaky", "resident", "slow_stop"]
    submitted: list[str] = []
    emit("READY")
    counter = 0
    while True:
        if len(submitted) < MAX_TASKS:
            kind = rng.choice(kinds)
            counter += 1
            task_id = f"{prefix}-{counter:03d}-{kind}"
            emit(f"SUBMIT {task_id}")
            args: tuple[Any, ...] = (counter,) if kind == "quick" else ()
            controller.submit(kind, *args, task_id=task_id)
            submitted.append(task_id)
        roll = rng.random()
        live = [r for r in controller.runs() if not r.done]
        if live and roll < 0.25:
            target = rng.choice(live)
            if target.name in ("resident", "slow_stop"):
                # pause 会阻塞到确认；放到线程里，别卡住提交循环。
                threading.Thread(target=controller.pause, args=(target.task_id,), daemon=True).start()
        elif live and roll < 0.40:
            target = rng.choice(live)
            controller.resume(target.task_id)
        elif live and roll < 0.50:
            target = rng.choice(live)
            controller.stop(target.task_id, reason="工作节点自己停")
        time.sleep(rng.uniform(0.005, 0.03))


if __name__ == "__main__":
    sys.exit(main())
