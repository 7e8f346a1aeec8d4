"""客户端的网络读上限：一次存储调用等服务器回复最多多久。

为什么需要它：``statement_timeout`` 是服务器端的——网络分区时语句根本到不了服务器，它不起作用；
TCP keepalive / ``tcp_user_timeout`` 只在内核收不到对端确认时生效，而挂住的中间设备（负载均衡、
连接池代理、半开的 NAT）照样确认每个字节。于是一次 ``save`` 可以永远挂在 ``recv`` 上——它是在
任务自己的锁里调用的，``stop()``、``submit()`` 跟着一起挂住（issue 22 第 2 条：分区期间 15 秒不返回）。

做法：每个在途调用登记一个期限；一个看门线程在期限到时对该连接的套接字做 ``shutdown(SHUT_RDWR)``。
阻塞在读上的驱动立刻看到 EOF，抛 ``OperationalError``，连接作废（连接池丢弃它）。调用方据
``fired`` 把它翻译成"N 秒内没有收到回复、结果未知"。只用公开的套接字接口，不依赖驱动内部，
对 psycopg 的任何版本都一样；热路径上的开销是一次加锁的字典登记与注销。
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import socket
import threading
import time

from chongming_task.core.locks import YieldingLock


class _Call:
    __slots__ = ("deadline", "fd", "fired", "inode")

    def __init__(self, deadline: float, fd: int, inode: int | None) -> None:
        self.deadline = deadline
        self.fd = fd
        self.fired = False
        # 描述符号会被复用：调用途中驱动关掉了连接、别的线程又开了一个套接字，拿到的可能是同一个号。
        # 切之前核对 inode，只切登记时的那一个套接字。
        self.inode = inode


def socket_inode(fd: int) -> int | None:
    """``fd`` 此刻指向的套接字的 inode（``_cut`` 据它核对没切错套接字）；描述符已无效时 None。"""
    try:
        return os.fstat(fd).st_ino
    except OSError:
        return None


def _cut(fd: int, inode: int | None) -> None:
    """切断这个套接字（两个方向）。fromfd 复制出一个描述符来操作，关掉复制品不影响驱动自己的那个。"""
    with contextlib.suppress(OSError):
        if inode is None or os.fstat(fd).st_ino != inode:
            return
        dup = socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM)
        try:
            dup.shutdown(socket.SHUT_RDWR)
        finally:
            dup.close()


class Deadlines:
    """一个存储的全部在途调用。看门线程在第一次登记时才启动。"""

    def __init__(self, name: str) -> None:
        self._name = name
        # 每次存储调用登记、注销各拿一次这把锁，锁下只有字典操作（看门线程扫描也只是几步比较）：用让出 GIL
        # 的锁，几个写线程同时登记时不排成车队（core/locks.py）。
        self._lock = YieldingLock()
        self._cond = threading.Condition(self._lock)  # type: ignore[arg-type]
        self._calls: dict[int, _Call] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False
        # 看门线程最迟什么时候醒（单调时钟；无限期地等时是 inf）。只在持锁时读写。
        self._wake_at = math.inf

    def arm(self, fd: int, seconds: float, inode: int | None = None) -> tuple[int, _Call]:
        """登记一次在途调用。``inode``：调用方已知的该套接字的 inode（``socket_inode``，同一条连接的套接字
        不变，可以按连接缓存）；不给时这里 ``fstat`` 一次。"""
        if inode is None:
            inode = socket_inode(fd)
        call = _Call(time.monotonic() + seconds, fd, inode)
        # 每次存储调用登记、注销各一次：直接用底层锁的快路径（core/locks.py 说明的写法），不经 Condition 与
        # YieldingLock 的 __enter__ / __exit__ 两层 Python 调用。notify 只要求持有同一把锁。
        lock = self._lock
        if not lock.try_acquire():
            lock.acquire()
        try:
            key = next(self._ids)
            self._calls[key] = call
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._watch, name=f"{self._name}:deadline", daemon=True
                )
                self._thread.start()
            elif call.deadline < self._wake_at:
                # 看门线程在等（除了 wait 它一直持锁，所以此刻不在扫描），而且它醒得比这个期限晚（无限期地等
                # 时是 inf）：叫醒它重算。醒得更早时不叫——它醒来重扫会看到这一条；每次调用都叫醒它曾让每个
                # 存储调用多一次线程切换。
                self._cond.notify()
        finally:
            lock.release()
        return key, call

    def disarm(self, key: int) -> None:
        lock = self._lock
        if not lock.try_acquire():
            lock.acquire()
        try:
            self._calls.pop(key, None)
        finally:
            lock.release()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _watch(self) -> None:
        with self._cond:
            while not self._closed:
                if not self._calls:
                    self._wake_at = math.inf
                    self._cond.wait()
                    continue
                now = time.monotonic()
                # 期限都一样长，最早登记的最先到期；调用不多（≤ 连接池大小），直接扫一遍。
                earliest = min(call.deadline for call in self._calls.values())
                if earliest > now:
                    self._wake_at = earliest
                    self._cond.wait(earliest - now)
                    continue
                for key, call in list(self._calls.items()):
                    if call.deadline <= now and not call.fired:
                        call.fired = True
                        _cut(call.fd, call.inode)
                        del self._calls[key]


__all__ = ["Deadlines", "socket_inode"]
