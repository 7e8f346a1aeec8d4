"""伞包 chongming-task：core + runtime + sqlite，外加 [postgres] / [cli] / [web] / [all]。"""

from importlib.metadata import distribution

from packaging.requirements import Requirement


def test_umbrella_requirements_and_extras() -> None:
    dist = distribution("chongming-task")
    assert dist.version == "0.1.0"
    assert sorted(dist.metadata.get_all("Provides-Extra") or []) == ["all", "cli", "postgres", "web"]
    requires = {
        (r.name, str(r.specifier), str(r.marker or "")) for r in map(Requirement, dist.requires or [])
    }
    assert requires == {
        ("chongming-task-core", "==0.1.0", ""),
        ("chongming-task-runtime", "==0.1.0", ""),
        ("chongming-task-store-sqlite", "==0.1.0", ""),
        ("chongming-task-store-postgres", "==0.1.0", 'extra == "postgres"'),
        ("chongming-task-cli", "==0.1.0", 'extra == "cli"'),
        ("chongming-task-store-postgres", "==0.1.0", 'extra == "all"'),
        ("chongming-task-cli", "==0.1.0", 'extra == "all"'),
        ("chongming-task-web", "==0.1.0", 'extra == "web"'),
        ("chongming-task-web", "==0.1.0", 'extra == "all"'),
    }
