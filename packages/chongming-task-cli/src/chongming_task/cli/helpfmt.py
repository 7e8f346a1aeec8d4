"""--help 的排版：按显示宽度折行，不拆开 ASCII 单词。

click 自带的折行用 textwrap：它只在空白处断行，中文句子里没有空白，整句被当成一个"长单词"，放不下时
就从中间硬切——``memory://`` 被切成 ``memor`` / ``y://``（issue 16.12）。而且它按字符数量宽度，中文
占两列，行会超出终端。这里的规则：

* 可以断行的地方：空白处，以及任意两个中文字符之间（中文本来就不靠空格分词）；
* 不可以断开的：一串连续的非空白、非中文字符（选项名、URL、``0-3,8``）——放不下就整个挪到下一行，
  比一行还长时宁可超宽，也不切开；
* 中文的收尾标点（，。）等）不放在行首，开头标点（（「 等）不放在行尾；
* 宽度按 wcwidth 计（中文两列）。
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import click
from wcwidth import wcswidth

# 中日韩文字与全角标点：每个字符都是一个可断行的单位。
_WIDE = "\u2e80-\u9fff\u3000-\u303f\uac00-\ud7af\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef"
_TOKEN = re.compile(rf"\s+|[^\s{_WIDE}]+|[{_WIDE}]")
_NO_LINE_START = frozenset("，。、；：？！）」』】》〉…—,.;:?!)]}%")
_NO_LINE_END = frozenset("（「『【《〈([{")


def _width(text: str) -> int:
    width = wcswidth(text)
    return width if width >= 0 else len(text)


def _units(text: str) -> list[str]:
    """切成不可再分的单位；空白单位用 " " 表示"这里原来有空白"。"""
    units: list[str] = []
    for token in _TOKEN.findall(text):
        if token.isspace():
            if units and units[-1] != " ":
                units.append(" ")
            continue
        if units and units[-1] != " " and (token[0] in _NO_LINE_START or units[-1][-1] in _NO_LINE_END):
            units[-1] += token  # 标点粘在相邻的单位上，一起换行
        else:
            units.append(token)
    while units and units[-1] == " ":
        units.pop()
    return units


def fill(text: str, width: int, initial_indent: str = "", subsequent_indent: str = "") -> list[str]:
    """贪心折行：每行尽量放满，行宽（含缩进）不超过 ``width``（单个放不下的单位除外）。"""
    lines: list[str] = []
    line, used, has_content, space = initial_indent, _width(initial_indent), False, False
    for unit in _units(text):
        if unit == " ":
            space = has_content
            continue
        cost = _width(unit) + (1 if space else 0)
        if has_content and used + cost > width:
            lines.append(line)
            line, used, space = subsequent_indent, _width(subsequent_indent), False
            cost = _width(unit)
        line += (" " if space else "") + unit
        used += cost
        has_content, space = True, False
    if has_content or not lines:
        lines.append(line)
    return lines


def wrap_help(text: str, width: int, initial_indent: str = "", subsequent_indent: str = "") -> str:
    """与 click.formatting.wrap_text(preserve_paragraphs=True) 同样的段落规则，换成上面的折行。

    空行分段；以只含 ``\\b`` 的一行开头的段落原样保留（只加缩进）。
    """
    paragraphs: list[tuple[int, bool, list[str]]] = []
    buffer: list[str] = []
    indent: int | None = None

    def flush() -> None:
        if buffer:
            raw = buffer[0].strip() == "\b"
            paragraphs.append((indent or 0, raw, buffer[1:] if raw else list(buffer)))
            buffer.clear()

    for line in text.expandtabs().splitlines():
        if not line:
            flush()
            indent = None
            continue
        if indent is None:
            stripped = line.lstrip()
            indent = len(line) - len(stripped)
            line = stripped
        buffer.append(line)
    flush()
    rendered: list[str] = []
    for extra, raw, lines in paragraphs:
        first, rest = initial_indent + " " * extra, subsequent_indent + " " * extra
        if raw:
            rendered.append("\n".join(rest + line for line in lines))
        else:
            rendered.append("\n".join(fill(" ".join(lines), width, first, rest)))
    return "\n\n".join(rendered)


class HelpFormatter(click.HelpFormatter):
    """只换掉正文与选项/命令列表的折行；标题、Usage 行沿用 click。"""

    def write_text(self, text: str) -> None:
        indent = " " * self.current_indent
        self.write(wrap_help(text, self.width, indent, indent))
        self.write("\n")

    def write_dl(self, rows: Iterable[tuple[str, str]], col_max: int = 30, col_spacing: int = 2) -> None:
        items = list(rows)
        if not items:
            return
        first_col = min(max(_width(first) for first, _ in items), col_max) + col_spacing
        for first, second in items:
            self.write(" " * self.current_indent + first)
            if not second:
                self.write("\n")
                continue
            if _width(first) <= first_col - col_spacing:
                self.write(" " * (first_col - _width(first)))
            else:
                self.write("\n" + " " * (first_col + self.current_indent))
            text_width = max(self.width - first_col - self.current_indent, 20)
            lines = wrap_help(second, text_width).splitlines() or [""]
            self.write(lines[0] + "\n")
            for line in lines[1:]:
                self.write(" " * (first_col + self.current_indent) + line + "\n")


class Context(click.Context):
    formatter_class = HelpFormatter


__all__ = ["Context", "HelpFormatter", "fill", "wrap_help"]
