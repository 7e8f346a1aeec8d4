"""真实浏览器：Debian 的 chromium 由 Playwright 驱动（executable_path，不下载浏览器）。

一个 SQLite 存储、一个真实的控制台服务器进程（uvicorn，随机空闲端口）、一个真实跑着任务的持有者进程。
看到进度不刷新页面就在变；暂停 → "已暂停"；恢复；停止 → "已停止"；按筛选批量停止；只读服务器没有按钮；
Ctrl-C 之后服务器 2 秒内退出（浏览器的 SSE 长连接还开着）。截图存进 tmp_path
（设了 CHONGMING_WEB_SCREENSHOTS 时也复制到那个目录，docs/web.md 的配图就是这样来的）。

没有 chromium 或 playwright 时跳过；CHONGMING_REQUIRE_BROWSER=1（CI）时跳过即失败（见根目录 conftest.py）。
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from chongming_task.stores.sqlite import SqliteTaskStore

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
TESTS_DIR = Path(__file__).resolve().parent
_ENTRY = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from chongming_task.cli import main; main(sys.argv[1:])"
)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_TASK_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="module")
def playwright_api() -> Any:
    if not os.path.exists(CHROMIUM):
        pytest.skip("需要浏览器：apt-get install -y chromium fonts-noto-cjk（CI 的 .ci/run 会自动安装）")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip(
            "需要浏览器驱动：pip install playwright（不要运行 playwright install，用系统的 chromium）"
        )
    return sync_playwright


def expect(locator: Any) -> Any:
    # 用定位器断言而不是 wait_for_function：后者要 eval 字符串，会被我们自己的 CSP（无 unsafe-eval）拦下。
    from playwright.sync_api import expect as playwright_expect

    return playwright_expect(locator)


@pytest.fixture
def browser(playwright_api: Any) -> Iterator[Any]:
    with playwright_api() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield instance
        finally:
            instance.close()


class Proc:
    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []

    def wait_line(self, stream: str, pattern: str, timeout: float = 30.0) -> re.Match[str]:
        pipe = self.proc.stderr if stream == "stderr" else self.proc.stdout
        assert pipe is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = pipe.readline()
            if not line:
                break
            self.lines.append(line)
            found = re.search(pattern, line)
            if found:
                return found
        raise AssertionError(f"进程没有输出 {pattern!r}：{''.join(self.lines)}{self._rest()}")

    def _rest(self) -> str:
        if self.proc.poll() is None:
            return ""
        out, err = self.proc.communicate(timeout=5)
        return out + err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    procs: list[Proc] = []

    def start(*argv: str) -> Proc:
        proc = Proc(list(argv), tmp_path)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()


def start_server(spawn: Callable[..., Proc], db: str, *extra: str) -> tuple[Proc, str]:
    proc = spawn(sys.executable, "-c", _ENTRY, "web", "--db", db, "--port", "0", "--operator", "tester",
                 "--poll-interval", "0.3", *extra)  # fmt: skip
    found = proc.wait_line("stderr", r"(http://127\.0\.0\.1:\d+/)")
    return proc, found.group(1)


def interrupt_within(proc: Proc, seconds: float) -> float:
    started = time.monotonic()
    proc.proc.send_signal(signal.SIGINT)
    proc.proc.wait(timeout=10)
    return time.monotonic() - started


def shot(page: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    target = os.environ.get("CHONGMING_WEB_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / path.name)


def status_of(db: str, task_id: str) -> str | None:
    with SqliteTaskStore(db) as store:
        snapshot = store.get(task_id)
    return None if snapshot is None else snapshot.status.value


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("条件在超时内没有成立")


def seed_failed_durable(db: str, task_id: str) -> None:
    """直接写一个已失败的持久任务（带配方），不需要 worker：重试只把它交回队列。"""
    from datetime import UTC, datetime

    from chongming_task import Failure, FailureKind, TaskSnapshot, TaskStatus
    from chongming_task.core.recipes import Recipe

    now = datetime.now(UTC)
    snapshot = TaskSnapshot(
        task_id=task_id,
        name="etl.durable",
        created_at=now,
        status=TaskStatus.FAILED,
        attempt=1,
        started_at=now,
        finished_at=now,
        failure=Failure(FailureKind.EXCEPTION, "上游不可用"),
        recipe=Recipe(name="etl.durable", args=("<b>不是标签</b>",), kwargs={"day": "2030-01-02"}),
    )
    with SqliteTaskStore(db) as store:
        store.create(snapshot)


def act(page: Any, action: str, reason: str) -> None:
    """在任务页上填原因、点动作按钮、在确认页点确认（服务端确认页，不靠 JS 对话框）。"""
    page.fill("textarea[name=reason]", reason)
    page.click(f"button[data-action={action}]")
    page.wait_for_selector("#confirm-button")
    page.click("#confirm-button")
    page.wait_for_selector("#task")


def test_live_console_in_a_real_browser(browser: Any, spawn: Callable[..., Proc], tmp_path: Path) -> None:
    db = str(tmp_path / "tasks.db")
    holder = spawn(sys.executable, str(TESTS_DIR / "web_holder.py"), db)
    holder.wait_line("stdout", "ready")
    wait_for(lambda: status_of(db, "live-1") == "running")
    seed_failed_durable(db, "durable-1")
    server, url = start_server(spawn, db)
    page = browser.new_page(viewport={"width": 1280, "height": 900}, locale="zh-CN")
    errors: list[str] = []
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)

    # 1. 任务列表：进度不刷新页面就在变
    page.goto(url + "tasks")
    progress = page.locator('tr[data-task-id="live-1"] [data-field="progress.text"]')
    expect(page.locator("#live-state")).to_have_attribute("data-state", "on", timeout=15_000)
    loads = len(navigations)
    first = progress.inner_text()
    expect(progress).not_to_have_text(first, timeout=15_000)
    assert len(navigations) == loads  # 没有重新加载：是 SSE 推来的
    assert progress.inner_text() != first and "步" in progress.inner_text()
    shot(page, tmp_path, "web-tasks")

    # 2. 任务页：日志的实时尾巴不刷新页面就在长（第二条 SSE，同一个共享轮询器）
    page.goto(url + "tasks/live-1")
    log_lines = page.locator("#log-lines li[data-seq]")
    expect(log_lines.first).to_contain_text('步完成 <ok> "引号"', timeout=15_000)  # 原样显示，不被当成标签
    loads, shown = len(navigations), log_lines.count()
    expect(log_lines).not_to_have_count(shown, timeout=15_000)
    # 行号一次读出（同一个 DOM 快照）：日志还在实时追加，分几次读最后一行、行数与全部行号会读到不同的时刻
    # （负载高时两次读之间又到了几行，读到的 last 与行数对不上，测试就错判）。
    seqs = [int(s) for s in log_lines.evaluate_all("els => els.map(e => e.dataset.seq)")]
    assert len(navigations) == loads and len(seqs) > shown
    assert seqs == list(range(seqs[-1] - len(seqs) + 1, seqs[-1] + 1))  # 首屏与实时追加的行接得上：不重不漏
    # 暂停 → "已暂停"，恢复 → "运行中"，停止 → "已停止"（都由持有者执行，页面经 SSE 更新）
    badge = page.locator('#task [data-field="status_label"]')
    act(page, "pause", "浏览器测试：暂停")
    expect(badge).to_have_text("已暂停", timeout=20_000)
    assert status_of(db, "live-1") == "paused"
    shot(page, tmp_path, "web-task-paused")
    act(page, "resume", "浏览器测试：恢复")
    expect(badge).to_have_text("运行中", timeout=20_000)
    act(page, "stop", "浏览器测试：停止")
    expect(badge).to_have_text("已停止", timeout=20_000)
    assert badge.inner_text() == "已停止" and status_of(db, "live-1") == "stopped"
    expect(page.locator("#history")).to_contain_text("web:tester", timeout=20_000)
    assert "浏览器测试：停止" in page.locator("#history").inner_text()  # 谁、为什么，都在时间线里
    assert page.locator("button[data-action=stop]").is_hidden()  # 已停止：不再有停止按钮
    shot(page, tmp_path, "web-task")

    # 3. 按筛选批量停止：确认页显示数目，确认后三个任务都停下
    page.goto(url + "tasks?name=bulk.")
    page.click("#bulk-stop")
    assert page.locator("#bulk-count").inner_text() == "3"
    page.fill("textarea[name=reason]", "浏览器测试：批量停止")
    shot(page, tmp_path, "web-bulk")
    page.click("#bulk-form button[type=submit]")
    page.wait_for_selector('tr[data-task-id="bulk-0"]')
    for i in range(3):
        expect(page.locator(f'tr[data-task-id="bulk-{i}"] [data-field="status_label"]')).to_have_text(
            "已停止", timeout=20_000
        )
    assert [status_of(db, f"bulk-{i}") for i in range(3)] == ["stopped"] * 3

    # 3b. 已失败的持久任务：配方原样显示，"重试"确认后回到队列、"待认领"，时间线里是 web:tester
    page.goto(url + "tasks/durable-1")
    expect(page.locator("#recipe-args")).to_contain_text('"<b>不是标签</b>"')
    act(page, "retry", "浏览器测试：重试")
    expect(page.locator('#task [data-field="status_label"]')).to_have_text("排队中", timeout=20_000)
    expect(page.locator('#task [data-field="claim_label"]')).to_have_text("待认领")
    expect(page.locator("#history")).to_contain_text("浏览器测试：重试")
    assert "web:tester" in page.locator("#history").inner_text() and status_of(db, "durable-1") == "queued"

    # 4. 总览
    page.goto(url + "overview")
    page.wait_for_selector("#status-counts")
    assert page.locator('#status-counts tr[data-status="stopped"] [data-count]').inner_text() == "4"
    expect(page.locator("#nodes")).to_contain_text("holder-1")  # 持有者进程还在：节点与租约新鲜度
    assert "存活" in page.locator("#nodes").inner_text()
    heartbeat = page.locator("#nodes tr").first.locator("td").nth(3)
    expect(heartbeat).not_to_have_text(heartbeat.inner_text(), timeout=15_000)  # 节点表也经 SSE 原地更新
    shot(page, tmp_path, "web-overview")

    # 5. 只读服务器：没有任何按钮
    ro_server, ro_url = start_server(spawn, db, "--read-only")
    ro = browser.new_page(viewport={"width": 1280, "height": 900}, locale="zh-CN")
    for path in ("tasks", "tasks/live-1", "overview"):
        ro.goto(ro_url + path)
        assert ro.locator("#read-only-badge").is_visible()
        buttons = [b for b in ro.locator("button").all_inner_texts() if b != "筛选"]
        assert buttons == [], path
    assert ro.locator("#bulk-stop").count() == 0
    shot(ro, tmp_path, "web-read-only")
    assert errors == []  # 页面脚本没有报错（包括 CSP 拦截）

    # 6. Ctrl-C：浏览器的 SSE 长连接还开着，服务器 2 秒内退出
    page.goto(url + "tasks")
    expect(page.locator("#live-state")).to_have_attribute("data-state", "on", timeout=15_000)
    assert interrupt_within(server, 2.0) < 2.0
    assert interrupt_within(ro_server, 2.0) < 2.0
    assert server.proc.returncode is not None
