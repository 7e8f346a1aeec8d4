"""Starlette 应用：页面、JSON API、SSE、健康检查与指标。

路由只做三件事：校验参数（错了就 400，一行中文）、检查会话与 CSRF、把同步的存储调用放进线程池
（``run_in_threadpool``）。读写逻辑全在 ``service.ConsoleService``，页面与 API 共用它。
"""

from __future__ import annotations

import getpass
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from chongming_task import TaskStatus, TaskStore
from chongming_task.clock import Clock
from chongming_task.web.filters import (
    BadRequest,
    TaskFilter,
    parse_cursor,
    parse_filter,
    parse_log_args,
    parse_page_size,
)
from chongming_task.web.poller import KEEPALIVE, SharedPoller
from chongming_task.web.present import ACTION_LABELS, STATUS_LABELS
from chongming_task.web.security import (
    CSRF_FIELD,
    CSRF_HEADER,
    LoginLimiter,
    SecurityMiddleware,
    Session,
    SessionStore,
    client_address,
    cookie_header,
    tokens_equal,
    too_many_attempts,
)
from chongming_task.web.service import (
    Conflict,
    ConsoleService,
    LogTail,
    NotFound,
    check_action,
    check_operator,
    check_reason,
    check_task_action,
)

logger = logging.getLogger("chongming_task.web")

HERE = Path(__file__).resolve().parent
MAX_BODY = 64 * 1024
DEFAULT_POLL_INTERVAL = 1.0


@dataclass(frozen=True)
class WebSettings:
    """服务器配置。``token`` 为 None 表示不要求登录（只允许在回环地址上这样启动，见 security.check_bind）。"""

    token: str | None = None
    read_only: bool = False
    num_buckets: int = 64
    poll_interval: float = DEFAULT_POLL_INTERVAL
    default_operator: str | None = None
    store_display: str = ""


class HttpError(Exception):
    def __init__(self, status: int, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.data = data or {}


def _default_operator() -> str:
    try:
        return getpass.getuser() or "local"
    except Exception:  # 容器里可能没有对应的用户名
        return "local"


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("chongming_task.web", "templates"),
        autoescape=True,  # 一律转义：任务名、标签、原因、失败信息都来自不可信的输入
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["STATUS_LABELS"] = {s.value: label for s, label in STATUS_LABELS.items()}
    env.globals["ACTION_LABELS"] = ACTION_LABELS
    env.globals["ALL_STATUSES"] = [s.value for s in TaskStatus]
    env.filters["q"] = lambda value: quote(str(value), safe="")
    return env


class WebConsole:
    """一个控制台实例：存储、服务层、共享轮询器、会话表与 Starlette 应用。"""

    def __init__(self, store: TaskStore, settings: WebSettings, *, clock: Clock | None = None) -> None:
        self.settings = settings
        self.limiter = LoginLimiter(clock=clock)  # 登录限速的时钟（测试传 FakeClock）
        self.service = ConsoleService(store, num_buckets=settings.num_buckets, read_only=settings.read_only)
        self.poller = SharedPoller(settings.poll_interval)
        self.sessions = SessionStore()
        self.templates = _templates()
        self.operator = settings.default_operator or _default_operator()
        # 会话 id → 待显示的一次性提示（POST → 303 → GET 之间传话）。
        self.flashes: dict[str, list[str]] = {}
        self.app = self._build()

    # -- plumbing -----------------------------------------------------------------------------------

    def _build(self) -> Starlette:
        r = Route
        routes = [
            r("/", self.index),
            r("/login", self.login_page, methods=["GET"]),
            r("/login", self.login_submit, methods=["POST"]),
            r("/logout", self.logout, methods=["POST"]),
            r("/tasks", self.tasks_page),
            r("/tasks/{task_id:path}/action", self.task_action, methods=["POST"]),
            r("/tasks/{task_id:path}", self.task_page),
            r("/overview", self.overview_page),
            r("/overview/reconcile", self.reconcile_submit, methods=["POST"]),
            r("/bulk", self.bulk_page, methods=["GET"]),
            r("/bulk", self.bulk_submit, methods=["POST"]),
            r("/api/tasks", self.api_tasks),
            r("/api/overview", self.api_overview),
            r("/api/doctor", self.api_doctor),
            r("/api/bulk/preview", self.api_bulk_preview),
            r("/api/bulk", self.api_bulk, methods=["POST"]),
            r("/api/reconcile", self.api_reconcile, methods=["POST"]),
            r("/api/stream/tasks", self.stream_tasks),
            r("/api/stream/overview", self.stream_overview),
            r("/api/stream/task/{task_id:path}", self.stream_task),
            r("/api/stream/logs/{task_id:path}", self.stream_logs),
            r("/api/tasks/{task_id:path}/logs", self.api_task_logs, methods=["GET"]),
            r("/api/tasks/{task_id:path}/{action:str}", self.api_task_action, methods=["POST"]),
            r("/api/tasks/{task_id:path}", self.api_task),
            r("/favicon.ico", self.favicon),
            r("/healthz", self.healthz),
            r("/metrics", self.metrics),
            Mount("/static", app=StaticFiles(packages=[("chongming_task.web", "static")]), name="static"),
        ]

        @asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            await self.poller.start()
            try:
                yield
            finally:
                await self.poller.stop()
                await run_in_threadpool(self.service.close)

        app = Starlette(
            routes=routes,
            lifespan=lifespan,
            exception_handlers={HttpError: self._http_error, 404: self._not_found},  # type: ignore[dict-item]
        )
        app.add_middleware(
            SecurityMiddleware,
            token=self.settings.token,
            default_operator=self.operator,
            sessions=self.sessions,
            limiter=self.limiter,
        )
        return app

    async def _http_error(self, request: Request, exc: HttpError) -> Response:
        if isinstance(exc, _Redirect):
            return RedirectResponse(exc.location, status_code=303)
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": exc.message, **exc.data}, status_code=exc.status)
        return self.render(request, "error.html", {"status": exc.status, "message": exc.message}, exc.status)

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        return await self._http_error(request, HttpError(404, "没有这个页面：请从导航栏进入"))

    def flash(self, session: Session, message: str) -> None:
        if session.session_id:
            messages = self.flashes.setdefault(session.session_id, [])
            messages.append(message)
            del messages[:-5]
            while len(self.flashes) > 10_000:  # 不再回来的会话留下的提示：有上界
                del self.flashes[next(iter(self.flashes))]

    def session(self, request: Request) -> Session:
        session = request.scope.get("session_obj")
        assert isinstance(session, Session), "SecurityMiddleware 必须在路由之前运行"
        return session

    def require_login(self, request: Request, *, api: bool) -> Session:
        session = self.session(request)
        if session.authenticated:
            return session
        if api:
            raise HttpError(401, "需要登录：请求头带上 Authorization: Bearer <口令>，或先在 /login 登录")
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise _Redirect(f"/login?{urlencode({'next': target})}")

    def check_csrf(self, request: Request, session: Session, form: dict[str, str] | None) -> None:
        if session.bearer:
            return  # 浏览器不会替跨站请求带 Authorization 头：Bearer 请求天然不受 CSRF 影响
        supplied = request.headers.get(CSRF_HEADER) or (form or {}).get(CSRF_FIELD)
        if not tokens_equal(session.csrf, supplied):
            raise HttpError(403, "CSRF 校验失败：请刷新页面后重试（表单已过期，或请求不是从本控制台发出的）")

    def require_write(self) -> None:
        if self.settings.read_only:
            raise HttpError(403, "只读模式：这个控制台不接受任何操作（启动时去掉 --read-only 才能操作）")

    async def form(self, request: Request) -> dict[str, str]:
        body = await _body(request)
        try:
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            raise HttpError(400, "表单不是合法的 UTF-8") from None
        return dict(pairs)

    async def json_body(self, request: Request) -> dict[str, Any]:
        body = await _body(request)
        if not body.strip():
            return {}
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise HttpError(400, "请求体不是合法的 JSON") from None
        if not isinstance(data, dict):
            raise HttpError(400, '请求体必须是 JSON 对象，例如 {"reason": "..."}')
        return data

    def render(
        self, request: Request, template: str, context: dict[str, Any], status: int = 200
    ) -> HTMLResponse:
        session = request.scope.get("session_obj")
        flash: list[str] = []
        if isinstance(session, Session):
            flash = self.flashes.pop(session.session_id, [])
        base = {
            "request_path": request.url.path,
            "session": session,
            "csrf": session.csrf if isinstance(session, Session) else "",
            "read_only": self.settings.read_only,
            "login_required": self.settings.token is not None,
            "store_display": self.settings.store_display,
            "flash": flash,
        }
        html = self.templates.get_template(template).render({**base, **context})
        return HTMLResponse(html, status_code=status)

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """在线程池里调用同步的服务层，并把它的异常翻成 HTTP 状态码。"""
        try:
            return await run_in_threadpool(fn, *args, **kwargs)
        except BadRequest as exc:
            raise HttpError(400, str(exc)) from None
        except NotFound as exc:
            raise HttpError(404, str(exc)) from None
        except Conflict as exc:
            raise HttpError(409, exc.message, exc.data) from None
        except PermissionError as exc:
            raise HttpError(403, str(exc)) from None

    def parse_filter(self, params: Any) -> TaskFilter:
        try:
            return parse_filter(params, params.getlist("status"), num_buckets=self.settings.num_buckets)
        except BadRequest as exc:
            raise HttpError(400, str(exc)) from None

    def _page_args(self, request: Request) -> tuple[TaskFilter, Any, int]:
        params = request.query_params
        flt = self.parse_filter(params)
        try:
            return flt, parse_cursor(params.get("after")), parse_page_size(params.get("limit"))
        except BadRequest as exc:
            raise HttpError(400, str(exc)) from None

    # -- pages --------------------------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        return RedirectResponse("/tasks", status_code=303)

    async def login_page(self, request: Request) -> Response:
        return self.render(
            request, "login.html", {"next": _safe_next(request.query_params.get("next")), "error": None}
        )

    async def login_submit(self, request: Request) -> Response:
        session = self.session(request)
        form = await self.form(request)
        self.check_csrf(request, session, form)
        next_url = _safe_next(form.get("next"))
        if self.settings.token is not None:
            client = client_address(request.scope)
            wait = self.limiter.retry_after(client)
            if wait is not None:  # 被限速：连口令都不比较
                page = self.render(
                    request, "login.html", {"next": next_url, "error": too_many_attempts(wait)}, 429
                )
                page.headers["Retry-After"] = str(wait)
                return page
            if not tokens_equal(self.settings.token, form.get("token")):
                self.limiter.failed(client)
                context = {"next": next_url, "error": "口令不对：请核对启动控制台时给的 --token"}
                return self.render(request, "login.html", context, 403)
            self.limiter.succeeded(client)
        try:
            operator = check_operator(form.get("operator") or self.operator)
        except BadRequest as exc:
            return self.render(request, "login.html", {"next": next_url, "error": str(exc)}, 400)
        # 换一个新会话（防会话固定）：登录前的 id 可能被别人预先种下。
        self.sessions.delete(session.session_id)
        fresh = self.sessions.create(operator, authenticated=True)
        request.scope["set_cookie"] = cookie_header(fresh, secure=request.url.scheme == "https")
        return RedirectResponse(next_url, status_code=303)

    async def logout(self, request: Request) -> Response:
        session = self.session(request)
        self.check_csrf(request, session, await self.form(request))
        self.sessions.delete(session.session_id)
        return RedirectResponse("/login" if self.settings.token else "/tasks", status_code=303)

    async def tasks_page(self, request: Request) -> Response:
        self.require_login(request, api=False)
        flt, cursor, size = self._page_args(request)
        page = await self.call(self.service.list_page, flt, cursor, size)
        return self.render(
            request,
            "tasks.html",
            {
                "filter": flt,
                "page": page,
                "limit": size,
                "first_page": cursor is None,
                "stream_url": "/api/stream/tasks?" + request.url.query,
                "next_url": None
                if page["next_cursor"] is None
                else "/tasks?" + flt.querystring(limit=str(size), after=page["next_cursor"]),
                "first_url": "/tasks?" + flt.querystring(limit=str(size)),
                "bulk_query": flt.querystring(),
            },
        )

    def _log_args(self, request: Request) -> tuple[int | None, int | None, int]:
        try:
            return parse_log_args(request.query_params)
        except BadRequest as exc:
            raise HttpError(400, str(exc)) from None

    async def task_page(self, request: Request) -> Response:
        self.require_login(request, api=False)
        task_id = request.path_params["task_id"]
        attempt, _after, _limit = self._log_args(request)
        detail = await self.call(self.service.task, task_id)
        logs = await self.call(self.service.log_tail, task_id, attempt)
        quoted = quote(task_id, safe="")
        log_query = urlencode([("attempt", str(attempt))] if attempt is not None else [])
        log_stream = f"/api/stream/logs/{quoted}?" + urlencode(
            [*([("attempt", str(attempt))] if attempt is not None else []), ("after", str(logs["last_seq"]))]
        )
        return self.render(
            request,
            "task.html",
            {
                "task": detail,
                "stream_url": "/api/stream/task/" + quoted,
                "logs": logs,
                "log_attempt": attempt,
                "log_attempts": list(range(1, max(detail["attempt"], attempt or 0) + 1)),
                "log_stream_url": log_stream,
                "log_api_url": f"/api/tasks/{quoted}/logs" + (f"?{log_query}" if log_query else ""),
            },
        )

    async def task_action(self, request: Request) -> Response:
        session = self.require_login(request, api=False)
        form = await self.form(request)
        self.check_csrf(request, session, form)
        self.require_write()
        task_id = request.path_params["task_id"]
        try:
            action = check_task_action(form.get("action"))
            reason = check_reason(form.get("reason"))
        except BadRequest as exc:
            raise HttpError(400, str(exc)) from None
        if form.get("confirm") != "1":
            detail = await self.call(self.service.task, task_id)
            return self.render(
                request,
                "confirm.html",
                {
                    "title": f"确认{ACTION_LABELS[action]}任务",
                    "action_url": f"/tasks/{quote(task_id, safe='')}/action",
                    "fields": {"action": action, "reason": reason or ""},
                    "summary": [f"任务 {detail['name']}（{task_id}）", f"当前状态：{detail['status_label']}"],
                    "reason": reason,
                    "button": f"确认{ACTION_LABELS[action]}",
                    "cancel_url": f"/tasks/{quote(task_id, safe='')}",
                },
            )
        result = await self._task_action(task_id, action, operator=session.operator, reason=reason)
        self.flash(session, result["message"])
        return RedirectResponse(f"/tasks/{quote(task_id, safe='')}", status_code=303)

    async def overview_page(self, request: Request) -> Response:
        self.require_login(request, api=False)
        overview = await self.call(self.service.overview)
        doctor = await self.call(self.service.doctor)
        return self.render(
            request,
            "overview.html",
            {"overview": overview, "doctor": doctor, "stream_url": "/api/stream/overview"},
        )

    async def reconcile_submit(self, request: Request) -> Response:
        session = self.require_login(request, api=False)
        form = await self.form(request)
        self.check_csrf(request, session, form)
        self.require_write()
        if form.get("confirm") != "1":
            doctor = await self.call(self.service.doctor)
            dry = doctor["reconcile"]
            return self.render(
                request,
                "confirm.html",
                {
                    "title": "确认执行 reconcile",
                    "action_url": "/overview/reconcile",
                    "fields": {},
                    "summary": [
                        (
                            f"预演：{len(dry['lost'])} 个会被判为结果未知（lost），"
                            f"{len(dry['adoptable'])} 个需要重新提交，{len(dry['skipped'])} 个会跳过"
                        ),
                        "只在确认持有进程已经不在之后执行：它会把租约过期的任务如实标记为 lost",
                    ],
                    "reason": None,
                    "button": "确认 reconcile",
                    "cancel_url": "/overview",
                },
            )
        result = await self.call(self.service.reconcile, operator=session.operator)
        self.flash(session, result["message"])
        return RedirectResponse("/overview", status_code=303)

    async def bulk_page(self, request: Request) -> Response:
        self.require_login(request, api=False)
        flt = self.parse_filter(request.query_params)
        action_raw = request.query_params.get("action", "stop")
        try:
            action = check_action(action_raw)
        except BadRequest as exc:
            raise HttpError(400, str(exc)) from None
        preview = await self.call(self.service.bulk_preview, flt, action)
        return self.render(
            request,
            "bulk.html",
            {"filter": flt, "action": action, "preview": preview, "filter_params": flt.params()},
        )

    def _bulk_request(
        self, filter_data: Mapping[str, Any], data: Mapping[str, Any], statuses: list[Any]
    ) -> tuple[TaskFilter, str, str | None, int]:
        """批量操作的四个参数（筛选、动作、原因、确认过的数目）：表单与 JSON API 共用一套检查与 400 消息。"""
        try:
            flt = parse_filter(filter_data, statuses, num_buckets=self.settings.num_buckets)
            action = check_action(data.get("action"))
            reason = check_reason(data.get("reason"))
            expected = _expected(data.get("expected"))
        except BadRequest as exc:
            raise HttpError(400, str(exc)) from None
        return flt, action, reason, expected

    async def bulk_submit(self, request: Request) -> Response:
        session = self.require_login(request, api=False)
        form = await self.form(request)
        self.check_csrf(request, session, form)
        self.require_write()
        statuses = [v for k, v in parse_qsl((await _body(request)).decode("utf-8")) if k == "status"]
        flt, action, reason, expected = self._bulk_request(form, form, statuses)
        if form.get("confirm") != "1":
            raise HttpError(400, "批量操作需要确认：请在批量页核对数目后点确认")
        try:
            result = await self.call(
                self.service.bulk_apply,
                flt,
                action,
                operator=session.operator,
                reason=reason,
                expected=expected,
            )
        except HttpError as exc:
            if exc.status != 409:
                raise
            self.flash(session, exc.message)
            return RedirectResponse(f"/bulk?{flt.querystring(action=action)}", status_code=303)
        self.flash(session, result["message"])
        return RedirectResponse(f"/tasks?{flt.querystring()}", status_code=303)

    # -- JSON API -----------------------------------------------------------------------------------

    async def api_tasks(self, request: Request) -> Response:
        self.require_login(request, api=True)
        flt, cursor, size = self._page_args(request)
        page = await self.call(self.service.list_page, flt, cursor, size)
        return JSONResponse({"filter": flt.to_dict(), **page})

    async def api_task(self, request: Request) -> Response:
        self.require_login(request, api=True)
        return JSONResponse(await self.call(self.service.task, request.path_params["task_id"]))

    async def api_task_logs(self, request: Request) -> Response:
        self.require_login(request, api=True)
        attempt, after, limit = self._log_args(request)
        task_id = request.path_params["task_id"]
        return JSONResponse(await self.call(self.service.logs, task_id, attempt, after, limit))

    async def api_overview(self, request: Request) -> Response:
        self.require_login(request, api=True)
        return JSONResponse(await self.call(self.service.overview))

    async def api_doctor(self, request: Request) -> Response:
        self.require_login(request, api=True)
        return JSONResponse(await self.call(self.service.doctor))

    async def api_bulk_preview(self, request: Request) -> Response:
        self.require_login(request, api=True)
        flt = self.parse_filter(request.query_params)
        try:
            action = check_action(request.query_params.get("action"))
        except BadRequest as exc:
            raise HttpError(400, str(exc)) from None
        return JSONResponse(await self.call(self.service.bulk_preview, flt, action))

    async def api_task_action(self, request: Request) -> Response:
        session = self.require_login(request, api=True)
        data = await self.json_body(request)
        self.check_csrf(request, session, None)
        self.require_write()
        try:
            action = check_task_action(request.path_params["action"])
            reason = check_reason(data.get("reason"))
        except BadRequest as exc:
            raise HttpError(400, str(exc)) from None
        task_id = request.path_params["task_id"]
        result = await self._task_action(task_id, action, operator=session.operator, reason=reason)
        # 指令只是受理（持有者执行后才算数）→ 202；重试当场写进存储 → 200。
        return JSONResponse(result, status_code=200 if action == "retry" else 202)

    async def _task_action(
        self, task_id: str, action: str, *, operator: str, reason: str | None
    ) -> dict[str, Any]:
        if action == "retry":
            return await self.call(self.service.retry, task_id, operator=operator, reason=reason)  # type: ignore[no-any-return]
        return await self.call(self.service.act, task_id, action, operator=operator, reason=reason)  # type: ignore[no-any-return]

    async def api_bulk(self, request: Request) -> Response:
        session = self.require_login(request, api=True)
        data = await self.json_body(request)
        self.check_csrf(request, session, None)
        self.require_write()
        filter_data = data.get("filter") or {}
        if not isinstance(filter_data, dict):
            raise HttpError(400, 'filter 必须是 JSON 对象，例如 {"name": "etl.", "status": ["running"]}')
        statuses = filter_data.get("status") or []
        if isinstance(statuses, str):
            statuses = [statuses]
        if not isinstance(statuses, list):
            raise HttpError(400, "filter.status 必须是状态名的列表")
        flt, action, reason, expected = self._bulk_request(filter_data, data, statuses)
        result = await self.call(
            self.service.bulk_apply, flt, action, operator=session.operator, reason=reason, expected=expected
        )
        return JSONResponse(result, status_code=202)

    async def api_reconcile(self, request: Request) -> Response:
        session = self.require_login(request, api=True)
        await self.json_body(request)
        self.check_csrf(request, session, None)
        self.require_write()
        return JSONResponse(await self.call(self.service.reconcile, operator=session.operator))

    # -- SSE ----------------------------------------------------------------------------------------

    def _sse(self, key: str, fetch: Callable[[], Any]) -> StreamingResponse:
        poller = self.poller

        async def events() -> AsyncIterator[str]:
            yield self._retry_line()
            async for text in poller.subscribe(key, fetch):
                yield ": keepalive\n\n" if text is None else f"event: update\ndata: {text}\n\n"
            yield "event: bye\ndata: {}\n\n"  # 服务器关闭：告诉页面别急着重连

        return self._event_stream(events())

    def _retry_line(self) -> str:
        """SSE 的第一行：断线后浏览器隔多久重连（不短于 1 秒）。"""
        return f"retry: {int(max(1.0, self.settings.poll_interval) * 1000)}\n\n"

    @staticmethod
    def _event_stream(events: AsyncIterator[str]) -> StreamingResponse:
        return StreamingResponse(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def stream_tasks(self, request: Request) -> Response:
        self.require_login(request, api=True)
        flt, cursor, size = self._page_args(request)
        key = "tasks?" + flt.querystring(limit=str(size), after=None if cursor is None else cursor.encode())
        return self._sse(key, lambda: self.service.list_page(flt, cursor, size))

    async def stream_task(self, request: Request) -> Response:
        self.require_login(request, api=True)
        task_id = request.path_params["task_id"]

        def fetch() -> Any:
            try:
                return self.service.task(task_id)
            except NotFound as exc:
                return {"error": str(exc)}

        return self._sse("task:" + task_id, fetch)

    async def stream_logs(self, request: Request) -> Response:
        """日志的实时尾巴：共享轮询器每个间隔为这个（任务, 尝试）读一次新行；每个连接只收自己没见过的行。

        连接从 ``after``（页面首屏的最后一行）或断线重连时浏览器带回的 ``Last-Event-ID`` 接着发。
        """
        self.require_login(request, api=True)
        attempt, after, _limit = self._log_args(request)
        task_id = request.path_params["task_id"]
        resume = request.headers.get("last-event-id", "")
        sent = int(resume) if resume.isdigit() and len(resume) < 20 else (after or 0)
        key = f"logs:{'' if attempt is None else attempt}:{task_id}"
        tail = LogTail(self.service.store, task_id, attempt)
        poller = self.poller

        async def events() -> AsyncIterator[str]:
            nonlocal sent
            yield self._retry_line()
            async for payload in poller.subscribe_values(key, tail):
                if payload is KEEPALIVE:
                    yield ": keepalive\n\n"
                    continue
                if "error" in payload:
                    yield f"event: update\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"
                    continue
                window: list[dict[str, Any]] = payload["lines"]
                fresh = [line for line in window if line["seq"] > sent]
                if not fresh:
                    continue
                # 窗口满了、而且第一行也没见过：这个连接落后太多，中间有行没推给它（页面提示刷新）。
                gap = len(window) == payload["window"] and window[0]["seq"] > sent + 1
                sent = fresh[-1]["seq"]
                data = json.dumps({"lines": fresh, "gap": gap}, ensure_ascii=False, separators=(",", ":"))
                yield f"id: {sent}\nevent: logs\ndata: {data}\n\n"
            yield "event: bye\ndata: {}\n\n"

        return self._event_stream(events())

    async def stream_overview(self, request: Request) -> Response:
        self.require_login(request, api=True)
        return self._sse("overview", self.service.overview)

    # -- ops ----------------------------------------------------------------------------------------

    async def favicon(self, request: Request) -> Response:
        return Response(status_code=204)  # 没有图标；免得浏览器每页报一次 404

    async def healthz(self, request: Request) -> Response:
        try:
            await run_in_threadpool(self.service.ping)
        except Exception as exc:
            return JSONResponse({"ok": False, "error": f"存储不可用：{exc}"}, status_code=503)
        return JSONResponse({"ok": True, "read_only": self.settings.read_only})

    async def metrics(self, request: Request) -> Response:
        from chongming_task.web import metrics

        if not metrics.available():
            raise HttpError(
                404, '没有 /metrics：请安装 prometheus-client（pip install "chongming-task-web[metrics]"）'
            )
        body, content_type = await run_in_threadpool(metrics.render, self.service, self.poller)
        return Response(body, media_type=content_type)


class _Redirect(HttpError):
    def __init__(self, location: str) -> None:
        super().__init__(303, "需要登录", {"location": location})
        self.location = location


def _safe_next(value: str | None) -> str:
    """登录后的跳转只许站内路径：``//evil.example`` 与 ``https://...`` 都是开放重定向。"""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/tasks"
    return value


def _expected(value: Any) -> int:
    if isinstance(value, bool):
        raise BadRequest("expected 必须是确认页显示的任务数（非负整数）")
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str) and value.isdigit() and len(value) < 12:
        return int(value)
    raise BadRequest("expected 必须是确认页显示的任务数（非负整数）：先用 /api/bulk/preview 看会作用到几个")


async def _body(request: Request) -> bytes:
    cached = request.scope.get("cached_body")
    if isinstance(cached, bytes):
        return cached
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise HttpError(413, f"请求体太大：最多 {MAX_BODY // 1024} KB")
        chunks.append(chunk)
    body = b"".join(chunks)
    request.scope["cached_body"] = body
    return body


def create_app(store: TaskStore, settings: WebSettings | None = None) -> Starlette:
    """建一个控制台应用（不监听端口；``serve`` 或任何 ASGI 服务器都能跑它）。"""
    return WebConsole(store, settings or WebSettings()).app


__all__ = ["HttpError", "WebConsole", "WebSettings", "create_app"]
