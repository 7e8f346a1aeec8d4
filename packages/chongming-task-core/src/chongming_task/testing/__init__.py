"""给任务作者与存储实现者的测试工具：FakeClock、make_context、StoreContract。"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from chongming_task.testing.context import TestHandle, make_context
from chongming_task.testing.fake_clock import FakeClock

if TYPE_CHECKING:
    from chongming_task.testing.store_contract import StoreContract

__all__ = ["FakeClock", "StoreContract", "TestHandle", "make_context"]


def __getattr__(name: str) -> Any:
    # StoreContract 按需导入：只写任务、不写存储后端的人 import chongming_task.testing 时，
    # 不必加载一千多行契约用例（以及 unittest）。
    if name == "StoreContract":
        from chongming_task.testing.store_contract import StoreContract

        return StoreContract
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
