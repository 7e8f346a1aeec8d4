"""写穿层的收敛与隔离（fencing）判定（docs/distributed.md §7）。

两件事，都出在"不知道存储里现在是什么"的时候：

* **结果未知的写**：连接在 save / create 中途断了——服务器可能已经提交，只是回执丢了。盲目用旧版本重放会
  撞版本冲突（那次写其实成功了），旧实现于是对这个任务永远放弃；create 的重放则永远 DuplicateTaskId。
  这里的规则：先读回存储里的快照与历史，与本进程的历史对照（:func:`compare`）。存储的历史是本进程历史的
  前缀 → 那些写都成功了，从存储的版本接着写；否则是别人写的 → 冲突 / 隔离。认领 / 接手来的持久任务只对照
  本进程接手之后的那一段（接手时的版本 ``base`` 之后），并要求持有者仍是本节点：之前的记录是提交者写的，
  本进程的状态机里本来就没有它们。已确认落库的版本（``durable``）不要求仍在线：长跑任务的早期历史可能已被
  归档。确认存在过的任务读回时不见了（被删了）按隔离处理，绝不重建。
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
    durable: int | None = None,
) -> Verdict:
    """存储里的 (快照, 历史) 与本进程的历史对照。

    ``base``：本进程从存储的哪个版本接着写（提交的任务是 0，整段历史都是本进程写的；认领 / 接手来的持久任务是
    接手那一刻存储里的版本 V——V 及以前的迁移是提交者、前任持有者写的，本进程的状态机里没有它们）。
    ``local``：本进程写下的迁移记录，版本 ``base + 1`` 起连续（base 为 0 时就是全部历史）。
    ``holder``：base > 0 时本进程的持有者名（认领写下的 ``owner``）。
    ``durable``：存储已向本进程确认过的最后一个版本（写穿层的记账：上一次确定成功的写、或接手时的版本）；
    None 表示这个任务还没有任何一版被确认过——只有提交时 create 的读回是这样。

    逐条比较（Transition 是值对象：版本、起止状态、触发源、发起者、原因、时间都相同才算同一条）：

    * 存储里版本大于 base 的在线记录必须逐条等于 ``local`` 里同一版本的那条，快照版本 n 不超过
      base + len(local)，快照的状态是第 n 版记录的终点——那些写都成功了，从 n 接着写；n == base 表示本进程的写
      一条也没落库，重写。
    * 版本不超过 base 的记录是接手时的底子，不逐条比（本进程没有它们；它们可能已被归档出在线库）。为什么
      这样仍然分得清"自己的"与"别人的"：底子之后别人的任何改写都要么留下一条版本 > base 的记录（接手
      ``cluster:adopted``、reconcile 判 lost、运维的 retry / reset / 强制迁移都递增版本号），与本进程同版本的
      记录对不上；要么换了持有者而不改版本号（交还之后被别的 worker 认领：认领只写 owner 与租约），所以
      base > 0 时还要求存储里的持有者仍是 ``holder``。
    * **在线历史可以缺头，但缺的只能是确认过的版本**（不超过 ``max(base, durable)``）。在线历史总是一段
      连续的版本、止于 n：归档只删每个任务最老的一段前缀（持久层实现指南 §9），运行得比保留窗口还久的任务，
      早期的记录就不在线了。已确认的版本不必再看：存储确认那次写时已按 expect_version 核对过、记录只追加不
      改写，它们就是本进程写的（或接手时的底子）；仍在线的照样逐条核对。还没确认的那几版（durable 之后，
      正是结果未知的那次写带的）必须都在线、逐条对得上才算本进程的——它们也被归档掉的话（结果未知的状态拖过
      了整个保留窗口）无从核对，保守地判 DIVERGED：宁可停写、如实记下 fenced，也不在看不见的记录上接着写。
      durable 为 None 时一条也不能缺。
    * 存储的版本比 durable 还旧（确认过的写不见了：被删了又以同一个 id 重建、或从备份恢复）不是本进程的前缀。
    * 存储里没有这个任务：只有 create 的读回（durable 为 None、base 为 0）才是 ABSENT（create 没写进去，
      可以再建）。否则这个任务在存储里确认存在过——提交时 create 已确认，或是从存储里认领来的——不见了只能是
      被人删了（``prune`` / 归档器整体归档终态任务 / 手工删除），按隔离处理，**绝不重建**：重建等于替运维
      撤销一次删除，把一个已被清走的任务连同本进程的历史又写回去。
    """
    if stored is None:
        return Verdict.ABSENT if durable is None and base == 0 else Verdict.DIVERGED
    n = stored.status_version
    known = base if durable is None else max(base, durable)
    mine = n - base  # 存储里属于本进程的条数
    if n < known or mine > len(local):
        return Verdict.DIVERGED
    if base and holder is not None and stored.owner != holder:
        return Verdict.DIVERGED
    # 在线历史：一段连续的版本 first .. n（空的表示全都归档了，first = n + 1）；缺的头只能是确认过的版本。
    first = history[0].version if history else n + 1
    if first < 1 or first - 1 > known or first + len(history) - 1 != n:
        return Verdict.DIVERGED
    for offset, record in enumerate(history):
        version = first + offset
        if record.version != version:
            return Verdict.DIVERGED
        # 底子（版本 <= base）不比：本进程没有它们。
        if version > base and record != local[version - base - 1]:
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
