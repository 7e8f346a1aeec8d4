"""契约用例：迁移历史：append 按 (task_id, version) 幂等、按版本排序、跨任务的批量追加。"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from chongming_task.errors import (
    TaskNotFound,
)
from chongming_task.testing.contract._base import (
    ContractBase,
    S,
    snap,
    walk,
)


class HistoryCases(ContractBase):
    """迁移历史。"""

    __test__: ClassVar[bool] = False

    # ===============================================================================================
    # history
    # ===============================================================================================

    def test_append_is_idempotent_on_task_and_version(self) -> None:
        store = self.open_store()
        base = snap("ap")
        store.create(base)
        _, records = walk(base, S.QUEUED, S.STARTING)
        store.append(records)
        store.append(records)
        store.append(records[:1])
        duplicate = dataclasses.replace(records[0], reason="重放的另一份", actor="someone-else")
        store.append([duplicate])
        self.assertEqual(
            store.history("ap"), records, "已有 (task_id, version) 的记录必须被忽略，而不是覆盖或重复"
        )

    def test_history_is_ordered_by_version(self) -> None:
        store = self.open_store()
        base = snap("order")
        store.create(base)
        _, records = walk(base, S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED)
        store.append([records[2]])
        store.append([records[0], records[3]])
        store.append([records[1]])
        self.assertEqual(store.history("order"), records)

    def test_append_batch_spanning_tasks(self) -> None:
        store = self.open_store()
        store.create(snap("x"))
        store.create(snap("y"))
        _, rx = walk(snap("x"), S.QUEUED)
        _, ry = walk(snap("y"), S.QUEUED, S.CANCELLED)
        store.append([ry[1], rx[0], ry[0]])
        self.assertEqual(store.history("x"), rx)
        self.assertEqual(store.history("y"), ry)

    def test_append_for_unknown_task_raises_task_not_found(self) -> None:
        store = self.open_store()
        store.create(snap("known"))
        _, known = walk(snap("known"), S.QUEUED)
        _, ghost = walk(snap("ghost"), S.QUEUED)
        with self.assertRaises(TaskNotFound):
            store.append([*known, *ghost])
        self.assertEqual(store.history("ghost"), [])
        self.assertEqual(store.history("known"), [], "含未知任务的一批整批不写")

    def test_history_of_unknown_task_is_empty(self) -> None:
        store = self.open_store()
        self.assertEqual(store.history("nobody"), [])
