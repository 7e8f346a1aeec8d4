"""公开路径 ``chongming_task.models``：快照、迁移记录、失败、进度、结果（永久有效的导入路径）。

实现在 ``chongming_task.core.records``。这里只做转出（连同存储后端会用到的几个内部辅助名），
不定义任何东西；转出的名单就是 records 的 ``__all__``，不另抄一份。
"""

from __future__ import annotations

from chongming_task.core import records as _records
from chongming_task.core.records import *  # noqa: F403

# 存储后端与旧代码用到的内部辅助名，照旧可从这里导入（``as`` 形式即显式转出）。
from chongming_task.core.records import _DATETIME_FIELDS as _DATETIME_FIELDS
from chongming_task.core.records import _OPTIONAL_TEXT_FIELDS as _OPTIONAL_TEXT_FIELDS
from chongming_task.core.records import _check_number as _check_number
from chongming_task.core.records import _dt_from_text as _dt_from_text
from chongming_task.core.records import _dt_to_text as _dt_to_text
from chongming_task.core.records import _format_amount as _format_amount

__all__ = list(_records.__all__)
