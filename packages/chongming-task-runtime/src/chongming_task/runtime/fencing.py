"""写穿层的收敛与隔离（fencing）判定（docs/distributed.md §7）。

两件事，都出在"不知道存储里现在是什么"的时候：

* **结果未知的写**：连接在 save / create 中途断了——服务器可能已经提交，只是回执丢了。盲目用旧版本重放会
  撞版本冲突（那次写其实成功了），旧实现于是对这个任务永远放弃；create 的重放则永远 DuplicateTaskId。
  这里的规则：先读回存储里的快照与历史，与本进程的历史对照（:func:`compare`）。存储的历史是本进程历史的
  前缀 → 那些写都成功了，从存储的版本接着写；否则是别人写的 → 冲突 / 隔离。认领 / 接手来的持久任务只对照
  本进程接手之后的那一段（接手时的版本 ``base`` 之后），并要求持有者仍是本节点：之前的记录是提交者写的，
  本进程的状态机里本来就没有它们。
* **隔离**：本节点续不上租约（网络分区），别的节点的 reconcile 接管了判定。:class:`LeaseWatch` 记下最后一次
  续租成功的时刻，租约到期那一刻本节点自己就知道；读回时发现存储被别人改写，就是被隔离了（:func:`fenced_text`）。
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Sequence

from chongming_task.models import TaskSnapshot, Transition


class Verdict(enum.Enum):
    ABSENT = "absent"  # 存储里没有这个任务：create 没写进去
    PREFIX = "prefix"  # 存储里是本进程写过的一段前缀：从存储的版本接着写
    DIVERGED = "diverged"  # 存储里有别人写的迁移：冲突 / 隔离


def compare(
    local: Sequence[Transition],
    stored: TaskSnapshot | None,
    history: Sequence[Transition],
    *,
    base: int = 0,
    holder: str | None = None,
) -> Verdict:
    """存储里的 (快照, 历史) 与本进程的历史对照。

    ``base``：本进程从存储的哪个版本接着写（提交的任务是 0，整段历史都是本进程写的；认领 / 接手来的持久任务是
    接手那一刻存储里的版本 V——V 及以前的迁移是提交者、前任持有者写的，本进程的状态机里没有它们）。
    ``local``：本进程写下的迁移记录，版本 ``base + 1`` 起连续（base 为 0 时就是全部历史）。
    ``holder``：base > 0 时本进程的持有者名（认领写下的 ``owner``）。

    逐条比较（Transition 是值对象：版本、起止状态、触发源、发起者、原因、时间都相同才算同一条）：

    * 存储里版本大于 base 的记录必须正好是 ``local`` 的前 n - base 条（n 是存储快照的版本），快照的状态是
      其中最后一条的终点——那些写都成功了，从 n 接着写；n == base 表示本进程的写一条也没落库，重写。
    * 版本不超过 base 的记录是接手时的底子，不逐条比（本进程没有它们；它们可能已被归档出在线库）。为什么
      这样仍然分得清"自己的"与"别人的"：底子之后别人的任何改写都要么留下一条版本 > base 的记录（接手
      ``cluster:adopted``、reconcile 判 lost、运维的 retry / reset / 强制迁移都递增版本号），与本进程同版本的
      记录对不上；要么换了持有者而不改版本号（交还之后被别的 worker 认领：认领只写 owner 与租约），所以
      base > 0 时还要求存储里的持有者仍是 ``holder``。
    * base > 0 时存储里没有这个任务不是 ABSENT：它是从存储里认领来的，不见了只能是被人删了——绝不重建
      （本进程也没有它完整的历史可以重建），按隔离处理。
    """
    if stored is None:
        return Verdict.ABSENT if base == 0 else Verdict.DIVERGED
    n = stored.status_version
    mine = n - base  # 存储里属于本进程的条数
    if mine < 0 or mine > len(local):
        return Verdict.DIVERGED
    if base and holder is not None and stored.owner != holder:
        return Verdict.DIVERGED
    if base:
        # 底子（版本 <= base）不比；历史按版本升序，版本 > base 的是一段后缀。
        tail = [record for record in history if record.version > base]
    else:
        # 提交的任务：整段历史都得是本进程的，条数也必须正好是 n（不多不少，不接受缺头）。
        if len(history) != n:
            return Verdict.DIVERGED
        tail = list(history)
    if tail != list(local[:mine]):
        return Verdict.DIVERGED
    if mine and local[mine - 1].to_status is not stored.status:
        return Verdict.DIVERGED
    if not mine and local and local[0].from_status is not stored.status:
        # 本进程的写一条也没落库：存储应当还停在底子的状态（本进程第一条记录的起点）。状态不改版本号就变不了，
        # 这里不符只能是存储被别人以不合常规的方式改写了。
        return Verdict.DIVERGED
    return Verdict.PREFIX


def first_foreign(
    local: Sequence[Transition], history: Sequence[Transition], *, base: int = 0
) -> Transition | None:
    """存储历史里第一条与本进程不同的记录（说明是谁、在哪个版本接管的）。按版本对齐：``local`` 从版本
    ``base + 1`` 起（见 :func:`compare`），版本不超过 base 的是接手时的底子，不算别人的改写。"""
    for record in history:
        index = record.version - base - 1
        if index < 0:
            continue
        if index >= len(local) or local[index] != record:
            return record
    return None


def fenced_text(
    local: TaskSnapshot,
    local_transitions: Sequence[Transition],
    stored: TaskSnapshot,
    history: Sequence[Transition],
    *,
    base: int = 0,
    holder: str | None = None,
) -> str:
    """隔离记录的正文：存储里的结论、是谁写的，以及本地的真实结果（docs/distributed.md §7.3）。
    ``base`` / ``holder`` 与 :func:`compare` 的相同。"""
    foreign = first_foreign(local_transitions, history, base=base)
    who = "另一个写者"
    if foreign is not None:
        who = f"{foreign.actor or '另一个写者'}（v{foreign.version}，{foreign.trigger}）"
    elif base and holder is not None and stored.owner != holder:
        who = f"另一个持有者 {stored.owner or '（无人持有）'}"
    last = local_transitions[-1] if local_transitions else None
    mine = f"{local.status}（v{local.status_version}" + (f"，{last.trigger}）" if last is not None else "）")
    return (
        f"本节点被隔离（fenced）：存储中任务已被 {who} 改写为 {stored.status}（v{stored.status_version}）；"
        f"本地实际结果：{mine}。以存储为准，本地结果不再写入；请核对副作用后决定是否重新提交"
    )


class LeaseWatch:
    """本节点的租约是否还有效（按本节点自己的单调时钟）。

    续租成功时记下"这次续租开始的时刻 + lease_ttl"为租约有效期（用开始时刻：回执可能走了很久，保守地算）。
    过了这个时刻还没续上，本节点就知道：别的节点的 reconcile 可以合法地接管它的任务了。
    """

    def __init__(self, lease_ttl: float, now: float) -> None:
        self._ttl = lease_ttl
        self._lock = threading.Lock()
        self._valid_until = now + lease_ttl
        self._reported = False

    def renewed(self, started_at: float) -> bool:
        """续租成功。返回 True 表示此前租约已过期（调用方打一行"租约恢复"）。"""
        with self._lock:
            was_expired = self._reported
            self._valid_until = max(self._valid_until, started_at + self._ttl)
            self._reported = False
            return was_expired

    def expired_now(self, now: float) -> float | None:
        """租约刚刚过期（每次过期只返回一次）：返回已经多久没续上（秒）；否则 None。"""
        with self._lock:
            if self._reported or now < self._valid_until:
                return None
            self._reported = True
            return now - (self._valid_until - self._ttl)

    def valid_for(self, now: float) -> float:
        """本节点的租约（按它自己的判断）还剩多少秒；已过期时为零或负数。"""
        with self._lock:
            return self._valid_until - now

    def is_expired(self, now: float) -> bool:
        with self._lock:
            return now >= self._valid_until


__all__ = ["LeaseWatch", "Verdict", "compare", "fenced_text", "first_foreign"]
