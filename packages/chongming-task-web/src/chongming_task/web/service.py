"""控制台的全部读写：同步函数，只经公开 API 碰存储（由路由放进线程池执行）。

这一层不知道 HTTP：参数已由 ``filters`` 校验过，结果是只含 JSON 值的 dict，页面、JSON API 与 SSE
共用。控制动作一律走正常的跨进程指令通道（``TaskStore.submit_command``，发起者 ``web:<操作者>``），
与 ``chongming-task stop`` 写下的是同一种指令，由持有任务的进程取走执行，所以 ``history`` 里看得到
是谁、为什么——控制台自己从不改写任务状态。没有任何入口接受代码或可调用对象：只有任务 id、动作名
（stop / pause / resume / retry）与一段原因文本。

retry（重试持久任务）例外地不是一条指令：已结束的任务没有持有者可以去执行它，所以与
``chongming-task retry`` 一样，直接经 ``Controller.requeue``（审计过的 retry()，记为 ``control:retry``，
操作者 ``web:<操作者>``）把它交回队列，等 worker 认领。
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from chongming_task import CommandAction, TaskSnapshot, TaskStatus, TaskStore
from chongming_task.controller import Controller
from chongming_task.errors import ConcurrencyConflict, ConfigurationError, TaskError, TaskNotFound
from chongming_task.runtime.cluster import format_buckets  # 与 doctor / check_cluster 同一种桶号写法
from chongming_task.storage import MAX_LOG_LINES
from chongming_task.web.filters import BadRequest, Cursor, TaskFilter, page_query
from chongming_task.web.present import (
    ACTION_LABELS,
    ACTION_STATUSES,
    ACTIVE_STATUSES,
    QUEUED_STATUSES,
    RETRY_STATUSES,
    STATUS_LABELS,
    age,
    fmt_time,
    log_row,
    log_stats_view,
    status_label,
    task_detail,
    task_row,
)

MAX_REASON = 1000
MAX_OPERATOR = 64
MAX_BULK = 10_000
"""一次批量操作最多写多少条指令：更多的要再确认一次（一次请求不该无限期地占着一个线程）。"""

BULK_BATCH = 500
MAX_PENDING = 50_000
ORPHAN_LIMIT = 100
LOG_WINDOW = 200
"""任务页显示、实时跟随的日志尾部行数（更早的行用 JSON API 按 seq 翻）。"""


class Conflict(RuntimeError):
    """动作与任务当前状态不符，或批量的数目在确认之后变多了（HTTP 409）。消息给用户看。"""

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data or {}


class NotFound(LookupError):
    """任务不存在（HTTP 404）。"""


def check_reason(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest("原因（reason）必须是文本")
    text: str = value.strip()
    if not text:
        return None
    if len(text) > MAX_REASON:
        raise BadRequest(f"原因（reason）太长：最多 {MAX_REASON} 个字符")
    if "\x00" in text:
        raise BadRequest("原因（reason）不能包含 NUL 字符")
    return text


def check_operator(value: Any) -> str:
    """操作者名字：写进指令的发起者 ``web:<名字>``。只许可见字符，避免日志与历史里出现控制字符。"""
    if not isinstance(value, str) or not value.strip():
        raise BadRequest("操作者名字不能为空：它会以 web:<名字> 写进迁移历史")
    name: str = value.strip()
    if len(name) > MAX_OPERATOR:
        raise BadRequest(f"操作者名字太长：最多 {MAX_OPERATOR} 个字符")
    if any(not ch.isprintable() for ch in name):
        raise BadRequest("操作者名字只能包含可见字符")
    return name


def check_action(value: Any) -> str:
    if value not in ACTION_STATUSES:
        raise BadRequest(f"未知动作 {str(value)[:50]!r}：只能是 stop、pause 或 resume")
    return str(value)


def check_task_action(value: Any) -> str:
    """单个任务上的动作：批量的三种之外还有 retry（只对已结束的持久任务）。"""
    if value == "retry":
        return "retry"
    if value not in ACTION_STATUSES:
        raise BadRequest(f"未知动作 {str(value)[:50]!r}：只能是 stop、pause、resume 或 retry")
    return str(value)


@dataclass(frozen=True)
class PendingRequest:
    action: str
    issuer: str
    at: datetime


class PendingRequests:
    """本控制台发出、持有者还没执行的请求（只在内存里：它只用来把"未确认"如实标出来）。

    存储没有"列出待执行指令"的公开读法，所以"未确认"以存储里的快照为准来解除：stop 在任务进入
    stopping 或终态时、pause 在出现 paused 或终态时、resume 在任务离开 paused 时。
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, PendingRequest] = {}

    def add(self, task_id: str, action: str, issuer: str, at: datetime) -> None:
        with self._lock:
            self._items.pop(task_id, None)
            self._items[task_id] = PendingRequest(action, issuer, at)  # 新请求取代旧的
            # 持有者永远不执行的请求（进程已不在）不会自己解除：只留最新的一批，内存有上界。
            while len(self._items) > MAX_PENDING:
                del self._items[next(iter(self._items))]

    def view(self, snapshot: TaskSnapshot, now: datetime) -> dict[str, Any] | None:
        with self._lock:
            request = self._items.get(snapshot.task_id)
            if request is None:
                return None
            if _settled(request.action, snapshot.status):
                del self._items[snapshot.task_id]
                return None
        return {
            "action": request.action,
            "label": f"{ACTION_LABELS[request.action]}请求未确认",
            "issuer": request.issuer,
            "age": age(request.at, now),
        }

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


def _settled(action: str, status: TaskStatus) -> bool:
    if status.is_terminal:
        return True
    if action == "stop":
        return status is TaskStatus.STOPPING
    if action == "pause":
        return status is TaskStatus.PAUSED
    return status is not TaskStatus.PAUSED  # resume


class LogTail:
    """一个日志视图（任务 + 可选的尝试号）的滚动窗口，作为共享轮询器的取数函数。

    第一次读出仍保存的全部行（存储每任务最多保存 ``MAX_LOG_LINES`` 行，一次查询就够）并留下最后
    ``window`` 行；之后每次只读 seq 大于已见最大 seq 的新行——每个间隔一次存储查询，不管多少个浏览器在看。
    与 ``logs --follow`` 同一种续读条件（seq 严格递增、严格大于），所以不重不漏。
    """

    def __init__(self, store: TaskStore, task_id: str, attempt: int | None, window: int = LOG_WINDOW) -> None:
        self.store = store
        self.task_id = task_id
        self.attempt = attempt
        self.lines: deque[dict[str, Any]] = deque(maxlen=window)
        self.last_seq: int | None = None

    def __call__(self) -> dict[str, Any]:
        while True:
            batch = self.store.read_logs(
                self.task_id, attempt=self.attempt, after_seq=self.last_seq, limit=MAX_LOG_LINES
            )
            self.lines.extend(log_row(line) for line in batch)
            if batch:
                self.last_seq = batch[-1].seq
            elif self.last_seq is None:
                self.last_seq = 0
            if len(batch) < MAX_LOG_LINES:
                break
        return {
            "task_id": self.task_id,
            "attempt": self.attempt,
            "window": self.lines.maxlen,
            "last_seq": self.last_seq,
            "lines": list(self.lines),
        }


class ConsoleService:
    """一个存储上的控制台操作。线程安全：存储本身线程安全，这里的可变状态只有带锁的 PendingRequests。"""

    def __init__(self, store: TaskStore, *, num_buckets: int, read_only: bool = False) -> None:
        self.store = store
        self.num_buckets = num_buckets
        self.read_only = read_only
        self.pending = PendingRequests()
        self._reader_lock = threading.Lock()
        self._reader: Controller | None = None

    @staticmethod
    def now() -> datetime:
        return datetime.now(UTC)

    def close(self) -> None:
        with self._reader_lock:
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.close(reason="网页控制台退出")

    def _reader_controller(self) -> Controller:
        """体检与 reconcile 预演用的 Controller：不提交任务，所以不登记节点、不认领任何指令。"""
        with self._reader_lock:
            if self._reader is None:
                self._reader = Controller(store=self.store, owner="web:console", num_buckets=self.num_buckets)
            return self._reader

    # -- reads --------------------------------------------------------------------------------------

    def ping(self) -> None:
        self.store.get("__chongming_web_healthz__")  # 走一次真实查询：存储断了，healthz 就该失败

    def list_page(self, flt: TaskFilter, cursor: Cursor | None, size: int) -> dict[str, Any]:
        """一页任务（新的在前）与下一页的游标。同一微秒创建的多行跨页时也不重不漏。"""
        now = self.now()
        fetch = size + 1
        while True:
            rows = self.store.query(page_query(flt, cursor, fetch))
            full = len(rows) == fetch
            if cursor is not None:
                # 与游标同一时刻的行：按 (created_at, task_id) 降序，只要排在游标之后的。
                key = (cursor.created_at, cursor.task_id)
                rows = [s for s in rows if (s.created_at, s.task_id) < key]
            if len(rows) > size or not full:
                break
            fetch *= 2  # 整页都是被筛掉的同一时刻行（极少见）：取更多再试
        page, more = rows[:size], len(rows) > size
        last = page[-1] if page else None
        return {
            "tasks": [task_row(s, now, self.pending.view(s, now)) for s in page],
            "next_cursor": Cursor(last.created_at, last.task_id).encode() if more and last else None,
        }

    def task(self, task_id: str) -> dict[str, Any]:
        snapshot = self.store.get(task_id)
        if snapshot is None:
            raise NotFound(f"找不到任务 {task_id!r}：它可能已被 prune 清理，或 id 写错了")
        now = self.now()
        return task_detail(snapshot, self.store.history(task_id), now, self.pending.view(snapshot, now))

    def logs(self, task_id: str, attempt: int | None, after: int | None, limit: int) -> dict[str, Any]:
        """按 seq 升序的一页日志（JSON API）：``after`` 之后、最多 ``limit`` 行，外加计数。"""
        if self.store.get(task_id) is None:
            raise NotFound(f"找不到任务 {task_id!r}：它可能已被 prune 清理，或 id 写错了")
        lines = self.store.read_logs(task_id, attempt=attempt, after_seq=after, limit=limit)
        stats = self.store.log_stats(task_id)
        return {
            "task_id": task_id,
            "attempt": attempt,
            "lines": [log_row(line) for line in lines],
            "next_after": lines[-1].seq if lines else after,
            "more": len(lines) == limit,
            "stats": log_stats_view(stats),
        }

    def log_tail(self, task_id: str, attempt: int | None) -> dict[str, Any]:
        """任务页首屏的日志尾部与计数（之后由 ``/api/stream/logs`` 续上）。"""
        tail = LogTail(self.store, task_id, attempt)()
        tail["stats"] = log_stats_view(self.store.log_stats(task_id))
        return tail

    def overview(self) -> dict[str, Any]:
        now = self.now()
        stats = self.store.stats()
        counts = stats.to_dict()
        nodes = []
        for node in self.store.list_nodes():
            alive = node.alive(now)
            nodes.append(
                {
                    "owner": node.owner,
                    "alive": alive,
                    "buckets": "全部（不限定）" if node.buckets is None else format_buckets(node.buckets),
                    "num_buckets": node.num_buckets,
                    "heartbeat": age(node.heartbeat_at, now),
                    "expires_at": fmt_time(node.expires_at),
                    "freshness": "存活" if alive else f"已过期（{age(node.expires_at, now)}）",
                }
            )
        return {
            "total": stats.total,
            "unfinished": stats.unfinished,
            "active": sum(counts[s.value] for s in ACTIVE_STATUSES),
            "queued": sum(counts[s.value] for s in QUEUED_STATUSES),
            "statuses": [
                {"status": s.value, "label": STATUS_LABELS[s], "count": counts[s.value]} for s in TaskStatus
            ],
            "buckets": [{"bucket": b, "count": n} for b, n in sorted(self.store.bucket_counts().items())],
            "nodes": nodes,
        }

    def doctor(self) -> dict[str, Any]:
        """集群体检（与 ``chongming-task doctor`` 同一份 check_cluster）与 reconcile 预演（不写任何状态）。"""
        reader = self._reader_controller()
        report = reader.check_cluster(orphan_limit=ORPHAN_LIMIT)
        dry = reader.reconcile(dry_run=True)
        now = self.now()

        def brief(items: list[TaskSnapshot]) -> list[dict[str, Any]]:
            return [task_row(s, now) for s in items]

        return {
            "healthy": report.healthy,
            "problems": report.problems(),
            "warnings": report.warnings(),
            "reconcile": {
                "lost": brief(dry.lost),
                "adoptable": brief(dry.adoptable),
                "skipped": brief(dry.skipped),
            },
        }

    def bulk_preview(self, flt: TaskFilter, action: str) -> dict[str, Any]:
        """批量动作会作用到的任务数（按状态分）：确认页显示它，执行时以它为上限。"""
        stats = self.store.stats(flt.query(statuses=ACTION_STATUSES[action]))
        by_status = [
            {"status": s.value, "label": status_label(s), "count": n} for s, n in stats.counts.items() if n
        ]
        return {"action": action, "count": stats.total, "by_status": by_status, "filter": flt.to_dict()}

    # -- writes -------------------------------------------------------------------------------------

    def _refuse_if_read_only(self) -> None:
        if self.read_only:
            raise PermissionError("只读模式：这个控制台不接受任何操作（启动时去掉 --read-only 才能操作）")

    def act(self, task_id: str, action: str, *, operator: str, reason: str | None) -> dict[str, Any]:
        """对一个任务写一条 stop / pause / resume 指令（跨进程：由持有者取走执行）。"""
        self._refuse_if_read_only()
        snapshot = self.store.get(task_id)
        if snapshot is None:
            raise NotFound(f"找不到任务 {task_id!r}：它可能已被 prune 清理，或 id 写错了")
        verb = ACTION_LABELS[action]
        if snapshot.status not in ACTION_STATUSES[action]:
            raise Conflict(
                f"任务 {task_id} 当前是「{status_label(snapshot.status)}」（{snapshot.status.value}），"
                f"不能{verb}；刷新页面查看最新状态",
                {"status": snapshot.status.value},
            )
        issuer = f"web:{operator}"
        now = self.now()
        self.store.submit_command(task_id, CommandAction(action), issuer=issuer, reason=reason)
        self.pending.add(task_id, action, issuer, now)
        holder = snapshot.lease_owner or snapshot.owner or "（未知）"
        message = f"已受理：{verb}请求已写入存储，由持有者 {holder} 执行（未确认，页面会在状态变化时更新）"
        if snapshot.lease_until is not None and snapshot.lease_until < now:
            message += (
                f"。注意：持有者的租约已在 {fmt_time(snapshot.lease_until)} 过期，可能没有进程会执行它；"
                "确认持有进程已经不在后，可在总览页执行 reconcile"
            )
        return {
            "task_id": task_id,
            "action": action,
            "accepted": True,
            "confirmed": False,
            "message": message,
        }

    def retry(self, task_id: str, *, operator: str, reason: str | None) -> dict[str, Any]:
        """重试一个已结束（failed / stopped / cancelled / lost）的持久任务：与 CLI ``retry`` 同一条
        ``Controller.requeue`` 路径，迁移历史里记为 ``control:retry``、操作者 ``web:<操作者>``。"""
        self._refuse_if_read_only()
        snapshot = self.store.get(task_id)
        if snapshot is None:
            raise NotFound(f"找不到任务 {task_id!r}：它可能已被 prune 清理，或 id 写错了")
        if snapshot.recipe is not None and snapshot.status not in RETRY_STATUSES:
            allowed = "、".join(status_label(s) for s in TaskStatus if s in RETRY_STATUSES)
            raise Conflict(
                f"任务 {task_id} 当前是「{status_label(snapshot.status)}」（{snapshot.status.value}），"
                f"不能重试：只有{allowed}的持久任务能重试；刷新页面查看最新状态",
                {"status": snapshot.status.value},
            )
        controller = Controller(store=self.store, owner=f"web:{operator}", num_buckets=self.num_buckets)
        try:
            revived = controller.requeue(task_id, reason=reason)
        except TaskNotFound as exc:
            raise NotFound(f"找不到任务 {task_id!r}：{exc}") from None
        except ConfigurationError as exc:  # 不是持久任务：参数从未落库，只能重新提交
            raise BadRequest(str(exc)) from None
        except ConcurrencyConflict as exc:  # 确认之后别人先改了它
            raise Conflict(
                f"重试没有写入：{exc}；刷新页面查看最新状态", {"status": snapshot.status.value}
            ) from None
        except TaskError as exc:
            raise Conflict(
                f"重试被拒绝：{exc}；刷新页面查看最新状态", {"status": snapshot.status.value}
            ) from None
        finally:
            controller.close(reason="网页控制台重试结束")
        return {
            "task_id": task_id,
            "action": "retry",
            "accepted": True,
            "confirmed": True,
            "status": revived.status.value,
            "attempt": revived.attempt,
            "message": f"已重新排队：任务 {task_id} 将是第 {revived.attempt + 1} 次尝试，等 worker 认领",
        }

    def bulk_apply(
        self, flt: TaskFilter, action: str, *, operator: str, reason: str | None, expected: int
    ) -> dict[str, Any]:
        """对筛选出的任务逐个写指令。数目比确认时多 → Conflict（绝不作用到操作者没看到的任务上）。"""
        self._refuse_if_read_only()
        preview = self.bulk_preview(flt, action)
        if preview["count"] > expected:
            raise Conflict(
                f"符合条件的任务从确认时的 {expected} 个变成了 {preview['count']} 个：请重新确认",
                {"preview": preview},
            )
        issuer = f"web:{operator}"
        applicable = ACTION_STATUSES[action]
        issued: Counter[str] = Counter()
        cursor: Cursor | None = None
        total = 0
        while total < min(expected, MAX_BULK):
            batch = min(BULK_BATCH, min(expected, MAX_BULK) - total)
            query = replace(
                page_query(flt, cursor, batch + 1), statuses=flt.query(statuses=applicable).statuses
            )
            rows = self.store.query(query)
            if cursor is not None:
                key = (cursor.created_at, cursor.task_id)
                rows = [s for s in rows if (s.created_at, s.task_id) < key]
            rows = rows[:batch]
            if not rows:
                break
            now = self.now()
            for snapshot in rows:
                self.store.submit_command(
                    snapshot.task_id, CommandAction(action), issuer=issuer, reason=reason
                )
                self.pending.add(snapshot.task_id, action, issuer, now)
                issued[snapshot.status.value] += 1
            total += len(rows)
            cursor = Cursor(rows[-1].created_at, rows[-1].task_id)
        remaining = max(0, self.bulk_preview(flt, action)["count"] - total) if total >= MAX_BULK else 0
        message = f"已对 {total} 个任务写入{ACTION_LABELS[action]}请求（未确认：由各自的持有者执行）"
        if remaining:
            message += f"；一次最多 {MAX_BULK} 个，还有约 {remaining} 个，请再执行一次"
        return {"action": action, "issued": total, "by_status": dict(issued), "message": message}

    def reconcile(self, *, operator: str) -> dict[str, Any]:
        """真正执行 reconcile：把失去监督者的任务如实标记为 lost（actor 为 ``web:<操作者>``）。"""
        self._refuse_if_read_only()
        controller = Controller(store=self.store, owner=f"web:{operator}", num_buckets=self.num_buckets)
        try:
            report = controller.reconcile()
        finally:
            controller.close(reason="网页控制台 reconcile 结束")
        return {
            "lost": [s.task_id for s in report.lost],
            "adoptable": [s.task_id for s in report.adoptable],
            "skipped": [s.task_id for s in report.skipped],
            "message": (
                f"reconcile 完成：{len(report.lost)} 个判为结果未知（lost），"
                f"{len(report.adoptable)} 个需要重新提交，{len(report.skipped)} 个有人正在写、已跳过"
            ),
        }


__all__ = [
    "LOG_WINDOW",
    "MAX_BULK",
    "Conflict",
    "ConsoleService",
    "LogTail",
    "NotFound",
    "PendingRequests",
    "check_action",
    "check_operator",
    "check_reason",
    "check_task_action",
    "format_buckets",
]
