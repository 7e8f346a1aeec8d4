"""chongming-task-core 的发行元数据：版本、零第三方依赖、入口点。"""

from importlib.metadata import distribution


def test_core_has_no_runtime_dependencies() -> None:
    dist = distribution("chongming-task-core")
    assert dist.version == "0.1.0"
    assert not dist.requires, f"核心包不允许有运行时依赖，却声明了：{dist.requires}"


def test_core_registers_memory_store() -> None:
    eps = {(ep.group, ep.name): ep.value for ep in distribution("chongming-task-core").entry_points}
    assert eps == {
        ("chongming_task.stores", "memory"): "chongming_task.stores.memory:InMemoryTaskStore",
        # pytest 插件（用户指南 §14.4）：只有 pytest 读这个组
        ("pytest11", "chongming_task"): "chongming_task.testing.pytest_plugin",
    }
