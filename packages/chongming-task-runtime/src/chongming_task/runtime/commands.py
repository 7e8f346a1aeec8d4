"""跨进程控制指令的处理：持有者取走指令、执行、完成；不是自己的立刻交还。

规则（用户指南 §9.4）：

* 只有持有任务的控制器才认领：分区节点按自己的桶认领，不分区的按自己的名字认领（``holder``：存储在认领
  的同一事务里对照任务行此刻的 owner，任务被 adopt 换了持有者，指令就归新持有者）；纯查询的控制台从不
  认领，免得抢走别人的指令。按名字而不是按手里的 task_id 清单认领：积压十万个排队任务时，每 0.1 秒一次
  的轮询不再是 O(在管任务数) 的参数。还没跟上契约（``claim_commands`` 不接受 ``holder``）的第三方后端
  照旧按 task_id 清单认领。
* 取到的指令若属于本进程持有的任务：执行并 complete。
* 不属于本进程：任务已落终态 → complete（指令作废，没有可执行的动作）；存储说它归别人 → release，立即
  交还给真正的持有者。绝不 complete 别人的指令（那会让持有者永远收不到）。
* 存储说它归本节点、本进程却不持有、也不是正在落库的新任务：这是同名的上一个进程留下的任务（重启沿用了
  owner）。既不执行也不交还——交还给自己只会让下一轮再取到它，每 0.1 秒一次，排在前面的这种指令还会把
  真正要执行的挤出一批之外——留着租约，到期后重新投递：那时 reconcile 已判它 lost（→ complete）或别的
  节点已接手（→ 按持有者认领交给新持有者）。
* 执行出错：既不 complete 也不 release，租约到期后指令会被重新投递。
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from chongming_task.errors import TaskError
from chongming_task.storage import Command, CommandAction, TaskStore

if TYPE_CHECKING:
    from chongming_task.runtime.taskrun import TaskRun

logger = logging.getLogger("chongming_task.controller")

CLAIM_BATCH = 100


def execute_command(run: TaskRun, command: Command) -> None:
    """在本进程持有的任务上执行一条指令；发起者记进迁移历史的 actor。"""
    issuer = command.issuer
    logger.info("执行来自 %s 的指令 %s（任务 %s）", issuer, command.action.value, run.task_id)
    if command.action is CommandAction.STOP:
        run.stop(reason=command.reason or f"来自 {issuer} 的停止指令", actor=issuer)
    elif command.action is CommandAction.RESUME:
        run.resume(actor=issuer)
    elif command.action is CommandAction.PAUSE:
        timeout = command.payload.get("timeout")
        pause_timeout = float(timeout) if isinstance(timeout, (int, float)) else None
        # pause 会阻塞到确认或窗口用尽；放到独立线程里，别卡住轮询它的后台循环。
        threading.Thread(
            target=run.pause,
            kwargs={"timeout": pause_timeout, "actor": issuer},
            name=f"pause[{run.task_id}]",
            daemon=True,
        ).start()


def poll_commands(
    store: TaskStore,
    owner: str,
    *,
    lease: float,
    task_ids: Collection[str] | None,
    buckets: Collection[int] | None,
    local_run: Callable[[str], TaskRun | None],
    on_store_error: Callable[[str, BaseException], None] | None = None,
    by_holder: bool = False,
    arriving: Callable[[str], bool] = lambda task_id: False,
) -> int:
    """认领一批指令并逐条处理。返回本轮取到的指令数。

    ``by_holder``：按本节点的名字认领（见模块说明）。``arriving(task_id)``：这个任务是否正在落库、马上就由
    本进程持有（已写进存储、还没登记）——它的指令交还，下一轮就能执行，不必等租约到期。
    """
    try:
        if by_holder:
            commands = store.claim_commands(
                owner, lease=lease, limit=CLAIM_BATCH, task_ids=task_ids, buckets=buckets, holder=owner
            )
        else:
            commands = store.claim_commands(
                owner, lease=lease, limit=CLAIM_BATCH, task_ids=task_ids, buckets=buckets
            )
    except TaskError as exc:
        # 存储故障期间每 0.1 秒失败一次：交给调用方的限流日志（Controller 的 OutageLog），不逐次刷屏。
        if on_store_error is not None:
            on_store_error("claim_commands", exc)
        else:
            logger.warning("轮询指令失败：%s", exc)
        return 0
    for command in commands:
        try:
            # 先问"正在落库吗"再问"本地有吗"：登记时两者在控制器锁内一起变，这个顺序下不会两头都落空。
            coming = arriving(command.task_id)
            run = local_run(command.task_id)
            if run is not None:
                execute_command(run, command)
                store.complete_command(command.command_id, owner)
                continue
            snapshot = store.get(command.task_id)
            if snapshot is None or snapshot.is_terminal:
                store.complete_command(command.command_id, owner)
            elif snapshot.owner == owner and not coming:
                logger.info(
                    "指令 %s 的任务 %s 在存储里归本节点 %s，但不在本进程（同名的上一个进程留下的）："
                    "留到租约到期再投递",
                    command.command_id,
                    command.task_id,
                    owner,
                )
            else:
                store.release_command(command.command_id, owner)
        except TaskError as exc:
            logger.warning("处理指令 %s 失败（租约到期后会重新投递）：%s", command.command_id, exc)
    return len(commands)


def remote_payload(timeout: float | None) -> Mapping[str, Any]:
    return {} if timeout is None else {"timeout": timeout}


__all__ = ["CLAIM_BATCH", "execute_command", "poll_commands", "remote_payload"]
