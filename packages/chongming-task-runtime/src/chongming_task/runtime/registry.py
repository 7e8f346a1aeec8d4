"""任务定义白名单。Controller 只接受登记过的名字，绝不接受代码。

一个能启动任意可调用对象的入口等于远程代码执行（将来接 CLI、接看板都一样），所以 submit 只收
字符串名字；名字必须事先 register。重名注册直接报错：静默覆盖会让"我明明改了实现，跑的还是
旧的"这类问题极难发现。
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypedDict, Unpack

from chongming_task.core.recipes import OnLost, check_on_lost
from chongming_task.errors import ConfigurationError
from chongming_task.models import (
    MAX_DESCRIPTION_LENGTH,
    check_storable_text,
    check_tag_count,
    normalize_tags,
    validate_task_id,
)
from chongming_task.policies import RetryPolicy, Timeout
from chongming_task.runtime.signature import check_task_signature

SPEC_ATTRIBUTE = "__chongming_task__"


@dataclass(frozen=True)
class TaskDefinition:
    """一条登记：名字 → 函数与它的默认策略。"""

    name: str
    fn: Callable[..., Any]
    tags: frozenset[str]
    retry: RetryPolicy | None
    timeout: Timeout | None
    description: str | None
    durable: bool = False
    """提交时默认落配方（issue 19）。"""
    on_lost: OnLost = OnLost.FAIL


def _spec_of(fn: Callable[..., Any]) -> Any:
    return getattr(fn, SPEC_ATTRIBUTE, None)


def _first_doc_line(fn: Callable[..., Any]) -> str | None:
    doc = inspect.getdoc(fn)
    if not doc:
        return None
    return doc.strip().splitlines()[0].strip() or None


class RegisterOptions(TypedDict, total=False):
    """``register`` 的可选关键字参数（None 表示取 @task 规格里的值，再没有就用默认）。"""

    tags: Iterable[str] | None
    retry: RetryPolicy | None
    timeout: Timeout | None
    description: str | None
    durable: bool | None
    on_lost: OnLost | str | None


class TaskRegistry:
    """名字 → TaskDefinition。线程安全由 Controller 的锁负责。"""

    def __init__(self) -> None:
        self._definitions: dict[str, TaskDefinition] = {}
        self._names: frozenset[str] = frozenset()

    @property
    def names(self) -> frozenset[str]:
        """已登记的名字（登记时更新的同一个 frozenset，读它不拷贝）。worker 每次认领都要这个集合：原来每次
        拿控制器锁、拷一份定义列表、再建一个 frozenset。登记只增不减，每次登记换一个新集合，读到的总是某次
        登记之后的完整集合。"""
        return self._names

    def register(
        self, name: str, fn: Callable[..., Any], **options: Unpack[RegisterOptions]
    ) -> TaskDefinition:
        """``Controller.register`` 的实现（公开签名只写在控制器上，这里收同一组关键字参数）。"""
        tags = options.get("tags")
        retry = options.get("retry")
        timeout = options.get("timeout")
        description = options.get("description")
        durable = options.get("durable")
        on_lost = options.get("on_lost")
        validate_task_id(name, what="任务名")
        if durable is not None and not isinstance(durable, bool):
            raise ConfigurationError(f"durable 必须是 True / False（None 表示取 @task 的），收到 {durable!r}")
        if not callable(fn):
            raise ConfigurationError(f"register({name!r}, ...) 的第二个参数必须是函数，收到 {fn!r}")
        check_task_signature(fn)  # 忘了 ctx 在登记时就说清楚，别等到任务跑起来
        if name in self._definitions:
            raise ConfigurationError(
                f"任务名 {name!r} 已经登记过（{self._definitions[name].fn!r}）；"
                "重名注册不会静默覆盖，请换一个名字或去掉重复的 register"
            )
        spec = _spec_of(fn)
        spec_tags = frozenset(getattr(spec, "tags", ()) or ())
        definition = TaskDefinition(
            name=name,
            fn=fn,
            tags=check_tag_count(spec_tags | normalize_tags(tags)),
            retry=retry if retry is not None else getattr(spec, "retry", None),
            timeout=timeout if timeout is not None else getattr(spec, "timeout", None),
            description=description or getattr(spec, "description", None) or _first_doc_line(fn),
            durable=durable if durable is not None else bool(getattr(spec, "durable", False)),
            on_lost=check_on_lost(on_lost if on_lost is not None else getattr(spec, "on_lost", OnLost.FAIL)),
        )
        # 存不下的描述（含取自 docstring 的）在登记时就拒绝（用户指南 §13），而不是等到第一次提交。
        check_storable_text("description", definition.description, limit=MAX_DESCRIPTION_LENGTH)
        if definition.retry is not None and not isinstance(definition.retry, RetryPolicy):
            raise ConfigurationError(f"retry 必须是 RetryPolicy(...)，收到 {definition.retry!r}")
        if definition.timeout is not None and not isinstance(definition.timeout, Timeout):
            raise ConfigurationError(f"timeout 必须是 Timeout(...)，收到 {definition.timeout!r}")
        self._definitions[name] = definition
        self._names = self._names | {name}
        return definition

    def register_decorated(self, fn: Callable[..., Any]) -> TaskDefinition:
        """登记一个 @task 函数：名字、标签、重试、超时、描述都取自它的规格。"""
        spec = _spec_of(fn)
        if spec is None:
            name = getattr(fn, "__name__", None)
            if not isinstance(name, str) or name == "<lambda>":
                raise ConfigurationError(
                    f"{fn!r} 没有用 @task 装饰，也没有可用的函数名；请用 register(name, fn)"
                )
            return self.register(name, fn)
        return self.register(spec.name, fn)

    def register_module(self, module: ModuleType) -> list[TaskDefinition]:
        """登记模块里所有 @task 函数（按名字排序，结果可预测）。"""
        if not isinstance(module, ModuleType):
            raise ConfigurationError(f"register_module() 需要一个模块对象，收到 {module!r}")
        found = [
            value
            for _, value in sorted(vars(module).items())
            if callable(value) and _spec_of(value) is not None
        ]
        return [self.register_decorated(fn) for fn in found]

    def resolve(self, name: object) -> TaskDefinition:
        """按名字取定义。传入可调用对象或未登记的名字 → ConfigurationError。"""
        if callable(name):
            raise ConfigurationError(
                "submit() 只接受已登记的任务名（字符串），不接受函数或其他可调用对象："
                "能启动任意可调用对象的入口等于远程代码执行。"
                "请先 controller.register('名字', 函数)，再按名字提交"
            )
        if not isinstance(name, str):
            raise ConfigurationError(f"任务名必须是字符串，收到 {name!r}")
        definition = self._definitions.get(name)
        if definition is None:
            known = ", ".join(sorted(self._definitions)) or "（还没有登记任何任务）"
            raise ConfigurationError(f"任务名 {name!r} 没有登记；已登记的有：{known}")
        return definition

    def __contains__(self, name: object) -> bool:
        return name in self._definitions

    def __iter__(self) -> Iterator[TaskDefinition]:
        return iter(list(self._definitions.values()))

    def __len__(self) -> int:
        return len(self._definitions)


__all__ = ["SPEC_ATTRIBUTE", "TaskDefinition", "TaskRegistry"]
