"""契约套件自己的测试：故意做坏的存储必须被它抓住。

每个变种都是 InMemoryTaskStore 的子类，只改坏一处（正是真实后端最容易写错的那几处）。我们用
unittest 的 loader / runner 对一个动态生成的 StoreContract 子类跑完整套件，断言指定的用例失败。
同一套路先跑一遍未改坏的内存存储，证明失败确实来自变种而不是跑法本身。
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import threading
import unittest
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from chongming_task.core.records import pack_transition
from chongming_task.core.storage import _base_checks
from chongming_task.core.storage import checks as memory_checks
from chongming_task.core.storage.claiming import ClaimStart, QueuedClaim, claimable
from chongming_task.errors import ConcurrencyConflict, TaskError
from chongming_task.models import Progress, TaskSnapshot, Transition
from chongming_task.states import TaskStatus
from chongming_task.storage import ClaimRequest, LogLine, NodeRecord, SaveRequest, TaskQuery, TaskStore
from chongming_task.stores.memory import InMemoryTaskStore
from chongming_task.testing import FakeClock
from chongming_task.testing.store_contract import StoreContract


class TouchBumpsVersion(InMemoryTaskStore):
    """touch 顺手把 status_version 加一：进度上报会与状态写入持续冲突。"""

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        found = super().touch(
            task_id,
            progress=progress,
            heartbeat_at=heartbeat_at,
            lease_owner=lease_owner,
            lease_until=lease_until,
        )
        if found:
            with self._lock:
                row = self._rows[task_id]
                row.snapshot = row.snapshot.evolve(status_version=row.snapshot.status_version + 1)
        return found


class WriteThenCheckSave(InMemoryTaskStore):
    """save 先写快照与历史、后查版本：冲突时照样抛 ConcurrencyConflict，但脏数据已经落盘。"""

    def save(
        self,
        snapshot: TaskSnapshot,
        *,
        expect_version: int,
        transitions: Sequence[Transition] = (),
        lease_expired_before: datetime | None = None,
    ) -> None:
        if lease_expired_before is not None:
            # 这个变种只改坏版本检查的先后；带租约条件的 save 照常（先查后写）
            super().save(
                snapshot,
                expect_version=expect_version,
                transitions=transitions,
                lease_expired_before=lease_expired_before,
            )
            return
        with self._lock:
            row = self._row(snapshot.task_id)
            before = row.snapshot
            row.snapshot = snapshot.evolve(
                progress=before.progress,
                last_heartbeat_at=before.last_heartbeat_at,
                lease_owner=before.lease_owner,
                lease_until=before.lease_until,
            )
            for record in transitions:
                row.history.setdefault(record.version, pack_transition(record))
        if before.status_version != expect_version:
            raise ConcurrencyConflict("版本不符（可惜已经写进去了）")


class DropsTransitions(InMemoryTaskStore):
    """save 只写快照，随附的迁移记录被丢掉：历史出现空洞。"""

    def save(
        self,
        snapshot: TaskSnapshot,
        *,
        expect_version: int,
        transitions: Sequence[Transition] = (),
        lease_expired_before: datetime | None = None,
    ) -> None:
        super().save(
            snapshot, expect_version=expect_version, transitions=(), lease_expired_before=lease_expired_before
        )


def _like_regex(prefix: str) -> re.Pattern[str]:
    parts = [".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in prefix]
    return re.compile("".join(parts) + ".*", re.DOTALL)


class WildcardPrefix(InMemoryTaskStore):
    """name_prefix 直接拼进 LIKE 而没有转义：``%`` 与 ``_`` 变成了通配符。"""

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        if query is None or query.name_prefix is None:
            return super().query(query)
        pattern = _like_regex(query.name_prefix)
        loose = dataclasses.replace(query, name_prefix=None, limit=None)
        rows = [s for s in super().query(loose) if pattern.fullmatch(s.name)]
        return rows if query.limit is None else rows[: query.limit]


class IgnoresDurable(InMemoryTaskStore):
    """query / stats 把 ``TaskQuery.durable`` 当成不限：持久筛选形同虚设。"""

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        return super().query(None if query is None else dataclasses.replace(query, durable=None))

    def stats(self, query: TaskQuery | None = None) -> Any:
        return super().stats(None if query is None else dataclasses.replace(query, durable=None))


class AwaitingIgnoresOwner(InMemoryTaskStore):
    """``TaskQuery.awaiting_claim`` 只看 queued + 配方、忘了"无人持有"：别人手里排队的任务也算待认领，
    reconcile 就再也看不到它们（持有者死了也没人接手）。"""

    def _wrong(self, query: TaskQuery, rows: list[TaskSnapshot]) -> list[TaskSnapshot]:
        want = query.awaiting_claim
        return [s for s in rows if (s.status is TaskStatus.QUEUED and s.recipe is not None) == want]

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        if query is None or query.awaiting_claim is None:
            return super().query(query)
        rows = self._wrong(query, super().query(dataclasses.replace(query, awaiting_claim=None, limit=None)))
        return rows if query.limit is None else rows[: query.limit]


class SharedOutcome(InMemoryTaskStore):
    """出库时把同一个 outcome 对象交给每个调用方：改一处，处处都变。"""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._cache: dict[str, Any] = {}

    def get(self, task_id: str) -> TaskSnapshot | None:
        snapshot = super().get(task_id)
        if snapshot is None or not isinstance(snapshot.outcome, (dict, list)):
            return snapshot
        cached = self._cache.setdefault(task_id, snapshot.outcome)
        return snapshot.evolve(outcome=cached)


class CompletesForAnyone(InMemoryTaskStore):
    """complete_command 不看持有者：查询客户端会把别人的指令"完成"掉。"""

    def complete_command(self, command_id: str, claimant: str) -> bool:
        with self._lock:
            command = self._commands.get(command_id)
            if command is None or command.command.claimant is None:
                return False
            holder = command.command.claimant
        return super().complete_command(command_id, holder)


class ClaimIgnoresLease(InMemoryTaskStore):
    """认领时不看租约：持有中的指令又被别人取走。"""

    def claim_commands(self, claimant: str, *, lease: float, limit: int = 100, **filters: Any) -> list[Any]:
        with self._lock:
            for command in self._pending.values():
                command.update(lease_until=None)
        return super().claim_commands(claimant, lease=lease, limit=limit, **filters)


class HolderFromCreate(InMemoryTaskStore):
    """按持有者认领时看的是任务创建时的 owner，不是任务行此刻的：adopt 之后指令仍交给旧持有者。"""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._first_owner: dict[str, str | None] = {}

    def create(self, snapshot: TaskSnapshot, transitions: Sequence[Transition] = ()) -> None:
        self._first_owner.setdefault(snapshot.task_id, snapshot.owner)
        super().create(snapshot, transitions)

    def _claim_commands(self, request: ClaimRequest) -> list[Any]:
        if request.holder is None:
            return super()._claim_commands(request)
        ids = {t for t, owner in self._first_owner.items() if owner == request.holder}
        if request.task_ids is not None:
            ids &= request.task_ids
        return super()._claim_commands(dataclasses.replace(request, holder=None, task_ids=frozenset(ids)))


class RenewsTheWholeHolder(InMemoryTaskStore):
    """续租不看 task_ids，按持有者写遍它名下的全部任务：同名的上一个进程留下的任务也被续上，永远不过期。"""

    def _renew_leases(self, lease_owner: str, task_ids: frozenset[str], lease_until: datetime) -> None:
        with self._lock:
            everyone = frozenset(self._rows)
        super()._renew_leases(lease_owner, everyone, lease_until)


class PruneByCreatedAt(InMemoryTaskStore):
    """prune 按创建时间删最旧的，且不分终态与否。"""

    def prune(self, keep_terminal: int) -> int:
        with self._lock:
            terminal = sum(1 for row in self._rows.values() if row.snapshot.is_terminal)
            excess = max(0, terminal - keep_terminal)
            doomed = sorted(self._rows.values(), key=lambda row: row.snapshot.created_at)[:excess]
            for row in doomed:
                del self._rows[row.snapshot.task_id]
            return len(doomed)


class PublishKeepsFirst(InMemoryTaskStore):
    """publish_node 写成 INSERT OR IGNORE：节点的第一次发布之后，心跳再也更新不了记录。"""

    def publish_node(self, record: NodeRecord) -> None:
        with self._lock:
            if record.owner in self._nodes:
                return
        super().publish_node(record)


class ListHidesExpired(InMemoryTaskStore):
    """list_nodes 按真实时钟把过期记录藏起来：崩溃的节点从检查里"消失"，它的桶的空洞也就看不见了。"""

    def list_nodes(self) -> list[NodeRecord]:
        now = datetime.now(UTC)
        return [record for record in super().list_nodes() if record.alive(now)]


class NodeBucketsNoneBecomesEmpty(InMemoryTaskStore):
    """把 buckets 存成"空值即空集合"的列：不限定桶（None）读回来变成一个桶也不负责。"""

    def list_nodes(self) -> list[NodeRecord]:
        return [
            dataclasses.replace(record, buckets=record.buckets or frozenset())
            for record in super().list_nodes()
        ]


class IgnoresLogIdentity(InMemoryTaskStore):
    """append_logs 不看幂等身份（问题 18 之前的行为）：结果未知的一批被重试时，同样的行写了两遍。"""

    def append_logs(self, lines: Sequence[LogLine]) -> None:
        super().append_logs([dataclasses.replace(x, writer="", writer_seq=0) for x in lines])


class DedupesOnlyKeptRows(InMemoryTaskStore):
    """按"仍保存的行里有没有这个身份"去重（唯一约束 + ON CONFLICT DO NOTHING 的做法）：被上限删掉的行
    连身份一起没了，重试时它们被当成新行再写一遍，还把真正最新的行挤掉。"""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._kept_ids: dict[str, dict[tuple[str, int], int]] = {}  # task_id → 身份 → seq

    def append_logs(self, lines: Sequence[LogLine]) -> None:
        fresh: list[LogLine] = []
        for x in lines:
            stats = self.log_stats(x.task_id)
            ids = self._kept_ids.setdefault(x.task_id, {})
            seq = ids.get((x.writer, x.writer_seq))
            if x.writer and seq is not None and seq > stats.dropped:  # 那一行还在：算重复
                continue
            if x.writer:
                ids[(x.writer, x.writer_seq)] = (
                    stats.last_seq + 1 + sum(f.task_id == x.task_id for f in fresh)
                )
            fresh.append(dataclasses.replace(x, writer="", writer_seq=0))
        super().append_logs(fresh)


class BatchIgnoresVersion(InMemoryTaskStore):
    """save_many 逐项写时拿存储里的当前版本当期望版本：过时的写者不再冲突，改写别人的结果。"""

    def save_many(self, requests: Sequence[SaveRequest]) -> list[TaskError | None]:
        results: list[TaskError | None] = []
        for request in requests:
            stored = self.get(request.snapshot.task_id)
            expect = request.expect_version if stored is None else stored.status_version
            results.extend(super().save_many([dataclasses.replace(request, expect_version=expect)]))
        return results


class BatchStopsAtFirstConflict(InMemoryTaskStore):
    """save_many 遇到第一项冲突就停，却把后面没写的项报成成功：调用方以为"已提交"，存储里没有。"""

    def save_many(self, requests: Sequence[SaveRequest]) -> list[TaskError | None]:
        results: list[TaskError | None] = []
        for request in requests:
            if any(result is not None for result in results):
                results.append(None)
                continue
            results.extend(super().save_many([request]))
        return results


class MixedBatchTrustsTheCreates(InMemoryTaskStore):
    """write_many 只要有一项 create 失败（重复 id）就放弃整批，却把没写的 save 报成成功：组提交里同批的
    starting / 终态的调用方以为"已提交"，存储里没有。"""

    def write_many(
        self, creates: Sequence[tuple[TaskSnapshot, Sequence[Transition]]], saves: Sequence[SaveRequest]
    ) -> tuple[list[TaskError | None], list[TaskError | None]]:
        created = self.create_many(creates)
        if any(result is not None for result in created):
            return created, [None] * len(saves)
        return created, self.save_many(saves)


class BatchChecksOnlyTheFirst(InMemoryTaskStore):
    """create_many 只检查第一项的可存储性（以为同批都是同一个模板复制的），其余的不查就写：evolve 绕过构造
    校验塞进来的 NUL、超范围的 priority 混进了存储。"""

    def create_many(
        self, items: Sequence[tuple[TaskSnapshot, Sequence[Transition]]]
    ) -> list[TaskError | None]:
        results: list[TaskError | None] = []
        for index, (snapshot, transitions) in enumerate(items):
            with contextlib.ExitStack() as stack:
                if index:
                    stack.enter_context(_swapped((memory_checks, "check_snapshot", _unchecked)))
                try:
                    self.create(snapshot, transitions)
                except TaskError as exc:
                    results.append(exc)
                    continue
            results.append(None)
        return results


def _unchecked(snapshot: TaskSnapshot, like: TaskSnapshot | None = None) -> TaskSnapshot:
    return snapshot


class SaveTrustsItsRecords(InMemoryTaskStore):
    """save 不逐条查随附的迁移记录（以为版本号接得上就够了）：别的任务的记录、不是 Transition 的对象混进了
    历史。save 的入参检查里逐条查记录的只有一处（``checks.check_save`` 里那一遍 ``check_transitions``，
    ``validate_checked_save`` 不再重复它）：这个变种在 save / save_many 期间把它换成不查。"""

    def save(
        self,
        snapshot: TaskSnapshot,
        *,
        expect_version: int,
        transitions: Sequence[Transition] = (),
        lease_expired_before: datetime | None = None,
    ) -> None:
        with _swapped((memory_checks, "check_transitions", _trusting)):
            super().save(
                snapshot,
                expect_version=expect_version,
                transitions=transitions,
                lease_expired_before=lease_expired_before,
            )

    def save_many(self, requests: Sequence[SaveRequest]) -> list[TaskError | None]:
        with _swapped((memory_checks, "check_transitions", _trusting)):
            return super().save_many(requests)


def _trusting(task_id: str | None, transitions: Sequence[Transition]) -> None:
    return None


class SaveAcceptsAVersionJump(InMemoryTaskStore):
    """save 只在带了迁移记录时核对版本号（以为"没有记录"就是"只改字段"）：快照从 v0 跳到 v2、一条记录也不带也
    照写——存储里的任务到了 v2，历史却是空的。这个变种在 save / save_many / write_many / ``_save_direct``
    期间换上修复前的那份入参检查（``checks`` 与 ``_base_checks`` 两处名字都换：``check_save_since`` 查的是
    后者）。"""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int, **kwargs: Any) -> None:
        with _gap_blind_checks():
            super().save(snapshot, expect_version=expect_version, **kwargs)

    def save_many(self, requests: Sequence[SaveRequest]) -> list[TaskError | None]:
        with _gap_blind_checks():
            return super().save_many(requests)

    def write_many(
        self, creates: Sequence[tuple[TaskSnapshot, Sequence[Transition]]], saves: Sequence[SaveRequest]
    ) -> tuple[list[TaskError | None], list[TaskError | None]]:
        with _gap_blind_checks():
            return super().write_many(creates, saves)

    def _save_direct(
        self, snapshot: TaskSnapshot, expect_version: int, transitions: Sequence[Transition]
    ) -> None:
        with _gap_blind_checks():
            super()._save_direct(snapshot, expect_version, transitions)


_validate_checked_save = memory_checks.validate_checked_save


def _gap_blind(snapshot: TaskSnapshot, expect_version: int, transitions: Sequence[Transition]) -> None:
    """修复前的 ``validate_checked_save``：没有记录时只查 expect_version 本身，不管快照版本跳了几版。"""
    jumped = (
        not transitions
        and isinstance(expect_version, int)
        and not isinstance(expect_version, bool)
        and 0 <= expect_version < snapshot.status_version
    )
    _validate_checked_save(snapshot, snapshot.status_version if jumped else expect_version, transitions)


@contextlib.contextmanager
def _gap_blind_checks() -> Iterator[None]:
    with _swapped(
        (memory_checks, "validate_checked_save", _gap_blind),
        (_base_checks, "validate_checked_save", _gap_blind),
    ):
        yield


_SWAP_LOCK = threading.Lock()
_SWAPPED: dict[tuple[int, str], list[Any]] = {}  # (id(对象), 名字) → [几个线程在用, 原物]


@contextlib.contextmanager
def _swapped(*swaps: tuple[object, str, object]) -> Iterator[None]:
    """变种的方法执行期间把 ``对象.名字`` 换成替身（模块级的函数：对整个进程生效）。

    为什么不直接 ``mock.patch``：契约里的并发用例让几个线程同时调用变种的方法，各自的 patch 记下进来那一刻
    看到的函数——交错退出时（A 进、B 进、A 出、B 出）最后出去的那个把替身当成原物装回去，之后跑的别的用例
    （未经改动的内存存储的契约）也就成了变种，偶发失败。这里按 (对象, 名字) 计数：第一个进来的换上，最后一个
    出去的换回原物。"""
    with _SWAP_LOCK:
        for owner, name, replacement in swaps:
            entry = _SWAPPED.get((id(owner), name))
            if entry is None:
                _SWAPPED[(id(owner), name)] = [1, getattr(owner, name)]
                setattr(owner, name, replacement)
            else:
                entry[0] += 1
    try:
        yield
    finally:
        with _SWAP_LOCK:
            for owner, name, _ in swaps:
                entry = _SWAPPED[(id(owner), name)]
                entry[0] -= 1
                if entry[0] == 0:
                    setattr(owner, name, entry[1])
                    del _SWAPPED[(id(owner), name)]


class SaveRewritesRecipe(InMemoryTaskStore):
    """save 把调用方手里的配方原样写回（配方列进了 save 的 UPDATE）：丢了配方的快照一写，持久任务就没了。"""

    def save(self, snapshot: TaskSnapshot, *, expect_version: int, **kwargs: Any) -> None:
        super().save(snapshot, expect_version=expect_version, **kwargs)
        with self._lock:
            row = self._rows[snapshot.task_id]
            row.snapshot = row.snapshot.evolve(recipe=snapshot.recipe)


class ClaimIgnoresHolder(InMemoryTaskStore):
    """认领不看 owner：已被别的 worker 取走的任务会被再取一次（同一任务启动两次）。"""

    def _claim_queued(self, request: QueuedClaim) -> list[TaskSnapshot]:
        with self._lock:
            for row in self._rows.values():
                if row.snapshot.status is TaskStatus.QUEUED and row.snapshot.recipe is not None:
                    row.snapshot = row.snapshot.evolve(owner=None)
        return super()._claim_queued(request)


class ClaimHoards(InMemoryTaskStore):
    """认领不管 limit：一个 worker 把队列全搬走（囤积），别的 worker 空闲。"""

    def _claim_queued(self, request: QueuedClaim) -> list[TaskSnapshot]:
        return super()._claim_queued(dataclasses.replace(request, limit=10_000))


class ClaimStartSkipsHistory(InMemoryTaskStore):
    """认领并开始时快照写成了 starting，queued → starting 的迁移记录却没写：历史有空洞。"""

    def _claim_and_start(self, request: QueuedClaim, start: ClaimStart) -> list[TaskSnapshot]:
        result = super()._claim_and_start(request, start)
        with self._lock:
            for snapshot in result:
                self._rows[snapshot.task_id].history.pop(snapshot.status_version, None)
        return result


class ClaimBeforeSave(InMemoryTaskStore):
    """``ClaimStart.save`` 与认领分开提交、认领在前：save 版本冲突时下一个任务已在存储里被认领成 starting，
    调用方却只看到 save 的异常（以为什么也没认领到），那个任务没人跑，直到租约过期。"""

    claim_start_saves = True

    def _claim_and_start(self, request: QueuedClaim, start: ClaimStart) -> list[TaskSnapshot]:
        save = start.save
        result = super()._claim_and_start(request, dataclasses.replace(start, save=None))
        if save is not None:
            self.save(save.snapshot, expect_version=save.expect_version, transitions=save.transitions)
        return result


class SkipsSaveWhenNothingClaimed(InMemoryTaskStore):
    """认领扑空时连 ``ClaimStart.save`` 也不写（"什么也没认领到 = 什么也没发生"）：终态丢了。"""

    claim_start_saves = True

    def _claim_and_start(self, request: QueuedClaim, start: ClaimStart) -> list[TaskSnapshot]:
        with self._lock:
            nothing = not any(claimable(row.snapshot, request) for row in self._rows.values())
        if start.save is not None and (nothing or request.empty):
            return []
        return super()._claim_and_start(request, start)


class ClaimStartInventsItsOwnStart(InMemoryTaskStore):
    """存储自己拼 starting（只改状态、版本号，补一条记录），不经状态机：attempt、started_at、执行器名
    都没记。"""

    def _claim_and_start(self, request: QueuedClaim, start: ClaimStart) -> list[TaskSnapshot]:
        result: list[TaskSnapshot] = []
        with self._lock:
            for snapshot in self._claim_locked(request):
                version = snapshot.status_version + 1
                started = snapshot.evolve(status=TaskStatus.STARTING, status_version=version)
                row = self._rows[snapshot.task_id]
                row.snapshot = started
                row.history[version] = pack_transition(
                    Transition(
                        task_id=snapshot.task_id,
                        from_status=TaskStatus.QUEUED,
                        to_status=TaskStatus.STARTING,
                        trigger="claim",
                        actor=None,
                        reason=None,
                        version=version,
                        at=start.at,
                    )
                )
                result.append(started)
        return result


class NextSaveTrustsEverything(InMemoryTaskStore):
    """写穿的 ``_save_next`` 以为状态机交来的都对：不查版本、不查可存储性、不沿用存储的旁路字段——过时的写者
    覆盖了别人的写，存不下的文本也进了库（其余写入口不变）。"""

    def _save_next(self, snapshot: TaskSnapshot, record: Transition, packed: Any) -> None:
        with self._lock:
            row = self._rows[snapshot.task_id]
            row.snapshot = snapshot
            row.history.setdefault(packed[5], packed)


MUTANTS: dict[type[InMemoryTaskStore], set[str]] = {
    NextSaveTrustsEverything: {
        "test_next_save_writes_exactly_like_save",
        "test_next_save_refuses_what_save_refuses",
    },
    TouchBumpsVersion: {
        "test_touch_updates_side_channel_without_bumping_version",
        "test_touch_never_conflicts_with_save",
        "test_touch_and_save_interleaved_from_threads",
    },
    WriteThenCheckSave: {
        "test_save_version_mismatch_writes_nothing",
        "test_race_same_expect_version_exactly_one_wins",
    },
    DropsTransitions: {
        "test_save_bumps_version_and_appends_transitions",
        "test_race_retrying_writers_leave_a_gapless_history",
    },
    WildcardPrefix: {
        "test_query_name_prefix_percent_is_literal",
        "test_query_name_prefix_underscore_is_literal",
    },
    IgnoresDurable: {"test_query_and_stats_filter_by_durable"},
    AwaitingIgnoresOwner: {"test_query_and_stats_filter_by_awaiting_claim"},
    SharedOutcome: {"test_returned_outcome_is_a_copy"},
    CompletesForAnyone: {"test_complete_is_idempotent_for_holder_and_false_for_others"},
    ClaimIgnoresLease: {
        "test_claimed_command_is_invisible_to_others_while_leased",
        "test_concurrent_claimers_never_share_a_command",
    },
    HolderFromCreate: {"test_claim_filtered_by_holder_follows_the_task_row"},
    RenewsTheWholeHolder: {"test_renew_leases_writes_one_lease_to_the_listed_tasks_only"},
    PruneByCreatedAt: {
        "test_prune_keeps_newest_terminal_tasks",
        "test_prune_never_deletes_non_terminal_tasks",
    },
    PublishKeepsFirst: {
        "test_publish_node_same_owner_replaces_last_writer_wins",
        "test_concurrent_publishers_from_threads",
    },
    ListHidesExpired: {"test_list_nodes_includes_expired_records"},
    NodeBucketsNoneBecomesEmpty: {"test_node_buckets_none_and_empty_set_are_distinct"},
    IgnoresLogIdentity: {
        "test_retried_batch_is_written_once",
        "test_partially_overlapping_batch_adds_only_the_new_lines_in_order",
        "test_writers_and_tasks_have_independent_identities",
    },
    DedupesOnlyKeptRows: {"test_retry_of_a_batch_over_the_bound_neither_duplicates_nor_counts_drops_twice"},
    BatchIgnoresVersion: {
        "test_save_many_conflict_writes_nothing_for_that_item_only",
        "test_racing_save_many_one_winner_per_task_and_no_gap",
    },
    BatchStopsAtFirstConflict: {"test_save_many_conflict_writes_nothing_for_that_item_only"},
    BatchChecksOnlyTheFirst: {"test_create_many_checks_every_item_not_just_the_first_of_a_shape"},
    SaveTrustsItsRecords: {"test_save_rejects_records_that_are_not_its_own"},
    SaveAcceptsAVersionJump: {"test_save_refuses_a_version_jump_without_records"},
    MixedBatchTrustsTheCreates: {"test_write_many_refuses_a_duplicate_or_a_conflict_alone"},
    SaveRewritesRecipe: {"test_save_never_rewrites_the_recipe"},
    ClaimIgnoresHolder: {
        "test_claim_takes_priority_then_fifo_and_only_limit",
        "test_concurrent_claimers_take_every_task_exactly_once",
    },
    ClaimStartSkipsHistory: {
        "test_claim_and_start_writes_starting_exactly_as_the_state_machine_would",
        "test_claim_and_start_only_claims_a_task_the_state_machine_will_not_start",
        "test_concurrent_claim_and_start_starts_every_task_exactly_once",
    },
    ClaimStartInventsItsOwnStart: {
        "test_claim_and_start_writes_starting_exactly_as_the_state_machine_would",
        "test_claim_and_start_only_claims_a_task_the_state_machine_will_not_start",
        "test_concurrent_claim_and_start_starts_every_task_exactly_once",
    },
    ClaimHoards: {"test_claim_takes_priority_then_fifo_and_only_limit"},
    ClaimBeforeSave: {"test_claim_after_a_failed_save_writes_nothing"},
    SkipsSaveWhenNothingClaimed: {"test_claim_after_save_commits_the_save_when_nothing_is_claimable"},
}


def run_contract(store_cls: type[InMemoryTaskStore]) -> tuple[unittest.TestResult, set[str], str]:
    """对 store_cls 跑完整契约套件，返回 (结果, 失败或出错的用例名, 报告文本)。"""

    def make_store(self: StoreContract) -> TaskStore:
        return store_cls()

    def make_clocked_store(self: StoreContract, clock: FakeClock) -> TaskStore:
        return store_cls(clock=clock)

    # 动态子类只活在这个函数里，pytest 的收集看不到它。
    suite_cls = type(
        f"Contract_{store_cls.__name__}",
        (StoreContract,),
        {"make_store": make_store, "make_clocked_store": make_clocked_store},
    )
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(suite_cls)
    stream = io.StringIO()
    result = unittest.TextTestRunner(stream=stream, verbosity=0).run(suite)
    broken: set[str] = set()
    for case, _ in [*result.failures, *result.errors]:
        test_id = case.id()
        # 子测试的 id 形如 "...test_x (method='get')"：只取方法名。
        broken.add(test_id.split(" ", 1)[0].rsplit(".", 1)[-1])
    return result, broken, stream.getvalue()


def test_harness_passes_the_unbroken_reference_store() -> None:
    result, broken, report = run_contract(InMemoryTaskStore)
    assert result.testsRun >= 45
    assert not result.skipped
    assert broken == set(), report


@pytest.mark.parametrize("mutant", list(MUTANTS), ids=lambda cls: cls.__name__)
def test_contract_catches_mutant(mutant: type[InMemoryTaskStore]) -> None:
    result, broken, report = run_contract(mutant)
    expected = MUTANTS[mutant]
    missing = expected - broken
    assert not missing, f"{mutant.__name__}：这些用例本该失败却通过了：{sorted(missing)}\n{report}"
    # 也不能"全军覆没"：那说明变种根本跑不起来，而不是被某条语义抓住。
    assert len(broken) < result.testsRun // 2, (
        f"{mutant.__name__} 让大半用例失败，变种本身可能坏了：{sorted(broken)}"
    )
