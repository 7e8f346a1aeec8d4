"""每个路由的 TestClient 测试：筛选、键集翻页、坏参数 → 400、登录、CSRF、只读、转义、批量、reconcile。"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from markupsafe import escape
from starlette.testclient import TestClient
from web_testkit import T0, ClientFactory, MakeTask, csrf_of

from chongming_task import Failure, FailureKind, TaskStatus
from chongming_task.core.state_machine import StateMachine
from chongming_task.models import MAX_LABEL_LENGTH
from chongming_task.stores.sqlite import SqliteTaskStore
from chongming_task.web.security import CONTENT_SECURITY_POLICY

TOKEN = "s3cret-token-for-tests-0123456789"


def ids(response: Any) -> list[str]:
    assert response.status_code == 200, response.text
    return [row["task_id"] for row in response.json()["tasks"]]


def claim_all(store: SqliteTaskStore) -> list[Any]:
    """像持有者那样取走全部待执行指令（用来核对控制台写下的指令）。"""
    return store.claim_commands("probe", lease=30, limit=10_000)


# -- 列表：筛选与翻页 ---------------------------------------------------------------------------------


def test_filters_by_status_name_tag_bucket_holder(client: TestClient, make_task: MakeTask) -> None:
    make_task(
        "a", name="etl.load", status=TaskStatus.RUNNING, tags=frozenset({"nightly"}), bucket=1, owner="n1"
    )
    make_task("b", name="etl.clean", status=TaskStatus.PAUSED, bucket=2, owner="n2")
    make_task(
        "c", name="report", status=TaskStatus.SUCCEEDED, tags=frozenset({"nightly"}), bucket=1, owner="n1"
    )
    make_task("d", name="ETL.upper", status=TaskStatus.QUEUED)
    assert ids(client.get("/api/tasks")) == ["d", "c", "b", "a"]  # 新的在前
    assert ids(client.get("/api/tasks?status=running&status=paused")) == ["b", "a"]
    assert ids(client.get("/api/tasks?status=running,succeeded")) == ["c", "a"]
    assert ids(client.get("/api/tasks?name=etl.")) == ["b", "a"]  # 区分大小写、按字面
    assert ids(client.get("/api/tasks?tag=nightly")) == ["c", "a"]
    assert ids(client.get("/api/tasks?bucket=1")) == ["c", "a"]
    assert ids(client.get("/api/tasks?holder=n2")) == ["b"]
    assert ids(client.get("/api/tasks?name=&tag=")) == ["d", "c", "b", "a"]  # 表单留空 = 不限
    text = client.get("/tasks?status=paused").text
    assert 'data-task-id="b"' in text and 'data-task-id="a"' not in text


def test_keyset_paging_is_complete_even_with_identical_timestamps(
    client: TestClient, make_task: MakeTask
) -> None:
    same = T0 + timedelta(hours=1)
    expected = []
    for i in range(7):
        created = same if i in (2, 3, 4) else T0 + timedelta(minutes=i)
        make_task(f"p{i}", created_at=created)
    expected = ids(client.get("/api/tasks?limit=100"))
    seen: list[str] = []
    url = "/api/tasks?limit=2"
    pages = 0
    while True:
        data = client.get(url).json()
        seen += [row["task_id"] for row in data["tasks"]]
        pages += 1
        if data["next_cursor"] is None:
            break
        url = f"/api/tasks?limit=2&after={data['next_cursor']}"
    assert seen == expected and len(seen) == 7 and pages == 4
    # 页面上的"下一页"链接带着同样的筛选条件与游标
    text = client.get("/tasks?limit=2&name=demo").text
    assert re.search(r'href="/tasks\?name=demo&amp;limit=2&amp;after=[A-Za-z0-9_-]+" id="next-page"', text)


def test_elapsed_dash_for_never_started_and_progress_bar(client: TestClient, make_task: MakeTask) -> None:
    make_task("q", status=TaskStatus.QUEUED)
    make_task("r", status=TaskStatus.RUNNING, progress=(3, 12, "块", "第 3 块"))
    rows = {row["task_id"]: row for row in client.get("/api/tasks").json()["tasks"]}
    assert rows["q"]["elapsed"] == "-"
    assert rows["r"]["elapsed"] != "-"
    assert rows["r"]["progress"]["percent"] == 25.0
    text = client.get("/tasks").text
    assert re.search(r'<progress data-progress max="12(\.0)?" value="3(\.0)?"></progress>', text)
    assert "3/12 块（25%） · 第 3 块" in text


@pytest.mark.parametrize(
    ("query", "needle"),
    [
        ("status=bogus", "未知状态 'bogus'"),
        ("bucket=abc", "桶号（bucket）必须是整数"),
        ("bucket=-1", "桶号（bucket）越界"),
        ("bucket=64", "合法范围是 0–63"),
        ("limit=0", "每页条数（limit）越界"),
        ("limit=501", "每页条数（limit）越界"),
        ("after=%%%", "翻页游标 after 无法解析"),
        ("after=bm90LWEtY3Vyc29y", "翻页游标 after 无法解析"),
        ("name=" + "x" * 1001, "任务名前缀（name）太长"),
        ("tag=a%00b", "不能包含 NUL"),
    ],
)
def test_bad_parameters_are_a_clear_400(client: TestClient, query: str, needle: str) -> None:
    api = client.get(f"/api/tasks?{query}")
    assert api.status_code == 400 and needle in api.json()["error"]
    page = client.get(f"/tasks?{query}")
    assert page.status_code == 400 and str(escape(needle)) in page.text
    assert client.get(f"/api/stream/tasks?{query}").status_code == 400


# -- 单个任务 ---------------------------------------------------------------------------------------


def test_task_detail_shows_snapshot_failure_lease_and_timeline(
    client: TestClient, store: SqliteTaskStore, make_task: MakeTask
) -> None:
    now = datetime.now(UTC)
    make_task(
        "f1",
        status=TaskStatus.RUNNING,
        attempt=2,
        max_attempts=3,
        lease_owner="node-a:42",
        lease_until=now - timedelta(seconds=30),
        last_heartbeat_at=now - timedelta(seconds=5),
        failure=Failure(FailureKind.EXCEPTION, "上一次：连接被重置", exc_type="ConnectionResetError"),
    )
    detail = client.get("/api/tasks/f1").json()
    assert detail["holder"] == "node-a:42"
    assert detail["lease"].startswith("已过期")
    assert detail["heartbeat"].endswith("秒前")
    assert detail["failure_detail"]["exc_type"] == "ConnectionResetError"
    assert detail["actions"] == ["pause", "stop"]
    text = client.get("/tasks/f1").text
    assert "上一次：连接被重置" in text and "node-a:42" in text and "2</span> / 3" in text
    missing = client.get("/tasks/nope")
    assert missing.status_code == 404 and str(escape("找不到任务 'nope'")) in missing.text
    assert client.get("/api/tasks/nope").status_code == 404


def test_lost_is_shown_as_result_unknown(client: TestClient, make_task: MakeTask) -> None:
    make_task("l1", status=TaskStatus.LOST, finished_at=T0 + timedelta(hours=1))
    assert "结果未知" in client.get("/tasks").text
    assert client.get("/api/tasks/l1").json()["status_label"] == "结果未知"


# -- 动作：CSRF、确认、指令通道、"未确认" --------------------------------------------------------------


def test_action_needs_csrf_then_confirmation_then_writes_a_command(
    client: TestClient, store: SqliteTaskStore, make_task: MakeTask
) -> None:
    make_task("s1", status=TaskStatus.RUNNING, lease_owner="node-a")
    # 没有 CSRF 令牌：403，什么也不写
    denied = client.post("/tasks/s1/action", data={"action": "stop", "reason": "x", "confirm": "1"})
    assert denied.status_code == 403 and "CSRF" in denied.text
    denied = client.post("/tasks/s1/action", data={"action": "stop", "csrf": "wrong", "confirm": "1"})
    assert denied.status_code == 403
    assert claim_all(store) == []
    csrf = csrf_of(client)
    # 第一次提交只是确认页
    confirm = client.post("/tasks/s1/action", data={"action": "stop", "reason": "发布窗口", "csrf": csrf})
    assert confirm.status_code == 200 and "确认停止" in confirm.text and "发布窗口" in confirm.text
    assert claim_all(store) == []
    done = client.post(
        "/tasks/s1/action", data={"action": "stop", "reason": "发布窗口", "csrf": csrf, "confirm": "1"}
    )
    assert done.status_code == 303 and done.headers["location"] == "/tasks/s1"
    page = client.get("/tasks/s1").text
    assert "已受理：停止请求已写入存储，由持有者 node-a 执行" in page
    assert "停止请求未确认" in page
    [command] = claim_all(store)
    assert (command.action.value, command.issuer, command.reason) == ("stop", "web:alice", "发布窗口")


def test_pause_stays_unconfirmed_until_the_store_shows_paused(
    client: TestClient, store: SqliteTaskStore, make_task: MakeTask
) -> None:
    snapshot = make_task("p1", status=TaskStatus.RUNNING)
    csrf = csrf_of(client)
    response = client.post("/api/tasks/p1/pause", json={"reason": "排查"}, headers={"X-CSRF-Token": csrf})
    assert response.status_code == 202 and response.json()["confirmed"] is False
    row = client.get("/api/tasks/p1").json()
    assert row["status_label"] == "运行中" and row["pending"]["label"] == "暂停请求未确认"
    # 持有者真的暂停了：存储里出现 paused，"未确认"随之消失。像持有者那样经状态机走
    # running → pausing → paused，两条迁移记录随 save 一起提交（不带记录就前进版本号的 save 会被存储拒绝：
    # 历史不能有空洞）。
    holder = StateMachine(snapshot, ())
    holder.mark_pausing()
    holder.mark_paused()
    store.save(holder.snapshot, expect_version=0, transitions=holder.transitions)
    row = client.get("/api/tasks/p1").json()
    assert row["status_label"] == "已暂停" and row["pending"] is None
    # 不能对已暂停的任务再暂停：409，说清当前状态
    again = client.post("/api/tasks/p1/pause", json={}, headers={"X-CSRF-Token": csrf})
    assert again.status_code == 409 and "已暂停" in again.json()["error"]


def test_api_action_errors(client: TestClient, make_task: MakeTask) -> None:
    make_task("e1")
    csrf = {"X-CSRF-Token": csrf_of(client)}
    assert client.post("/api/tasks/e1/explode", json={}, headers=csrf).status_code == 400
    assert client.post("/api/tasks/nope/stop", json={}, headers=csrf).status_code == 404
    bad_json = client.post("/api/tasks/e1/stop", content=b"{not json", headers=csrf)
    assert bad_json.status_code == 400 and "JSON" in bad_json.json()["error"]
    long_reason = client.post("/api/tasks/e1/stop", json={"reason": "x" * 1001}, headers=csrf)
    assert long_reason.status_code == 400 and "太长" in long_reason.json()["error"]
    code = client.post("/api/tasks/e1/stop", json={"reason": {"__import__": "os"}}, headers=csrf)
    assert code.status_code == 400  # 只收文本：没有任何入口接受代码或对象


# -- 转义 -------------------------------------------------------------------------------------------


HOSTILE = [
    "<script>alert('x')</script>",
    '"><img src=x onerror=alert(1)>',
    "'; DROP TABLE tasks; --",
    "中文任务名·全角（括号）",
    "<" + "长" * 10_000 + ">",
]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_names_labels_and_failures_are_escaped(
    client: TestClient, make_task: MakeTask, hostile: str
) -> None:
    make_task(
        "h1",
        # 任务名与 label 都有 512 字符上限（用户指南 §13）；10 KB 的串完整地放进失败信息
        name=hostile[:500],
        label=hostile[:MAX_LABEL_LENGTH],
        status=TaskStatus.FAILED,
        finished_at=T0 + timedelta(hours=1),
        failure=Failure(FailureKind.EXCEPTION, hostile, traceback=hostile),
        tags=frozenset({"x"}),
    )
    for path in ("/tasks", "/tasks/h1", "/overview", "/bulk?action=stop"):
        page = client.get(path).text
        assert "<script>alert" not in page and "<img src=x" not in page, path
    page = client.get("/tasks/h1").text
    assert str(escape(hostile)) in page  # 原文完整地、转义后出现（CJK 原样）
    # API 原样返回（JSON 本身不执行）
    assert client.get("/api/tasks/h1").json()["label"] == hostile[:MAX_LABEL_LENGTH]


def test_security_headers_on_every_response(client: TestClient) -> None:
    for path in ("/tasks", "/api/tasks", "/healthz", "/static/console.js", "/nowhere"):
        headers = client.get(path).headers
        assert headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY
    assert "unsafe-inline" not in CONTENT_SECURITY_POLICY
    text = client.get("/tasks").text
    assert re.findall(r"<script[^>]*>", text) == ['<script src="/static/console.js" defer>']  # 没有内联脚本
    assert " on" + "click=" not in text


# -- 登录与只读 -------------------------------------------------------------------------------------


def test_token_login_sets_strict_httponly_session(client_for: ClientFactory, make_task: MakeTask) -> None:
    make_task("a1")
    client = client_for(token=TOKEN)
    redirect = client.get("/tasks?status=running")
    assert redirect.status_code == 303 and redirect.headers["location"].startswith("/login?next=")
    assert client.get("/api/tasks").status_code == 401
    csrf = csrf_of(client, "/login")
    wrong = client.post("/login", data={"csrf": csrf, "token": "nope", "operator": "bob"})
    assert wrong.status_code == 403 and "口令不对" in wrong.text
    no_csrf = client.post("/login", data={"token": TOKEN, "operator": "bob"})
    assert no_csrf.status_code == 403
    ok = client.post(
        "/login", data={"csrf": csrf, "token": TOKEN, "operator": "bob", "next": "//evil.example"}
    )
    assert ok.status_code == 303 and ok.headers["location"] == "/tasks"  # 开放重定向被挡住
    cookie = ok.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert ids(client.get("/api/tasks")) == ["a1"]
    assert "web:bob" in client.get("/tasks").text


def test_bearer_token_for_scripts(
    client_for: ClientFactory, store: SqliteTaskStore, make_task: MakeTask
) -> None:
    make_task("b1")
    client = client_for(token=TOKEN)
    client.cookies.clear()
    assert client.get("/api/tasks", headers={"Authorization": "Bearer wrong"}).status_code == 401
    auth = {"Authorization": f"Bearer {TOKEN}", "X-Chongming-Operator": "deploy-bot"}
    assert ids(client.get("/api/tasks", headers=auth)) == ["b1"]
    response = client.post("/api/tasks/b1/stop", json={"reason": "回滚"}, headers=auth)
    assert response.status_code == 202
    [command] = claim_all(store)
    assert command.issuer == "web:deploy-bot" and command.reason == "回滚"


def test_read_only_has_no_buttons_and_rejects_every_action(
    client_for: ClientFactory, store: SqliteTaskStore, make_task: MakeTask
) -> None:
    make_task("r1")
    client = client_for(read_only=True)
    csrf = csrf_of(client)
    for path in ("/tasks", "/tasks/r1", "/overview", "/bulk?action=stop"):
        text = client.get(path).text
        assert "<button" not in text.replace('<button type="submit">筛选</button>', ""), path
        assert "只读模式" in text
    posts = [
        ("/tasks/r1/action", {"action": "stop", "csrf": csrf, "confirm": "1"}),
        ("/overview/reconcile", {"csrf": csrf, "confirm": "1"}),
        ("/bulk", {"action": "stop", "csrf": csrf, "confirm": "1", "expected": "1"}),
    ]
    for path, form in posts:
        assert client.post(path, data=form).status_code == 403, path
    headers = {"X-CSRF-Token": csrf}
    for path in ("/api/tasks/r1/stop", "/api/bulk", "/api/reconcile"):
        response = client.post(path, json={"action": "stop", "expected": 1}, headers=headers)
        assert response.status_code == 403 and "只读模式" in response.json()["error"], path
    assert claim_all(store) == []


# -- 批量 -------------------------------------------------------------------------------------------


def test_bulk_preview_confirm_and_apply(
    client: TestClient, store: SqliteTaskStore, make_task: MakeTask
) -> None:
    for i in range(3):
        make_task(f"etl{i}", name="etl.part")
    make_task("etl-done", name="etl.part", status=TaskStatus.SUCCEEDED, finished_at=T0 + timedelta(hours=1))
    make_task("other", name="report")
    page = client.get("/bulk?name=etl.&action=stop")
    assert page.status_code == 200 and 'id="bulk-count">3<' in page.text
    preview = client.get("/api/bulk/preview?name=etl.&action=stop").json()
    assert preview["count"] == 3
    csrf = csrf_of(client)
    # 确认之后又多了一个：不作用到操作者没看到的任务上
    make_task("etl3", name="etl.part")
    stale = client.post(
        "/bulk",
        data={"csrf": csrf, "action": "stop", "name": "etl.", "expected": "3", "confirm": "1", "reason": "r"},
    )
    assert stale.status_code == 303 and stale.headers["location"].startswith("/bulk?")
    assert "请重新确认" in client.get(stale.headers["location"]).text
    assert claim_all(store) == []
    done = client.post(
        "/bulk",
        data={
            "csrf": csrf,
            "action": "stop",
            "name": "etl.",
            "expected": "4",
            "confirm": "1",
            "reason": "清场",
        },
    )
    assert done.status_code == 303
    commands = claim_all(store)
    assert sorted(c.task_id for c in commands) == ["etl0", "etl1", "etl2", "etl3"]
    assert {(c.issuer, c.reason) for c in commands} == {("web:alice", "清场")}
    api = client.post(
        "/api/bulk",
        json={"action": "pause", "filter": {"name": "report"}, "expected": 1},
        headers={"X-CSRF-Token": csrf},
    )
    assert api.status_code == 202 and api.json()["issued"] == 1
    assert (
        client.post("/api/bulk", json={"action": "stop"}, headers={"X-CSRF-Token": csrf}).status_code == 400
    )


# -- 总览与 reconcile -------------------------------------------------------------------------------


def test_overview_counts_nodes_and_reconcile(
    client: TestClient, store: SqliteTaskStore, make_task: MakeTask
) -> None:
    now = datetime.now(UTC)
    make_task("ok1", status=TaskStatus.QUEUED, bucket=3)
    make_task(
        "gone",
        status=TaskStatus.RUNNING,
        bucket=5,
        lease_owner="dead-node",
        lease_until=now - timedelta(minutes=5),
    )
    from chongming_task import NodeRecord

    store.publish_node(NodeRecord("node-b", frozenset(range(32)), 64, now, now + timedelta(seconds=30)))
    data = client.get("/api/overview").json()
    assert (data["total"], data["active"], data["queued"]) == (2, 1, 1)
    assert {b["bucket"]: b["count"] for b in data["buckets"]} == {3: 1, 5: 1}
    assert data["nodes"][0]["owner"] == "node-b" and data["nodes"][0]["alive"] is True
    doctor = client.get("/api/doctor").json()
    assert doctor["healthy"] is False and any("空洞" in p or "没有" in p for p in doctor["problems"])
    assert [row["task_id"] for row in doctor["reconcile"]["lost"]] == ["gone"]
    text = client.get("/overview").text
    assert "node-b" in text and "0–31" in text and "reconcile 预演" in text
    csrf = csrf_of(client)
    confirm = client.post("/overview/reconcile", data={"csrf": csrf})
    assert confirm.status_code == 200 and "确认 reconcile" in confirm.text
    assert store.get("gone").status is TaskStatus.RUNNING  # type: ignore[union-attr]
    done = client.post("/overview/reconcile", data={"csrf": csrf, "confirm": "1"})
    assert done.status_code == 303
    assert store.get("gone").status is TaskStatus.LOST  # type: ignore[union-attr]
    assert store.history("gone")[-1].actor == "web:alice"
    assert "1 个判为结果未知" in client.get("/overview").text


def test_healthz_and_metrics(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"ok": True, "read_only": False}
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        response = client.get("/metrics")
        assert response.status_code == 404 and "prometheus-client" in response.text
    else:
        body = client.get("/metrics").text
        assert 'chongming_tasks{status="running"}' in body


def test_index_redirects_and_static_js_has_no_inner_html(client: TestClient) -> None:
    assert client.get("/").headers["location"] == "/tasks"
    js = client.get("/static/console.js")
    assert js.status_code == 200 and "EventSource" in js.text
    assert "innerHTML" not in js.text.replace("从不 innerHTML", "")


def test_logout_needs_csrf_and_ends_the_session(client_for: ClientFactory, make_task: MakeTask) -> None:
    make_task("o1")
    client = client_for(token=TOKEN)
    csrf = csrf_of(client, "/login")
    assert client.post("/login", data={"csrf": csrf, "token": TOKEN, "operator": "bob"}).status_code == 303
    fresh = csrf_of(client)
    assert client.post("/logout", data={}).status_code == 403  # 没有 CSRF：别的网页不能把人登出
    assert client.get("/api/tasks").status_code == 200
    out = client.post("/logout", data={"csrf": fresh})
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert client.get("/api/tasks").status_code == 401


def test_favicon_and_healthz_when_the_store_is_gone(client_for: ClientFactory, db_path: str) -> None:
    assert client_for().get("/favicon.ico").status_code == 204
    broken = SqliteTaskStore(db_path)
    from chongming_task.web import WebSettings
    from chongming_task.web.app import WebConsole

    console = WebConsole(broken, WebSettings(default_operator="alice"))
    broken.close()  # 存储断了：healthz 走一次真实查询，就该失败
    with TestClient(console.app) as client:
        response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["ok"] is False and "存储不可用" in response.json()["error"]
