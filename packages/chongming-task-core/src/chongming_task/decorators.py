"""``@task``：把任务的元数据挂在函数对象上（用户指南 §2.4）。

它**不**产生全局注册表：规格只存在 ``fn.__chongming_task__`` 上，谁注册、注册到哪个控制器由
调用方决定。import 可能发生在任何地方（包括测试收集阶段），"import 即注册"的隐式行为极难排查。

装饰器原样返回函数本身（不包一层）：这样模块级任务函数仍能按名字 pickle，进程执行器在子进程里
找得到它。
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar, overload

from chongming_task.errors import ConfigurationError
from chongming_task.models import normalize_tags, validate_task_id
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
    return TaskSpec(
        name=resolved,
        description=description if description is not None else _first_doc_line(fn),
        tags=normalize_tags(tags),
        retry=retry,
        timeout=timeout,
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


@overload
def task(fn: F, /) -> F: ...


@overload
def task(
    *,
    name: str | None = None,
    description: str | None = None,
    tags: Iterable[str] | None = None,
    retry: RetryPolicy | None = None,
    timeout: Timeout | None = None,
) -> Callable[[F], F]: ...


def task(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    tags: Iterable[str] | None = None,
    retry: RetryPolicy | None = None,
    timeout: Timeout | None = None,
) -> Any:
    """声明一个任务：``@task`` 或 ``@task(name=, description=, tags=, retry=, timeout=)``。

    名字默认取函数名，描述默认取 docstring 第一行。返回原函数（不包装），规格在
    ``fn.__chongming_task__``（见 :func:`task_spec`）。
    """
    if fn is not None:
        return _attach(fn, _build_spec(fn, name, description, tags, retry, timeout))

    def decorate(inner: F) -> F:
        return _attach(inner, _build_spec(inner, name, description, tags, retry, timeout))

    return decorate


def task_spec(fn: object) -> TaskSpec | None:
    """取函数上的 ``@task`` 规格；没有装饰过返回 None。"""
    spec = getattr(fn, SPEC_ATTRIBUTE, None)
    return spec if isinstance(spec, TaskSpec) else None


__all__ = ["SPEC_ATTRIBUTE", "TaskSpec", "task", "task_spec"]
