"""issue 16.5 / 16.6 / 16.7 / 16.10：打开来读的存储绝不被写；首次落库成功之前任务体不执行。

全部用真实的 CLI 进程或公开的库 API：别的应用的 SQLite 文件与 0 字节文件在每条只读命令前后做 sha256，
拼错的 Postgres schema 查 information_schema.schemata，只有 SELECT 权限的真实 Postgres 角色跑 run。
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli_edges import cli, error_line, json_error

from chongming_task import Controller, SqliteTaskStore, open_store
from chongming_task.core.storage.opening import SchemaMissing
from chongming_task.errors import ConfigurationError, StoreError

READ_ONLY_COMMANDS = (
    ("ps",),
    ("status", "x"),
    ("history", "x"),
    ("stats",),
    ("buckets",),
    ("doctor",),
    ("reconcile", "--dry-run"),
)

MARKER_TASKS = '''
import os, sys


def touch_marker(ctx):
    """任务体一旦执行就在当前目录留下 marker.txt：测试据此判断"任务体没跑"。"""
    with open(os.path.join(os.getcwd(), "marker.txt"), "w") as f:
        f.write("ran")
    return "ok"


def register(controller):
    controller.register("touch_marker", touch_marker)
'''


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def foreign_db(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('alice')")
    conn.commit()
    conn.close()
    return path


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "marker_tasks.py").write_text(MARKER_TASKS, encoding="utf-8")
    return tmp_path


# -- 16.5：只读命令 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["foreign", "empty"])
@pytest.mark.parametrize("command", READ_ONLY_COMMANDS, ids=lambda c: " ".join(c))
def test_read_only_commands_never_write_a_foreign_or_empty_sqlite_file(
    tmp_path: Path, kind: str, command: tuple[str, ...]
) -> None:
    path = tmp_path / "other-app.db"
    if kind == "foreign":
        foreign_db(path)
    else:
        path.write_bytes(b"")
    before, listing = sha(path), sorted(os.listdir(tmp_path))
    for flag in (("--db", str(path)), ("--store", f"sqlite:{path}")):
        line = error_line(cli(*flag, *command, cwd=tmp_path))
        assert "没有 chongming-task 的表" in line and str(path) in line, line
        assert sha(path) == before, f"{command} 改写了 {kind} 文件"
        assert sorted(os.listdir(tmp_path)) == listing, "不能留下 -wal / -shm / -journal 之类的文件"
    assert (
        json_error(cli("--json", "--db", str(path), *command, cwd=tmp_path))["error"]
        == "store_not_initialized"
    )


def test_store_url_to_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    for command in READ_ONLY_COMMANDS:
        line = error_line(cli("--store", "sqlite:missing.db", *command, cwd=tmp_path))
        assert "missing.db" in line and "不存在" in line
    assert os.listdir(tmp_path) == []


def test_run_refuses_a_foreign_file_until_init_says_so(workdir: Path) -> None:
    path = foreign_db(workdir / "app.db")
    before = sha(path)
    line = error_line(cli("--db", str(path), "run", "--tasks", "marker_tasks", "touch_marker", cwd=workdir))
    assert "已有别的表" in line and "chongming-task init" in line
    assert sha(path) == before and not (workdir / "marker.txt").exists()

    assert cli("--db", str(path), "init", cwd=workdir).returncode == 0
    done = cli(
        "--db", str(path), "run", "--tasks", "marker_tasks", "touch_marker", "--task-id", "t1", cwd=workdir
    )
    assert done.returncode == 0, done.stderr
    assert (workdir / "marker.txt").read_text() == "ran"
    assert "t1" in cli("--db", str(path), "ps", cwd=workdir).stdout
    with sqlite3.connect(path) as conn:  # 别人的表原样还在
        assert conn.execute("SELECT name FROM users").fetchall() == [("alice",)]


def test_run_still_creates_a_new_file_and_a_zero_byte_file(workdir: Path) -> None:
    for name in ("new.db", "zero.db"):
        if name == "zero.db":
            (workdir / name).write_bytes(b"")
        result = cli("--db", name, "run", "--tasks", "marker_tasks", "touch_marker", cwd=workdir)
        assert result.returncode == 0, result.stderr
        assert cli("--db", name, "ps", cwd=workdir).returncode == 0


def test_schema_sql_for_sqlite_builds_a_store_the_cli_reads(tmp_path: Path) -> None:
    script = cli("--db", "x.db", "schema-sql", cwd=tmp_path)
    assert script.returncode == 0 and "CREATE TABLE IF NOT EXISTS tasks" in script.stdout
    assert not (tmp_path / "x.db").exists(), "schema-sql 不连接、不建文件"
    with sqlite3.connect(tmp_path / "by-hand.db") as conn:
        conn.executescript(script.stdout)
    result = cli("--db", "by-hand.db", "ps", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


# -- 16.6：写不进去就不跑 ------------------------------------------------------------------------------


def test_controller_submit_raises_and_the_body_never_runs_when_the_create_fails(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    SqliteTaskStore(path).close()
    ran = threading.Event()
    controller = Controller(store=SqliteTaskStore(path, readonly=True))
    controller.register("work", lambda ctx: ran.set())
    try:
        with pytest.raises(StoreError, match="已拒绝提交"):
            controller.submit("work", task_id="w1")
        assert controller.runs() == [] and not ran.wait(0.3)
    finally:
        controller.close(close_store=True)
    reader = SqliteTaskStore(path, readonly=True)
    assert reader.get("w1") is None
    reader.close()


def test_run_on_an_immutable_sqlite_file_refuses_before_the_body(workdir: Path) -> None:
    """root 不理会 chmod 0444：用 chattr +i（对 root 也生效）做出真正写不进去的文件。"""
    path = workdir / "ro.db"
    SqliteTaskStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")  # 不留 -wal / -shm，只有这一个不可改的文件
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("此环境不能 chattr +i（需要 CAP_LINUX_IMMUTABLE）")
    try:
        before = sha(path)
        line = error_line(
            cli("--db", str(path), "run", "--tasks", "marker_tasks", "touch_marker", cwd=workdir)
        )
        # 在打开时（切 WAL 就要写）或提交时（首次落库）被拒绝，两处都在任务体之前。
        assert "只读" in line or "任务没有执行" in line, line
        assert not (workdir / "marker.txt").exists()
        assert sha(path) == before
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


# -- Postgres ---------------------------------------------------------------------------------------------


@pytest.fixture
def pg() -> Iterator[tuple[str, object]]:
    base = os.environ.get("CHONGMING_TEST_POSTGRES")
    if not base:
        pytest.skip("需要 CHONGMING_TEST_POSTGRES")
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(base, autocommit=True) as admin:
        yield base, admin


def _schema_exists(admin: object, name: str) -> bool:
    row = admin.execute(  # type: ignore[attr-defined]
        "SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s", [name]
    ).fetchone()
    return bool(row[0])


def test_postgres_typo_schema_is_never_created_by_readers(tmp_path: Path, pg: tuple[str, object]) -> None:
    base, admin = pg
    typo = f"typo_{uuid.uuid4().hex[:10]}"
    url = f"{base}?schema={typo}"
    for command in READ_ONLY_COMMANDS:
        line = error_line(cli("--store", url, *command, cwd=tmp_path))
        assert typo in line and "不存在" in line, line
    assert not _schema_exists(admin, typo)
    with pytest.raises(SchemaMissing):
        open_store(url, readonly=True)
    assert not _schema_exists(admin, typo)


def test_postgres_schema_with_foreign_tables_needs_init(tmp_path: Path, pg: tuple[str, object]) -> None:
    base, admin = pg
    schema = f"app_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE SCHEMA "{schema}"')  # type: ignore[attr-defined]
    admin.execute(f'CREATE TABLE "{schema}".orders (id int)')  # type: ignore[attr-defined]
    try:
        with pytest.raises(SchemaMissing, match="chongming-task init"):
            open_store(f"{base}?schema={schema}")
        assert cli("--store", f"{base}?schema={schema}", "init", cwd=tmp_path).returncode == 0
        assert cli("--store", f"{base}?schema={schema}", "ps", cwd=tmp_path).returncode == 0
    finally:
        admin.execute(f'DROP SCHEMA "{schema}" CASCADE')  # type: ignore[attr-defined]


def test_select_only_postgres_role_run_refuses_before_the_body(workdir: Path, pg: tuple[str, object]) -> None:
    base, admin = pg
    suffix = uuid.uuid4().hex[:10]
    role, schema = f"sel_only_{suffix}", f"sel_only_{suffix}"
    script = cli("--store", f"{base}?schema={schema}", "schema-sql", cwd=workdir)
    assert script.returncode == 0
    admin.execute(script.stdout)  # type: ignore[attr-defined]  # DBA 照 schema-sql 建表
    admin.execute(f'CREATE ROLE "{role}" LOGIN')  # type: ignore[attr-defined]
    admin.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')  # type: ignore[attr-defined]
    admin.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')  # type: ignore[attr-defined]
    try:
        host = base.split("://", 1)[1].split("@", 1)[-1].split("?", 1)[0]
        url = f"postgresql://{role}@{host}?schema={schema}"
        assert cli("--store", url, "ps", cwd=workdir).returncode == 0  # 读照常
        result = cli("--store", url, "run", "--tasks", "marker_tasks", "touch_marker", cwd=workdir)
        line = error_line(result)
        assert "提交被拒绝" in line and "任务没有执行" in line, line
        assert "写存储失败" not in result.stderr
        assert not (workdir / "marker.txt").exists(), "首次落库失败时任务体不能执行"
        row = admin.execute(f'SELECT count(*) FROM "{schema}".tasks').fetchone()  # type: ignore[attr-defined]
        assert row == (0,)
    finally:
        admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')  # type: ignore[attr-defined]
        admin.execute(f'DROP OWNED BY "{role}"')  # type: ignore[attr-defined]
        admin.execute(f'DROP ROLE IF EXISTS "{role}"')  # type: ignore[attr-defined]


# -- 16.7 / 16.10 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://u@127.0.0.1:abc/db",
        "postgresql://u@127.0.0.1:0/db",
        "postgresql://u@[::1/db",
        "postgresql://u@127.0.0.1/db?sslmode=bogus",
        "postgresql://u%zz@127.0.0.1/db",
    ],
)
def test_malformed_postgres_urls_are_classified_by_the_store(dsn: str) -> None:
    pytest.importorskip("psycopg")
    from chongming_task.stores.postgres import PostgresTaskStore

    with pytest.raises(ConfigurationError) as caught:
        PostgresTaskStore(dsn)
    message = str(caught.value)
    assert "写法不对" in message and "postgresql://用户@主机:端口/库名" in message
    assert "请确认数据库在运行" not in message


def test_unknown_scheme_lists_only_importable_backends() -> None:
    """只装了 core 时（这里用 sys.modules 屏蔽两个存储包来模拟）报错只列出 memory。"""
    code = (
        "import sys\n"
        "sys.modules['chongming_task.stores.sqlite'] = None\n"
        "sys.modules['chongming_task.stores.postgres'] = None\n"
        "from chongming_task import open_store\n"
        "try:\n"
        "    open_store('redis://x')\n"
        "except Exception as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "redis" in out and "memory" in out
    assert "sqlite" not in out and "postgres" not in out
    with pytest.raises(ConfigurationError) as caught:
        open_store("redis://x")
    assert "sqlite" in str(caught.value)  # 装了的照常列出
