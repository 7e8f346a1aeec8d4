"""读回对照的判定规则（runtime/fencing.py 的 ``compare``，docs/distributed.md §7.2、§7.3）——纯函数的单元测试。

重点是认领 / 接手来的持久任务：本进程的状态机只凭存储里版本 V 的快照重建，没有 V 及以前的记录（它们是
提交者写的），所以只对照 V 之后的那一段（``base=V``），并要求持有者仍是本节点。提交的任务（``base=0``）照旧
整段对照。
时间全部来自同一个 FakeClock：两个写者在同一时刻写下的同一种迁移记录逐字段相同，判定不能靠时间戳碰运气。
"""

from __future__ import annotations

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
