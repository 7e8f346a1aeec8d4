"""每个服务器一个共享的存储轮询器：不管开了多少个浏览器，每种视图每个间隔只查一次存储。

"视图"按键区分（``tasks?<筛选与页>``、``task:<id>``、``overview``）：同一个键的所有 SSE 连接共享
一次查询的结果；没有订阅者的键不再查询。查询是同步的存储调用，放进线程池执行，事件循环不被阻塞。

关闭时（Ctrl-C → 服务器的 handle_exit）``request_stop_threadsafe`` 让所有订阅立即结束，
SSE 流干净地收尾，uvicorn 不必等长连接超时。
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool

logger = logging.getLogger("chongming_task.web")

KEEPALIVE_SECONDS = 15.0
KEEPALIVE: Any = object()
"""``subscribe_values`` 在长时间没有变化时产出的心跳标记。"""


@dataclass
class _Topic:
    fetch: Callable[[], Any]
    subscribers: int = 0
    payload: Any = None
    text: str | None = None
    version: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    first: asyncio.Lock = field(default_factory=asyncio.Lock)


def _encode(payload: Any) -> str:
    # 不缩进、不含换行：一个 SSE data 行就是一个完整 JSON。
    return json.dumps(payload, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


class SharedPoller:
    """按键共享的轮询。``queries`` 记每个键查了几次存储（测试与 /metrics 用）。"""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.queries: Counter[str] = Counter()
        self._topics: dict[str, _Topic] = {}
        self._closing = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._closing = asyncio.Event()  # 同一个应用可以被再次启动（测试里每个 TestClient 一个事件循环）
        self._topics.clear()
        self._task = asyncio.create_task(self._run(), name="chongming-web-poller")

    def request_stop_threadsafe(self) -> None:
        """可以从信号处理或别的线程调用：让轮询与全部 SSE 流尽快结束。"""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._closing.set)

    async def stop(self) -> None:
        self._closing.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _poll(self, key: str, topic: _Topic) -> None:
        self.queries[key] += 1
        try:
            payload = await run_in_threadpool(topic.fetch)
        except Exception as exc:  # 存储暂时不可用：把错误推给页面，而不是让轮询器死掉
            logger.warning("轮询 %s 失败：%s", key, exc)
            payload = {"error": f"读取存储失败：{exc}"}
        text = _encode(payload)
        if text != topic.text:
            topic.text = text
            topic.payload = payload
            topic.version += 1
            # 换一个新 Event 再唤醒旧的：被唤醒的订阅者下一轮等的是新 Event，不会空转。
            old, topic.changed = topic.changed, asyncio.Event()
            old.set()

    async def _run(self) -> None:
        while not self._closing.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._closing.wait(), timeout=self.interval)
            if self._closing.is_set():
                break
            for key, topic in list(self._topics.items()):
                if topic.subscribers <= 0:
                    self._topics.pop(key, None)
                    continue
                await self._poll(key, topic)

    async def subscribe(self, key: str, fetch: Callable[[], Any]) -> AsyncIterator[str | None]:
        """依次产出这个键的 JSON 文本（先是当前值，之后每次变化一条）；长时间没变化时产出 None（心跳）。

        服务器关闭时迭代结束。
        """
        async for topic in self._follow(key, fetch):
            yield None if topic is None else topic.text

    async def subscribe_values(self, key: str, fetch: Callable[[], Any]) -> AsyncIterator[Any]:
        """同 ``subscribe``，但产出查询结果本身（心跳是 ``KEEPALIVE``）：每个连接要自己再加工结果时用
        （日志流只把这个连接还没见过的行发出去）。结果对象是所有订阅者共享的，不能修改。"""
        async for topic in self._follow(key, fetch):
            yield KEEPALIVE if topic is None else topic.payload

    async def _follow(self, key: str, fetch: Callable[[], Any]) -> AsyncIterator[_Topic | None]:
        topic = self._topics.get(key)
        if topic is None:
            topic = self._topics[key] = _Topic(fetch)
        topic.subscribers += 1
        try:
            async with topic.first:
                if topic.text is None:
                    await self._poll(key, topic)  # 新视图的第一个订阅者：立刻查一次，不等下个间隔
            seen = topic.version
            yield topic
            while not self._closing.is_set():
                if topic.version != seen:
                    seen = topic.version
                    yield topic
                    continue
                changed = asyncio.ensure_future(topic.changed.wait())
                closing = asyncio.ensure_future(self._closing.wait())
                try:
                    done, _ = await asyncio.wait(
                        {changed, closing}, timeout=KEEPALIVE_SECONDS, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    changed.cancel()
                    closing.cancel()
                if not done:
                    yield None
        finally:
            topic.subscribers -= 1

    def subscribers(self) -> dict[str, int]:
        return {key: topic.subscribers for key, topic in self._topics.items()}


__all__ = ["KEEPALIVE", "KEEPALIVE_SECONDS", "SharedPoller"]
