"""WAL 检查点挪到后台线程（文件库、可写打开）。

SQLite 默认在某次提交让 WAL 超过 1,000 页时，由这次提交的线程当场做检查点：把 WAL 里的页拷回主文件，
synchronous=NORMAL 下还要 fsync WAL 与主文件各一次。这段时间它仍在 ``_WriterTurn`` 里（检查点发生在
COMMIT 那次 ``execute`` 之内），于是本进程的其他写者全都排在一次 fsync 后面，而那次提交的调用方（例如
等着 starting 落库的任务）也被拖住。空任务的基准里这是墙钟的大头之一（见 bench/README.md 2026-12-01 的
"SQLite 写路径"一节）。

所以本包的连接关掉自动检查点（``PRAGMA wal_autocheckpoint = 0``），改由每个存储一条后台 daemon 线程做
``PRAGMA wal_checkpoint(PASSIVE)``：PASSIVE 不等读者、不挡写者，检查点期间别的线程照常提交。
持久性语义不变：每次提交照旧在 COMMIT 返回前写进 WAL（进程崩溃不丢）；断电时可能丢的仍是最近一次
检查点之后的事务，检查点的间隔按 SQLite 默认的约 1,000 页估算（每次检查点之后按"上一轮每次提交写了
几页"重算要隔多少次提交），与原来同一个量级。没有关自动检查点的连接（别的程序、sqlite3 命令行）照旧
自己做检查点，与这里互不妨碍。

线程只在第一次需要时启动（fork 出来的子进程里重新启动），是 daemon：解释器随时可以退出；
``close()`` 让它停下并等它做完手上的那一次。
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from chongming_task.stores.sqlite._fork import FORKS

TARGET_FRAMES = 1000
"""两次检查点之间 WAL 大约攒多少页（与 SQLite 的默认 ``wal_autocheckpoint`` 相同）。"""

FIRST_INTERVAL = 100
"""还没量过每次提交写几页时，每隔多少次写事务做一次检查点。"""

_MIN_INTERVAL = 8
_MAX_INTERVAL = TARGET_FRAMES

BEHIND = 4
"""攒够 ``BEHIND`` 个间隔的写事务、后台线程还没做检查点时，由提交的线程自己做一次（WAL 的硬上限）。"""

FORCE_FRAMES = 2 * TARGET_FRAMES
"""WAL 超过这么多页还没拷完时，占着本进程的写者队列再做一次（见 ``_checkpoint_once``）。"""

CATCH_UP_PASSES = 4
"""占写者队列的那一次之前，至多再做几次不占队列的 PASSIVE（见 ``_catch_up``）。"""

CATCH_UP_LEFT = 64
"""没拷回的页不多于这么多时就不再追，直接占队列拷完（几十页是亚毫秒级的活）。"""

Checkpoint = Callable[[bool], Any]
"""执行一次 ``PRAGMA wal_checkpoint(PASSIVE)``（参数为真时占着本进程的写者队列），返回结果行
(busy, WAL 页数, 已拷回页数)。"""


class BackgroundCheckpointer:
    """数写事务，攒够了就叫醒后台线程做一次 PASSIVE 检查点（设计见模块说明）。"""

    def __init__(self, checkpoint: Checkpoint, name: str) -> None:
        self._checkpoint = checkpoint
        self._name = name
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._commits = 0  # 上一次检查点之后的写事务数
        self._interval = FIRST_INTERVAL
        self._last_log = 0  # 上一次检查点时 WAL 的页数（只有后台线程读写）
        self._pending = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._generation = FORKS.generation

    def committed(self) -> None:
        """一次写事务提交之后调用（在写锁之外）：只数数，够了就叫醒线程，不在调用方线程上做检查点——
        除非后台线程落后太多（见 ``BEHIND``）。"""
        if self._generation != FORKS.generation:  # 见 _fork：不为每次提交查一次进程号
            self._after_fork()
        with self._lock:
            self._commits += 1
            if self._closed:
                return
            if self._commits >= BEHIND * self._interval:
                # 后台线程迟迟没轮上（2 核机器重负载、GIL 争用）：WAL 的上限不能取决于线程调度，
                # 这一次由提交的线程自己做——与 SQLite 默认的自动检查点同一个做法，只在落后时才发生。
                self._commits = 0
                inline = True
            elif self._commits < self._interval or self._pending:
                return
            else:
                inline = False
                self._pending = True
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                    self._thread.start()
                else:
                    self._wake.notify()
        if inline:
            self._checkpoint_inline()

    def _checkpoint_inline(self) -> None:
        try:
            self._checkpoint(True)  # 占着本进程的写者队列：这一次能拷完，下一次提交从头复用 WAL
        except Exception:
            return  # 与后台那次一样不致命：WAL 先长着，下一轮再试
        with self._lock:
            self._last_log = 0

    def _after_fork(self) -> None:
        # fork 出来的子进程里没有父进程的线程，父进程里别的线程也可能在 fork 那一刻持有锁：全部换新的。
        self._generation = FORKS.generation
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread = None
        self._pending = False
        self._commits = 0

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                self._pending = False
                commits, self._commits = self._commits, 0
            added = self._checkpoint_once()
            with self._lock:
                if added is not None and added > 0 and commits > 0:
                    # 每轮最多翻倍或减半：一两轮估偏了（WAL 中途从头复用、一次 create_many 写了上千页）不至于
                    # 让间隔一下子跳到头。
                    wanted = int(TARGET_FRAMES * commits / added)
                    wanted = max(self._interval // 2, min(self._interval * 2, wanted))
                    self._interval = max(_MIN_INTERVAL, min(_MAX_INTERVAL, wanted))
                self._wake.notify_all()

    def _checkpoint_once(self) -> int | None:
        """一次 PASSIVE 检查点；返回上一次之后 WAL 新增的页数（失败时 None）。

        写者不停时 PASSIVE 拷不完：它只拷开始那一刻之前的页，检查点期间别的线程又追加了新页，而 WAL 只有在
        全部拷回之后才会从头复用，否则一直变长（实测 3,000 个空任务涨到 90 MB）。所以 WAL 超过
        ``FORCE_FRAMES`` 页时，紧接着再做一次占着本进程写者队列的检查点：这一次只拷刚才追加的那几页，
        本进程没有写者插进来，能拷完，下一次提交就从头复用 WAL。它每隔几轮才有一次。占队列之前先不占队列地
        追几遍（``_catch_up``），占队列时只剩几十页。
        """
        try:
            row = self._checkpoint(False)
            if row is None or row[1] is None:
                return None
            log = int(row[1])
            forced = log > FORCE_FRAMES
            if forced:
                self._catch_up(log, log - self._last_log if log >= self._last_log else log)
                self._checkpoint(True)
        except Exception:
            # 检查点失败不致命：WAL 先长着，下一轮再试（存储关闭之后的那一次也走到这里）。
            return None
        if log < self._last_log:
            # WAL 中途从头复用过，这一轮的页数与提交数对不上：不拿它估间隔。
            self._last_log = log
            return None
        added = log - self._last_log
        # 占着写者队列拷完之后，下一次提交就从头复用 WAL：下一轮从 0 数起。
        self._last_log = 0 if forced else log
        return added

    def _catch_up(self, log: int, copied: int) -> None:
        """占写者队列之前，不占队列地再拷几遍：每一遍只拷上一遍期间新追加的页。只在"拷得比写得快"时追：
        每一遍拷的页都要不到上一遍的一半（一遍比一遍短），到某一遍只拷了不多于 ``CATCH_UP_LEFT`` 页、或做满
        ``CATCH_UP_PASSES`` 遍为止。``log`` 是第一遍开始时 WAL 的页数，``copied`` 是第一遍拷的页数（上一次
        检查点之后新增的页）。PASSIVE 拷到它开始那一刻的末尾、返回的正是那时的页数，所以一遍"拷了多少"要由
        下一遍的页数减这一遍的得知；第一遍期间追加了多少，按这期间的写事务数乘每次提交的页数估。

        为什么追：占着写者队列的那一次期间，本进程的每个写者都在排队——提交线程等着自己的 create 落库（submit
        不返回），执行槽等着 starting 落库（任务体不开始）。原来它要拷的是第一遍期间追加的全部页（逐个 submit
        的基准里每轮约 30 次、每次约 500 页，见 bench/README.md 第十七轮 sq17）；追过之后只剩几十页。

        为什么要"减半"才接着追：追的每一遍期间写者照常追加，WAL 照长。拷得比写得快时这些页一遍比一遍少，
        合计不到第一遍期间追加的那么多（WAL 的峰值至多比原来多一个检查点间隔的页）；写得比拷得快时（机器
        很挤、fsync 很慢）追下去 WAL 只会越来越长——那时不追，照原来的做法直接占队列拷完。拷回的页与持久性
        不变：追的几遍只是把原来占队列时要拷的页提前拷了。"""
        with self._lock:
            during = self._commits  # 第一遍期间的写事务数（_loop 在第一遍之前清零）
            per_commit = TARGET_FRAMES / self._interval
        if during * per_commit * 2 > copied:
            return  # 第一遍期间追加的页估计不少于它拷的一半：拷不过写，不追
        for _ in range(CATCH_UP_PASSES):
            row = self._checkpoint(False)
            if row is None or row[1] is None or row[1] < 0:
                return  # 这一遍没做成（-1：别的连接正在做检查点）：交给占队列的那一次
            fresh = row[1] - log  # 这一遍拷的页 = 上一遍期间追加的页
            if row[1] < log or fresh <= CATCH_UP_LEFT or fresh * 2 > copied:
                return  # WAL 已从头复用；或只剩几十页；或没有减半（写得比拷得快）：交给占队列的那一次
            copied, log = fresh, row[1]

    def close(self, timeout: float = 5.0) -> None:
        """停下线程；正在做的那一次检查点做完再返回（最多等 ``timeout`` 秒）。"""
        with self._lock:
            self._closed = True
            self._wake.notify_all()
            thread = self._thread if self._generation == FORKS.generation else None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def interval(self) -> int:
        """当前每隔多少次写事务做一次检查点（测试与基准观察用）。"""
        return self._interval


__all__ = [
    "BEHIND",
    "CATCH_UP_LEFT",
    "CATCH_UP_PASSES",
    "FIRST_INTERVAL",
    "FORCE_FRAMES",
    "TARGET_FRAMES",
    "BackgroundCheckpointer",
]
