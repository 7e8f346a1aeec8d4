"""数值参数的唯一检查点：公开 API 的每个数字参数（秒数、次数、额度、优先级……）都经这里。

为什么集中在一处：数字的坏法是固定的几种——``bool`` 冒充整数、NaN（与任何数比较都是 False，所以
``value <= 0`` 这种检查放过它）、inf 与 ``1e308``（稍后在 ``timedelta`` / ``Event.wait`` 里变成
``OverflowError``）、负数、``2**70`` 这种存储放不下的整数。每个入口各写一遍，总有一处漏掉其中一种，
漏掉的那种就会以原始异常的形式出现在调用方面前，或者更糟：NaN 的轮询间隔让指令永远不被认领、
让后台循环空转占满 CPU。这里在 API 边界上把它们统一拒绝成一行说明允许范围的 ConfigurationError。

上限的取法：时长最多 10 年（``MAX_SECONDS``）——再长的超时、租约、间隔都没有意义，而且
``now + timedelta(seconds=...)`` 与 ``threading.Event.wait`` 都还远在溢出之前；整数上限是有符号 32 位
（``MAX_INT32``，优先级与次数），任何后端的整数列都放得下。
"""

from __future__ import annotations

import math
from typing import TypedDict, Unpack, overload

from chongming_task.errors import ConfigurationError

MAX_SECONDS = 10 * 365 * 24 * 3600
"""任何时长参数（超时、租约、间隔、等待、退避）的上限：10 年，单位秒。"""

MAX_INT32 = 2**31 - 1
"""整数参数（优先级、次数、额度）的默认上限：任何后端的整数列都放得下。"""

MIN_INT32 = -(2**31)


def _fmt(bound: float) -> str:
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def range_text(low: float | None, high: float | None, *, low_open: bool = False, unit: str = "") -> str:
    """把允许范围写成一句中文（报错消息与文档用同一种说法），例如"0.1 到 315360000 秒之间"。"""
    suffix = f" {unit}" if unit else " "
    if low is not None and high is not None:
        if low_open:
            return f"大于 {_fmt(low)}{suffix.rstrip()}、不超过 {_fmt(high)}{suffix}"
        return f"{_fmt(low)} 到 {_fmt(high)}{suffix}之间"
    if low is not None:
        return f"大于 {_fmt(low)}{suffix}" if low_open else f"不小于 {_fmt(low)}{suffix}"
    if high is not None:
        return f"不超过 {_fmt(high)}{suffix}"
    return ""


def _short_repr(value: object) -> str:
    """报错里回显收到的值，但不让 10**400 这种值把一行消息撑成几百个字符。"""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


class NumberRules(TypedDict, total=False):
    """``check_number`` 的规则关键字（都可省）：写成一份，两个重载与实现共用，不各抄一遍。"""

    low: float | None
    high: float | None
    low_open: bool
    integer: bool
    unit: str
    hint: str


@overload
def check_number(
    name: str, value: object, *, allow_none: bool, **rules: Unpack[NumberRules]
) -> float | None: ...


@overload
def check_number(name: str, value: object, **rules: Unpack[NumberRules]) -> float: ...


def check_number(
    name: str, value: object, *, allow_none: bool = False, **rules: Unpack[NumberRules]
) -> float | None:
    """``value`` 必须是有限的数（``integer=True`` 时是整数），落在 [low, high]（``low_open`` 时下界不含）。

    返回规范化后的值（浮点参数转成 float，整数参数原样）；``allow_none`` 且值为 None 时返回 None。
    ``bool`` 永远不算数字（``True`` 冒充 1 是常见的调用错误）。``hint`` 接在消息末尾
    （例如"不想限制请传 None"）。
    """
    if value is None and allow_none:
        return None
    low, high, low_open = rules.get("low"), rules.get("high"), rules.get("low_open", False)
    integer, unit, hint = rules.get("integer", False), rules.get("unit", ""), rules.get("hint", "")
    kind = "整数" if integer else "有限数"
    allowed = range_text(low, high, low_open=low_open, unit=unit)
    if not allowed:
        message = f"{name} 必须是{kind}，收到 {_short_repr(value)}"
    elif allowed.endswith("之间"):
        message = f"{name} 必须是 {allowed}的{kind}，收到 {_short_repr(value)}"
    else:  # "大于 0 秒、不超过 … 秒" / "不小于 0" 这类比较短语直接跟在"必须"后面
        message = f"{name} 必须{allowed.rstrip()}（{kind}），收到 {_short_repr(value)}"
    if hint:
        message = f"{message}；{hint}"
    if isinstance(value, bool):
        raise ConfigurationError(message)
    if integer:
        if not isinstance(value, int):
            raise ConfigurationError(message)
        number: float = value
    else:
        if not isinstance(value, (int, float)):
            raise ConfigurationError(message)
        # 大整数转 float 可能溢出（10**400）：按"超出范围"报，不让 OverflowError 漏出去。
        try:
            number = float(value)
        except OverflowError:
            raise ConfigurationError(message) from None
        if not math.isfinite(number):
            raise ConfigurationError(message)
    if low is not None and (number <= low if low_open else number < low):
        raise ConfigurationError(message)
    if high is not None and number > high:
        raise ConfigurationError(message)
    return number


@overload
def check_seconds(
    name: str, value: object, *, low: float = ..., low_open: bool = ..., hint: str = ..., allow_none: bool
) -> float | None: ...


@overload
def check_seconds(
    name: str, value: object, *, low: float = ..., low_open: bool = ..., hint: str = ...
) -> float: ...


def check_seconds(
    name: str,
    value: object,
    *,
    low: float = 0.0,
    low_open: bool = True,
    hint: str = "",
    allow_none: bool = False,
) -> float | None:
    """时长参数：有限的秒数，默认要求 > 0，上限 ``MAX_SECONDS``（10 年）。"""
    return check_number(
        name, value, low=low, high=MAX_SECONDS, low_open=low_open, unit="秒", hint=hint, allow_none=allow_none
    )


def check_int(name: str, value: object, *, low: int | None = None, high: int | None = MAX_INT32) -> int:
    """整数参数（次数、额度、优先级）：真正的 int（不是 bool），落在 [low, high]。"""
    check_number(name, value, low=low, high=high, integer=True)
    assert isinstance(value, int)
    return value


__all__ = [
    "MAX_INT32",
    "MAX_SECONDS",
    "MIN_INT32",
    "NumberRules",
    "check_int",
    "check_number",
    "check_seconds",
    "range_text",
]
