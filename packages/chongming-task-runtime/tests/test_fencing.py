"""读回对照的判定规则（runtime/fencing.py 的 ``compare``，docs/distributed.md §7.2、§7.3）——纯函数的单元测试。

重点是认领 / 接手来的持久任务：本进程的状态机只凭存储里版本 V 的快照重建，没有 V 及以前的记录（它们是
提交者写的），所以只对照 V 之后的那一段（``base=V``），并要求持有者仍是本节点。提交的任务（``base=0``）照旧
整段对照。
时间全部来自同一个 FakeClock：两个写者在同一时刻写下的同一种迁移记录逐字段相同，判定不能靠时间戳碰运气。
"""

from __future__ import annotations

import dataclasses

import pytest

from chongming_task.core.recipes import Recipe
from chongming_task.core.state_machine import StateMachine
from chongming_task.core.triggers import TRIGGER_RECONCILE
from chongming_task.models import Transition
from chongming_task.runtime.fencing import Verdict, compare, fenced_text, first_foreign
from chongming_task.runtime.taskrun import mark_lease_expired
from chongming_task.states import TaskStatus
from chongming_task.testing import FakeClock

S = TaskStatus
CLOCK = FakeClock()
RECIPE = Recipe(name="job", max_attempts=3)


def enqueued() -> StateMachine:
    """提交者写下的持久任务：pending → queued（v1），无人持有。"""
    machine = StateMachine.create("t", "job", max_attempts=3, clock=CLOCK, recipe=RECIPE, owner=None)
    machine.mark_queued(actor="submitter", reason="持久任务入队")
    return machine


def claimed_by(holder: str, submitted: StateMachine) -> StateMachine:
    """``claim_queued`` 交回的样子：持有者与租约换成认领者，版本不变；状态机没有之前的历史。"""
    snapshot = submitted.snapshot.evolve(owner=holder, lease_owner=holder)
    return StateMachine(snapshot, (), clock=CLOCK)


def ran(machine: StateMachine, upto: TaskStatus) -> StateMachine:
    steps = [
        (S.STARTING, machine.mark_starting),
        (S.RUNNING, machine.mark_running),
        (S.SUCCEEDED, lambda: machine.mark_succeeded(outcome=1)),
    ]
    for status, step in steps:
        step()
        if status is upto:
            break
    return machine


def stored_at(
    submitted: StateMachine, mine: StateMachine, version: int, *, owner: str = "w"
) -> tuple[StateMachine, list[Transition]]:
    """存储里此刻的样子：提交者的 v1 + 本进程写成的那些（到 ``version`` 为止），持有者 ``owner``。"""
    history = list(submitted.transitions) + [t for t in mine.transitions if t.version <= version]
    last = history[-1]
    snapshot = mine.snapshot.evolve(status=last.to_status, status_version=version, owner=owner)
    return StateMachine(snapshot, history, clock=CLOCK), history


# -- 提交的任务（base = 0）：与以前逐字相同 ----------------------------------------------------------


def test_a_submitted_task_compares_its_whole_history() -> None:
    machine = ran(enqueued(), S.RUNNING)
    local = machine.transitions
    assert compare(local, None, []) is Verdict.ABSENT
    for n in range(len(local) + 1):
        history = list(local[:n])
        status = history[-1].to_status if history else S.PENDING
        stored = machine.snapshot.evolve(status=status, status_version=n)
        assert compare(local, stored, history) is Verdict.PREFIX, n
    # 缺头的历史、多出来的记录、别人的记录：都不是本进程的前缀
    stored = machine.snapshot
    assert compare(local, stored, list(local[1:])) is Verdict.DIVERGED
    lost = mark_lease_expired(stored, clock=CLOCK, actor="peer")
    assert compare(local, lost.snapshot, [*local, *lost.transitions]) is Verdict.DIVERGED


# -- 认领来的任务（base = V） ----------------------------------------------------------------------


@pytest.mark.parametrize("written", [1, 2, 3, 4], ids=["none-of-ours", "starting", "running", "succeeded"])
def test_a_claimed_task_accepts_the_base_it_claimed_and_compares_only_what_came_after(written: int) -> None:
    """修复前：存储里前 V 条是提交者的，本进程的状态机里没有，``compare`` 于是把本进程自己写成的前缀判成
    别人的改写——读回之后任务被隔离，存储停在 running 直到被判 lost。"""
    submitted = enqueued()
    base = submitted.snapshot.status_version
    mine = ran(claimed_by("w", submitted), S.SUCCEEDED)
    local = mine.transitions_since(base)
    store, history = stored_at(submitted, mine, written)
    assert compare(local, store.snapshot, history, base=base, holder="w") is Verdict.PREFIX
    assert first_foreign(local, history, base=base) is None
    # 不给起点（修复前的调用）：同一个存储被判成别人的改写
    assert compare(mine.transitions, store.snapshot, history) is Verdict.DIVERGED


def test_records_up_to_the_base_may_have_been_archived_away() -> None:
    """版本不超过 V 的记录是接手时的底子，不逐条比：它们可能已被归档出在线库（只归档前缀）。"""
    submitted = enqueued()
    mine = ran(claimed_by("w", submitted), S.RUNNING)
    store, history = stored_at(submitted, mine, 3)
    online = [t for t in history if t.version > 1]
    assert compare(mine.transitions_since(1), store.snapshot, online, base=1, holder="w") is Verdict.PREFIX


def test_a_claimed_task_taken_over_after_our_lease_expired_is_fenced() -> None:
    """租约过期后别的 worker 接手（``cluster:adopted``，版本 V+1）：本进程 V+1 的那条（starting）没写进去，
    存储里同一版本是别人的记录——隔离，不覆盖。"""
    submitted = enqueued()
    mine = ran(claimed_by("w", submitted), S.STARTING)
    theirs = StateMachine(submitted.snapshot.evolve(owner="w"), (), clock=CLOCK)
    theirs.adopt("b", actor="b", reason="原持有者 w 的租约已过期")
    history = [*submitted.transitions, *theirs.transitions]
    verdict = compare(mine.transitions_since(1), theirs.snapshot, history, base=1, holder="w")
    assert verdict is Verdict.DIVERGED
    foreign = first_foreign(mine.transitions_since(1), history, base=1)
    assert foreign is not None and foreign.actor == "b" and foreign.version == 2
    text = fenced_text(mine.snapshot, mine.transitions_since(1), theirs.snapshot, history, base=1, holder="w")
    assert "b（v2，cluster:adopted）" in text and "starting（v2" in text


def test_a_claimed_task_released_and_claimed_by_another_worker_is_fenced_even_with_identical_records() -> (
    None
):
    """交还（持有者清空，版本不变）之后被另一个 worker 认领（也不改版本），它在同一时刻写下的 starting 与
    本进程的那条逐字段相同（同一个时钟）——只有持有者分得清。"""
    submitted = enqueued()
    mine = ran(claimed_by("w", submitted), S.STARTING)
    other = ran(claimed_by("b", submitted), S.STARTING)
    assert mine.transitions == other.transitions, "前提：两条记录逐字段相同"
    history = [*submitted.transitions, *other.transitions]
    local = mine.transitions_since(1)
    assert compare(local, other.snapshot, history, base=1, holder="w") is Verdict.DIVERGED
    assert compare(local, other.snapshot, history, base=1, holder="b") is Verdict.PREFIX
    # 被另一个 worker 认领、还没写任何迁移（存储停在底子的版本）也一样
    reclaimed = submitted.snapshot.evolve(owner="b")
    assert compare(local, reclaimed, list(submitted.transitions), base=1, holder="w") is Verdict.DIVERGED
    text = fenced_text(mine.snapshot, local, reclaimed, list(submitted.transitions), base=1, holder="w")
    assert "另一个持有者 b" in text
    released = submitted.snapshot.evolve(owner=None)
    assert compare(local, released, list(submitted.transitions), base=1, holder="w") is Verdict.DIVERGED


def test_a_claimed_task_judged_lost_or_retried_by_someone_else_is_fenced() -> None:
    submitted = enqueued()
    mine = ran(claimed_by("w", submitted), S.SUCCEEDED)
    local = mine.transitions_since(1)
    # reconcile 在本进程的 running 之后判 lost（本进程的 succeeded 没写进去）
    store, history = stored_at(submitted, mine, 3)
    lost = mark_lease_expired(store.snapshot, clock=CLOCK, actor="peer")
    after_lost = [*history, *lost.transitions]
    assert compare(local, lost.snapshot, after_lost, base=1, holder="w") is Verdict.DIVERGED
    foreign = first_foreign(local, after_lost, base=1)
    assert foreign is not None and foreign.trigger == TRIGGER_RECONCILE
    # 本进程的终态写成了、之后运维 reset：存储比本进程多一条别人的记录
    done, history = stored_at(submitted, mine, 4)
    done.reset(confirm=True, actor="ops", reason="从头再来")
    assert compare(local, done.snapshot, done.transitions, base=1, holder="w") is Verdict.DIVERGED
    # 判 lost 之后运维 retry（重新排队、持有者清空），又被同一个 worker 认领了回来（持有者又是 w）：
    # 多出的记录不是这台状态机写的
    revived = StateMachine(lost.snapshot, after_lost, clock=CLOCK)
    revived.retry(actor="ops", reason="重跑")
    again = revived.snapshot.evolve(owner="w")
    assert compare(local, again, revived.transitions, base=1, holder="w") is Verdict.DIVERGED


def test_a_claimed_task_that_vanished_or_went_backwards_is_fenced_never_recreated() -> None:
    submitted = enqueued()
    mine = ran(claimed_by("w", submitted), S.RUNNING)
    local = mine.transitions_since(1)
    assert compare(local, None, [], base=1, holder="w") is Verdict.DIVERGED, (
        "认领来的任务不见了：被删了，不重建"
    )
    # 被删了又以同一个 id 重新提交（版本回到 0 / 1、不是本节点持有）
    fresh = StateMachine.create("t", "job", clock=CLOCK, recipe=RECIPE, owner="w")
    assert compare(local, fresh.snapshot, [], base=1, holder="w") is Verdict.DIVERGED
    # 存储的状态与它自己的历史末条对不上（不合常规的改写）
    store, history = stored_at(submitted, mine, 3)
    odd = store.snapshot.evolve(status=S.PAUSED)
    assert compare(local, odd, history, base=1, holder="w") is Verdict.DIVERGED
    base_odd = submitted.snapshot.evolve(owner="w", status=S.PAUSED)
    assert compare(local, base_odd, list(submitted.transitions), base=1, holder="w") is Verdict.DIVERGED


def test_an_adopted_task_counts_its_own_adoption_as_the_base() -> None:
    """接手来的任务：``cluster:adopted`` 那条由接手的 worker 直接写进存储，写穿从它之后（V+1）接着写。"""
    submitted = enqueued()
    adopted = StateMachine(submitted.snapshot.evolve(owner="dead"), (), clock=CLOCK)
    adopted.adopt("w", actor="w", reason="原持有者 dead 的租约已过期")
    base = adopted.snapshot.status_version
    ran(adopted, S.RUNNING)
    history = [*submitted.transitions, *adopted.transitions]
    local = adopted.transitions_since(base)
    assert compare(local, adopted.snapshot, history, base=base, holder="w") is Verdict.PREFIX
    at_base = [t for t in history if t.version <= base]
    before_ours = adopted.snapshot.evolve(status=S.QUEUED, status_version=base)
    assert compare(local, before_ours, at_base, base=base, holder="w") is Verdict.PREFIX


# -- 已确认的版本（durable）：归档掉的早期历史、被删掉的任务 ------------------------------------------


def submitted_running() -> StateMachine:
    """提交的任务（整段历史都是本进程的）：pending → queued → starting → running（v3）。"""
    machine = StateMachine.create("t", "job", max_attempts=3, clock=CLOCK)
    machine.mark_queued()
    return ran(machine, S.RUNNING)


def test_a_submitted_task_with_archived_early_history_is_judged_from_its_last_confirmed_version() -> None:
    """存储确认过 v3（``durable=3``），之后终态那次写结果未知。早期历史（v1..v2，或 v1..v3 全部）已被归档出
    在线库：写成了（存储 v4、在线有第 4 条）与没写成（存储仍是 v3）都是本进程的前缀。修复前提交的任务按位置
    整段对照，"缺头"一律判 DIVERGED。"""
    machine = submitted_running()
    machine.mark_succeeded(outcome=1)
    local = machine.transitions
    done = machine.snapshot
    at_3 = done.evolve(status=S.RUNNING, status_version=3)
    for online_from in (1, 2, 3, 4):
        committed = [t for t in local if t.version >= online_from]
        assert compare(local, done, committed, durable=3) is Verdict.PREFIX, online_from
        assert compare(local, done, committed) is (
            Verdict.PREFIX if online_from == 1 else Verdict.DIVERGED
        ), "没有确认过的版本时一条也不能缺（create 的读回）"
        not_committed = [t for t in local if online_from <= t.version <= 3]
        assert compare(local, at_3, not_committed, durable=3) is Verdict.PREFIX, online_from


def test_records_after_the_last_confirmed_version_must_be_online_and_ours() -> None:
    machine = submitted_running()
    machine.mark_succeeded(outcome=1)
    local = machine.transitions
    done = machine.snapshot
    # 结果未知的那次写带的第 4 条也被归档掉了：无从核对，保守地判隔离
    assert compare(local, done, [], durable=3) is Verdict.DIVERGED
    # 确认过的版本仍在线时照样逐条核对：在线的第 2 条不是本进程的 → 不是前缀
    forged = [*local[:1], dataclasses.replace(local[1], actor="someone-else"), *local[2:]]
    assert compare(local, done, forged[1:], durable=3) is Verdict.DIVERGED
    # 别人在确认版本之后写了第 4 条（reconcile 判 lost）
    at_3 = done.evolve(status=S.RUNNING, status_version=3)
    lost = mark_lease_expired(at_3, clock=CLOCK, actor="peer")
    assert compare(local, lost.snapshot, list(lost.transitions), durable=3) is Verdict.DIVERGED
    # 在线历史中间有空洞、或多出确认版本之后不属于快照的记录
    assert compare(local, done, [local[0], local[3]], durable=3) is Verdict.DIVERGED
    assert compare(local, at_3, list(local), durable=3) is Verdict.DIVERGED
    # 存储比确认过的版本还旧：确认过的写不见了（删了重建、从备份恢复）
    at_2 = done.evolve(status=S.STARTING, status_version=2)
    assert compare(local, at_2, list(local[:2]), durable=3) is Verdict.DIVERGED


def test_a_confirmed_task_that_vanished_is_fenced_never_recreated() -> None:
    """提交时 create 已确认（durable 不是 None）：读回时不见了只能是被删了——不是 ABSENT，不重建。"""
    local = submitted_running().transitions
    assert compare(local, None, []) is Verdict.ABSENT  # 只有 create 的读回才可能是"没写进去"
    for durable in (0, 1, 3):
        assert compare(local, None, [], durable=durable) is Verdict.DIVERGED, durable


def test_a_claimed_task_running_past_the_retention_window_is_judged_from_its_last_confirmed_version() -> None:
    """认领来的任务同理：接手（v1）之后本进程写成、已确认的 v2..v3 也可能被归档掉。"""
    submitted = enqueued()
    mine = ran(claimed_by("w", submitted), S.SUCCEEDED)
    local = mine.transitions_since(1)
    store, history = stored_at(submitted, mine, 4)
    tail = [t for t in history if t.version == 4]
    assert compare(local, store.snapshot, tail, base=1, holder="w") is Verdict.DIVERGED, (
        "只凭接手版本：缺了 v2..v3"
    )
    assert compare(local, store.snapshot, tail, base=1, holder="w", durable=3) is Verdict.PREFIX
    assert compare(local, store.snapshot, tail, base=1, holder="b", durable=3) is Verdict.DIVERGED
