"""chongming-task-runtime 的发行元数据。"""

from importlib.metadata import distribution

from packaging.requirements import Requirement


def test_runtime_dependencies() -> None:
    dist = distribution("chongming-task-runtime")
    assert dist.version == "0.1.0"
    requirements = [Requirement(r) for r in dist.requires or []]
    names = sorted(r.name for r in requirements if r.marker is None)
    assert names == ["chongming-task-core", "tabulate", "wcwidth"]
    # 可观测性只是可选 extras（用户指南 §15）：不装它们，runtime 不多拉任何第三方包
    optional = sorted((str(r.marker), r.name) for r in requirements if r.marker is not None)
    assert optional == [('extra == "metrics"', "prometheus-client"), ('extra == "otel"', "opentelemetry-api")]
