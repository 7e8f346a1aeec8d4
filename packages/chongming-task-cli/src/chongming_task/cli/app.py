"""命令组与全局选项；错误在这里统一翻成一行中文 + 三档退出码。"""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from chongming_task.cli.buckets import check_buckets, parse_bucket_spec
from chongming_task.cli.errors import (
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    describe_click_error,
    mask_secrets,
    secrets_in,
)
from chongming_task.cli.params import POSITIVE_INT
from chongming_task.cli.state import (
    ENV_DB,
    ENV_NUM_BUCKETS,
    ENV_OWNED_BUCKETS,
    ENV_OWNER,
    ENV_STORE,
    AppState,
)
from chongming_task.errors import TaskError
from chongming_task.policies import DEFAULT_NUM_BUCKETS

F = TypeVar("F", bound=Callable[..., Any])

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 110}

PLUGIN_GROUP = "chongming_task.cli_commands"
"""其他发行包登记子命令的入口点组（名字 → click.Command），例如 chongming-task-web 的 ``web``。"""

# 由可选发行包提供的子命令：没装时给出确切的 pip 命令，而不是一句"没有这个命令"。
OPTIONAL_COMMANDS = {"web": ("chongming-task-web", "chongming-task[web]")}


class ConsoleCommand(click.Command):
    """子命令：帮助选项的说明也用中文。"""

    def get_help_option(self, ctx: click.Context) -> click.Option | None:
        option = super().get_help_option(ctx)
        if option is not None:
            option.help = "显示帮助并退出。"
        return option


class ConsoleGroup(click.Group):
    """把 click 的退出方式换成我们的：命令返回退出码；任何错误都是一行中文、退出码 1。

    CliRunner 与 console script 走的都是这个 main()，所以测试看到的就是用户看到的。
    """

    command_class = ConsoleCommand

    def get_help_option(self, ctx: click.Context) -> click.Option | None:
        option = super().get_help_option(ctx)
        if option is not None:
            option.help = "显示帮助并退出。"
        return option

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *(ep.name for ep in entry_points(group=PLUGIN_GROUP))})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """内置命令优先；其次是入口点登记的插件命令（每次现查，不缓存：装/卸插件不必重启什么）。"""
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        for ep in entry_points(group=PLUGIN_GROUP, name=cmd_name):
            loaded = ep.load()
            if isinstance(loaded, click.Command):
                return loaded
        if cmd_name in OPTIONAL_COMMANDS:
            dist, extra = OPTIONAL_COMMANDS[cmd_name]

            def missing() -> None:
                raise CliError(
                    f"子命令 {cmd_name} 由发行包 {dist} 提供，但它没有安装。"
                    f'请运行：pip install {dist}（或 pip install "{extra}"）'
                )

            # 吞下一切参数：用户写的是 `web --db x`，要看到的是安装提示，而不是"没有这个选项"。
            return click.Command(
                cmd_name,
                callback=missing,
                add_help_option=False,
                context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
            )
        return None

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        code = self.run_console(args, prog_name or "chongming-task", complete_var, extra)
        if standalone_mode:
            sys.exit(code)
        return code

    def run_console(
        self, args: Sequence[str] | None, prog_name: str, complete_var: str | None, extra: dict[str, Any]
    ) -> int:
        argv = list(sys.argv[1:] if args is None else args)
        debug = "--debug" in argv
        secrets = _secrets_from_args(argv)
        try:
            result = super().main(
                argv, prog_name=prog_name, complete_var=complete_var, standalone_mode=False, **extra
            )
            return result if isinstance(result, int) else EXIT_OK
        except click.ClickException as exc:
            return _fail(describe_click_error(exc), exc, debug, secrets)
        except click.Abort as exc:
            return _fail("已中断", exc, debug, secrets)
        except CliError as exc:
            return _fail(exc.message, exc, debug, secrets, code=exc.code)
        except TaskError as exc:
            return _fail(str(exc), exc, debug, secrets)
        except Exception as exc:
            message = f"内部错误：{type(exc).__name__}: {exc}"
            if not debug:
                message += "（加 --debug 查看完整堆栈）"
            return _fail(message, exc, debug, secrets)


def _secrets_from_args(argv: list[str]) -> list[str]:
    """报错时要遮盖的口令：取自命令行的 --store 与环境变量。

    出错时命令的 click 上下文可能已经关闭（甚至还没建好），所以直接看原始参数，而不是看解析结果。
    """
    urls = [os.environ.get(ENV_STORE, "")]
    for index, arg in enumerate(argv):
        if arg == "--store" and index + 1 < len(argv):
            urls.append(argv[index + 1])
        elif arg.startswith("--store="):
            urls.append(arg.partition("=")[2])
    return [secret for url in urls for secret in secrets_in(url)]


def _fail(message: str, exc: BaseException, debug: bool, secrets: list[str], code: int = EXIT_FAILED) -> int:
    if debug:
        text = "".join(traceback.format_exception(exc))
        click.echo(mask_secrets(text, secrets), err=True, nl=False)
    # 一行：驱动的报错常带换行与缩进（psycopg 的 "\tIs the server running..."），压成一行再输出。
    one_line = re.sub(r"\s*\n\s*", " ", message.strip())
    click.echo("错误：" + mask_secrets(one_line, secrets), err=True)
    return code


def _from_command_line(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.PROMPT)


@click.group(cls=ConsoleGroup, context_settings=CONTEXT_SETTINGS)
@click.option(
    "--db",
    metavar="PATH",
    envvar=ENV_DB,
    show_envvar=True,
    help="SQLite 数据库文件（--store sqlite:PATH 的简写）。",
)
@click.option(
    "--store",
    "store_url",
    metavar="URL",
    envvar=ENV_STORE,
    show_envvar=True,
    help="存储连接串：sqlite:///abs.db、postgresql://user@host/db、memory://，或插件登记的其他 scheme。",
)
@click.option(
    "--num-buckets",
    type=POSITIVE_INT,
    metavar="N",
    envvar=ENV_NUM_BUCKETS,
    show_envvar=True,
    default=DEFAULT_NUM_BUCKETS,
    show_default=True,
    help="桶数（一旦开始用就不要改，所有节点必须一致）。",
)
@click.option(
    "--owned-buckets",
    "owned_spec",
    metavar="SPEC",
    envvar=ENV_OWNED_BUCKETS,
    show_envvar=True,
    help="本节点负责的桶，如 0-15 或 0-3,8,10-12；限定后 run 必须给 --bucket-key。",
)
@click.option(
    "--owner",
    metavar="NAME",
    envvar=ENV_OWNER,
    show_envvar=True,
    help="本进程的持有者/发起者标识（默认 主机名:pid），写进指令与迁移历史。",
)
@click.option("--json", "as_json", is_flag=True, help="查询命令输出机器可读的 JSON。")
@click.option("--debug", is_flag=True, help="出错时打印完整堆栈，并打开库的调试日志。")
@click.pass_context
def cli(
    ctx: click.Context,
    db: str | None,
    store_url: str | None,
    num_buckets: int,
    owned_spec: str | None,
    owner: str | None,
    as_json: bool,
    debug: bool,
) -> None:
    """chongming-task 命令行控制台：Controller 之上的一层薄适配。

    \b
    退出码：0 成功；1 命令失败；3 命令成功但任务没成功（run 的任务没有落在 succeeded）。
    """
    if db is not None and store_url is not None:
        db_cli, store_cli = _from_command_line(ctx, "db"), _from_command_line(ctx, "store_url")
        if db_cli == store_cli:
            raise CliError("--db 与 --store 只能给一个（--db PATH 就是 --store sqlite:PATH 的简写）")
        # 一个来自命令行、一个来自环境变量：命令行的那个说了算。
        if db_cli:
            store_url = None
        else:
            db = None
    if owner is not None and not owner.strip():
        raise CliError("--owner 不能是空字符串")
    owned: frozenset[int] | None = None
    if owned_spec is not None:
        owned = check_buckets(parse_bucket_spec(owned_spec), owned_spec, num_buckets)
    if debug:
        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    state = AppState(
        db=db,
        store_url=store_url,
        num_buckets=num_buckets,
        owned_buckets=owned,
        owner=owner,
        json=as_json,
        debug=debug,
    )
    ctx.obj = state
    ctx.call_on_close(state.close)


def json_option(fn: F) -> F:
    """命令后面也能写 --json（与全局的 --json 等价），省得用户记位置。"""

    def enable(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
        if value:
            ctx.ensure_object(AppState).json = True

    return click.option(
        "--json", "json_flag", is_flag=True, expose_value=False, callback=enable, help="输出 JSON。"
    )(fn)


pass_state = click.make_pass_decorator(AppState)

__all__ = ["CONTEXT_SETTINGS", "ConsoleGroup", "cli", "json_option", "pass_state"]
