"""存不下的值（issue 22.5）：每个值要么在入口处被拒绝，要么每个后端都存得下——没有第三种结局。

以前：孤立代理项的 task_id / label / 标签、含 NUL 的 label / bucket_key / 返回值、``priority=±2**70``、
1 MB 的标签、270 MB 的返回值都被接受，任务照常运行，存储却永远写不进那一行，写穿无限重试、
``persist_failures`` 越积越多，bucket_key 的孤立代理项直接漏出 ``UnicodeEncodeError``。
现在：同一份检查（``chongming_task.core.records`` 的上限与 ``check_json_value``，用户指南 §13）在
提交 / TaskRun 构造 / run_task / @task / register 处抛 ConfigurationError，在返回时落
``failed/result_invalid``；恰好在上限上的值在内存、SQLite、PostgreSQL 上都原样往返。

270 MB 的返回值不在测试里真的分配：测的是刚过上限（16 MiB + 1 字节）。
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prefork import python_run

from chongming_task import (
    ConfigurationError,
    Controller,
    FailureKind,
    InMemoryTaskStore,
    SqliteTaskStore,
    TaskContext,
    TaskRun,
    TaskStatus,
    open_store,
    run_task,
    task,
)
from chongming_task.models import (
    MAX_BUCKET_KEY_LENGTH,
    MAX_DESCRIPTION_LENGTH,
    MAX_ID_LENGTH,
    MAX_JSON_BYTES,
    MAX_LABEL_LENGTH,
    MAX_PRIORITY,
    MAX_TAG_LENGTH,
    MAX_TAGS,
    MIN_PRIORITY,
    TaskSnapshot,
)
from chongming_task.storage import SIDE_CHANNEL_FIELDS, TaskStore

WIDE = "🚀"  # UTF-8 下 4 个字节：按字节计的后端限制（索引行）最先被它撞到

# 名字 → 提交参数。每一个都曾被接受、然后永远写不进某个后端。
HOSTILE_SUBMITS: dict[str, dict[str, Any]] = {
    "task_id 孤立代理项": {"task_id": "t-\ud800"},
    "task_id 过长": {"task_id": "t" * (MAX_ID_LENGTH + 1)},
    "label 孤立代理项": {"label": "l-\udfff"},
    "label 含 NUL": {"label": "l\x00"},
    "label 过长": {"label": "l" * (MAX_LABEL_LENGTH + 1)},
    "标签 孤立代理项": {"tags": ["g-\ud800"]},
    "标签 含 NUL": {"tags": ["g\x00"]},
    "1 MB 的标签": {"tags": ["g" * 1_000_000]},
    "标签刚过长度上限": {"tags": ["g" * (MAX_TAG_LENGTH + 1)]},
    "标签太多": {"tags": [f"g{i}" for i in range(MAX_TAGS + 1)]},
    "bucket_key 孤立代理项": {"bucket_key": "k-\ud800"},
    "bucket_key 含 NUL": {"bucket_key": "k\x00"},
    "bucket_key 过长": {"bucket_key": "k" * (MAX_BUCKET_KEY_LENGTH + 1)},
    "priority=2**70": {"priority": 2**70},
    "priority=-2**70": {"priority": -(2**70)},
    "priority 刚过上限": {"priority": MAX_PRIORITY + 1},
    "priority 刚过下限": {"priority": MIN_PRIORITY - 1},
}


def echo(ctx: TaskContext, value: Any = None) -> Any:
    return value


def sized(ctx: TaskContext, size: int) -> str:
    """返回一个 JSON 编码后恰好 ``size`` 字节的字符串（'"' + 内容 + '"'）。"""
    return "x" * (size - 2)


def boom(ctx: TaskContext) -> None:
    raise ValueError("坏了\x00" + "\ud800" + "!" * 100_000)


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], TaskStore]]:
    opened: list[TaskStore] = []

    def make() -> TaskStore:
        if request.param == "memory":
            store: TaskStore = InMemoryTaskStore()
        elif request.param == "sqlite":
            store = SqliteTaskStore(tmp_path / f"tasks-{len(opened)}.db")
        else:
            store = open_store(request.getfixturevalue("pg_schema_factory")("unstorable"))
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def controller_on(store: TaskStore) -> Controller:
    controller = Controller(store=store, max_parallel=1)  # 一个槽位：泄漏一个，后面的任务就永远排队
    controller.register("echo", echo)
    controller.register("sized", sized)
    controller.register("boom", boom)
    return controller


def assert_healthy(controller: Controller, store: TaskStore) -> None:
    assert controller.persist_failures == []
    assert controller.active_count == 0
    # 槽位没有泄漏：一个普通任务照常跑完并写进存储。
    probe = controller.submit("echo", value="probe")
    outcome = probe.wait(timeout=30)
    assert outcome.status is TaskStatus.SUCCEEDED and outcome.value == "probe"
    stored = store.get(probe.task_id)
    assert stored is not None and stored.status is TaskStatus.SUCCEEDED and stored.outcome == "probe"
    assert controller.persist_failures == []


def test_hostile_submits_are_refused_and_nothing_is_stored(store_factory: Callable[[], TaskStore]) -> None:
    store = store_factory()
    with controller_on(store) as controller:
        for label, kwargs in HOSTILE_SUBMITS.items():
            with pytest.raises(ConfigurationError) as caught:
                controller.submit("echo", **kwargs)
            message = str(caught.value)
            assert "\n" not in message and len(message) <= 300, (label, message)
            assert store.query() == [], f"{label}：被拒绝的提交在存储里留下了一行"
            assert controller.list_tasks() == [], label
        assert_healthy(controller, store)


def test_values_just_inside_every_limit_are_stored_exactly(store_factory: Callable[[], TaskStore]) -> None:
    store = store_factory()
    tags = {f"{i:02d}" + WIDE * (MAX_TAG_LENGTH - 2) for i in range(MAX_TAGS)}
    with controller_on(store) as controller:
        runs = []
        for index, priority in enumerate((MAX_PRIORITY, MIN_PRIORITY)):
            runs.append(
                controller.submit(
                    "echo",
                    task_id=str(index) + WIDE * (MAX_ID_LENGTH - 1),
                    label=WIDE * MAX_LABEL_LENGTH,
                    tags=tags,
                    bucket_key=WIDE * MAX_BUCKET_KEY_LENGTH,
                    priority=priority,
                    value={"文本": WIDE * 1000, "整数": 2**80},
                )
            )
        for run in runs:
            outcome = run.wait(timeout=30)
            assert outcome.status is TaskStatus.SUCCEEDED
            stored = store.get(run.task_id)
            assert stored is not None
            # 逐字段相等：存储里的正是进程里的（旁路字段——心跳、租约——按自己的节奏写，不比）。
            for field_name in TaskSnapshot.FIELD_NAMES:
                if field_name not in SIDE_CHANNEL_FIELDS:
                    assert getattr(stored, field_name) == getattr(outcome.snapshot, field_name), field_name
            assert stored.tags == frozenset(tags) and stored.label == WIDE * MAX_LABEL_LENGTH
            assert stored.outcome == {"文本": WIDE * 1000, "整数": 2**80}
            assert [t.to_status for t in store.history(run.task_id)][-1] is TaskStatus.SUCCEEDED
        assert {s.priority for s in store.query()} == {MAX_PRIORITY, MIN_PRIORITY}
        assert_healthy(controller, store)


def test_results_at_and_just_over_the_size_limit(store_factory: Callable[[], TaskStore]) -> None:
    """16 MiB 的返回值存得下；多一个字节：failed/result_invalid（不重试），终态照样写进存储。"""
    store = store_factory()
    with controller_on(store) as controller:
        over = controller.submit("sized", size=MAX_JSON_BYTES + 1)
        outcome = over.wait(timeout=60)
        assert outcome.status is TaskStatus.FAILED
        assert outcome.failure is not None and outcome.failure.kind is FailureKind.RESULT_INVALID
        assert "太大" in outcome.failure.message
        stored = store.get(over.task_id)
        assert stored is not None and stored.status is TaskStatus.FAILED and stored.outcome is None
        assert stored.failure == outcome.failure

        fits = controller.submit("sized", size=MAX_JSON_BYTES)
        outcome = fits.wait(timeout=60)
        assert outcome.status is TaskStatus.SUCCEEDED
        stored = store.get(fits.task_id)
        assert stored is not None and stored.status is TaskStatus.SUCCEEDED
        assert len(stored.outcome) == MAX_JSON_BYTES - 2
        assert_healthy(controller, store)


@pytest.mark.parametrize(
    "value",
    [{"text": "a\x00b"}, {"k\x00": 1}, ["\ud800"], {"\udfff": 1}],
    ids=["NUL 值", "NUL 键", "孤立代理项值", "孤立代理项键"],
)
def test_unstorable_results_are_result_invalid(store_factory: Callable[[], TaskStore], value: Any) -> None:
    store = store_factory()
    with controller_on(store) as controller:
        run = controller.submit("echo", value=value)
        outcome = run.wait(timeout=30)
        assert outcome.failure is not None and outcome.failure.kind is FailureKind.RESULT_INVALID
        stored = store.get(run.task_id)
        assert stored is not None and stored.status is TaskStatus.FAILED
        assert stored.failure is not None and stored.failure.kind is FailureKind.RESULT_INVALID
        assert_healthy(controller, store)


def test_exception_and_stop_reason_text_is_made_storable(store_factory: Callable[[], TaskStore]) -> None:
    """失败与停止原因来自异常与调用方，不能拒绝：NUL / 孤立代理项被转义、超长被截断，终态照样落库。"""
    store = store_factory()
    with controller_on(store) as controller:
        run = controller.submit("boom")
        outcome = run.wait(timeout=30)
        assert outcome.status is TaskStatus.FAILED
        stored = store.get(run.task_id)
        assert stored is not None and stored.status is TaskStatus.FAILED
        assert stored.failure == outcome.failure and stored.failure is not None
        assert stored.failure.message.startswith("坏了\\x00\\ud800!!!") and "已截断" in stored.failure.message

        held = controller.submit("echo", value=1)
        held.stop(reason="不要了\x00\ud800")
        held.wait(timeout=30)
        history = store.history(held.task_id)
        assert history and history == list(held.transitions)
        assert controller.persist_failures == []
        assert_healthy(controller, store)


def test_every_entry_point_refuses_the_same_values(tmp_path: Path) -> None:
    """TaskRun 构造、run_task、@task、register 用的是同一份检查。"""
    for kwargs in ({"task_id": "a\ud800"}, {"task_id": "x" * (MAX_ID_LENGTH + 1)}):
        with pytest.raises(ConfigurationError):
            run_task(echo, **kwargs)
    for kwargs in (
        {"priority": 2**70},
        {"label": "a\x00"},
        {"tags": ["t" * (MAX_TAG_LENGTH + 1)]},
        {"description": "d" * (MAX_DESCRIPTION_LENGTH + 1)},
    ):
        with pytest.raises(ConfigurationError):
            TaskRun(echo, **kwargs)
    with pytest.raises(ConfigurationError):
        task(name="n\ud800")(echo)
    with pytest.raises(ConfigurationError):
        task(tags=["t" * 1_000_000])(echo)
    with pytest.raises(ConfigurationError):
        task(description="d" * (MAX_DESCRIPTION_LENGTH + 1))(echo)
    with Controller() as controller:
        with pytest.raises(ConfigurationError):
            controller.register("bad", echo, tags=[f"t{i}" for i in range(MAX_TAGS + 1)])
        with pytest.raises(ConfigurationError):
            controller.register("bad", echo, description="d\x00")
        with pytest.raises(ConfigurationError):
            controller.register("名字\udcff", echo)
        assert controller.definitions() == []
    # 刚好在上限上的，各入口都接受。
    outcome = TaskRun(
        echo, task_id=WIDE * MAX_ID_LENGTH, priority=MIN_PRIORITY, label=WIDE * MAX_LABEL_LENGTH
    )
    outcome.start()
    assert outcome.wait(timeout=30).status is TaskStatus.SUCCEEDED


# -- 真实的命令行进程 ------------------------------------------------------------------------------

CLI_TASKS = (
    "from chongming_task import TaskContext\n\n\n"
    "def echo(ctx: TaskContext, data: object = None) -> object:\n"
    "    open('ran.txt', 'a').write('ran')\n"
    "    return data\n\n\n"
    "def register(controller):\n"
    "    controller.register('echo', echo)\n"
)

HOSTILE_CLI = {
    "--task-id 过长": ["--task-id", "t" * (MAX_ID_LENGTH + 1)],
    "--bucket-key 过长": ["--bucket-key", "k" * (MAX_BUCKET_KEY_LENGTH + 1)],
    "--tag 过长": ["--tag", "g" * (MAX_TAG_LENGTH + 1)],
    "--label 过长": ["--label", "l" * (MAX_LABEL_LENGTH + 1)],
    "--priority 超出范围": ["--priority", str(2**62)],
    "--arg 含 NUL": ["--arg", 'data="a\\u0000b"'],
    "--arg 含孤立代理项": ["--arg", 'data=["\\ud800"]'],
}


@pytest.mark.parametrize("args", list(HOSTILE_CLI.values()), ids=list(HOSTILE_CLI))
def test_cli_refuses_unstorable_values_with_exit_1(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "unstorable_tasks.py").write_text(CLI_TASKS, encoding="utf-8")
    exe = shutil.which("chongming-task", path=os.path.dirname(sys.executable)) or "chongming-task"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHONGMING_TASK_")}
    env["PYTHONPATH"] = str(tmp_path)
    db = tmp_path / "tasks.db"
    # 控制台脚本经预导入的模板进程 fork 着跑（tests/support/prefork.py）。
    result = python_run(
        [exe, "--db", str(db), "run", "--tasks", "unstorable_tasks", "echo", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert len(lines) == 1 and len(lines[0]) <= 300, result.stderr
    assert "写存储失败" not in result.stderr + result.stdout and "Traceback" not in result.stderr
    assert not (tmp_path / "ran.txt").exists(), "被拒绝的任务不能执行"
    if db.exists():
        with sqlite3.connect(db) as raw:
            assert raw.execute("SELECT count(*) FROM tasks").fetchone() == (0,)


def test_check_json_value_encodes_exactly_like_the_strict_encoder() -> None:
    """``check_json_value`` 复用一个不查循环引用的 C 编码器（``core/compact_json.py``）：对随机的值
    （非字符串键、非 ASCII、大整数、IntEnum、元组）输出与 ``json.JSONEncoder(ensure_ascii=False,
    allow_nan=False, separators=(",", ":")).encode`` 逐字相同；NaN、不可序列化的值、元组键照旧是
    ConfigurationError，带环的值在量深度时就被拒绝。"""
    import enum
    import json
    import random

    from chongming_task.core.storage.checks import check_json_value

    class Level(enum.IntEnum):
        HIGH = 3

    reference = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    rng = random.Random(5)
    pieces: list[Any] = [1, -5, 2**70, 2.5, 1e17, "é中\u2028", 'a"b\\', None, True, False, "", Level.HIGH]

    def build(level: int) -> Any:
        if level > 4 or rng.random() < 0.3:
            return rng.choice(pieces)
        roll = rng.random()
        if roll < 0.4:
            return [build(level + 1) for _ in range(rng.randint(0, 3))]
        if roll < 0.55:
            return tuple(build(level + 1) for _ in range(rng.randint(0, 3)))
        keys = [rng.choice(["k", "é", 1, 2.5, True, None]) for _ in range(rng.randint(0, 3))]
        return {key: build(level + 1) for key in keys}

    for _ in range(5000):
        value = build(0)
        assert check_json_value(value) == reference.encode(value), value
    for bad in (float("nan"), [float("inf")], {"a": object()}, {(1, 2): 1}, b"x", {1, 2}):
        with pytest.raises(ConfigurationError, match="必须可 JSON 序列化"):
            check_json_value(bad)
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(ConfigurationError, match="嵌套太深"):
        check_json_value(cyclic)
