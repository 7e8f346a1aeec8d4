"""章节引用不许悬空：源码、测试与文档里的每个 "§N"、"见 X"、链接锚点都必须指向现存文档的现存标题。

规则（docs/README.md「章节引用的写法」一节写的就是这一份，改规则时两边一起改）：

1. **文档名**：``用户指南`` = docs/user-guide.md，``设计文档`` = docs/design.md，``持久层实现指南`` =
   docs/store-guide.md，``分布式设计说明`` = docs/distributed.md，``命令行控制台`` = docs/cli.md。
   也可以直接写路径（``docs/store-guide.md``、``store-guide.md``）。
2. **§ 归属**：``§`` 属于紧挨在它前面的文档名或路径（中间只能有空白、注释续行的 ``#``、分隔符
   ``、，,/与和及或`` 或同一串里的其他 § 引用），所以 ``用户指南 §2、§2.4、§14`` 三个都属于用户指南。
   前面没有文档名的**裸 §**：在 docs/ 下的文档里指这份文档自己，在其他地方（代码、测试、示例、bench、
   根目录 README）一律指 docs/user-guide.md。
3. **§ 的解析**：``§N`` / ``§N.M`` 必须是那份文档里某个编号标题（``## N.`` / ``### N.M``，代码块里的 ``#``
   行不算）；范围 ``§A–B`` / ``§A–§B`` 的两端都必须存在；标题 ``### 2.16–2.18`` 覆盖其中每个编号。
4. **没有编号的标题**用 ``文档名「标题原文」`` 引用（如 ``命令行控制台「参考」``），标题原文必须逐字存在。
5. **路径**：出现的每个 ``*.md`` 路径都必须存在——相对引用它的文件所在目录、仓库根目录或 docs/ 解析。
6. **Markdown 链接** ``[…](x.md#锚点)``：文件必须存在，锚点必须是该文件某个标题的 GitHub 锚点；链接文字里的
   § 属于链接指向的文档（``[用户指南 §9](user-guide.md#9-持久化与跨进程)``）。
7. docs/ 下的文档里，``第 N 节`` 等同于本文档的 ``§N``。

扫描范围：packages/*/src、packages/*/tests、packages/*/README.md、tests、tests-contract、docs、examples、
README.md、bench 下的 .py 与 .md 文件（本文件除外：下面的自测要写故意悬空的引用）。
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC_NAMES = {
    "用户指南": "docs/user-guide.md",
    "设计文档": "docs/design.md",
    "持久层实现指南": "docs/store-guide.md",
    "分布式设计说明": "docs/distributed.md",
    "命令行控制台": "docs/cli.md",
}
DEFAULT_DOC = "docs/user-guide.md"
SCAN = (
    "packages/*/src",
    "packages/*/tests",
    "packages/*/README.md",
    "tests",
    "tests-contract",
    "docs",
    "examples",
    "README.md",
    "bench",
)
SKIP_PARTS = frozenset(
    {".venv", "__pycache__", "build", "dist", ".pytest_cache", ".mypy_cache", ".hypothesis"}
)

_NUM = r"\d+(?:\.\d+)*"
_FENCE = re.compile(r"^\s*(```+|~~~+)")
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_HEADING_NUMBER = re.compile(rf"^({_NUM})(?:\s*[–-]\s*({_NUM}))?\.?(?:\s+|$)")
_LINK = re.compile(r"\[([^\]\n]*)\]\(([^)\s]+)\)")
# 一个 token：文档名 / .md 路径 / § 引用（可带范围）/ 「标题」 / 第 N 节。
_TOKEN = re.compile(
    "|".join(
        [
            "(?P<name>" + "|".join(DOC_NAMES) + ")",
            r"(?P<path>(?<![\w./*-])(?:\.{1,2}/)*[\w./-]*[\w-]\.md)(?![\w-])",
            rf"(?P<sec>§\s*(?P<a>{_NUM})(?:\s*[–-]\s*§?\s*(?P<b>{_NUM}))?)",
            r"(?P<quote>「(?P<title>[^」\n]+)」)",
            rf"(?P<nth>第\s*(?P<n>{_NUM})\s*节)",
        ]
    )
)
# 文档名与它的 § 之间、以及同一串 § 引用之间允许出现的东西。
_CONNECTOR = re.compile(r"^[\s#、，,/与和及或（(]*$")


@dataclass(frozen=True)
class Doc:
    sections: frozenset[str]
    titles: frozenset[str]
    anchors: frozenset[str]


@dataclass
class Ref:
    source: str  # "相对路径:行号"
    text: str
    doc: str | None  # 相对仓库根目录的文档路径；None = 文件不存在
    sections: tuple[str, ...] = ()
    title: str | None = None
    anchor: str | None = None
    problems: list[str] = field(default_factory=list)


def github_anchor(heading: str) -> str:
    """GitHub 给标题生成的锚点：小写，去掉标点（保留字母、数字、下划线、连字符与空格），空格变连字符。"""
    text = heading.strip().lower().replace("`", "")
    text = "".join(ch for ch in text if ch.isalnum() or ch in " _-")
    return text.replace(" ", "-")


def _expand(first: str, last: str | None) -> list[str]:
    """``2.16–2.18`` → 2.16、2.17、2.18；只展开最后一级。"""
    if last is None:
        return [first]
    head, _, start = first.rpartition(".")
    end = last.rpartition(".")[2]
    if not (start.isdigit() and end.isdigit()) or int(end) < int(start):
        return [first, last]
    prefix = f"{head}." if head else ""
    return [f"{prefix}{n}" for n in range(int(start), int(end) + 1)]


def parse_doc(text: str) -> Doc:
    sections: set[str] = set()
    titles: set[str] = set()
    anchors: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        match = _HEADING.match(line)
        if match is None:
            continue
        heading = match.group(2)
        anchors.add(github_anchor(heading))
        number = _HEADING_NUMBER.match(heading)
        if number:
            sections.update(_expand(number.group(1), number.group(2)))
            titles.add(heading[number.end() :].strip())
        else:
            titles.add(heading.strip())
    return Doc(frozenset(sections), frozenset(titles), frozenset(anchors))


@cache
def load_doc(relative: str) -> Doc:
    return parse_doc((ROOT / relative).read_text(encoding="utf-8"))


def resolve_path(token: str, source: Path) -> str | None:
    """把 .md 路径解析成相对仓库根目录的路径；找不到返回 None（规则 5）。"""
    path, _, _anchor = token.partition("#")
    if path.startswith("/"):
        # 以 / 开头的是仓库根目录下的路径（例如网址里的 .../blob/main/docs/x.md 的尾巴），不是本机绝对路径。
        path = path.lstrip("/")
    for base in (source.parent, ROOT, ROOT / "docs"):
        candidate = (base / path).resolve()
        if candidate.is_file() and candidate.is_relative_to(ROOT):
            return candidate.relative_to(ROOT).as_posix()
    return None


def _own_doc(source: Path) -> str:
    relative = source.relative_to(ROOT).as_posix()
    if relative.startswith("docs/") and relative.endswith(".md"):
        return relative
    return DEFAULT_DOC


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _scan_span(text: str, start: int, end: int, source: Path, link_doc: str | None) -> Iterator[Ref]:
    """在 text[start:end] 里按规则 1–4、7 找引用。link_doc：链接文字里的 § 默认属于链接指向的文档。"""
    label = source.relative_to(ROOT).as_posix()
    in_docs = label.startswith("docs/") and label.endswith(".md")
    current: str | None = None  # 当前生效的文档（被文档名 / 路径 / 前一个 § 带出来）
    have_current = False
    last_end = start
    for match in _TOKEN.finditer(text, start, end):
        if have_current and not _CONNECTOR.match(text[last_end : match.start()]):
            have_current = False
        last_end = match.end()
        where = f"{label}:{_line_of(text, match.start())}"
        kind = match.lastgroup
        if kind == "name":
            current, have_current = DOC_NAMES[match.group("name")], True
        elif kind == "path":
            token = match.group("path")
            resolved = resolve_path(token, source)
            ref = Ref(where, token, resolved)
            if resolved is None:
                ref.problems.append(f"文件 {token} 不存在")
            yield ref
            current, have_current = resolved, resolved is not None
        elif kind in ("sec", "nth"):
            if kind == "nth" and not in_docs:
                continue
            if have_current:
                doc = current
            else:
                doc = link_doc if link_doc is not None else _own_doc(source)
                current, have_current = doc, True
            if kind == "sec":
                numbers: tuple[str, ...] = tuple(n for n in (match.group("a"), match.group("b")) if n)
            else:
                numbers = (match.group("n"),)
            yield Ref(where, match.group(0), doc, sections=numbers)
        elif kind == "quote":
            if have_current and current is not None:
                yield Ref(where, match.group(0), current, title=match.group("title"))
            have_current = False


def find_refs(text: str, source: Path) -> Iterator[Ref]:
    label = source.relative_to(ROOT).as_posix()
    position = 0
    for link in _LINK.finditer(text):
        yield from _scan_span(text, position, link.start(), source, None)
        target = link.group(2)
        where = f"{label}:{_line_of(text, link.start())}"
        path, hash_, anchor = target.partition("#")
        link_doc: str | None
        if "://" in target or target.startswith("mailto:"):
            link_doc = None
        elif not path and hash_:
            link_doc = source.relative_to(ROOT).as_posix()  # 本文档内的锚点
            yield Ref(where, target, link_doc, anchor=anchor)
        elif path.endswith(".md"):
            # 链接只按 Markdown 的规矩相对本文件解析（渲染出来的页面就是这么跳的）。
            linked = (source.parent / path).resolve()
            link_doc = linked.relative_to(ROOT).as_posix() if linked.is_file() else None
            ref = Ref(where, target, link_doc, anchor=anchor or None)
            if link_doc is None:
                ref.problems.append(f"链接目标 {path} 不存在（相对 {label} 所在目录）")
            yield ref
        else:
            link_doc = None
        if link_doc is not None and link_doc.endswith(".md"):
            # 链接文字里的文档名优先；没有文档名的 § 属于链接目标。
            yield from _scan_span(text, link.start(1), link.end(1), source, link_doc)
        else:
            yield from _scan_span(text, link.start(1), link.end(1), source, None)
        position = link.end()
    yield from _scan_span(text, position, len(text), source, None)


def check(ref: Ref) -> list[str]:
    problems = list(ref.problems)
    if ref.doc is None or not ref.doc.endswith(".md"):
        return problems
    doc = load_doc(ref.doc)
    for number in ref.sections:
        if number not in doc.sections:
            problems.append(f"{ref.doc} 没有编号为 {number} 的标题")
    if ref.title is not None and ref.title not in doc.titles:
        problems.append(f"{ref.doc} 没有标题「{ref.title}」")
    if ref.anchor is not None and ref.anchor not in doc.anchors:
        problems.append(f"{ref.doc} 没有锚点 #{ref.anchor}")
    return problems


def scanned_files() -> list[Path]:
    files: set[Path] = set()
    for pattern in SCAN:
        for top in ROOT.glob(pattern):
            candidates = [top] if top.is_file() else top.rglob("*")
            for path in candidates:
                if path.suffix not in (".py", ".md") or not path.is_file():
                    continue
                if SKIP_PARTS.intersection(path.relative_to(ROOT).parts):
                    continue
                files.add(path)
    files.discard(Path(__file__).resolve())
    return sorted(files)


def all_refs() -> list[Ref]:
    refs: list[Ref] = []
    for path in scanned_files():
        refs.extend(find_refs(path.read_text(encoding="utf-8"), path))
    return refs


def test_every_reference_resolves() -> None:
    broken = [
        f"{ref.source}: {ref.text} → {'；'.join(problems)}" for ref in all_refs() if (problems := check(ref))
    ]
    assert not broken, "悬空的章节引用（规则见 docs/README.md「章节引用的写法」）：\n" + "\n".join(broken)


def test_the_scan_sees_references_everywhere() -> None:
    # 防止扫描范围或正则悄悄失效、变成"什么都没检查也通过"。
    refs = all_refs()
    sections = [ref for ref in refs if ref.sections]
    assert len(sections) >= 60, len(sections)
    places = {ref.source.split("/")[0].split(":")[0] for ref in sections}
    assert {"packages", "docs", "tests", "README.md"} <= places, places
    assert any(ref.source.startswith("packages/") and "/src/" in ref.source for ref in sections)
    assert any(ref.anchor for ref in refs)
    assert any(ref.title for ref in refs)


# -- 自测：规则本身 ------------------------------------------------------------------------------------

CODE = ROOT / "packages" / "chongming-task-core" / "src" / "chongming_task" / "example.py"
DOC = ROOT / "docs" / "distributed.md"


def _problems(text: str, source: Path = CODE) -> list[str]:
    return [problem for ref in find_refs(text, source) for problem in check(ref)]


def _docs_of(text: str, source: Path = CODE) -> list[tuple[str | None, tuple[str, ...]]]:
    return [(ref.doc, ref.sections) for ref in find_refs(text, source) if ref.sections]


def test_doc_name_binds_a_chain_of_sections() -> None:
    assert _docs_of("（用户指南 §2、§2.4、§14）") == [
        ("docs/user-guide.md", ("2",)),
        ("docs/user-guide.md", ("2.4",)),
        ("docs/user-guide.md", ("14",)),
    ]
    assert _docs_of("分布式设计说明 §5；另见 §4.1") == [
        ("docs/distributed.md", ("5",)),
        ("docs/user-guide.md", ("4.1",)),
    ]
    # 注释折行：下一行的 "# " 不打断归属。
    assert _docs_of("# 规则见设计文档\n# §7") == [("docs/design.md", ("7",))]


def test_bare_section_defaults() -> None:
    assert _docs_of("见 §9.5") == [("docs/user-guide.md", ("9.5",))]
    assert _docs_of("见 §5 的检查", DOC) == [("docs/distributed.md", ("5",))]
    assert _docs_of("见第 3 节", DOC) == [("docs/distributed.md", ("3",))]
    assert _docs_of("第 3 节") == []  # 代码里的"第 N 节"不是文档引用


def test_broken_references_are_reported() -> None:
    assert _problems("用户指南 §8.12") == ["docs/user-guide.md 没有编号为 8.12 的标题"]
    assert _problems("分布式设计说明 §11.2–11.3") == [
        "docs/distributed.md 没有编号为 11.2 的标题",
        "docs/distributed.md 没有编号为 11.3 的标题",
    ]
    assert _problems("这些约束写在 ARCHITECTURE.md 里") == ["文件 ARCHITECTURE.md 不存在"]
    assert _problems("命令行控制台「不存在的标题」") == ["docs/cli.md 没有标题「不存在的标题」"]
    assert _problems("[x](user-guide.md#no-such-anchor)", DOC) == [
        "docs/user-guide.md 没有锚点 #no-such-anchor"
    ]
    assert _problems("[x](nope.md)", DOC) == ["链接目标 nope.md 不存在（相对 docs/distributed.md 所在目录）"]


def test_good_references_pass() -> None:
    assert _problems("用户指南 §10、§11.3；持久层实现指南 §2.16–2.18；设计文档 §1–§15") == []
    assert _problems("见 docs/store-guide.md（持久层实现指南）") == []
    assert _problems("命令行控制台「参考」") == []
    assert _problems("[用户指南 §9](user-guide.md#9-持久化与跨进程)", DOC) == []
    assert _problems("缺少字段「租户」") == []  # 前面没有文档名的「」只是引号


def test_link_text_sections_belong_to_the_link_target() -> None:
    refs = [ref for ref in find_refs("[第二节 §2](store-guide.md)", DOC) if ref.sections]
    assert [(ref.doc, ref.sections) for ref in refs] == [("docs/store-guide.md", ("2",))]


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("9. 持久化与跨进程", "9-持久化与跨进程"),
        ("2.1 `create(snapshot, transitions=())`", "21-createsnapshot-transitions"),
    ],
)
def test_github_anchor(heading: str, anchor: str) -> None:
    assert github_anchor(heading) == anchor
