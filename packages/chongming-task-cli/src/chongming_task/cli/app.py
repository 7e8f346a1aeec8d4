"""命令组与全局选项；错误在这里统一翻成一行中文 + 三档退出码。"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from importlib import metadata
from importlib.metadata import entry_points
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from chongming_task.cli import helpfmt
from chongming_task.cli.buckets import MAX_NUM_BUCKETS, owned_buckets
from chongming_task.cli.errors import (
    EXIT_FAILED,
    EXIT_OK,
    CliError,
    describe_click_error,
    mask_secrets,
    one_line,
    secrets_in,
)
from chongming_task.cli.output import escape_text
from chongming_task.cli.params import IntType
from chongming_task.cli.state import (
    ENV_DB,
    ENV_NUM_BUCKETS,
    ENV_OWNED_BUCKETS,
    ENV_OWNER,
    ENV_STORE,
    AppState,
)
from chongming_task.errors import ConfigurationError, DuplicateTaskId, StoreError, TaskError, TaskNotFound
from chongming_task.policies import DEFAULT_NUM_BUCKETS

F = TypeVar("F", bound=Callable[..., Any])

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 110}

PLUGIN_GROUP = "chongming_task.cli_commands"
"""其他发行包登记子命令的入口点组（名字 → click.Command），例如 chongming-task-web 的 ``web``。"""

# 由可选发行包提供的子命令：没装时给出确切的 pip 命令，而不是一句"没有这个命令"。
OPTIONAL_COMMANDS = {"web": ("chongming-task-web", "chongming-task[web]")}


class ConsoleCommand(click.Command):
    """子命令：帮助选项的说明也用中文；--help 按显示宽度折行（helpfmt）。"""

    context_class = helpfmt.Context

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
    context_class = helpfmt.Context

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
        # 出错时 click 的上下文可能已经关闭（甚至还没建好），所以这两个开关直接看原始参数。
        debug = "--debug" in argv
        as_json = "--json" in argv
        secrets = _secrets_from_args(argv)
        try:
            _refuse_undecodable(argv)
            result = super().main(
                argv, prog_name=prog_name, complete_var=complete_var, standalone_mode=False, **extra
            )
            return result if isinstance(result, int) else EXIT_OK
        except click.ClickException as exc:
            return _fail(describe_click_error(exc), "usage", exc, debug, as_json, secrets)
        except click.Abort as exc:
            return _fail("已中断", "interrupted", exc, debug, as_json, secrets)
        except CliError as exc:
            return _fail(
                exc.message, exc.error, exc, debug, as_json, secrets, code=exc.code, details=exc.details
            )
        except TaskError as exc:
            return _fail(str(exc), _task_error_code(exc), exc, debug, as_json, secrets)
        except Exception as exc:
            message = f"内部错误：{type(exc).__name__}: {exc}"
            if not debug:
                message += "（加 --debug 查看完整堆栈，并请报告这个问题）"
            return _fail(message, "internal", exc, debug, as_json, secrets)


def _task_error_code(exc: TaskError) -> str:
    """库的异常 → 稳定错误码（子类在前）。"""
    if isinstance(exc, DuplicateTaskId):
        return "duplicate_task_id"
    if isinstance(exc, TaskNotFound):
        return "task_not_found"
    if isinstance(exc, ConfigurationError):
        return "configuration"
    if isinstance(exc, StoreError):
        return "store_error"
    return "task_error"


def _refuse_undecodable(argv: list[str]) -> None:
    """命令行参数与我们的环境变量里不是 UTF-8 的字节，在碰任何东西之前拒绝。

    Python 用 surrogateescape 解码 argv：``$'\\xff'`` 变成 ``'\\udcff'`` 这样的孤立代理字符。它进了
    task_id / bucket_key / 标签就编码不出去（写存储时 UnicodeEncodeError，以前报"内部错误"；issue 22.7），
    打印它也会失败。所以只在这一处统一检查，报出是哪个参数。
    """
    named = [(argv[i - 1] if i and argv[i - 1].startswith("-") else None, arg) for i, arg in enumerate(argv)]
    named += [(f"环境变量 {k}", v) for k, v in os.environ.items() if k.startswith("CHONGMING_TASK_")]
    for where, value in named:
        if any("\ud800" <= ch <= "\udfff" for ch in value):
            shown = value.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
            label = f"{where} 的值" if where else "参数"
            raise CliError(
                f"{label} {shown[:60]!r} 含有不是 UTF-8 的字节：命令行参数只能是 UTF-8 文本，"
                "请检查终端或脚本的编码设置（例如 LANG=C.UTF-8）"
            )


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


def _fail(
    message: str,
    error: str,
    exc: BaseException,
    debug: bool,
    as_json: bool,
    secrets: list[str],
    code: int = EXIT_FAILED,
    details: dict[str, object] | None = None,
) -> int:
    """报错：stderr 上恰好一行（≤ 300 个字符，含"错误："前缀），细节只在 --debug 时给。

    ``--json`` 时这一行是一个 JSON 对象 ``{"error": 码, "message": 消息, "exit_code": 退出码}``：
    脚本按稳定的 ``error`` 判分支。消息先遮口令、再转义控制字符（任务数据里的 ESC 不能驱动终端），最后
    才截断——遮盖必须在截断之前，否则口令可能被截成遮不住的半截。
    """
    if debug:
        text = "".join(traceback.format_exception(exc))
        click.echo(escape_text(mask_secrets(text, secrets)), err=True, nl=False)
    cleaned = escape_text(mask_secrets(message, secrets), keep_newlines=True)
    if as_json:
        line = one_line(cleaned, prefix="")
        payload: dict[str, object] = {"error": error, "message": line, "exit_code": code}
        for key, value in (details or {}).items():
            payload.setdefault(key, escape_text(value) if isinstance(value, str) else value)
        click.echo(json.dumps(payload, ensure_ascii=False), err=True)
    else:
        click.echo(one_line(cleaned), err=True)
    return code


def _version_message() -> str:
    """--version：CLI 与它所用的各成员包的版本（lockstep 发布，版本不一致多半是装错了）。"""
    parts = []
    for dist in (
        "chongming-task-cli",
        "chongming-task-core",
        "chongming-task-runtime",
        "chongming-task-store-sqlite",
        "chongming-task-store-postgres",
    ):
        try:
            parts.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{dist}（未安装）")
    return "chongming-task " + parts[0].split()[-1] + "（" + "，".join(parts) + "）"


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    click.echo(_version_message())
    ctx.exit(EXIT_OK)


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
    type=IntType(minimum=1, maximum=MAX_NUM_BUCKETS),
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
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="显示版本并退出。",
)
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
        owned = owned_buckets(owned_spec, num_buckets)
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
