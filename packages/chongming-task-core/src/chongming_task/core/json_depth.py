"""JSON 值的嵌套深度上限（设计文档 §17）。

标准库的 ``json`` 编码器、解码器和 ``pickle`` 都是递归实现：嵌套到一千层上下就抛 ``RecursionError``。
它不是 ``TypeError`` / ``ValueError``，按"不可序列化"处理的代码接不住，曾让执行任务的线程直接死掉、
任务永远停在 ``running``、槽位泄漏。所以在交给它们之前，先用**非递归**的遍历量一下深度：

* 上限 ``MAX_JSON_DEPTH`` 远低于解释器的递归上限（也低于任何后端的嵌套限制），在线程栈、子进程、
  PostgreSQL jsonb 里都能安全往返；
* 量深度本身不递归、遇到超限立刻停，代价与一次编码同阶。
"""

from __future__ import annotations

import json
from typing import Any

from chongming_task.errors import ConfigurationError

MAX_JSON_DEPTH = 200
"""JSON 值（任务返回值、命令行 ``--arg`` 的 JSON、指令 payload）允许的最大嵌套层数。"""


def json_depth_exceeds(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """``value`` 的容器嵌套是否超过 ``limit`` 层（标量 0 层，``[]`` 1 层）。非递归，超限即停。"""
    if not isinstance(value, _CONTAINERS):
        return False
    # 栈里只放容器（连同它所在的层数）：标量在取出它的父容器时就地略过，不为每个标量造一个元组、
    # 入栈再出栈——JSON 值（配方、返回值）大半是标量，这样量一遍约快一倍（enqueue() 每个任务量三次）。
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        depth += 1
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, _CONTAINERS):
                stack.append((child, depth))
    return False


_CONTAINERS = (dict, list, tuple)


def check_json_depth(value: Any, *, what: str, limit: int = MAX_JSON_DEPTH) -> None:
    """嵌套超过 ``limit`` 层时抛 ConfigurationError（一行中文，说明怎么改）。"""
    if json_depth_exceeds(value, limit):
        raise ConfigurationError(f"{what} 嵌套太深（超过 {limit} 层）：请把它摊平，或存成文件只传路径")


def loads_bounded(text: str, *, what: str, limit: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads``，但嵌套过深时抛 ConfigurationError 而不是 RecursionError。

    其他解析错误（ValueError）原样抛出，调用方照旧按"不是 JSON"处理。
    """
    try:
        value = json.loads(text)
    except RecursionError:
        raise ConfigurationError(
            f"{what} 嵌套太深（超过 {limit} 层）：请把它摊平，或存成文件只传路径"
        ) from None
    check_json_depth(value, what=what, limit=limit)
    return value


__all__ = ["MAX_JSON_DEPTH", "check_json_depth", "json_depth_exceeds", "loads_bounded"]
