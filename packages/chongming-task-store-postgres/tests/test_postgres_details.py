"""PostgresTaskStore 独有的细节：PostgreSQL 存不下的输入、表结构版本、建表 SQL、连接串、惰性导入、
单次往返的 save。"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from chongming_task.errors import ConcurrencyConflict, ConfigurationError, StoreError, TaskNotFound
from chongming_task.models import Failure, FailureKind, Progress
from chongming_task.states import TaskStatus
from chongming_task.storage import TaskQuery
from chongming_task.stores.postgres import SCHEMA_VERSION, PostgresTaskStore
from chongming_task.stores.postgres._codec import json_text
from chongming_task.stores.postgres.store import redact
from chongming_task.testing import FakeClock
from chongming_task.testing.store_contract import snap, step, walk

# -- 不需要数据库的部分 ------------------------------------------------------------------------------


def test_json_nul_detection_is_exact() -> None:
    with pytest.raises(ConfigurationError, match="NUL"):
        json_text({"k": "a\x00b"}, "outcome")
    with pytest.raises(ConfigurationError, match="NUL"):
        json_text({"a\x00": 1}, "outcome")
    with pytest.raises(ConfigurationError, match="NUL"):
        json_text(["\\\x00"], "outcome")  # 反斜杠后紧跟 NUL
    # 字面的 "\u0000" 六个字符不是 NUL：json 里它是 "\\u0000"，jsonb 能存。
    assert json_text({"k": "\\u0000"}, "outcome") == '{"k":"\\\\u0000"}'
    assert json_text({"k": "\\\\u0000"}, "outcome")


def test_bad_constructor_arguments_are_configuration_errors() -> None:
    for kwargs in (
        {"schema": ""},
        {"schema": "pg_catalog"},
        {"schema": "x" * 64},
        {"schema": "a\x00b"},
        {"min_size": -1},
        {"max_size": 0},
        {"min_size": 4, "max_size": 2},
        {"pool_timeout": 0},
        {"connect_timeout": float("nan")},
    ):
        with pytest.raises(ConfigurationError):
            PostgresTaskStore("postgresql://nobody@127.0.0.1:1/none", **kwargs)
    with pytest.raises(ConfigurationError, match="连接串"):
        PostgresTaskStore("")


def test_schema_sql_is_complete_and_quoted() -> None:
    text = PostgresTaskStore.schema_sql('weird "name"')
    assert text.startswith("BEGIN;") and text.rstrip().endswith("COMMIT;")
    assert 'CREATE SCHEMA IF NOT EXISTS "weird ""name"""' in text
    for table in ("schema_version", "tasks", "transitions", "commands"):
        assert f'"weird ""name""".{table}' in text
    assert "USING gin (tags)" in text
    assert "SEQUENCE" not in text.upper() and "SERIAL" not in text.upper(), "只读写角色用不了序列"
    with pytest.raises(ConfigurationError):
        PostgresTaskStore.schema_sql("pg_nope")


def test_importing_without_the_driver_gives_the_install_command() -> None:
    """没有 psycopg 时：import chongming_task 照常；取 PostgresTaskStore 才报错，且带安装命令。"""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["psycopg"] = None  # 模拟没装驱动
        sys.modules["psycopg_pool"] = None
        import chongming_task
        print("core-ok")
        for attempt in ("facade", "module"):
            try:
                if attempt == "facade":
                    chongming_task.PostgresTaskStore
                else:
                    import chongming_task.stores.postgres
            except ImportError as exc:
                assert 'pip install "chongming-task[postgres]"' in str(exc), str(exc)
                assert isinstance(exc.__cause__, ImportError), "要用 from 链上真实的导入错误"
                print(attempt + "-hint")
            else:
                raise SystemExit(attempt + ": 应当抛 ImportError")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["core-ok", "facade-hint", "module-hint"]


# -- 需要数据库的部分 --------------------------------------------------------------------------------


@pytest.fixture
def store(postgres_dsn: str, schema: str) -> Any:
    opened = PostgresTaskStore(postgres_dsn, schema=schema)
    yield opened
    opened.close()


@pytest.mark.postgres
def test_nul_characters_are_rejected_without_writing(store: PostgresTaskStore) -> None:
    # 文本字段里的 NUL 在快照构造时就被拒绝（所有后端共用的规则，用户指南 §13）；绕过构造校验
    # （evolve）的快照在写入时同样被拒绝。
    bad_snapshots = [
        snap("nul-label").evolve(label="a\x00b"),
        snap("nul-desc").evolve(description="x\x00"),
        snap("nul-owner").evolve(owner="node\x00a"),
        snap("nul-outcome", outcome={"text": "before\x00after"}),
        snap("nul-key", outcome={"k\x00": 1}),
    ]
    for bad in bad_snapshots:
        with pytest.raises(ConfigurationError, match="NUL"):
            store.create(bad)
        assert store.get(bad.task_id) is None, f"{bad.task_id} 被拒绝了却留下了一行"
    with pytest.raises(ConfigurationError, match="NUL"):
        snap("nul-label", label="a\x00b")
    with pytest.raises(ConfigurationError, match="NUL"):
        Progress(done=1, message="p\x00")
    # 失败来自异常，不能拒绝：NUL 被转义成可见的 \x00，于是每个后端都存得下。
    escaped = snap("nul-failure", failure=Failure(kind=FailureKind.EXCEPTION, message="boom\x00"))
    store.create(escaped)
    got_failure = store.get("nul-failure")
    assert got_failure is not None and got_failure.failure is not None
    assert got_failure.failure.message == "boom\\x00"

    base = snap("nul-save")
    store.create(base)
    with pytest.raises(ConfigurationError, match="NUL"):
        step(base, TaskStatus.QUEUED, reason="原因\x00")
    nxt, record = step(base, TaskStatus.QUEUED, outcome=["\x00"])
    with pytest.raises(ConfigurationError, match="NUL"):
        store.save(nxt, expect_version=0, transitions=[record])
    with pytest.raises(ConfigurationError, match="NUL"):
        Progress(done=1, unit="\x00")
    with pytest.raises(ConfigurationError, match="NUL"):
        store.submit_command("nul-save", "stop", reason="r\x00")
    with pytest.raises(ConfigurationError, match="NUL"):
        store.submit_command("nul-save", "stop", payload={"x": "\x00"})
    got = store.get("nul-save")
    assert got is not None and got.status_version == 0 and got.progress is None
    assert store.history("nul-save") == []
    assert store.claim_commands("w", lease=10) == []
    # 查询条件里的 NUL 同样是用法错误，而不是数据库报错。
    with pytest.raises(ConfigurationError):
        store.query(TaskQuery(owner="a\x00"))
    assert store.get("a\x00") is None


@pytest.mark.postgres
def test_integers_out_of_range_are_configuration_errors(store: PostgresTaskStore) -> None:
    with pytest.raises(ConfigurationError, match="范围"):
        store.create(snap("huge-priority", priority=2**63))
    with pytest.raises(ConfigurationError, match="范围"):
        store.create(snap("huge-bucket", bucket=2**31))
    assert store.query() == []
    # jsonb 里的大整数没有位宽限制：原样往返。
    store.create(snap("big-json", outcome=[2**80, -(2**70)]))
    got = store.get("big-json")
    assert got is not None and got.outcome == [2**80, -(2**70)]


@pytest.mark.postgres
def test_time_offsets_round_trip_including_odd_ones(store: PostgresTaskStore) -> None:
    odd = timezone(timedelta(hours=5, minutes=45))  # 尼泊尔
    west = timezone(timedelta(hours=-9, minutes=-30))
    created = datetime(2026, 7, 1, 12, 0, 0, 999999, tzinfo=odd)
    base = snap("tz", at=created, lease_until=datetime(2026, 7, 1, 0, 0, tzinfo=west))
    store.create(base)
    got = store.get("tz")
    assert got is not None
    assert got.to_dict() == base.to_dict()
    assert got.created_at.utcoffset() == timedelta(hours=5, minutes=45)
    assert store.touch("tz", heartbeat_at=datetime(2026, 7, 1, 1, 2, 3, 4, tzinfo=west))
    got = store.get("tz")
    assert got is not None and got.last_heartbeat_at is not None
    assert got.last_heartbeat_at.isoformat() == "2026-07-01T01:02:03.000004-09:30"


@pytest.mark.postgres
def test_save_is_a_single_round_trip(store: PostgresTaskStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """热路径：快照 + 迁移记录在一条语句里（一次往返），不是 BEGIN/UPDATE/INSERT/COMMIT 四次。"""
    base = snap("rt")
    store.create(base)
    executed: list[str] = []
    # 在游标上数：Connection.execute 也经 Cursor.execute，而写语句走的是连接上复用的游标（store._cursor）
    original = psycopg.Cursor.execute

    def counting(self: psycopg.Cursor[Any], query: Any, *args: Any, **kwargs: Any) -> Any:
        executed.append(str(query)[:40])
        return original(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counting)
    current, records = walk(base, TaskStatus.QUEUED, TaskStatus.STARTING, TaskStatus.RUNNING)
    store.save(current, expect_version=0, transitions=records)
    assert len(executed) == 1, executed
    executed.clear()
    with pytest.raises(ConcurrencyConflict, match="期望 status_version=0，存储中为 3"):
        store.save(current, expect_version=0, transitions=records)
    monkeypatch.undo()
    assert store.history("rt") == records


def _count_executes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """数经 ``Connection.execute`` 发出的语句（Cursor.execute 另数：管道里逐条执行走的也是它）。"""
    executed: list[str] = []
    for cls in (psycopg.Connection, psycopg.Cursor):
        original = cls.execute

        def counting(self: Any, query: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            executed.append(str(query)[:40])
            return _original(self, query, *args, **kwargs)

        monkeypatch.setattr(cls, "execute", counting)
    return executed


@pytest.mark.postgres
def test_group_commit_batch_is_one_statement(
    store: PostgresTaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """组提交的一批 save（互不相同的任务）是一条语句、一次往返，而不是 BEGIN、每项一条、COMMIT；逐项结果照旧：
    冲突与不存在的项什么也不写，没有迁移记录的项、一步与多步的项都写对。"""
    from chongming_task.storage import SaveRequest

    bases = [snap(f"gb-{i}") for i in range(4)]
    for base in bases:
        store.create(base)
    stale, stale_record = step(bases[3], TaskStatus.QUEUED)
    store.save(stale, expect_version=0, transitions=[stale_record])
    one, one_records = walk(bases[0], TaskStatus.QUEUED)
    many, many_records = walk(bases[1], TaskStatus.QUEUED, TaskStatus.STARTING, TaskStatus.RUNNING)
    quiet = bases[2].evolve(label="只改字段")  # 没有迁移记录
    late, late_record = step(bases[3], TaskStatus.CANCELLED)  # 以为版本还是 0
    ghost, ghost_record = step(snap("gb-ghost"), TaskStatus.QUEUED)
    executed = _count_executes(monkeypatch)
    results = store.save_many(
        [
            SaveRequest(many, 0, many_records),
            SaveRequest(late, 0, [late_record]),
            SaveRequest(one, 0, one_records),
            SaveRequest(ghost, 0, [ghost_record]),
            SaveRequest(quiet, 0, ()),
        ]
    )
    # 批量语句经 RawCursor.execute 发出（只数一次，见 _sql.numbered）；冲突的那项另有一次读。
    writes = [text for text in executed if not text.startswith("SELECT status_version")]
    assert len(writes) == 1 and writes[0].startswith("WITH u "), executed
    monkeypatch.undo()
    assert results[0] is None and results[2] is None and results[4] is None
    assert isinstance(results[1], ConcurrencyConflict) and "存储中为 1" in str(results[1])
    assert isinstance(results[3], TaskNotFound)
    assert store.get("gb-0") == one and store.history("gb-0") == one_records
    assert store.get("gb-1") == many and store.history("gb-1") == many_records
    assert store.get("gb-2") == quiet and store.history("gb-2") == []
    assert store.get("gb-3") == stale and store.history("gb-3") == [stale_record]
    assert store.get("gb-ghost") is None and store.history("gb-ghost") == []


@pytest.mark.postgres
def test_write_many_is_one_statement_with_per_item_results(
    store: PostgresTaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """组提交的混合批（create + save）是一条语句、一次往返；逐项结果与单独写时相同：已存在的 id、同批里
    重复的 id 是 DuplicateTaskId，存不下的值是 ConfigurationError（不进语句），冲突与不存在的 save 什么也
    不写。冒名的 create 撞上同批正被 save 的那个任务时，它的迁移记录不能借那个 id 写进去。"""
    from chongming_task.errors import DuplicateTaskId
    from chongming_task.storage import SaveRequest
    from chongming_task.testing.contract._base import full_snapshot

    existing = [snap(f"wb-{i}") for i in range(3)]
    for base in existing:
        store.create(base)
    stale, stale_record = step(existing[2], TaskStatus.QUEUED)
    store.save(stale, expect_version=0, transitions=[stale_record])
    one, one_records = walk(existing[0], TaskStatus.QUEUED)
    many, many_records = walk(existing[1], TaskStatus.QUEUED, TaskStatus.STARTING, TaskStatus.RUNNING)
    late, late_record = step(existing[2], TaskStatus.CANCELLED)  # 以为版本还是 0
    ghost, ghost_record = step(snap("wb-ghost"), TaskStatus.QUEUED)
    full = full_snapshot().evolve(task_id="wb-full", status=TaskStatus.PENDING, status_version=0)
    fresh, fresh_record = step(full, TaskStatus.QUEUED, actor='演员 "甲"', reason="原因\\含反斜杠")
    plain, plain_record = step(snap("wb-plain", tags=frozenset({'a"b', "x,y"})), TaskStatus.QUEUED)
    impostor, impostor_record = step(snap("wb-1", label="impostor"), TaskStatus.QUEUED, actor="冒名者")
    twin, twin_record = step(snap("wb-plain", label="twin"), TaskStatus.QUEUED)
    bad = snap("wb-bad", outcome={"text": "a\x00b"})  # jsonb 存不下 NUL：编码这一项时就被拒绝
    executed = _count_executes(monkeypatch)
    created, saved = store.write_many(
        [
            (fresh, [fresh_record]),
            (impostor, [impostor_record]),
            (plain, [plain_record]),
            (twin, [twin_record]),
            (bad, []),
        ],
        [
            SaveRequest(many, 0, many_records),
            SaveRequest(late, 0, [late_record]),
            SaveRequest(one, 0, one_records),
            SaveRequest(ghost, 0, [ghost_record]),
        ],
    )
    writes = [text for text in executed if not text.startswith("SELECT status_version")]
    # 批量语句经 RawCursor.execute 发出（只数一次，见 _sql.numbered）；冲突的那项另有一次读。
    assert len(writes) == 1 and writes[0].startswith("WITH c "), executed
    # 两段的迁移记录一条 INSERT（每条写迁移记录表的 INSERT 都要服务器重新解析、编译它的 CHECK 约束）。
    text = store._sql.write_batch(
        3, 4
    )  # 这一批进语句的是 3 个 create（bad 编码时被拒、twin 同批重复）与 4 项 save
    assert text.count("INSERT INTO") == 2 and text.count(".transitions (") == 1, text
    monkeypatch.undo()
    assert created[0] is None and created[2] is None
    assert isinstance(created[1], DuplicateTaskId) and isinstance(created[3], DuplicateTaskId)
    assert isinstance(created[4], ConfigurationError)
    assert saved[0] is None and saved[2] is None
    assert isinstance(saved[1], ConcurrencyConflict) and "存储中为 1" in str(saved[1])
    assert isinstance(saved[3], TaskNotFound)
    assert store.get("wb-full") == fresh and store.history("wb-full") == [fresh_record]
    assert store.get("wb-plain") == plain and store.history("wb-plain") == [plain_record]
    assert store.get("wb-0") == one and store.history("wb-0") == one_records
    assert store.get("wb-1") == many and store.history("wb-1") == many_records, "冒名者的记录不能写进去"
    assert store.get("wb-2") == stale and store.history("wb-2") == [stale_record]
    assert store.get("wb-ghost") is None and store.get("wb-bad") is None
    assert store.write_many([], []) == ([], [])


@pytest.mark.postgres
def test_write_many_with_a_chained_save_is_still_one_transaction(
    store: PostgresTaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """同一任务在批里有两项 save（要链式写，一条 UPDATE 写不下）：仍是一个事务——管道里先插入新任务、再按
    task_id 顺序写 save，逐项结果照旧。"""
    from chongming_task.errors import DuplicateTaskId
    from chongming_task.storage import SaveRequest

    base = snap("wp-chain")
    store.create(base)
    store.create(snap("wp-taken"))
    queued, r1 = step(base, TaskStatus.QUEUED)
    starting, r2 = step(queued, TaskStatus.STARTING)
    fresh, fresh_record = step(snap("wp-new"), TaskStatus.QUEUED)
    again, again_record = step(snap("wp-taken", label="again"), TaskStatus.QUEUED)
    transactions: list[int] = []
    original = psycopg.Connection.transaction

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        transactions.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "transaction", counting)
    created, saved = store.write_many(
        [(fresh, [fresh_record]), (again, [again_record])],
        [SaveRequest(queued, 0, [r1]), SaveRequest(starting, 1, [r2])],
    )
    monkeypatch.undo()
    assert transactions == [1], "一个事务"
    assert created[0] is None and isinstance(created[1], DuplicateTaskId)
    assert saved == [None, None]
    assert store.get("wp-chain") == starting and store.history("wp-chain") == [r1, r2]
    assert store.get("wp-new") == fresh and store.history("wp-new") == [fresh_record]
    assert store.history("wp-taken") == []


@pytest.mark.postgres
def test_concurrent_write_many_over_the_same_tasks_never_deadlocks(store: PostgresTaskStore) -> None:
    """几个线程同时写混合批：同样几个新 id（彼此重复）与同样几个已有任务的 save，各自按打乱的顺序给出。
    所有批次按同一顺序加锁（先按 task_id 插入，再按 task_id 锁行）：没有一批以死锁失败，每个新 id 恰好
    一个赢家。（按给出的顺序插入的变体在这里多半以 "deadlock detected" 失败：每批 40 个新 id，足够让两批
    交错着互等。）"""
    import random
    import threading

    from chongming_task.storage import SaveRequest

    targets = [snap(f"wd-t{i}") for i in range(4)]
    for target in targets:
        store.create(target)
    errors: list[BaseException] = []
    winners: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(4)

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for round_ in range(30):
                start.wait(10)
                creates = [step(snap(f"wd-{round_}-{j}"), TaskStatus.QUEUED) for j in range(40)]
                rng.shuffle(creates)
                saves = []
                for target in rng.sample(targets, len(targets)):
                    current = store.get(target.task_id)
                    assert current is not None
                    moved = current.evolve(label=f"{seed}-{round_}")
                    saves.append(SaveRequest(moved, current.status_version, ()))
                created, _ = store.write_many([(q, [r]) for q, r in creates], saves)
                with lock:
                    winners.extend(q.task_id for (q, _), e in zip(creates, created, strict=True) if e is None)
        except BaseException as exc:
            errors.append(exc)
            start.abort()

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [], errors
    assert sorted(winners) == sorted(f"wd-{r}-{j}" for r in range(30) for j in range(40))


def _generic_plan(conn: Any, text: str) -> list[str]:
    """``text``（psycopg 的 ``%s`` / ``%(名字)s`` 占位符）作为预备语句的通用计划：psycopg 执行第 5 次起
    服务器用的就是它。"""
    numbers: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        name = match.group(1) or f"#{len(numbers)}"
        return f"${numbers.setdefault(name, len(numbers) + 1)}"

    prepared = re.sub(r"%(?:\((\w+)\))?[sb]", number, text)
    count = len(numbers) or len(set(re.findall(r"\$\d+", prepared)))  # 批量语句已是 $n（见 _sql.numbered）
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(f"PREPARE batch AS {prepared}")
    try:
        nulls = ", ".join(["NULL"] * count)
        return [str(row[0]) for row in conn.execute(f"EXPLAIN EXECUTE batch({nulls})")]
    finally:
        conn.execute("DEALLOCATE batch")


def test_batch_statements_are_numbered_once_and_sent_raw(monkeypatch: pytest.MonkeyPatch) -> None:
    """组提交的批量语句在渲染时就换成 ``$n``、用 RawCursor 原样发出：psycopg 的普通游标对长于 4,096 字节或
    多于 50 个参数的语句不缓存 ``%s`` → ``$n`` 的转换，每次执行都在客户端重新切一遍（这两条都超过）。"""
    from chongming_task.stores.postgres._sql import Sql, numbered

    sql = Sql("s")
    for text in (sql.save_batch(1), sql.save_batch(3), sql.write_batch(1, 0), sql.write_batch(2, 3)):
        assert "%" not in text
        placeholders = [int(n) for n in re.findall(r"\$(\d+)", text)]
        assert placeholders == list(range(1, len(placeholders) + 1)), "按出现顺序编号、各出现一次"
    assert numbered("a %s b %s") == "a $1 b $2"
    with pytest.raises(AssertionError):
        numbered("LIKE 'x%' AND %s")


@pytest.mark.postgres
def test_batch_writes_look_rows_up_by_key_even_when_planned_on_a_small_table(
    store: PostgresTaskStore, postgres_dsn: str
) -> None:
    """组提交的批量写（``save_batch`` / ``write_batch``）与续租（``touch_many`` / ``renew_leases``）
    是预备语句：
    通用计划在表还小、没有统计信息时定下，之后一直用。它们必须按主键逐行找（锁行、UPDATE、"在不在"），
    不能顺序扫描整张 tasks——否则每批的代价随表长大而线性增长（旧语句在这里对 2 项以上的批都是 Seq Scan）。"""
    for i in range(30):
        store.create(snap(f"gp-{i}"))
    sql = store._sql
    texts = {
        "save_batch(1)": sql.save_batch(1),
        "save_batch(2)": sql.save_batch(2),
        "save_batch(16)": sql.save_batch(16),
        "write_batch(1, 2)": sql.write_batch(1, 2),
        "write_batch(3, 5)": sql.write_batch(3, 5),
        "touch_many": sql.touch_many,
        "renew_leases": sql.renew_leases,
    }
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        for name, text in texts.items():
            plan = _generic_plan(conn, text)
            scans = [line.strip() for line in plan if " on tasks" in line and "Scan" in line]
            assert scans and all("using tasks_pkey" in line for line in scans), (name, plan)


@pytest.mark.postgres
def test_batch_and_single_step_writes_round_trip_every_field(store: PostgresTaskStore) -> None:
    """批量合成的一条 save（按位置绑定、VALUES 里逐列转换类型）与只带一条迁移记录的 create / save（迁移记录按
    标量参数绑定）写下的每个字段都与快照逐字相同：JSON 列、标签、带任意偏移的时间、None 的列。"""
    from chongming_task.storage import SaveRequest
    from chongming_task.testing.contract._base import full_snapshot

    full = full_snapshot()
    odd = timezone(timedelta(hours=-9, minutes=-30))
    created = datetime(2026, 7, 1, 1, 2, 3, 4, tzinfo=odd)
    first = full.evolve(task_id="rt-full-a", status=TaskStatus.PENDING, status_version=0, created_at=created)
    second = full.evolve(
        task_id="rt-full-b", status=TaskStatus.PENDING, status_version=0, pid=None, label=None
    )
    queued_a, record_a = step(first, TaskStatus.QUEUED, actor='演员 "甲"', reason="原因\\含反斜杠")
    queued_b, record_b = step(second, TaskStatus.QUEUED)
    store.create(queued_a, [record_a])  # 一条迁移记录：标量参数
    store.create(queued_b, [record_b])
    assert store.get("rt-full-a") == queued_a and store.history("rt-full-a") == [record_a]
    done_a, records_a = walk(queued_a, TaskStatus.STARTING, TaskStatus.RUNNING, TaskStatus.FAILED)
    done_a = done_a.evolve(outcome={"嵌套": [1, 2.5, None, "x"]}, tags=frozenset({'a"b', "c\\d", "x,y"}))
    starting_b, record_b2 = step(queued_b, TaskStatus.STARTING)
    assert store.save_many(
        [SaveRequest(done_a, queued_a.status_version, records_a), SaveRequest(starting_b, 1, [record_b2])]
    ) == [None, None]
    assert store.get("rt-full-a") == done_a
    assert store.get("rt-full-b") == starting_b
    assert store.history("rt-full-a") == [record_a, *records_a]
    assert store.history("rt-full-b") == [record_b, record_b2]
    running_b, record_b3 = step(starting_b, TaskStatus.RUNNING)
    store.save(running_b, expect_version=2, transitions=[record_b3])  # 一步的 save：标量参数
    assert store.get("rt-full-b") == running_b
    assert store.history("rt-full-b") == [record_b, record_b2, record_b3]
    stored = store.get("rt-full-b")
    assert stored is not None and stored.created_at.utcoffset() == full.created_at.utcoffset()


@pytest.mark.postgres
def test_newer_schema_version_is_refused(postgres_dsn: str, schema: str, admin: Any) -> None:
    PostgresTaskStore(postgres_dsn, schema=schema).close()
    admin.execute(f'UPDATE "{schema}".schema_version SET version = {SCHEMA_VERSION + 1}')
    with pytest.raises(StoreError, match="高于本程序支持的"):
        PostgresTaskStore(postgres_dsn, schema=schema)


@pytest.mark.postgres
def test_schema_sql_applied_by_hand_is_accepted(postgres_dsn: str, schema: str, admin: Any) -> None:
    admin.execute(PostgresTaskStore.schema_sql(schema))
    store = PostgresTaskStore(postgres_dsn, schema=schema)
    try:
        store.create(snap("by-hand"))
        assert store.get("by-hand") is not None
    finally:
        store.close()


@pytest.mark.postgres
def test_from_url_strips_our_parameters_and_redacts_the_password(postgres_dsn: str, schema: str) -> None:
    sep = "&" if "?" in postgres_dsn else "?"
    url = f"{postgres_dsn}{sep}schema={schema}&max_size=2&pool_timeout=3&application_name=from-url-test"
    store = PostgresTaskStore.from_url(url, min_size=0)
    try:
        assert store.schema == schema
        assert store.pool.max_size == 2
        store.create(snap("u"))
        assert store.get("u") is not None
    finally:
        store.close()
    with pytest.raises(ConfigurationError, match="max_size"):
        PostgresTaskStore.from_url(f"{postgres_dsn}{sep}max_size=lots")
    assert "hunter2" not in redact("postgresql://u:hunter2@db.internal:5432/x")
    assert "***" in redact("host=db password=hunter2 dbname=x")
    # 服务器是 trust 认证时口令被忽略，正好用来确认 repr 不泄露它。
    with_password = PostgresTaskStore(make_conninfo(postgres_dsn, password="hunter2"), schema=schema)
    try:
        assert "hunter2" not in repr(with_password) and schema in repr(with_password)
    finally:
        with_password.close()
    assert "closed" in repr(with_password)


@pytest.mark.postgres
def test_claim_uses_the_injected_clock(postgres_dsn: str, schema: str) -> None:
    clock = FakeClock(start=datetime(2030, 1, 1, tzinfo=UTC))
    store = PostgresTaskStore(postgres_dsn, schema=schema, clock=clock)
    try:
        store.create(snap("clocked"))
        command = store.submit_command("clocked", "stop")
        assert command.created_at == clock.now()
        (claimed,) = store.claim_commands("a", lease=10)
        assert claimed.lease_until == clock.now() + timedelta(seconds=10)
        clock.advance(9.999)
        assert store.claim_commands("b", lease=10) == []
        clock.advance(0.001)  # lease_until <= now 即过期
        (again,) = store.claim_commands("b", lease=10)
        assert again.deliveries == 2
        assert store.claim_commands("c", lease=10, buckets=[2**40]) == []
    finally:
        store.close()


@pytest.mark.postgres
def test_touch_many_is_one_transaction(store: PostgresTaskStore) -> None:
    for i in range(3):
        store.create(snap(f"tm-{i}"))
    until = datetime(2026, 5, 1, tzinfo=UTC)
    store.touch_many(
        [(f"tm-{i}", {"lease_owner": "node-z", "lease_until": until}) for i in range(3)]
        + [("tm-missing", {"lease_owner": "node-z"})]
    )
    assert [s.lease_owner for s in store.query(TaskQuery(order="oldest"))] == ["node-z"] * 3
    with pytest.raises(ConfigurationError, match="NUL"):
        store.touch_many([("tm-0", {"lease_owner": "x"}), ("tm-1", {"lease_owner": "bad\x00"})])
    got = store.get("tm-0")
    assert got is not None and got.lease_owner == "node-z", "校验失败的批次一条也不能写"
    with pytest.raises(ConfigurationError, match="未知字段"):
        store.touch_many([("tm-0", {"status": "running"})])


@pytest.mark.postgres
def test_touch_many_merges_repeats_like_updates_in_order(store: PostgresTaskStore) -> None:
    """一条语句更新一批：同一任务出现多次时按先后合并字段（与逐条 touch 的结果相同），没给的字段不动。"""
    for i in range(2):
        store.create(snap(f"tr-{i}"))
    until = datetime(2026, 5, 1, tzinfo=timezone(timedelta(hours=8)))
    beat = datetime(2026, 4, 1, tzinfo=UTC)
    store.touch_many(
        [
            ("tr-0", {"progress": Progress(done=1, total=4), "lease_owner": "first"}),
            ("tr-1", {"heartbeat_at": beat}),
            ("tr-0", {"lease_owner": "second", "lease_until": until}),
        ]
    )
    first, second = store.get("tr-0"), store.get("tr-1")
    assert first is not None and second is not None
    assert (first.progress, first.lease_owner, first.lease_until) == (
        Progress(done=1, total=4),
        "second",
        until,
    )
    assert str(first.lease_until.utcoffset()) == "8:00:00"  # 偏移随数组一起往返
    assert (second.last_heartbeat_at, second.progress, second.lease_owner) == (beat, None, None)
    store.touch_many([("tr-1", {"heartbeat_at": beat + timedelta(seconds=1)})])  # 其余数组全是 NULL
    again = store.get("tr-1")
    assert again is not None and again.last_heartbeat_at == beat + timedelta(seconds=1)


def test_json_text_writes_exponent_floats_in_fixed_point_exactly_when_the_value_has_one() -> None:
    """jsonb 把 ``1e+17`` 读回成整数：带指数的浮点数改写成定点。判定先看文本里有没有"数字 e 数字"
    （``_EXPONENT``）再遍历值；结果与"总是遍历值"逐字相同——字符串里的 "1e5"、键里的 e 都不算。"""
    import json
    import random

    from chongming_task.stores.postgres._codec import _has_exponent_float, _plain_json

    def reference(value: object) -> str:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        return _plain_json(value) if _has_exponent_float(value) else text

    fixed = [
        1e17,
        -2.5e300,
        1.5e-07,
        {"name": "x1e5", "kwargs": {"e": 1}},
        ["1e+17", 1e16, 2.0],
        {"k": [1.0629773069210299e17]},
        {"1E5": "2e-3"},
        0.0001,
        123456789.0,
    ]
    rng = random.Random(7)
    pieces = [1, 2.5, 1e17, 3e-9, "e", "1e5", "E9", None, True, -7e22, 1.0]

    def build(depth: int) -> object:
        if depth > 3 or rng.random() < 0.3:
            return rng.choice(pieces)
        if rng.random() < 0.5:
            return [build(depth + 1) for _ in range(rng.randint(0, 3))]
        return {f"k{index}e": build(depth + 1) for index in range(rng.randint(0, 3))}

    for value in fixed + [build(0) for _ in range(2000)]:
        assert json_text(value, "outcome") == reference(value), value
    assert json_text(1e17, "outcome") == "100000000000000000.0"


def test_history_rows_encode_exactly_like_json_dumps() -> None:
    """迁移记录的 JSON 参数（``_sql.rows_param``）复用一个 C 编码器：与原来的 ``json.dumps(...,
    default=_json_value)`` 逐字相同（时间经 isoformat、非 ASCII 原样、NULL）。"""
    import json

    from chongming_task.stores.postgres import _sql
    from chongming_task.stores.postgres._codec import TRANSITIONS
    from chongming_task.testing.contract._base import snap, walk

    _, records = walk(snap('任务\u2028"x'), TaskStatus.QUEUED, TaskStatus.STARTING, TaskStatus.RUNNING)
    rows = [TRANSITIONS.params(record) for record in records]
    expected = json.dumps(rows, ensure_ascii=False, default=_sql._json_value, separators=(",", ":"))
    assert _sql.rows_param(rows) == {"t_rows": expected}
    assert _sql.rows_param([]) == {"t_rows": "[]"}


def test_queued_notice_payload_is_what_json_dumps_writes() -> None:
    """入队通知的载荷（``_claim.notice_params``）直接拼成文本：与 ``json.dumps`` 逐字相同（task_id 转义、
    桶号整数或 null），listener 照旧按 JSON 解析。"""
    import json

    from chongming_task.stores.postgres._claim import notice_params
    from chongming_task.testing.contract._base import snap

    for task_id, bucket in (("t-1", None), ('任务"\\\u2028x', 7), ("a", 0), ("b", 2**40)):
        payload = notice_params("channel", snap(task_id).evolve(bucket=bucket))["notice_payload"]
        assert payload == json.dumps({"kind": "queued", "task_id": task_id, "bucket": bucket})
        assert json.loads(payload) == {"kind": "queued", "task_id": task_id, "bucket": bucket}
