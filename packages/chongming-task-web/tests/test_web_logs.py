"""任务页上的持久化日志：首屏尾部、按尝试筛、JSON API 翻页、SSE 实时尾巴（经共享轮询器）、恶意内容转义。"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import httpx
import pytest
from markupsafe import escape
from starlette.testclient import TestClient
from web_testkit import T0, ClientFactory, CountingStore, LiveServer, MakeTask, sse_events

from chongming_task import TaskStatus
from chongming_task.storage import LOG_TRUNCATED_MARKER, MAX_LOG_MESSAGE_BYTES, LogLine
from chongming_task.stores.sqlite import SqliteTaskStore
from chongming_task.web import WebSettings
from chongming_task.web.app import WebConsole
from chongming_task.web.service import LOG_WINDOW


def write_logs(store: SqliteTaskStore, task_id: str, messages: list[str], *, attempt: int = 1) -> None:
    at = T0 + timedelta(minutes=5)
    store.append_logs(
        [LogLine(task_id, attempt, at + timedelta(milliseconds=i), "INFO", m) for i, m in enumerate(messages)]
    )


def seqs(lines: list[dict[str, Any]]) -> list[int]:
    return [line["seq"] for line in lines]


def test_task_page_shows_the_log_tail_per_attempt(
    client: TestClient, store: SqliteTaskStore, make_task: MakeTask
) -> None:
    make_task("g1", attempt=2, max_attempts=3)
    write_logs(store, "g1", ["第一次：连接数据库", "第一次：超时"], attempt=1)
    write_logs(store, "g1", ["第二次：重新连接"], attempt=2)
    text = client.get("/tasks/g1").text
    assert "第一次：连接数据库" in text and "第二次：重新连接" in text
    assert "— 第 2 次尝试 —" in text  # 尝试之间有分隔
    assert 'href="?attempt=1"' in text and 'href="?attempt=2"' in text
    assert 'data-log-stream="/api/stream/logs/g1?after=3"' in text  # 实时尾巴从首屏最后一行接着读
    only_second = client.get("/tasks/g1?attempt=2").text
    assert "第二次：重新连接" in only_second and "第一次：超时" not in only_second
    assert 'data-log-stream="/api/stream/logs/g1?attempt=2&amp;after=3"' in only_second
    empty = make_task("g2")
    assert "还没有日志" in client.get(f"/tasks/{empty.task_id}").text


def test_page_shows_only_the_newest_window(
    client: TestClient, store: SqliteTaskStore, make_task: MakeTask
) -> None:
    make_task("w1")
    write_logs(store, "w1", [f"第 {i} 行" for i in range(1, LOG_WINDOW + 51)])
    text = client.get("/tasks/w1").text
    assert f"第 {LOG_WINDOW + 50} 行" in text and "第 51 行<" in text and "第 50 行<" not in text


def test_logs_api_pages_by_seq_and_attempt(
    client: TestClient, store: SqliteTaskStore, make_task: MakeTask
) -> None:
    make_task("a1", attempt=2)
    write_logs(store, "a1", [f"a{i}" for i in range(5)], attempt=1)
    write_logs(store, "a1", [f"b{i}" for i in range(3)], attempt=2)
    data = client.get("/api/tasks/a1/logs").json()
    assert seqs(data["lines"]) == list(range(1, 9))
    assert data["stats"] == {"kept": 8, "dropped": 0, "last_seq": 8} and data["more"] is False
    first = client.get("/api/tasks/a1/logs?limit=3").json()
    assert seqs(first["lines"]) == [1, 2, 3] and first["more"] is True and first["next_after"] == 3
    rest = client.get(f"/api/tasks/a1/logs?after={first['next_after']}").json()
    assert seqs(rest["lines"]) == [4, 5, 6, 7, 8]
    second = client.get("/api/tasks/a1/logs?attempt=2").json()
    assert [line["message"] for line in second["lines"]] == ["b0", "b1", "b2"]
    assert {line["attempt"] for line in second["lines"]} == {2}
    assert client.get("/api/tasks/a1/logs?after=8").json()["lines"] == []
    missing = client.get("/api/tasks/nope/logs")
    assert missing.status_code == 404 and "找不到任务" in missing.json()["error"]


@pytest.mark.parametrize(
    ("query", "needle"),
    [
        ("attempt=x", "尝试次数（attempt）必须是整数"),
        ("attempt=-1", "尝试次数（attempt）越界"),
        ("after=abc", "日志序号（after）必须是整数"),
        ("limit=0", "日志行数（limit）越界"),
        ("limit=1001", "日志行数（limit）越界"),
    ],
)
def test_bad_log_parameters_are_a_clear_400(
    client: TestClient, make_task: MakeTask, query: str, needle: str
) -> None:
    make_task("b1")
    api = client.get(f"/api/tasks/b1/logs?{query}")
    assert api.status_code == 400 and needle in api.json()["error"]
    assert client.get(f"/api/stream/logs/b1?{query}").status_code == 400
    if not query.startswith(("after", "limit")):
        page = client.get(f"/tasks/b1?{query}")
        assert page.status_code == 400 and str(escape(needle)) in page.text


HOSTILE_LINES = [
    "<script>alert('x')</script>",
    '"><img src=x onerror=alert(1)>',
    "'单引号' \"双引号\" &amp; 与号",
    "中文日志·全角（括号）：处理第 3 批",
    "<" + "长" * 10_000 + ">",  # 10 KB 以上：存储截到 4 KB
]


@pytest.mark.parametrize("hostile", HOSTILE_LINES)
def test_hostile_log_lines_are_escaped(
    client: TestClient, store: SqliteTaskStore, make_task: MakeTask, hostile: str
) -> None:
    make_task("h1")
    write_logs(store, "h1", [hostile])
    [stored] = store.read_logs("h1")
    page = client.get("/tasks/h1").text
    assert "<script>alert" not in page and "<img src=x" not in page
    assert str(escape(stored.message)) in page  # 原文（截断后）转义后完整出现，CJK 原样
    api = client.get("/api/tasks/h1/logs").json()["lines"][0]
    assert api["message"] == stored.message  # JSON 原样返回
    if len(hostile.encode()) > MAX_LOG_MESSAGE_BYTES:
        assert api["truncated"] is True and api["message"].endswith(LOG_TRUNCATED_MARKER)
    else:
        assert api["message"] == hostile


# -- SSE 实时尾巴（真实的 uvicorn：TestClient 不流式） ------------------------------------------------------


def test_live_log_tail_over_sse_is_shared_and_resumes(store: SqliteTaskStore, make_task: MakeTask) -> None:
    make_task("live")
    write_logs(store, "live", ["旧行 1", "旧行 2"])
    counting = CountingStore(store)
    console = WebConsole(counting, WebSettings(default_operator="alice", poll_interval=0.05))  # type: ignore[arg-type]

    async def scenario(base: str) -> tuple[list[list[Any]], list[Any], int]:
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            url = "/api/stream/logs/live?after=2"

            def got(n: int) -> Any:
                return lambda events: sum(len(json.loads(d)["lines"]) for e, d in events if e == "logs") >= n

            readers = [asyncio.create_task(sse_events(http, url, until=got(3))) for _ in range(5)]
            await asyncio.sleep(0.3)
            before = counting.calls.get("read_logs", 0)
            await asyncio.sleep(0.5)  # 10 个间隔：5 个浏览器看同一个日志视图
            during = counting.calls.get("read_logs", 0) - before
            await asyncio.to_thread(write_logs, store, "live", ["新行 <b>3</b>", "新行 4", "新行 5"])
            results = await asyncio.wait_for(asyncio.gather(*readers), timeout=10)
            # 断线重连：浏览器带回 Last-Event-ID，只收之后的行
            await asyncio.to_thread(write_logs, store, "live", ["新行 6"])
            resumed = await sse_events(http, url, until=got(1), headers={"Last-Event-ID": "5"})
            return [[json.loads(d) for e, d in r if e == "logs"] for r in results], resumed, during

    with LiveServer(console) as base:
        results, resumed, during = asyncio.run(scenario(base))
    for events in results:
        lines = [line for event in events for line in event["lines"]]
        assert [line["message"] for line in lines] == ["新行 <b>3</b>", "新行 4", "新行 5"]  # 旧行不重发
        assert seqs(lines) == [3, 4, 5] and not any(event["gap"] for event in events)
    assert 2 <= during <= 14  # 每个间隔一次 read_logs，而不是每个浏览器一次（5 个浏览器 ≈ 50 次）
    assert [line["message"] for event in resumed for line in json.loads(event[1])["lines"]] == ["新行 6"]


def test_log_stream_flags_a_gap_when_a_client_is_too_far_behind(
    client_for: ClientFactory, store: SqliteTaskStore, make_task: MakeTask
) -> None:
    make_task("fast", status=TaskStatus.RUNNING)
    write_logs(store, "fast", [f"行 {i}" for i in range(LOG_WINDOW + 10)])
    console = WebConsole(store, WebSettings(default_operator="alice", poll_interval=0.05))

    async def scenario(base: str) -> list[Any]:
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            events = await sse_events(http, "/api/stream/logs/fast?after=1", until=lambda e: len(e) >= 1)
            return [json.loads(d) for e, d in events if e == "logs"]

    with LiveServer(console) as base:
        [event] = asyncio.run(scenario(base))
    assert event["gap"] is True and len(event["lines"]) == LOG_WINDOW
    assert event["lines"][-1]["message"] == f"行 {LOG_WINDOW + 9}"
