"""chongming-task 的版本号，只写在这里。

门面 ``chongming_task.__version__`` 转出它；运行时（节点登记里的 ``version``）直接从这里读，
不去导入门面——门面为类型检查引用了运行时的模块，运行时再回头导入门面就成了一个导入环。
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
