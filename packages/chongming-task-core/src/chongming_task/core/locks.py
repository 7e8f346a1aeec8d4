"""不在 GIL 下排成车队的锁（``YieldingLock``）。

为什么要有它
-------------
CPython 里两个线程抢同一把 ``threading.Lock``、而临界区只是一小段 Python 代码时，会掉进"锁车队"
（lock convoy）：

1. 线程 A 拿着锁时被要求让出 GIL（另一个线程等 GIL 满 5 ms，``sys.getswitchinterval()``）；
2. 线程 B 拿到 GIL，走到同一把锁前，拿不到，于是在内核里睡下（释放 GIL）；
3. A 回来、放锁——这一放把锁**直接交给了睡着的 B**，而 B 还要等 GIL 才能往下走；
4. A 接着跑到下一次加锁，锁在 B 手里，A 也只好在内核里睡下……

从此每一次加锁都是两次上下文切换。Controller 里两个执行槽跑空任务时，这个车队是最大的开销：
``Controller(max_parallel=2)`` + 内存存储消化积压，每任务 63–178 µs、0.5–4.8 次上下文切换，而且时好时坏
（一旦进入车队就出不来，积压越大越容易进入）；同样的代码只把控制器锁与存储锁换成本模块的锁：
44–47 µs、每任务 0.0–0.1 次切换，从 1 千到 3 万个积压都是平的（bench/README.md"锁车队"一节）。

怎么做
------
先 ``acquire(False)`` 试一次（没人抢时和普通锁一样快）；拿不到就 ``time.sleep(0)``——它让出 GIL，被抢占的
持有者得以跑完它那一小段临界区、放锁（此时没有睡着的等待者，放锁不交接），之后再试。试满 ``SPINS`` 次
仍拿不到（持有者在做阻塞的事，或者真的在长时间持有），才像普通锁一样在内核里等。

只用于**临界区只有内存里的几步操作**的锁。持锁期间会做阻塞 I/O 的锁（比如跨一次数据库提交）不要换：
那时持有者本来就放了 GIL，让出 GIL 换不来什么，白白多转几圈。

接口与 ``threading.Lock`` 相同（``acquire(blocking, timeout)`` / ``release`` / ``locked`` / ``with``），
可以交给 ``threading.Condition`` 当底层锁。不可重入：同一线程第二次加锁会死等，和 ``Lock`` 一样。
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

__all__ = ["SPINS", "YieldingLock"]

SPINS = 20
"""拿不到锁时让出 GIL 再试的次数，之后才在内核里等。

每次让出最多等一个切换间隔（另一个线程在跑时要等它被要求让出 GIL）；持有者被抢占的那一小段临界区通常
一两次就跑完；20 次是上限，不是常态。"""

_sleep = time.sleep
_monotonic = time.monotonic


class YieldingLock:
    """拿不到时先让出 GIL、再试，最后才阻塞的互斥锁（为什么见模块文档）。"""

    # acquire 的快路径、release 与 locked 直接是底层 C 锁的绑定方法：放锁、查锁不多一层 Python 调用。
    __slots__ = ("_try", "_wait", "locked", "release")

    def __init__(self) -> None:
        lock = threading.Lock()
        self._try = lock.acquire
        self._wait = lock.acquire
        self.release = lock.release
        self.locked = lock.locked

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """同 ``threading.Lock.acquire``：``blocking=False`` 只试一次；``timeout`` 秒内拿不到返回 False。"""
        if self._try(False):
            return True
        if not blocking:
            return False
        if timeout < 0:
            return self._contended()
        # 有时限：让出 GIL 的几圈也算在时限里，剩下的时间才交给底层锁去等。
        deadline = _monotonic() + timeout
        for _ in range(SPINS):
            _sleep(0)
            if self._try(False):
                return True
            if _monotonic() >= deadline:
                return False
        return self._wait(True, max(0.0, deadline - _monotonic()))

    def _contended(self) -> bool:
        for _ in range(SPINS):
            _sleep(0)
            if self._try(False):
                return True
        return self._wait()

    def __enter__(self) -> bool:
        if self._try(False):
            return True
        return self._contended()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"<YieldingLock {'locked' if self.locked() else 'unlocked'}>"
