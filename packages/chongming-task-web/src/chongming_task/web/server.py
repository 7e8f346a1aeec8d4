"""用 uvicorn 跑控制台：安全检查、真实端口、Ctrl-C 在 2 秒内退出。

uvicorn 关闭时会等所有连接结束，而 SSE 是长连接：``handle_exit`` 先让共享轮询器结束全部流，
再把收尾时限（``timeout_graceful_shutdown``）压到 1 秒，所以 Ctrl-C 之后服务器很快退出。
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType

import uvicorn

from chongming_task import TaskStore
from chongming_task.web.app import WebConsole, WebSettings
from chongming_task.web.security import check_bind

GRACEFUL_SHUTDOWN_SECONDS = 1


class _ConsoleServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, console: WebConsole, announce: Callable[[str], None]) -> None:
        super().__init__(config)
        self.console = console
        self.announce = announce

    async def startup(self, sockets: list[object] | None = None) -> None:  # type: ignore[override]
        await super().startup(sockets)  # type: ignore[arg-type]
        if self.should_exit or not self.servers:
            return
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        shown = f"[{host}]" if ":" in str(host) else str(host)
        mode = "（只读）" if self.console.settings.read_only else ""
        self.announce(f"网页控制台已启动{mode}：http://{shown}:{port}/ （Ctrl-C 退出）")

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.console.poller.request_stop_threadsafe()  # 先结束 SSE 长连接，关闭才不会等它们
        super().handle_exit(sig, frame)


def serve(
    store: TaskStore,
    settings: WebSettings,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    announce: Callable[[str], None] | None = None,
) -> None:
    """阻塞地运行控制台直到 Ctrl-C / SIGTERM。非回环地址且没有口令 → ``InsecureBind``（不启动）。"""
    check_bind(host, settings.token)
    console = WebConsole(store, settings)
    config = uvicorn.Config(
        console.app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
        proxy_headers=False,  # 不信任 X-Forwarded-*：会话 cookie 的 Secure 只看真实连接
        server_header=False,
    )
    server = _ConsoleServer(
        config, console, announce or (lambda line: print(line, file=sys.stderr, flush=True))
    )
    server.run()


__all__ = ["GRACEFUL_SHUTDOWN_SECONDS", "serve"]
