"""``chongming-task web``：CLI 通过入口点组 ``chongming_task.cli_commands`` 发现这个子命令。

全局选项（``chongming-task --db x web``）与子命令自己的 ``--db`` / ``--store`` 都认，子命令的优先。
错误以 ``ConfigurationError`` 抛出，由 CLI 统一翻成一行"错误：……"、退出码 1。
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from chongming_task import ConfigurationError, TaskError, open_store
from chongming_task.store_registry import split_url
from chongming_task.web.app import DEFAULT_POLL_INTERVAL, WebSettings
from chongming_task.web.security import InsecureBind
from chongming_task.web.server import serve

ENV_TOKEN = "CHONGMING_TASK_WEB_TOKEN"
DEFAULT_PORT = 8765


def _store_url(ctx: click.Context, db: str | None, store_url: str | None) -> tuple[str, str]:
    root = ctx.find_root().params
    if db is None and store_url is None:
        db, store_url = root.get("db"), root.get("store_url")
    if db is not None and store_url is not None:
        raise ConfigurationError("--db 与 --store 只能给一个（--db PATH 就是 --store sqlite:PATH 的简写）")
    if db is not None:
        path = os.path.abspath(db)
        if not os.path.exists(path):
            raise ConfigurationError(f"数据库文件 {db} 不存在：请检查 --db 路径（控制台不会新建空库）")
        return f"sqlite:{path}", db
    if store_url is not None:
        return store_url, store_url.split("@")[-1] if "@" in store_url else store_url
    raise ConfigurationError("没有指定存储：请用 chongming-task web --db tasks.db 或 --store URL")


_F = TypeVar("_F", bound=Callable[..., Any])


def _with_default(
    name: str, kind: click.ParamType[Any], default: float, help_text: str
) -> Callable[[_F], _F]:
    """带默认值（帮助里显示出来）的数值选项：端口与轮询间隔共用这一种写法。"""
    return click.option(name, type=kind, default=default, show_default=True, help=help_text)


@click.command("web")
@click.option("--db", metavar="PATH", help="SQLite 数据库文件。")
@click.option(
    "--store", "store_url", metavar="URL", help="存储连接串（sqlite:///abs.db、postgresql://...）。"
)
@click.option("--host", default="127.0.0.1", show_default=True, help="监听地址；非回环地址必须给 --token。")
@_with_default("--port", click.IntRange(0, 65535), DEFAULT_PORT, "端口（0 = 随机空闲端口）。")
@click.option("--read-only", is_flag=True, help="只读：拒绝一切操作，页面上没有按钮。")
@click.option(
    "--token", envvar=ENV_TOKEN, show_envvar=True, metavar="TOKEN", help="登录口令（至少 16 个字符）。"
)
@click.option(
    "--operator", metavar="NAME", help="无口令模式下的操作者名（默认当前系统用户），写成 web:<NAME>。"
)
@_with_default(
    "--poll-interval",
    click.FloatRange(0.1, 60.0),
    DEFAULT_POLL_INTERVAL,
    "共享轮询的间隔（秒）：每种视图每个间隔查一次存储。",
)
@click.pass_context
def web_command(
    ctx: click.Context,
    db: str | None,
    store_url: str | None,
    host: str,
    port: int,
    read_only: bool,
    token: str | None,
    operator: str | None,
    poll_interval: float,
) -> int:
    """运维网页控制台：实时查看与控制任务（默认只监听 127.0.0.1）。"""
    url, display = _store_url(ctx, db, store_url)
    settings = WebSettings(
        token=token or None,
        read_only=read_only,
        num_buckets=int(ctx.find_root().params.get("num_buckets") or 64),
        poll_interval=poll_interval,
        default_operator=operator,
        store_display=display,
    )
    # 控制台从不建表（issue 16.5）：--read-only 时只读打开，否则只写指令、不建表（"never"）。
    # 内置后端之外的 scheme 不认这两个参数，不传。
    opening: dict[str, object] = {}
    if split_url(url)[0] in ("sqlite", "postgresql", "postgres"):
        opening = {"readonly": True} if read_only else {"create_schema": "never"}
    try:
        store = open_store(url, **opening)
    except (TaskError, ImportError, OSError) as exc:
        raise ConfigurationError(f"无法打开存储 {display}：{exc}") from exc
    try:
        serve(store, settings, host=host, port=port)
    except InsecureBind as exc:
        raise ConfigurationError(str(exc)) from None
    finally:
        store.close()
    return 0


__all__ = ["ENV_TOKEN", "web_command"]
