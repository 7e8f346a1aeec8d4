"""chongming-task-store-sqlite 的发行元数据：只依赖 core，注册 sqlite 方案。"""

from importlib.metadata import distribution


def test_sqlite_store_metadata() -> None:
    dist = distribution("chongming-task-store-sqlite")
    assert dist.version == "0.1.0"
    assert dist.requires == ["chongming-task-core==0.1.0"]
    eps = {ep.group: (ep.name, ep.value) for ep in dist.entry_points}
    assert eps == {"chongming_task.stores": ("sqlite", "chongming_task.stores.sqlite:SqliteTaskStore")}
