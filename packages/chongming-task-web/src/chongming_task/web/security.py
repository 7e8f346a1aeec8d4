"""默认安全：会话、登录、CSRF、安全响应头、只在回环地址上免口令。

威胁模型（docs/web.md 的"安全模型"一节）：控制台能停掉生产任务，所以

* 默认只监听 127.0.0.1；监听非回环地址而没有 ``--token`` 时拒绝启动（``check_bind``）。
* 有口令时：登录页用口令换一个服务端会话，cookie 是 HttpOnly + SameSite=Strict（脚本读不到、
  跨站请求不带）。口令用 ``hmac.compare_digest`` 比较（常数时间，不泄露前缀是否对）。登录成功后
  换一个新的会话 id，防止会话固定。脚本调用 JSON API 用 ``Authorization: Bearer <口令>``。
* 每个改变状态的请求都要 CSRF 令牌（表单字段 ``csrf`` 或请求头 ``X-CSRF-Token``），与会话里的
  逐字比较。没有口令时也一样：否则任何网页都能让本机浏览器往 127.0.0.1 提交一个"停止"。
  Bearer 请求免 CSRF：浏览器不会替跨站请求自动带上 Authorization 头。
* 登录限速（``LoginLimiter``）：同一个客户端地址一分钟内口令错 5 次（登录表单与 Bearer 头合计），之后的
  尝试一律 429 + ``Retry-After``，在窗口过去之前连口令都不比较。
* CSP 只允许同源脚本（没有内联脚本）、``frame-ancestors 'none'``（不许被嵌进别人的页面点击劫持）。
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import math
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from chongming_task.clock import Clock, SystemClock

SESSION_COOKIE = "chongming_session"
SESSION_TTL = 12 * 3600.0
MAX_SESSIONS = 10_000
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
OPERATOR_HEADER = "x-chongming-operator"
MAX_LOGIN_FAILURES = 5
LOGIN_WINDOW_SECONDS = 60.0
MAX_TRACKED_CLIENTS = 10_000

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
]

# 不需要会话的路径：静态文件、健康检查、指标（不为它们建会话，免得被刷爆会话表）。
_SESSIONLESS_PREFIXES = ("/static/", "/healthz", "/metrics", "/favicon.ico")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class InsecureBind(ValueError):
    """监听地址与口令的组合不安全（拒绝启动）。"""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # 主机名：无法确认只在本机，按非回环处理


def check_bind(host: str, token: str | None) -> None:
    if token is None and not is_loopback(host):
        raise InsecureBind(
            f"拒绝在非回环地址 {host} 上无口令启动：任何能连到这台机器的人都能停掉任务。"
            "请加 --token（或环境变量 CHONGMING_TASK_WEB_TOKEN），或改用 --host 127.0.0.1"
        )
    if token is not None and len(token) < 16:
        generate = "python -c 'import secrets; print(secrets.token_urlsafe())'"
        raise InsecureBind(f"口令太短：--token 至少 16 个字符（可用 {generate} 生成）")


def tokens_equal(expected: str, supplied: str | None) -> bool:
    if supplied is None:
        return False
    return hmac.compare_digest(expected.encode("utf-8"), supplied.encode("utf-8"))


class LoginLimiter:
    """按客户端地址数口令错误：``window`` 秒内错满 ``max_failures`` 次就拒绝，直到最早的那次滑出窗口。

    只在内存里、只数失败（登录成功清零）。记录的地址数有上界（最久没动静的先忘），内存不会被换着地址刷爆。
    时间取自 ``clock.monotonic()``，测试用 FakeClock。
    """

    def __init__(
        self,
        *,
        max_failures: int = MAX_LOGIN_FAILURES,
        window: float = LOGIN_WINDOW_SECONDS,
        clock: Clock | None = None,
        max_clients: int = MAX_TRACKED_CLIENTS,
    ) -> None:
        self.max_failures = max_failures
        self.window = window
        self.clock: Clock = clock or SystemClock()
        self.max_clients = max_clients
        self._lock = threading.Lock()
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, client: str, now: float) -> deque[float] | None:
        stamps = self._failures.get(client)
        if stamps is None:
            return None
        while stamps and stamps[0] <= now - self.window:
            stamps.popleft()
        if not stamps:
            del self._failures[client]
            return None
        return stamps

    def retry_after(self, client: str) -> int | None:
        """这个地址现在被拒绝时返回还要等几秒（向上取整，至少 1），否则 None。"""
        with self._lock:
            now = self.clock.monotonic()
            stamps = self._recent(client, now)
            if stamps is None or len(stamps) < self.max_failures:
                return None
            return max(1, math.ceil(stamps[-self.max_failures] + self.window - now))

    def failed(self, client: str) -> None:
        with self._lock:
            now = self.clock.monotonic()
            stamps = self._recent(client, now) or deque(maxlen=self.max_failures)
            stamps.append(now)
            self._failures[client] = stamps
            self._failures.move_to_end(client)
            while len(self._failures) > self.max_clients:
                self._failures.popitem(last=False)

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._failures.pop(client, None)


def too_many_attempts(seconds: int) -> str:
    return f"口令错误次数太多：请 {seconds} 秒后再试（同一地址每分钟最多错 {MAX_LOGIN_FAILURES} 次）"


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


@dataclass
class Session:
    session_id: str
    csrf: str
    operator: str
    authenticated: bool
    expires: float
    bearer: bool = False  # Authorization: Bearer 请求的一次性会话（不入会话表、免 CSRF）


class SessionStore:
    """服务端会话表（只在内存里：重启即全部登出，这是有意的——口令才是凭据，会话只是它的缓存）。"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: OrderedDict[str, Session] = OrderedDict()

    def create(self, operator: str, *, authenticated: bool) -> Session:
        session = Session(
            session_id=secrets.token_urlsafe(32),
            csrf=secrets.token_urlsafe(32),
            operator=operator,
            authenticated=authenticated,
            expires=time.monotonic() + SESSION_TTL,
        )
        with self._lock:
            self._items[session.session_id] = session
            while len(self._items) > MAX_SESSIONS:
                self._items.popitem(last=False)  # 最旧的先走
        return session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        with self._lock:
            session = self._items.get(session_id)
            if session is None:
                return None
            if session.expires < time.monotonic():
                del self._items[session_id]
                return None
            return session

    def delete(self, session_id: str) -> None:
        with self._lock:
            self._items.pop(session_id, None)


def cookie_header(session: Session, *, secure: bool) -> bytes:
    parts = [
        f"{SESSION_COOKIE}={session.session_id}",
        "Path=/",
        "HttpOnly",
        "SameSite=Strict",
        f"Max-Age={int(SESSION_TTL)}",
    ]
    if secure:
        parts.append("Secure")
    return "; ".join(parts).encode("ascii")


def _cookie(scope: Scope, name: str) -> str | None:
    for key, value in scope.get("headers", []):
        if key == b"cookie":
            for part in value.decode("latin-1").split(";"):
                k, _, v = part.strip().partition("=")
                if k == name:
                    return str(v)
    return None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return None


@dataclass(eq=False)  # 中间件按身份比较，不按字段
class SecurityMiddleware:
    """纯 ASGI 中间件（不缓冲响应，SSE 照常流式）：加安全头；找出或建立会话，放进 scope["session_obj"]。

    * 没有口令：第一次来的浏览器自动得到一个已认证的会话（操作者为服务器的默认操作者名）。
    * 有口令：第一次来的浏览器得到一个**未认证**的会话（只为登录表单的 CSRF），登录后换新会话。
    * ``Authorization: Bearer <口令>``：一次性的已认证会话，操作者取自 ``X-Chongming-Operator`` 头。
    """

    app: ASGIApp
    _: KW_ONLY
    token: str | None
    default_operator: str
    sessions: SessionStore
    limiter: LoginLimiter

    def _bearer(self, scope: Scope) -> Session | int | None:
        """Bearer 头对了 → 一次性会话；错了 → None（并计一次失败）；这个地址被限速 → 要等的秒数。"""
        header = _header(scope, b"authorization")
        if self.token is None or header is None or not header.lower().startswith("bearer "):
            return None
        client = client_address(scope)
        wait = self.limiter.retry_after(client)
        if wait is not None:
            return wait
        if not tokens_equal(self.token, header[7:].strip()):
            self.limiter.failed(client)
            return None
        operator = (_header(scope, OPERATOR_HEADER.encode()) or "api").strip() or "api"
        return Session("", "", operator[:64], authenticated=True, expires=0.0, bearer=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        new_cookie: bytes | None = None
        session: Session | None = None
        if not path.startswith(_SESSIONLESS_PREFIXES):
            bearer = self._bearer(scope)
            if isinstance(bearer, int):
                await _too_many(send, bearer)
                return
            session = bearer or self.sessions.get(_cookie(scope, SESSION_COOKIE))
            if session is None:
                session = self.sessions.create(self.default_operator, authenticated=self.token is None)
                new_cookie = cookie_header(session, secure=scope.get("scheme") == "https")
        scope["session_obj"] = session
        scope["set_cookie"] = new_cookie

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.extend(SECURITY_HEADERS)
                cookie = scope.get("set_cookie")
                if cookie is not None:
                    headers.append((b"set-cookie", cookie))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _too_many(send: Send, seconds: int) -> None:
    body = json.dumps({"error": too_many_attempts(seconds)}, ensure_ascii=False).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(seconds).encode()),
        *SECURITY_HEADERS,
    ]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})


__all__ = [
    "CONTENT_SECURITY_POLICY",
    "CSRF_FIELD",
    "CSRF_HEADER",
    "SESSION_COOKIE",
    "InsecureBind",
    "LoginLimiter",
    "SecurityMiddleware",
    "Session",
    "SessionStore",
    "check_bind",
    "client_address",
    "cookie_header",
    "is_loopback",
    "tokens_equal",
    "too_many_attempts",
]
