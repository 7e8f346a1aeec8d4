"""参数类型：校验失败时给中文说明（click 内置类型的报错是英文）。"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from chongming_task.core.json_depth import loads_bounded
from chongming_task.core.storage.checks import check_json_value
from chongming_task.errors import ConfigurationError
from chongming_task.states import TaskStatus

if TYPE_CHECKING:
    # click 8.5 起 ParamType 是泛型；运行时不下标，老版本 click（>= 8.1）照样能用。
    _ParamType = click.ParamType[Any, Any]
else:
    _ParamType = click.ParamType

_F = TypeVar("_F", bound=Callable[..., Any])

# 整数选项的默认范围：64 位有符号整数。存储把整数存进 BIGINT / SQLite INTEGER，超出这个范围的数
# 要么写不进去、要么在驱动里溢出（issue 22.7）——在命令行就拒绝，而不是让它变成"内部错误"。
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# 秒数选项的上限：一年。更大的值（1e308）会让 monotonic() + timeout 这类计算溢出或永远不到期。
MAX_SECONDS = 365 * 24 * 3600.0


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "…"


class IntType(_ParamType):
    """整数，带上下限（默认是 64 位有符号整数的范围）。"""

    name = "整数"

    def __init__(self, minimum: int | None = None, maximum: int = INT64_MAX) -> None:
        self.minimum = minimum
        self.maximum = maximum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            text = str(value).strip()
            # 超过 30 位的数字不交给 int()：它一定越界，而 int() 对上千位的输入既慢又有位数上限。
            digits = text.lstrip("+-")
            if len(digits) > 30 and digits.isascii() and digits.isdigit():
                self.fail(f"{_short(value)} 超出范围：{self._range()}", param, ctx)
            try:
                number = int(text)
            except ValueError:
                self.fail(f"{_short(value)} 不是整数", param, ctx)
        if self.minimum is not None and number < self.minimum:
            self.fail(f"必须 >= {self.minimum}，收到 {number}", param, ctx)
        if number < INT64_MIN or number > self.maximum:
            self.fail(f"{number} 超出范围：{self._range()}", param, ctx)
        return number

    def _range(self) -> str:
        low = INT64_MIN if self.minimum is None else self.minimum
        return f"必须在 {low} 到 {self.maximum} 之间"


class SecondsType(_ParamType):
    """正的、有限的秒数（可带小数），不超过一年。"""

    name = "秒数"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError, OverflowError):
            self.fail(f"{_short(value)} 不是秒数（例如 2 或 0.5）", param, ctx)
        if not math.isfinite(seconds) or seconds <= 0:
            self.fail(f"必须是正的秒数（有限值，例如 2 或 0.5），收到 {_short(value)}", param, ctx)
        if seconds > MAX_SECONDS:
            self.fail(f"最多 {MAX_SECONDS:g} 秒（一年），收到 {_short(value)}", param, ctx)
        return seconds


class ChoiceType(_ParamType):
    """从固定集合里选一个；报错时列出全部可选值。"""

    name = "选项"

    def __init__(self, choices: list[str]) -> None:
        self.choices = choices

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return "[" + "|".join(self.choices) + "]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip().lower()
        if text not in self.choices:
            self.fail(f"{_short(value)} 不是可选值；可选：{', '.join(self.choices)}", param, ctx)
        return text


class StatusType(ChoiceType):
    """任务状态名（TaskStatus 的值）。"""

    name = "状态"

    def __init__(self) -> None:
        super().__init__([status.value for status in TaskStatus])

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return "STATUS"


def parse_task_argument(text: str) -> tuple[str, Any]:
    """``--arg k=v``：值能按 JSON 解析就用解析结果（数字、布尔、列表、对象），否则按原样字符串。

    想传字面量字符串 "3" 时写 ``--arg n='"3"'``。
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise click.BadParameter(f"{text!r} 应写成 名字=值，例如 --arg source=kafka://orders")
    if not key.isidentifier():
        raise click.BadParameter(f"参数名 {key!r} 不是合法的 Python 参数名")
    try:
        value: Any = loads_bounded(raw, what=f"--arg {key} 的 JSON 值")
    except ConfigurationError as exc:  # 嵌套过深：json.loads 会抛 RecursionError（issue 22.4）
        raise click.BadParameter(str(exc)) from None
    except ValueError:
        value = raw
    try:
        # 与返回值、存储同一份可存储性规则（NUL、孤立代理项、大小；用户指南 §13）：命令行参数多半会
        # 被任务原样返回或写进别处，存不下的值在提交前就说清楚，而不是任务跑完才 result_invalid。
        check_json_value(value, what=f"参数 {key} 的值")
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc)) from None
    return key, value


INT = IntType()
NON_NEGATIVE_INT = IntType(minimum=0)
POSITIVE_INT = IntType(minimum=1)
SECONDS = SecondsType()
STATUS = StatusType()
EXECUTOR = ChoiceType(["thread", "process"])
ORDER = ChoiceType(["oldest", "newest"])


def seconds_option(flag: str, default: float, help: str, *, metavar: str = "SECONDS") -> Callable[[_F], _F]:
    """有默认值的秒数选项（--help 里显示默认值）：各命令的间隔、超时选项都是这一个样子。"""
    return click.option(flag, type=SECONDS, default=default, show_default=True, metavar=metavar, help=help)


__all__ = [
    "EXECUTOR",
    "INT",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_SECONDS",
    "NON_NEGATIVE_INT",
    "ORDER",
    "POSITIVE_INT",
    "SECONDS",
    "STATUS",
    "IntType",
    "parse_task_argument",
    "seconds_option",
]
