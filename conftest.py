"""仓库级 pytest 配置：Postgres 测试的 DSN 夹具，以及"CI 上 Postgres 测试不许跳过"这条规则。

本地没有数据库时，Postgres 测试照常跳过（开发者不必为了跑单元测试先装一个 PostgreSQL）。
但 CI 必须真的连上数据库：`.ci/run` 设置 ``CHONGMING_REQUIRE_POSTGRES=1``，此时任何本该跳过的
Postgres 测试都改判为失败——否则 DSN 配错、驱动没装、夹具写错，都只会变成一行不起眼的 "s"，
CI 照样变绿。

判定"这是一个 Postgres 测试"的依据（满足其一即可）：

* 测试带 ``@pytest.mark.postgres`` 标记（模块级 ``pytestmark`` 也算）；
* 跳过原因里提到 Postgres / psycopg / ``CHONGMING_TEST_POSTGRES``
  （覆盖 ``unittest.SkipTest`` 与 ``pytest.importorskip("psycopg")`` 这类没有标记的跳过）。

同一条规则挂在两处：用例执行（setup/call/teardown 的报告）与收集（模块级 skip / importorskip
会让整个模块在收集阶段就被跳过，根本走不到用例执行）。xfail 不是跳过，不受影响。

真实浏览器测试（网页控制台，``@pytest.mark.browser``）用同一套规则：本地没有 chromium / playwright
时跳过；``.ci/run`` 设置 ``CHONGMING_REQUIRE_BROWSER=1``，此时跳过即失败。

环境里有 ``PYTHONDONTWRITEBYTECODE`` 时，会话开始前把仓库自己的源码编译成 .pyc（``_compile_bytecode``）。
"""

from __future__ import annotations

import compileall
import os
import re
import sys
from collections.abc import Generator
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

POSTGRES_DSN_ENV = "CHONGMING_TEST_POSTGRES"
REQUIRE_POSTGRES_ENV = "CHONGMING_REQUIRE_POSTGRES"

_POSTGRES_REASON = re.compile(r"postgres|psycopg|CHONGMING_TEST_POSTGRES", re.IGNORECASE)

REQUIRE_BROWSER_ENV = "CHONGMING_REQUIRE_BROWSER"


_ROOT = Path(__file__).resolve().parent
_BYTECODE_DIRS = ("packages", "tests", "tests-contract", "examples")

# 起 Python 子进程的测试共用的工具（tests/support/prefork.py：经预导入的模板进程 fork，省掉每个子进程的
# 解释器启动与导入）。以 --import-mode=importlib 运行时 pytest 不改 sys.path，这里显式放进去。
_SUPPORT = _ROOT / "tests" / "support"
if _SUPPORT.is_dir() and str(_SUPPORT) not in sys.path:
    sys.path.insert(0, str(_SUPPORT))


def _compile_bytecode() -> None:
    """``PYTHONDONTWRITEBYTECODE`` 设置时（CI 与开发机的环境里都可能有），导入系统从不写 .pyc：套件里每个
    子进程（CLI、worker、崩溃矩阵的子进程……上千个）都要把导入的几十个本仓库模块从源码重新编译一遍，
    负载 5 时一次 ``import chongming_task.cli`` 1.9 秒，其中约 1.1 秒是编译；有 .pyc 时 0.8 秒。这里在会话
    开始前显式编译一次（compileall 不受这个变量约束；导入系统照样读已有的 .pyc，按源码的 mtime 与大小判断
    是否过期）。只写进已被 .gitignore 忽略的 __pycache__/，与没设这个变量时导入系统自己写的完全相同；
    源码树只读时编译失败不影响测试（只是慢）。pytester 把本文件复制进临时目录时那里没有这些目录，什么也不做。
    """
    if not sys.dont_write_bytecode:
        return  # 导入系统自己会写 .pyc
    for name in _BYTECODE_DIRS:
        directory = _ROOT / name
        if directory.is_dir():
            compileall.compile_dir(directory, quiet=2)


def pytest_sessionstart(session: pytest.Session) -> None:
    _compile_bytecode()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if "prefork" in sys.modules:  # 用过模板进程才有它；关掉控制 socket，模板随之退出
        sys.modules["prefork"].close_shared_server()


@pytest.fixture(autouse=True)
def _pytester_writes_bytecode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """用 pytester 在子进程里跑 pytest 的测试：子进程不继承 ``PYTHONDONTWRITEBYTECODE``。

    为什么：pytest 给入口点注册的插件（hypothesis 的一百多个模块）做断言改写，改写结果只在允许写字节码时
    缓存；不缓存时每个 pytest 子进程都要重新改写、编译一遍，负载 5 时约 3 秒（占子进程启动的大半）。这些
    测试测的是本仓库的 conftest 钩子，与字节码缓存无关；缓存写进 .venv 与 pytester 的临时目录。"""
    if "pytester" in request.fixturenames:
        monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)


def _required(env: str) -> bool:
    return os.environ.get(env, "").strip() not in ("", "0", "false", "no")


def _postgres_required() -> bool:
    return _required(REQUIRE_POSTGRES_ENV)


def _skip_reason(longrepr: object) -> str:
    # 跳过报告的 longrepr 是 (path, lineno, reason) 三元组；其他情况退回 str()。
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _fail_browser_skip(report: pytest.TestReport | pytest.CollectReport, marked: bool) -> None:
    if not marked or not report.skipped or hasattr(report, "wasxfail") or not _required(REQUIRE_BROWSER_ENV):
        return
    reason = _skip_reason(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (
        f"{REQUIRE_BROWSER_ENV}=1：真实浏览器测试不允许跳过，这里按失败处理。\n"
        f"原跳过原因：{reason}\n"
        "请安装 chromium 与 fonts-noto-cjk（apt-get install -y chromium fonts-noto-cjk），"
        "再 pip install playwright。"
    )


def _fail_instead_of_skip(report: pytest.TestReport | pytest.CollectReport, marked: bool) -> None:
    if not report.skipped or hasattr(report, "wasxfail") or not _postgres_required():
        return
    reason = _skip_reason(report.longrepr)
    if not (marked or _POSTGRES_REASON.search(reason)):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"{REQUIRE_POSTGRES_ENV}=1：Postgres 测试不允许跳过，这里按失败处理。\n"
        f"原跳过原因：{reason}\n"
        f"请设置 {POSTGRES_DSN_ENV}=postgresql://user@host:5432/db 并确认数据库可连、驱动已安装。"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _fail_instead_of_skip(report, marked=item.get_closest_marker("postgres") is not None)
    _fail_browser_skip(report, marked=item.get_closest_marker("browser") is not None)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield
    _fail_instead_of_skip(report, marked=collector.get_closest_marker("postgres") is not None)
    _fail_browser_skip(report, marked=collector.get_closest_marker("browser") is not None)
    return report


@pytest.fixture(scope="session")
def postgres_dsn() -> str:
    """真实 PostgreSQL 的连接串，取自环境变量 CHONGMING_TEST_POSTGRES；没有就跳过。

    在 CI（CHONGMING_REQUIRE_POSTGRES=1）里，这个跳过会被上面的钩子改判为失败。
    """
    dsn = os.environ.get(POSTGRES_DSN_ENV, "").strip()
    if not dsn:
        pytest.skip(f"需要真实 PostgreSQL：请设置 {POSTGRES_DSN_ENV}=postgresql://user@host:5432/db")
    return dsn
