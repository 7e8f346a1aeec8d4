"""恶意/畸形输入：每个公开构造函数与存储方法，要么接受并原样保存，要么给出清楚的
ConfigurationError / StoreError——绝不是别的异常类型（那会以堆栈的形式出现在运维面前），
绝不写出一行被破坏的数据（写了什么就读回什么，拒绝了就什么都没写）。

覆盖：task_id / name / label / tags 里的 unicode、NUL、10 KB 长串、SQL 元字符与 LIKE 通配符；
name_prefix 的字面匹配；巨大的 outcome；不可 JSON 的结果；坏的桶配置；非法策略；ProcessExecutor 的
不可 pickle 参数；open_store 的各种坏连接串；带口令的 DSN（口令绝不出现在报错、repr、堆栈与日志里）。
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from chongming_task import (
    AggregationPolicy,
    BucketPolicy,
    ConcurrencyPolicy,
    ConfigurationError,
    Controller,
    ExponentialBackoff,
    Failure,
    FixedBackoff,
    InMemoryTaskStore,
    Pipeline,
    Progress,
    RetryPolicy,
    SqliteTaskStore,
    StateMachine,
    StoreError,
    TaskQuery,
    TaskSnapshot,
    TaskStatus,
    Timeout,
    open_store,
)
from chongming_task.errors import TaskError
from chongming_task.storage import TaskStore

S = TaskStatus
CLEAR_ERRORS = (ConfigurationError, StoreError)
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# 各种"坏值"：类型不对、越界、NaN/inf、负数、bool 冒充整数、超长、NUL……
junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.binary(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just(object()),
    st.just("\x00"),
    st.just("x" * 10_240),
)

SQL_META = [
    "'",
    '"',
    ";",
    "--",
    "/*",
    "*/",
    "%",
    "_",
    "\\",
    "\\%",
    "%_",
    "[",
    "]",
    "^",
    "ESCAPE",
    "\x7f",
    "😀",
]
hostile_text = st.one_of(
    st.text(min_size=1, max_size=40),
    st.lists(st.sampled_from(SQL_META), min_size=1, max_size=6).map("".join),
    st.text(alphabet=st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), min_size=1, max_size=10),
    st.just("x" * 10_240),
    st.just("a\x00b"),
    st.just("\U0010ffff"),
)


def clear_or_ok(fn: Callable[[], Any]) -> tuple[bool, Any]:
    """调用一次：成功返回 (True, 值)；ConfigurationError/StoreError 返回 (False, 异常)；别的异常判失败。"""
    try:
        return True, fn()
    except CLEAR_ERRORS as exc:
        assert str(exc).strip(), "报错消息不能为空"
        return False, exc


# -- public constructors ----------------------------------------------------------------------------


@SETTINGS
@given(task_id=hostile_text, name=hostile_text, label=st.one_of(st.none(), hostile_text), tags=st.lists(junk))
def test_task_snapshot_rejects_or_accepts_cleanly(
    task_id: str, name: str, label: Any, tags: list[Any]
) -> None:
    from datetime import UTC, datetime

    ok, value = clear_or_ok(
        lambda: TaskSnapshot(task_id=task_id, name=name, label=label, created_at=datetime.now(UTC), tags=tags)
    )
    if ok:
        assert value.task_id == task_id and "\x00" not in task_id and len(task_id) <= 512


@SETTINGS
@given(done=junk, total=junk, unit=junk, message=junk)
def test_progress(done: Any, total: Any, unit: Any, message: Any) -> None:
    ok, value = clear_or_ok(lambda: Progress(done=done, total=total, unit=unit, message=message))
    if ok:
        assert math.isfinite(value.done) and value.done >= 0


@SETTINGS
@given(kind=junk, message=junk, retryable=junk, exc_type=junk)
def test_failure(kind: Any, message: Any, retryable: Any, exc_type: Any) -> None:
    ok, value = clear_or_ok(
        lambda: Failure(kind=kind, message=message, retryable=retryable, exc_type=exc_type)
    )
    if ok:
        assert isinstance(value.message, str) and isinstance(value.retryable, bool)


@SETTINGS
@given(a=junk, b=junk, c=junk, d=junk)
def test_policies(a: Any, b: Any, c: Any, d: Any) -> None:
    clear_or_ok(lambda: RetryPolicy(max_attempts=a, backoff=b))
    clear_or_ok(lambda: RetryPolicy(max_attempts=3, retry_on=c, give_up_on=d))
    clear_or_ok(lambda: Timeout(start=a, per_attempt=b, idle=c))
    clear_or_ok(lambda: FixedBackoff(a))
    clear_or_ok(lambda: ExponentialBackoff(base=a, factor=b, max_delay=c, jitter=d))
    clear_or_ok(lambda: ConcurrencyPolicy(max_parallel=a, limits=b, priority=c))
    clear_or_ok(lambda: ConcurrencyPolicy(limits={a: b} if isinstance(a, str) else {"db": a}))
    clear_or_ok(lambda: BucketPolicy(a))
    clear_or_ok(lambda: AggregationPolicy(a))
    ok, policy = clear_or_ok(lambda: BucketPolicy(7))
    assert ok
    clear_or_ok(lambda: policy.bucket_for(a))
    clear_or_ok(lambda: policy.validate_buckets([a, b]))


@SETTINGS
@given(
    statuses=junk,
    name_prefix=junk,
    tag=junk,
    bucket=junk,
    buckets=junk,
    limit=junk,
    order=junk,
    created_after=junk,
)
def test_task_query(
    statuses: Any,
    name_prefix: Any,
    tag: Any,
    bucket: Any,
    buckets: Any,
    limit: Any,
    order: Any,
    created_after: Any,
) -> None:
    for kwargs in (
        {"statuses": statuses},
        {"name_prefix": name_prefix},
        {"tag": tag},
        {"bucket": bucket},
        {"buckets": buckets},
        {"limit": limit},
        {"order": order},
        {"created_after": created_after},
    ):
        clear_or_ok(lambda kwargs=kwargs: TaskQuery(**kwargs))


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(
        [
            "max_parallel",
            "max_parallel_per_bucket",
            "num_buckets",
            "owner",
            "owned_buckets",
            "lease_ttl",
            "graceful_stop",
            "command_poll_interval",
            "side_channel_interval",
            "store",
            "concurrency",
            "executor",
        ]
    ),
    value=junk,
)
def test_controller_arguments(name: str, value: Any) -> None:
    ok, controller = clear_or_ok(lambda: Controller(**{name: value}))
    if ok:
        controller.close()


@SETTINGS
@given(
    task_name=junk, node_id=st.one_of(st.none(), hostile_text), join=junk, depends=st.lists(junk, max_size=2)
)
def test_pipeline_node(task_name: Any, node_id: Any, join: Any, depends: list[Any]) -> None:
    pipeline = Pipeline("p")
    pipeline.node("fetch", node_id="fetch")
    clear_or_ok(lambda: pipeline.node(task_name, node_id=node_id, join=join, depends_on=depends))
    clear_or_ok(lambda: Pipeline(task_name))
    clear_or_ok(pipeline.topological_order)


BAD_BUCKETS: list[Any] = [[-1], [64], ["0"], [True], [1.5], [], "0-3", 5, [None]]


@pytest.mark.parametrize("owned", BAD_BUCKETS, ids=repr)
def test_bad_bucket_specs_are_configuration_errors(owned: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        Controller(owned_buckets=owned, num_buckets=64)
    assert info.value.args[0]


@pytest.mark.parametrize("key", ["", 0, b"k", None, ["a"]], ids=repr)
def test_bad_bucket_keys(key: Any) -> None:
    controller = Controller(owned_buckets=range(4), num_buckets=8)
    controller.register("noop", lambda ctx: None)
    try:
        with pytest.raises(ConfigurationError):
            controller.submit("noop", bucket_key=key)
        assert controller.runs() == []
    finally:
        controller.close()


# -- open_store URLs, DSN passwords -----------------------------------------------------------------


@SETTINGS
@given(
    url=st.one_of(
        junk,
        st.text(max_size=30).map(lambda s: f"sqlite:///nonexistent-dir-\x01/{s}"),
        st.sampled_from(
            [
                "",
                "   ",
                "zzz://x",
                "://",
                "memory://?x=1",
                "sqlite:///:memory:?busy_timeout=-1",
                "sqlite:///:memory:?synchronous=MAYBE",
                "sqlite:///:memory:?unknown=1",
                "sqlite:///tmp/../../../../proc/self/mem",
                "postgresql://127.0.0.1:1/db?schema=bad;name",
                "postgresql://127.0.0.1:1/db?max_size=zero",
                "postgresql://127.0.0.1:1/db?pool_timeout=nan",
            ]
        ),
    )
)
def test_open_store_bad_urls(url: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    # 没有 scheme 的字符串按 SQLite 文件路径处理：在临时目录里打开，别把随机名字的数据库文件留在仓库里。
    with contextlib.chdir(tmp_path_factory.mktemp("urls")):
        ok, store = clear_or_ok(lambda: open_store(url))
        if ok:
            store.close()


SECRET = "s3cr3t-Pa55"
PASSWORD_DSNS = [
    f"postgresql://alice:{SECRET}@127.0.0.1:1/db?connect_timeout=1",
    f"postgresql://alice:{SECRET}@127.0.0.1:1/db?connect_timeout=1&schema=bad;schema",
    f"postgresql://alice@127.0.0.1:1/db?password={SECRET}&connect_timeout=1",
]


@pytest.mark.parametrize(
    "dsn", PASSWORD_DSNS, ids=["url-password", "url-password-bad-option", "query-password"]
)
def test_dsn_password_never_printed_or_logged(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("psycopg")
    caplog.set_level(logging.DEBUG)
    with pytest.raises(CLEAR_ERRORS) as info:
        open_store(dsn, connect_timeout=1.0)
    text = "".join(traceback.format_exception(info.value))
    assert SECRET not in text, f"口令出现在报错/堆栈里：{text}"
    assert SECRET not in repr(info.value)
    leaked = [r.getMessage() for r in caplog.records if SECRET in r.getMessage()]
    assert not leaked, f"口令出现在日志里：{leaked}"


@pytest.mark.postgres
def test_dsn_password_not_in_repr_of_a_live_store(pg_url: str) -> None:
    pytest.importorskip("psycopg")
    # 真实库的账号没有口令；带一个无关的 password 参数，libpq 对 trust 认证会忽略它。
    store = open_store(pg_url.replace("?", f"?password={SECRET}&", 1))
    try:
        assert SECRET not in repr(store) and SECRET not in str(store)
    finally:
        store.close()


@pytest.mark.postgres
def test_libpq_options_with_spaces_survive_from_url(pg_url: str) -> None:
    """回归：from_url 曾把 ``options=-c%20x=1`` 重新编码成 ``-c+x=1``，服务器拒绝连接。"""
    pytest.importorskip("psycopg")
    store = open_store(f"{pg_url}&options=-c%20statement_timeout%3D1234")
    try:
        conn_getter = store._pool.connection  # type: ignore[attr-defined]
        with conn_getter() as conn:
            assert conn.execute("SHOW statement_timeout").fetchone()[0] == "1234ms"
    finally:
        store.close()


# -- store methods: what goes in comes out, what is refused leaves no trace ------------------------

_ids = itertools.count()


def fresh_id(prefix: str = "h") -> str:
    return f"{prefix}{next(_ids)}"


@pytest.fixture(params=["memory", "sqlite-file"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TaskStore]:
    store: TaskStore = (
        InMemoryTaskStore() if request.param == "memory" else SqliteTaskStore(tmp_path / "h.db")
    )
    yield store
    store.close()


json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(),
    ),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def roundtrip(store: TaskStore, task_id: str, name: str, label: Any, tags: Any, outcome: Any) -> None:
    before = len(store.query())

    def build() -> StateMachine:
        machine = StateMachine.create(task_id, name, label=label, tags=tags)
        machine.mark_queued()
        machine.mark_starting()
        machine.mark_running()
        machine.mark_succeeded(outcome=outcome)
        return machine

    ok, machine = clear_or_ok(build)
    if not ok:
        assert len(store.query()) == before
        return
    ok, _ = clear_or_ok(lambda: store.create(machine.snapshot, machine.transitions))
    if not ok:
        assert len(store.query()) == before, "被拒绝的写入留下了数据"
        assert (
            clear_or_ok(lambda: store.get(task_id))[1] is None
            or not clear_or_ok(lambda: store.get(task_id))[0]
        )
        return
    stored = store.get(task_id)
    assert stored == machine.snapshot, "读回的快照与写入的不一致"
    assert store.history(task_id) == list(machine.transitions)


@SETTINGS
@given(
    name=hostile_text,
    label=st.one_of(st.none(), hostile_text),
    tags=st.lists(hostile_text, max_size=3),
    outcome=json_values,
    suffix=hostile_text,
)
def test_store_roundtrip_hostile_text(
    any_store: TaskStore, name: str, label: Any, tags: list[str], outcome: Any, suffix: str
) -> None:
    roundtrip(any_store, fresh_id() + suffix[:400], name, label, tags, outcome)


@SETTINGS
@given(prefix=st.one_of(hostile_text, st.sampled_from(["%", "_", "\\", "%%", "a_", "a%", "\\_", "'", "A"])))
def test_name_prefix_is_literal(any_store: TaskStore, prefix: str) -> None:
    assume("\x00" not in prefix and len(prefix) <= 512)
    names = [
        "a_b",
        "a%b",
        "aXb",
        "A_b",
        "\\_x",
        "'; DROP TABLE tasks;--",
        "%",
        "_",
        "😀x",
        prefix,
        prefix + "z",
    ]
    for name in names:
        if "\x00" in name:
            continue
        machine = StateMachine.create(fresh_id("p"), name)
        any_store.create(machine.snapshot, machine.transitions)
    everything = any_store.query()
    query = TaskQuery(name_prefix=prefix)
    assert [s.task_id for s in any_store.query(query)] == [s.task_id for s in query.apply(everything)]
    assert any_store.stats(query).total == len(query.apply(everything))


def test_huge_outcome_roundtrips(any_store: TaskStore) -> None:
    outcome = {"rows": [{"id": i, "text": "数据" * 50} for i in range(20_000)], "blob": "x" * 2_000_000}
    roundtrip(any_store, fresh_id("big"), "big", None, (), outcome)
    stored = any_store.query(TaskQuery(name_prefix="big"))
    assert stored and stored[-1].outcome == outcome


@pytest.mark.parametrize(
    "outcome",
    [
        {1, 2},
        object(),
        float("nan"),
        {"x": float("inf")},
        b"bytes",
        {("tuple", "key"): 1},
        [threading.Lock()],
    ],
    ids=["set", "object", "nan", "inf", "bytes", "tuple-key", "lock"],
)
def test_non_json_outcome_refused_without_trace(any_store: TaskStore, outcome: Any) -> None:
    task_id = fresh_id("nj")
    machine = StateMachine.create(task_id, "nj")
    machine.mark_queued()
    machine.mark_starting()
    machine.mark_running()
    any_store.create(machine.snapshot, machine.transitions)
    version = machine.snapshot.status_version
    machine.mark_succeeded(outcome=outcome)
    with pytest.raises(ConfigurationError):
        any_store.save(
            machine.snapshot, expect_version=version, transitions=machine.transitions_since(version)
        )
    stored = any_store.get(task_id)
    assert stored is not None and stored.status is S.RUNNING and stored.status_version == version
    assert len(any_store.history(task_id)) == version
    other = StateMachine.create(fresh_id("nj"), "nj")
    other.mark_queued()
    other.mark_starting()
    other.mark_running()
    other.mark_succeeded(outcome=outcome)
    with pytest.raises(ConfigurationError):
        any_store.create(other.snapshot, other.transitions)
    assert any_store.get(other.task_id) is None and any_store.history(other.task_id) == []


@SETTINGS
@given(task_id=junk, progress=junk, lease=junk, limit=junk)
def test_store_methods_with_junk_arguments(
    any_store: TaskStore, task_id: Any, progress: Any, lease: Any, limit: Any
) -> None:
    machine = StateMachine.create(fresh_id("j"), "junk")
    any_store.create(machine.snapshot, machine.transitions)
    snapshot_before = any_store.get(machine.task_id)
    for call in (
        lambda: any_store.get(task_id),
        lambda: any_store.history(task_id),
        lambda: any_store.touch(machine.task_id, progress=progress),
        lambda: any_store.touch(machine.task_id, heartbeat_at=progress),
        lambda: any_store.touch(task_id, lease_owner=lease),
        lambda: any_store.submit_command(machine.task_id, task_id),
        lambda: any_store.claim_commands("c", lease=lease),
        lambda: any_store.claim_commands("c", lease=1.0, limit=limit),
        lambda: any_store.complete_command(task_id, "c"),
        lambda: any_store.release_command(task_id, "c"),
        lambda: any_store.prune(limit),
        lambda: any_store.save(machine.snapshot, expect_version=limit),
        lambda: any_store.create(task_id),
        lambda: any_store.query(task_id),
    ):
        clear_or_ok(call)
    after = any_store.get(machine.task_id)
    assert after is not None and after.status_version == snapshot_before.status_version  # type: ignore[union-attr]
    assert after.status is snapshot_before.status  # type: ignore[union-attr]


@pytest.mark.postgres
@SETTINGS
@given(
    name=hostile_text,
    label=st.one_of(st.none(), hostile_text),
    tags=st.lists(hostile_text, max_size=3),
    outcome=json_values,
    prefix=hostile_text,
)
def test_postgres_roundtrip_and_literal_prefix(
    pg_store: TaskStore, name: str, label: Any, tags: list[str], outcome: Any, prefix: str
) -> None:
    roundtrip(pg_store, fresh_id("pg"), name, label, tags, outcome)
    if "\x00" not in prefix:
        everything = pg_store.query()
        query = TaskQuery(name_prefix=prefix)
        assert [s.task_id for s in pg_store.query(query)] == [s.task_id for s in query.apply(everything)]


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[TaskStore]:
    pytest.importorskip("psycopg")
    store = open_store(pg_url)
    yield store
    store.close()


# -- through the Controller -------------------------------------------------------------------------


def test_non_json_result_fails_the_task_clearly_and_store_matches(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "c.db")
    controller = Controller(store=store, owner="hostile")

    class Opaque:
        pass

    controller.register("set_result", lambda ctx: {1, 2})
    controller.register("object_result", lambda ctx: Opaque())
    controller.register("nan_result", lambda ctx: float("nan"))
    try:
        runs = [
            controller.submit(name, task_id=name) for name in ("set_result", "object_result", "nan_result")
        ]
        controller.wait_all(timeout=20)
        for run in runs:
            assert run.status is S.FAILED
            assert run.snapshot.failure is not None and "JSON" in run.snapshot.failure.message
            stored = store.get(run.task_id)
            assert stored is not None and stored.status is S.FAILED
            assert stored == run.snapshot.evolve(
                progress=stored.progress,
                last_heartbeat_at=stored.last_heartbeat_at,
                lease_owner=stored.lease_owner,
                lease_until=stored.lease_until,
            )
            assert store.history(run.task_id) == list(run.transitions)
        assert controller.persist_failures == []
    finally:
        controller.close(close_store=True)


def module_level_echo(ctx: Any, value: Any) -> Any:
    return value


@pytest.mark.parametrize(
    "arg",
    [threading.Lock(), lambda: 1, (x for x in range(3))],
    ids=["lock", "lambda", "generator"],
)
def test_unpicklable_args_for_process_executor(tmp_path: Path, arg: Any) -> None:
    from chongming_task.runtime.executors import ProcessExecutor

    store = SqliteTaskStore(tmp_path / "p.db")
    controller = Controller(store=store, executor=ProcessExecutor(), owner="proc")
    controller.register("echo", module_level_echo)
    try:
        with pytest.raises(ConfigurationError) as info:
            controller.submit("echo", arg, task_id="unpicklable")
        assert "pickle" in str(info.value)
        assert store.get("unpicklable") is None, "被拒绝的提交不能留下任务"
        assert controller.runs() == []
    finally:
        controller.close(close_store=True)


def test_errors_are_task_errors_with_chinese_text() -> None:
    """所有"清楚的错误"都属于 TaskError 家族，消息是中文（至少含一个 CJK 字符）。"""
    samples: list[BaseException] = []
    for fn in (
        lambda: Progress(done=-1),
        lambda: RetryPolicy(max_attempts=0),
        lambda: TaskQuery(limit=-1),
        lambda: Controller(max_parallel=0),
        lambda: open_store("zzz://x"),
        lambda: BucketPolicy(0),
    ):
        with pytest.raises(CLEAR_ERRORS) as info:
            fn()
        samples.append(info.value)
    for exc in samples:
        assert isinstance(exc, TaskError)
        assert any("\u4e00" <= ch <= "\u9fff" for ch in str(exc)), str(exc)
    json.dumps([str(e) for e in samples], ensure_ascii=False)


def test_sqlite_url_query_is_refused_not_turned_into_a_file_name(tmp_path: Path) -> None:
    """回归：sqlite:///x.db?busy_timeout=5 曾静默打开一个名为 "x.db?busy_timeout=5" 的新文件。"""
    with pytest.raises(ConfigurationError, match="关键字参数"):
        open_store(f"sqlite:///{tmp_path}/x.db?busy_timeout=5")
    with pytest.raises(ConfigurationError):
        open_store("sqlite:///:memory:?unknown=1")
    assert list(tmp_path.iterdir()) == []
    store = open_store(f"sqlite:///{tmp_path}/x.db", busy_timeout=5)  # 选项的正确写法
    store.close()
