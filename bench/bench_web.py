"""网页控制台：100 万行 SQLite 存储上任务列表页的服务端渲染耗时（issue 21）。

测什么
    ``GET /tasks?<筛选>`` 整页（键集分页查询 + 行的展示加工 + Jinja2 渲染），计时放在 ASGI 应用外面一层：
    从应用收到请求到最后一个响应字节交出去，不含 HTTP 客户端自己的开销。视图：无筛选、状态、任务名前缀、
    标签、桶、持有者、状态 + 持有者，以及沿"下一页"游标往深处翻（第 2–20 页）。
    目标：全部视图合起来 p95 ≤ 100 ms，每个视图也单独打印 p95。
    同一次运行里的对照（地板）：同样的筛选直接调 ``store.query``（只查库、不渲染）的 p95。

数据
    与 ``bench_sqlite_store.py`` 同一个造数函数（批量 SQL 灌入：2% running、3% queued、其余终态；64 个桶、
    8 个 owner、每 10 行一个 io 标签），文件只建一次（默认 /tmp/chongming-bench-web-1m.db，
    环境变量 CHONGMING_BENCH_WEB_DB 可换）。

用法
    python bench/bench_web.py [--quick]     （--quick：每个视图少采样几次）
"""

from __future__ import annotations

import os
import platform
import sqlite3
import sys
import time
import warnings
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore", message=".*httpx.*")

from bench_sqlite_store import BIG_ROWS, big_file_ready, build_big_file  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

from chongming_task.stores.sqlite import SqliteTaskStore  # noqa: E402
from chongming_task.web import WebSettings  # noqa: E402
from chongming_task.web.app import WebConsole  # noqa: E402
from chongming_task.web.filters import page_query, parse_cursor, parse_filter  # noqa: E402

GOAL_P95_MS = 100.0
WEB_DB = Path(os.environ.get("CHONGMING_BENCH_WEB_DB", "/tmp/chongming-bench-web-1m.db"))
VIEWS = {
    "无筛选（最新 50 条）": "",
    "状态 running": "status=running",
    "状态 running + queued": "status=running&status=queued",
    "任务名前缀 sync-42（1%）": "name=sync-42",
    "任务名前缀 sync-4（11%）": "name=sync-4",
    "任务名前缀 sync-（全部）": "name=sync-",
    "任务名前缀 nomatch（没有）": "name=nomatch",
    "标签 io": "tag=io",
    "桶 7": "bucket=7",
    "持有者 worker-3": "holder=worker-3",
    "状态 running + 持有者 worker-3": "status=running&holder=worker-3",
}
DEEP_PAGES = 20

Scope = MutableMapping[str, Any]
ASGI = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


class ServerTimer:
    """ASGI 外层：记每个 HTTP 请求在服务端花的时间（毫秒）。"""

    def __init__(self, app: ASGI) -> None:
        self.app = app
        self.samples: list[float] = []

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        started = time.perf_counter()
        await self.app(scope, receive, send)
        if scope["type"] == "http":
            self.samples.append((time.perf_counter() - started) * 1000)


def p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[max(0, int(len(ordered) * 0.95 + 0.5) - 1)]


def next_url(html: str) -> str | None:
    marker = 'href="'
    end = html.find('" id="next-page"')
    if end < 0:
        return None
    start = html.rfind(marker, 0, end) + len(marker)
    return html[start:end].replace("&amp;", "&")


def main() -> int:
    quick = "--quick" in sys.argv
    rounds = 15 if quick else 40
    print(
        f"Python {platform.python_version()}，SQLite {sqlite3.sqlite_version}，{platform.machine()}，"
        f"{os.cpu_count()} 核；{BIG_ROWS:,} 行，每页 50 行"
    )
    if not big_file_ready(WEB_DB, BIG_ROWS):
        build_big_file(WEB_DB, BIG_ROWS)
    else:
        print(f"    复用已有的 {WEB_DB}")
    store = SqliteTaskStore(WEB_DB, readonly=True)
    console = WebConsole(store, WebSettings(read_only=True, default_operator="bench"))
    timer = ServerTimer(console.app)
    all_samples: list[float] = []
    ok = True
    print(f"\n  {'视图':<32} {'渲染 p95':>10} {'中位':>8} {'store.query p95（地板）':>22}")
    with TestClient(timer) as client:  # type: ignore[arg-type]
        # 每个视图：先预热一次，再采样 rounds 次
        for label, query in VIEWS.items():
            url = "/tasks?" + query
            assert client.get(url).status_code == 200
            timer.samples.clear()
            for _ in range(rounds):
                response = client.get(url)
                assert response.status_code == 200, url
            samples = list(timer.samples)
            all_samples += samples
            floor = floor_p95(store, query, rounds)
            print(f"  {label:<32} {p95(samples):>8.2f} ms {sorted(samples)[len(samples) // 2]:>6.2f} ms"
                  f" {floor:>18.2f} ms")  # fmt: skip
        # 往深处翻：沿页面上的"下一页"链接（键集游标），每种筛选翻 DEEP_PAGES 页
        for label, query in (("无筛选 第 2–20 页", ""), ("状态 running 第 2–20 页", "status=running")):
            timer.samples.clear()
            url: str | None = "/tasks?" + query
            pages = 0
            while url is not None and pages < DEEP_PAGES:
                response = client.get(url)
                assert response.status_code == 200, url
                url = next_url(response.text)
                pages += 1
            samples = timer.samples[1:]  # 第一页上面已经测过
            all_samples += samples
            print(f"  {label:<32} {p95(samples):>8.2f} ms {sorted(samples)[len(samples) // 2]:>6.2f} ms")
    store.close()
    overall = p95(all_samples)
    ok = overall <= GOAL_P95_MS
    verdict = "达标" if ok else "未达标"
    print(
        f"\n  全部 {len(all_samples)} 次渲染：p95 {overall:.2f} ms，目标 ≤ {GOAL_P95_MS:.0f} ms → {verdict}"
        f"（{GOAL_P95_MS / overall:.1f}× 余量）"
    )
    return 0 if ok else 1


def floor_p95(store: SqliteTaskStore, query: str, rounds: int) -> float:
    """同样的筛选只调 store.query（第一页，limit 51：页面多取一行判断有没有下一页）。"""
    pairs = parse_qsl(query)
    params = dict(pairs)
    flt = parse_filter(params, [v for k, v in pairs if k == "status"], num_buckets=64)
    page = page_query(flt, parse_cursor(None), 51)
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        store.query(page)
        samples.append((time.perf_counter() - started) * 1000)
    return p95(samples)


if __name__ == "__main__":
    sys.exit(main())
