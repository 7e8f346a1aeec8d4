"""登录限速：同一地址一分钟内口令错 5 次之后 429 + Retry-After（表单与 Bearer 头合计），FakeClock。"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient
from web_testkit import ClientFactory, csrf_of

from chongming_task.stores.sqlite import SqliteTaskStore
from chongming_task.testing.fake_clock import FakeClock
from chongming_task.web import WebSettings
from chongming_task.web.app import WebConsole
from chongming_task.web.security import LoginLimiter

TOKEN = "s3cret-token-for-tests-0123456789"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def console(store: SqliteTaskStore, clock: FakeClock) -> WebConsole:
    return WebConsole(store, WebSettings(token=TOKEN, default_operator="alice"), clock=clock)


@pytest.fixture
def client(console: WebConsole) -> Iterator[TestClient]:
    with TestClient(console.app, follow_redirects=False) as c:
        yield c


def login(client: TestClient, token: str, csrf: str) -> Any:
    return client.post("/login", data={"csrf": csrf, "token": token, "operator": "bob"})


def test_five_failures_then_429_with_retry_after_until_the_window_passes(
    client: TestClient, clock: FakeClock
) -> None:
    csrf = csrf_of(client, "/login")
    for _ in range(5):
        assert login(client, "wrong-guess", csrf).status_code == 403
    clock.advance(10)
    blocked = login(client, TOKEN, csrf)  # 被限速时连正确的口令也不比较
    assert blocked.status_code == 429
    assert blocked.headers["retry-after"] == "50"
    assert "口令错误次数太多：请 50 秒后再试" in blocked.text
    # Bearer 头与登录表单共用一个计数：换个方式猜也不行
    api = client.get("/api/tasks", headers={"Authorization": f"Bearer {TOKEN}"})
    assert api.status_code == 429 and api.headers["retry-after"] == "50"
    assert "秒后再试" in api.json()["error"]
    clock.advance(50)  # 最早的一次失败滑出一分钟窗口
    ok = login(client, TOKEN, csrf)
    assert ok.status_code == 303
    assert client.get("/api/tasks").status_code == 200


def test_bearer_failures_count_too_and_success_resets(console: WebConsole, client: TestClient) -> None:
    for _ in range(4):
        assert client.get("/api/tasks", headers={"Authorization": "Bearer nope"}).status_code == 401
    csrf = csrf_of(client, "/login")
    assert login(client, TOKEN, csrf).status_code == 303  # 成功清零
    client.cookies.clear()
    for _ in range(5):
        assert client.get("/api/tasks", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/api/tasks", headers={"Authorization": "Bearer nope"}).status_code == 429
    # 不影响不带口令的请求（它们本来就是 401）与无需会话的路径
    assert client.get("/healthz").status_code == 200


def test_limiter_is_per_address_and_bounded(clock: FakeClock) -> None:
    limiter = LoginLimiter(max_failures=2, window=60, clock=clock, max_clients=3)
    limiter.failed("10.0.0.1")
    limiter.failed("10.0.0.1")
    assert limiter.retry_after("10.0.0.1") == 60
    assert limiter.retry_after("10.0.0.2") is None  # 别的地址不受影响
    clock.advance(59.5)
    assert limiter.retry_after("10.0.0.1") == 1  # 向上取整，至少 1 秒
    clock.advance(0.5)
    assert limiter.retry_after("10.0.0.1") is None
    for i in range(2, 6):
        limiter.failed(f"10.0.0.{i}")
        limiter.failed(f"10.0.0.{i}")
    assert limiter.retry_after("10.0.0.2") is None  # 只记最近的 3 个地址：最旧的被忘掉
    assert limiter.retry_after("10.0.0.5") == 60


def test_no_token_means_no_limiter_in_the_way(client_for: ClientFactory) -> None:
    client = client_for()
    for _ in range(10):
        assert client.get("/api/tasks", headers={"Authorization": "Bearer x"}).status_code == 200
