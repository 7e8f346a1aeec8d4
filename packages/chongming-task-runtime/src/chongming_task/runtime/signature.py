"""任务函数签名的提交前检查：第一个位置参数收上下文（用户指南 §2.1）。

新手最常见的错误是忘了写 ``ctx``（``def fetch(url)``）：执行器按 ``fn(ctx, *args, **kwargs)`` 调用，
于是 url 收到了上下文、真正的参数多出来一个，任务跑起来才以一个看不懂的 TypeError 失败（还可能被
重试几轮）。这里在 register / submit / run_task 时就把它拦下，并直说该怎么改。

只拦"确定是忘了 ctx"的情形，绝不误伤合法写法：

* 登记时（还没有参数）：函数根本没有能收上下文的位置参数（``def f()``、``def f(*, url)``），或第一个
  位置参数标注成了 str / int 这类不可能是上下文的值类型；
* 提交时：``fn(ctx, *args, **kwargs)`` 绑不上、而 ``fn(*args, **kwargs)`` 绑得上——差的正好是 ctx。
  别的绑定错误（少传、多传了参数）照旧留给任务自己报：那不是"忘了 ctx"，改判会改变既有行为。

``inspect.signature`` 认得 ``@task`` 函数（原样返回）、``async def``、``functools.partial``、绑定方法、
``functools.wraps`` 包装与带 ``__call__`` 的对象；取不到签名的（部分 C 实现的可调用对象）不检查。
"""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from chongming_task.errors import ConfigurationError

_P = inspect.Parameter
_POSITIONAL = (_P.POSITIONAL_ONLY, _P.POSITIONAL_OR_KEYWORD)

# 第一个位置参数标注成这些类型时，它不可能是上下文。
_VALUE_TYPES: frozenset[Any] = frozenset({str, int, float, bool, bytes, list, dict, tuple, set, frozenset})
_VALUE_TYPE_NAMES = frozenset(t.__name__ for t in _VALUE_TYPES)

_CONTEXT = object()
"""绑定检查时代替上下文的占位对象（只用于 Signature.bind，不会被调用）。"""


# 已通过检查的调用形状（位置参数个数, 关键字名）——只给普通函数记：Signature.bind 的成败只取决于参数
# 个数与关键字名，不看值，所以同一个函数、同一种形状的提交不必每次重算签名（提交热路径上最贵的一步）。
_Shape = tuple[int, tuple[str, ...]] | None
# 普通字典（热路径上比 WeakKeyDictionary 便宜得多）；强引用的函数至多 _MAX_CACHED 个，满了整个清掉重记。
_passed: dict[Callable[..., Any], set[_Shape]] = {}
_MAX_CACHED = 1024


def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    """``inspect.signature``，按函数缓存：每次提交都要核对参数，而解析签名比核对本身贵好几倍
    （submit_many 一次提交十万个同一函数的任务）。不可哈希的可调用对象不缓存。"""
    try:
        hash(fn)
    except TypeError:
        return _uncached_signature(fn)
    return _cached_signature(fn)


def _uncached_signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


_cached_signature = functools.lru_cache(maxsize=1024)(_uncached_signature)


def _display_name(fn: Callable[..., Any]) -> str:
    target: Any = fn
    while isinstance(target, functools.partial):
        target = target.func
    name = getattr(target, "__name__", None)
    return name if isinstance(name, str) else type(target).__name__


def _suggested(name: str, signature: inspect.Signature) -> str:
    """把 ctx 加在最前面的写法，例如 ``def fetch(ctx, url)``（只写参数名，不抄标注）。"""
    parts = ["ctx"]
    star_written = False
    for parameter in signature.parameters.values():
        if parameter.kind is _P.VAR_POSITIONAL:
            parts.append(f"*{parameter.name}")
            star_written = True
        elif parameter.kind is _P.KEYWORD_ONLY:
            if not star_written:
                parts.append("*")
                star_written = True
            parts.append(parameter.name)
        elif parameter.kind is _P.VAR_KEYWORD:
            parts.append(f"**{parameter.name}")
        else:
            parts.append(parameter.name)
    return f"def {name}({', '.join(parts)})"


def _is_value_type(annotation: object) -> bool:
    if isinstance(annotation, str):  # from __future__ import annotations：标注是字符串
        return annotation.split("[", 1)[0].strip() in _VALUE_TYPE_NAMES
    origin = typing.get_origin(annotation) or annotation
    return origin in _VALUE_TYPES


def _refuse(fn: Callable[..., Any], signature: inspect.Signature, why: str) -> ConfigurationError:
    name = _display_name(fn)
    return ConfigurationError(
        f"任务函数 {name}{signature} {why}：执行器按 fn(ctx, *args, **kwargs) 调用，第一个位置参数收到的是"
        f"上下文 ctx（TaskContext），你传的参数从第二个开始；请写成 {_suggested(name, signature)}"
    )


def check_task_signature(
    fn: Callable[..., Any],
    args: tuple[Any, ...] | None = None,
    kwargs: Mapping[str, Any] | None = None,
) -> None:
    """确定是忘了 ctx 时抛 ConfigurationError。``args`` 为 None 表示登记时（还没有参数）。"""
    shape: _Shape = None if args is None else (len(args), tuple(kwargs) if kwargs else ())
    cacheable = type(fn) is types.FunctionType
    passed = _passed.get(fn) if cacheable else None
    if passed is not None and shape in passed:
        return
    _check(fn, args, kwargs)
    if cacheable:
        if passed is None:
            if len(_passed) >= _MAX_CACHED:
                _passed.clear()
            passed = _passed.setdefault(fn, set())
        passed.add(shape)


def _check(fn: Callable[..., Any], args: tuple[Any, ...] | None, kwargs: Mapping[str, Any] | None) -> None:
    signature = _signature(fn)
    if signature is None:
        return
    parameters = list(signature.parameters.values())
    positional = [p for p in parameters if p.kind in _POSITIONAL]
    takes_var_positional = any(p.kind is _P.VAR_POSITIONAL for p in parameters)
    if not positional and not takes_var_positional:
        raise _refuse(fn, signature, "没有能接收上下文的位置参数")
    if positional and positional[0].annotation is not _P.empty and _is_value_type(positional[0].annotation):
        first = positional[0]
        raise _refuse(fn, signature, f"的第一个位置参数 {first.name} 标注成了值类型（{first.annotation}）")
    if args is None:
        return
    given = dict(kwargs or {})
    try:
        signature.bind(_CONTEXT, *args, **given)
    except TypeError:
        try:
            signature.bind(*args, **given)
        except TypeError:
            return  # 别的参数错误：不是"忘了 ctx"，照旧由任务自己报
        raise _refuse(fn, signature, "收不下上下文加上你传的参数") from None


def accepts_keyword(method: Callable[..., Any], name: str) -> bool:
    """``method`` 是否接受关键字参数 ``name``（或 ``**kwargs``）。存储契约后来加的参数用它判断：直接覆盖
    公开方法的老式第三方后端没有这个参数，调用方就走老路，而不是让它抛 TypeError。"""
    try:
        parameters = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


__all__ = ["accepts_keyword", "check_task_signature"]
