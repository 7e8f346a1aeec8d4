"""小部件：桶的写法、口令遮盖、--arg 解析、终端上的实时进度。"""

from __future__ import annotations

import io
from typing import Any

import click
import pytest

from chongming_task import Controller
from chongming_task.cli.buckets import check_buckets, format_bucket_spec, parse_bucket_spec
from chongming_task.cli.cmd_run import _Watcher
from chongming_task.cli.errors import CliError, mask_secrets, secrets_in
from chongming_task.cli.output import LiveDisplay
from chongming_task.cli.params import parse_task_argument


def test_bucket_spec_round_trip() -> None:
    assert parse_bucket_spec("0-3,8,10-12") == frozenset({0, 1, 2, 3, 8, 10, 11, 12})
    assert parse_bucket_spec(" 5 ") == frozenset({5})
    assert parse_bucket_spec("3,1-2,2") == frozenset({1, 2, 3})
    assert format_bucket_spec({0, 1, 2, 3, 8, 10, 11, 12}) == "0-3,8,10-12"
    assert format_bucket_spec([7]) == "7"
    for spec in ("0-15", "1,3,5", "0-3,8,10-12"):
        assert format_bucket_spec(parse_bucket_spec(spec)) == spec
    assert check_buckets(frozenset({0, 63}), "0,63", 64) == frozenset({0, 63})
    with pytest.raises(CliError, match="桶号 64 超出 --num-buckets 64 的范围 0-63"):
        check_buckets(frozenset({64}), "64", 64)
    for bad in ("+3", "1e2", "3-", "-", "x"):
        with pytest.raises(CliError, match="写法不对"):
            parse_bucket_spec(bad)


def test_masking_covers_url_query_and_keyword_forms() -> None:
    url = "postgresql://alice:p%40ss@db:5432/x?password=other&schema=s"
    secrets = secrets_in(url)
    assert {"p%40ss", "p@ss", "other"} <= set(secrets)
    text = f"连不上 {url}（user=alice password=p@ss host=db）password='other'"
    masked = mask_secrets(text, secrets)
    assert "p@ss" not in masked and "p%40ss" not in masked and "other" not in masked
    assert "postgresql://alice:***@db:5432" in masked
    # 不认识的连接串也按模式遮盖
    assert mask_secrets("redis://u:hunter2@h/0") == "redis://u:***@h/0"
    assert mask_secrets("host=h password=hunter2 port=1") == "host=h password=*** port=1"
    assert secrets_in(None) == [] and secrets_in("sqlite:tasks.db") == []


def test_task_argument_parsing() -> None:
    assert parse_task_argument("n=3") == ("n", 3)
    assert parse_task_argument("x=3.5") == ("x", 3.5)
    assert parse_task_argument("s=kafka://orders") == ("s", "kafka://orders")
    assert parse_task_argument("eq=a=b") == ("eq", "a=b")
    assert parse_task_argument('q="3"') == ("q", "3")
    assert parse_task_argument("z=null") == ("z", None)
    assert parse_task_argument(" k =[1]") == ("k", [1])
    for bad in ("=1", "noeq", "a-b=1"):
        with pytest.raises(click.BadParameter):
            parse_task_argument(bad)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_watcher_on_a_terminal_draws_a_progress_bar() -> None:
    def steps(ctx: Any) -> int:
        for index in range(1, 5):
            ctx.checkpoint()
            ctx.progress(index, total=4, unit="step")
        return 4

    controller = Controller()
    controller.register("steps", steps)
    run = controller.submit("steps", task_id="tty")
    stream = _Tty()
    watcher = _Watcher(run, LiveDisplay(stream), progress_interval=5.0)
    watcher.follow()
    watcher.render(final=True)
    controller.close()
    text = stream.getvalue()
    assert "running → succeeded" in text
    assert "进度" not in text  # 终端上不打印整行进度，只刷新底部那一行


def test_watcher_draws_the_bar_while_running() -> None:
    import threading

    gate = threading.Event()

    def half(ctx: Any) -> None:
        ctx.progress(2, total=4, unit="step", message="一半")
        gate.wait(5)
        ctx.checkpoint()

    controller = Controller()
    controller.register("half", half)
    run = controller.submit("half", task_id="bar")
    stream = _Tty()
    watcher = _Watcher(run, LiveDisplay(stream), progress_interval=5.0)
    deadline = 50
    while run.snapshot.progress is None and deadline:
        run.done_event.wait(0.02)
        deadline -= 1
    watcher.render(final=False)
    assert "[##########----------]  50%  2/4 step  一半" in stream.getvalue()
    gate.set()
    watcher.follow()
    controller.close()


def test_second_interrupt_before_close_starts_does_not_wait_later() -> None:
    """第二下 Ctrl-C 落在"正在停止"提示之后、close() 开始之前：命令收尾时的那次 close() 不能再等满窗口。

    CI 上撞到过（stop 36）：那次 close() 从头开始，等了 graceful_stop 整整 5 秒。这里让提示行本身抛出
    KeyboardInterrupt，确定地复现"close() 还没开始"这一刻。
    """
    import threading
    import time

    from chongming_task.cli.cmd_run import _close_after_interrupt

    release = threading.Event()

    def deaf(ctx: Any) -> None:
        release.wait(30)  # 从不 checkpoint：优雅停止等不到它

    class _Interrupted(LiveDisplay):
        def line(self, text: str) -> None:
            if text.startswith("收到 SIGINT"):
                raise KeyboardInterrupt
            super().line(text)

    controller = Controller(graceful_stop=5.0)
    controller.register("deaf", deaf)
    run = controller.submit("deaf", task_id="deaf")
    try:
        deadline = time.monotonic() + 5
        while run.status.value != "running" and time.monotonic() < deadline:
            run.done_event.wait(0.01)
        display = _Interrupted(io.StringIO())
        assert _close_after_interrupt(controller, _Watcher(run, display, 5.0), display, "SIGINT") is False
        assert controller.closed
        started = time.monotonic()
        controller.close(reason="命令收尾")  # AppState.close 做的那次
        assert time.monotonic() - started < 1.0
    finally:
        release.set()
        controller.close()
