"""chongming-task：受监督地运行、观察与控制任务。

本文件只由 chongming-task-core 提供。其他发行包（runtime、各存储、cli）向同一个命名空间
添加子模块；``extend_path`` 让分别以可编辑方式安装的多个 ``src/`` 目录合并成一个包。

核心名字在这里直接导入（零第三方依赖）。属于其他发行包的名字经 PEP 562 ``__getattr__``
惰性解析：``import chongming_task`` 从不导入运行时、sqlite3 存储或 psycopg。缺少发行包时
抛出带确切 ``pip install`` 命令的 ImportError；发行包装了但它自己的依赖缺失时，原样抛出
真实错误，不加掩饰。
"""

__path__ = __import__("pkgutil").extend_path(__path__, __name__)

import importlib
from typing import TYPE_CHECKING, Any

from chongming_task.clock import Clock, SystemClock
from chongming_task.core.state_machine import StateMachine
from chongming_task.core.version import __version__ as __version__
from chongming_task.errors import (
    AttemptsExhausted,
    CircularDependency,
    ConcurrencyConflict,
    ConfigurationError,
    DependencyFailed,
    DuplicateTaskId,
    InvalidTransition,
    StoreError,
    TaskCancelled,
    TaskError,
    TaskExecutionError,
    TaskNotFound,
    TaskTimeout,
)
from chongming_task.models import Failure, FailureKind, Outcome, Progress, TaskSnapshot, Transition
from chongming_task.policies import (
    AggregationPolicy,
    BucketPolicy,
    ConcurrencyPolicy,
    ExponentialBackoff,
    FixedBackoff,
    Jitter,
    JoinMode,
    RetryPolicy,
    Timeout,
)
from chongming_task.states import TERMINAL_STATUSES, TRANSITIONS, TaskStatus
from chongming_task.storage import (
    Command,
    CommandAction,
    NodeRecord,
    QueryOrder,
    TaskQuery,
    TaskStats,
    TaskStore,
)
from chongming_task.store_registry import open_store

if TYPE_CHECKING:
    from chongming_task.context import RuntimeContext, TaskContext
    from chongming_task.controller import Controller, render_table
    from chongming_task.decorators import task
    from chongming_task.pipeline import Pipeline, PipelineRun
    from chongming_task.run import TaskRun, run_task
    from chongming_task.runtime.executors import InlineExecutor, ProcessExecutor, ThreadExecutor
    from chongming_task.stores.memory import InMemoryTaskStore
    from chongming_task.stores.postgres import PostgresTaskStore
    from chongming_task.stores.sqlite import SqliteTaskStore

_CORE = "chongming-task-core"
_RUNTIME = "chongming-task-runtime"

# 名字 → (模块, 提供它的发行包, 安装命令)
_LAZY: dict[str, tuple[str, str, str]] = {
    "TaskContext": ("chongming_task.context", _CORE, "pip install chongming-task-core"),
    "RuntimeContext": ("chongming_task.context", _CORE, "pip install chongming-task-core"),
    "task": ("chongming_task.decorators", _CORE, "pip install chongming-task-core"),
    "InMemoryTaskStore": ("chongming_task.stores.memory", _CORE, "pip install chongming-task-core"),
    "TaskRun": (
        "chongming_task.run",
        _RUNTIME,
        "pip install chongming-task-runtime（或 pip install chongming-task）",
    ),
    "run_task": (
        "chongming_task.run",
        _RUNTIME,
        "pip install chongming-task-runtime（或 pip install chongming-task）",
    ),
    "Controller": (
        "chongming_task.controller",
        _RUNTIME,
        "pip install chongming-task-runtime（或 pip install chongming-task）",
    ),
    "render_table": (
        "chongming_task.controller",
        _RUNTIME,
        "pip install chongming-task-runtime（或 pip install chongming-task）",
    ),
    "Pipeline": (
        "chongming_task.pipeline",
        _RUNTIME,
        "pip install chongming-task-runtime（或 pip install chongming-task）",
    ),
    "PipelineRun": (
        "chongming_task.pipeline",
        _RUNTIME,
        "pip install chongming-task-runtime（或 pip install chongming-task）",
    ),
    "InlineExecutor": (
        "chongming_task.runtime.executors",
        _RUNTIME,
        "pip install chongming-task-runtime（或 pip install chongming-task）",
    ),
    "ThreadExecutor": (
        "chongming_task.runtime.executors",
        _RUNTIME,
        "pip install chongming-task-runtime（或 pip install chongming-task）",
    ),
    "ProcessExecutor": (
        "chongming_task.runtime.executors",
        _RUNTIME,
        "pip install chongming-task-runtime（或 pip install chongming-task）",
    ),
    "SqliteTaskStore": (
        "chongming_task.stores.sqlite",
        "chongming-task-store-sqlite",
        "pip install chongming-task-store-sqlite（或 pip install chongming-task）",
    ),
    "PostgresTaskStore": (
        "chongming_task.stores.postgres",
        "chongming-task-store-postgres",
        'pip install "chongming-task[postgres]"',
    ),
}


def __getattr__(name: str) -> Any:
    try:
        module_name, distribution, hint = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'chongming_task' has no attribute {name!r}") from None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise ImportError(
                f"chongming_task.{name} 由发行包 {distribution} 提供，但它没有安装。请运行：{hint}",
                name=module_name,
            ) from exc
        raise  # 发行包在，但它自己的依赖缺失：抛出真实错误
    value = getattr(module, name)
    globals()[name] = value  # 之后的访问不再经过 __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


_CORE_NAMES = [
    "TERMINAL_STATUSES",
    "TRANSITIONS",
    "AggregationPolicy",
    "AttemptsExhausted",
    "BucketPolicy",
    "CircularDependency",
    "Clock",
    "Command",
    "CommandAction",
    "ConcurrencyConflict",
    "ConcurrencyPolicy",
    "ConfigurationError",
    "DependencyFailed",
    "DuplicateTaskId",
    "ExponentialBackoff",
    "Failure",
    "FailureKind",
    "FixedBackoff",
    "InvalidTransition",
    "Jitter",
    "JoinMode",
    "NodeRecord",
    "Outcome",
    "Progress",
    "QueryOrder",
    "RetryPolicy",
    "StateMachine",
    "StoreError",
    "SystemClock",
    "TaskCancelled",
    "TaskError",
    "TaskExecutionError",
    "TaskNotFound",
    "TaskQuery",
    "TaskSnapshot",
    "TaskStats",
    "TaskStatus",
    "TaskStore",
    "TaskTimeout",
    "Timeout",
    "Transition",
    "open_store",
]


def _installed_lazy_names() -> list[str]:
    """星号导入只带上已安装发行包的名字。

    PostgresTaskStore 永远不在其中：它依赖可选的驱动，``from chongming_task import *`` 不应因为
    没装 psycopg 而失败（要用它请显式导入，缺驱动时会得到安装提示）。
    """
    from importlib.util import find_spec

    names = []
    for name, (module_name, _distribution, _hint) in _LAZY.items():
        if name == "PostgresTaskStore":
            continue
        # 只探测顶层模块（不触发 chongming_task.runtime 包的导入）：runtime 的执行器随 run.py 同包发布。
        probe = "chongming_task.run" if module_name.startswith("chongming_task.runtime") else module_name
        try:
            if find_spec(probe) is not None:
                names.append(name)
        except (ImportError, ValueError):
            continue
    return names


if TYPE_CHECKING:
    # 类型检查器看到完整的静态名单（mypy --strict 据此判断哪些名字是显式导出的）。
    __all__ = [
        "TERMINAL_STATUSES",
        "TRANSITIONS",
        "AggregationPolicy",
        "AttemptsExhausted",
        "BucketPolicy",
        "CircularDependency",
        "Clock",
        "Command",
        "CommandAction",
        "ConcurrencyConflict",
        "ConcurrencyPolicy",
        "ConfigurationError",
        "Controller",
        "DependencyFailed",
        "DuplicateTaskId",
        "ExponentialBackoff",
        "Failure",
        "FailureKind",
        "FixedBackoff",
        "InMemoryTaskStore",
        "InlineExecutor",
        "InvalidTransition",
        "Jitter",
        "JoinMode",
        "NodeRecord",
        "Outcome",
        "Pipeline",
        "PipelineRun",
        "PostgresTaskStore",
        "ProcessExecutor",
        "Progress",
        "QueryOrder",
        "RetryPolicy",
        "RuntimeContext",
        "SqliteTaskStore",
        "StateMachine",
        "StoreError",
        "SystemClock",
        "TaskCancelled",
        "TaskContext",
        "TaskError",
        "TaskExecutionError",
        "TaskNotFound",
        "TaskQuery",
        "TaskRun",
        "TaskSnapshot",
        "TaskStats",
        "TaskStatus",
        "TaskStore",
        "TaskTimeout",
        "ThreadExecutor",
        "Timeout",
        "Transition",
        "open_store",
        "render_table",
        "run_task",
        "task",
    ]
else:
    __all__ = sorted(_CORE_NAMES + _installed_lazy_names())
