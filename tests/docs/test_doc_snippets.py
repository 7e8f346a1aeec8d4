"""文档不许与代码漂移：docs/ 里标成可运行的代码块逐块执行，状态转移表由 TRANSITIONS 生成并比对。

约定（写在每份参与检查的文档开头的 HTML 注释里，标记串是 ``doc-snippets: runnable``）：

* ```` ```python ```` 代码块**会被执行**：每块写进一个临时目录里的 snippet.py，用当前解释器在全新子进程里
  运行（cwd = 那个临时目录），必须以 0 退出。块与块之间不共享任何状态，所以每块都要自带 import。
* ```` ```py ```` 是只示意、不执行的 Python 片段（例如需要外部数据库、或只是签名说明）；
  ```` ```text ```` / ```` ```bash ```` 是输出或命令行。

失败时报出文件名与代码块开头的行号。

状态转移表夹在 ``<!-- BEGIN transitions -->`` 与 ``<!-- END transitions -->`` 之间，由本文件从
``chongming_task.states.TRANSITIONS`` 生成；表变了就运行 ``python tests/docs/test_doc_snippets.py --write``
重新生成，不要手改。
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from prefork import python_run

DOCS = Path(__file__).resolve().parents[2] / "docs"
MARKER = "doc-snippets: runnable"
# 这几份文档必须参与检查（不能悄悄去掉标记退出检查）。
REQUIRED = ("README.md", "user-guide.md", "design.md", "distributed.md")
TABLE_BEGIN = "<!-- BEGIN transitions -->"
TABLE_END = "<!-- END transitions -->"
FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)")
SNIPPET_TIMEOUT = 60
# 别的工程师正在写的文档：我们先链上，它们落地之前链接允许暂时悬空（落地之后照常检查）。
PENDING_LINKS = frozenset({"cli.md"})


def checked_docs() -> list[Path]:
    return sorted(p for p in DOCS.glob("*.md") if MARKER in p.read_text(encoding="utf-8")[:2000])


def extract_blocks(text: str, name: str = "?") -> list[tuple[int, str, str]]:
    """(开头行号, 语言, 代码) 列表。行号从 1 起，指向开头的 ``` 那一行。"""
    blocks: list[tuple[int, str, str]] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        fence, language = match.group(1), match.group(2)
        start = index
        body: list[str] = []
        index += 1
        while index < len(lines) and not lines[index].startswith(fence):
            body.append(lines[index])
            index += 1
        if index >= len(lines):
            raise AssertionError(f"docs/{name} 第 {start + 1} 行开始的代码块没有闭合")
        blocks.append((start + 1, language, "\n".join(body) + "\n"))
        index += 1
    return blocks


def runnable_snippets() -> list[tuple[str, int, str]]:
    found: list[tuple[str, int, str]] = []
    for doc in checked_docs():
        for line, language, code in extract_blocks(doc.read_text(encoding="utf-8"), doc.name):
            if language == "python":
                found.append((doc.name, line, code))
    return found


SNIPPETS = runnable_snippets()


@pytest.mark.parametrize(("doc", "line", "code"), SNIPPETS, ids=[f"{d}:{n}" for d, n, _ in SNIPPETS])
def test_snippet_runs(doc: str, line: int, code: str, tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    # 经预导入的模板进程 fork（tests/support/prefork.py），省掉解释器启动与导入。
    result = python_run([str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=SNIPPET_TIMEOUT)
    assert result.returncode == 0, (
        f"docs/{doc} 第 {line} 行开始的 python 代码块运行失败（退出码 {result.returncode}）\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    )


def test_required_docs_opt_in() -> None:
    names = {p.name for p in checked_docs()}
    missing = [name for name in REQUIRED if name not in names]
    assert not missing, f"这些文档缺少 {MARKER!r} 标记（或文件不存在）：{missing}"
    assert len(SNIPPETS) >= 20, "用户指南里的可运行代码块少得可疑：是不是代码块的语言标记写错了？"


def test_fences_use_known_languages() -> None:
    allowed = {"python", "py", "text", "bash", "sql", "toml", "ini", ""}
    for doc in checked_docs():
        for line, language, _ in extract_blocks(doc.read_text(encoding="utf-8"), doc.name):
            assert language in allowed, f"docs/{doc.name} 第 {line} 行：未知的代码块语言 {language!r}"
            assert language != "", (
                f"docs/{doc.name} 第 {line} 行：代码块要写明语言（python / py / text / bash）"
            )


# -- the transition table --------------------------------------------------------------------------


def render_transition_table() -> str:
    from chongming_task.states import TRANSITIONS, TaskStatus

    rows = ["| 从 | 可以到 |", "| --- | --- |"]
    for status in TaskStatus:
        targets = [f"`{s.value}`" for s in TaskStatus if s in TRANSITIONS[status]]
        rows.append(f"| `{status.value}` | {', '.join(targets) if targets else '（终态，没有出边）'} |")
    return "\n".join(rows)


def _split_guide() -> tuple[str, str, str]:
    text = (DOCS / "user-guide.md").read_text(encoding="utf-8")
    assert text.count(TABLE_BEGIN) == 1 and text.count(TABLE_END) == 1, "用户指南里的转移表标记缺失或重复"
    head, rest = text.split(TABLE_BEGIN)
    body, tail = rest.split(TABLE_END)
    return head, body, tail


def test_transition_table_matches_code() -> None:
    _, body, _ = _split_guide()
    assert body.strip() == render_transition_table(), (
        "docs/user-guide.md 里的转移表与 chongming_task.states.TRANSITIONS 不一致；"
        "请运行 python tests/docs/test_doc_snippets.py --write 重新生成"
    )


def test_every_status_is_described() -> None:
    from chongming_task.states import TaskStatus

    text = (DOCS / "user-guide.md").read_text(encoding="utf-8")
    missing = [s.value for s in TaskStatus if f"| `{s.value}` |" not in text.split(TABLE_BEGIN)[0]]
    assert not missing, f"状态一览表里缺少这些状态的说明：{missing}"


def test_relative_links_resolve() -> None:
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
    for doc in checked_docs():
        for target in link.findall(doc.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:") or target in PENDING_LINKS:
                continue
            assert (doc.parent / target).exists(), f"docs/{doc.name} 链接到不存在的 {target}"


def write_transition_table() -> None:
    head, _, tail = _split_guide()
    text = f"{head}{TABLE_BEGIN}\n{render_transition_table()}\n{TABLE_END}{tail}"
    (DOCS / "user-guide.md").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write_transition_table()
        print("已重新生成 docs/user-guide.md 里的状态转移表")
    else:
        print("用法：python tests/docs/test_doc_snippets.py --write")
