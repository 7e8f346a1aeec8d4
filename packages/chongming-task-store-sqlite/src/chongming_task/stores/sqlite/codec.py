"""旧模块路径（保留）：SQLite 的编解码在私有模块 ``_codec`` 里，这里只重新导出。"""

from chongming_task.stores.sqlite._codec import *  # noqa: F403
from chongming_task.stores.sqlite._codec import __all__ as __all__
