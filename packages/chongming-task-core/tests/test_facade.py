"""门面 ``chongming_task`` 的名单：惰性名字只写在 ``_LAZY`` 一张表里，其余一切由它推出。

只装 core 时的真实安装提示由 tests/test_packaging.py 在干净的 venv 里验证；这里在开发环境里
逐个名字模拟"模块不存在"，并核对类型检查器看到的静态导入与表一致（那是唯一允许的重复）。
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

import chongming_task

FACADE = Path(chongming_task.__file__)


def _type_checking_imports() -> dict[str, str]:
    """``if TYPE_CHECKING:`` 块里静态导入的名字 → 模块。"""
    tree = ast.parse(FACADE.read_text(encoding="utf-8"))
    found: dict[str, str] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Name) and stmt.test.id == "TYPE_CHECKING":
            for node in stmt.body:
                if isinstance(node, ast.ImportFrom) and node.module:
                    for alias in node.names:
                        # 同名别名（X as X）是类型检查器认的显式再导出；别的写法会让名字变成私有。
                        assert alias.asname == alias.name, (
                            f"{alias.name} 必须写成 {alias.name} as {alias.name}"
                        )
                        found[alias.name] = node.module
    return found


def test_type_checking_imports_match_the_lazy_table() -> None:
    lazy = {name: module for name, (module, _distribution) in chongming_task._LAZY.items()}
    assert _type_checking_imports() == lazy


def test_every_lazy_distribution_has_an_install_hint() -> None:
    distributions = {distribution for _module, distribution in chongming_task._LAZY.values()}
    assert distributions <= set(chongming_task._INSTALL_HINTS)
    for hint in chongming_task._INSTALL_HINTS.values():
        assert hint.startswith("pip install "), hint


def test_all_is_core_names_plus_installed_lazy_names() -> None:
    # 开发环境装了全部发行包：星号导入带上除 PostgresTaskStore（可选驱动）以外的全部惰性名字。
    expected = sorted(
        [*chongming_task._CORE_NAMES, *(n for n in chongming_task._LAZY if n != "PostgresTaskStore")]
    )
    assert chongming_task.__all__ == expected
    assert "PostgresTaskStore" not in chongming_task.__all__
    for name in ("TaskStatus", "StateMachine", "TaskStore", "open_store", "TRANSITIONS", "TERMINAL_STATUSES"):
        assert name in chongming_task._CORE_NAMES
    for not_public in ("TYPE_CHECKING", "Any", "importlib", "types", "errors", "clock", "__version__"):
        assert not_public not in chongming_task.__all__


def test_every_name_in_all_resolves() -> None:
    for name in chongming_task.__all__:
        assert getattr(chongming_task, name) is not None, name


def test_dir_lists_lazy_names_before_first_use() -> None:
    listed = dir(chongming_task)
    for name in chongming_task._LAZY:
        assert name in listed


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
        _ = chongming_task.NoSuchThing


@pytest.mark.parametrize("name", sorted(chongming_task._LAZY))
def test_missing_distribution_gives_its_install_hint(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module_name, distribution = chongming_task._LAZY[name]
    # sys.modules 里放 None：之后导入该模块抛 ModuleNotFoundError(name=模块名)，与没装发行包时一样。
    monkeypatch.setitem(sys.modules, module_name, None)
    monkeypatch.delitem(vars(chongming_task), name, raising=False)  # 丢掉之前访问留下的缓存
    with pytest.raises(ImportError) as caught:
        getattr(chongming_task, name)
    message = str(caught.value)
    assert message == (
        f"chongming_task.{name} 由发行包 {distribution} 提供，但它没有安装。"
        f"请运行：{chongming_task._INSTALL_HINTS[distribution]}"
    )
    assert caught.value.name == module_name


def test_missing_dependency_of_an_installed_distribution_is_not_masked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 发行包在、但它自己的依赖缺失：原样抛出真实的 ModuleNotFoundError，不冒充成"没装发行包"。
    real_import = importlib.import_module

    def fake_import(module_name: str, package: str | None = None) -> object:
        if module_name == "chongming_task.stores.postgres":
            raise ModuleNotFoundError("No module named 'psycopg'", name="psycopg")
        return real_import(module_name, package)

    monkeypatch.setattr(chongming_task.importlib, "import_module", fake_import)
    monkeypatch.delitem(vars(chongming_task), "PostgresTaskStore", raising=False)
    with pytest.raises(ModuleNotFoundError) as caught:
        _ = chongming_task.PostgresTaskStore
    assert caught.value.name == "psycopg"
