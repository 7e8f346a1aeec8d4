"""``open_store(url)``：按连接串的 scheme 找到存储插件。

插件登记在入口点组 ``chongming_task.stores``（scheme → 类）。类若定义了 ``from_url(url, **kwargs)``
就用它解析连接串，否则以 ``cls(url, **kwargs)`` 构造。没有 scheme 的字符串按 SQLite 文件路径处理。
"""

from __future__ import annotations

import importlib
import re
from importlib.metadata import entry_points
from typing import Any, NamedTuple

from chongming_task.errors import ConfigurationError
from chongming_task.storage import TaskStore

ENTRY_POINT_GROUP = "chongming_task.stores"


# 内置后端：scheme → (位置 ``模块:类``, 实现包没装时的安装提示)。位置是源码直接运行（未 pip 安装、
# 没有入口点元数据）时的兜底；一个 scheme 一行，位置与提示不再分两张表各写一遍。
class _Builtin(NamedTuple):
    target: str
    install: str | None = None


_POSTGRES = _Builtin(
    "chongming_task.stores.postgres:PostgresTaskStore", 'pip install "chongming-task[postgres]"'
)
_BUILTIN: dict[str, _Builtin] = {
    "memory": _Builtin("chongming_task.stores.memory:InMemoryTaskStore"),
    "sqlite": _Builtin(
        "chongming_task.stores.sqlite:SqliteTaskStore",
        "pip install chongming-task-store-sqlite（或 pip install chongming-task）",
    ),
    "postgresql": _POSTGRES,
    "postgres": _POSTGRES,
}

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")


def available_schemes() -> dict[str, str]:
    """已登记的 scheme → ``模块:类``（入口点优先，其次内置兜底）。"""
    schemes = {scheme: builtin.target for scheme, builtin in _BUILTIN.items()}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        schemes[ep.name] = ep.value
    return schemes


def installed_schemes() -> list[str]:
    """真正能导入的 scheme（按名字排序）。

    登记表里有、但实现包没装（只装了 core 时的 sqlite / postgres）或它的依赖缺失的不算：报错里列出一个
    随后又说"未安装"的 scheme，只会让人更糊涂（issue 16.10）。只在报错路径上调用：要逐个导入实现。
    """
    usable = []
    for name, target in available_schemes().items():
        try:
            _load(target, name)
        except (ImportError, ConfigurationError, AttributeError):
            continue
        usable.append(name)
    return sorted(usable)


def _load(target: str, scheme: str) -> type[TaskStore]:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # 只有"插件本身没装"才换成安装提示；插件装了但它自己的依赖缺失，原样抛出真实错误。
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            builtin = _BUILTIN.get(scheme)
            hint = (builtin and builtin.install) or "请安装提供该 scheme 的插件包"
            raise ImportError(f"存储 scheme '{scheme}' 的实现 {module_name} 未安装：{hint}") from exc
        raise
    cls = getattr(module, attr)
    if not (isinstance(cls, type) and issubclass(cls, TaskStore)):
        raise ConfigurationError(f"入口点 '{scheme}' 指向的 {target} 不是 TaskStore 的子类")
    return cls


def split_url(url: str) -> tuple[str, str]:
    """返回 (scheme, url)。没有 scheme 的字符串视为 SQLite 文件路径。"""
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError(
            f"存储连接串必须是非空字符串，例如 sqlite:///tmp/tasks.db 或 memory://，收到 {url!r}"
        )
    match = _SCHEME.match(url)
    if match is None:
        return "sqlite", f"sqlite:{url}"
    return match.group(1).lower(), url


def open_store(url: str, **kwargs: Any) -> TaskStore:
    """按连接串打开存储。

    支持 ``memory://``、``sqlite:///绝对路径``、``sqlite:相对路径.db``、裸文件路径、``postgresql://...``，
    以及任何第三方包在入口点里登记的 scheme。
    """
    scheme, url = split_url(url)
    schemes = available_schemes()
    target = schemes.get(scheme)
    if target is None:
        known = ", ".join(installed_schemes()) or "（只有 memory）"
        raise ConfigurationError(
            f"未知的存储 scheme '{scheme}'；已安装、可用的有：{known}（连接串写成 scheme:... 或 scheme://...）"
        )
    cls = _load(target, scheme)
    from_url = getattr(cls, "from_url", None)
    store = from_url(url, **kwargs) if callable(from_url) else cls(url, **kwargs)  # type: ignore[call-arg]
    if not isinstance(store, TaskStore):
        raise ConfigurationError(f"{target}.from_url() 没有返回 TaskStore")
    return store


__all__ = ["ENTRY_POINT_GROUP", "available_schemes", "installed_schemes", "open_store", "split_url"]
