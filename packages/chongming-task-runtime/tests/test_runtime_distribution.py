"""chongming-task-runtime 的发行元数据。"""

from importlib.metadata import distribution

from packaging.requirements import Requirement


def test_runtime_dependencies() -> None:
    dist = distribution("chongming-task-runtime")
    assert dist.version == "0.1.0"
    names = sorted(Requirement(r).name for r in dist.requires or [])
    assert names == ["chongming-task-core", "tabulate", "wcwidth"]
