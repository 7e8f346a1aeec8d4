"""公开路径 ``chongming_task.controller``：Controller（用户指南印出的导入路径，永久有效）。

实现在 ``chongming_task.runtime.controller``（本地调度）与 ``chongming_task.runtime.store_link``
（只在有存储时才存在的那一半）。这里只做转出，不定义任何东西。
"""

from __future__ import annotations

from chongming_task.core.triggers import TRIGGER_TIMEOUT_START
from chongming_task.runtime.controller import (
    NOTIFIED_POLL_INTERVAL,
    SUBMIT_KEYWORDS,
    Controller,
    Submit,
    default_owner,
    render_table,
)

__all__ = [
    "NOTIFIED_POLL_INTERVAL",
    "SUBMIT_KEYWORDS",
    "TRIGGER_TIMEOUT_START",
    "Controller",
    "Submit",
    "default_owner",
    "render_table",
]
