"""持久任务在控制台里（issue 21 × issue 19）：durable 筛选（走存储的 TaskQuery.durable，翻页与批量都对）、
"持久" / "待认领" 徽章、配方（参数按 JSON 文本显示并转义）、重试（确认 + 原因 + CSRF，经 Controller.requeue，
history 里操作者是 web:<操作者>）、只读 403、错误状态的 400 / 409。"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from markupsafe import escape
from starlette.testclient import TestClient
from web_testkit import T0, ClientFactory, MakeTask, csrf_of

from chongming_task import Failure, FailureKind, TaskStatus
from chongming_task.core.recipes import OnLost, Recipe
from chongming_task.stores.sqlite import SqliteTaskStore

HOSTILE = "<script>alert('x')</script>\"'&中文"


def ids(response: Any) -> list[str]:
    assert response.status_code == 200, response.text
    return [row["task_id"] for row in response.json()["tasks"]]


def recipe(**changes: Any) -> Recipe:
    fields: dict[str, Any] = {"name": "etl.load", "args": (1, "两"), "kwargs": {"day": "2030-01-02"}}
    fields.update(changes)
    return Recipe(**fields)


def failed(make_task: MakeTask, task_id: str, **fields: Any) -> Any:
    fields.setdefault("status", TaskStatus.FAILED)
    fields.setdefault("finished_at", T0 + timedelta(hours=1))
    fields.setdefault("failure", Failure(FailureKind.EXCEPTION, "boom"))
    fields.setdefault("attempt", 1)
    return make_task(task_id, name="etl.load", **fields)


# -- 筛选与徽章 -------------------------------------------------------------------------------------


def test_durable_filter_in_api_form_and_paging(client: TestClient, make_task: MakeTask) -> None:
    durable_ids = []
    for i in range(7):
        durable_ids.append(make_task(f"d{i}", status=TaskStatus.QUEUED, recipe=recipe()).task_id)
        make_task(f"p{i}", status=TaskStatus.RUNNING)
    newest_first = durable_ids[::-1]
    assert ids(client.get("/api/tasks?durable=1")) == newest_first
    assert ids(client.get("/api/tasks?durable=true&status=queued")) == newest_first
    assert ids(client.get("/api/tasks?durable=0")) == [f"p{i}" for i in range(6, -1, -1)]
    assert len(ids(client.get("/api/tasks?durable="))) == 14  # 表单留空 = 全部
    assert len(ids(client.get("/api/tasks?durable=all"))) == 14
    assert client.get("/api/tasks?durable=1").json()["filter"]["durable"] is True
    # 键集翻页：每页 3 个，只在持久任务里翻，不重不漏（过滤在存储里做，页不会被筛空）
    seen: list[str] = []
    url = "/api/tasks?durable=1&limit=3"
    while True:
        page = client.get(url).json()
        assert len(page["tasks"]) == 3 or page["next_cursor"] is None
        seen += [row["task_id"] for row in page["tasks"]]
        if page["next_cursor"] is None:
            break
        url = f"/api/tasks?durable=1&limit=3&after={page['next_cursor']}"
    assert seen == newest_first
    # 网页：下拉框保留选择，下一页链接带着 durable=1
    html = client.get("/tasks?durable=1&limit=3").text
    assert '<option value="1" selected>只看持久任务</option>' in html
    assert (
        'data-task-id="p0"' not in html and "durable=1" in html.split('id="next-page"')[0].rsplit("<a", 1)[1]
    )


def test_durable_filter_bad_value_is_a_clear_400(client: TestClient) -> None:
    response = client.get("/api/tasks?durable=maybe")
    assert response.status_code == 400
    assert "持久筛选（durable）只能是 1" in response.json()["error"]
    assert client.get("/tasks?durable=maybe").status_code == 400


def test_bulk_preview_honours_the_durable_filter(client: TestClient, make_task: MakeTask) -> None:
    make_task("d1", status=TaskStatus.QUEUED, recipe=recipe())
    make_task("p1", status=TaskStatus.QUEUED)
    make_task("p2", status=TaskStatus.RUNNING)
    assert client.get("/api/bulk/preview?action=stop&durable=1").json()["count"] == 1
    assert client.get("/api/bulk/preview?action=stop&durable=0").json()["count"] == 2
    html = client.get("/bulk?action=stop&durable=1").text
    assert 'name="durable" value="1"' in html  # 确认表单带着同一组条件


def test_durable_and_unclaimed_badges(client: TestClient, make_task: MakeTask) -> None:
    make_task("waiting", status=TaskStatus.QUEUED, recipe=recipe())
    make_task("claimed", status=TaskStatus.QUEUED, recipe=recipe(), owner="worker-1")
    make_task("plain", status=TaskStatus.QUEUED)
    rows = {row["task_id"]: row for row in client.get("/api/tasks").json()["tasks"]}
    assert (rows["waiting"]["durable"], rows["waiting"]["claim_label"]) == (True, "待认领")
    assert (rows["claimed"]["durable"], rows["claimed"]["claim_label"]) == (True, None)
    assert (rows["plain"]["durable"], rows["plain"]["claim_label"]) == (False, None)
    html = client.get("/tasks").text
    row_of = {tid: html.split(f'<tr data-task-id="{tid}">')[1].split("</tr>")[0] for tid in rows}
    assert ">持久</span>" in row_of["waiting"] and ">待认领</span>" in row_of["waiting"]
    assert ">持久</span>" in row_of["claimed"] and "待认领" not in row_of["claimed"]
    assert "持久" not in row_of["plain"] and "待认领" not in row_of["plain"]
    page = client.get("/tasks/waiting").text
    assert ">持久</span>" in page and ">待认领</span>" in page
    assert ">待认领</span>" not in client.get("/tasks/claimed").text


# -- 配方 -------------------------------------------------------------------------------------------


def test_task_page_shows_the_recipe(client: TestClient, make_task: MakeTask) -> None:
    make_task(
        "r1",
        status=TaskStatus.QUEUED,
        recipe=recipe(
            args=(1, 2.5, "三"),
            kwargs={"租户": "甲", "limit": 0},
            max_attempts=3,
            timeout={"start": None, "per_attempt": 60.0, "idle": None},
            priority=7,
            bucket_key="tenant-甲",
            on_lost=OnLost.RETRY,
        ),
    )
    page = client.get("/tasks/r1").text
    assert "持久配方" in page
    assert str(escape(json.dumps([1, 2.5, "三"], ensure_ascii=False, indent=2))) in page
    assert str(escape(json.dumps({"租户": "甲", "limit": 0}, ensure_ascii=False, indent=2))) in page
    assert "retry</span>（worker 失联后自动重跑" in page
    assert "tenant-甲" in page and "<dd>7</dd>" in page and "<dd>3</dd>" in page
    data = client.get("/api/tasks/r1").json()["recipe"]
    assert data["args"] == [1, 2.5, "三"] and data["kwargs"] == {"租户": "甲", "limit": 0}
    assert (data["on_lost"], data["max_attempts"], data["priority"]) == ("retry", 3, 7)
    assert data["timeout"] == {"start": None, "per_attempt": 60.0, "idle": None}
    make_task("plain", status=TaskStatus.RUNNING)
    assert "持久配方" not in client.get("/tasks/plain").text
    assert client.get("/api/tasks/plain").json()["recipe"] is None


@pytest.mark.parametrize(
    "hostile", [HOSTILE, '"><img src=x onerror=alert(1)>', "</pre><script>x()</script>", "长" * 10_000]
)
def test_hostile_recipe_arguments_are_escaped(client: TestClient, make_task: MakeTask, hostile: str) -> None:
    make_task(
        "h1",
        status=TaskStatus.QUEUED,
        recipe=recipe(args=(hostile,), kwargs={hostile[:100]: [hostile]}, bucket_key=hostile[:200]),
    )
    page = client.get("/tasks/h1").text
    assert "<script>" not in page.replace('<script src="/static/console.js" defer>', "")
    assert "<img src=x" not in page
    assert str(escape(json.dumps([hostile], ensure_ascii=False, indent=2))) in page
    assert client.get("/api/tasks/h1").json()["recipe"]["args"] == [hostile]


# -- 重试 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [TaskStatus.FAILED, TaskStatus.STOPPED, TaskStatus.LOST])
def test_retry_from_the_page_confirms_then_requeues_with_web_actor(
    client: TestClient, store: SqliteTaskStore, make_task: MakeTask, status: TaskStatus
) -> None:
    failed(make_task, "f1", status=status, recipe=recipe(), owner="worker-1")
    page = client.get("/tasks/f1").text
    assert 'value="retry" data-action="retry">重试</button>' in page  # 可见（没有 hidden）
    assert "retry" in client.get("/api/tasks/f1").json()["actions"]
    # 没有 CSRF：403，什么也没写
    denied = client.post("/tasks/f1/action", data={"action": "retry", "confirm": "1"})
    assert denied.status_code == 403 and "CSRF" in denied.text
    assert store.get("f1").status is status  # type: ignore[union-attr]
    csrf = csrf_of(client)
    confirm = client.post("/tasks/f1/action", data={"action": "retry", "reason": "修好了上游", "csrf": csrf})
    assert confirm.status_code == 200 and "确认重试" in confirm.text and "修好了上游" in confirm.text
    assert store.get("f1").status is status  # type: ignore[union-attr]
    done = client.post(
        "/tasks/f1/action", data={"action": "retry", "reason": "修好了上游", "csrf": csrf, "confirm": "1"}
    )
    assert done.status_code == 303 and done.headers["location"] == "/tasks/f1"
    revived = store.get("f1")
    assert revived is not None and revived.status is TaskStatus.QUEUED and revived.owner is None
    last = store.history("f1")[-1]
    assert (last.trigger, last.actor, last.reason) == ("control:retry", "web:alice", "修好了上游")
    page = client.get("/tasks/f1").text
    assert "已重新排队：任务 f1 将是第 2 次尝试，等 worker 认领" in page
    assert "web:alice" in page and ">待认领</span>" in page  # 迁移时间线里看得到是谁


def test_retry_json_api(client: TestClient, store: SqliteTaskStore, make_task: MakeTask) -> None:
    failed(make_task, "j1", recipe=recipe())
    csrf = {"X-CSRF-Token": csrf_of(client)}
    assert client.post("/api/tasks/j1/retry", json={}).status_code == 403  # 没有 CSRF
    response = client.post("/api/tasks/j1/retry", json={"reason": "重跑"}, headers=csrf)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["action"], body["status"], body["confirmed"]) == ("retry", "queued", True)
    last = store.history("j1")[-1]
    assert (last.trigger, last.actor, last.reason) == ("control:retry", "web:alice", "重跑")
    # 已经回到队列：再重试是 409，说清当前状态
    again = client.post("/api/tasks/j1/retry", json={}, headers=csrf)
    assert again.status_code == 409 and "排队中" in again.json()["error"]
    assert again.json()["status"] == "queued"


def test_retry_rejects_non_durable_and_non_terminal_tasks(
    client: TestClient, store: SqliteTaskStore, make_task: MakeTask
) -> None:
    failed(make_task, "plain")  # 非持久：没有配方
    make_task("busy", status=TaskStatus.RUNNING, recipe=recipe(), owner="worker-1")
    failed(make_task, "won", status=TaskStatus.SUCCEEDED, failure=None, recipe=recipe())
    csrf = csrf_of(client)
    headers = {"X-CSRF-Token": csrf}
    plain = client.post("/api/tasks/plain/retry", json={}, headers=headers)
    assert plain.status_code == 400 and "不是持久任务" in plain.json()["error"]
    busy = client.post("/api/tasks/busy/retry", json={}, headers=headers)
    assert busy.status_code == 409 and "运行中" in busy.json()["error"] and "不能重试" in busy.json()["error"]
    won = client.post("/api/tasks/won/retry", json={}, headers=headers)
    assert won.status_code == 409 and "已成功" in won.json()["error"]
    assert client.post("/api/tasks/nope/retry", json={}, headers=headers).status_code == 404
    page = client.post("/tasks/busy/action", data={"action": "retry", "csrf": csrf, "confirm": "1"})
    assert page.status_code == 409 and "不能重试" in page.text
    assert [h.trigger for h in store.history("busy")] == []  # 什么也没写
    # 按钮：非持久任务没有重试按钮；持久但不能重试的按钮隐藏（状态变了由 SSE 显示出来）
    assert 'data-action="retry"' not in client.get("/tasks/plain").text
    assert 'data-action="retry" hidden>' in client.get("/tasks/busy").text
    assert "retry" not in client.get("/api/tasks/busy").json()["actions"]
    # 批量不接受 retry（只对单个任务）
    bulk = client.get("/api/bulk/preview?action=retry")
    assert bulk.status_code == 400


def test_retry_on_read_only_is_hidden_and_403(
    client_for: ClientFactory, store: SqliteTaskStore, make_task: MakeTask
) -> None:
    failed(make_task, "ro", recipe=recipe())
    client = client_for(read_only=True)
    page = client.get("/tasks/ro").text
    assert "重试</button>" not in page and "持久配方" in page
    csrf = csrf_of(client)
    form = client.post("/tasks/ro/action", data={"action": "retry", "csrf": csrf, "confirm": "1"})
    assert form.status_code == 403 and "只读模式" in form.text
    api = client.post("/api/tasks/ro/retry", json={}, headers={"X-CSRF-Token": csrf})
    assert api.status_code == 403 and "只读模式" in api.json()["error"]
    assert store.get("ro").status is TaskStatus.FAILED  # type: ignore[union-attr]
    assert store.history("ro") == []
