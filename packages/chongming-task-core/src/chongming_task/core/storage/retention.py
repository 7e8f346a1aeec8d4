"""时间窗口保留的共用算法（issue 20；存储指南 §9）：哪些迁移记录可以离开在线库。

规则只有一条，所有后端共用这一份实现，语义因此逐字一致：

    一个任务可以归档的，是它在线历史里**最长的、每一条都早于截止时刻的前缀**。

为什么是"前缀"而不是"早于截止时刻的全部"：迁移的 ``at`` 来自写入它的节点的时钟，不同节点的时钟
可能相差几秒，同一任务的 ``at`` 未必随版本单调。只删"早于截止时刻"的行，遇到一条乱序的旧时间就会在
线上历史中间挖出一个洞；只删前缀，则线上留下的永远是一段连续的后缀（版本从某个 > 1 的数开始），归档
里是连续的前缀，两者拼起来没有空洞、没有重叠——``merged_history`` 的版本连续性检查就建立在这上面。

扫描按 ``(task_id, version)`` 键集分页：后端只需提供"严格在某键之后、按键升序的若干条"这一个原语。
一个任务的前缀一旦断开（遇到一条不早于截止时刻的记录），就直接跳到下一个任务（游标设成
``(task_id, MAX_VERSION)``），不再读它剩下的行——于是一次完整扫描读到的行数约等于"可归档的行数 +
任务数"，而不是整张表。
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, ClassVar, Protocol

from chongming_task.core.storage.values import ArchiveDeleted, ArchivedTask, ArchiveReceipt
from chongming_task.models import Transition

MAX_VERSION = 2**63 - 1
"""版本号的上界（SQL 后端的 64 位整数）：游标 ``(task_id, MAX_VERSION)`` 等于"跳过这个任务剩下的行"。"""

START_KEY: tuple[str, int] = ("", -1)
"""比任何真实键都小的游标（task_id 非空、版本 >= 1）。"""

Fetch = Callable[[tuple[str, int], int], Sequence[Transition]]
"""``fetch(after, n)``：严格在键 ``after`` 之后、按 (task_id, version) 升序的至多 n 条迁移记录。"""


def archivable_prefix(
    fetch: Fetch, before: datetime, after: tuple[str, int] | None, limit: int
) -> list[Transition]:
    """按键升序返回游标 ``after`` 之后、至多 ``limit`` 条"可归档前缀"里的迁移记录（规则见模块说明）。

    ``after`` 落在某任务的中间（上一批在这里截断）时，从它的下一条继续：前面那些都早于截止时刻
    （否则不会被导出），前缀性质照样成立。
    """
    out: list[Transition] = []
    cursor = START_KEY if after is None else after
    # 游标落在某任务中间时，这个任务的前缀此前一直没有断。
    while len(out) < limit:
        # 每次只取还差的条数（至少 256）：多取的行解码了又扔掉，下一批还要再读一遍。
        chunk = min(max(limit - len(out), 256), 20_000)
        rows = fetch(cursor, chunk)
        if not rows:
            break
        broken: str | None = None
        for record in rows:
            if record.task_id == broken:
                continue
            if record.at < before:
                out.append(record)
                if len(out) >= limit:
                    return out
            else:
                broken = record.task_id
        last = rows[-1]
        # 最后一个任务断了：跳过它剩下的行；没断：从最后一条之后接着读。
        cursor = (last.task_id, MAX_VERSION) if last.task_id == broken else (last.task_id, last.version)
        if len(rows) < chunk:
            break
    return out


def version_runs(keys: Sequence[tuple[str, int]], rows: int) -> list[list[tuple[str, int, int]]]:
    """回执里的键 → 连续版本段 ``(task_id, 首版本, 末版本)``，再按每批至多 ``rows`` 行分批。

    SQL 后端的 ``delete_archived`` 用它：导出按 (task_id, version) 升序，一个任务的前缀是一段连续的版本，
    一条按范围的 DELETE 顶得上七八条按键的。只合并真正相邻的键（同一任务、版本恰好 +1），所以删的仍然
    正好是回执列出的那些行。
    """
    batches: list[list[tuple[str, int, int]]] = []
    batch: list[tuple[str, int, int]] = []
    count = 0
    task: str | None = None
    first = last = 0
    for task_id, version in keys:
        if task_id == task and version == last + 1 and count < rows:
            last = version
            count += 1
            continue
        if task is not None:
            batch.append((task, first, last))
            if count >= rows:
                batches.append(batch)
                batch, count = [], 0
        task, first, last = task_id, version, version
        count += 1
    if task is not None:
        batch.append((task, first, last))
    if batch:
        batches.append(batch)
    return batches


class RetentionModule(Protocol):
    """实现归档保留的模块（SQL 后端的 ``_archive``）：四个函数，第一个参数是存储本身。"""

    def export_transitions(
        self, store: Any, before: datetime, after: tuple[str, int] | None, limit: int
    ) -> list[Transition]: ...

    def export_finished(
        self, store: Any, before: datetime, after: str | None, limit: int
    ) -> list[ArchivedTask]: ...

    def delete_archived(self, store: Any, receipt: ArchiveReceipt) -> ArchiveDeleted: ...

    def purge_commands(self, store: Any, completed_before: datetime) -> int: ...


class RetentionByModule:
    """TaskStore 的混入：归档保留的四个方法原样转交给类属性 ``_retention`` 指向的模块。

    SQLite 与 Postgres 后端都把实现放在各自的 ``_archive`` 模块里，转交的签名只写在这里一份。
    混入要写在 ``TaskStore`` 之前：``class MyStore(RetentionByModule, TaskStore)``。
    """

    _retention: ClassVar[RetentionModule]

    def export_transitions(
        self, before: datetime, *, after: tuple[str, int] | None = None, limit: int = 1000
    ) -> list[Transition]:
        return self._retention.export_transitions(self, before, after, limit)

    def export_finished(
        self, before: datetime, *, after: str | None = None, limit: int = 100
    ) -> list[ArchivedTask]:
        return self._retention.export_finished(self, before, after, limit)

    def delete_archived(self, receipt: ArchiveReceipt) -> ArchiveDeleted:
        return self._retention.delete_archived(self, receipt)

    def purge_commands(self, completed_before: datetime) -> int:
        return self._retention.purge_commands(self, completed_before)


__all__ = [
    "MAX_VERSION",
    "START_KEY",
    "Fetch",
    "RetentionByModule",
    "RetentionModule",
    "archivable_prefix",
    "version_runs",
]
