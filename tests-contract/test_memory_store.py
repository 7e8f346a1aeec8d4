"""内存存储跑契约套件：两份——注入 FakeClock 的（租约用例毫秒级完成）与真实时钟的（短租约真等）。"""

from __future__ import annotations

from collections.abc import Sequence

from chongming_task.core.records import PackedTransition, pack_transition
from chongming_task.core.storage import checks
from chongming_task.errors import ConfigurationError
from chongming_task.models import TaskSnapshot, Transition
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


class _CreatesThroughWriteThrough(InMemoryTaskStore):
    """公开的 create 改走写穿落库的入口（``_create_direct``，参数先照 create 的规矩查过）：常见形状的新任务
    存成精简的行（快照 + 历史元组，不造 _Row，见 InMemoryTaskStore.__init__ 里 ``_lean`` 的说明）。契约套件
    里的每个用例于是都在精简的行上跑一遍：第一次读写它的每个方法（get、查询、save、touch、续租、日志、
    认领、指令、prune、归档、删除）都得与完整的行给出一样的结果。"""

    def create(self, snapshot: TaskSnapshot, transitions: Sequence[Transition] = ()) -> None:
        transitions = tuple(transitions)
        if snapshot.__class__ is not TaskSnapshot:
            super().create(snapshot, transitions)
            return
        checks.check_transitions(snapshot.task_id, transitions)
        packed: tuple[PackedTransition, ...] = tuple(pack_transition(record) for record in transitions)
        self._create_direct(snapshot, packed)

    def _create_direct(self, snapshot: TaskSnapshot, packed: tuple[PackedTransition, ...]) -> None:
        # 子类改了 create 却不改 _create_direct 时，TaskStore 会把 _create_direct 换回基类的（见 contract.py）
        super()._create_direct(snapshot, packed)


class TestInMemoryStoreLeanRows(StoreContract):
    def make_store(self) -> InMemoryTaskStore:
        return _CreatesThroughWriteThrough()

    def make_clocked_store(self, clock: FakeClock) -> InMemoryTaskStore:
        return _CreatesThroughWriteThrough(clock=clock)


def test_a_write_through_create_keeps_no_row_object_until_the_task_is_written_again() -> None:
    store = _CreatesThroughWriteThrough()
    store.create(snap("a"))
    assert "a" in store._lean and "a" not in store._rows  # 精简的行
    assert store.get("a") is store._lean["a"]  # get 不为它造 _Row
    store.history("a")  # 其余的读写先把它换成 _Row
    assert "a" in store._rows and not store._lean and not store._lean_history


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
