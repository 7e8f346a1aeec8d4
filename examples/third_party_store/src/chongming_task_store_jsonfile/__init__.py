"""JsonFileTaskStore：把全部任务、历史与指令存进一个 JSON 文件的第三方后端范例。

它演示一个后端最少要做的几件事，刻意写得短：

* 继承 ``TaskStore``，实现 25 个抽象方法（含归档保留的 4 个、任务日志的 3 个）；语义不靠猜，
  靠跑 ``StoreContract``（见 tests/）。
* 序列化只用核心提供的 ``to_dict()`` / ``from_dict()``：它们保证逐字段精确往返
  （带时区的时间到微秒、frozenset 标签、嵌套的 failure / progress）。每次读取都重新反序列化，
  所以调用方拿到的永远是副本，改它不会改到存储。
* 一把锁护住"检查版本 + 写入"，save 因此是原子的；每次修改都整份重写文件（先写临时文件再
  ``os.replace``），进程崩溃也不会留下半截文件。
* 时间（指令创建与租约）取自注入的 ``clock``，测试可以用 FakeClock。
* 通过入口点 ``chongming_task.stores`` 登记 scheme ``jsonfile``：``open_store("jsonfile:///路径.json")``。

适用范围：单进程。它没有跨进程文件锁——两个进程同时打开同一个文件会互相覆盖。要跨进程请用
SQLite / Postgres 后端；要写自己的跨进程后端，请读 docs/store-guide.md 的"原子性与并发"一节。
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from chongming_task.clock import SYSTEM_CLOCK, Clock
from chongming_task.core.storage.checks import (
    append_logs_args,
    check_aware,
    check_count,
    check_holder,
    check_json_value,
    check_key,
    check_node_owner,
    check_node_record,
    check_receipt,
    check_snapshot,
    check_transitions,
    claim_args,
    command_args,
    export_finished_args,
    export_transitions_args,
    read_logs_args,
    touch_args,
    validate_save,
)
from chongming_task.core.storage.claiming import (
    ClaimStart,
    QueuedClaim,
    claim_order,
    claimable,
    claimed,
    start_claimed,
)
from chongming_task.core.storage.columns import CREATE_ONLY_FIELDS, SIDE_CHANNEL_FIELDS
from chongming_task.core.storage.contract import TaskStore
from chongming_task.core.storage.retention import archivable_prefix
from chongming_task.core.storage.values import (
    MAX_LOG_LINES,
    ArchiveDeleted,
    ArchivedTask,
    ArchiveReceipt,
    Command,
    CommandAction,
    LogLine,
    LogStats,
    NodeRecord,
    TaskQuery,
    TaskStats,
    as_query,
    count_buckets,
    lease_held_message,
    lease_is_held,
    unseen_log_lines,
)
from chongming_task.errors import (
    ConcurrencyConflict,
    ConfigurationError,
    DuplicateTaskId,
    StoreError,
    TaskNotFound,
)
from chongming_task.models import Progress, TaskSnapshot, Transition

FORMAT_VERSION = 1


def _parse_time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _time_text(value: datetime) -> str:
    return value.isoformat(timespec="microseconds")


def _snapshot_dict(snapshot: TaskSnapshot) -> dict[str, Any]:
    data = check_snapshot(snapshot).to_dict()
    # to_dict 不复制 outcome：经一次 JSON 往返既校验可序列化，又切断与调用方对象的联系。
    data["outcome"] = json.loads(check_json_value(snapshot.outcome))
    return data


def _copy_json(value: Any) -> Any:
    """JSON 值的深拷贝。from_dict 会原样引用字典里的 outcome / payload，不拷贝就等于把存储交了出去。"""
    return json.loads(json.dumps(value)) if isinstance(value, (dict, list)) else value


def _thaw(data: dict[str, Any]) -> TaskSnapshot:
    return TaskSnapshot.from_dict({**data, "outcome": _copy_json(data["outcome"])})


def _thaw_command(data: dict[str, Any]) -> Command:
    return Command.from_dict({**data, "payload": _copy_json(data["payload"])})


class JsonFileTaskStore(TaskStore):
    """单文件 JSON 存储。``path`` 不存在时新建；存在时载入。"""

    def __init__(self, path: str | os.PathLike[str], *, clock: Clock | None = None) -> None:
        self._path = Path(path)
        self._clock: Clock = clock or SYSTEM_CLOCK
        self._lock = threading.RLock()
        self._closed = False
        self._tasks: dict[str, dict[str, Any]] = {}
        self._history: dict[str, dict[str, dict[str, Any]]] = {}
        self._commands: dict[str, dict[str, Any]] = {}
        self._nodes: dict[str, dict[str, Any]] = {}
        # 任务日志：task_id → {"seq": 最后分配的序号, "lines": [LogLine.to_dict(), ...],
        # "writers": {写入者: 已接受的最大 writer_seq}}，最多 MAX_LOG_LINES 行。writers 是重试幂等的水位线
        # （unseen_log_lines）；没有这个键的旧文件当作还没有水位线。
        self._logs: dict[str, dict[str, Any]] = {}
        self._next_command = 1
        if self._path.exists():
            self._load()
        else:
            if not self._path.parent.is_dir():
                raise StoreError(
                    f"目录 {self._path.parent} 不存在：请先创建它，JsonFileTaskStore 只负责文件本身"
                )
            self._flush()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> JsonFileTaskStore:
        """``jsonfile:///绝对路径.json`` 或 ``jsonfile:相对路径.json``。"""
        scheme, sep, rest = url.partition(":")
        if scheme.lower() != "jsonfile" or not sep:
            raise ConfigurationError(f"连接串必须以 jsonfile: 开头，收到 {url!r}")
        path = rest[2:] if rest.startswith("//") else rest
        if not path:
            raise ConfigurationError("jsonfile 连接串缺少文件路径，例如 jsonfile:///var/lib/app/tasks.json")
        return cls(path, **kwargs)

    @property
    def path(self) -> Path:
        return self._path

    def __repr__(self) -> str:
        return f"JsonFileTaskStore({str(self._path)!r})"

    # -- file I/O (lock held) -----------------------------------------------------------------------

    def _load(self) -> None:
        try:
            document = json.loads(self._path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise StoreError(f"读不了存储文件 {self._path}：{exc}") from exc
        if document.get("format") != FORMAT_VERSION:
            raise StoreError(
                f"{self._path} 的格式版本是 {document.get('format')!r}，本程序只认 {FORMAT_VERSION}"
            )
        self._tasks = document["tasks"]
        self._history = document["history"]
        self._commands = document["commands"]
        self._next_command = document["next_command"]
        # 节点记录是后加的：旧文件里没有这个键，当作还没有节点发布过。
        self._nodes = document.get("nodes", {})
        # 任务日志也是后加的（issue 18）：旧文件里没有这个键，当作还没有日志；下一次写入时连同它一起写回。
        self._logs = document.get("logs", {})

    def _flush(self) -> None:
        document = {
            "format": FORMAT_VERSION,
            "tasks": self._tasks,
            "history": self._history,
            "commands": self._commands,
            "next_command": self._next_command,
            "nodes": self._nodes,
            "logs": self._logs,
        }
        temp = self._path.with_name(self._path.name + ".tmp")
        try:
            temp.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
            # 先写临时文件再原子替换：崩溃时要么是旧文件，要么是新文件，不会是半截。
            # 范例为了简单没有 fsync；生产后端要在替换前 fsync 文件、替换后 fsync 目录。
            os.replace(temp, self._path)
        except OSError as exc:
            raise StoreError(f"写不了存储文件 {self._path}：{exc}") from exc

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"存储 {self._path} 已关闭：close() 之后不能再读写")

    def _require(self, task_id: str) -> dict[str, Any]:
        data = self._tasks.get(task_id)
        if data is None:
            raise TaskNotFound(f"存储里没有任务 {task_id!r}")
        return data

    def _matching(self, query: TaskQuery | None) -> list[TaskSnapshot]:
        snapshots = [_thaw(data) for data in self._tasks.values()]
        return snapshots if query is None else [s for s in snapshots if as_query(query).matches(s)]

    # -- snapshots ----------------------------------------------------------------------------------

    def create(self, snapshot: TaskSnapshot, transitions: Sequence[Transition] = ()) -> None:
        data = _snapshot_dict(snapshot)
        records = list(transitions)
        check_transitions(snapshot.task_id, records)
        with self._lock:
            self._check_open()
            if snapshot.task_id in self._tasks:
                raise DuplicateTaskId(f"task_id {snapshot.task_id!r} 已存在：想重跑请换一个 task_id 提交")
            self._tasks[snapshot.task_id] = data
            history = self._history.setdefault(snapshot.task_id, {})
            for record in records:
                history.setdefault(str(record.version), record.to_dict())
            self._flush()

    def save(
        self,
        snapshot: TaskSnapshot,
        *,
        expect_version: int,
        transitions: Sequence[Transition] = (),
        lease_expired_before: datetime | None = None,
    ) -> None:
        validate_save(snapshot, expect_version, transitions)
        check_aware("lease_expired_before", lease_expired_before)
        data = _snapshot_dict(snapshot)
        with self._lock:
            self._check_open()
            current = self._require(snapshot.task_id)
            if current["status_version"] != expect_version:
                raise ConcurrencyConflict(
                    f"任务 {snapshot.task_id!r} 的版本已是 {current['status_version']}，"
                    f"不是期望的 {expect_version}"
                )
            lease_until = _thaw(current).lease_until
            if lease_is_held(lease_until, lease_expired_before):  # reconcile 的写：租约必须仍已过期
                raise ConcurrencyConflict(lease_held_message(snapshot.task_id, lease_until))
            for key in SIDE_CHANNEL_FIELDS:  # 旁路字段只归 touch 管
                data[key] = current[key]
            for key in CREATE_ONLY_FIELDS:  # 配方只由 create 写入（旧文件里没有这个键：普通任务）
                data[key] = current.get(key)
            self._tasks[snapshot.task_id] = data
            history = self._history.setdefault(snapshot.task_id, {})
            for record in transitions:
                history.setdefault(str(record.version), record.to_dict())
            self._flush()

    def get(self, task_id: str) -> TaskSnapshot | None:
        check_key("task_id", task_id)
        with self._lock:
            self._check_open()
            data = self._tasks.get(task_id)
            return None if data is None else _thaw(data)

    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        query = as_query(query)
        with self._lock:
            self._check_open()
            return query.apply(self._matching(None))

    def stats(self, query: TaskQuery | None = None) -> TaskStats:
        with self._lock:
            self._check_open()
            selected = self._matching(query)
        return TaskStats.of(selected)

    def bucket_counts(self, query: TaskQuery | None = None) -> dict[int, int]:
        with self._lock:
            self._check_open()
            selected = self._matching(query)
        return count_buckets(selected)

    # -- history ------------------------------------------------------------------------------------

    def append(self, transitions: Sequence[Transition]) -> None:
        records = list(transitions)
        check_transitions(None, records)
        with self._lock:
            self._check_open()
            for record in records:
                self._require(record.task_id)  # 先全部检查：有未知任务就整批不写
            for record in records:
                self._history.setdefault(record.task_id, {}).setdefault(str(record.version), record.to_dict())
            self._flush()

    def history(self, task_id: str) -> list[Transition]:
        check_key("task_id", task_id)
        with self._lock:
            self._check_open()
            records = [Transition.from_dict(data) for data in self._history.get(task_id, {}).values()]
        return sorted(records, key=lambda record: record.version)

    # -- durable tasks (issue 19) -------------------------------------------------------------------

    def _claim_queued(self, request: QueuedClaim) -> list[TaskSnapshot]:
        """认领待执行的持久任务：判据、顺序与认领后的快照都取自 ``core.storage.claiming``，锁内一次完成。"""
        with self._lock:
            taken = self._claimed_locked(request)
            for snapshot in taken:
                self._tasks[snapshot.task_id] = _snapshot_dict(snapshot)
            if taken:
                self._flush()
            return taken

    def _claim_and_start(self, request: QueuedClaim, start: ClaimStart) -> list[TaskSnapshot]:
        """认领并开始（一次落盘）：开始之后的快照与迁移记录由 ``claiming.start_claimed``（状态机）算出，
        存储不自己拼 starting 的字段。"""
        with self._lock:
            result: list[TaskSnapshot] = []
            for snapshot in self._claimed_locked(request):
                begun = start_claimed(snapshot, start)
                if begun is not None:
                    snapshot, transitions = begun
                    history = self._history.setdefault(snapshot.task_id, {})
                    for record in transitions:
                        history.setdefault(str(record.version), record.to_dict())
                self._tasks[snapshot.task_id] = _snapshot_dict(snapshot)
                result.append(snapshot)
            if result:
                self._flush()
            return result

    def _claimed_locked(self, request: QueuedClaim) -> list[TaskSnapshot]:
        """（持锁调用）两种认领共用：挑出可认领的任务、按认领顺序取前 limit 个，交回写上持有者与租约之后的
        快照（还没存进 ``_tasks``，由调用方存）。"""
        self._check_open()
        if request.empty:
            return []
        candidates = [s for s in (_thaw(data) for data in self._tasks.values()) if claimable(s, request)]
        candidates.sort(key=claim_order)
        return [claimed(snapshot, request) for snapshot in candidates[: request.limit]]

    # -- side channel -------------------------------------------------------------------------------

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        touch_args(task_id, progress, heartbeat_at, lease_owner, lease_until)
        with self._lock:
            self._check_open()
            data = self._tasks.get(task_id)
            if data is None:
                return False
            # 只改这四个键，绝不碰 status_version：进度上报不该与状态写入冲突。
            if progress is not None:
                data["progress"] = progress.to_dict()
            if heartbeat_at is not None:
                data["last_heartbeat_at"] = _time_text(heartbeat_at)
            if lease_owner is not None:
                data["lease_owner"] = lease_owner
            if lease_until is not None:
                data["lease_until"] = _time_text(lease_until)
            self._flush()
            return True

    # -- commands -----------------------------------------------------------------------------------

    def submit_command(
        self,
        task_id: str,
        action: CommandAction | str,
        *,
        issuer: str | None = None,
        reason: str | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> Command:
        action, payload_dict = command_args(task_id, action, issuer, reason, payload)
        body = json.loads(check_json_value(payload_dict, what="指令 payload"))
        with self._lock:
            self._check_open()
            task = self._require(task_id)
            command = Command(
                command_id=f"cmd-{self._next_command:09d}",  # 顺序号即先后：同一时刻提交的也有序
                task_id=task_id,
                action=action,
                issuer=issuer,
                reason=reason,
                payload=body,
                created_at=self._clock.now(),
                bucket=task["bucket"],
            )
            self._next_command += 1
            self._commands[command.command_id] = command.to_dict()
            self._flush()
            return _thaw_command(self._commands[command.command_id])

    def claim_commands(
        self,
        claimant: str,
        *,
        lease: float,
        limit: int = 100,
        task_ids: Iterable[str] | None = None,
        buckets: Iterable[int] | None = None,
        holder: str | None = None,
    ) -> list[Command]:
        wanted_tasks, wanted_buckets = claim_args(claimant, lease, limit, task_ids, buckets)
        wanted_holder = check_holder(holder)
        claimed: list[Command] = []
        with self._lock:
            self._check_open()
            now = self._clock.now()
            for data in self._commands.values():  # dict 保持插入顺序 = 提交顺序
                if len(claimed) >= limit:
                    break
                if data["completed_at"] is not None:
                    continue
                held_until = _parse_time(data["lease_until"])
                if held_until is not None and held_until > now:
                    continue
                if wanted_tasks is not None and data["task_id"] not in wanted_tasks:
                    continue
                if wanted_buckets is not None and data["bucket"] not in wanted_buckets:
                    continue
                if wanted_holder is not None:
                    task = self._tasks.get(data["task_id"])
                    if task is None or task.get("owner") != wanted_holder:
                        continue
                data["claimant"] = claimant
                data["lease_until"] = _time_text(now + timedelta(seconds=lease))
                data["deliveries"] += 1
                claimed.append(_thaw_command(data))
            if claimed:
                self._flush()
        return claimed

    def complete_command(self, command_id: str, claimant: str) -> bool:
        check_key("command_id", command_id)
        with self._lock:
            self._check_open()
            data = self._commands.get(command_id)
            if data is None or data["claimant"] != claimant:
                return False
            if data["completed_at"] is None:
                data["completed_at"] = _time_text(self._clock.now())
                data["lease_until"] = None
                self._flush()
            return True

    def release_command(self, command_id: str, claimant: str) -> bool:
        check_key("command_id", command_id)
        with self._lock:
            self._check_open()
            data = self._commands.get(command_id)
            if data is None or data["claimant"] != claimant or data["completed_at"] is not None:
                return False
            data["claimant"] = None
            data["lease_until"] = None
            self._flush()
            return True

    # -- membership ---------------------------------------------------------------------------------

    def publish_node(self, record: NodeRecord) -> None:
        data = check_node_record(record).to_dict()  # 纯 JSON 的副本：之后改 record.info 碰不到存储
        with self._lock:
            self._check_open()
            self._nodes[record.owner] = data  # 按 owner 整条覆盖：后写者为准
            self._flush()

    def list_nodes(self) -> list[NodeRecord]:
        with self._lock:
            self._check_open()
            # from_dict 会重新规范 info（一次 JSON 往返），返回的永远是副本；过期的记录也照样列出。
            return [NodeRecord.from_dict(self._nodes[owner]) for owner in sorted(self._nodes)]

    def remove_node(self, owner: str) -> bool:
        check_node_owner(owner)
        with self._lock:
            self._check_open()
            if self._nodes.pop(owner, None) is None:
                return False
            self._flush()
            return True

    # -- upkeep -------------------------------------------------------------------------------------

    # -- task logs（issue 18；存储指南 §11）-------------------------------------------------------------

    def append_logs(self, lines: Sequence[LogLine]) -> None:
        batch = append_logs_args(lines)
        with self._lock:
            self._check_open()
            by_task: dict[str, list[LogLine]] = {}
            for line in batch:
                by_task.setdefault(line.task_id, []).append(line)
            for task_id, group in by_task.items():
                if task_id not in self._tasks:
                    continue  # 任务已不在：跳过（见契约）
                entry = self._logs.setdefault(task_id, {"seq": 0, "lines": []})
                writers = entry.setdefault("writers", {})
                fresh, marks = unseen_log_lines(group, writers)
                writers.update(marks)
                for line in fresh:
                    entry["seq"] += 1
                    entry["lines"].append({**line.to_dict(), "seq": entry["seq"]})
                if len(entry["lines"]) > MAX_LOG_LINES:
                    del entry["lines"][: len(entry["lines"]) - MAX_LOG_LINES]  # 丢最旧的
            if batch:
                self._flush()

    def read_logs(
        self, task_id: str, *, attempt: int | None = None, after_seq: int | None = None, limit: int = 1000
    ) -> list[LogLine]:
        read_logs_args(task_id, attempt, after_seq, limit)
        with self._lock:
            self._check_open()
            entry = self._logs.get(task_id) if task_id in self._tasks else None
            picked = [
                LogLine.from_dict(data)
                for data in (entry["lines"] if entry else [])
                if (after_seq is None or data["seq"] > after_seq)
                and (attempt is None or data["attempt"] == attempt)
            ]
            return picked[:limit]

    def log_stats(self, task_id: str) -> LogStats:
        check_key("task_id", task_id)
        with self._lock:
            self._check_open()
            entry = self._logs.get(task_id) if task_id in self._tasks else None
            if not entry:
                return LogStats()
            kept = len(entry["lines"])
            return LogStats(kept=kept, dropped=entry["seq"] - kept, last_seq=entry["seq"])

    def prune(self, keep_terminal: int) -> int:
        check_count("keep_terminal", keep_terminal)
        with self._lock:
            self._check_open()
            terminal = [s for s in self._matching(None) if s.is_terminal]
            excess = len(terminal) - keep_terminal
            if excess <= 0:
                return 0
            # 最旧的在前：按 finished_at；没有 finished_at 的终态记录视为最旧。
            terminal.sort(key=lambda s: (s.finished_at is not None, s.finished_at or s.created_at, s.task_id))
            doomed = {s.task_id for s in terminal[:excess]}
            for task_id in doomed:
                del self._tasks[task_id]
                self._history.pop(task_id, None)
                self._logs.pop(task_id, None)
            self._commands = {cid: c for cid, c in self._commands.items() if c["task_id"] not in doomed}
            self._flush()
            return len(doomed)

    # -- retention: archive-then-delete（存储指南 §9）-------------------------------------------------
    # 前缀规则与键集扫描直接用 core 的 archivable_prefix：后端只需提供"某键之后按键升序的若干条"。

    def export_transitions(
        self, before: datetime, *, after: tuple[str, int] | None = None, limit: int = 1000
    ) -> list[Transition]:
        after = export_transitions_args(before, after, limit)

        def fetch(cursor: tuple[str, int], n: int) -> list[Transition]:
            with self._lock:
                self._check_open()
                keys = sorted(
                    (task_id, int(version))
                    for task_id, records in self._history.items()
                    if task_id >= cursor[0]
                    for version in records
                )
                picked = [key for key in keys if key > cursor][:n]
                return [Transition.from_dict(self._history[t][str(v)]) for t, v in picked]

        return archivable_prefix(fetch, before, after, limit)

    def export_finished(
        self, before: datetime, *, after: str | None = None, limit: int = 100
    ) -> list[ArchivedTask]:
        after = export_finished_args(before, after, limit)
        with self._lock:
            self._check_open()
            chosen = sorted(
                (
                    s
                    for s in self._matching(None)
                    if s.is_terminal and (s.finished_at or s.created_at) < before
                ),
                key=lambda s: s.task_id,
            )
            out: list[ArchivedTask] = []
            for snapshot in chosen:
                if after is not None and snapshot.task_id <= after:
                    continue
                records = self._history.get(snapshot.task_id, {})
                history = tuple(Transition.from_dict(records[v]) for v in sorted(records, key=int))
                commands = tuple(
                    _thaw_command(c) for c in self._commands.values() if c["task_id"] == snapshot.task_id
                )
                out.append(ArchivedTask(snapshot, history, commands))
                if len(out) >= limit:
                    break
            return out

    def delete_archived(self, receipt: ArchiveReceipt) -> ArchiveDeleted:
        receipt = check_receipt(receipt)
        doomed = dict(receipt.tasks)
        with self._lock:
            self._check_open()

            def leaves(task_id: str) -> bool:
                data = self._tasks.get(task_id)
                if data is None or task_id not in doomed or self._history.get(task_id):
                    return False
                snapshot = _thaw(data)
                return snapshot.is_terminal and snapshot.status_version == doomed[task_id]

            transitions = commands = tasks = 0
            for task_id, version in receipt.transitions:
                if self._history.get(task_id, {}).pop(str(version), None) is not None:
                    transitions += 1
            for command_id in receipt.commands:
                command = self._commands.get(command_id)
                # 未完成的指令只随它的任务整体离开，否则它还等着被执行。
                if command is not None and (
                    command["completed_at"] is not None or leaves(command["task_id"])
                ):
                    del self._commands[command_id]
                    commands += 1
            for task_id in doomed:
                if leaves(task_id) and not any(c["task_id"] == task_id for c in self._commands.values()):
                    del self._tasks[task_id]
                    self._history.pop(task_id, None)
                    self._logs.pop(task_id, None)  # 日志不归档，随任务删
                    tasks += 1
            if transitions or commands or tasks:
                self._flush()
            return ArchiveDeleted(transitions, tasks, commands)

    def purge_commands(self, completed_before: datetime) -> int:
        check_aware("completed_before", completed_before, required=True)
        with self._lock:
            self._check_open()
            doomed = [
                cid
                for cid, c in self._commands.items()
                if c["completed_at"] is not None
                and datetime.fromisoformat(c["completed_at"]) < completed_before
            ]
            for cid in doomed:
                del self._commands[cid]
            if doomed:
                self._flush()
            return len(doomed)

    def close(self) -> None:
        with self._lock:
            self._closed = True


__all__ = ["JsonFileTaskStore"]
