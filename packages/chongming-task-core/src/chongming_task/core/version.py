"""chongming-task 的版本号，只写在这里。

门面 ``chongming_task.__version__`` 转出它；运行时（节点登记里的 ``version``）直接从这里读，
不去导入门面——门面为类型检查引用了运行时的模块，运行时再回头导入门面就成了一个导入环。
"""

from __future__ import annotations

__version__ = "0.1.0"

NODE_FEATURE_LEVEL = 1
"""节点登记（``nodes`` 表的 ``info.feature_level``）里写的"这份代码能承受哪些原地升级"的等级。

为什么要它：发布之前版本号一直是 0.1.0，区分不了新旧进程。有的原地升级不升 schema 版本，却会让
**正在运行的旧代码**出错——Postgres 把状态列换成域类型（pg16）之后，旧进程连接上已预备的读语句全部报
"cached plan must not change result type"，直到连接到龄（默认 1 小时）。可写打开的新进程在做这类升级
之前看一眼还活着的节点：有没写到这个等级的（旧代码），就先不升、告警并给出 SQL，等它们停掉再说。

* 1：能承受状态与版本列换成域类型（被换时丢掉那条连接，见 Postgres 存储的 ``_discard_if_stale_plans``）。

以后每加一种会让运行中的旧代码出错的原地升级，就把它加一，并在升级处要求活节点都到了新等级。
"""

__all__ = ["NODE_FEATURE_LEVEL", "__version__"]
