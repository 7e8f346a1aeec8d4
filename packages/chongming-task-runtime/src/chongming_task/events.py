"""公开路径 ``chongming_task.events``：控制器事件钩子的事件类型（用户指南 §15.1）。

``Controller(listeners=[fn])`` / ``controller.add_listener(fn)`` 登记的监听器收到这里的事件对象。
实现与交付规则在 ``chongming_task.runtime.events``；这里只做转出。
"""

from __future__ import annotations

from chongming_task.runtime.events import (
    MAX_PENDING_EVENTS,
    Event,
    Listener,
    ProgressEvent,
    StoreErrorEvent,
    TransitionEvent,
)

__all__ = [
    "MAX_PENDING_EVENTS",
    "Event",
    "Listener",
    "ProgressEvent",
    "StoreErrorEvent",
    "TransitionEvent",
]
