"""退出码、命令行错误与报错时的口令遮盖。

退出码只有三档（命令行控制台「参考」），脚本靠它判分支：

* 0：命令成功；
* 1：命令本身失败（任务 id 不存在、参数不对、存储连不上、任务名没有登记……）；
* 3：命令成功执行了，但任务没有成功（run 的任务落在 failed / stopped / lost 等终态）。

click 自带的用法错误退出码是 2、消息是英文；这里统一翻成一行中文、退出码 1。
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, unquote, urlsplit

import click

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_TASK_NOT_SUCCEEDED = 3

HELP_HINT = "用 chongming-task --help 或 chongming-task <命令> --help 查看用法"


class CliError(Exception):
    """命令失败：打印一行中文到 stderr，按 ``code`` 退出（默认 1）。"""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


# URL 形式的 user:password@ ——不管是不是我们自己拼出来的连接串，只要长得像就遮住。
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:)(?P<pw>[^@\s]+)@")
# libpq 关键字形式的 password=...（带不带引号都算）。
_KV_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)(?P<pw>'(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def secrets_in(url: str | None) -> list[str]:
    """从存储连接串里取出需要遮盖的口令（URL 里的密码、查询参数 password=）。"""
    if not url:
        return []
    found: list[str] = []
    # 解析不了的连接串（urlsplit 抛 ValueError）：mask_secrets 的正则仍会按模式遮盖。
    with contextlib.suppress(ValueError):
        parts = urlsplit(url)
        if parts.password:
            found.extend({parts.password, unquote(parts.password)})
        for key, value in parse_qsl(parts.query, keep_blank_values=False):
            if key.lower() == "password" and value:
                found.append(value)
    return [secret for secret in found if secret]


def mask_secrets(text: str, secrets: Iterable[str] = ()) -> str:
    """把口令替换成 ***：驱动的报错、我们自己的消息、--debug 的堆栈都要过这一道。"""
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(secret, "***")
    text = _URL_PASSWORD.sub(lambda m: f"{m.group('head')}***@", text)
    return _KV_PASSWORD.sub(lambda m: f"{m.group('head')}***", text)


def describe_click_error(error: click.ClickException) -> str:
    """click 的用法错误 → 一行中文。click 的原文是英文，而且会跨多行带 Usage。"""
    if isinstance(error, click.NoSuchOption):
        message = f"没有这个选项：{error.option_name}"
        if error.possibilities:
            message += f"；你是不是想用 {' / '.join(sorted(error.possibilities))}"
    elif isinstance(error, click.MissingParameter):
        hint = _param_hint(error)
        what = "选项" if isinstance(error.param, click.Option) else "参数"
        message = f"缺少{what} {hint}" if hint else f"缺少{what}"
    elif isinstance(error, click.BadParameter):
        hint = _param_hint(error)
        message = f"{hint} 不合法：{error.message}" if hint else f"参数不合法：{error.message}"
    elif isinstance(error, click.BadOptionUsage):
        message = f"选项 {error.option_name} 用法不对：{_translate(error.message)}"
    elif isinstance(error, click.UsageError):
        message = _translate(error.message)
    else:
        message = error.format_message()
    return f"{message}（{HELP_HINT}）"


def _param_hint(error: click.MissingParameter | click.BadParameter) -> str:
    if error.param_hint is not None:
        hint = error.param_hint
        return " / ".join(hint) if not isinstance(hint, str) else hint
    if error.param is not None:
        if isinstance(error.param, click.Argument):
            return error.param.human_readable_name  # TASK_ID，与 --help 里的写法一致
        return " / ".join(error.param.opts) or (error.param.name or "")
    return ""


_CLICK_MESSAGES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"No such command '(.+)'\."), "没有这个命令：{0}"),
    (re.compile(r"Option '(.+)' requires an argument\."), "选项 {0} 需要一个值"),
    (re.compile(r"Option '(.+)' requires (\d+) arguments\."), "选项 {0} 需要 {1} 个值"),
    (re.compile(r"Got unexpected extra arguments? \((.+)\)"), "多出了参数：{0}"),
    (re.compile(r"Option '(.+)' does not take a value\."), "选项 {0} 不接受值"),
    (re.compile(r"Missing command\."), "缺少命令"),
)


def _translate(message: str) -> str:
    for pattern, template in _CLICK_MESSAGES:
        match = pattern.search(message)
        if match:
            return template.format(*match.groups())
    return message


__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_TASK_NOT_SUCCEEDED",
    "CliError",
    "describe_click_error",
    "mask_secrets",
    "secrets_in",
]
