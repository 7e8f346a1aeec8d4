"""批量提交期间暂停循环 GC（``Controller.submit_many``，用户指南 §9.8）。

为什么：十万个任务的 submit_many 一口气造出约九十万个被循环 GC 追踪、且全部活着的对象（快照、状态机、
句柄……）。CPython 的分代回收每当"新晋升到最老一代的对象超过那一代的四分之一"就做一次全量回收，于是这一次调用里
要做七八次全量扫描，每次扫遍全部在管任务的对象，而它们一个也不是垃圾——十万个任务里这要一两秒。
暂停期间只是不回收循环垃圾（引用计数照常释放一切非循环的对象），恢复之后照常按阈值回收。

规则（用户的 GC 设置不能被我们改掉）：

* 只在进入时 GC 是开着的才关、只由最后一个退出的调用者恢复（多个线程同时 submit_many 时按计数）；
  无论正常返回还是抛错，退出时都恢复。进入时本来就关着 GC 的，我们什么也不碰。
* 只改开 / 关，不改阈值，也不 ``gc.freeze()``（那会让这些对象永远不被回收）。
* fork 出的子进程（暂停期间别的线程 fork）里恢复成进入前的样子：子进程里没有那次 submit_many 去恢复它。
* 已知的限度：暂停期间别的线程自己调用了 ``gc.disable()``，最后一个退出的调用者仍会把 GC 打开——
  我们无从分辨那次关闭是谁做的。
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0
"""正在暂停中的调用个数（嵌套 / 多线程同时调用）。"""
_resume = False
"""最后一个退出的调用者要不要把 GC 打开（第一个进入者进入时 GC 是开着的，由我们关的）。"""


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """在 ``with`` 块内暂停循环 GC，退出时（含异常）恢复成进入前的设置（规则见模块说明）。"""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            if _resume:
                gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                _resume = False
                gc.enable()


def _after_fork_in_child() -> None:
    # 子进程只有 fork 的那一条线程：暂停中的调用都不在了，没人会退出去恢复；锁可能在 fork 那一刻被别的线程
    # 拿着，换一把新的。
    global _lock, _depth, _resume
    _lock = threading.Lock()
    if _depth and _resume:
        gc.enable()
    _depth = 0
    _resume = False


os.register_at_fork(after_in_child=_after_fork_in_child)


def paused_depth() -> int:
    """正在暂停中的调用个数（测试用）。"""
    return _depth
