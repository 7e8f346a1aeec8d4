"""每个命令、每个选项经 CliRunner：退出码、stdout、stderr 与 --json。"""

from __future__ import annotations

import io
import json
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from chongming_task import Controller, StateMachine
from chongming_task.cli import cmd_query
from chongming_task.cli.output import LiveDisplay
from chongming_task.policies import BucketPolicy
from chongming_task.stores.sqlite import SqliteTaskStore
from chongming_task.testing import FakeClock

TASKS = "cli_test_tasks"


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("错误：")
    assert "Traceback" not in stderr
    return lines[0]


def run_ok(invoke: Any, db: str, *args: str) -> Any:
    result = invoke("--db", db, "run", "--tasks", TASKS, *args)
    assert result.exit_code == 0, result.output
    return result


# -- 全局选项 ------------------------------------------------------------------------------------------


def test_help_is_chinese_and_lists_every_command(invoke: Any) -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for command in (
        "tasks",
        "run",
        "ps",
        "status",
        "history",
        "stats",
        "buckets",
        "stop",
        "pause",
        "resume",
        "reconcile",
        "prune",
    ):
        assert f"  {command} " in result.stdout
    assert "显示帮助并退出" in result.stdout
    assert "CHONGMING_TASK_DB" in result.stdout
    sub = invoke("run", "--help")
    assert sub.exit_code == 0 and "--bucket-key" in sub.stdout and "显示帮助并退出" in sub.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["nosuch"], "没有这个命令：nosuch"),
        (["--nope", "ps"], "没有这个选项：--nope"),
        (["--num-buckets", "zero", "ps"], "--num-buckets 不合法：'zero' 不是整数"),
        (["--num-buckets", "0", "ps"], "必须 >= 1"),
        (["status"], "缺少参数 TASK_ID"),
        (["prune"], "缺少选项 --keep-terminal"),
        (["ps", "--status", "bogus"], "'bogus' 不是可选值"),
        (["ps", "--limit", "0"], "必须 >= 1"),
        (["run", "count", "--executor", "gpu"], "'gpu' 不是可选值；可选：thread, process"),
        (["ps", "--watch", "0"], "必须是正的秒数"),
    ],
)
def test_usage_errors_are_one_chinese_line_with_exit_1(invoke: Any, args: list[str], needle: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 1
    line = one_error_line(result.stderr)
    assert needle in line
    assert "--help" in line


def test_db_and_store_on_the_command_line_conflict(invoke: Any, db: str) -> None:
    result = invoke("--db", db, "--store", "memory://", "ps")
    assert result.exit_code == 1
    assert "--db 与 --store 只能给一个" in one_error_line(result.stderr)


def test_command_line_wins_over_environment(invoke: Any, db: str, tmp_path: Path) -> None:
    run_ok(invoke, db, "count", "--task-id", "a")
    # 环境变量给了一个不存在的库，命令行 --db 说了算
    result = invoke("--db", db, "ps", env={"CHONGMING_TASK_STORE": f"sqlite:{tmp_path / 'other.db'}"})
    assert result.exit_code == 0 and "a " in result.stdout
    result = invoke("--store", f"sqlite:{db}", "ps", env={"CHONGMING_TASK_DB": str(tmp_path / "nope.db")})
    assert result.exit_code == 0 and "a " in result.stdout


def test_every_global_option_has_an_environment_variable(invoke: Any, db: str) -> None:
    env = {
        "CHONGMING_TASK_DB": db,
        "CHONGMING_TASK_OWNER": "env-owner",
        "CHONGMING_TASK_NUM_BUCKETS": "8",
        "CHONGMING_TASK_OWNED_BUCKETS": "0-3",
        "CHONGMING_TASK_MODULE": TASKS,
    }
    key = next(f"k{i}" for i in range(100) if BucketPolicy(8).bucket_for(f"k{i}") < 4)
    result = invoke("run", "count", "--task-id", "e1", "--bucket-key", key, env=env)
    assert result.exit_code == 0, result.output
    snapshot = json.loads(invoke("--json", "status", "e1", env=env).stdout)
    assert snapshot["owner"] == "env-owner"
    assert snapshot["bucket"] == BucketPolicy(8).bucket_for(key)
    assert invoke("tasks", env=env).exit_code == 0
    listed = json.loads(invoke("--json", "buckets", env=env).stdout)
    assert listed["num_buckets"] == 8 and listed["owned"] == "0-3"
    store_env = {"CHONGMING_TASK_STORE": f"sqlite:{db}"}
    assert "e1" in invoke("ps", env=store_env).stdout


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("0-70", "桶号 64-70 超出 --num-buckets 64 的范围 0-63"),
        ("a-b", "写法不对：'a-b'"),
        ("5-2", "区间 '5-2' 反了"),
        ("", "不能为空"),
        ("-1", "写法不对"),
        ("0-3,,4", "写法不对"),
    ],
)
def test_owned_buckets_spec_is_validated(invoke: Any, db: str, spec: str, needle: str) -> None:
    result = invoke("--db", db, "--owned-buckets", spec, "ps")
    assert result.exit_code == 1
    assert needle in one_error_line(result.stderr)


def test_owned_buckets_checked_against_num_buckets(invoke: Any, db: str) -> None:
    result = invoke("--db", db, "--num-buckets", "16", "--owned-buckets", "0-15,16", "ps")
    assert result.exit_code == 1
    assert "桶号 16 超出 --num-buckets 16 的范围 0-15" in result.stderr


def test_no_store_and_missing_db_file(invoke: Any, tmp_path: Path) -> None:
    result = invoke("ps")
    assert result.exit_code == 1
    assert "没有指定存储" in one_error_line(result.stderr)
    result = invoke("--db", str(tmp_path / "typo.db"), "ps")
    assert result.exit_code == 1
    assert "typo.db 不存在" in one_error_line(result.stderr)
    assert not (tmp_path / "typo.db").exists()  # 查询不会顺手建一个空库


def test_unknown_store_scheme(invoke: Any) -> None:
    result = invoke("--store", "redis://localhost/0", "ps")
    assert result.exit_code == 1
    line = one_error_line(result.stderr)
    assert "未知的存储 scheme 'redis'" in line


def test_unreachable_postgres_never_prints_the_password(invoke: Any) -> None:
    url = "postgresql://alice:s3cr3t-pw@127.0.0.1:1/db?connect_timeout=1"
    result = invoke("--store", url, "ps")
    assert result.exit_code == 1
    line = one_error_line(result.stderr)
    assert "s3cr3t-pw" not in result.output
    assert "无法打开存储" in line or "错误" in line
    debug = invoke("--debug", "--store", url, "ps")
    assert debug.exit_code == 1
    assert "Traceback" in debug.stderr
    assert "s3cr3t-pw" not in debug.output


def test_debug_shows_traceback_only_when_asked(invoke: Any, db: str) -> None:
    quiet = invoke("--db", db, "run", "--tasks", TASKS, "nosuch")
    assert quiet.exit_code == 1 and "Traceback" not in quiet.stderr
    loud = invoke("--debug", "--db", db, "run", "--tasks", TASKS, "nosuch")
    assert loud.exit_code == 1 and "Traceback" in loud.stderr
    assert loud.stderr.rstrip().splitlines()[-1].startswith("错误：")


# -- tasks ----------------------------------------------------------------------------------------


def test_tasks_lists_definitions(invoke: Any) -> None:
    result = invoke("tasks", "--tasks", TASKS)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "DESCRIPTION", "TAGS", "RETRY", "TIMEOUT"]
    boom = next(line for line in lines if line.startswith("boom"))
    assert "最多 2 次" in boom and "per_attempt=30s idle=10s" in boom
    assert any(line.startswith("count") and "demo" in line for line in lines)
    assert any(line.startswith("echo") and "原样返回参数" in line for line in lines)


def test_tasks_json(invoke: Any) -> None:
    result = invoke("--json", "tasks", "--tasks", TASKS)
    data = {d["name"]: d for d in json.loads(result.stdout)}
    assert set(data) == {"boom", "count", "deaf", "echo", "needs", "resident", "spin"}
    assert data["boom"]["max_attempts"] == 2
    assert data["boom"]["timeout"] == {"start": None, "per_attempt": 30, "idle": 10}
    assert data["count"]["tags"] == ["demo"] and data["count"]["timeout"] is None
    # 命令后面的 --json 与全局的等价
    assert json.loads(invoke("tasks", "--tasks", TASKS, "--json").stdout) == json.loads(result.stdout)


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(body, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_module_problems_are_explained(invoke: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cases = {
        _module(tmp_path, monkeypatch, "ct_noreg", "X = 1\n"): "没有 register(controller) 函数",
        _module(tmp_path, monkeypatch, "ct_badreg", "def register(c):\n    raise RuntimeError('坏了')\n"): (
            "register(controller) 出错：RuntimeError: 坏了"
        ),
        _module(tmp_path, monkeypatch, "ct_broken", "import not_a_real_dependency_xyz\n"): (
            "导入任务模块 ct_broken 时出错：ModuleNotFoundError"
        ),
        "no_such_module_xyz": "找不到任务模块 no_such_module_xyz",
        "tasks/file.py": "不是文件路径",
    }
    for module, needle in cases.items():
        result = invoke("tasks", "--tasks", module)
        assert result.exit_code == 1, module
        assert needle in one_error_line(result.stderr), module
    result = invoke("tasks")
    assert result.exit_code == 1 and "需要 --tasks MODULE" in result.stderr


# -- run ------------------------------------------------------------------------------------------


def test_run_success_prints_result_and_plain_progress(invoke: Any, db: str) -> None:
    result = run_ok(invoke, db, "count", "--arg", "n=3", "--task-id", "c1")
    assert result.stdout.strip() == result.stdout.strip().splitlines()[0]  # stdout 只有一行结果
    assert "任务 c1 成功（succeeded）" in result.stdout and "返回值：3" in result.stdout
    assert "已提交 c1（任务 count，桶 -" in result.stderr
    assert "c1 running → succeeded" in result.stderr
    assert "进度 3/3 step 第 3 步" in result.stderr
    assert "\r" not in result.stderr and "\x1b" not in result.stderr  # 不是终端：不输出控制字符
    err = result.stderr
    assert err.index("进度 3/3 step") < err.index("running → succeeded")


def test_run_json_is_the_snapshot(invoke: Any, db: str) -> None:
    result = invoke(
        "--json",
        "--db",
        db,
        "run",
        "--tasks",
        TASKS,
        "count",
        "--task-id",
        "j1",
        "--label",
        "数数",
        "--tag",
        "x",
        "--tag",
        "y",
        "--priority",
        "7",
    )
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["task_id"] == "j1" and data["status"] == "succeeded" and data["outcome"] == 3
    assert data["label"] == "数数" and data["priority"] == 7
    assert set(data["tags"]) == {"demo", "x", "y"}


def test_run_arguments_are_json_when_they_parse(invoke: Any, db: str) -> None:
    args = [
        "n=3",
        "flag=true",
        "items=[1, 2]",
        'obj={"a": null}',
        "text=kafka://orders",
        'quoted="3"',
        "empty=",
    ]
    cmd = ["--json", "--db", db, "run", "--tasks", TASKS, "echo"]
    for arg in args:
        cmd += ["--arg", arg]
    result = invoke(*cmd)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["outcome"] == {
        "n": 3,
        "flag": True,
        "items": [1, 2],
        "obj": {"a": None},
        "text": "kafka://orders",
        "quoted": "3",
        "empty": "",
    }


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["echo", "--arg", "novalue"], "应写成 名字=值"),
        (["echo", "--arg", "1x=2"], "不是合法的 Python 参数名"),
        (["echo", "--arg", "a=1", "--arg", "a=2"], "--arg a 给了两次"),
        (["echo", "--arg", "label=x"], "请用 --label 选项"),
        (["echo", "--arg", "bucket_key=x"], "请用 --bucket-key 选项"),
        (["needs"], "任务 needs 的参数与 --arg 对不上"),
        (["needs", "--arg", "source=a", "--arg", "bogus=1"], "它接受的参数是：source、limit"),
        (["nosuch"], "任务名 'nosuch' 没有登记"),
        (["os.system", "--arg", "command=id"], "拒绝运行 'os.system'"),
        (["cli_test_tasks.count"], "不接受模块路径或可调用对象"),
        (["builtins:eval"], "拒绝运行 'builtins:eval'"),
    ],
)
def test_run_refuses_bad_arguments_and_unregistered_names(
    invoke: Any, db: str, args: list[str], needle: str
) -> None:
    result = invoke("--db", db, "run", "--tasks", TASKS, *args)
    assert result.exit_code == 1
    assert needle in one_error_line(result.stderr)
    assert "已提交" not in result.stderr  # 拒绝发生在提交之前


def test_run_unregistered_name_lists_what_is_registered(invoke: Any, db: str) -> None:
    result = invoke("--db", db, "run", "--tasks", TASKS, "os.system")
    assert "已登记的有：boom, count, deaf, echo, needs, resident, spin" in result.stderr


def test_run_failed_task_exits_3(invoke: Any, db: str) -> None:
    result = invoke("--db", db, "run", "--tasks", TASKS, "boom", "--task-id", "b1")
    assert result.exit_code == 3
    assert "任务 b1 没有成功，终态 failed：exception，故意失败" in result.stdout
    assert "running → retry_wait" in result.stderr
    assert "日志 WARNING 马上要失败了" in result.stderr
    assert result.stderr.count("错误：") == 0  # 命令本身没有失败


def test_run_duplicate_task_id_exits_1(invoke: Any, db: str) -> None:
    run_ok(invoke, db, "count", "--task-id", "dup")
    result = invoke("--db", db, "run", "--tasks", TASKS, "count", "--task-id", "dup")
    assert result.exit_code == 1
    assert "提交被拒绝：task_id 'dup' 已存在" in one_error_line(result.stderr)


def test_run_without_store_runs_in_memory(invoke: Any) -> None:
    result = invoke("run", "--tasks", TASKS, "count", "--task-id", "m1")
    assert result.exit_code == 0
    assert "存储 无（仅本进程内存）" in result.stderr


def test_partitioned_run_requires_bucket_key(invoke: Any, db: str) -> None:
    result = invoke(
        "--db",
        db,
        "--num-buckets",
        "64",
        "--owned-buckets",
        "0-15",
        "run",
        "--tasks",
        TASKS,
        "count",
        "--task-id",
        "p1",
    )
    assert result.exit_code == 1
    line = one_error_line(result.stderr)
    assert "--owned-buckets 0-15" in line and "必须给出 --bucket-key" in line and "永远排队" in line
    assert not Path(db).exists()  # 在碰存储之前就拒绝了


def test_bucket_key_outside_owned_buckets_is_refused(invoke: Any, db: str) -> None:
    assert BucketPolicy(64).bucket_for("tenant-B") == 28
    result = invoke(
        "--db",
        db,
        "--owned-buckets",
        "0-15",
        "run",
        "--tasks",
        TASKS,
        "count",
        "--task-id",
        "p2",
        "--bucket-key",
        "tenant-B",
    )
    assert result.exit_code == 1
    line = one_error_line(result.stderr)
    assert "桶 28" in line and "'tenant-B'" in line and "[0, 1, ..., 15]" in line
    assert json.loads(invoke("--json", "--db", db, "ps").stdout) == []


def test_bucket_key_inside_owned_buckets_runs(invoke: Any, db: str) -> None:
    result = invoke(
        "--json",
        "--db",
        db,
        "--owned-buckets",
        "0-15",
        "run",
        "--tasks",
        TASKS,
        "count",
        "--task-id",
        "p3",
        "--bucket-key",
        "orders",
    )
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert (data["bucket"], data["bucket_key"]) == (13, "orders")


def test_owning_every_bucket_is_not_a_partition(invoke: Any, db: str) -> None:
    result = invoke(
        "--db",
        db,
        "--num-buckets",
        "4",
        "--owned-buckets",
        "0-3",
        "run",
        "--tasks",
        TASKS,
        "count",
        "--task-id",
        "all",
    )
    assert result.exit_code == 0


def test_live_display_on_a_terminal_redraws_one_line() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    display = LiveDisplay(stream)
    display.status("t1  running  1.0s  [####----] 50%  1/2 step")
    display.line("[12:00:00] t1 running → stopping")
    display.status("t1  stopping  1.1s")
    display.finish()
    text = stream.getvalue()
    assert text.count("\r\x1b[K") >= 3
    assert "[12:00:00] t1 running → stopping\n" in text
    plain = io.StringIO()
    quiet = LiveDisplay(plain)
    quiet.status("不会出现")
    quiet.line("整行")
    assert plain.getvalue() == "整行\n"


# -- 查询 -----------------------------------------------------------------------------------------


@pytest.fixture
def populated(invoke: Any, db: str) -> str:
    run_ok(invoke, db, "count", "--task-id", "q1", "--label", "第一个")
    invoke("--db", db, "run", "--tasks", TASKS, "boom", "--task-id", "q2")
    run_ok(invoke, db, "echo", "--task-id", "q3", "--bucket-key", "orders", "--tag", "io")
    return db


def test_ps_table_and_filters(invoke: Any, populated: str) -> None:
    db = populated

    def ids(*args: str) -> list[str]:
        result = invoke("--db", db, "ps", *args)
        assert result.exit_code == 0
        return [line.split()[0] for line in result.stdout.splitlines()[2:]]

    header = invoke("--db", db, "ps").stdout.splitlines()[0].split()
    assert header == ["TASK_ID", "NAME", "STATUS", "ATTEMPT", "ELAPSED", "PROGRESS", "BUCKET", "FAILURE"]
    assert ids() == ["q1", "q2", "q3"]
    assert ids("--newest") == ["q3", "q2", "q1"]
    assert ids("--limit", "1") == ["q1"]
    assert ids("--status", "failed") == ["q2"]
    assert ids("--status", "failed", "--status", "succeeded") == ["q1", "q2", "q3"]
    assert ids("--name-prefix", "ec") == ["q3"]
    assert ids("--tag", "demo") == ["q1"]
    assert ids("--bucket", "13") == ["q3"]
    assert ids("--pipeline", "nope") == []
    assert "第一个" in invoke("--db", db, "ps").stdout  # NAME 列是 label
    empty = invoke("--db", db, "ps", "--status", "running")
    assert empty.stdout.strip() == "（没有符合条件的任务）"
    bad = invoke("--db", db, "ps", "--bucket", "64")
    assert bad.exit_code == 1 and "--bucket 64 越界" in bad.stderr


def test_ps_json(invoke: Any, populated: str) -> None:
    data = json.loads(invoke("--json", "--db", populated, "ps", "--status", "failed").stdout)
    assert [d["task_id"] for d in data] == ["q2"]
    assert data[0]["failure"]["kind"] == "exception"


def test_ps_watch_refreshes_until_ctrl_c(
    invoke: Any, populated: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sleeps: list[float] = []

    def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(cmd_query.time, "sleep", fake_sleep)
    result = invoke("--db", populated, "ps", "--watch", "0.5")
    assert result.exit_code == 0
    assert sleeps == [0.5, 0.5, 0.5]
    assert result.stdout.count("TASK_ID") == 3
    assert "每 0.5 秒刷新，Ctrl-C 退出" in result.stdout
    sleeps.clear()
    default = invoke("--json", "--db", populated, "ps", "--watch")
    assert sleeps == [2.0, 2.0, 2.0]
    frames = [json.loads(line) for line in default.stdout.splitlines()]
    assert len(frames) == 3 and all(len(frame) == 3 for frame in frames)


def test_status_detail_and_json(invoke: Any, populated: str) -> None:
    result = invoke("--db", populated, "status", "q2")
    assert result.exit_code == 0
    rows = dict(line.split(None, 1) for line in result.stdout.splitlines())
    assert rows["status"] == "failed"
    assert rows["attempt"] == "2/2"
    assert rows["failure"].startswith("exception：故意失败")
    data = json.loads(invoke("--db", populated, "status", "q2", "--json").stdout)
    assert data["status"] == "failed" and data["failure"]["message"] == "故意失败"
    assert set(rows) - {"elapsed"} <= set(data)  # 明细的字段名与 --json 的键一致
    missing = invoke("--db", populated, "status", "nope")
    assert missing.exit_code == 1 and "找不到任务 'nope'" in one_error_line(missing.stderr)


def test_history_lists_every_transition(invoke: Any, populated: str) -> None:
    result = invoke("--db", populated, "history", "q1")
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["TIME", "FROM", "→", "TO", "TRIGGER", "ACTOR", "REASON", "VERSION"]
    assert [line.split()[2:5] for line in lines[2:]] == [
        ["pending", "→", "queued"],
        ["queued", "→", "starting"],
        ["starting", "→", "running"],
        ["running", "→", "succeeded"],
    ]
    data = json.loads(invoke("--json", "--db", populated, "history", "q2").stdout)
    assert [d["version"] for d in data] == list(range(1, len(data) + 1))
    assert data[-1]["to_status"] == "failed"
    missing = invoke("--db", populated, "history", "nope")
    assert missing.exit_code == 1 and "找不到任务" in missing.stderr


def test_stats(invoke: Any, populated: str) -> None:
    result = invoke("--db", populated, "stats")
    assert result.exit_code == 0
    assert [line.split() for line in result.stdout.splitlines()[2:4]] == [["succeeded", "2"], ["failed", "1"]]
    assert "合计 3，未结束 0" in result.stdout
    data = json.loads(invoke("--json", "--db", populated, "stats").stdout)
    assert data["total"] == 3 and data["unfinished"] == 0 and data["counts"]["succeeded"] == 2


def test_buckets_marks_owned(invoke: Any, populated: str) -> None:
    result = invoke(
        "--db", populated, "--owned-buckets", "12-13", "buckets", "--key", "orders", "--key", "tenant-B"
    )
    assert result.exit_code == 0
    out = result.stdout
    assert "bucket_key 'orders' → 桶 13（本节点负责）" in out
    assert "bucket_key 'tenant-B' → 桶 28（不归本节点）" in out
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert rows == [["12", "0", "✓"], ["13", "1", "✓"]]
    assert "本节点负责：12-13，带桶的任务共 1 个" in out
    everything = invoke("--db", populated, "buckets", "--all")
    assert sum(1 for line in everything.stdout.splitlines() if line[:1].isdigit()) == 64
    data = json.loads(invoke("--json", "--db", populated, "--owned-buckets", "0-15", "buckets").stdout)
    assert {"bucket": 13, "count": 1, "owned": True} in data["buckets"]
    assert data["owned"] == "0-15" and len(data["buckets"]) == 16


# -- 控制（持有者是本测试进程里的另一个 Controller：同一个 SQLite 文件、各自一条连接） -------------


@pytest.fixture
def holder(db: str) -> Any:
    def resident(ctx: Any) -> int:
        processed = 0
        while not ctx.is_stop_requested:
            ctx.checkpoint()
            processed += 1
            time.sleep(0.005)
        return processed

    controller = Controller(store=SqliteTaskStore(db), owner="holder", command_poll_interval=0.02)
    controller.register("resident", resident)
    controller.submit("resident", task_id="h1")
    yield controller
    controller.close(close_store=True)


def test_stop_is_accepted_and_reaches_the_holder(invoke: Any, db: str, holder: Any, wait_until: Any) -> None:
    wait_until(lambda: holder.get("h1").status.value == "running")
    result = invoke("--db", db, "--owner", "ops", "stop", "h1", "--reason", "发布窗口", "--wait", "10")
    assert result.exit_code == 0, result.output
    assert "已受理：停止请求已写入存储，由持有者 holder 执行" in result.stdout
    assert "任务 h1 已落终态：succeeded" in result.stdout
    history = json.loads(invoke("--json", "--db", db, "history", "h1").stdout)
    stop = next(t for t in history if t["to_status"] == "stopping")
    assert (stop["actor"], stop["reason"], stop["trigger"]) == ("ops", "发布窗口", "control:stop")
    # 已结束的任务：stop / pause / resume 同一种出口（docs/cli.md "控制命令与已结束的任务"）——
    # 什么都不写，退出码 1，错误码 task_finished。
    again = invoke("--db", db, "stop", "h1")
    assert again.exit_code == 1 and again.stdout == ""
    assert "已经结束（succeeded），没有可停止的执行：没有写入任何指令" in one_error_line(again.stderr)
    as_json = invoke("--json", "--db", db, "stop", "h1")
    assert as_json.exit_code == 1 and as_json.stdout == ""
    assert len(as_json.stderr.splitlines()) == 1, as_json.stderr
    data = json.loads(as_json.stderr)
    assert {k: data[k] for k in ("error", "task_id", "action", "status", "exit_code")} == {
        "error": "task_finished",
        "task_id": "h1",
        "action": "stop",
        "status": "succeeded",
        "exit_code": 1,
    }


def test_stop_json_and_wait_timeout(invoke: Any, db: str, tmp_path: Path) -> None:
    # 没有持有者的排队任务：指令写下了，但没人执行，--wait 到时如实报错
    store = SqliteTaskStore(db)
    machine = StateMachine.create(
        "orphan", "job", lease_owner="gone", lease_until=FakeClock().now() - timedelta(minutes=1)
    )
    machine.mark_queued()
    store.create(machine.snapshot, machine.transitions)
    store.close()
    stopped = invoke("--json", "--db", db, "stop", "orphan")
    assert json.loads(stopped.stdout) == {"task_id": "orphan", "action": "stop", "accepted": True}
    assert "租约已在" in stopped.stderr  # 提醒走 stderr，不污染 JSON
    result = invoke("--db", db, "stop", "orphan", "--wait", "0.2")
    assert result.exit_code == 1
    warning, error = result.stderr.strip().splitlines()
    assert warning.startswith("注意：持有者 gone 的租约已在") and "reconcile" in warning
    assert "仍未落终态（当前 queued）" in one_error_line(error)
    missing = invoke("--db", db, "stop", "nope")
    assert missing.exit_code == 1 and "找不到任务 'nope'" in missing.stderr


def test_pause_is_unconfirmed_then_resume(invoke: Any, db: str, holder: Any, wait_until: Any) -> None:
    wait_until(lambda: holder.get("h1").status.value == "running")
    result = invoke("--db", db, "pause", "h1", "--timeout", "5")
    assert result.exit_code == 0
    assert "未确认" in result.stdout and "status h1" in result.stdout
    wait_until(lambda: holder.get("h1").status.value == "paused")
    assert json.loads(invoke("--json", "--db", db, "status", "h1").stdout)["status"] == "paused"
    resumed = invoke("--db", db, "resume", "h1")
    assert resumed.exit_code == 0 and "已受理：恢复请求已写入存储" in resumed.stdout
    wait_until(lambda: holder.get("h1").status.value == "running")
    assert json.loads(invoke("--json", "--db", db, "pause", "h1").stdout) == {
        "task_id": "h1",
        "action": "pause",
        "confirmed": False,
    }
    wait_until(lambda: holder.get("h1").status.value == "paused")
    assert json.loads(invoke("--json", "--db", db, "resume", "h1").stdout)["accepted"] is True
    wait_until(lambda: holder.get("h1").status.value == "running")


def test_pause_and_resume_refuse_finished_or_unknown_tasks(invoke: Any, db: str) -> None:
    run_ok(invoke, db, "count", "--task-id", "done")
    for command in ("pause", "resume"):
        result = invoke("--db", db, command, "done")
        assert result.exit_code == 1
        assert "已经结束（succeeded）" in one_error_line(result.stderr)
        missing = invoke("--db", db, command, "nope")
        assert missing.exit_code == 1 and "找不到任务" in missing.stderr


def test_reconcile_dry_run_then_for_real(invoke: Any, db: str) -> None:
    clock = FakeClock()
    store = SqliteTaskStore(db)
    past = clock.now() - timedelta(minutes=5)
    for task_id, actions in (
        ("dead-run", ("mark_queued", "mark_starting", "mark_running")),
        ("dead-queue", ("mark_queued",)),
    ):
        machine = StateMachine.create(task_id, "job", lease_owner="crashed", lease_until=past)
        for action in actions:
            getattr(machine, action)()
        store.create(machine.snapshot, machine.transitions)
    store.close()
    dry = invoke("--db", db, "reconcile", "--dry-run")
    assert dry.exit_code == 0
    assert "dead-run" in dry.stdout and "会被判为 lost" in dry.stdout
    assert "dead-queue" in dry.stdout and "无人接手" in dry.stdout
    assert "dry-run：没有写入任何状态" in dry.stdout
    assert json.loads(invoke("--json", "--db", db, "status", "dead-run").stdout)["status"] == "running"
    data = json.loads(invoke("--json", "--db", db, "reconcile").stdout)
    assert [s["task_id"] for s in data["lost"]] == ["dead-run"]
    assert data["lost"][0]["status"] == "lost" and data["dry_run"] is False
    assert json.loads(invoke("--json", "--db", db, "status", "dead-run").stdout)["status"] == "lost"
    # 只看本节点的桶：限定到一个空桶时什么都不动
    quiet = invoke("--db", db, "--owned-buckets", "5", "reconcile")
    assert quiet.exit_code == 0 and "没有失去监督者的任务（本节点负责的桶：5）" in quiet.stdout


def test_prune_keeps_newest_terminal(invoke: Any, db: str) -> None:
    for index in range(3):
        run_ok(invoke, db, "count", "--task-id", f"old{index}")
    result = invoke("--db", db, "prune", "--keep-terminal", "1")
    assert result.exit_code == 0 and "已清理 2 条终态记录（保留最新 1 条）" in result.stdout
    assert [d["task_id"] for d in json.loads(invoke("--json", "--db", db, "ps").stdout)] == ["old2"]
    assert json.loads(invoke("--json", "--db", db, "prune", "--keep-terminal", "0").stdout) == {
        "removed": 1,
        "keep_terminal": 0,
    }
    bad = invoke("--db", db, "prune", "--keep-terminal", "-1")
    assert bad.exit_code == 1 and "必须 >= 0" in bad.stderr


def test_sigterm_handler_is_restored_after_run(invoke: Any, db: str) -> None:
    import signal

    before = signal.getsignal(signal.SIGTERM)
    run_ok(invoke, db, "count", "--task-id", "sig")
    assert signal.getsignal(signal.SIGTERM) is before
    assert threading.current_thread() is threading.main_thread()
