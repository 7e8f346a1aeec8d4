"""持久任务的提交一侧（issue 19）：由登记的定义与提交参数拼出配方，以及"只入队、不执行"的 enqueue。

配方（``core/recipes.py``）只记名字、参数与能落库的策略；worker 执行时函数、重试条件与退避取自它自己登记的
同名定义（白名单：worker 只执行自己登记了名字的配方）。参数在提交时逐个检查能否经 JSON 原样往返，不能就是
ConfigurationError（写明参数与值的类型），什么也不写。

enqueue 写下的任务是 ``queued``、``owner`` 为空、没有租约：提交者不持有它，负责它所在桶、登记了它名字的 worker
用 ``TaskStore.claim_queued`` 认领（``runtime/worker.py``）。
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from chongming_task.clock import Clock
from chongming_task.core.recipes import OnLost, Recipe, check_durable_value, check_on_lost
from chongming_task.core.state_machine import StateMachine
from chongming_task.errors import ConfigurationError, DuplicateTaskId, TaskNotFound
from chongming_task.models import TaskSnapshot
from chongming_task.policies import Timeout
from chongming_task.runtime.registry import TaskDefinition
from chongming_task.storage import TaskStore


def timeout_dict(timeout: Timeout | None) -> dict[str, float | None] | None:
    if timeout is None or timeout.is_unlimited:
        return None
    return {"start": timeout.start, "per_attempt": timeout.per_attempt, "idle": timeout.idle}


def recipe_timeout(recipe: Recipe) -> Timeout | None:
    """配方里记下的超时（没有记就是 None：用 worker 上登记的定义的）。"""
    if recipe.timeout is None:
        return None
    return Timeout(**dict(recipe.timeout))


def _positional_names(definition: TaskDefinition | None, count: int) -> list[str]:
    """第 i 个位置参数在任务函数里叫什么（第一个位置参数是 ctx，跳过）；取不到就写 args[i]。"""
    names: tuple[str, ...] = ()
    if definition is not None:
        try:
            names = _parameter_names(definition.fn)
        except TypeError:  # 不可哈希的可调用对象：不缓存，当场取
            names = _parameter_names.__wrapped__(definition.fn)
    return [f"{names[i]}（args[{i}]）" if i < len(names) else f"args[{i}]" for i in range(count)]


@functools.lru_cache(maxsize=256)
def _parameter_names(fn: Callable[..., Any]) -> tuple[str, ...]:
    """任务函数除 ctx 以外的位置参数名。按函数缓存：每次 enqueue 都要用（报错时写出参数名），而
    ``inspect.signature`` 每次要几十微秒——它占了入队 CPU 的一成左右；登记的函数就那么几个。"""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in parameters if p.kind in _POSITIONAL)[1:]


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def build_recipe(
    definition: TaskDefinition | None,
    name: str,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    tags: frozenset[str],
    priority: int,
    bucket_key: str | None,
    on_lost: OnLost | str | None = None,
    max_attempts: int | None = None,
) -> Recipe:
    """提交参数 → 配方（参数不能原样往返时抛 ConfigurationError）。"""
    # 先逐个查参数（报错写出函数里的参数名），再交给 Recipe（它也查一遍：从存储读回的配方同样要合法）。
    for label, value in zip(_positional_names(definition, len(args)), args, strict=True):
        check_durable_value(value, label)
    retry = definition.retry if definition is not None else None
    if max_attempts is None:
        max_attempts = retry.max_attempts if retry is not None else 1
    lost = on_lost if on_lost is not None else (definition.on_lost if definition is not None else OnLost.FAIL)
    return Recipe(
        name=name,
        args=args,
        kwargs=dict(kwargs),
        max_attempts=max_attempts,
        timeout=timeout_dict(definition.timeout if definition is not None else None),
        tags=tuple(sorted(tags)),
        priority=priority,
        bucket_key=bucket_key,
        on_lost=check_on_lost(lost),
    )


def enqueue_recipe(
    store: TaskStore,
    recipe: Recipe,
    *,
    task_id: str,
    clock: Clock,
    bucket: int | None,
    label: str | None,
    description: str | None,
    issuer: str,
) -> str:
    """把一个待认领的持久任务写进存储：pending → queued 两步在一次 create 里（带历史），无人持有。"""
    machine = StateMachine.create(
        task_id,
        recipe.name,
        max_attempts=recipe.max_attempts,
        clock=clock,
        lock=threading.RLock(),
        label=label,
        tags=frozenset(recipe.tags),
        priority=recipe.priority,
        bucket=bucket,
        bucket_key=recipe.bucket_key,
        owner=None,
        description=description,
        recipe=recipe,
    )
    machine.mark_queued(actor=issuer, reason="持久任务入队，等 worker 认领")
    try:
        store.create(machine.snapshot, machine.transitions)
    except DuplicateTaskId:
        existing = store.get(task_id)
        raise DuplicateTaskId.for_existing(
            task_id, existing.status if existing is not None else None, where="于存储中"
        ) from None
    return task_id


def requeue(store: TaskStore, task_id: str, *, clock: Clock, actor: str, reason: str | None) -> TaskSnapshot:
    """已结束（failed / stopped / cancelled / lost）的持久任务经审计的 ``retry()`` 复活、交回队列、无人持有。

    与 reconcile 的 on_lost 重跑同一条路径（``control:retry``），只是由人发起；之后任何登记了它名字、负责它的
    桶的 worker 都能认领。不是持久任务 → ConfigurationError（它的参数从未落库，没法重跑：请重新提交）。
    """
    snapshot = store.get(task_id)
    if snapshot is None:
        raise TaskNotFound(f"存储里没有任务 {task_id!r}")
    if snapshot.recipe is None:
        raise ConfigurationError(
            f"任务 {task_id!r} 不是持久任务（提交时没有 durable=True）：它的参数从未落库，无法重跑；"
            "请重新提交它"
        )
    machine = StateMachine(snapshot, (), clock=clock, lock=threading.RLock())
    machine.retry(actor=actor, reason=reason or f"{actor} 要求重跑持久任务")
    revived = machine.snapshot.evolve(owner=None)
    store.save(
        revived,
        expect_version=snapshot.status_version,
        transitions=machine.transitions_since(snapshot.status_version),
    )
    return revived


def check_durable_flag(durable: object) -> bool | None:
    if durable is not None and not isinstance(durable, bool):
        raise ConfigurationError(f"durable 必须是 True / False（None 表示按任务定义），收到 {durable!r}")
    return durable


def names_text(names: Iterable[str]) -> str:
    ordered = sorted(names)
    return "、".join(ordered[:8]) + (" 等" if len(ordered) > 8 else "") if ordered else "（没有）"


__all__ = [
    "build_recipe",
    "check_durable_flag",
    "enqueue_recipe",
    "names_text",
    "recipe_timeout",
    "requeue",
    "timeout_dict",
]
