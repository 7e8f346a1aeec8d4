"""测试共用的常量与小工具（conftest 不能被测试模块导入，放在这里）。"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

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
