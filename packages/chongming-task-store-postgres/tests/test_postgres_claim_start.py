"""PostgresTaskStore 的"认领并开始"（``claim_queued(..., start=...)``）：一条语句里照状态机的规矩写 starting。

那条语句（``_claim.claim_start_sql``）把 ``mark_starting`` 的改动逐列写成了 SQL，所以这里逐字段（连时区偏移）
对照 ``claiming.start_claimed`` 算出的快照与迁移记录：状态机那边多改一个字段、这边漏写一列，都会在这里失败。
另一个用例让几个各自一个连接池的存储（等同于几台机器）同时抢同一批任务：每个任务只被一个开始，且每个开始了的
任务都有它那一条 queued → starting 的迁移记录（历史没有空洞）。
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest

from chongming_task.core.storage.claiming import ClaimStart, QueuedClaim, claimed, start_claimed
from chongming_task.models import Failure, FailureKind, TaskSnapshot, Transition
from chongming_task.states import TaskStatus
from chongming_task.stores.postgres import PostgresTaskStore
from chongming_task.testing.contract.durable import durable

pytestmark = pytest.mark.postgres

S = TaskStatus
LEASE = datetime(2026, 3, 1, 9, 0, 0, tzinfo=timezone(timedelta(hours=-5)))
NAMES = ["contract-task"]


@pytest.fixture
def store(postgres_dsn: str, schema: str) -> Iterator[PostgresTaskStore]:
    opened = PostgresTaskStore(postgres_dsn, schema=schema)
    yield opened
    opened.close()


def _exact(value: object) -> object:
    """相等之外还要同一个时区偏移（datetime 的 == 只比时刻）。"""
    return (value, value.utcoffset()) if isinstance(value, datetime) else value


def _fields(snapshot: TaskSnapshot) -> dict[str, object]:
    return {name: _exact(getattr(snapshot, name)) for name in TaskSnapshot.FIELD_NAMES}


def _record(transition: Transition) -> tuple[object, ...]:
    return (
        transition.task_id,
        transition.version,
        transition.from_status,
        transition.to_status,
        transition.trigger,
        transition.actor,
        transition.reason,
        _exact(transition.at),
    )


@pytest.mark.parametrize("executor", ["thread", None])
def test_claim_and_start_writes_what_the_state_machine_computes(
    store: PostgresTaskStore, executor: str | None
) -> None:
    retried = Failure(FailureKind.EXCEPTION, "上一次尝试失败", retryable=True)
    before = [
        durable("fresh", seconds=0),
        # 重试之后回到 queued 的样子：上一次尝试留下的 failure / retry_at / pid / 执行器名都要照状态机处理
        durable(
            "again",
            seconds=1,
            attempt=1,
            max_attempts=3,
            failure=retried,
            retry_at=datetime(2026, 3, 1, 8, 0, 30, tzinfo=timezone(timedelta(hours=3))),
            pid=4242,
            executor="process",
            status_version=5,
        ),
        durable("spent", seconds=2, attempt=3, max_attempts=3),  # 状态机不让开始：只认领
    ]
    for snapshot in before:
        store.create(snapshot)
    at = datetime(2026, 3, 1, 16, 0, 7, 123456, tzinfo=timezone(timedelta(hours=8)))
    start = ClaimStart(at=at, executor=executor)
    request = QueuedClaim("worker-a", frozenset(NAMES), None, 5, LEASE)
    got = store.claim_queued("worker-a", names=NAMES, limit=5, lease_until=LEASE, start=start)

    assert [snapshot.task_id for snapshot in got] == ["fresh", "again", "spent"]
    for snapshot, original in zip(got, before, strict=True):
        held = claimed(original, request)
        begun = start_claimed(held, start)
        want, history = (held, ()) if begun is None else begun
        assert _fields(snapshot) == _fields(want), snapshot.task_id
        stored = store.get(snapshot.task_id)
        assert stored is not None
        assert _fields(stored) == _fields(want), snapshot.task_id
        assert [_record(t) for t in store.history(snapshot.task_id)] == [_record(t) for t in history]
    assert [s.status for s in got] == [S.STARTING, S.STARTING, S.QUEUED]


def test_racing_stores_start_every_task_once_each_with_its_transition_record(
    postgres_dsn: str, schema: str
) -> None:
    total = 120
    stores = [PostgresTaskStore(postgres_dsn, schema=schema, min_size=2, max_size=2) for _ in range(3)]
    try:
        for index in range(total):
            stores[0].create(durable(f"race-{index:03d}", seconds=index % 7))
        taken: dict[str, list[str]] = {}
        errors: list[BaseException] = []
        lock = threading.Lock()
        barrier = threading.Barrier(6)

        def worker(store: PostgresTaskStore, holder: str) -> None:
            start = ClaimStart(at=LEASE, executor=holder)
            barrier.wait()
            try:
                while True:
                    got = store.claim_queued(holder, names=NAMES, limit=2, lease_until=LEASE, start=start)
                    with lock:
                        for snapshot in got:
                            taken.setdefault(snapshot.task_id, []).append(holder)
                        if not got or sum(map(len, taken.values())) > 2 * total:
                            return
            except BaseException as exc:  # 交给主线程断言（线程里的异常不会让用例失败）
                with lock:
                    errors.append(exc)

        threads = [
            threading.Thread(target=worker, args=(store, f"m{machine}-t{thread}"))
            for machine, store in enumerate(stores)
            for thread in range(2)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        doubles = {task_id: holders for task_id, holders in taken.items() if len(holders) != 1}
        assert doubles == {}, "同一个任务被不止一个认领者开始"
        assert len(taken) == total, "有任务没有被任何认领者开始"
        probe = stores[0]
        for snapshot in probe.query():
            (holder,) = taken[snapshot.task_id]
            assert (snapshot.status, snapshot.status_version, snapshot.attempt) == (S.STARTING, 2, 1)
            assert (snapshot.owner, snapshot.lease_owner, snapshot.executor) == (holder, holder, holder)
            history = probe.history(snapshot.task_id)
            assert [(t.from_status, t.to_status, t.version) for t in history] == [
                (S.QUEUED, S.STARTING, 2)
            ], f"{snapshot.task_id} 开始了，却没有（或不止一条）queued → starting 的迁移记录"
    finally:
        for opened in stores:
            opened.close()


def _typed_fields(snapshot: TaskSnapshot) -> dict[str, object]:
    """逐字段、连类型：配方再展开成它的字段与各自的类型（Recipe 的 == 比值与类型，这里连容器类型也比）。"""
    out: dict[str, object] = {name: (type(value), value) for name, value in _fields(snapshot).items()}
    recipe = snapshot.recipe
    if recipe is not None:
        out["recipe"] = {
            name: (type(getattr(recipe, name)), getattr(recipe, name)) for name in recipe.__dataclass_fields__
        }
        out["recipe.timeout"] = (
            None if recipe.timeout is None else {k: type(v) for k, v in recipe.timeout.items()}
        )
    return out


@pytest.mark.parametrize("starting", [False, True])
def test_claimed_rows_decode_exactly_like_a_read_of_the_same_row(
    store: PostgresTaskStore, starting: bool
) -> None:
    """认领交回的快照走的是不再校验的解码（``SnapshotCodec.trusted_from_row``）：逐字段、连类型与时区偏移，
    与 ``get()`` 经完整校验读回的同一行相同——哪一列解码错了、配方哪一项没有照 ``from_dict`` 规整，
    都在这里失败。"""
    from chongming_task.core.recipes import OnLost, Recipe
    from chongming_task.models import Progress
    from chongming_task.testing.contract.durable import recipe

    shanghai = timezone(timedelta(hours=8))
    before = [
        durable("rich", seconds=0),  # 契约里那份配方：嵌套参数、浮点与大整数、超时、标签、on_lost=retry
        durable(
            "fields",
            seconds=1,
            tags=frozenset({"io", "夜间"}),
            label="标签",
            description="说明",
            priority=3,
            bucket=7,
            bucket_key="tenant-乙",
            pipeline_id="p-1",
            node_id="n-1",
            progress=Progress(3, 10, "件"),
            queued_at=datetime(2026, 3, 1, 8, 0, 1, 5, tzinfo=shanghai),
            recipe=recipe(tags=("b", "a", "b"), timeout={"start": 1, "per_attempt": None, "idle": None}),
        ),
        durable(
            "bare",
            seconds=2,
            recipe=Recipe("contract-task", args=(), kwargs={}, on_lost=OnLost.FAIL),
        ),
    ]
    for snapshot in before:
        store.create(snapshot)
    start = ClaimStart(at=LEASE, executor="thread") if starting else None
    got = store.claim_queued("worker-a", names=NAMES, limit=5, lease_until=LEASE, start=start)
    assert sorted(snapshot.task_id for snapshot in got) == ["bare", "fields", "rich"]
    for snapshot in got:
        stored = store.get(snapshot.task_id)
        assert stored is not None
        assert _typed_fields(snapshot) == _typed_fields(stored), snapshot.task_id
        assert snapshot == stored
    fields = next(snapshot for snapshot in got if snapshot.task_id == "fields")
    assert fields.recipe is not None and fields.recipe.tags == ("a", "b"), "配方标签照 from_dict 排序去重"
    assert fields.recipe.timeout == {"start": 1.0, "per_attempt": None, "idle": None}


def test_every_save_statement_shape_composes_with_the_claim(store: PostgresTaskStore) -> None:
    """``ClaimStart.save`` 把 save 的语句与认领并开始拼成一条（``_claim.save_claim_start_sql``）：save 有
    四种语句（一条 / 多条迁移记录、不带记录、带租约条件），加上按桶过滤的认领，每一种拼出来都要能执行、
    判定照旧。"""
    from chongming_task.errors import ConcurrencyConflict
    from chongming_task.storage import SaveRequest
    from chongming_task.testing.contract._base import step, walk

    store.create(durable("held", seconds=0, bucket=None, recipe=durable("x").recipe))
    for index in range(6):
        store.create(durable(f"next-{index}", seconds=10 + index, bucket=index % 2))
    (current,) = store.claim_queued("w", names=NAMES, limit=1, lease_until=LEASE, start=ClaimStart(at=LEASE))
    assert current.task_id == "held"

    def chained(request: SaveRequest, buckets: list[int] | None = None) -> list[str]:
        start = ClaimStart(at=LEASE, executor="thread", save=request)
        got = store.claim_queued("w", names=NAMES, buckets=buckets, limit=1, lease_until=LEASE, start=start)
        return [snapshot.task_id for snapshot in got]

    # 不带迁移记录（只改字段）、一条记录、两条记录（running 随终态一起写）、带租约条件（判 LOST 的写）
    same = current.evolve(executor="thread")
    assert chained(SaveRequest(same, 2, ())) == ["next-0"]
    running, record = step(same, S.RUNNING)
    assert chained(SaveRequest(running, 2, (record,)), buckets=[1]) == ["next-1"]
    pausing, records = walk(running, S.PAUSING, S.RUNNING)
    assert chained(SaveRequest(pausing, 3, tuple(records))) == ["next-2"]
    lost, record = step(pausing, S.LOST)
    later = LEASE + timedelta(hours=1)
    assert chained(SaveRequest(lost, 5, (record,), lease_expired_before=later), buckets=[1]) == ["next-3"]
    stored = store.get("held")
    assert stored is not None and (stored.status, stored.status_version) == (S.LOST, 6)
    assert [t.version for t in store.history("held")] == [2, 3, 4, 5, 6]
    # 租约还有效时带租约条件的 save 照旧报冲突，认领什么也不做
    other = store.get("next-0")
    assert other is not None
    stopping, record = step(other, S.STOPPING)
    with pytest.raises(ConcurrencyConflict):
        chained(SaveRequest(stopping, 2, (record,), lease_expired_before=LEASE - timedelta(hours=1)))
    left = [s.task_id for s in store.query() if s.status is S.QUEUED and s.owner is None]
    assert sorted(left) == ["next-4", "next-5"]
    # 每个认领到的任务都有它那条 queued → starting（save 带迁移记录时它并进 save 的那条 INSERT，
    # 见 save_claim_start_sql）：版本、触发、时刻（连偏移）与 start_claimed 算出的一样。
    for task_id in ("next-0", "next-1", "next-2", "next-3"):
        started = store.get(task_id)
        assert started is not None and started.status is S.STARTING
        history = store.history(task_id)
        assert history and history[-1].version == started.status_version
        queued = started.evolve(
            status=S.QUEUED, status_version=started.status_version - 1, attempt=0, started_at=None
        )
        begun = start_claimed(queued, ClaimStart(at=LEASE, executor="thread"))
        assert begun is not None
        assert _record(history[-1]) == _record(begun[1][-1])


def test_a_save_with_history_and_the_claim_share_one_history_insert(store: PostgresTaskStore) -> None:
    """save 带迁移记录时，认领的 queued → starting 并进 save 的那条 INSERT（UNION ALL），整条语句只有一个
    写迁移记录表的节点；不带记录的 save 照旧由认领自己的 CTE 写。"""
    from chongming_task.stores.postgres import _claim

    sql = store._sql
    for text, inserts in ((sql.save, 1), (sql.save_one, 1), (sql.save_leased, 1), (sql.save_no_history, 1)):
        composed = _claim.save_claim_start_sql(sql.s, text, sql.save_result, by_bucket=False)
        assert composed.count("INSERT INTO") == inserts, composed
        assert ("UNION ALL" in composed) == (text != sql.save_no_history)


def test_writes_reuse_one_cursor_per_pooled_connection(
    postgres_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """建任务、认领并开始、终态 + 认领这几条热路径上的写复用连接上的同一个游标（``store._cursor``），
    不每次 ``conn.execute`` 新建一个：新游标连带一份适配器表与 Transformer，参数的 dumper、结果列的
    loader 每次重新查（callgrind：入队每个任务 ~60 k、worker 每个任务 ~110 k 条指令）。"""
    import psycopg

    from chongming_task.storage import SaveRequest
    from chongming_task.testing.contract._base import step

    made = [0]
    original = psycopg.Connection.cursor

    def counting(self: psycopg.Connection[object], *args: object, **kwargs: object) -> object:
        made[0] += 1
        return original(self, *args, **kwargs)  # type: ignore[call-overload]

    store = PostgresTaskStore(postgres_dsn, schema=schema, min_size=1, max_size=2)
    try:
        monkeypatch.setattr(psycopg.Connection, "cursor", counting)
        for index in range(20):
            store.create(durable(f"reuse-{index:02d}", seconds=index))
        (current,) = store.claim_queued("w", names=NAMES, limit=1, lease_until=LEASE, start=ClaimStart(LEASE))
        for _ in range(10):
            done, record = step(current, S.FAILED)
            start = ClaimStart(LEASE, "thread", SaveRequest(done, current.status_version, (record,)))
            (current,) = store.claim_queued("w", names=NAMES, limit=1, lease_until=LEASE, start=start)
        monkeypatch.undo()
        assert made[0] <= 2, f"31 次写新建了 {made[0]} 个游标（连接池至多 2 条连接）"
        assert [s.status for s in store.query() if s.status is not S.QUEUED].count(S.FAILED) == 10
    finally:
        store.close()


def _rows_read_by_claim(plan: dict[str, object]) -> list[tuple[str, int, int]]:
    """EXPLAIN (ANALYZE, FORMAT JSON) 的计划树里，认领的 UPDATE 读 tasks（别名 t）的每个扫描节点：
    (节点类型, 实际读出的行数, 该节点所在连接被连接条件滤掉的行数)。"""
    found: list[tuple[str, int, int]] = []

    def walk(node: dict[str, object], removed: int) -> None:
        removed = int(node.get("Rows Removed by Join Filter", 0)) or removed  # type: ignore[call-overload]
        if node.get("Relation Name") == "tasks" and node.get("Alias") == "t":
            found.append((str(node["Node Type"]), int(node["Actual Rows"]), removed))  # type: ignore[call-overload]
        for child in node.get("Plans", ()):  # type: ignore[attr-defined]
            walk(child, removed)

    walk(plan["Plan"], 0)  # type: ignore[arg-type]
    return found


def test_a_claim_reads_only_the_rows_it_claims_even_without_statistics(
    store: PostgresTaskStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """认领的 UPDATE 经主键找挑中的那一行，不读整个队列——哪怕表上还没有统计信息（新建的表、
    ``autovacuum = off``、刚灌进一大批任务）。

    原来的复查条件 ``t.owner IS NULL AND t.status = 'queued'`` 没有统计信息时按默认选择率估成一行，规划器
    于是位图扫描出全部排队中的任务、再与挑中的那一行做连接过滤：300 个排队任务时每次认领读 300 行、滤掉
    299 行（issue 19：worker 吞吐随队列变长而下降）。三种认领语句（只认领、认领并开始、终态 + 认领并开始）
    都经公开的 ``claim_queued`` 发出；这里截下每条语句，在回滚的事务里 ``EXPLAIN ANALYZE`` 同一段文本与参数。
    """
    import psycopg

    from chongming_task.storage import SaveRequest
    from chongming_task.testing.contract._base import step

    for index in range(300):
        store.create(durable(f"queue-{index:03d}", seconds=index))
    plans: list[tuple[str, list[tuple[str, int, int]]]] = []
    original = psycopg.Cursor.execute

    def explaining(
        self: psycopg.Cursor[object], query: object, params: object = None, **kwargs: object
    ) -> object:
        if (
            isinstance(query, str)
            and "picked AS (SELECT task_id" in query
            and not query.startswith("EXPLAIN")
        ):
            with self.connection.transaction(force_rollback=True):
                cursor = self.connection.cursor()
                cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + query, params)  # type: ignore[arg-type]
                row = cursor.fetchone()
                assert row is not None
                plans.append((query[:60], _rows_read_by_claim(row[0][0])))
        return original(self, query, params, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(psycopg.Cursor, "execute", explaining)
    plain = store.claim_queued("w", names=NAMES, limit=2, lease_until=LEASE)
    (current,) = store.claim_queued("w", names=NAMES, limit=1, lease_until=LEASE, start=ClaimStart(LEASE))
    running, first = step(current, S.RUNNING)
    failed, second = step(running, S.FAILED)
    start = ClaimStart(LEASE, "thread", SaveRequest(failed, current.status_version, (first, second)))
    chained = store.claim_queued("w", names=NAMES, limit=1, lease_until=LEASE, start=start)
    monkeypatch.undo()
    assert [s.task_id for s in plain] == ["queue-000", "queue-001"]
    assert [s.task_id for s in chained] == ["queue-003"]
    assert len(plans) == 3, plans
    for query, scans in plans:
        assert scans, f"计划里找不到认领的 UPDATE 对 tasks 的扫描：{query}"
        for node, rows, removed in scans:
            assert rows <= 2 and removed == 0, (
                f"认领读了 {rows} 行 tasks（{node}）、连接条件滤掉 {removed} 行：应当只经主键读挑中的行"
                f"（{query}）"
            )
