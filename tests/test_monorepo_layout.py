"""单仓多包的结构约束：版本同步（lockstep）、包间钉版本、依赖方向、命名空间文件归属、工具配置覆盖全部成员。

这些约束写在根目录 README.md 的「包地图」与「开发」两节里；这里把它们变成会失败的检查，免得某次改动悄悄破坏。
只读源码树里的 pyproject.toml，不依赖任何已安装的包。

发版时改版本：把 packages/*/pyproject.toml 里的 version 与所有 ``chongming-task-*==X`` 一起改，
这个测试会指出漏改的地方。
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"
UMBRELLA = "chongming-task"
MEMBERS = [
    "chongming-task-core",
    "chongming-task-runtime",
    "chongming-task-store-sqlite",
    "chongming-task-store-postgres",
    "chongming-task-cli",
    "chongming-task-web",
]
ALL = [*MEMBERS, UMBRELLA]

# 允许的内部依赖方向：cli -> runtime -> core，stores -> core。
ALLOWED_INTERNAL = {
    "chongming-task-core": set(),
    "chongming-task-runtime": {"chongming-task-core"},
    "chongming-task-store-sqlite": {"chongming-task-core"},
    "chongming-task-store-postgres": {"chongming-task-core"},
    "chongming-task-cli": {
        "chongming-task-core",
        "chongming-task-runtime",
        "chongming-task-store-sqlite",
        "chongming-task-store-postgres",
    },
    # 网页控制台以 CLI 子命令的形式启动（入口点 chongming_task.cli_commands），所以依赖 cli。
    "chongming-task-web": {
        "chongming-task-core",
        "chongming-task-runtime",
        "chongming-task-store-sqlite",
        "chongming-task-cli",
    },
    UMBRELLA: set(MEMBERS),
}


def load(name: str) -> dict[str, Any]:
    with (PACKAGES / name / "pyproject.toml").open("rb") as fh:
        return tomllib.load(fh)


def all_requirements(project: dict[str, Any]) -> list[Requirement]:
    reqs = [Requirement(r) for r in project.get("dependencies", [])]
    for extra in project.get("optional-dependencies", {}).values():
        reqs.extend(Requirement(r) for r in extra)
    return reqs


def test_package_directories_are_exactly_the_known_set() -> None:
    found = sorted(p.parent.name for p in PACKAGES.glob("*/pyproject.toml"))
    assert found == sorted(ALL)


def test_versions_are_in_lockstep() -> None:
    versions = {name: load(name)["project"]["version"] for name in ALL}
    assert len(set(versions.values())) == 1, f"版本不一致：{versions}"


@pytest.mark.parametrize("name", ALL)
def test_internal_pins_match_the_lockstep_version(name: str) -> None:
    project = load(name)["project"]
    version = project["version"]
    for req in all_requirements(project):
        if req.name.startswith("chongming-task"):
            assert str(req.specifier) == f"=={version}", f"{name}: {req} 必须钉成 =={version}"


@pytest.mark.parametrize("name", ALL)
def test_dependency_direction(name: str) -> None:
    internal = {
        r.name for r in all_requirements(load(name)["project"]) if r.name.startswith("chongming-task")
    }
    assert internal <= ALLOWED_INTERNAL[name], f"{name} 不该依赖 {internal - ALLOWED_INTERNAL[name]}"


def test_core_has_zero_third_party_dependencies() -> None:
    project = load("chongming-task-core")["project"]
    assert project.get("dependencies", []) == []
    assert not project.get("optional-dependencies")


@pytest.mark.parametrize("name", ALL)
def test_common_metadata(name: str) -> None:
    data = load(name)
    project = data["project"]
    assert project["name"] == name
    assert project["requires-python"] == ">=3.11"
    assert data["build-system"]["build-backend"] == "hatchling.build"
    assert (PACKAGES / name / project["readme"]).is_file()
    assert (PACKAGES / name / "tests").is_dir()
    wheel = data["tool"]["hatch"]["build"]["targets"]["wheel"]
    if name == UMBRELLA:
        assert wheel == {"bypass-selection": True}
        assert not (PACKAGES / name / "src").exists(), "伞包不带任何模块"
    else:
        assert wheel["packages"] == ["src/chongming_task"]


def _shipped_files(name: str) -> set[str]:
    src = PACKAGES / name / "src"
    return {
        p.relative_to(src).as_posix()
        for p in src.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith((".pyc", ".pyo"))
    }


def test_only_core_ships_the_namespace_init() -> None:
    owners = [name for name in MEMBERS if "chongming_task/__init__.py" in _shipped_files(name)]
    assert owners in ([], ["chongming-task-core"]), owners
    init = PACKAGES / "chongming-task-core/src/chongming_task/__init__.py"
    if init.exists():
        first_code = next(
            line for line in init.read_text(encoding="utf-8").splitlines() if re.match(r"__path__\s*=", line)
        )
        assert "extend_path" in first_code


def test_no_two_distributions_ship_the_same_file() -> None:
    seen: dict[str, str] = {}
    for name in MEMBERS:
        for rel in _shipped_files(name):
            assert rel not in seen, f"{rel} 同时出现在 {seen[rel]} 和 {name}"
            seen[rel] = name


def test_shared_folders_have_no_init() -> None:
    # chongming_task/stores/ 由多个发行包共同填充（PEP 420），谁都不能给它放 __init__.py。
    for name in MEMBERS:
        assert not (PACKAGES / name / "src/chongming_task/stores/__init__.py").exists(), name


def test_tool_configs_cover_every_member() -> None:
    with (ROOT / "pyproject.toml").open("rb") as fh:
        root = tomllib.load(fh)
    assert "project" not in root, "根目录 pyproject.toml 只放工具配置"
    srcs = [f"packages/{name}/src" for name in MEMBERS]
    assert sorted(root["tool"]["mypy"]["mypy_path"]) == sorted(srcs)
    assert sorted(root["tool"]["ruff"]["src"]) == sorted(srcs)

    with (ROOT / "hatch.toml").open("rb") as fh:
        hatch = tomllib.load(fh)
    env = hatch["envs"]["default"]
    assert env["skip-install"] is True
    assert sorted(env["workspace"]["members"]) == sorted(f"packages/{name}" for name in ALL)

    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for name in ALL:
        assert re.search(rf"packages/{re.escape(name)}\s", makefile), f"Makefile MEMBERS 漏了 {name}"
