"""契约用例：收尾：prune 只删最老的终态任务、close 之后一切调用都报 StoreError。"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from chongming_task.errors import (
    ConfigurationError,
    StoreError,
)
from chongming_task.models import Progress
from chongming_task.testing.contract._base import (
    ContractBase,
    S,
    node,
    snap,
    step,
)


class HousekeepingCases(ContractBase):
    """prune 与 close。"""

    __test__: ClassVar[bool] = False

    # ===============================================================================================
    # prune
    # ===============================================================================================

    def test_prune_keeps_newest_terminal_tasks(self) -> None:
        store = self._prune_fixture()
        self.assertEqual(store.prune(keep_terminal=2), 3)
        terminal = {s.task_id for s in store.query() if s.is_terminal}
        self.assertEqual(terminal, {"term-0", "term-1"}, "按 finished_at 保留最新的 N 个")
        self.assertEqual(store.prune(keep_terminal=2), 0)
        self.assertEqual(store.stats().total, 8)

    def test_prune_never_deletes_non_terminal_tasks(self) -> None:
        store = self._prune_fixture()
        self.assertEqual(store.prune(keep_terminal=0), 5)
        remaining = {s.task_id for s in store.query()}
        self.assertEqual(remaining, {f"live-{i}" for i in range(6)})
        self.assertEqual(store.stats().unfinished, 6)

    def test_prune_removes_history_and_commands_of_pruned_tasks(self) -> None:
        store = self._prune_fixture()
        kept_history = store.history("term-0")
        self.assertTrue(kept_history)
        store.prune(keep_terminal=1)
        for i in range(1, 5):
            self.assertIsNone(store.get(f"term-{i}"))
            self.assertEqual(store.history(f"term-{i}"), [], "被删任务的历史也要删掉")
        self.assertEqual(store.history("term-0"), kept_history)
        claimed = {c.task_id for c in store.claim_commands("w", lease=60)}
        self.assertEqual(claimed, {"term-0"} | {f"live-{i}" for i in range(6)}, "被删任务的指令也要删掉")

    def test_prune_rejects_negative_keep(self) -> None:
        store = self._prune_fixture()
        with self.assertRaises(ConfigurationError):
            store.prune(keep_terminal=-1)
        self.assertEqual(store.stats().total, 11)

    # ===============================================================================================
    # close
    # ===============================================================================================

    def test_close_twice_is_fine(self) -> None:
        store = self.open_store()
        store.create(snap("cl"))
        store.close()
        store.close()

    def test_calls_after_close_raise_store_error(self) -> None:
        store = self.open_store()
        base = snap("closed")
        store.create(base)
        command = store.submit_command("closed", "stop")
        store.close()
        queued, record = step(base, S.QUEUED)
        calls: list[tuple[str, Callable[[], object]]] = [
            ("create", lambda: store.create(snap("new"))),
            ("save", lambda: store.save(queued, expect_version=0, transitions=[record])),
            ("get", lambda: store.get("closed")),
            ("query", lambda: store.query()),
            ("stats", lambda: store.stats()),
            ("bucket_counts", lambda: store.bucket_counts()),
            ("append", lambda: store.append([record])),
            ("history", lambda: store.history("closed")),
            ("touch", lambda: store.touch("closed", progress=Progress(done=1))),
            ("touch_many", lambda: store.touch_many([("closed", {"progress": Progress(done=1)})])),
            ("submit_command", lambda: store.submit_command("closed", "stop")),
            ("claim_commands", lambda: store.claim_commands("w", lease=60)),
            ("complete_command", lambda: store.complete_command(command.command_id, "w")),
            ("release_command", lambda: store.release_command(command.command_id, "w")),
            ("prune", lambda: store.prune(keep_terminal=0)),
            ("publish_node", lambda: store.publish_node(node("node-a"))),
            ("list_nodes", lambda: store.list_nodes()),
            ("remove_node", lambda: store.remove_node("node-a")),
        ]
        for name, call in calls:
            with self.subTest(method=name), self.assertRaises(StoreError):
                call()

    def test_context_manager_closes_the_store(self) -> None:
        store = self.open_store()
        with store as entered:
            self.assertIs(entered, store)
            store.create(snap("ctx"))
        with self.assertRaises(StoreError):
            store.get("ctx")
