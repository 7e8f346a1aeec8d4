"""把任务的 ``ctx.log`` 行按旁路节奏批量写进存储（issue 18；用户指南 §15）。

``LogSink`` 是 Controller 的存储链接持有的一个缓冲：

* ``add`` 在任务线程里调用（``ctx.log`` 之后，经 TaskRun 的事件转发；进程执行器的行在父进程里转发），
  只在一把叶子锁下往 deque 里追加一个元组——不碰任务锁、不碰存储，常数时间。
* ``flush`` 由后台循环按 ``side_channel_interval`` 调用，也在每次尝试结束、落终态之前由工作线程调用一次
  （任务锁之外）：这样一次尝试的全部日志行都先于它的终态写进存储，``logs --follow`` 看到终态后再读
  一次就不会漏行。两个调用方可能同时 flush：``_flush_lock`` 让它们排队，否则同一任务的两批行可能以
  相反的顺序落库（序号由存储按写入先后分配）。
* 存储失败绝不让任务失败：记进 ``persist_failures``（与旁路回写同一条路径，含事件钩子与指标），这批行
  放回缓冲下次再写。缓冲有上限（``MAX_PENDING_LINES``）：存储长时间不可用时丢最旧的并计数，进程内存
  不会因为一个刷屏的任务而无限增长。
* 重试不重复：失败可能是"结果未知"——Postgres 已经 COMMIT、回执在网络上丢了，或客户端超时。放回缓冲的
  那批下次原样再写，所以每行带一个幂等身份（``LogLine.writer`` / ``writer_seq``）：``writer`` 是这个
  缓冲创建时随机生成的 uuid，``writer_seq`` 是 ``add`` 在叶子锁下给的、本缓冲内严格递增的行号。存储为
  每个任务记下每个写入者已接受的最大号（水位线，见 ``values.unseen_log_lines``），重试的行不再写第二遍；
  重排、丢号都不会发生：flush 串行、失败的一批放回队首，同一写入者的号总是按顺序到达存储。
  为什么不用 (task_id, attempt, 行号)：同一任务同一尝试号的行不一定只出自一个进程——租约丢了之后旧持有者
  的缓冲还在 flush，接手的持有者已经开始写（尝试号各自取自手里的快照，不保证不同）；两边各自从 1 数，
  就会把对方的行当成重复吞掉。随机的写入者标识让每个进程、每个 Controller 的号互不相干，不需要协调。
"""

from __future__ import annotations

import collections
import logging
import threading
import uuid
from collections.abc import Callable
from datetime import datetime

from chongming_task.context import LogEntry
from chongming_task.errors import ConfigurationError, TaskError
from chongming_task.storage import MAX_LOG_MESSAGE_BYTES, LogLine, TaskStore, checked_log_line

logger = logging.getLogger("chongming_task.controller")

MAX_PENDING_LINES = 10_000
"""缓冲里最多积压多少行（存储不可用时）。超出丢最旧的。"""

MAX_BATCH_LINES = 2_000
"""一次 append_logs 最多写多少行：单个事务保持短小，积压时分几批写完。"""


class LogSink:
    """一个 Controller 的日志缓冲（见模块说明）。线程安全。"""

    def __init__(
        self,
        store: TaskStore,
        *,
        on_failure: Callable[[str, str, BaseException], None],
        max_pending: int = MAX_PENDING_LINES,
    ) -> None:
        self._store = store
        self._on_failure = on_failure
        self._max_pending = max_pending
        self._lock = threading.Lock()  # 叶子锁：只护着 _pending / dropped
        self._flush_lock = threading.Lock()  # 串行化 flush，保证同一任务的行按产生的顺序落库
        self._pending: collections.deque[tuple[str, LogEntry, int]] = collections.deque()
        self.writer = uuid.uuid4().hex
        """本缓冲写出的行的写入者标识（幂等身份的一半，见模块说明）。"""
        self._last_seq = 0  # 最后给出的 writer_seq（在 _lock 下递增）
        self.dropped = 0
        """因积压超限而丢掉、从未写进存储的行数（累计）。"""

    def add(self, task_id: str, entry: LogEntry) -> None:
        with self._lock:
            self._last_seq += 1
            self._pending.append((task_id, entry, self._last_seq))
            overflow = len(self._pending) - self._max_pending
            if overflow > 0:
                for _ in range(overflow):
                    self._pending.popleft()
                first = self.dropped == 0
                self.dropped += overflow
        if overflow > 0 and first:
            logger.warning(
                "任务日志积压超过 %d 行（存储写不进去？），开始丢弃最旧的行；任务照常运行", self._max_pending
            )

    def has_unwritten(self) -> bool:
        """有没有还没确认写进存储的行（积压着的，或另一个 flush 正在写的）。不拿锁：空闲时的快速判定。

        先看缓冲、再看写锁，次序不能反：另一个 flush 先拿写锁再取走一批，所以"缓冲已空且写锁空闲"意味着
        此前加进来的行都已经写完（或如实记了失败），调用方（落终态之前的那次 flush）可以跳过。"""
        return bool(self._pending) or self._flush_lock.locked()

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def flush(self) -> None:
        """把积压的行写进存储（分批）。失败时记一次 persist failure，这批放回缓冲，下次再写。"""
        with self._flush_lock:
            while True:
                with self._lock:
                    pending = self._pending
                    count = len(pending)
                    if not count:
                        return
                    if count <= MAX_BATCH_LINES:
                        batch = list(pending)  # 常见情形（每次尝试结束时的那一两行）：整个取走
                        pending.clear()
                    else:
                        count = MAX_BATCH_LINES
                        batch = [pending.popleft() for _ in range(count)]
                writer = self.writer
                try:
                    # 受信入口（TaskStore._append_log_lines）：行是 _line 刚造、刚查过的，存储不必再查一遍。
                    self._store._append_log_lines([_line(item, writer) for item in batch])
                except ConfigurationError as exc:
                    # 参数错误重试也不会好（_line 已把存不下的字符转义，到这里说明是后端自己的限制）：
                    # 丢掉这批并计数，绝不让一行坏日志堵住后面所有的行。
                    with self._lock:
                        self.dropped += len(batch)
                    self._on_failure(batch[0][0], f"append_logs×{len(batch)}", exc)
                    continue
                except TaskError as exc:
                    with self._lock:
                        # 放回队首（保持顺序）；放不下的最旧行丢掉并计数。
                        room = max(0, self._max_pending - len(self._pending))
                        keep = batch[-room:] if room else []
                        self.dropped += len(batch) - len(keep)
                        self._pending.extendleft(reversed(keep))
                    self._on_failure(batch[0][0], f"append_logs×{len(batch)}", exc)
                    return
                if count < MAX_BATCH_LINES:
                    return


def _line(item: tuple[str, LogEntry, int], writer: str) -> LogLine:
    task_id, entry, writer_seq = item
    message = entry.message
    size = len(message)  # ASCII 正文的 UTF-8 字节数就是字符数
    # 存储存不下 NUL 与孤立代理项（契约要求整批拒绝）：转义成可见的文本，而不是让整批写不进去。
    if "\x00" in message:
        message = message.replace("\x00", "\\x00")
        size = len(message)
    if not message.isascii():
        try:
            size = len(message.encode("utf-8"))  # 正常的中文行到此为止：不必再解码回来
        except UnicodeEncodeError:
            message = message.encode("utf-8", "backslashreplace").decode("utf-8")
            size = len(message.encode("utf-8"))
    # 级别名来自 logging.getLevelName：自定义的数字级别是 "Level 25"，截到 16 个字符以内。
    level = entry.level_name[:16] or "NOTSET"
    attempt, at = entry.attempt, entry.at
    if (
        size <= MAX_LOG_MESSAGE_BYTES
        and attempt.__class__ is int
        and 0 <= attempt < 2**63
        and at.__class__ is datetime
        and at.utcoffset() is not None
        and task_id.__class__ is str
        and task_id
    ):
        # 快路径（几乎每一行）：上面已经确认了 LogLine.__post_init__ 要查的每一项——正文不超长、不用截断，
        # 尝试号与时间合法，级别名 1..16 个字符，写入者是本缓冲的 uuid、行号 ≥ 1——不再逐字段通用校验
        # （每行约 2 µs，每个写日志的任务至少一行）。其余情形走构造函数，由它校验或截断。
        return checked_log_line(task_id, attempt, at, level, message, 0, False, writer, writer_seq)
    return LogLine(
        task_id=task_id,
        attempt=attempt,
        at=at,
        level=level,
        message=message,
        writer=writer,
        writer_seq=writer_seq,
    )


__all__ = ["MAX_BATCH_LINES", "MAX_PENDING_LINES", "LogSink"]
