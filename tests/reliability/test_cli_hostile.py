"""命令行的恶意/畸形输入：真实子进程跑 ``chongming-task``，每一种都必须退出码 1、stderr 恰好一行中文、
没有 Traceback；带口令的连接串，口令绝不出现在任何输出里；查询类命令不改动数据库里的任何一行。"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prefork import python_run

from chongming_task import SqliteTaskStore, StateMachine

SECRET = "s3cr3t-Pa55"


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("chongming-task", path=os.path.dirname(sys.executable)) or "chongming-task"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_TASK_")}
    full_env.update(env or {})
    # 控制台脚本经预导入的模板进程 fork 着跑（tests/support/prefork.py），省掉解释器启动与导入。
    return python_run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=60, env=full_env)


def assert_clear_failure(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr
    assert len(lines) == 1, f"stderr 应当只有一行：{result.stderr!r}"
    assert len(lines[0]) <= 300, f"错误行不能超过 300 个字符（细节在 --debug 里）：{len(lines[0])}"
    assert "内部错误" not in lines[0], lines[0]
    assert any("\u4e00" <= ch <= "\u9fff" for ch in lines[0]), lines[0]
    return lines[0]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.db"
    store = SqliteTaskStore(path)
    machine = StateMachine.create("existing", "job")
    machine.mark_queued()
    store.create(machine.snapshot, machine.transitions)
    store.close()
    return path


@pytest.fixture
def boom_module(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "boom_tasks.py").write_text('raise RuntimeError("模块导入时就出错")\n', encoding="utf-8")
    (tmp_path / "syntax_tasks.py").write_text("def register(controller:\n", encoding="utf-8")
    (tmp_path / "empty_tasks.py").write_text("X = 1\n", encoding="utf-8")
    return {"PYTHONPATH": str(tmp_path)}


BAD_GLOBALS = [
    ["--owned-buckets", "0-999"],
    ["--owned-buckets", "a-b"],
    ["--owned-buckets", "5-2"],
    ["--owned-buckets", ""],
    ["--owned-buckets", "-1"],
    ["--num-buckets", "0"],
    ["--num-buckets", "lots"],
    ["--owner", ""],
]


@pytest.mark.parametrize("options", BAD_GLOBALS, ids=lambda o: " ".join(o) or "empty")
def test_bad_global_options(db: Path, tmp_path: Path, options: list[str]) -> None:
    assert_clear_failure(cli("--db", str(db), *options, "ps", cwd=tmp_path))


@pytest.mark.parametrize(
    "args",
    [
        ["status", "x" * 10_000],
        ["status", "does-not-exist"],
        ["history", "does-not-exist"],
        ["stop", "does-not-exist"],
        ["ps", "--status", "sleeping"],
        ["ps", "--limit", "-1"],
        ["ps", "--bucket", "-3"],
        ["prune", "--keep", "-1"],
        ["nonsense-command"],
    ],
    ids=lambda a: " ".join(a)[:30],
)
def test_bad_command_arguments(db: Path, tmp_path: Path, args: list[str]) -> None:
    before = db.read_bytes()
    assert_clear_failure(cli("--db", str(db), *args, cwd=tmp_path))
    store = SqliteTaskStore(db)
    try:
        assert [s.task_id for s in store.query()] == ["existing"]
        assert store.get("existing").status_version == 1  # type: ignore[union-attr]
    finally:
        store.close()
    assert before  # 数据库文件仍在


@pytest.mark.parametrize("prefix", ["%", "_", "\\", "'; DROP TABLE tasks;--", "jo%", "j_b"])
def test_name_prefix_metacharacters_match_literally(db: Path, tmp_path: Path, prefix: str) -> None:
    result = cli("--db", str(db), "ps", "--name-prefix", prefix, "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "existing" not in result.stdout  # 名字是 "job"，这些前缀按字面都不匹配
    ok = cli("--db", str(db), "ps", "--name-prefix", "jo", "--json", cwd=tmp_path)
    assert ok.returncode == 0 and "existing" in ok.stdout


@pytest.mark.parametrize(
    "module", ["boom_tasks", "syntax_tasks", "empty_tasks", "no_such_module_xyz", "os.path"]
)
def test_task_module_that_fails_to_load(
    db: Path, tmp_path: Path, boom_module: dict[str, str], module: str
) -> None:
    assert_clear_failure(cli("--db", str(db), "tasks", "--tasks", module, cwd=tmp_path, env=boom_module))
    assert_clear_failure(
        cli("--db", str(db), "run", "anything", "--tasks", module, cwd=tmp_path, env=boom_module)
    )


@pytest.mark.parametrize(
    "store",
    [
        f"postgresql://alice:{SECRET}@127.0.0.1:1/db?connect_timeout=1",
        f"postgresql://alice@127.0.0.1:1/db?password={SECRET}&connect_timeout=1",
        f"postgresql://alice:{SECRET}@127.0.0.1:1/db?schema=bad;name",
    ],
    ids=["url-password", "query-password", "bad-schema"],
)
@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_password_never_printed(tmp_path: Path, store: str, debug: bool) -> None:
    pytest.importorskip("psycopg")
    args = ["--store", store, *(["--debug"] if debug else []), "ps"]
    result = cli(*args, cwd=tmp_path)
    assert SECRET not in result.stderr and SECRET not in result.stdout, result.stderr
    if not debug:
        assert_clear_failure(result)
    else:
        assert result.returncode == 1


@pytest.mark.parametrize(
    "store",
    ["zzz://x", "sqlite:///nonexistent-dir/sub/x.db", "memory://?x=1", "sqlite:///:memory:?busy_timeout=-1"],
)
def test_bad_store_urls(tmp_path: Path, store: str) -> None:
    assert_clear_failure(cli("--store", store, "ps", cwd=tmp_path))


def test_database_that_is_not_sqlite(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    assert_clear_failure(cli("--db", str(garbage), "ps", cwd=tmp_path))
    assert garbage.read_bytes() == b"this is not a database" * 100, "不是数据库的文件不能被改写"
