"""内存存储跑契约套件：两份——注入 FakeClock 的（租约用例毫秒级完成）与真实时钟的（短租约真等）。"""

from __future__ import annotations

from chongming_task.errors import ConfigurationError
from chongming_task.store_registry import open_store
from chongming_task.stores.memory import InMemoryTaskStore
from chongming_task.testing import FakeClock
from chongming_task.testing.store_contract import StoreContract, snap


class TestInMemoryStore(StoreContract):
    def make_store(self) -> InMemoryTaskStore:
        return InMemoryTaskStore()

    def make_clocked_store(self, clock: FakeClock) -> InMemoryTaskStore:
        return InMemoryTaskStore(clock=clock)


class TestInMemoryStoreRealClock(StoreContract):
    """不注入时钟：验证套件的"真实短租约"路径本身可用（第三方后端多半走这条路）。"""

    def make_store(self) -> InMemoryTaskStore:
        return InMemoryTaskStore()


def test_open_store_memory_url_gives_a_fresh_store_each_time() -> None:
    first = open_store("memory://")
    second = open_store("memory://")
    try:
        assert isinstance(first, InMemoryTaskStore)
        first.create(snap("only-in-first"))
        assert second.get("only-in-first") is None
    finally:
        first.close()
        second.close()


def test_from_url_accepts_clock_and_rejects_paths_and_unknown_options() -> None:
    clock = FakeClock()
    store = InMemoryTaskStore.from_url("memory://", clock=clock)
    assert store.clock is clock
    store.close()
    for bad in ("memory://somewhere", "memory:///tmp/x"):
        try:
            InMemoryTaskStore.from_url(bad)
        except ConfigurationError as exc:
            assert "memory://" in str(exc)
        else:
            raise AssertionError(f"{bad} 应当被拒绝")
    try:
        InMemoryTaskStore.from_url("memory://", path="x")
    except ConfigurationError as exc:
        assert "clock" in str(exc)
    else:
        raise AssertionError("多余的参数应当被拒绝")
