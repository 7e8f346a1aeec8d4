"""旧模块路径（保留）：SQLite 的表结构与版本管理在私有模块 ``_schema`` 里，这里只重新导出。"""

from chongming_task.stores.sqlite._schema import *  # noqa: F403
from chongming_task.stores.sqlite._schema import __all__ as __all__
