"""StoreContract：每个 TaskStore 后端都必须通过的契约套件。

用法（pytest 与 unittest 都能跑，本模块不依赖 pytest）::

    from chongming_task.testing.store_contract import StoreContract


    class TestMyStore(StoreContract):
        def make_store(self):
            return MyStore(...)

约定：

* ``make_store()`` 每次调用都必须返回一个**全新的空存储**。每个用例结束时套件会关闭它
  （``addCleanup``），清理数据库文件之类的事请在你自己的 ``addCleanup`` / ``tearDown`` 里做。
* 可选钩子 ``make_clocked_store(clock)``：若你的存储接受注入时钟，返回一个用 ``clock`` 的新存储；
  涉及租约到期的用例就用 FakeClock 推进时间，毫秒级完成。返回 None（默认）时这些用例改用真实的
  短租约，真实等待总计不到 2 秒。
* 基类本身带 ``__test__ = False``，pytest 不会收集它；直接用 unittest 运行基类时整体跳过。
  子类自动恢复收集。想再写一层抽象中间类，请在中间类里显式写 ``__test__ = False``。

用例按流量种类分在 ``chongming_task.testing.contract`` 的各个模块里（每个模块一个 mixin），这里
把它们组合成一个类；导入路径与类名是公开契约，模块划分不是。语义的逐条说明见
docs/store-guide.md（持久层实现指南）。
"""

from __future__ import annotations

from typing import ClassVar

from chongming_task.testing.contract._base import ContractBase, full_snapshot, node, snap, step, walk
from chongming_task.testing.contract.archive import ArchiveCases
from chongming_task.testing.contract.batches import BatchCases
from chongming_task.testing.contract.commands import CommandCases
from chongming_task.testing.contract.history import HistoryCases
from chongming_task.testing.contract.housekeeping import HousekeepingCases
from chongming_task.testing.contract.logs import LogCases
from chongming_task.testing.contract.nodes import NodeCases
from chongming_task.testing.contract.queries import QueryCases
from chongming_task.testing.contract.saves import SaveCases
from chongming_task.testing.contract.snapshots import SnapshotCases
from chongming_task.testing.contract.touch import TouchCases


class StoreContract(
    SnapshotCases,
    SaveCases,
    BatchCases,
    QueryCases,
    HistoryCases,
    TouchCases,
    CommandCases,
    NodeCases,
    HousekeepingCases,
    ArchiveCases,
    LogCases,
    ContractBase,
):
    """TaskStore 契约套件。子类实现 ``make_store()``；可选实现 ``make_clocked_store(clock)``。"""

    __test__: ClassVar[bool] = False


__all__ = ["StoreContract", "full_snapshot", "node", "snap", "step", "walk"]
