"""第三方后端范例（examples/third_party_store）跑契约套件，并验证它的入口点登记能被 open_store 找到。

范例不装进共享的开发 venv：这里把它的 src/ 加进 sys.path 直接导入，再把它自带的契约测试类
原样放进本模块，让 pytest 收集——"范例通过契约套件"因此是 make test 的一部分。
"""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

from chongming_task.store_registry import ENTRY_POINT_GROUP, available_schemes, open_store
from chongming_task.testing.store_contract import snap

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "third_party_store"
ENTRY_POINT = "chongming_task_store_jsonfile:JsonFileTaskStore"

if str(EXAMPLE / "src") not in sys.path:
    sys.path.insert(0, str(EXAMPLE / "src"))

from chongming_task_store_jsonfile import JsonFileTaskStore  # noqa: E402


def _load_example_tests() -> type:
    spec = importlib.util.spec_from_file_location(
        "jsonfile_example_contract", EXAMPLE / "tests" / "test_contract.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    test_class: type = module.TestJsonFileStore
    return test_class


# 范例自带的测试类（契约套件 + 它自己的"重开后数据还在"用例），由 pytest 在这里收集。
TestJsonFileStoreExample = _load_example_tests()


def test_example_pyproject_declares_the_entry_point() -> None:
    meta = tomllib.loads((EXAMPLE / "pyproject.toml").read_text(encoding="utf-8"))
    project = meta["project"]
    assert project["name"] == "chongming-task-store-jsonfile"
    assert project["entry-points"][ENTRY_POINT_GROUP] == {"jsonfile": ENTRY_POINT}
    assert any(dep.startswith("chongming-task-core") for dep in project["dependencies"])
    # 第三方模块不许进 chongming_task 命名空间。
    assert meta["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == [
        "src/chongming_task_store_jsonfile"
    ]
    assert not (EXAMPLE / "src" / "chongming_task").exists()


def test_open_store_finds_the_example_through_its_entry_point(tmp_path: Path) -> None:
    """不 pip install：在临时目录里按 pyproject 写一份最小的 dist-info，让 importlib.metadata 看见它。"""
    meta = tomllib.loads((EXAMPLE / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    dist_info = tmp_path / "site" / f"chongming_task_store_jsonfile-{meta['version']}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n", encoding="utf-8"
    )
    lines = [f"[{ENTRY_POINT_GROUP}]"] + [
        f"{k} = {v}" for k, v in meta["entry-points"][ENTRY_POINT_GROUP].items()
    ]
    (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    sys.path.insert(0, str(tmp_path / "site"))
    try:
        assert available_schemes()["jsonfile"] == ENTRY_POINT
        db = tmp_path / "tasks.json"
        store = open_store(f"jsonfile://{db}")
        try:
            assert isinstance(store, JsonFileTaskStore)
            store.create(snap("via-entry-point"))
        finally:
            store.close()
        reopened = open_store(f"jsonfile:{db}")
        try:
            assert reopened.get("via-entry-point") is not None
        finally:
            reopened.close()
    finally:
        sys.path.remove(str(tmp_path / "site"))
    assert "jsonfile" not in available_schemes()
