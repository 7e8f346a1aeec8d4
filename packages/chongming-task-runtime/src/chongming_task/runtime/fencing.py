"""写穿层的收敛与隔离（fencing）判定（docs/distributed.md §7）。

两件事，都出在"不知道存储里现在是什么"的时候：

* **结果未知的写**：连接在 save / create 中途断了——服务器可能已经提交，只是回执丢了。盲目用旧版本重放会
  撞版本冲突（那次写其实成功了），旧实现于是对这个任务永远放弃；create 的重放则永远 DuplicateTaskId。
  这里的规则：先读回存储里的快照与历史，与本进程的历史对照（:func:`compare`）。存储的历史是本进程历史的
  前缀 → 那些写都成功了，从存储的版本接着写；否则是别人写的 → 冲突 / 隔离。
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
    local: Sequence[Transition], stored: TaskSnapshot | None, history: Sequence[Transition]
) -> Verdict:
    """存储里的 (快照, 历史) 与本进程的历史对照。

    逐条比较（Transition 是值对象：版本、起止状态、触发源、发起者、原因、时间都相同才算同一条）：
    存储的历史必须正好是本进程历史的前 n 条，且快照的版本就是 n。版本 0（刚建、没有历史）也是前缀。
    """
    if stored is None:
        return Verdict.ABSENT
    n = stored.status_version
    if n > len(local) or len(history) != n:
        return Verdict.DIVERGED
    if list(local[:n]) != list(history):
        return Verdict.DIVERGED
    if n and local[n - 1].to_status is not stored.status:
        return Verdict.DIVERGED
    return Verdict.PREFIX


def first_foreign(local: Sequence[Transition], history: Sequence[Transition]) -> Transition | None:
    """存储历史里第一条与本进程不同的记录（说明是谁、在哪个版本接管的）。"""
    for index, record in enumerate(history):
        if index >= len(local) or local[index] != record:
            return record
    return None


def fenced_text(
    local: TaskSnapshot,
    local_transitions: Sequence[Transition],
    stored: TaskSnapshot,
    history: Sequence[Transition],
) -> str:
    """隔离记录的正文：存储里的结论、是谁写的，以及本地的真实结果（docs/distributed.md §7.3）。"""
    foreign = first_foreign(local_transitions, history)
    who = "另一个写者"
    if foreign is not None:
        who = f"{foreign.actor or '另一个写者'}（v{foreign.version}，{foreign.trigger}）"
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
