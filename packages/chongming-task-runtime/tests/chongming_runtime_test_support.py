"""运行时测试共用的小工具（测试文件用 ``--import-mode=importlib`` 导入，彼此不能互相 import，所以放在这里；
conftest 把本目录放进了 ``sys.path``）。"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 20.0, interval: float = 0.002) -> T:
    """轮询直到 ``predicate()`` 为真，返回它的值；超时则断言失败。

    为什么只有一份：这些测试等的是另一个线程或进程把状态推进到某处。默认上限给得宽（20 秒），因为条件
    成立时立刻返回，上限只在测试本来就要失败时才被用满——在负载高的 CI 机器上，窄上限只会制造假失败。
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"条件在 {timeout:g} 秒内没有成立")
        time.sleep(interval)
