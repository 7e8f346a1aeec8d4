"""公开路径 ``chongming_task.states``：任务状态与转移表（用户指南印出的导入路径，永久有效）。

实现在 ``chongming_task.core.statuses``（生命周期的规则都在 ``chongming_task.core`` 里并排放着：
状态与转移表、触发源 ``core.triggers``、状态机 ``core.state_machine``、记录 ``core.records``）。
这里只做转出，不定义任何东西；转出的名单就是 statuses 的 ``__all__``。
"""

from __future__ import annotations

from chongming_task.core import statuses as _statuses
from chongming_task.core.statuses import *  # noqa: F403
from chongming_task.core.statuses import S as S

__all__ = list(_statuses.__all__)
