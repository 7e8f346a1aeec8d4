"""共享轮询器（20 个订阅者，存储每个间隔只被查一次）、关闭时流干净结束，以及 `chongming-task web` 子命令。"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from click.testing import CliRunner

from chongming_task.cli import cli
from chongming_task.web.poller import SharedPoller
from chongming_task.web.security import InsecureBind, check_bind, is_loopback


def test_one_query_per_interval_however_many_subscribers() -> None:
    calls = {"n": 0}

    def fetch() -> dict[str, Any]:
        calls["n"] += 1
        return {"n": calls["n"]}

    async def scenario() -> tuple[list[list[str]], int, int]:
        poller = SharedPoller(interval=0.05)
        await poller.start()
        received: list[list[str]] = [[] for _ in range(20)]

        async def client(index: int) -> None:
            async for text in poller.subscribe("tasks?x", fetch):
                if text is not None:
                    received[index].append(text)
                if len(received[index]) >= 4:
                    return

        await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(20))), timeout=10)
        queries = poller.queries["tasks?x"]
        await poller.stop()
        return received, queries, calls["n"]

    received, queries, fetched = asyncio.run(scenario())
    # 20 个订阅者看到同样的 4 个版本，而存储只被查了 4 次左右（每个间隔一次，不是每个订阅者一次）
    assert all(r == received[0] for r in received)
    assert fetched == queries and 4 <= queries <= 6


def test_streams_end_when_the_server_stops() -> None:
    async def scenario() -> float:
        poller = SharedPoller(interval=0.05)
        await poller.start()
        seen: list[str | None] = []

        async def client() -> None:
            async for text in poller.subscribe("overview", lambda: {"same": 1}):
                seen.append(text)

        task = asyncio.create_task(client())
        await asyncio.sleep(0.2)
        loop = asyncio.get_running_loop()
        started = loop.time()
        poller.request_stop_threadsafe()  # 信号处理里调用的就是它
        await asyncio.wait_for(task, timeout=2)
        await poller.stop()
        assert seen == ['{"same":1}']  # 内容没变化：不重复推送
        return loop.time() - started

    assert asyncio.run(scenario()) < 0.5


def test_bind_rules() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")
    check_bind("127.0.0.1", None)
    with pytest.raises(InsecureBind, match="--token"):
        check_bind("0.0.0.0", None)
    with pytest.raises(InsecureBind, match="至少 16 个字符"):
        check_bind("0.0.0.0", "short")
    check_bind("0.0.0.0", "x" * 16)


def test_web_command_refuses_non_loopback_without_token(tmp_path: Any) -> None:
    from chongming_task.stores.sqlite import SqliteTaskStore

    db = tmp_path / "t.db"
    SqliteTaskStore(str(db)).close()
    result = CliRunner().invoke(cli, ["web", "--db", str(db), "--host", "0.0.0.0"], catch_exceptions=False)
    assert result.exit_code == 1
    assert "拒绝在非回环地址 0.0.0.0 上无口令启动" in result.output


def test_web_command_store_errors(tmp_path: Any) -> None:
    runner = CliRunner()
    missing = runner.invoke(cli, ["web", "--db", str(tmp_path / "nope.db")], catch_exceptions=False)
    assert missing.exit_code == 1 and "数据库文件" in missing.output and "不存在" in missing.output
    none = runner.invoke(cli, ["web"], catch_exceptions=False)
    assert none.exit_code == 1 and "没有指定存储" in none.output


def test_web_without_the_distribution_prints_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import chongming_task.cli.app as app

    real = app.entry_points

    def without_web(**kwargs: Any) -> Any:
        if kwargs.get("group") == app.PLUGIN_GROUP:
            return real(group="chongming_task.no_such_group")
        return real(**kwargs)

    monkeypatch.setattr(app, "entry_points", without_web)
    result = CliRunner().invoke(cli, ["web", "--db", "x.db"], catch_exceptions=False)
    assert result.exit_code == 1
    assert 'pip install chongming-task-web（或 pip install "chongming-task[web]"）' in result.output


def test_web_is_listed_in_help_when_installed() -> None:
    output = CliRunner().invoke(cli, ["--help"]).output
    assert "运维网页控制台" in output
