"""给任务作者与存储实现者的测试工具：FakeClock、make_context、StoreContract。"""

from chongming_task.testing.context import TestHandle, make_context
from chongming_task.testing.fake_clock import FakeClock

__all__ = ["FakeClock", "TestHandle", "make_context"]
