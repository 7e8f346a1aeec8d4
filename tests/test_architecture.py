"""源码模块之间没有导入环，连只给类型检查器看的导入也算。

导入图从 packages/*/src 的源码用 ``ast`` 建出来，不导入任何模块，所以环再绕也不会让测试本身卡住。
计入的边：模块顶层的导入、``if TYPE_CHECKING:`` 里的导入、函数体里的局部导入、``try`` / ``if`` 里的导入——
只要源码里写了 ``import``，就是一条"这个模块知道那个模块"的依赖。类型导入不会在运行时报错，但它一样
说明两个模块互相知道对方的内部，改一边就得看另一边；环一出现，"谁是底层"就说不清了。

边指向被导入的那个模块本身：``from a.b import c`` 在 ``a.b.c`` 是模块时指向 ``a.b.c``，否则指向 ``a.b``；
``import a.b.c`` 指向 ``a.b.c``。导入子模块时 Python 顺带执行父包的 ``__init__``，这一层隐含的关系不算边
（否则每个包与它的子模块都成了环）。

唯一的例外：门面 ``chongming_task/__init__.py`` 的 ``if TYPE_CHECKING:`` 块。它为了让类型检查器看见惰性名字，
静态导入了 runtime 与存储的模块；运行时这些名字由 ``__getattr__`` 按需解析，门面从不导入它们。
这条边属于门面的设计（见它的模块说明），不是分层上的依赖，所以不计入。
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(ROOT.glob("packages/*/src"))
FACADE = "chongming_task"


def _module_name(src: Path, path: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for src in SOURCES:
        for path in src.rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            modules[_module_name(src, path)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _type_checking_imports(tree: ast.Module) -> set[int]:
    """``if TYPE_CHECKING:`` 块里（任意深度）的导入语句，按 id 记。"""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for inner in node.body:
                found.update(
                    id(sub) for sub in ast.walk(inner) if isinstance(sub, ast.Import | ast.ImportFrom)
                )
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(被导入的源码模块, 行号)：模块里每一条导入语句，不论写在哪一层。"""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    skip = _type_checking_imports(tree) if name == FACADE else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{node.module}" if node.module else package
            else:
                base = node.module or ""
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                if candidate in modules:
                    yield candidate, node.lineno
                elif base in modules:
                    yield base, node.lineno


def import_graph() -> dict[str, dict[str, int]]:
    """模块 → {它导入的源码模块: 第一处导入的行号}。"""
    modules = source_modules()
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, path in modules.items():
        for target, line in imports_of(name, path, modules):
            graph[name].setdefault(target, line)
    return graph


def strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan：只返回真正成环的分量（多于一个模块，或模块导入了它自己）。"""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[list[str]] = []
    counter = 0

    def visit(root: str) -> None:
        nonlocal counter
        # 迭代版深度优先，免得大图撞上递归深度上限。
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph[node]:
                    result.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(result)


def shortest_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """分量里经过字典序最小模块的最短环（广度优先），首尾是同一个模块。"""
    members = set(component)
    start = component[0]
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for child in sorted(graph[node]):
                if child not in members:
                    continue
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{component} 不是环")


def describe(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    modules = source_modules()
    hops = []
    for here, there in itertools.pairwise(cycle):
        where = modules[here].relative_to(ROOT).as_posix()
        hops.append(f"    {here} → {there}   ({where}:{graph[here][there]})")
    return "\n".join(hops)


def test_the_graph_covers_every_distribution() -> None:
    # 防止 glob 或解析悄悄失效、变成"没有边也就没有环"。
    graph = import_graph()
    for module in (
        "chongming_task",
        "chongming_task.controller",
        "chongming_task.runtime.controller",
        "chongming_task.stores.sqlite",
        "chongming_task.stores.postgres",
        "chongming_task.cli",
    ):
        assert module in graph, module
    assert sum(len(targets) for targets in graph.values()) > 100
    # 公开模块 chongming_task.controller 只是转出；实现在 runtime/ 里，真实的依赖边在那里。
    assert "chongming_task.runtime.controller" in graph["chongming_task.controller"]
    assert "chongming_task.errors" in graph["chongming_task.runtime.controller"]


def test_no_import_cycle_among_source_modules() -> None:
    graph = import_graph()
    components = strongly_connected(graph)
    report = []
    for component in components:
        cycle = shortest_cycle(graph, component)
        report.append(
            f"环（分量共 {len(component)} 个模块：{', '.join(component)}）：\n{describe(graph, cycle)}"
        )
    assert not components, "源码模块之间有导入环（类型导入、局部导入都算）：\n" + "\n".join(report)


def test_cycle_finder_finds_type_only_and_local_cycles() -> None:
    # 自测：一个纯类型导入的环、一个局部导入的环、一条无环链。
    graph: dict[str, dict[str, int]] = {
        "a": {"b": 1},
        "b": {"a": 5},
        "c": {"d": 1},
        "d": {"e": 2},
        "e": {"c": 3},
        "f": {"a": 1},
        "g": {"g": 1},
    }
    assert strongly_connected(graph) == [["a", "b"], ["c", "d", "e"], ["g"]]
    assert shortest_cycle(graph, ["c", "d", "e"]) == ["c", "d", "e", "c"]
    assert shortest_cycle(graph, ["g"]) == ["g", "g"]


def test_imports_of_counts_type_checking_and_function_local_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import High\n"
    )
    (package / "high.py").write_text("def make():\n    from . import low\n    return low\n")
    modules = {"pkg": package / "__init__.py", "pkg.low": package / "low.py", "pkg.high": package / "high.py"}
    assert list(imports_of("pkg.low", modules["pkg.low"], modules)) == [("pkg.high", 3)]
    assert list(imports_of("pkg.high", modules["pkg.high"], modules)) == [("pkg.low", 2)]
