"""LISTEN/NOTIFY：指令一提交，持有任务的控制器立刻知道，而不是等下一轮轮询。

一条专用连接（不取自连接池：LISTEN 是会话级状态，归还给池的连接可能被别人拿去、被重置，
而且一条长期阻塞在等待通知上的连接会永久占掉池里的一个名额）。后台线程阻塞在
``conn.notifies()`` 上，收到通知就唤醒等待者、调用回调。

通知只是"快点来看"的提示，不是投递通道：指令本身永远经由 ``claim_commands`` 取走，所以
通知丢了（连接断开、监听还没建立）最多多等一个轮询间隔。为了把这一点做实，监听连接每次
（重新）建立之后都会发一次"可能漏掉了"的唤醒（回调收到 None），让调用方立刻补一次轮询。
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from chongming_task.storage import CommandAction

logger = logging.getLogger("chongming_task.stores.postgres")

_POLL_SECONDS = 0.2
"""notifies() 的分段等待：决定 close() 最多要等多久后台线程退出，不影响通知的时延。"""

_RECONNECT_MIN = 0.2
_RECONNECT_MAX = 5.0


@dataclass(frozen=True)
class CommandNotice:
    """一条"有新指令"的通知（来自 submit_command 或 release_command）。

    它只是提示：真正取指令仍要走 ``claim_commands``——通知可能丢，也可能属于别的节点。
    """

    command_id: str
    task_id: str
    action: CommandAction | None
    bucket: int | None


NoticeCallback = Callable[[CommandNotice | None], object]
"""回调：收到 CommandNotice；收到 None 表示监听连接刚（重新）建立、之前的通知可能漏了，应补一次轮询。"""


def parse_notice(payload: str) -> CommandNotice | None:
    try:
        data: Any = json.loads(payload)
        action_text = data.get("action")
        bucket = data.get("bucket")
        return CommandNotice(
            command_id=str(data["command_id"]),
            task_id=str(data["task_id"]),
            action=CommandAction(action_text) if action_text in {a.value for a in CommandAction} else None,
            bucket=bucket if isinstance(bucket, int) and not isinstance(bucket, bool) else None,
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


class CommandListener:
    """后台监听线程 + 等待者计数。由 PostgresTaskStore 按需创建，随 store.close() 关闭。"""

    def __init__(self, conninfo: str, connect_kwargs: dict[str, Any], channel: str) -> None:
        self._conninfo = conninfo
        self._connect_kwargs = connect_kwargs
        self._channel = channel
        self._cond = threading.Condition()
        self._generation = 0  # 每收到一次唤醒加一；等待者比较它来判断"自上次以来有没有新通知"
        self._local = threading.local()
        self._callbacks: list[NoticeCallback] = []
        self._events: list[threading.Event] = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.last_error: BaseException | None = None

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self, ready_timeout: float) -> bool:
        """启动后台线程（幂等），等到 LISTEN 生效或超时；返回是否已在监听。"""
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"chongming-pg-listen:{self._channel}", daemon=True
                )
                self._thread.start()
        return self._ready.wait(ready_timeout)

    @property
    def started(self) -> bool:
        return self._thread is not None

    @property
    def listening(self) -> bool:
        return self._ready.is_set()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self._cond:
            self._cond.notify_all()

    # -- subscribers ----------------------------------------------------------------------------------

    def add(self, target: NoticeCallback | threading.Event) -> Callable[[], None]:
        with self._cond:
            if isinstance(target, threading.Event):
                self._events.append(target)
            else:
                self._callbacks.append(target)

        def unsubscribe() -> None:
            with self._cond:
                if isinstance(target, threading.Event):
                    if target in self._events:
                        self._events.remove(target)
                elif target in self._callbacks:
                    self._callbacks.remove(target)

        return unsubscribe

    def wait(self, timeout: float | None) -> bool:
        """等到本线程上次调用之后有新通知（或超时）。

        基准按线程记：两次 wait 之间到达的通知不会丢——典型用法"取指令 → wait → 取指令"里，
        取指令期间到达的通知会让下一次 wait 立刻返回 True。
        """
        with self._cond:
            seen: int | None = getattr(self._local, "seen", None)
            if seen is None:
                seen = self._generation
            if self._generation == seen and not self._stop.is_set():
                self._cond.wait_for(lambda: self._generation != seen or self._stop.is_set(), timeout)
            notified = self._generation != seen
            self._local.seen = self._generation
            return notified

    # -- background thread ----------------------------------------------------------------------------

    def _wake(self, notice: CommandNotice | None) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()
            callbacks = list(self._callbacks)
            events = list(self._events)
        for event in events:
            event.set()
        for callback in callbacks:
            try:
                callback(notice)
            except Exception:  # 回调是调用方的代码：它出错不能让监听线程死掉
                logger.exception("指令通知回调抛出异常（已忽略，监听继续）")

    def _run(self) -> None:
        delay = _RECONNECT_MIN
        listen = sql.SQL("LISTEN {}").format(sql.Identifier(self._channel))
        reconnecting = False
        # 故障期间每次重连失败都打 WARNING 会刷屏：一次故障只打第一行 WARNING，之后的重连失败降为 INFO，
        # 连上之后打一行 INFO（issue 22 第 13 条）。
        failing = False
        while not self._stop.is_set():
            conn: psycopg.Connection[Any] | None = None
            try:
                conn = psycopg.connect(self._conninfo, autocommit=True, **self._connect_kwargs)
                conn.execute(listen)
                delay = _RECONNECT_MIN
                if failing:
                    logger.info("指令监听连接已恢复")
                    failing = False
                if reconnecting:
                    # 断线期间提交的指令收不到通知了：叫醒大家补一次轮询。
                    self._wake(None)
                reconnecting = True
                self._ready.set()
                while not self._stop.is_set():
                    for notify in conn.notifies(timeout=_POLL_SECONDS):
                        if notify.channel != self._channel:
                            continue
                        self._wake(parse_notice(notify.payload))
            except psycopg.Error as exc:
                self.last_error = exc
                if not self._stop.is_set():
                    logger.log(
                        logging.INFO if failing else logging.WARNING,
                        "指令监听连接中断，%.1f 秒后重连（期间靠轮询兜底）：%s",
                        delay,
                        exc,
                    )
                    failing = True
            finally:
                self._ready.clear()
                if conn is not None:
                    with contextlib.suppress(psycopg.Error):
                        conn.close()
            if self._stop.wait(delay):
                break
            delay = min(delay * 2, _RECONNECT_MAX)


__all__ = ["CommandListener", "CommandNotice", "NoticeCallback", "parse_notice"]
