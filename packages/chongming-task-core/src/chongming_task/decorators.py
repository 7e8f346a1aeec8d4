"""``@task``：把任务的元数据挂在函数对象上（用户指南 §2.4）。

它**不**产生全局注册表：规格只存在 ``fn.__chongming_task__`` 上，谁注册、注册到哪个控制器由
调用方决定。import 可能发生在任何地方（包括测试收集阶段），"import 即注册"的隐式行为极难排查。

装饰器原样返回函数本身（不包一层）：这样模块级任务函数仍能按名字 pickle，进程执行器在子进程里
找得到它。
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypedDict, TypeVar, Unpack, overload

from chongming_task.core.recipes import OnLost, check_on_lost
from chongming_task.errors import ConfigurationError
from chongming_task.models import (
    MAX_DESCRIPTION_LENGTH,
    check_storable_text,
    normalize_tags,
    validate_task_id,
)
from chongming_task.policies import RetryPolicy, Timeout

SPEC_ATTRIBUTE = "__chongming_task__"

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class TaskSpec:
    """``@task`` 记下的任务规格。"""

    name: str
    description: str | None = None
    tags: frozenset[str] = field(default_factory=frozenset)
    retry: RetryPolicy | None = None
    timeout: Timeout | None = None
    durable: bool = False
    """提交时默认落配方（``submit(..., durable=...)`` 可逐次覆盖；issue 19）。"""
    on_lost: OnLost = OnLost.FAIL
    """持久任务在跑时载体消失之后：保持 lost（``"fail"``）或经 retry() 重新排队（``"retry"``）。"""


def _first_doc_line(fn: Callable[..., Any]) -> str | None:
    doc = getattr(fn, "__doc__", None)
    if not isinstance(doc, str) or not doc:
        return None
    for line in doc.strip().splitlines():
        if line.strip():
            return line.strip()
    return None


def _build_spec(
    fn: Callable[..., Any],
    name: str | None,
    description: str | None,
    tags: Iterable[str] | None,
    retry: RetryPolicy | None,
    timeout: Timeout | None,
    durable: object = False,
    on_lost: object = OnLost.FAIL,
) -> TaskSpec:
    if not callable(fn):
        raise ConfigurationError(f"@task 只能装饰可调用对象（函数），收到 {fn!r}")
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise ConfigurationError(f"@task(retry=...) 必须是 RetryPolicy(...)，收到 {retry!r}")
    if timeout is not None and not isinstance(timeout, Timeout):
        raise ConfigurationError(f"@task(timeout=...) 必须是 Timeout(...)，收到 {timeout!r}")
    if description is not None and not isinstance(description, str):
        raise ConfigurationError(f"@task(description=...) 必须是字符串，收到 {description!r}")
    resolved = name if name is not None else getattr(fn, "__name__", None)
    if resolved is None:
        raise ConfigurationError(f"无法从 {fn!r} 推断任务名：请写 @task(name='...')")
    validate_task_id(resolved, what="name")
    if description is None:
        description = _first_doc_line(fn)
    # 存不下的描述（含取自 docstring 的）在装饰时就拒绝（用户指南 §13），而不是等到第一次提交。
    check_storable_text("@task 的 description", description, limit=MAX_DESCRIPTION_LENGTH)
    if not isinstance(durable, bool):
        raise ConfigurationError(f"@task(durable=...) 必须是 True 或 False，收到 {durable!r}")
    return TaskSpec(
        name=resolved,
        description=description,
        tags=normalize_tags(tags),
        retry=retry,
        timeout=timeout,
        durable=durable,
        on_lost=check_on_lost(on_lost),
    )


def _attach(fn: F, spec: TaskSpec) -> F:
    if getattr(fn, SPEC_ATTRIBUTE, None) is not None:
        raise ConfigurationError(
            f"{getattr(fn, '__qualname__', fn)!r} 已经用 @task 装饰过；一个函数只能有一份任务规格"
        )
    try:
        setattr(fn, SPEC_ATTRIBUTE, spec)
    except (AttributeError, TypeError):
        raise ConfigurationError(
            f"无法在 {fn!r} 上记录任务规格（它不接受属性）；请用普通的 def 函数定义任务"
        ) from None
    return fn


class _TaskOptions(TypedDict, total=False):
    """``@task(...)`` 的关键字参数（给类型检查用；默认值见 ``task`` 本身）。"""

    name: str | None
    description: str | None
    tags: Iterable[str] | None
    retry: RetryPolicy | None
    timeout: Timeout | None
    durable: bool
    on_lost: OnLost | str


@overload
def task(fn: F, /) -> F: ...


@overload
def task(**options: Unpack[_TaskOptions]) -> Callable[[F], F]: ...


def task(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    tags: Iterable[str] | None = None,
    retry: RetryPolicy | None = None,
    timeout: Timeout | None = None,
    durable: bool = False,
    on_lost: OnLost | str = OnLost.FAIL,
) -> Any:
    """声明一个任务：``@task`` 或 ``@task(name=, description=, tags=, retry=, timeout=, durable=, ...)``。

    ``durable=True``：这个任务默认是持久任务（提交时落配方，worker 可认领、失联后可接手；用户指南 §9.9）。

    名字默认取函数名，描述默认取 docstring 第一行。返回原函数（不包装），规格在
    ``fn.__chongming_task__``（见 :func:`task_spec`）。
    """
    if fn is not None:
        return _attach(fn, _build_spec(fn, name, description, tags, retry, timeout, durable, on_lost))

    def decorate(inner: F) -> F:
        return _attach(inner, _build_spec(inner, name, description, tags, retry, timeout, durable, on_lost))

    return decorate


def task_spec(fn: object) -> TaskSpec | None:
    """取函数上的 ``@task`` 规格；没有装饰过返回 None。"""
    spec = getattr(fn, SPEC_ATTRIBUTE, None)
    return spec if isinstance(spec, TaskSpec) else None


__all__ = ["SPEC_ATTRIBUTE", "TaskSpec", "task", "task_spec"]
