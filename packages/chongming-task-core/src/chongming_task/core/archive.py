"""历史归档：先归档、再删除（issue 20；存储指南 §9，用户指南"历史归档"）。

存储只会"按批导出"和"按回执删除"（``TaskStore.export_*`` / ``delete_archived``）；这里负责把导出的
行**持久地**写成归档文件，然后才让存储删除它们，并且在任意时刻被 kill -9 之后都能续跑：

* **段（segment）**：一批一个文件，JSON Lines + gzip，每行 ``{"kind": ..., "record": ...}``，``kind``
  是 ``transition``（``Transition.to_dict()``）、``snapshot``（``TaskSnapshot.to_dict()``）或
  ``command``（``Command.to_dict()``）。文件名带序号与时间范围：
  ``seg-000042-20260101T000000Z-20260105T120000Z.jsonl.gz``。先写临时名 ``*.tmp``，fsync 文件，
  rename 成正式名，再 fsync 目录——正式名存在，内容就是完整的。
* **清单**：每段的名字、sha256、计数、每个任务的首末版本、状态（``recorded`` = 已落盘但可能还没删、
  ``deleted`` = 存储已按它删除）。分两个文件，合起来才是清单（``load_manifest`` 负责合并）：
  - ``manifest.json``：压实的底本 ``{"format": 1, "segments": [...]}``，写临时文件 + fsync + rename +
    fsync 目录，原子替换。只在一次运行的开头（上次留下了日志时）和结尾重写——每次运行 O(清单) 一次，
    而不是每段两次（那样总代价随段数平方增长）；
  - ``manifest.jsonl``：本次运行的追加日志，每行一条 JSON：``{"segment": {...}}`` 记入一段
    （state=recorded，写完 fsync 之后才删在线的行），``{"deleted": [段名, ...]}`` 把这些段标成 deleted
    （不单独 fsync，随下一段的记录一起落盘——丢了只是让那一段在续跑时再重放一次删除）。
    读的时候按顺序套在底本上；套用是幂等的（已知的段再记一次不改变它）。崩溃留下的半行（最后一行
    没有换行符或不是 JSON）读时忽略：它描述的段要么成了孤儿段（见下），要么停在 recorded，续跑都会按内容
    重新检查它。
  压实 = 把合并结果原子地写成新的 ``manifest.json``，再删掉日志；两步之间崩溃，日志里的记录在新底本里
  都已有，再套一遍不改变什么。读者先打开日志再读底本，所以读的时候碰上压实也不会漏段。
* **顺序（水位线）**：写段 → 记入清单（recorded）→ 存储删除 → 清单标 deleted。每一步之间崩溃：
  - 段写了、清单没记：重跑时按**内容**发现这个"孤儿段"，补记进清单，再按它的内容删除；
  - 记了、没删完：重跑时按段的内容重放删除（``delete_archived`` 幂等）；
  - 临时文件：没有 rename 就不算数，直接删掉（它的行还在线上，会被重新导出）。
  新的导出只在所有已知的段都删除完毕之后才开始，所以同一行不会进两个段。一次运行之内导出沿键集游标
  往前走（上一批的最后一个键之后），不从头重扫已经处理过的任务。
* 旧目录（只有 ``manifest.json``、没有日志，即这个格式之前写出的归档）照样能读、能续写：底本的格式没变。
* 同一目录同时只允许一个归档进程（``archive.lock`` 上的 flock）。

读回：``merged_history(store, task_id, directory)`` 把归档与在线历史拼成一条从版本 1 起连续的序列，
发现空洞或冲突就报错（``ArchiveError``）；CLI ``history TASK --archive DIR`` 用的就是它。
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from json.encoder import encode_basestring as _quote  # JSONEncoder(ensure_ascii=False) 用的就是它
from pathlib import Path
from typing import Any

from chongming_task.core.storage.contract import TaskStore
from chongming_task.core.storage.values import ArchiveDeleted, ArchivedTask, ArchiveReceipt, Command
from chongming_task.errors import ConfigurationError, StoreError
from chongming_task.models import TaskSnapshot, Transition

try:  # POSIX：同一目录只允许一个归档进程
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("chongming_task.archive")

MANIFEST = "manifest.json"
JOURNAL = "manifest.jsonl"
LOCK = "archive.lock"
FORMAT = 1
BATCH_SIZE = 20_000
"""每段默认最多多少条迁移记录。每段的固定代价是三次 fsync（段文件、目录、清单日志）和一轮导出/删除的
往返；负载重的共享机器上一次 fsync 可能要几十毫秒，段大一些，这部分就摊薄了。内存：一段 2 万条约
二三十 MB。"""
_SEGMENT = re.compile(r"^seg-(\d{6,})-(\d{8}T\d{6}Z)-(\d{8}T\d{6}Z)\.jsonl\.gz$")


class ArchiveError(StoreError):
    """归档目录的内容不完整或自相矛盾（段的校验和不对、历史有空洞、同一行出现在两个段里……）。"""


@dataclass
class ArchiveSummary:
    """一次归档运行的结果。``dry_run`` 时什么也没写、什么也没删，计数是"将会归档"的。"""

    transitions: int = 0
    tasks: int = 0
    commands: int = 0
    segments: int = 0
    purged_commands: int = 0
    reconciled_segments: int = 0
    partitions_dropped: int = 0
    deleted: ArchiveDeleted = field(default_factory=ArchiveDeleted)
    dry_run: bool = False

    def line(self) -> str:
        verb = "将归档" if self.dry_run else "已归档"
        text = (
            f"{verb} {self.transitions} 条迁移记录、{self.tasks} 个终态任务（{self.commands} 条指令），"
            f"{'' if self.dry_run else f'写出 {self.segments} 个段'}"
        ).rstrip("，")
        if self.reconciled_segments:
            text += f"，续上次中断的 {self.reconciled_segments} 个段"
        if self.partitions_dropped:
            text += f"，整块丢弃过期分区 {self.partitions_dropped} 个"
        if self.purged_commands:
            text += f"，清理已完成的旧指令 {self.purged_commands} 条"
        return text


# -- file primitives -----------------------------------------------------------------------------------


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):  # 有的文件系统（Windows）不能打开目录
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    """写临时名 → fsync → rename → fsync 目录：崩溃后要么是旧内容，要么是完整的新内容。"""
    temp = path.with_name(path.name + ".tmp")
    with open(temp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)
    _fsync_dir(path.parent)


def _stamp(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
"""一个编码器反复用（``json.dumps`` 带非默认参数时每次调用都新建一个）；紧凑、非 ASCII 原样输出。"""

GZIP_LEVEL = 3
"""段的 gzip 压缩级别。在接近真实的迁移记录上（uuid 任务号、混杂的触发器与原因）量过：级别 3 每行约
1.0 µs、27.6 字节；默认的 6 约 2.1 µs、23.4 字节；1 约 0.85 µs、33 字节。3 用一半的 CPU 换大约 18% 的
体积——归档速度受 CPU 限制，而归档文件只写一次、很少读。"""

_TRANSITION_LINE = (
    '{"kind":"transition","record":{"task_id":%s,"from_status":%s,"to_status":%s,"trigger":%s,'
    '"actor":%s,"reason":%s,"version":%d,"at":%s}}'
)


def _transition_line(t: Transition) -> str:
    """``_ENCODER.encode({"kind": "transition", "record": t.to_dict()})``，逐字节相同，快两三倍（不建中间
    字典；字符串用编码器同一个转义函数）。``to_dict`` 加了字段而这里没跟上，测试会发现。"""
    return _TRANSITION_LINE % (
        _quote(t.task_id),
        _quote(t.from_status),  # StrEnum 本身就是它的值（str），省掉 .value 的描述符查找
        _quote(t.to_status),
        _quote(t.trigger),
        "null" if t.actor is None else _quote(t.actor),
        "null" if t.reason is None else _quote(t.reason),
        t.version,
        _quote(t.at.isoformat(timespec="microseconds")),
    )


def _encode_segment(transitions: list[Transition], tasks: list[ArchivedTask]) -> bytes:
    """一段的字节：每行一条 JSON（见模块说明），整段一次压缩。mtime=0：同样的内容得到同样的字节。"""
    lines = [_transition_line(t) for t in transitions]
    for item in tasks:
        lines.append(_ENCODER.encode({"kind": "snapshot", "record": item.snapshot.to_dict()}))
        lines.extend(_transition_line(t) for t in item.history)
        lines.extend(_ENCODER.encode({"kind": "command", "record": c.to_dict()}) for c in item.commands)
    lines.append("")  # 最后一行也以换行结束
    return gzip.compress("\n".join(lines).encode("utf-8"), compresslevel=GZIP_LEVEL, mtime=0)


def read_segment(path: Path) -> Iterator[dict[str, Any]]:
    """逐行读一个段（``{"kind", "record"}``）。截断或损坏的段 → ArchiveError。"""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            for number, text in enumerate(handle, 1):
                if text.strip():
                    try:
                        yield json.loads(text)
                    except ValueError as exc:
                        raise ArchiveError(f"归档段 {path.name} 第 {number} 行不是 JSON：{exc}") from None
    except (OSError, EOFError) as exc:
        raise ArchiveError(f"归档段 {path.name} 读不了（截断或损坏）：{exc}；请从备份恢复这个文件") from exc


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# -- segment content ------------------------------------------------------------------------------------


class _Encoded:
    """已经编码好的 JSON 片段（归档器内存里清单项的 ``versions``，见 ``Archiver._add_entry``）。"""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def _encode_entry(entry: dict[str, Any]) -> bytes:
    """一个清单项 → 紧凑的 JSON 字节；``versions`` 可以是 ``_Encoded``（原样拼进去）。"""
    versions = entry["versions"]
    rest = _ENCODER.encode({key: value for key, value in entry.items() if key != "versions"})
    text = versions.text if isinstance(versions, _Encoded) else _ENCODER.encode(versions)
    return f'{rest[:-1]},"versions":{text}}}'.encode()


def _describe(
    name: str, sha: str, keys: Iterable[tuple[str, int]], *, tasks: int, commands: int
) -> dict[str, Any]:
    """清单里的一项：由段的**内容**（迁移记录的键、快照与指令的条数）算出，所以孤儿段能按内容补记。"""
    versions: dict[str, list[int]] = {}
    transitions = 0
    for task_id, version in keys:
        transitions += 1
        span = versions.get(task_id)
        if span is None:
            versions[task_id] = [version, version]
        elif version < span[0]:
            span[0] = version
        elif version > span[1]:
            span[1] = version
    return {
        "name": name,
        "sha256": sha,
        "transitions": transitions,
        "tasks": tasks,
        "commands": commands,
        "versions": versions,
        "state": "recorded",
    }


def _describe_content(name: str, sha: str, lines: list[dict[str, Any]]) -> dict[str, Any]:
    """读回来的段内容（``read_segment`` 的行）→ 清单项。"""
    kinds = [line["kind"] for line in lines]
    keys = (
        (line["record"]["task_id"], line["record"]["version"])
        for line in lines
        if line["kind"] == "transition"
    )
    return _describe(name, sha, keys, tasks=kinds.count("snapshot"), commands=kinds.count("command"))


def _receipt_of(lines: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> ArchiveReceipt:
    keys: list[tuple[str, int]] = []
    tasks: list[tuple[str, int]] = []
    commands: list[str] = []
    for line in lines:
        record = line["record"]
        if line["kind"] == "transition":
            keys.append((record["task_id"], record["version"]))
        elif line["kind"] == "snapshot":
            tasks.append((record["task_id"], record["status_version"]))
        elif line["kind"] == "command":
            commands.append(record["command_id"])
    return ArchiveReceipt(transitions=tuple(keys), tasks=tuple(tasks), commands=tuple(commands))


# -- the archiver ---------------------------------------------------------------------------------------


class Archiver:
    """把 ``store`` 里超出时间窗口的历史归档到 ``directory``，然后让存储删除它们。

    * ``batch_size``：每段最多多少条迁移记录（也是一次导出、一轮删除的单位）；
    * ``task_batch``：整体归档终态任务时每段最多多少个任务；
    * ``progress``：每写完一段回调一次（CLI 的进度条用它）。
    """

    def __init__(
        self,
        store: TaskStore,
        directory: str | os.PathLike[str],
        *,
        batch_size: int = BATCH_SIZE,
        task_batch: int = 200,
        progress: Callable[[ArchiveSummary], None] | None = None,
    ) -> None:
        for name, value in (("batch_size", batch_size), ("task_batch", task_batch)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
                raise ConfigurationError(f"{name} 必须是 1..100000 之间的整数，收到 {value!r}")
        self.store = store
        self.directory = Path(directory)
        self.batch_size = batch_size
        self.task_batch = task_batch
        self.progress = progress
        self._pending: list[bytes] = []  # 还没追加进日志的记录（各是一行，含换行符）
        self._journal: io.BufferedWriter | None = None
        self._sequence = 0

    # -- manifest -------------------------------------------------------------------------------------

    def _load_manifest(self) -> dict[str, Any]:
        manifest = load_manifest(self.directory)
        for entry in manifest["segments"]:
            entry["versions"] = _Encoded(_ENCODER.encode(entry["versions"]))
        return manifest

    def _note(self, record: dict[str, Any]) -> None:
        # 当场编码：之后对清单项的修改（标 deleted）不会改写已经排队的这一行。
        self._pending.append(_ENCODER.encode(record).encode("utf-8") + b"\n")

    def _add_entry(self, manifest: dict[str, Any], entry: dict[str, Any]) -> None:
        """记入一段。内存里的清单项只留 ``versions`` 编码好的文本：归档器自己用不到它，而 100 万行的
        运行里它是几十万个"任务 → [首, 末]"的小对象（几十 MB），文本只占几分之一。"""
        entry["versions"] = _Encoded(_ENCODER.encode(entry["versions"]))
        manifest["segments"].append(entry)
        self._pending.append(b'{"segment":' + _encode_entry(entry) + b"}\n")

    def _mark_deleted(self, entries: list[dict[str, Any]]) -> None:
        for entry in entries:
            entry["state"] = "deleted"
        self._note({"deleted": [entry["name"] for entry in entries]})

    def _save_manifest(self, manifest: dict[str, Any]) -> None:
        """把 ``manifest`` 自上次保存以来的变化（``_add_entry`` / ``_mark_deleted`` 排队的记录）追加进
        日志并 fsync：返回之后这些变化就是持久的。日志第一次建出来时顺带 fsync 目录。"""
        if not self._pending:
            return
        if self._journal is None:
            path = self.directory / JOURNAL
            created = not path.exists()
            self._journal = open(path, "ab")  # noqa: SIM115 - 整个运行期间开着，_compact 关
            if created:
                _fsync_dir(self.directory)
        self._journal.write(b"".join(self._pending))
        self._journal.flush()
        os.fsync(self._journal.fileno())
        self._pending.clear()

    def _compact(self, manifest: dict[str, Any]) -> None:
        """把合并后的清单原子地写成 ``manifest.json``，再删掉日志（顺序见模块说明）。"""
        if self._journal is not None:
            self._journal.close()
            self._journal = None
        self._pending.clear()  # 还没写进日志的记录（随后一段的"已删除"）已经在 manifest 里了
        body = b",".join(_encode_entry(entry) for entry in manifest["segments"])
        _write_atomic(self.directory / MANIFEST, b'{"format":%d,"segments":[%s]}' % (FORMAT, body))
        with contextlib.suppress(FileNotFoundError):
            (self.directory / JOURNAL).unlink()
        _fsync_dir(self.directory)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / LOCK, "a+b") as handle:
            if fcntl is not None:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    raise ArchiveError(
                        f"另一个归档进程正在使用 {self.directory}：等它结束再运行（同一目录同时只能有一个）"
                    ) from None
            yield

    # -- run ------------------------------------------------------------------------------------------

    def run(
        self, before: datetime, *, dry_run: bool = False, purge_commands_before: datetime | None = None
    ) -> ArchiveSummary:
        """归档 ``before`` 之前的历史（全部任务的旧前缀 + 在它之前结束的终态任务），并删除在线的那份。"""
        if not isinstance(before, datetime) or before.utcoffset() is None:
            raise ConfigurationError(f"before 必须是带时区的 datetime，收到 {before!r}")
        if dry_run:
            return self._dry_run(before)
        summary = ArchiveSummary()
        with self._locked():
            manifest = self._load_manifest()
            if (self.directory / JOURNAL).exists():
                self._compact(manifest)  # 上次被打断：先压实，丢掉可能的半行，日志从空的开始
            try:
                summary.reconciled_segments = self._reconcile(manifest)
                self._sequence = self._next_sequence(manifest)
                for name in self.store.expired_partitions(before):
                    self._archive_partition(manifest, summary, name, before)
                # 游标沿键集往前走：上一批的行已经删了，之前那些任务剩下的（窗口里的）行不必再读一遍。
                after: tuple[str, int] | None = None
                while batch := self.store.export_transitions(before, after=after, limit=self.batch_size):
                    self._archive(manifest, summary, batch, [])
                    after = (batch[-1].task_id, batch[-1].version)
                last: str | None = None
                while tasks := self.store.export_finished(before, after=last, limit=self.task_batch):
                    self._archive(manifest, summary, [], tasks)
                    last = tasks[-1].snapshot.task_id
            finally:
                if self._journal is not None:
                    self._journal.close()
                    self._journal = None
            if (self.directory / JOURNAL).exists():
                self._compact(manifest)
            if purge_commands_before is not None:
                summary.purged_commands = self.store.purge_commands(purge_commands_before)
        return summary

    def _dry_run(self, before: datetime) -> ArchiveSummary:
        summary = ArchiveSummary(dry_run=True)
        after: tuple[str, int] | None = None
        while batch := self.store.export_transitions(before, after=after, limit=self.batch_size):
            summary.transitions += len(batch)
            after = (batch[-1].task_id, batch[-1].version)
        last: str | None = None
        while tasks := self.store.export_finished(before, after=last, limit=self.task_batch):
            summary.tasks += len(tasks)
            summary.commands += sum(len(item.commands) for item in tasks)
            last = tasks[-1].snapshot.task_id
        return summary

    def _next_sequence(self, manifest: dict[str, Any]) -> int:
        numbers = [0]
        for entry in manifest["segments"]:
            match = _SEGMENT.match(entry["name"])
            if match:
                numbers.append(int(match.group(1)))
        for path in self.directory.iterdir():
            match = _SEGMENT.match(path.name)
            if match:
                numbers.append(int(match.group(1)))
        return max(numbers) + 1

    def _archive(
        self,
        manifest: dict[str, Any],
        summary: ArchiveSummary,
        transitions: list[Transition],
        tasks: list[ArchivedTask],
    ) -> None:
        entry = self._write_segment(manifest, transitions, tasks)
        # 3. 存储按回执删除；4. 标记已删除
        summary.deleted += self.store.delete_archived(ArchiveReceipt.of(transitions, tasks))
        # "已删除"这一行不单独 fsync：它随下一段的"记入"一起落盘（或在结尾压实时进底本）。丢了也无妨——
        # 段停在 recorded，续跑时重放删除（幂等）；省下的是每段一次 fsync。
        self._mark_deleted([entry])
        self._count(summary, entry)

    def _count(self, summary: ArchiveSummary, entry: dict[str, Any]) -> None:
        summary.segments += 1
        summary.transitions += entry["transitions"]
        summary.tasks += entry["tasks"]
        summary.commands += entry["commands"]
        if self.progress is not None:
            self.progress(summary)

    def _write_segment(
        self, manifest: dict[str, Any], transitions: list[Transition], tasks: list[ArchivedTask]
    ) -> dict[str, Any]:
        """第 1、2 步：段落盘（临时名 → fsync → rename → fsync 目录），记入清单（水位线，state=recorded）。"""
        history = [t for item in tasks for t in item.history]
        times = [t.at for t in transitions] + [t.at for t in history]
        times += [item.snapshot.finished_at or item.snapshot.created_at for item in tasks]
        name = f"seg-{self._sequence:06d}-{_stamp(min(times))}-{_stamp(max(times))}.jsonl.gz"
        self._sequence += 1  # 持锁运行，序号在本次运行里递增即可（开头按清单与目录取过一次最大值）
        data = _encode_segment(transitions, tasks)
        _write_atomic(self.directory / name, data)
        keys = [(t.task_id, t.version) for t in transitions] + [(t.task_id, t.version) for t in history]
        commands = sum(len(item.commands) for item in tasks)
        entry = _describe(name, hashlib.sha256(data).hexdigest(), keys, tasks=len(tasks), commands=commands)
        self._add_entry(manifest, entry)
        self._save_manifest(manifest)
        return entry

    def _archive_partition(
        self, manifest: dict[str, Any], summary: ArchiveSummary, name: str, before: datetime
    ) -> None:
        """整块归档一个过期分区：每批写成一段（recorded），存储 DETACH + DROP 之后一起标 deleted。

        丢弃不成（没有属主权限、拿不到锁、分区被并发改动）时存储什么也没删：按这些段的键逐行删除，
        结果与逐行归档一样。"""
        entries: list[dict[str, Any]] = []

        def write(batch: list[Transition]) -> None:
            entries.append(self._write_segment(manifest, batch, []))
            self._count(summary, entries[-1])

        result = self.store.archive_partition(name, before, write, batch=self.batch_size)
        if result.dropped:
            summary.partitions_dropped += 1
            summary.deleted += ArchiveDeleted(transitions=result.exported)
        else:
            logger.warning("分区 %s 没能整块丢弃，改为逐行删除：%s", name, result.reason)
        if not result.dropped:
            for entry in entries:
                receipt = _receipt_of(read_segment(self.directory / entry["name"]))
                summary.deleted += self.store.delete_archived(receipt)
        if entries:
            self._mark_deleted(entries)
            self._save_manifest(manifest)

    def _reconcile(self, manifest: dict[str, Any]) -> int:
        """续上次中断的运行：清理临时文件、补记孤儿段、重放没删完的段。返回处理的段数。"""
        for path in self.directory.glob("*.tmp"):
            path.unlink()
        known = {entry["name"] for entry in manifest["segments"]}
        orphans = sorted(
            p for p in self.directory.iterdir() if _SEGMENT.match(p.name) and p.name not in known
        )
        for path in orphans:
            lines = list(read_segment(path))
            self._add_entry(manifest, _describe_content(path.name, _sha256(path), lines))
        if orphans:
            self._save_manifest(manifest)
        replayed = 0
        for entry in manifest["segments"]:
            if entry["state"] == "deleted":
                continue
            path = self.directory / entry["name"]
            if not path.exists() or _sha256(path) != entry["sha256"]:
                raise ArchiveError(
                    f"归档段 {entry['name']} 缺失或校验和不符：它的行可能还在线上。请从备份恢复该文件后重跑"
                )
            self.store.delete_archived(_receipt_of(read_segment(path)))
            self._mark_deleted([entry])
            self._save_manifest(manifest)
            replayed += 1
        return replayed


# -- periodic retention (Controller) --------------------------------------------------------------------


@dataclass(frozen=True)
class Retention:
    """控制器后台定期执行的时间窗口保留：``Controller(store=..., retention=Retention(...))``（默认关闭）。

    * ``older_than``：在线保留多长的窗口（``timedelta`` 或秒数），截止时刻 = 每次运行时的"现在"减去它；
    * ``to``：归档目录（与 CLI ``archive --to`` 同一种目录，可以混用）；
    * ``every``：两次运行的间隔（秒，至少 1）。控制器构造之后马上跑第一次，之后每隔 ``every`` 一次；
      上一次还没跑完就跳过这一轮（同一目录同时只能有一个归档进程）；
    * ``purge_commands``：顺带清理截止时刻之前已完成的指令；
    * ``batch_size``：每段最多多少条迁移记录。
    """

    older_than: timedelta | float
    to: str | os.PathLike[str]
    every: float = 3600.0
    purge_commands: bool = True
    batch_size: int = BATCH_SIZE

    def __post_init__(self) -> None:
        window = self.older_than
        if isinstance(window, bool) or not isinstance(window, (timedelta, int, float)):
            raise ConfigurationError(f"Retention.older_than 必须是 timedelta 或秒数，收到 {window!r}")
        seconds = window.total_seconds() if isinstance(window, timedelta) else float(window)
        if not math.isfinite(seconds) or seconds <= 0:
            raise ConfigurationError(f"Retention.older_than 必须是正的时长，收到 {window!r}")
        object.__setattr__(self, "older_than", timedelta(seconds=seconds))
        every = self.every
        if isinstance(every, bool) or not isinstance(every, (int, float)) or not math.isfinite(every):
            raise ConfigurationError(f"Retention.every 必须是秒数，收到 {every!r}")
        if every < 1.0:
            raise ConfigurationError(f"Retention.every 至少 1 秒，收到 {every!r}")
        object.__setattr__(self, "every", float(every))
        if not isinstance(self.to, (str, os.PathLike)) or not os.fspath(self.to):
            raise ConfigurationError(f"Retention.to 必须是归档目录的路径，收到 {self.to!r}")
        if not isinstance(self.purge_commands, bool):
            raise ConfigurationError(
                f"Retention.purge_commands 必须是 True 或 False，收到 {self.purge_commands!r}"
            )

    @property
    def window(self) -> timedelta:
        assert isinstance(self.older_than, timedelta)  # __post_init__ 已归一
        return self.older_than

    def run(self, store: TaskStore, now: datetime) -> ArchiveSummary:
        """执行一次：归档 ``now - older_than`` 之前的历史（及已完成的旧指令）。"""
        before = now - self.window
        archiver = Archiver(store, self.to, batch_size=self.batch_size)
        return archiver.run(before, purge_commands_before=before if self.purge_commands else None)


# -- reading back ---------------------------------------------------------------------------------------


def load_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """清单 = 底本 ``manifest.json`` 套上日志 ``manifest.jsonl``（格式见模块说明）。两者都没有 → 空清单。

    先打开日志再读底本：读的同时有归档进程在压实（先换底本、再删日志）也不会漏掉段。
    """
    base = Path(directory)
    path = base / MANIFEST
    try:
        journal = open(base / JOURNAL, "rb")  # noqa: SIM115 - 下面的 with 关
    except FileNotFoundError:
        journal = None
    with journal or contextlib.nullcontext():
        manifest: dict[str, Any] = {"format": FORMAT, "segments": []}
        if path.exists():
            try:
                manifest = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ArchiveError(f"归档清单 {path} 读不了：{exc}") from exc
            if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
                found = manifest.get("format") if isinstance(manifest, dict) else manifest
                raise ArchiveError(f"归档清单 {path} 的格式版本是 {found!r}，本程序只认 {FORMAT}")
        if journal is not None:
            _apply_journal(manifest, journal.read(), base / JOURNAL)
    return manifest


def _apply_journal(manifest: dict[str, Any], data: bytes, path: Path) -> None:
    """按顺序把日志记录套在清单上（幂等）。最后一行残缺（没有换行符或不是 JSON）是崩溃留下的半行：忽略。"""
    by_name = {entry["name"]: entry for entry in manifest["segments"]}
    lines = data.split(b"\n")
    complete = lines[:-1]  # 最后一段（可能为空）没有换行符：写到一半
    for number, raw in enumerate(complete, 1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
            if not isinstance(record, dict):
                raise ValueError("不是 JSON 对象")
            if "segment" in record:
                entry = record["segment"]
                if entry["name"] not in by_name:
                    manifest["segments"].append(entry)
                    by_name[entry["name"]] = entry
            else:
                for name in record["deleted"]:
                    if name in by_name:
                        by_name[name]["state"] = "deleted"
        except (ValueError, KeyError, TypeError) as exc:
            if number == len(complete):
                break  # 最后一行：崩溃时的半行（断电后可能是一行零字节），它描述的段会被重新检查
            raise ArchiveError(
                f"归档清单日志 {path} 第 {number} 行损坏（{exc}）：请从备份恢复，或删掉这个文件后重跑归档"
                "（重跑会按内容重新检查日志里记过的段）"
            ) from None


@dataclass
class ArchivedTaskView:
    """归档里关于一个任务的全部内容。"""

    transitions: list[Transition] = field(default_factory=list)
    snapshot: TaskSnapshot | None = None
    commands: list[Command] = field(default_factory=list)


def read_task(directory: str | os.PathLike[str], task_id: str) -> ArchivedTaskView:
    """从归档里读出一个任务的迁移记录（按版本升序）、最后归档的快照与指令。

    靠清单里每段的 ``versions`` 索引只打开含这个任务的段；快照只出现在整体归档的段里（按内容扫）。
    同一版本出现两次 → ArchiveError（"同一行不进两个段"被破坏了）。
    """
    base = Path(directory)
    manifest = load_manifest(base)
    view = ArchivedTaskView()
    seen: dict[int, Transition] = {}
    for entry in manifest["segments"]:
        if task_id not in entry["versions"] and not entry["tasks"]:
            continue
        for line in read_segment(base / entry["name"]):
            record = line["record"]
            if record.get("task_id") != task_id:
                continue
            if line["kind"] == "transition":
                transition = Transition.from_dict(record)
                if transition.version in seen:
                    raise ArchiveError(
                        f"任务 {task_id!r} 的版本 {transition.version} 在归档里出现了两次"
                        f"（段 {entry['name']}）"
                    )
                seen[transition.version] = transition
            elif line["kind"] == "snapshot":
                snapshot = TaskSnapshot.from_dict(record)
                if view.snapshot is None or snapshot.status_version >= view.snapshot.status_version:
                    view.snapshot = snapshot
            else:
                view.commands.append(Command.from_dict(record))
    view.transitions = [seen[v] for v in sorted(seen)]
    return view


def merged_history(store: TaskStore, task_id: str, directory: str | os.PathLike[str]) -> list[Transition]:
    """归档 + 在线历史拼成的完整历史：版本从 1 起逐一连续。

    两边都有的版本必须逐字段相同（崩溃在"写段之后、删除之前"会出现这种重叠，是正常的）；
    出现空洞或冲突 → ArchiveError，说明缺了哪些版本。
    """
    archived = read_task(directory, task_id).transitions
    online = store.history(task_id)
    merged: dict[int, Transition] = {t.version: t for t in archived}
    for record in online:
        other = merged.get(record.version)
        if other is not None and other != record:
            raise ArchiveError(f"任务 {task_id!r} 的版本 {record.version} 在归档与在线库里内容不同")
        merged[record.version] = record
    versions = sorted(merged)
    missing = sorted(set(range(1, (versions[-1] if versions else 0) + 1)) - set(versions))
    if missing:
        shown = ", ".join(str(v) for v in missing[:10]) + (" ……" if len(missing) > 10 else "")
        raise ArchiveError(f"任务 {task_id!r} 的历史有空洞：缺版本 {shown}；请确认归档目录完整（含全部段）")
    return [merged[v] for v in versions]


def verify_archive(directory: str | os.PathLike[str]) -> dict[str, int]:
    """检查归档目录：每段的校验和、同一行不在两个段里。返回计数；有问题 → ArchiveError。"""
    base = Path(directory)
    manifest = load_manifest(base)
    keys: set[tuple[str, int]] = set()
    commands: set[str] = set()
    counts = {"segments": 0, "transitions": 0, "snapshots": 0, "commands": 0}
    for entry in manifest["segments"]:
        path = base / entry["name"]
        if not path.exists() or _sha256(path) != entry["sha256"]:
            raise ArchiveError(f"归档段 {entry['name']} 缺失或校验和不符")
        counts["segments"] += 1
        for line in read_segment(path):
            record = line["record"]
            if line["kind"] == "transition":
                key = (record["task_id"], record["version"])
                if key in keys:
                    raise ArchiveError(f"迁移记录 {key} 出现在两个段里（{entry['name']}）")
                keys.add(key)
                counts["transitions"] += 1
            elif line["kind"] == "command":
                if record["command_id"] in commands:
                    raise ArchiveError(f"指令 {record['command_id']} 出现在两个段里（{entry['name']}）")
                commands.add(record["command_id"])
                counts["commands"] += 1
            else:
                counts["snapshots"] += 1
    return counts


__all__ = [
    "BATCH_SIZE",
    "ArchiveError",
    "ArchiveSummary",
    "ArchivedTaskView",
    "Archiver",
    "Retention",
    "load_manifest",
    "merged_history",
    "read_segment",
    "read_task",
    "verify_archive",
]
