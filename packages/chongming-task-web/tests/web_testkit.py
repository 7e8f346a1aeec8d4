"""测试共用的常量与小工具（conftest 不能被测试模块导入，放在这里）。"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from starlette.testclient import TestClient

from chongming_task import TaskSnapshot

T0 = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)

MakeTask = Callable[..., TaskSnapshot]
ClientFactory = Callable[..., TestClient]


def csrf_of(client: TestClient, path: str = "/tasks") -> str:
    """从页面里取出 CSRF 令牌（与浏览器拿到的是同一个）。"""
    html = client.get(path).text
    marker = '<meta name="csrf-token" content="'
    start = html.index(marker) + len(marker)
    return html[start : html.index('"', start)]


class CountingStore:
    """包一层存储，数每个方法被调了几次（共享轮询器"每视图每间隔一次查询"就靠它来核对）。"""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if not callable(target):
            return target

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return target(*args, **kwargs)

        return counted


class LiveServer:
    """在本线程之外用真实的 uvicorn 跑一个控制台（127.0.0.1 的随机端口）：SSE 长连接要真实的流式服务器，
    TestClient 会等响应结束才返回。``with LiveServer(console) as base_url: ...``；退出时像 Ctrl-C 那样关。"""

    def __init__(self, console: Any) -> None:
        self.console = console
        self.server: Any = None
        self.thread: threading.Thread | None = None

    def __enter__(self) -> str:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.console.app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise AssertionError("uvicorn 没有在 10 秒内启动")
            time.sleep(0.01)
        return f"http://127.0.0.1:{port}"

    def stop(self) -> float:
        """像 Ctrl-C 那样关闭（先结束 SSE 流），返回关闭用了几秒。"""
        started = time.monotonic()
        if self.server is not None and self.thread is not None and self.thread.is_alive():
            self.console.poller.request_stop_threadsafe()
            self.server.should_exit = True
            self.thread.join(timeout=10)
        return time.monotonic() - started

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def sse_events(
    client: Any,
    url: str,
    *,
    until: Callable[[list[tuple[str, str]]], bool],
    headers: Any = None,
    events: list[tuple[str, str]] | None = None,
) -> list[tuple[str, str]]:
    """读一个 SSE 流，收集 (event, data)（也追加进 ``events``，调用方边读边看），直到 ``until(events)``
    成立或服务器结束流（收到 bye）。"""
    events = [] if events is None else events
    event, data = "message", ""
    async with client.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
            elif line == "" and data:
                events.append((event, data))
                if event == "bye" or until(events):
                    return events
                event, data = "message", ""
    return events
