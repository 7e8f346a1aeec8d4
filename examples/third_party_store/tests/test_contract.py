"""范例后端跑契约套件。

先 ``pip install -e .``，再 ``pytest tests``（或 ``python -m unittest discover tests``）。
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from chongming_task_store_jsonfile import JsonFileTaskStore

from chongming_task.testing import FakeClock
from chongming_task.testing.store_contract import StoreContract, full_snapshot


class TestJsonFileStore(StoreContract):
    def _fresh_path(self) -> Path:
        directory = Path(tempfile.mkdtemp(prefix="jsonfile-store-"))
        # 先登记删目录、后由套件登记关存储：清理按后进先出执行，存储先关、目录后删。
        self.addCleanup(shutil.rmtree, directory, ignore_errors=True)
        return directory / "tasks.json"

    def make_store(self) -> JsonFileTaskStore:
        return JsonFileTaskStore(self._fresh_path())

    def make_clocked_store(self, clock: FakeClock) -> JsonFileTaskStore:
        return JsonFileTaskStore(self._fresh_path(), clock=clock)

    # 契约之外、这个后端自己的承诺：数据落在文件里，重新打开还在。
    def test_data_survives_reopen(self) -> None:
        path = self._fresh_path()
        original = full_snapshot()
        with JsonFileTaskStore(path) as store:
            store.create(original)
            store.submit_command(original.task_id, "stop", issuer="ops")
        reopened = JsonFileTaskStore(path)
        self.addCleanup(reopened.close)
        self.assertEqual(reopened.get(original.task_id), original)
        (command,) = reopened.claim_commands("worker", lease=30)
        self.assertEqual((command.task_id, command.issuer), (original.task_id, "ops"))

    def test_from_url(self) -> None:
        path = self._fresh_path()
        store = JsonFileTaskStore.from_url(f"jsonfile://{path}")
        self.addCleanup(store.close)
        self.assertEqual(store.path, path)
