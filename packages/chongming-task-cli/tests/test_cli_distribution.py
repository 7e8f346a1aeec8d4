"""chongming-task-cli 的发行元数据：console script 与依赖。"""

from importlib.metadata import distribution


def test_cli_console_script() -> None:
    dist = distribution("chongming-task-cli")
    assert dist.version == "0.1.0"
    scripts = {ep.name: ep.value for ep in dist.entry_points if ep.group == "console_scripts"}
    assert scripts == {"chongming-task": "chongming_task.cli:main"}
    requires = dist.requires or []
    for member in ("core", "runtime", "store-sqlite", "store-postgres"):
        assert f"chongming-task-{member}==0.1.0" in requires
