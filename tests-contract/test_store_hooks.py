"""TaskStore 的"公开方法检查一次 → 后端钩子"：钩子是抽象的；直接覆盖公开方法的旧式后端照常可用。

旧式后端在这里是一个把 25 个公开方法全部转交给内存存储的包装类：它一个钩子也不实现，
照样能实例化、照样通过完整的契约套件（存储指南第 1 节"兼容"一段）。
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from chongming_task import Controller
from chongming_task.core.records import pack_transition
from chongming_task.core.state_machine import StateMachine
from chongming_task.core.storage.contract import TaskStore
from chongming_task.errors import ConfigurationError, DuplicateTaskId
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.states import TaskStatus
from chongming_task.storage import LogLine, SaveRequest
from chongming_task.stores.memory import InMemoryTaskStore
from chongming_task.testing import FakeClock
from chongming_task.testing.contract._base import T0, walk
from chongming_task.testing.store_contract import StoreContract, snap

HOOKS = {
    "save": "_save",
    "touch": "_touch",
    "submit_command": "_submit_command",
    "claim_commands": "_claim_commands",
}


def _forward(name: str) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)

    method.__name__ = name
    return method


def _init(self: Any, inner: InMemoryTaskStore) -> None:
    self.inner = inner


# claim_queued（持久任务的认领）是可选能力：钩子不是抽象的（没实现的后端照常能用，只是不能跑 worker），
# 旧式后端同样直接覆盖公开方法。
OPTIONAL = {"claim_queued"}
_PUBLIC = sorted(
    {name for name in TaskStore.__abstractmethods__ if not name.startswith("_")} | set(HOOKS) | OPTIONAL
)
LegacyStore: type[TaskStore] = type(
    "LegacyStore", (TaskStore,), {"__init__": _init, **{name: _forward(name) for name in _PUBLIC}}
)


def test_hooks_are_abstract_and_the_checked_public_methods_are_not() -> None:
    abstract = TaskStore.__abstractmethods__
    assert set(HOOKS.values()) <= abstract
    assert not set(HOOKS) & abstract


def test_a_store_with_neither_the_public_method_nor_its_hook_cannot_be_instantiated() -> None:
    namespace = {name: _forward(name) for name in _PUBLIC if name != "claim_commands"}
    incomplete: type[Any] = type("Incomplete", (TaskStore,), {"__init__": _init, **namespace})
    with pytest.raises(TypeError, match="_claim_commands"):
        incomplete(InMemoryTaskStore())


def test_a_legacy_store_is_not_asked_for_hooks_and_its_public_methods_are_used() -> None:
    store: Any = LegacyStore(InMemoryTaskStore())  # type: ignore[call-arg]
    store.create(snap("t1"))
    command = store.submit_command("t1", "pause", issuer="ops")
    assert [c.command_id for c in store.claim_commands("me", lease=30)] == [command.command_id]
    # 基类的公开方法没被调用，所以基类填进去的钩子只会说明原因，不会被悄悄用到。
    with pytest.raises(NotImplementedError, match="直接覆盖了 save"):
        store._save(None)


class TestLegacyStyleStore(StoreContract):
    """旧式后端（只覆盖公开方法）通过完整的契约套件。"""

    def make_store(self) -> TaskStore:
        return LegacyStore(InMemoryTaskStore())  # type: ignore[call-arg]

    def make_clocked_store(self, clock: FakeClock) -> TaskStore:
        return LegacyStore(InMemoryTaskStore(clock=clock))  # type: ignore[call-arg]


def test_a_subclass_that_overrides_save_still_sees_every_write_through_write() -> None:
    """内存存储的写穿入口 ``_save_direct`` 不经公开的 save：子类改了 save 或 _save（注入故障、记日志）却没改
    写穿入口时，基类退回默认实现，写穿照样经过子类的 save。"""
    seen: list[int] = []

    class CountingSave(InMemoryTaskStore):
        def save(self, snapshot: TaskSnapshot, **kwargs: Any) -> None:
            seen.append(snapshot.status_version)
            super().save(snapshot, **kwargs)

    class CountingHook(InMemoryTaskStore):
        def _save(self, request: SaveRequest) -> None:
            seen.append(-request.snapshot.status_version)
            super()._save(request)

    assert InMemoryTaskStore._save_direct is not TaskStore._save_direct  # 内存存储有自己的快路径
    assert InMemoryTaskStore._save_next is not TaskStore._save_next
    for cls in (CountingSave, CountingHook):
        assert cls._save_direct is TaskStore._save_direct
        assert cls._save_next is TaskStore._save_next
        store = cls()
        base = snap(f"sub-{cls.__name__}")
        store.create(base)
        queued, records = walk(base, TaskStatus.QUEUED)
        store._save_direct(queued, 0, tuple(records))
        running, more = walk(queued, TaskStatus.STARTING)
        store._save_next(running, more[0], pack_transition(more[0]))  # 写穿每次迁移走的入口
    assert seen == [1, 2, -1, -2]


def test_a_subclass_that_overrides_the_direct_save_still_sees_the_next_save() -> None:
    """子类只改了写穿入口 ``_save_direct``（不改 save）时，写穿每次迁移走的 ``_save_next`` 也退回默认实现、
    经过它：否则内存存储的 ``_save_next`` 会绕过子类加的料。"""
    seen: list[int] = []

    class CountingDirect(InMemoryTaskStore):
        def _save_direct(
            self, snapshot: TaskSnapshot, expect_version: int, transitions: Sequence[Transition]
        ) -> None:
            seen.append(snapshot.status_version)
            super()._save_direct(snapshot, expect_version, transitions)

    assert CountingDirect._save_next is TaskStore._save_next
    controller = Controller(store=CountingDirect(), owner="direct")
    controller.register("work", lambda ctx: "ok")
    try:
        assert controller.submit("work", task_id="direct").wait(timeout=5).status is TaskStatus.SUCCEEDED
    finally:
        controller.close()
    assert seen == [2, 3, 4]  # starting、running、succeeded 三次写穿都经过它


def test_a_mixin_placed_before_the_store_that_overrides_save_or_create_is_not_bypassed() -> None:
    """改写 save / create 的也可以是排在具体存储之前、本身不是 TaskStore 的混入类
    （``class Faulty(FaultMixin, InMemoryTaskStore)``，故障注入与记日志的常见写法）：组合出来的类自己的
    ``__dict__`` 里没有 save，但写穿的快路径同样不能绕过混入类。"""
    seen: list[str] = []

    class CountingMixin:
        def save(self, snapshot: TaskSnapshot, **kwargs: Any) -> None:
            seen.append(f"save v{snapshot.status_version}")
            super().save(snapshot, **kwargs)  # type: ignore[misc]

        def create(self, snapshot: TaskSnapshot, transitions: Sequence[Transition] = ()) -> None:
            seen.append(f"create {snapshot.task_id}")
            super().create(snapshot, transitions)  # type: ignore[misc]

    class Counted(CountingMixin, InMemoryTaskStore):
        pass

    assert Counted._save_direct is TaskStore._save_direct
    assert Counted._create_direct is TaskStore._create_direct
    controller = Controller(store=Counted(), owner="a")
    controller.register("work", lambda ctx: "ok")
    try:
        run = controller.submit("work", task_id="mixin")
        assert run.wait(timeout=5).status is TaskStatus.SUCCEEDED
    finally:
        controller.close()
    assert seen[0] == "create mixin"
    assert any(entry.startswith("save v") for entry in seen[1:])  # starting / running / 终态都经过混入类


def test_a_subclass_that_overrides_append_logs_still_sees_the_trusted_log_lines() -> None:
    """运行时写日志走受信入口 ``_append_log_lines``（内存存储有自己的快路径，不经公开的 append_logs）：
    子类改了 append_logs（注入故障、过滤、记日志）却没改受信入口时，基类退回默认实现，
    受信入口的行照样经过子类。"""
    seen: list[str] = []

    class CountingLogs(InMemoryTaskStore):
        def append_logs(self, lines: Sequence[LogLine]) -> None:
            seen.extend(line.message for line in lines)
            super().append_logs(lines)

    assert InMemoryTaskStore._append_log_lines is not TaskStore._append_log_lines  # 内存存储有自己的快路径
    assert CountingLogs._append_log_lines is TaskStore._append_log_lines
    store = CountingLogs()
    store.create(snap("sub-logs"))
    line = LogLine(
        task_id="sub-logs", attempt=1, at=T0, level="INFO", message="经过子类", writer="w", writer_seq=1
    )
    store._append_log_lines([line])
    assert seen == ["经过子类"]
    assert [g.message for g in store.read_logs("sub-logs")] == ["经过子类"]


def test_starts_on_claim_only_when_no_subclass_rewrote_a_step_the_combined_write_bypasses() -> None:
    """worker 只在合并的 claim_queued(start=...) 是一次写、又不会绕过子类加了料的 _claim_queued / save
    时用它。"""

    class CountsSaves(InMemoryTaskStore):
        def save(self, snapshot: TaskSnapshot, **kwargs: Any) -> None:
            super().save(snapshot, **kwargs)

    class CountsClaims(InMemoryTaskStore):
        def _claim_queued(self, request: Any) -> list[TaskSnapshot]:
            return super()._claim_queued(request)

    class Combined(CountsSaves):
        def _claim_and_start(self, request: Any, start: Any) -> list[TaskSnapshot]:
            return super()._claim_and_start(request, start)

    assert InMemoryTaskStore().starts_on_claim
    assert Combined().starts_on_claim, "合并实现本身就在加了料的那层之下：它知道自己绕过了什么"
    assert not CountsSaves().starts_on_claim
    assert not CountsClaims().starts_on_claim
    legacy: Any = LegacyStore(InMemoryTaskStore())  # type: ignore[call-arg]
    assert not legacy.starts_on_claim, "只实现了旧认领的后端：默认实现是两次写，worker 照旧分开写"


def test_a_claim_start_save_reaches_the_store_through_an_implementation_that_does_not_know_it() -> None:
    """``ClaimStart.save`` 只交给自己声明了 ``claim_start_saves`` 的 ``_claim_and_start``：子类覆盖了合并
    那一环（自己拼、不调用父类）却不认得 save 时，继承来的声明不算，基类先单独 save 再调它——终态不会被
    静默丢掉；worker 也只在声明了的存储上把终态并进认领（``saves_on_claim``）。"""
    from chongming_task.core.storage.claiming import ClaimStart
    from chongming_task.testing.contract.durable import durable

    seen: list[object] = []

    class OwnClaimStart(InMemoryTaskStore):
        def _claim_and_start(self, request: Any, start: ClaimStart) -> list[TaskSnapshot]:
            seen.append(start.save)
            return []  # 不认得 start.save：交给它的话 save 就丢了

    class Declared(InMemoryTaskStore):
        claim_start_saves = True

        def _claim_and_start(self, request: Any, start: ClaimStart) -> list[TaskSnapshot]:
            return super()._claim_and_start(request, start)

    assert InMemoryTaskStore().saves_on_claim
    assert Declared().saves_on_claim
    store = OwnClaimStart()
    assert store.starts_on_claim and not store.saves_on_claim
    legacy: Any = LegacyStore(InMemoryTaskStore())  # type: ignore[call-arg]
    assert not legacy.saves_on_claim
    store.create(durable("d", status=TaskStatus.RUNNING, status_version=3, owner="w"))
    running = store.get("d")
    assert running is not None
    done, records = walk(running, TaskStatus.SUCCEEDED)
    start = ClaimStart(at=T0, save=SaveRequest(done, 3, tuple(records)))
    assert store.claim_queued("w", names=["contract-task"], limit=1, lease_until=T0, start=start) == []
    assert seen == [None], "不认得 save 的实现收到的是不带 save 的 ClaimStart"
    stored = store.get("d")
    assert stored is not None and stored.status is TaskStatus.SUCCEEDED, "save 由基类先单独写下"


def test_a_subclass_that_overrides_create_still_sees_every_write_through_create() -> None:
    """写穿落库新任务走 ``_create_direct``（内存存储直接收下状态机的紧凑历史，不经公开的 create）：子类改了
    create 却没改这个入口时，基类退回默认实现——提交照样经过子类的 create，收到的是 Transition。"""
    seen: list[tuple[str, list[Transition]]] = []

    class CountingCreate(InMemoryTaskStore):
        def create(self, snapshot: TaskSnapshot, transitions: Sequence[Transition] = ()) -> None:
            seen.append((snapshot.task_id, list(transitions)))
            super().create(snapshot, transitions)

    assert InMemoryTaskStore._create_direct is not TaskStore._create_direct  # 内存存储有自己的快路径
    assert CountingCreate._create_direct is TaskStore._create_direct
    store = CountingCreate()
    controller = Controller(store=store, owner="a")
    controller.register("work", lambda ctx: "ok")
    try:
        run = controller.submit("work", task_id="sub-create")
        assert run.wait(timeout=5).status is TaskStatus.SUCCEEDED
    finally:
        controller.close()
    assert [
        (task_id, [(t.from_status, t.to_status, t.version) for t in records]) for task_id, records in seen
    ] == [("sub-create", [(TaskStatus.PENDING, TaskStatus.QUEUED, 1)])]


def test_the_memory_stores_direct_create_stores_what_create_stores_and_refuses_what_it_refuses() -> None:
    """``_create_direct`` 与 ``create(snapshot, 解包的历史)`` 存下同样的快照与历史；重复 id、存不下的快照
    （绕过构造校验的 evolve）照样被拒、什么也不写。"""
    base = snap("direct")
    queued, records = walk(base, TaskStatus.QUEUED)
    machine = StateMachine.from_snapshot(queued, records)
    direct, public = InMemoryTaskStore(), InMemoryTaskStore()
    direct._create_direct(queued, machine.packed_transitions())
    public.create(queued, records)
    assert direct.get("direct") == public.get("direct") == queued
    assert direct.history("direct") == public.history("direct") == list(records)
    with pytest.raises(DuplicateTaskId):
        direct._create_direct(queued, machine.packed_transitions())
    bad = queued.evolve(task_id="bad", label="含\x00的标签")
    with pytest.raises(ConfigurationError):
        direct._create_direct(bad, ())
    assert direct.get("bad") is None
