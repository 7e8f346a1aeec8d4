"""全局选项解析后的状态：存储怎么开、Controller 怎么建、任务模块怎么加载。

每个命令都从这里拿东西，因此"存储连不上""模块没有 register()"这类错误只在一处翻译成中文。
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sqlite3
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import click

from chongming_task.cli.buckets import format_bucket_spec
from chongming_task.cli.errors import CliError, mask_secrets, secrets_in
from chongming_task.controller import Controller
from chongming_task.core.storage.opening import CreateSchema, SchemaMissing, SchemaPrivilegeError
from chongming_task.errors import TaskError
from chongming_task.storage import TaskStore
from chongming_task.store_registry import open_store, split_url
from chongming_task.stores.sqlite import parse_url as parse_sqlite_url

ENV_DB = "CHONGMING_TASK_DB"
ENV_STORE = "CHONGMING_TASK_STORE"
ENV_OWNER = "CHONGMING_TASK_OWNER"
ENV_NUM_BUCKETS = "CHONGMING_TASK_NUM_BUCKETS"
ENV_OWNED_BUCKETS = "CHONGMING_TASK_OWNED_BUCKETS"
ENV_MODULE = "CHONGMING_TASK_MODULE"

# 报错与输出里显示的存储名最多这么长：100 KB 的连接串原样塞进一行报错，这行就读不了了。
_DISPLAY_LIMIT = 120
# PostgresTaskStore 自己认的连接串参数（libpq 不认识，校验写法前先摘掉）。
_OUR_PG_PARAMS = frozenset(
    {"schema", "min_size", "max_size", "pool_timeout", "connect_timeout", "statement_timeout"}
)
_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
# 不写成 "postgresql://用户:口令@…"：那正是口令遮盖要找的模式，提示本身会被遮成 ***。
_PG_FORMAT = "postgresql://用户@主机:端口/库名?schema=名字（有口令时写成 用户:口令@主机）"


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
        text = self.db if self.db is not None else self.mask(self.store_url or "（未指定）")
        return text if len(text) <= _DISPLAY_LIMIT else text[: _DISPLAY_LIMIT - 1] + "…"

    @property
    def owned_display(self) -> str:
        return "全部" if self.owned_buckets is None else format_bucket_spec(self.owned_buckets)

    # -- 存储 -----------------------------------------------------------------------------------------

    def open_store(
        self, *, create: bool = False, readonly: bool = False, create_schema: CreateSchema | None = None
    ) -> TaskStore:
        """打开全局选项指定的存储。``create=False`` 时 --db 指向不存在的文件算错：多半是路径写错了，
        静默建一个空库再报"找不到任务"只会把人引向错误的方向。

        建不建表（issue 16.5，约定见 ``chongming_task.core.storage.opening``）：``readonly`` ——只读命令
        （ps / status / history / stats / buckets / doctor / reconcile --dry-run）只读打开，绝不改存储；
        不是 ``create`` 的写命令（stop / pause / resume / prune / reconcile）从不建表（``"never"``）；
        ``create``（run）只在新的或空的存储上建表（``"auto"``），库里有别的表就拒绝并提示 init；
        ``create_schema`` 显式给出时优先（init 用 ``"always"``）。

        打开之前先在命令行这一侧把能查的查掉，报出真正的原因（issue 16.13、22.12）：
        路径是目录、Postgres 连接串写法不对（而不是"请确认数据库在运行"）、SQLite 文件已损坏
        （损坏的文件上查询会返回残缺的结果并退出 0，写入会把损坏扩大）。
        """
        if self.db is not None:
            path = os.path.abspath(self.db)
            _refuse_directory(path, f"--db {self.db}")
            if not create and not os.path.exists(path):
                raise CliError(
                    f"数据库文件 {self.db} 不存在：请检查 --db 路径（run 会在第一次提交时创建它）",
                    error="store_not_found",
                )
            url = f"sqlite:{path}"
        elif self.store_url is not None:
            url = self.store_url
        else:
            raise CliError(
                f"没有指定存储：请用 --db tasks.db 或 --store URL（也可以设环境变量 {ENV_DB} / {ENV_STORE}）",
                error="no_store",
            )
        sqlite_path = self._precheck(url)
        if sqlite_path is not None:
            problems = sqlite_integrity(sqlite_path)
            if problems:
                raise CliError(
                    f"数据库文件 {self.store_display} 已损坏（完整性检查：{problems[0][:80]}）："
                    "本命令拒绝在它上面读写，以免给出残缺的结果；请从备份恢复，或用 doctor 查看检查结果",
                    error="store_damaged",
                )
        try:
            store = open_store(
                url, **self._opening(url, create=create, readonly=readonly, mode=create_schema)
            )
        except (SchemaMissing, SchemaPrivilegeError) as exc:
            if exc.ddl:
                exc.add_note(exc.ddl)  # 完整建表 SQL 只在 --debug 的堆栈里出现，不进那一行报错
            error = "store_not_initialized" if isinstance(exc, SchemaMissing) else "store_unavailable"
            raise CliError(self.mask(str(exc)), error=error) from exc
        except (TaskError, ImportError, OSError) as exc:
            raise CliError(
                self.mask(f"无法打开存储 {self.store_display}：{exc}"), error="store_unavailable"
            ) from exc
        self._closers.append(store.close)
        return store

    @staticmethod
    def _opening(url: str, *, create: bool, readonly: bool, mode: CreateSchema | None) -> dict[str, Any]:
        """给内置的 SQLite / Postgres 存储的打开参数。第三方 scheme 与 memory:// 不认识这两个参数，不传。"""
        with contextlib.suppress(TaskError):
            if split_url(url)[0] not in ("sqlite", "postgresql", "postgres"):
                return {}
        if readonly:
            return {"readonly": True}
        return {"create_schema": mode or ("auto" if create else "never")}

    def sqlite_file(self) -> str | None:
        """全局选项指向的 SQLite 文件路径（不是 SQLite 或是 :memory: 时为 None）。"""
        if self.db is not None:
            return os.path.abspath(self.db)
        if self.store_url is None:
            return None
        with contextlib.suppress(TaskError, ValueError):
            scheme, url = split_url(self.store_url)
            if scheme == "sqlite":
                path = parse_sqlite_url(url)
                return None if path == ":memory:" else os.path.abspath(path)
        return None

    def _precheck(self, url: str) -> str | None:
        """打开前的检查；返回要做完整性检查的 SQLite 文件（存在且非空时），否则 None。"""
        try:
            scheme, normalized = split_url(url)
        except TaskError as exc:
            raise CliError(self.mask(str(exc)), error="store_unavailable") from exc
        if scheme in ("postgresql", "postgres"):
            self._check_postgres_url(normalized)
            return None
        if scheme != "sqlite":
            return None
        try:
            path = parse_sqlite_url(normalized)
        except TaskError as exc:
            raise CliError(
                self.mask(f"无法打开存储 {self.store_display}：{exc}"), error="store_unavailable"
            ) from exc
        if path == ":memory:":
            return None
        path = os.path.abspath(path)
        _refuse_directory(path, f"存储 {self.store_display}")
        return path if os.path.isfile(path) and os.path.getsize(path) > 0 else None

    def _check_postgres_url(self, url: str) -> None:
        """Postgres 连接串的写法问题在连接之前说清楚：驱动对它们的报错后面跟着"请确认数据库在运行"，
        把人引向排查服务器，而问题在连接串本身。"""
        reason: str | None = None
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            text = str(exc)
            reason = "IPv6 地址的方括号没有配对" if "IPv6" in text else "端口必须是 1-65535 的数字"
        else:
            query = parse_qsl(parts.query, keep_blank_values=True)
            sslmode = next((v for k, v in query if k == "sslmode"), None)
            if port == 0:
                reason = "端口必须是 1-65535 的数字"
            elif re.search(r"%(?![0-9A-Fa-f]{2})", url):
                reason = "有不完整的百分号转义（% 后面必须是两位十六进制数，口令里的 % 要写成 %25）"
            elif sslmode is not None and sslmode not in _SSLMODES:
                reason = f"sslmode 只能是 {' / '.join(_SSLMODES)}"
            else:
                reason = _libpq_parse_problem(url, parts, query)
        if reason is not None:
            raise CliError(
                f"PostgreSQL 连接串 {self.store_display} 写法不对：{reason}；请按 {_PG_FORMAT} 的格式改正",
                error="store_unavailable",
            )

    def has_store(self) -> bool:
        return self.db is not None or self.store_url is not None

    # -- Controller ---------------------------------------------------------------------------------

    def controller(
        self,
        store: TaskStore | None,
        *,
        claim_buckets: bool = False,
        executor: Any = None,
        close_reason: str = "命令行退出",
        **options: Any,
    ) -> Controller:
        """建一个 Controller。

        ``claim_buckets``：把 --owned-buckets 交给 Controller。声明了归属的 Controller 从构造起就按桶
        认领指令（§9.6），这正是 run（任务的持有者）要的；纯查询/控制命令不该这样——它会先抢到
        自己刚写下的 stop 指令再交还，平白让真正的持有者多等一轮轮询。reconcile 也要归属：它只清理
        本节点的桶。``options``：其余 Controller 参数（worker 的槽位、租约、自己的桶归属）；
        ``close_reason``：命令结束时关 Controller 写下的原因。
        """
        options.setdefault("owned_buckets", self.owned_buckets if claim_buckets else None)
        try:
            controller = Controller(
                store=store, owner=self.owner, num_buckets=self.num_buckets, executor=executor, **options
            )
        except TaskError as exc:
            raise CliError(self.mask(str(exc)), error="configuration") from exc
        # 先关 Controller（停任务、追平存储）再关存储：_closers 逆序执行。
        self._closers.append(lambda: controller.close(reason=close_reason))
        return controller

    def on_close(self, closer: Any) -> None:
        """命令结束时调用 ``closer()``（逆序：后登记的先关）。"""
        self._closers.append(closer)

    def close(self) -> None:
        """逆序关闭本次命令打开的一切（Controller 先于存储）。"""
        while self._closers:
            closer = self._closers.pop()
            try:
                closer()
            except Exception as exc:  # 收尾失败不该盖掉命令本身的结果，但要让人知道
                click.echo(self.mask(f"收尾时出错（已忽略）：{exc}"), err=True)


def _refuse_directory(path: str, what: str) -> None:
    if os.path.isdir(path):
        raise CliError(
            f"{what} 是一个目录，不是数据库文件：请给出文件路径，例如 {os.path.join(path, 'tasks.db')}",
            error="store_not_found",
        )


def _libpq_parse_problem(url: str, parts: Any, query: list[tuple[str, str]]) -> str | None:
    """让 libpq 自己解析一遍（不连接）：未知参数、非法转义这类问题它最清楚。没装驱动就跳过。"""
    try:
        from psycopg import ProgrammingError
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return None
    from urllib.parse import quote, urlencode, urlunsplit

    rest = [(k, v) for k, v in query if k not in _OUR_PG_PARAMS]
    dsn = urlunsplit(parts._replace(query=urlencode(rest, quote_via=quote)))
    try:
        conninfo_to_dict(dsn)
    except ProgrammingError as exc:
        text = str(exc).strip()
        match = re.search(r'invalid URI query parameter: "(.*)"', text)
        if match:
            known = ", ".join(sorted(_OUR_PG_PARAMS))
            return f"不认识的参数 {match.group(1)!r}（本库的参数有 {known}，其余须是 libpq 的连接参数）"
        return f"libpq 无法解析它（{text[:80]}）"
    return None


def sqlite_integrity(path: str, *, full: bool = False) -> list[str]:
    """对 SQLite 文件做完整性检查（只读连接，不改文件）：返回问题列表，空列表表示通过。

    默认 ``PRAGMA quick_check``（O(文件大小)，不核对索引内容，每条命令打开存储前都跑）；``full`` 时
    ``PRAGMA integrity_check``（doctor 用）。只读打开失败（没有读权限、不是 SQLite 文件）时返回空列表：
    那些情况由存储自己报出更准确的原因。
    """
    uri = Path(path).absolute().as_uri() + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=5)
    except sqlite3.Error:
        return []
    try:
        rows = conn.execute("PRAGMA integrity_check(20)" if full else "PRAGMA quick_check(20)").fetchall()
    except sqlite3.DatabaseError as exc:
        # 文件头完好、页面损坏时，连检查本身都可能读不下去：这也是损坏。"不是数据库"交给存储去报。
        text = str(exc)
        return [] if "not a database" in text else [text]
    finally:
        conn.close()
    results = [str(row[0]) for row in rows]
    return [] if results == ["ok"] else results


def load_task_module(name: str | None) -> ModuleType:
    """按模块名导入任务模块。只接受模块名：任务定义必须来自模块自己的 register(controller)。"""
    if not name:
        raise CliError(
            f"需要 --tasks MODULE（或环境变量 {ENV_MODULE}）：任务定义必须来自模块的 register(controller)",
            error="module_error",
        )
    if name.endswith(".py") or os.sep in name or "/" in name:
        raise CliError(
            f"--tasks 要的是模块名（例如 myapp.tasks），不是文件路径 {name!r}；"
            "请把模块所在目录放进 PYTHONPATH",
            error="module_error",
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
                f"找不到任务模块 {name}：请检查模块名，并确认它所在的目录在 PYTHONPATH 里",
                error="module_error",
            ) from exc
        raise CliError(
            f"导入任务模块 {name} 时出错：{type(exc).__name__}: {exc}", error="module_error"
        ) from exc
    except Exception as exc:
        raise CliError(
            f"导入任务模块 {name} 时出错：{type(exc).__name__}: {exc}", error="module_error"
        ) from exc


def register_tasks(controller: Controller, module: ModuleType) -> None:
    """调用模块的 register(controller)。没有这个函数就拒绝：CLI 只运行模块明确登记过的名字。"""
    register = getattr(module, "register", None)
    if not callable(register):
        raise CliError(
            f"模块 {module.__name__} 没有 register(controller) 函数：CLI 只运行模块里登记过的任务名，"
            "请在模块里写 def register(controller): controller.register_module(sys.modules[__name__])",
            error="module_error",
        )
    try:
        register(controller)
    except Exception as exc:
        raise CliError(
            f"模块 {module.__name__} 的 register(controller) 出错：{type(exc).__name__}: {exc}",
            error="module_error",
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
