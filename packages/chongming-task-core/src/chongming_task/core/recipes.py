"""持久任务的配方（issue 19）：任务名（从不存代码）、参数与运行它要用的策略，随快照在 create 时一起落库。

默认的任务不落配方（用户指南 §9.5：任意参数的序列化带来不可反序列化、版本漂移）。只有作者明确要求
（``submit(..., durable=True)`` / ``@task(durable=True)``），并且参数是能经 JSON **原样往返**的值时，
配方才落库——之后任何登记了同名任务的 worker 都能按它重新执行（at-least-once，见 §9.9）。

"原样往返"比"能序列化"严：``(1, 2)`` 读回是 ``[1, 2]``，``{1: "a"}`` 读回键变成 ``"1"``，它们都能
``json.dumps``，但 worker 收到的参数与提交时的不同。这里逐个参数检查，报错写明哪个参数、什么类型。

本模块只依赖标准库与 ``errors``（records 从这里取类型，反向导入会成环）。
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chongming_task.core.json_depth import MAX_JSON_DEPTH, json_depth_exceeds
from chongming_task.errors import ConfigurationError


class OnLost(enum.StrEnum):
    """持久任务在跑的时候载体消失（被 reconcile 判为 lost）之后怎么办。"""

    FAIL = "fail"
    """保持 lost（默认）：副作用可能已部分发生，由人决定要不要 ``retry``。"""
    RETRY = "retry"
    """尝试预算还有剩余时经审计的 ``retry()`` 重新排队（at-least-once：任务体可能被执行两次）。"""


_JSON_SCALARS = (str, bool, int, float, type(None))


def check_on_lost(value: object) -> OnLost:
    """``on_lost`` 的取值：``"fail"`` / ``"retry"``（或 OnLost）。"""
    try:
        return OnLost(value)  # type: ignore[arg-type]
    except ValueError:
        raise ConfigurationError(
            f"on_lost 只能是 {' / '.join(repr(m.value) for m in OnLost)}，收到 {value!r}"
        ) from None


def _problem(value: Any, path: str) -> tuple[str, str] | None:
    """value 不能经 JSON 原样往返时返回 (出问题的位置, 类型名)；非递归。"""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        kind = type(item)
        if kind is dict:
            for key, child in item.items():
                if type(key) is not str:
                    return f"{where} 的键 {key!r}", type(key).__name__
                stack.append((child, f"{where}[{key!r}]"))
        elif kind is list:
            stack.extend((child, f"{where}[{index}]") for index, child in enumerate(item))
        elif kind is float:
            if not math.isfinite(item):
                return where, f"float（{item!r}）"
        elif kind not in _JSON_SCALARS:
            # 子类（IntEnum、OrderedDict、str 的子类……）读回是基类：同样不是原样往返。
            return where, kind.__qualname__
    return None


def check_durable_value(value: Any, where: str) -> Any:
    """一个参数能否经 JSON 原样往返；不能 → ConfigurationError（写明参数与值的类型）。"""
    if json_depth_exceeds(value):
        raise ConfigurationError(
            f"持久任务的参数 {where} 嵌套超过 {MAX_JSON_DEPTH} 层："
            "请把大结构放进文件或数据库，参数里只传它的位置"
        )
    found = _problem(value, where)
    if found is not None:
        place, type_name = found
        raise ConfigurationError(
            f"持久任务的参数 {place}：值的类型是 {type_name}，无法按 JSON 原样保存；durable=True 只接受 "
            "dict（键为 str）/ list / str / int / float / bool / None；请换成这些类型（元组写成列表、"
            "时间写成 ISO 文本），或去掉 durable=True"
        )
    return value


def _timeout_dict(value: object) -> dict[str, float | None] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) - {"start", "per_attempt", "idle"}:
        raise ConfigurationError(f"配方的 timeout 必须是 {{start, per_attempt, idle}} 字典，收到 {value!r}")
    out: dict[str, float | None] = {}
    for key in ("start", "per_attempt", "idle"):
        item = value.get(key)
        if item is not None and (isinstance(item, bool) or not isinstance(item, (int, float))):
            raise ConfigurationError(f"配方的 timeout.{key} 必须是秒数或 None，收到 {item!r}")
        out[key] = None if item is None else float(item)
    return out


@dataclass(frozen=True)
class Recipe:
    """重新执行一个持久任务所需的全部信息（都是 JSON 值）。

    * ``name``：登记名——worker 只执行自己登记了这个名字的配方（白名单，从不存代码）；
    * ``args`` / ``kwargs``：提交时的参数（逐个经 ``check_durable_value`` 检查过）；
    * ``max_attempts``、``timeout``：重试与超时策略里能落库的部分（重试条件、退避取 worker 上登记的定义）；
    * ``tags``、``priority``、``bucket_key``：提交参数（快照里也有，配方里再记一份，重跑时照原样）；
    * ``on_lost``：在跑时载体消失之后是否自动重跑（``OnLost``）。
    """

    name: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_attempts: int = 1
    timeout: Mapping[str, float | None] | None = None
    tags: tuple[str, ...] = ()
    priority: int = 0
    bucket_key: str | None = None
    on_lost: OnLost = OnLost.FAIL

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigurationError(f"配方的 name 必须是非空字符串，收到 {self.name!r}")
        args: object = self.args
        if not isinstance(args, Sequence) or isinstance(args, (str, bytes)):
            raise ConfigurationError(f"配方的 args 必须是参数列表，收到 {args!r}")
        kwargs: object = self.kwargs
        if not isinstance(kwargs, Mapping):
            raise ConfigurationError(f"配方的 kwargs 必须是字典，收到 {kwargs!r}")
        for index, value in enumerate(args):
            check_durable_value(value, f"args[{index}]")
        for key, value in kwargs.items():
            if not isinstance(key, str):
                raise ConfigurationError(f"配方的 kwargs 的键必须是字符串，收到 {key!r}")
            check_durable_value(value, key)
        object.__setattr__(self, "args", tuple(args))
        object.__setattr__(self, "kwargs", dict(kwargs))
        for name in ("max_attempts", "priority"):
            number = getattr(self, name)
            if isinstance(number, bool) or not isinstance(number, int):
                raise ConfigurationError(f"配方的 {name} 必须是整数，收到 {number!r}")
        if self.max_attempts < 1:
            raise ConfigurationError(f"配方的 max_attempts 至少为 1，收到 {self.max_attempts}")
        object.__setattr__(self, "timeout", _timeout_dict(self.timeout))
        tags: object = self.tags
        if isinstance(tags, str) or not all(isinstance(tag, str) for tag in tags):  # type: ignore[attr-defined]
            raise ConfigurationError(f"配方的 tags 必须是字符串列表，收到 {tags!r}")
        object.__setattr__(self, "tags", tuple(sorted(set(tags))))  # type: ignore[call-overload]
        if self.bucket_key is not None and not isinstance(self.bucket_key, str):
            raise ConfigurationError(f"配方的 bucket_key 必须是字符串或 None，收到 {self.bucket_key!r}")
        object.__setattr__(self, "on_lost", check_on_lost(self.on_lost))

    @property
    def retries_when_lost(self) -> bool:
        return self.on_lost is OnLost.RETRY

    def to_dict(self, *, copy: bool = True) -> dict[str, Any]:
        """配方的 JSON 字典。

        ``copy=True``（默认）时参数深拷一份（经 JSON）：调用方改返回的字典碰不到配方本身。存储的列编码器只把
        字典编码成文本、从不改它，传 ``copy=False`` 省掉这次往返——持久任务每次保存（starting、终态）都要重编码
        一遍不变的配方，这次往返曾是 worker 路径上我们自己代码里最贵的一步。两种写法编码出的 JSON 文本相同：
        参数在 ``__post_init__`` 里已逐个查过能经 JSON 原样往返。
        """
        return {
            "name": self.name,
            "args": json.loads(json.dumps(list(self.args))) if copy else self.args,
            "kwargs": json.loads(json.dumps(self.kwargs)) if copy else self.kwargs,
            "max_attempts": self.max_attempts,
            "timeout": None if self.timeout is None else dict(self.timeout),
            "tags": list(self.tags),
            "priority": self.priority,
            "bucket_key": self.bucket_key,
            "on_lost": self.on_lost.value,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Recipe:
        if not isinstance(data, Mapping) or "name" not in data:
            raise ConfigurationError(f"配方字典缺少 name：{data!r}")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigurationError(f"配方字典里有未知字段：{sorted(unknown)}（它可能由更新版本的包写出）")
        return cls(
            name=data["name"],
            args=tuple(data.get("args") or ()),
            kwargs=dict(data.get("kwargs") or {}),
            max_attempts=data.get("max_attempts", 1),
            timeout=data.get("timeout"),
            tags=tuple(data.get("tags") or ()),
            priority=data.get("priority", 0),
            bucket_key=data.get("bucket_key"),
            on_lost=data.get("on_lost", OnLost.FAIL.value),
        )

    @classmethod
    def trusted_from_dict(cls, data: Mapping[str, Any]) -> Recipe:
        """存储读回的配方（存储自己表里的那一列，写入时已经 ``__post_init__`` 逐项查过）：与 ``from_dict``
        得到的配方逐项相同（字段的类型与规整——参数元组、标签排序去重、超时秒数转成浮点、``on_lost`` 转成枚举
        ——照做），只是不再逐个参数走 ``check_durable_value``。

        为什么：worker 每认领一个持久任务都要解码一次配方，参数的递归检查是其中最贵的一步（issue 19 的吞吐），
        而存储里的参数正是当初提交时查过、经 JSON 原样存下的那些值。未知字段、缺 name 仍照 ``from_dict``
        报错（那多半是更新版本的包写出的配方，不能当作认得）。
        """
        if not isinstance(data, Mapping) or "name" not in data:
            raise ConfigurationError(f"配方字典缺少 name：{data!r}")
        if not _RECIPE_KEYS.issuperset(data):
            unknown = set(data) - _RECIPE_KEYS
            raise ConfigurationError(f"配方字典里有未知字段：{sorted(unknown)}（它可能由更新版本的包写出）")
        tags = data.get("tags")
        recipe: Recipe = object.__new__(cls)
        recipe.__dict__.update(
            name=data["name"],
            args=tuple(data.get("args") or ()),
            kwargs=dict(data.get("kwargs") or {}),
            max_attempts=data.get("max_attempts", 1),
            timeout=_timeout_dict(data.get("timeout")),
            tags=tuple(sorted(set(tags))) if tags else (),
            priority=data.get("priority", 0),
            bucket_key=data.get("bucket_key"),
            on_lost=check_on_lost(data.get("on_lost", OnLost.FAIL.value)),
        )
        return recipe

    def __eq__(self, other: object) -> bool:
        # 逐值且逐类型相等：1 与 1.0、True 与 1 在 Python 里相等，但配方往返必须连类型一起保住。
        if not isinstance(other, Recipe):
            return NotImplemented
        return bool(_typed(self.to_dict()) == _typed(other.to_dict()))

    def __hash__(self) -> int:
        return hash((self.name, self.max_attempts, self.priority))


_RECIPE_KEYS = frozenset(Recipe.__dataclass_fields__)


def _typed(value: Any) -> Any:
    """把值连同类型展开成可比较的结构（``1 == 1.0`` 但 ``(int, 1) != (float, 1.0)``）。"""
    if isinstance(value, dict):
        return ("dict", tuple((key, _typed(value[key])) for key in sorted(value)))
    if isinstance(value, list):
        return ("list", tuple(_typed(item) for item in value))
    return (type(value).__name__, value)


__all__ = ["OnLost", "Recipe", "check_durable_value", "check_on_lost"]
