"""退出码、命令行错误与报错时的口令遮盖。

退出码只有三档（命令行控制台「参考」），脚本靠它判分支：

* 0：命令成功；
* 1：命令本身失败（任务 id 不存在、参数不对、存储连不上、任务名没有登记……）；
* 3：命令成功执行了，但任务没有成功（run 的任务落在 failed / stopped / lost 等终态）。

click 自带的用法错误退出码是 2、消息是英文；这里统一翻成一行中文、退出码 1。

每个错误还带一个稳定的错误码（``ERROR_CODES``，docs/cli.md 的"错误码"一节逐个列出）：``--json`` 模式下
错误以 JSON 对象写在 stderr，脚本按 ``error`` 字段判分支，不必解析中文消息。
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

# 一条错误在终端上的长度上限（含"错误："前缀）。超过的部分（驱动的原始报错、整段建表 SQL……）只在
# --debug 时出现：一屏长的一"行"既读不完，也让日志检索失灵。
MAX_ERROR_CHARS = 300
DEBUG_HINT = "（完整说明加 --debug 查看）"

# 稳定的错误码 → 含义。码一旦发布就不改名（脚本靠它判分支）；新情况加新码。docs/cli.md 里有同样的表，
# 测试核对两边一致。
ERROR_CODES: dict[str, str] = {
    "usage": "命令行写法不对：未知命令或选项、缺参数、参数值不合法（含 nan / inf / 越界的数字）",
    "no_store": "没有指定存储（--db / --store 或对应的环境变量）",
    "store_not_found": "--db 指向的数据库文件不存在，或路径是一个目录",
    "store_unavailable": "存储打不开或连不上（连接串写法不对、数据库没在运行、没有权限……）",
    "store_not_initialized": "存储里没有 chongming-task 的表（别的应用的库、空文件、拼错的 schema）；"
    "只读命令从不建表，要建请用 init",
    "store_damaged": "SQLite 数据库文件损坏（完整性检查没通过）",
    "store_error": "存储在执行命令的过程中出错",
    "task_not_found": "存储里没有这个任务 id",
    "task_finished": "控制命令（stop / pause / resume）的目标任务已经结束",
    "duplicate_task_id": "run 的 --task-id 已被存储里的另一个任务占用",
    "not_registered": "run 的任务名没有被模块的 register(controller) 登记（或是一个模块路径）",
    "module_error": "任务模块找不到、导入出错，或没有 register(controller)",
    "submit_rejected": "run 提交时被拒绝（桶不归本节点、参数不合法……）",
    "retry_rejected": "retry 的目标不是持久任务，或还没结束（只有已结束的持久任务能重跑）",
    "wait_timeout": "--wait 等满了时间，任务仍未到达要等的状态",
    "interrupted": "命令被中断（Ctrl-C）",
    "archive_error": "归档目录不完整或自相矛盾（段缺失、校验和不符、历史有空洞），或另一个归档进程正在用它",
    "configuration": "库拒绝了某个配置",
    "task_error": "库报告的其他错误",
    "internal": "内部错误（请带 --debug 的输出报告问题）",
}


class CliError(Exception):
    """命令失败：打印一行中文到 stderr，按 ``code`` 退出（默认 1）；``error`` 是稳定的错误码。"""

    def __init__(
        self,
        message: str,
        code: int = EXIT_FAILED,
        *,
        error: str = "usage",
        details: dict[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        if error not in ERROR_CODES:  # 码表是对外承诺：不允许在代码里随手造一个没登记的码
            raise ValueError(f"未登记的错误码 {error!r}")
        self.message = message
        self.code = code
        self.error = error
        # --json 时并进错误对象的附加字段（如 task_finished 的 task_id / status），给脚本免去解析消息。
        self.details = dict(details or {})


# libpq 关键字形式的 password=...（带不带引号都算）。这个模式是线性的：以字面量 password 开头，
# 引号内与 \S+ 都只向前扫描一次。
# 不带引号的口令到空白、& （URL 查询参数的分隔）或中文标点为止：我们自己的消息常把它紧接在"："前面。
_KV_PASSWORD = re.compile(
    r"(?P<head>\bpassword\s*=\s*)(?P<pw>'(?:[^'\\]|\\.)*'|[^\s&：，。；）]+)", re.IGNORECASE
)
# 一个 scheme 加 "://"：只在一串 scheme 字符的开头起匹配（否定的后顾断言），所以每串只扫一遍；
# scheme 要"以字母开头"，即这串里有一个字母能当起点。
_SCHEME_SEP = re.compile(r"(?<![A-Za-z0-9+.\-])[0-9+.\-]*[A-Za-z][A-Za-z0-9+.\-]*://")
# 从某个位置起的用户名 / 口令：一个字符类的贪心匹配，不回溯，耗时与匹配长度成正比。
_USER_PART = re.compile(r"[^:/@\s]*")
_PASSWORD_PART = re.compile(r"[^@\s]*")


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
    text = _mask_url_passwords(text)
    return _KV_PASSWORD.sub(lambda m: f"{m.group('head')}***", text)


def _mask_url_passwords(text: str) -> str:
    """``scheme://user:password@`` 里的 password → ``***``，线性时间。

    以前用一个正则 ``[A-Za-z][A-Za-z0-9+.-]*://[^:/@\\s]*:[^@\\s]+@``：它在每个起点都把 scheme 与口令
    扫到底再回溯，100 KB 的连接串要跑 30 秒以上（issue 22.9）。这里每个字符至多被看常数次：

    * 候选的 ``scheme://`` 只在一串 scheme 字符的开头起匹配（``_SCHEME_SEP``），每串只扫一遍；
    * 往后看用户名（一个字符类的贪心匹配），遇到 ``:`` 才有口令；口令扫到 ``@`` 或空白为止；
    * 没找到 ``@`` 时，跳过口令扫描已经走过的部分：那里面的 ``://`` 的口令也会停在同一处，结果相同
      （与旧正则的结果逐字一致，测试用随机串对拍过）。
    """
    out: list[str] = []
    copied = 0  # text[:copied] 已经写进 out
    pos = 0  # 在它之前的 "://" 已经处理过（或者它们的口令扫描停在同一处，结果相同）
    length = len(text)
    for candidate in _SCHEME_SEP.finditer(text):
        sep = candidate.end() - 3
        if sep < pos:
            continue
        user_end = _USER_PART.match(text, sep + 3).end()  # type: ignore[union-attr]
        if user_end >= length or text[user_end] != ":":
            pos = max(user_end, sep + 3)
            continue
        pw_start = user_end + 1
        pw_end = _PASSWORD_PART.match(text, pw_start).end()  # type: ignore[union-attr]
        if pw_end < length and text[pw_end] == "@" and pw_end > pw_start:
            out.append(text[copied:pw_start])
            out.append("***")
            copied = pw_end
            pos = pw_end + 1
        else:
            pos = max(pw_end, pw_start)
    out.append(text[copied:])
    return "".join(out)


def one_line(message: str, *, limit: int = MAX_ERROR_CHARS, prefix: str = "错误：") -> str:
    """把一条（可能多行、可能很长的）消息压成终端上的一行，连前缀不超过 ``limit`` 个字符。

    多行消息（存储的权限说明后面跟着整段建表 SQL）：逐行收下，遇到以冒号结尾、引出一整块细节的行
    （"二选一：""执行下面的 SQL："）或放不下时停止；驱动报错里的 ``LINE 1: ...`` 与 ``^`` 标记行跳过。
    被省略的部分在 --debug 的堆栈里完整可见，这一行以提示结尾，告诉人去哪里看。
    """
    budget = limit - len(prefix)
    lines = [re.sub(r"\s+", " ", line).strip() for line in message.strip().splitlines()]
    # 只有 ^ 的位置标记行后面可能还接着我们自己的收尾（"^）。"）：去掉 ^，留下收尾。
    lines = [line.lstrip("^ ") if line.startswith("^") else line for line in lines]
    lines = [line for line in lines if line and not _DRIVER_NOISE.match(line)]
    kept: list[str] = []
    used = 0
    cut = False
    for index, line in enumerate(lines):
        extra = len(line) + (1 if kept else 0)
        if index > 0 and (kept and kept[-1].endswith(("：", ":"))):
            kept.pop()  # 引出细节块的那一行没有细节就没有意义
            cut = True
            break
        room = budget - len(DEBUG_HINT)
        if used + extra > room:
            if not kept:  # 第一行本身就放不下：截断它
                kept.append(line[: max(room - 1, 0)] + "…")
            else:
                # 放不下的一行多半是"驱动原文。我们的建议。"：建议（句号分隔的最后几句）比原文重要，
                # 能放下就只留它们——"该怎么办"是一条错误最不能丢的部分。
                tail = _fitting_tail(line, room - used - 2)
                if tail:
                    kept.append("…" + tail)
            cut = True
            break
        kept.append(line)
        used += extra
    # 下一行以收尾标点开头（"^）。"去掉 ^ 之后）时直接接上，不插空格。
    text = "".join(
        ("" if not index or line[:1] in "）)。，；" else " ") + line for index, line in enumerate(kept)
    )
    if not cut and len(text) > budget:
        text = text[: budget - len(DEBUG_HINT) - 1] + "…"
        cut = True
    return prefix + text + (DEBUG_HINT if cut else "")


def _fitting_tail(line: str, room: int) -> str:
    """``line`` 按"。"分句后，能放进 ``room`` 个字符的最长句尾（至少一整句），没有则为空串。"""
    sentences = [part for part in re.split(r"(?<=。)", line) if part]
    tail = ""
    for sentence in reversed(sentences[1:]):
        if len(sentence) + len(tail) > room:
            break
        tail = sentence + tail
    return tail.strip()


# psycopg 把出错的 SQL 附在报错后面："LINE 1: CREATE TABLE ..." 与一行只有 ^ 的位置标记。
_DRIVER_NOISE = re.compile(r"^(LINE \d+:|HINT:|DETAIL:|CONTEXT:)")


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
    "ERROR_CODES",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_TASK_NOT_SUCCEEDED",
    "MAX_ERROR_CHARS",
    "CliError",
    "describe_click_error",
    "mask_secrets",
    "one_line",
    "secrets_in",
]
