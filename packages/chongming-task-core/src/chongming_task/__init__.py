"""chongming-task：受监督地运行、观察与控制任务。

本文件只由 chongming-task-core 提供。其他发行包（runtime、各存储、cli）向同一个命名空间
添加子模块；``extend_path`` 让分别以可编辑方式安装的多个 ``src/`` 目录合并成一个包。

核心名字在这里直接导入（零第三方依赖）。属于其他发行包的名字经 PEP 562 ``__getattr__``
惰性解析：``import chongming_task`` 从不导入运行时、sqlite3 存储或 psycopg。缺少发行包时
抛出带确切 ``pip install`` 命令的 ImportError；发行包装了但它自己的依赖缺失时，原样抛出
真实错误，不加掩饰。

名单各只写一处：核心名字就是下面直接导入的名字；惰性名字是 ``_LAZY`` 表（名字 → 模块、发行包），
``__getattr__``、``__dir__``、``__all__`` 与安装提示都从它推出。类型检查器看不懂动态名单，所以
``if TYPE_CHECKING:`` 里再静态导入一遍惰性名字——这是唯一的重复，由
``packages/chongming-task-core/tests/test_facade.py`` 核对两边一致。

为什么用 ``X as X`` 形式导入、而不给类型检查器一个静态 ``__all__``：mypy / pyright 对带
``py.typed`` 的包只认 ``__all__`` 或 ``as`` 同名别名这两种显式再导出；一旦看见 ``__all__``，
不在其中的名字一律当私有，那就得把惰性名字再抄一遍进去。运行时的 ``__all__`` 在
``if not TYPE_CHECKING:`` 里按已安装的发行包计算，类型检查器看不见它。
"""

__path__ = __import__("pkgutil").extend_path(__path__, __name__)

import importlib
import types
from typing import TYPE_CHECKING, Any

from chongming_task.clock import Clock as Clock
from chongming_task.clock import SystemClock as SystemClock
from chongming_task.core.state_machine import StateMachine as StateMachine
from chongming_task.errors import AttemptsExhausted as AttemptsExhausted
from chongming_task.errors import CircularDependency as CircularDependency
from chongming_task.errors import ConcurrencyConflict as ConcurrencyConflict
from chongming_task.errors import ConfigurationError as ConfigurationError
from chongming_task.errors import DependencyFailed as DependencyFailed
from chongming_task.errors import DuplicateTaskId as DuplicateTaskId
from chongming_task.errors import InvalidTransition as InvalidTransition
from chongming_task.errors import StoreError as StoreError
from chongming_task.errors import TaskCancelled as TaskCancelled
from chongming_task.errors import TaskError as TaskError
from chongming_task.errors import TaskExecutionError as TaskExecutionError
from chongming_task.errors import TaskNotFound as TaskNotFound
from chongming_task.errors import TaskTimeout as TaskTimeout
from chongming_task.models import Failure as Failure
from chongming_task.models import FailureKind as FailureKind
from chongming_task.models import Outcome as Outcome
from chongming_task.models import Progress as Progress
from chongming_task.models import TaskSnapshot as TaskSnapshot
from chongming_task.models import Transition as Transition
from chongming_task.policies import AggregationPolicy as AggregationPolicy
from chongming_task.policies import BucketPolicy as BucketPolicy
from chongming_task.policies import ConcurrencyPolicy as ConcurrencyPolicy
from chongming_task.policies import ExponentialBackoff as ExponentialBackoff
from chongming_task.policies import FixedBackoff as FixedBackoff
from chongming_task.policies import Jitter as Jitter
from chongming_task.policies import JoinMode as JoinMode
from chongming_task.policies import RetryPolicy as RetryPolicy
from chongming_task.policies import Timeout as Timeout
from chongming_task.states import TERMINAL_STATUSES as TERMINAL_STATUSES
from chongming_task.states import TRANSITIONS as TRANSITIONS
from chongming_task.states import TaskStatus as TaskStatus
from chongming_task.storage import Command as Command
from chongming_task.storage import CommandAction as CommandAction
from chongming_task.storage import NodeRecord as NodeRecord
from chongming_task.storage import QueryOrder as QueryOrder
from chongming_task.storage import TaskQuery as TaskQuery
from chongming_task.storage import TaskStats as TaskStats
from chongming_task.storage import TaskStore as TaskStore
from chongming_task.store_registry import open_store as open_store

# 到这里为止导入的公开名字就是核心名单：它们随 core 发布，星号导入总是带上。不算在内的：
# 门面自己用的 typing 辅助名字，以及导入子模块时 Python 顺手挂到包上的子模块（clock、errors……）。
_CORE_NAMES = tuple(
    sorted(
        name
        for name, value in globals().items()
        if not name.startswith("_")
        and name not in {"TYPE_CHECKING", "Any"}
        and not isinstance(value, types.ModuleType)
    )
)

from chongming_task.core.version import __version__ as __version__  # noqa: E402  (one home for the version)

_CORE = "chongming-task-core"
_RUNTIME = "chongming-task-runtime"
_SQLITE = "chongming-task-store-sqlite"
_POSTGRES = "chongming-task-store-postgres"

# 发行包 → 缺少它时给用户的安装命令。
_INSTALL_HINTS: dict[str, str] = {
    _CORE: "pip install chongming-task-core",
    _RUNTIME: "pip install chongming-task-runtime（或 pip install chongming-task）",
    _SQLITE: "pip install chongming-task-store-sqlite（或 pip install chongming-task）",
    # Postgres 后端要驱动，驱动由 umbrella 的 [postgres] 附加项带上。
    _POSTGRES: 'pip install "chongming-task[postgres]"',
}

# 惰性名字的唯一名单：名字 → (提供它的模块, 提供该模块的发行包)。
_LAZY: dict[str, tuple[str, str]] = {
    "TaskContext": ("chongming_task.context", _CORE),
    "RuntimeContext": ("chongming_task.context", _CORE),
    "task": ("chongming_task.decorators", _CORE),
    "InMemoryTaskStore": ("chongming_task.stores.memory", _CORE),
    "TaskRun": ("chongming_task.run", _RUNTIME),
    "run_task": ("chongming_task.run", _RUNTIME),
    "Controller": ("chongming_task.controller", _RUNTIME),
    "render_table": ("chongming_task.controller", _RUNTIME),
    "Submit": ("chongming_task.controller", _RUNTIME),
    "Pipeline": ("chongming_task.pipeline", _RUNTIME),
    "PipelineRun": ("chongming_task.pipeline", _RUNTIME),
    "InlineExecutor": ("chongming_task.runtime.executors", _RUNTIME),
    "ThreadExecutor": ("chongming_task.runtime.executors", _RUNTIME),
    "ProcessExecutor": ("chongming_task.runtime.executors", _RUNTIME),
    "SqliteTaskStore": ("chongming_task.stores.sqlite", _SQLITE),
    "PostgresTaskStore": ("chongming_task.stores.postgres", _POSTGRES),
}

# PostgresTaskStore 不进星号导入：它依赖可选的驱动，``from chongming_task import *`` 不应因为
# 没装 psycopg 而失败（要用它请显式导入，缺驱动时会得到安装提示）。
_NOT_STARRED = frozenset({"PostgresTaskStore"})

if TYPE_CHECKING:
    # 类型检查器的静态视图（见模块说明）；tests 核对它与 _LAZY 一致。
    from chongming_task.context import RuntimeContext as RuntimeContext
    from chongming_task.context import TaskContext as TaskContext
    from chongming_task.controller import Controller as Controller
    from chongming_task.controller import Submit as Submit
    from chongming_task.controller import render_table as render_table
    from chongming_task.decorators import task as task
    from chongming_task.pipeline import Pipeline as Pipeline
    from chongming_task.pipeline import PipelineRun as PipelineRun
    from chongming_task.run import TaskRun as TaskRun
    from chongming_task.run import run_task as run_task
    from chongming_task.runtime.executors import InlineExecutor as InlineExecutor
    from chongming_task.runtime.executors import ProcessExecutor as ProcessExecutor
    from chongming_task.runtime.executors import ThreadExecutor as ThreadExecutor
    from chongming_task.stores.memory import InMemoryTaskStore as InMemoryTaskStore
    from chongming_task.stores.postgres import PostgresTaskStore as PostgresTaskStore
    from chongming_task.stores.sqlite import SqliteTaskStore as SqliteTaskStore


def __getattr__(name: str) -> Any:
    try:
        module_name, distribution = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'chongming_task' has no attribute {name!r}") from None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise ImportError(
                f"chongming_task.{name} 由发行包 {distribution} 提供，但它没有安装。"
                f"请运行：{_INSTALL_HINTS[distribution]}",
                name=module_name,
            ) from exc
        raise  # 发行包在，但它自己的依赖缺失：抛出真实错误
    value = getattr(module, name)
    globals()[name] = value  # 之后的访问不再经过 __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def _installed_lazy_names() -> list[str]:
    """星号导入只带上已安装发行包的名字（``_NOT_STARRED`` 除外）。"""
    from importlib.util import find_spec

    names = []
    for name, (module_name, _distribution) in _LAZY.items():
        if name in _NOT_STARRED:
            continue
        # 只探测顶层模块（不触发 chongming_task.runtime 包的导入）：runtime 的执行器随 run.py 同包发布。
        probe = "chongming_task.run" if module_name.startswith("chongming_task.runtime") else module_name
        try:
            if find_spec(probe) is not None:
                names.append(name)
        except (ImportError, ValueError):
            continue
    return names


if not TYPE_CHECKING:
    __all__ = sorted([*_CORE_NAMES, *_installed_lazy_names()])
