"""默认安全：会话、登录、CSRF、安全响应头、只在回环地址上免口令。

威胁模型（docs/web.md 的"安全模型"一节）：控制台能停掉生产任务，所以

* 默认只监听 127.0.0.1；监听非回环地址而没有 ``--token`` 时拒绝启动（``check_bind``）。
* 有口令时：登录页用口令换一个服务端会话，cookie 是 HttpOnly + SameSite=Strict（脚本读不到、
  跨站请求不带）。口令用 ``hmac.compare_digest`` 比较（常数时间，不泄露前缀是否对）。登录成功后
  换一个新的会话 id，防止会话固定。脚本调用 JSON API 用 ``Authorization: Bearer <口令>``。
* 每个改变状态的请求都要 CSRF 令牌（表单字段 ``csrf`` 或请求头 ``X-CSRF-Token``），与会话里的
  逐字比较。没有口令时也一样：否则任何网页都能让本机浏览器往 127.0.0.1 提交一个"停止"。
  Bearer 请求免 CSRF：浏览器不会替跨站请求自动带上 Authorization 头。
* CSP 只允许同源脚本（没有内联脚本）、``frame-ancestors 'none'``（不许被嵌进别人的页面点击劫持）。
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

SESSION_COOKIE = "chongming_session"
SESSION_TTL = 12 * 3600.0
MAX_SESSIONS = 10_000
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
OPERATOR_HEADER = "x-chongming-operator"

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


class SecurityMiddleware:
    """纯 ASGI 中间件（不缓冲响应，SSE 照常流式）：加安全头；找出或建立会话，放进 scope["session_obj"]。

    * 没有口令：第一次来的浏览器自动得到一个已认证的会话（操作者为服务器的默认操作者名）。
    * 有口令：第一次来的浏览器得到一个**未认证**的会话（只为登录表单的 CSRF），登录后换新会话。
    * ``Authorization: Bearer <口令>``：一次性的已认证会话，操作者取自 ``X-Chongming-Operator`` 头。
    """

    def __init__(
        self, app: ASGIApp, *, token: str | None, default_operator: str, sessions: SessionStore
    ) -> None:
        self.app = app
        self.token = token
        self.default_operator = default_operator
        self.sessions = sessions

    def _bearer(self, scope: Scope) -> Session | None:
        header = _header(scope, b"authorization")
        if self.token is None or header is None or not header.lower().startswith("bearer "):
            return None
        if not tokens_equal(self.token, header[7:].strip()):
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
            session = self._bearer(scope) or self.sessions.get(_cookie(scope, SESSION_COOKIE))
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


__all__ = [
    "CONTENT_SECURITY_POLICY",
    "CSRF_FIELD",
    "CSRF_HEADER",
    "SESSION_COOKIE",
    "InsecureBind",
    "SecurityMiddleware",
    "Session",
    "SessionStore",
    "check_bind",
    "cookie_header",
    "is_loopback",
    "tokens_equal",
]
