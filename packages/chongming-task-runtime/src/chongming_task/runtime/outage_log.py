"""存储故障期间的限流日志：每个时间间隔一行带计数的汇总，而不是每个任务每一轮一行。

为什么：写穿层在存储故障期间每一轮后台循环都会为每个落后的任务重试一次，指令轮询每 0.1 秒一次。
逐条打日志时，一块写满的磁盘 25 秒能刷出十几万行（issue 22 第 13 条）——日志本身成了第二场事故，
真正有用的那一行反而被淹没。这里的规则：

* 故障开始（距上一次失败超过一个间隔）的第一次失败立刻打一行 WARNING，带原始错误——值班的人马上看到原因；
* 之后的失败只计数（次数、涉及的任务数、按操作分类）；每满一个间隔打一行汇总 WARNING；
* 第一次成功（``recovered()``）时，若有未汇总的失败先补打汇总，再打一行 INFO"存储恢复"。

``persist_failures`` 照常逐条记录（最多 20 条）：那是给程序看的，不受限流影响。
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

DEFAULT_INTERVAL = 5.0


class OutageLog:
    """一个 Controller 的存储故障日志（线程安全）。``interval`` 秒内至多一行汇总。"""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        interval: float = DEFAULT_INTERVAL,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._interval = interval
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._in_outage = False
        self._window_start = 0.0
        self._outage_start = 0.0
        self._last_failure = -1e18
        self._total = 0  # 本次故障以来的失败次数
        self._pending = 0  # 上一行之后、尚未汇总的失败次数
        self._ops: Counter[str] = Counter()
        self._tasks: set[str] = set()
        self._last_error = ""

    @property
    def in_outage(self) -> bool:
        with self._lock:
            return self._in_outage

    def failure(self, operation: str, task_id: str, error: str) -> None:
        """记一次失败；按规则决定是立刻打一行、打汇总，还是只计数。"""
        now = self._monotonic()
        first = False
        summary: str | None = None
        with self._lock:
            if not self._in_outage or now - self._last_failure > self._interval:
                # 新的一次故障（或上一次故障后安静了一整个间隔）：先把旧的未汇总部分清掉，再立刻报这一次。
                summary = self._summary_locked(now) if self._pending else None
                self._in_outage = True
                self._outage_start = now
                self._window_start = now
                self._total = 0
                first = True
            self._last_failure = now
            self._total += 1
            self._last_error = error
            if not first:  # 第一次已经原样打出来了，不再计入汇总
                self._pending += 1
                self._ops[operation.split("×", 1)[0]] += 1  # "touch×30"（批量）与 "touch" 归为一类
                self._tasks.add(task_id)
                if now - self._window_start >= self._interval:
                    summary = self._summary_locked(now)
        if summary is not None:
            self._logger.warning("%s", summary)
        if first:
            self._logger.warning(
                "写存储失败（任务照常运行，存储恢复后自动追平；之后每 %g 秒汇总一次）：%s %s：%s",
                self._interval,
                operation,
                task_id,
                error,
            )

    def tick(self) -> None:
        """后台循环每轮调用：间隔已满且有未汇总的失败时打汇总（故障期间即使没有新失败也按时汇报）。"""
        now = self._monotonic()
        with self._lock:
            if not self._pending or now - self._window_start < self._interval:
                return
            summary = self._summary_locked(now)
        self._logger.warning("%s", summary)

    def recovered(self) -> None:
        """一次写成功了：故障结束。补打未汇总的部分，再打一行恢复。"""
        if not self._in_outage:
            # 快路径（每次写成功都调用）：不在故障中就不拿锁。与并发的 failure() 竞争时最多让这次成功不算
            # "恢复"，下一次成功照样结束故障——只影响日志里恢复那一行出现的时刻。
            return
        with self._lock:
            if not self._in_outage:
                return
            now = self._monotonic()
            summary = self._summary_locked(now) if self._pending else None
            total, seconds = self._total, now - self._outage_start
            self._in_outage = False
        if summary is not None:
            self._logger.warning("%s", summary)
        self._logger.info(
            "存储恢复：故障持续约 %.1f 秒，期间写失败 %d 次；落后的任务正在追平", seconds, total
        )

    def _summary_locked(self, now: float) -> str:
        ops = "、".join(f"{op}×{n}" for op, n in sorted(self._ops.items()))
        text = (
            f"存储仍不可写：过去 {now - self._window_start:.1f} 秒写失败 {self._pending} 次"
            f"（{len(self._tasks)} 个任务；{ops}），故障已持续 {now - self._outage_start:.1f} 秒；"
            f"最近一次：{self._last_error.rstrip('。')}。任务照常运行，存储恢复后自动追平"
        )
        self._pending = 0
        self._ops.clear()
        self._tasks.clear()
        self._window_start = now
        return text


__all__ = ["DEFAULT_INTERVAL", "OutageLog"]
