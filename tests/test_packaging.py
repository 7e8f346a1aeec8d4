"""发行包是否真的能按承诺被安装和使用——用构建出来的 wheel，而不是开发时的可编辑安装。

每次测试会话只构建一次全部 wheel（含伞包），然后建两个全新的 venv：

* **只装 core**（``pip install --no-index``，不读任何 pip 配置）：``import chongming_task`` 可用、
  状态机能走完一个生命周期、内存存储通过契约套件、取用其他发行包的名字时给出 ``pip install`` 提示，
  并且 venv 里除了 core 之外没有任何第三方包。
* **装全部 wheel**（第三方依赖按开发 venv 里的版本从包索引安装，通常命中 pip 缓存）：
  ``chongming-task --help`` 能跑、``open_store("sqlite:///...")`` 返回可用的存储并通过契约套件、
  ``import chongming_task`` 不会顺带导入运行时 / SQLite / psycopg、门面上的每个名字都能解析。

每项检查是单独的测试函数：某个发行包的代码还没写好时，失败的只是依赖它的那几项，一眼就能看出缺什么。
依赖尚未落地代码的检查在文档字符串里注明了"需要：……"。

运行 ``pytest -m "not packaging"`` 可以在本地快速迭代时跳过这一组（``make test`` 总是包含它们）。
"""

from __future__ import annotations

import email.message
import email.parser
import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"
DISTRIBUTIONS = [
    "chongming-task-core",
    "chongming-task-runtime",
    "chongming-task-store-sqlite",
    "chongming-task-store-postgres",
    "chongming-task-cli",
    "chongming-task-web",
    "chongming-task",
]
# 全量 venv 里第三方依赖钉成与开发 venv 相同的版本：结果可复现，也让 pip 命中本机缓存。
THIRD_PARTY = [
    "starlette",
    "uvicorn",
    "jinja2",
    "markupsafe",
    "anyio",
    "h11",
    "idna",
    "click",
    "tabulate",
    "wcwidth",
    "psycopg",
    "psycopg-binary",
    "psycopg-pool",
    "typing-extensions",
]
TIMEOUT = 600


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False)


def _check(proc: subprocess.CompletedProcess[str], what: str) -> subprocess.CompletedProcess[str]:
    if proc.returncode != 0:
        shown = [arg if len(arg) < 200 else "<脚本>" for arg in map(str, proc.args)]
        pytest.fail(
            f"{what} 失败（退出码 {proc.returncode}）\n命令：{shown}\n"
            f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}",
            pytrace=False,
        )
    return proc


@dataclass(frozen=True)
class Venv:
    root: Path
    workdir: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    def script(self, name: str) -> Path:
        return self.root / "bin" / name

    def python_code(self, code: str, *args: str) -> subprocess.CompletedProcess[str]:
        # -I：隔离模式，不把当前目录放进 sys.path，也不读 PYTHONPATH——只看得到 venv 里装的东西。
        return _run([str(self.python), "-I", "-c", textwrap.dedent(code), *args], cwd=self.workdir)

    def pip(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        # 用开发 venv 里的 pip 操作目标解释器（pip --python），新 venv 不必自带 pip。
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(self.python),
            "--disable-pip-version-check",
            *args,
        ]
        return _run(cmd, cwd=self.workdir, env=env)


def _new_venv(base: Path) -> Venv:
    root = base / "venv"
    work = base / "work"
    work.mkdir(parents=True)
    _check(_run([sys.executable, "-m", "venv", "--without-pip", str(root)], cwd=base), "创建 venv")
    return Venv(root, work)


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """全部发行包的 wheel，每个会话构建一次（--no-isolation：hatchling 取自开发 venv，不需要网络）。"""
    out = tmp_path_factory.mktemp("wheels")
    procs = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "build",
                "--wheel",
                "--no-isolation",
                "--outdir",
                str(out),
                str(PACKAGES / name),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in DISTRIBUTIONS
    }
    failures = []
    for name, proc in procs.items():
        output, _ = proc.communicate(timeout=TIMEOUT)
        if proc.returncode != 0:
            failures.append(f"--- {name} ---\n{output}")
    assert not failures, "构建 wheel 失败：\n" + "\n".join(failures)
    built: dict[str, Path] = {}
    for name in DISTRIBUTIONS:
        (path,) = out.glob(f"{name.replace('-', '_')}-*.whl")
        built[name] = path
    return built


@pytest.fixture(scope="session")
def core_venv(tmp_path_factory: pytest.TempPathFactory, wheels: dict[str, Path]) -> Venv:
    venv = _new_venv(tmp_path_factory.mktemp("core-only"))
    # 不读任何 pip 配置、不连任何索引：core 若声明了任何依赖，这一步就会失败。
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    _check(venv.pip("install", "--no-index", str(wheels["chongming-task-core"]), env=env), "只装 core")
    return venv


@pytest.fixture(scope="session")
def full_venv(tmp_path_factory: pytest.TempPathFactory, wheels: dict[str, Path]) -> Venv:
    base = tmp_path_factory.mktemp("all-wheels")
    venv = _new_venv(base)
    pins = []
    for name in THIRD_PARTY:
        try:
            pins.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    constraints = base / "constraints.txt"
    constraints.write_text("\n".join(pins) + "\n", encoding="utf-8")
    targets = [
        str(wheels[name])
        for name in DISTRIBUTIONS
        if name not in ("chongming-task", "chongming-task-store-postgres")
    ]
    targets.append(f"{wheels['chongming-task-store-postgres']}[binary]")  # 测试机不一定有系统 libpq
    targets.append(f"{wheels['chongming-task']}[all]")  # 伞包与它的 extras 也要能解析
    proc = venv.pip(
        "install", "--find-links", str(wheels["chongming-task-core"].parent), "-c", str(constraints), *targets
    )
    _check(proc, "安装全部 wheel")
    return venv


# ---------------------------------------------------------------------------------------------
# 只看 wheel 内容，不需要 venv
# ---------------------------------------------------------------------------------------------


def _payload(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return {n for n in zf.namelist() if ".dist-info/" not in n}


def test_wheels_never_ship_the_same_file(wheels: dict[str, Path]) -> None:
    owner: dict[str, str] = {}
    for name, wheel in wheels.items():
        for path in _payload(wheel):
            assert path not in owner, f"{path} 同时出现在 {owner[path]} 和 {name} 的 wheel 里"
            owner[path] = name
    assert owner.get("chongming_task/__init__.py") == "chongming-task-core"
    assert "chongming_task/stores/__init__.py" not in owner, "chongming_task/stores/ 是 PEP 420 共享目录"


def test_umbrella_wheel_is_metadata_only(wheels: dict[str, Path]) -> None:
    assert _payload(wheels["chongming-task"]) == set()


def test_every_member_wheel_is_typed(wheels: dict[str, Path]) -> None:
    for name in DISTRIBUTIONS[:-1]:
        assert any(p.endswith("py.typed") for p in _payload(wheels[name])), f"{name} 的 wheel 缺 py.typed"


def _metadata(wheel: Path) -> tuple[email.message.Message, dict[str, bytes]]:
    """wheel 里的 METADATA（解析成头部）与 .dist-info/licenses/ 下的文件。"""
    with zipfile.ZipFile(wheel) as zf:
        (meta_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        meta = email.parser.BytesParser().parsebytes(zf.read(meta_name))
        licenses = {
            n.split(".dist-info/licenses/", 1)[1]: zf.read(n)
            for n in zf.namelist()
            if ".dist-info/licenses/" in n
        }
    return meta, licenses


def test_every_wheel_carries_pypi_metadata(wheels: dict[str, Path]) -> None:
    """许可证（SPDX ``MIT`` + 许可证全文）、分类、指向文档的项目链接：``pip show`` 像一个正常的 PyPI 家族。"""
    license_text = (ROOT / "LICENSE").read_bytes()
    assert b"MIT License" in license_text
    urls_by_dist: dict[str, dict[str, str]] = {}
    for name, wheel in wheels.items():
        assert (PACKAGES / name / "LICENSE").read_bytes() == license_text, f"{name}/LICENSE 与仓库根的不一致"
        meta, licenses = _metadata(wheel)
        assert meta["Name"] == name
        version = tuple(int(part) for part in meta["Metadata-Version"].split("."))
        assert version >= (2, 4), (
            f"{name}：Metadata-Version {meta['Metadata-Version']} 不支持 License-Expression"
        )
        assert meta["License-Expression"] == "MIT", name
        assert meta.get_all("License-File") == ["LICENSE"], name
        assert licenses == {"LICENSE": license_text}, f"{name} 的 wheel 没带许可证全文"
        # PEP 639：有了 License-Expression 就不能再写 License :: 分类
        classifiers = meta.get_all("Classifier") or []
        assert not [c for c in classifiers if c.startswith("License ::")], name
        for required in (
            "Development Status :: 3 - Alpha",
            "Intended Audience :: Developers",
            "Operating System :: OS Independent",
            "Programming Language :: Python :: 3.11",
            "Typing :: Typed",
        ):
            assert required in classifiers, f"{name} 缺分类 {required!r}"
        assert any(c.startswith("Topic :: ") for c in classifiers), name
        assert meta["Summary"] and meta["Author"] and meta["Requires-Python"] == ">=3.11", name
        assert meta["Description-Content-Type"] == "text/markdown" and meta.get_payload().strip(), name
        urls = dict(entry.split(", ", 1) for entry in meta.get_all("Project-URL") or [])
        assert {"Homepage", "Documentation", "User Guide", "Source", "Issues"} <= set(urls), (name, urls)
        assert urls["Documentation"].endswith(".md") and "/docs/" in urls["Documentation"], urls
        assert urls["User Guide"].endswith("/docs/user-guide.md"), urls
        assert urls["Source"].endswith(f"/packages/{name}"), urls
        # 链接指向的文档在仓库里真的存在
        for label in ("Documentation", "User Guide"):
            relative = urls[label].split("/blob/main/", 1)[1]
            assert (ROOT / relative).is_file(), f"{name} 的 {label} 指向不存在的 {relative}"
        urls_by_dist[name] = urls
    homepages = {urls["Homepage"] for urls in urls_by_dist.values()}
    assert len(homepages) == 1, f"六个发行包应指向同一个主页：{homepages}"


# ---------------------------------------------------------------------------------------------
# 只装 core
# ---------------------------------------------------------------------------------------------


def test_core_only_installs_no_third_party_package(core_venv: Venv) -> None:
    proc = _check(
        core_venv.python_code(
            """
            import importlib.metadata, json
            print(json.dumps(sorted(d.metadata["Name"] for d in importlib.metadata.distributions())))
            """
        ),
        "列出发行包",
    )
    assert json.loads(proc.stdout) == ["chongming-task-core"]


def test_core_source_install_pulls_in_nothing_else(tmp_path: Path) -> None:
    """`pip install packages/chongming-task-core` 只会装 core 自己。

    离线解析（--no-index），--ignore-installed 模拟干净环境；构建元数据用开发 venv 里的 hatchling。
    """
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-index"]
    cmd += ["--no-build-isolation", "--disable-pip-version-check", "--quiet", "--report", str(report)]
    _check(
        _run([*cmd, str(PACKAGES / "chongming-task-core")], cwd=tmp_path, env=env),
        "pip install 源码目录（dry-run）",
    )
    installed = [
        item["metadata"]["name"] for item in json.loads(report.read_text(encoding="utf-8"))["install"]
    ]
    assert installed == ["chongming-task-core"]


def test_core_only_import_and_state_machine_lifecycle(core_venv: Venv) -> None:
    """需要：core（StateMachine、TaskStatus、InvalidTransition）。"""
    _check(
        core_venv.python_code(
            """
            import sys
            import chongming_task
            from chongming_task.core.state_machine import StateMachine
            from chongming_task.states import TaskStatus

            assert "site-packages" in chongming_task.__file__, chongming_task.__file__
            machine = StateMachine.create("t1", "抽取", max_attempts=3)
            machine.mark_queued()
            machine.mark_starting(executor="thread")
            machine.mark_running()
            machine.mark_succeeded(outcome={"rows": 42})
            assert machine.status is TaskStatus.SUCCEEDED, machine.status
            path = [(t.from_status, t.to_status) for t in machine.transitions]
            assert path[-1][1] is TaskStatus.SUCCEEDED, path
            try:
                machine.mark_running()
            except chongming_task.InvalidTransition as exc:
                assert "succeeded" in str(exc), exc
            else:
                raise AssertionError("终态之后的 mark_running() 应当抛 InvalidTransition")
            assert chongming_task.StateMachine is StateMachine
            """
        ),
        "状态机生命周期",
    )


CONTRACT_RUNNER = """
import sys
import unittest

from chongming_task.testing import store_contract

target = sys.argv[1]
if target == "memory":
    from chongming_task.stores.memory import InMemoryTaskStore as factory
else:
    import itertools

    from chongming_task import open_store

    counter = itertools.count()

    def factory():
        return open_store(target.format(n=next(counter)))

base = store_contract.StoreContract
bases = (base,) if issubclass(base, unittest.TestCase) else (base, unittest.TestCase)


class TestInstalledStore(*bases):
    def make_store(self):
        return factory()


suite = unittest.defaultTestLoader.loadTestsFromTestCase(TestInstalledStore)
result = unittest.TextTestRunner(stream=sys.stdout, verbosity=1).run(suite)
if result.testsRun == 0:
    print("契约套件一个用例都没跑")
    sys.exit(2)
sys.exit(0 if result.wasSuccessful() else 1)
"""


def test_core_only_memory_store_passes_contract_suite(core_venv: Venv) -> None:
    """需要：core 的 chongming_task.testing.store_contract.StoreContract 与 InMemoryTaskStore。"""
    _check(core_venv.python_code(CONTRACT_RUNNER, "memory"), "内存存储跑契约套件")


def test_core_only_open_store_memory(core_venv: Venv) -> None:
    """需要：core 的 open_store 与 InMemoryTaskStore（经入口点 memory 解析）。"""
    _check(
        core_venv.python_code(
            """
            import chongming_task
            store = chongming_task.open_store("memory://")
            assert isinstance(store, chongming_task.TaskStore), type(store)
            assert type(store).__name__ == "InMemoryTaskStore", type(store)
            assert store.get("nope") is None
            store.close()
            """
        ),
        "open_store('memory://')",
    )


def test_core_only_names_from_other_distributions_raise_install_hint(core_venv: Venv) -> None:
    _check(
        core_venv.python_code(
            """
            import chongming_task

            for name in ["Controller", "run_task", "TaskRun", "Pipeline", "render_table",
                         "ThreadExecutor", "SqliteTaskStore", "PostgresTaskStore"]:
                try:
                    getattr(chongming_task, name)
                except ImportError as exc:
                    assert "pip install" in str(exc), (name, str(exc))
                else:
                    raise AssertionError(f"只装 core 时 chongming_task.{name} 应当抛 ImportError")
            try:
                from chongming_task import Controller  # noqa: F401
            except ImportError as exc:
                assert "pip install" in str(exc), str(exc)
            else:
                raise AssertionError("from chongming_task import Controller 应当抛 ImportError")
            """
        ),
        "安装提示",
    )


# ---------------------------------------------------------------------------------------------
# 装全部 wheel
# ---------------------------------------------------------------------------------------------


def test_all_wheels_dependencies_are_consistent(full_venv: Venv) -> None:
    _check(full_venv.pip("check"), "pip check")


def test_all_wheels_pip_show_looks_like_a_pypi_family(full_venv: Venv) -> None:
    proc = _check(full_venv.pip("show", *DISTRIBUTIONS), "pip show")
    blocks = proc.stdout.split("\n---\n")
    assert len(blocks) == len(DISTRIBUTIONS), proc.stdout
    for block in blocks:
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        assert fields["Name"] in DISTRIBUTIONS, block
        assert fields.get("License-Expression") == "MIT", block
        assert fields.get("Home-page", "").startswith("https://"), block
        assert fields.get("Author") == "chongming-task developers", block
        assert fields.get("Summary"), block


def test_all_wheels_cli_help(full_venv: Venv) -> None:
    """需要：cli 的 chongming_task.cli:main（click 命令组）。"""
    proc = _check(_run([str(full_venv.script("chongming-task")), "--help"], cwd=full_venv.workdir), "--help")
    assert "Usage" in proc.stdout or "用法" in proc.stdout, proc.stdout


def test_all_wheels_import_is_lazy(full_venv: Venv) -> None:
    _check(
        full_venv.python_code(
            """
            import sys
            import chongming_task

            heavy = ["chongming_task.run", "chongming_task.controller", "chongming_task.pipeline",
                     "chongming_task.runtime", "chongming_task.cli", "chongming_task.stores.sqlite",
                     "chongming_task.stores.postgres", "sqlite3", "psycopg", "psycopg_pool",
                     "tabulate", "click"]
            loaded = [m for m in heavy if m in sys.modules]
            assert not loaded, f"import chongming_task 顺带导入了：{loaded}"
            """
        ),
        "惰性导入",
    )


def test_all_wheels_every_public_name_resolves(full_venv: Venv) -> None:
    """需要：全部发行包的代码（runtime、sqlite、postgres 提供的名字）。"""
    _check(
        full_venv.python_code(
            """
            import chongming_task

            missing = []
            for name in chongming_task.__all__:
                try:
                    getattr(chongming_task, name)
                except Exception as exc:
                    missing.append(f"{name}: {type(exc).__name__}: {exc}")
            assert not missing, "\\n".join(missing)
            """
        ),
        "门面名字",
    )


def test_all_wheels_store_entry_points_load(full_venv: Venv) -> None:
    """需要：memory / sqlite / postgres 三个存储实现。"""
    _check(
        full_venv.python_code(
            """
            from importlib.metadata import entry_points
            import chongming_task

            eps = {ep.name: ep for ep in entry_points(group="chongming_task.stores")}
            assert {"memory", "sqlite", "postgresql", "postgres"} <= set(eps), sorted(eps)
            for name, ep in eps.items():
                cls = ep.load()
                assert issubclass(cls, chongming_task.TaskStore), (name, cls)
            """
        ),
        "存储入口点",
    )


def test_all_wheels_open_store_sqlite_returns_working_store(full_venv: Venv) -> None:
    """需要：store-sqlite 的 SqliteTaskStore。"""
    db = full_venv.workdir / "x.db"
    _check(
        full_venv.python_code(
            """
            import sys
            import chongming_task
            from chongming_task import StateMachine

            store = chongming_task.open_store(f"sqlite:///{sys.argv[1]}")
            assert isinstance(store, chongming_task.SqliteTaskStore), type(store)
            machine = StateMachine.create("pkg-1", "打包冒烟")
            store.create(machine.snapshot, machine.transitions)
            got = store.get("pkg-1")
            assert got is not None and got.task_id == "pkg-1", got
            store.close()

            again = chongming_task.open_store(f"sqlite:///{sys.argv[1]}")
            assert again.get("pkg-1") is not None, "重新打开后读不到刚写入的任务"
            again.close()
            """,
            str(db),
        ),
        "open_store('sqlite:///...')",
    )
    assert db.is_file()


def test_all_wheels_sqlite_store_passes_contract_suite(full_venv: Venv) -> None:
    """需要：store-sqlite 的 SqliteTaskStore 与 core 的 StoreContract。"""
    template = str(full_venv.workdir / "contract-{n}.db")
    _check(full_venv.python_code(CONTRACT_RUNNER, f"sqlite:///{template}"), "SQLite 跑契约套件")


@pytest.mark.postgres
def test_all_wheels_open_store_postgres(full_venv: Venv, postgres_dsn: str) -> None:
    """需要：store-postgres 的 PostgresTaskStore，以及真实数据库（CHONGMING_TEST_POSTGRES）。

    用独立的 schema 并在结束后删掉：不在共享的测试库里留下默认 schema。
    """
    psycopg = pytest.importorskip("psycopg", reason="需要 psycopg 才能清理 Postgres 测试 schema")
    schema = f"ct_packaging_{os.getpid()}"
    url = f"{postgres_dsn}{'&' if '?' in postgres_dsn else '?'}schema={schema}"
    try:
        _check(
            full_venv.python_code(
                """
                import sys
                import chongming_task

                store = chongming_task.open_store(sys.argv[1])
                assert isinstance(store, chongming_task.PostgresTaskStore), type(store)
                assert store.get("no-such-task-from-packaging-test") is None
                store.close()
                """,
                url,
            ),
            "open_store('postgresql://...')",
        )
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_web_wheel_ships_templates_and_static_files(wheels: dict[str, Path]) -> None:
    """网页控制台没有构建步骤：模板与手写的 JS/CSS 必须原样进 wheel。"""
    payload = _payload(wheels["chongming-task-web"])
    for name in ("templates/base.html", "templates/tasks.html", "static/console.js", "static/console.css"):
        assert f"chongming_task/web/{name}" in payload, name


def test_all_wheels_web_subcommand_is_discovered(full_venv: Venv) -> None:
    """需要：web 的入口点 chongming_task.cli_commands:web 与它的运行期依赖（starlette、uvicorn、jinja2）。"""
    cli = str(full_venv.script("chongming-task"))
    proc = _check(_run([cli, "web", "--help"], cwd=full_venv.workdir), "web --help")
    assert "运维网页控制台" in proc.stdout, proc.stdout
    _check(
        full_venv.python_code(
            """
            from chongming_task import open_store
            from chongming_task.web import WebSettings, create_app

            app = create_app(open_store("memory://"), WebSettings(read_only=True))
            paths = {getattr(route, "path", "") for route in app.routes}
            assert {"/tasks", "/overview", "/api/tasks", "/healthz", "/static"} <= paths, paths
            """
        ),
        "create_app",
    )
