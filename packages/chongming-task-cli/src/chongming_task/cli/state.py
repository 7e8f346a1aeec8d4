"""全局选项解析后的状态：存储怎么开、Controller 怎么建、任务模块怎么加载。

每个命令都从这里拿东西，因此"存储连不上""模块没有 register()"这类错误只在一处翻译成中文。
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import click

from chongming_task.cli.buckets import format_bucket_spec
from chongming_task.cli.errors import CliError, mask_secrets, secrets_in
from chongming_task.controller import Controller
from chongming_task.errors import TaskError
from chongming_task.storage import TaskStore
from chongming_task.store_registry import open_store

ENV_DB = "CHONGMING_TASK_DB"
ENV_STORE = "CHONGMING_TASK_STORE"
ENV_OWNER = "CHONGMING_TASK_OWNER"
ENV_NUM_BUCKETS = "CHONGMING_TASK_NUM_BUCKETS"
ENV_OWNED_BUCKETS = "CHONGMING_TASK_OWNED_BUCKETS"
ENV_MODULE = "CHONGMING_TASK_MODULE"


@dataclass
class AppState:
    """全局选项（命令行优先于环境变量，已在 app.py 里合并好）。"""

    db: str | None = None
    store_url: str | None = None
    num_buckets: int = 64
    owned_buckets: frozenset[int] | None = None
    owner: str | None = None
    json: bool = False
    debug: bool = False
    _closers: list[Any] = field(default_factory=list)

    # -- 口令遮盖 -------------------------------------------------------------------------------------

    @property
    def secrets(self) -> list[str]:
        return secrets_in(self.store_url)

    def mask(self, text: str) -> str:
        return mask_secrets(text, self.secrets)

    @property
    def store_display(self) -> str:
        """给人看的存储名：SQLite 文件路径，或遮掉口令的连接串。"""
        if self.db is not None:
            return self.db
        return self.mask(self.store_url or "（未指定）")

    @property
    def owned_display(self) -> str:
        return "全部" if self.owned_buckets is None else format_bucket_spec(self.owned_buckets)

    # -- 存储 -----------------------------------------------------------------------------------------

    def open_store(self, *, create: bool = False) -> TaskStore:
        """打开全局选项指定的存储。``create=False`` 时 --db 指向不存在的文件算错：多半是路径写错了，
        静默建一个空库再报"找不到任务"只会把人引向错误的方向。"""
        if self.db is not None:
            path = os.path.abspath(self.db)
            if not create and not os.path.exists(path):
                raise CliError(f"数据库文件 {self.db} 不存在：请检查 --db 路径（run 会在第一次提交时创建它）")
            url = f"sqlite:{path}"
        elif self.store_url is not None:
            url = self.store_url
        else:
            raise CliError(
                f"没有指定存储：请用 --db tasks.db 或 --store URL（也可以设环境变量 {ENV_DB} / {ENV_STORE}）"
            )
        try:
            store = open_store(url)
        except (TaskError, ImportError, OSError) as exc:
            raise CliError(self.mask(f"无法打开存储 {self.store_display}：{exc}")) from exc
        self._closers.append(store.close)
        return store

    def has_store(self) -> bool:
        return self.db is not None or self.store_url is not None

    # -- Controller ---------------------------------------------------------------------------------

    def controller(
        self, store: TaskStore | None, *, claim_buckets: bool = False, executor: Any = None
    ) -> Controller:
        """建一个 Controller。

        ``claim_buckets``：把 --owned-buckets 交给 Controller。声明了归属的 Controller 从构造起就按桶
        认领指令（§9.6），这正是 run（任务的持有者）要的；纯查询/控制命令不该这样——它会先抢到
        自己刚写下的 stop 指令再交还，平白让真正的持有者多等一轮轮询。reconcile 也要归属：它只清理
        本节点的桶。
        """
        try:
            controller = Controller(
                store=store,
                owner=self.owner,
                num_buckets=self.num_buckets,
                owned_buckets=self.owned_buckets if claim_buckets else None,
                executor=executor,
            )
        except TaskError as exc:
            raise CliError(self.mask(str(exc))) from exc
        # 先关 Controller（停任务、追平存储）再关存储：_closers 逆序执行。
        self._closers.append(lambda: controller.close(reason="命令行退出"))
        return controller

    def close(self) -> None:
        """逆序关闭本次命令打开的一切（Controller 先于存储）。"""
        while self._closers:
            closer = self._closers.pop()
            try:
                closer()
            except Exception as exc:  # 收尾失败不该盖掉命令本身的结果，但要让人知道
                click.echo(self.mask(f"收尾时出错（已忽略）：{exc}"), err=True)


def load_task_module(name: str | None) -> ModuleType:
    """按模块名导入任务模块。只接受模块名：任务定义必须来自模块自己的 register(controller)。"""
    if not name:
        raise CliError(
            f"需要 --tasks MODULE（或环境变量 {ENV_MODULE}）：任务定义必须来自模块的 register(controller)"
        )
    if name.endswith(".py") or os.sep in name or "/" in name:
        raise CliError(
            f"--tasks 要的是模块名（例如 myapp.tasks），不是文件路径 {name!r}；"
            "请把模块所在目录放进 PYTHONPATH"
        )
    # 与 python -m 一致：当前目录可导入。console script 的 sys.path[0] 是脚本所在目录，不是当前目录。
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            raise CliError(
                f"找不到任务模块 {name}：请检查模块名，并确认它所在的目录在 PYTHONPATH 里"
            ) from exc
        raise CliError(f"导入任务模块 {name} 时出错：{type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise CliError(f"导入任务模块 {name} 时出错：{type(exc).__name__}: {exc}") from exc


def register_tasks(controller: Controller, module: ModuleType) -> None:
    """调用模块的 register(controller)。没有这个函数就拒绝：CLI 只运行模块明确登记过的名字。"""
    register = getattr(module, "register", None)
    if not callable(register):
        raise CliError(
            f"模块 {module.__name__} 没有 register(controller) 函数：CLI 只运行模块里登记过的任务名，"
            "请在模块里写 def register(controller): controller.register_module(sys.modules[__name__])"
        )
    try:
        register(controller)
    except Exception as exc:
        raise CliError(
            f"模块 {module.__name__} 的 register(controller) 出错：{type(exc).__name__}: {exc}"
        ) from exc


__all__ = [
    "ENV_DB",
    "ENV_MODULE",
    "ENV_NUM_BUCKETS",
    "ENV_OWNED_BUCKETS",
    "ENV_OWNER",
    "ENV_STORE",
    "AppState",
    "load_task_module",
    "register_tasks",
]
