"""契约用例：快照的写入与读出：create / get、每个字段原样往返、进出存储的值都是副本。"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta
from typing import Any

from chongming_task.errors import (
    ConfigurationError,
    DuplicateTaskId,
)
from chongming_task.models import (
    MAX_BUCKET_KEY_LENGTH,
    MAX_DESCRIPTION_LENGTH,
    MAX_FAILURE_MESSAGE_LENGTH,
    MAX_ID_LENGTH,
    MAX_JSON_BYTES,
    MAX_LABEL_LENGTH,
    MAX_PRIORITY,
    MAX_PROGRESS_UNIT_LENGTH,
    MAX_TAG_LENGTH,
    MAX_TAGS,
    MAX_TEXT_LENGTH,
    MAX_TRACEBACK_LENGTH,
    MIN_PRIORITY,
    Failure,
    FailureKind,
    Progress,
)
from chongming_task.storage import (
    CommandAction,
    TaskQuery,
)
from chongming_task.testing.contract._base import (
    T0,
    TZ_ODD,
    ContractBase,
    S,
    _ids,
    full_snapshot,
    snap,
    step,
    walk,
)


class SnapshotCases(ContractBase):
    """create / get、字段保真、进出存储都是副本。"""

    # ===============================================================================================
    # create / get
    # ===============================================================================================

    def test_create_then_get(self) -> None:
        store = self.open_store()
        original = snap("c-1", name="first")
        store.create(original)
        self.assertSnapshotEqual(store.get("c-1"), original)
        self.assertEqual(store.history("c-1"), [])

    def test_get_unknown_returns_none(self) -> None:
        store = self.open_store()
        self.assertIsNone(store.get("nope"))

    def test_create_duplicate_raises_and_keeps_original(self) -> None:
        store = self.open_store()
        original = snap("dup", name="original", label="first")
        store.create(original)
        clash, records = walk(snap("dup", name="impostor", label="second"), S.QUEUED)
        with self.assertRaises(DuplicateTaskId):
            store.create(clash, records)
        self.assertSnapshotEqual(store.get("dup"), original)
        self.assertEqual(store.history("dup"), [], "被拒绝的 create 不能留下迁移记录")
        self.assertEqual(len(store.query()), 1)

    def test_create_with_existing_history(self) -> None:
        store = self.open_store()
        current, records = walk(snap("c-h"), S.QUEUED, S.STARTING, S.RUNNING)
        store.create(current, records)
        self.assertSnapshotEqual(store.get("c-h"), current)
        self.assertEqual(store.history("c-h"), records)

    def test_create_writes_initial_side_channel_fields(self) -> None:
        store = self.open_store()
        original = snap(
            "c-side",
            progress=Progress(done=1, total=3),
            last_heartbeat_at=T0 + timedelta(seconds=5),
            lease_owner="node-x",
            lease_until=T0 + timedelta(seconds=30),
        )
        store.create(original)
        self.assertSnapshotEqual(store.get("c-side"), original)

    # ===============================================================================================
    # fidelity
    # ===============================================================================================

    def test_fidelity_every_field_round_trips(self) -> None:
        store = self.open_store()
        original = full_snapshot()
        store.create(original)
        got = store.get(original.task_id)
        self.assertSnapshotEqual(got, original)
        assert got is not None
        self.assertEqual(got, original)
        self.assertEqual(got.failure, original.failure)
        assert got.failure is not None and original.failure is not None
        self.assertEqual(got.failure.traceback, original.failure.traceback)
        self.assertIn("KeyError", got.failure.traceback or "")
        self.assertIn("缺少字段「租户」", got.failure.traceback or "")
        self.assertEqual(got.created_at.microsecond, 123456)
        assert got.finished_at is not None
        self.assertEqual(got.finished_at.microsecond, 1)
        self.assertEqual(got.outcome["big"], 2**53 + 1, "大整数不能经浮点走样")
        self.assertIsInstance(got.outcome["big"], int)
        assert got.progress is not None
        self.assertEqual((got.progress.done, got.progress.total), (120.5, 500.25))

    def test_fidelity_minimal_snapshot_keeps_nones(self) -> None:
        store = self.open_store()
        original = snap("minimal")
        store.create(original)
        got = store.get("minimal")
        self.assertSnapshotEqual(got, original)
        assert got is not None
        self.assertEqual(got.tags, frozenset())
        self.assertIsNone(got.outcome)
        self.assertIsNone(got.bucket)

    def test_fidelity_scalar_and_list_outcomes(self) -> None:
        store = self.open_store()
        values: list[Any] = ["纯文本", 0, -1.5, True, False, [1, "二", [3.0]], {"": ""}, 10**30]
        for i, value in enumerate(values):
            store.create(snap(f"out-{i}", outcome=value))
        for i, value in enumerate(values):
            got = store.get(f"out-{i}")
            assert got is not None
            self.assertEqual(got.outcome, value, f"outcome {value!r} 没有原样往返")
            self.assertIs(type(got.outcome), type(value), f"outcome {value!r} 的类型变了")

    def test_fidelity_one_megabyte_outcome(self) -> None:
        store = self.open_store()
        rows = [{"id": i, "名称": f"记录-{i:06d}", "值": i * 0.5, "ok": i % 2 == 0} for i in range(16000)]
        outcome = {"rows": rows, "说明": "约 1 MB 的结果"}
        self.assertGreater(len(json.dumps(outcome, ensure_ascii=False).encode()), 1_000_000)
        base = snap("big")
        store.create(base)
        done, records = walk(base, S.QUEUED, S.STARTING, S.RUNNING)
        done, last = step(done, S.SUCCEEDED, outcome=outcome, finished_at=T0 + timedelta(hours=1))
        store.save(done, expect_version=0, transitions=[*records, last])
        got = store.get("big")
        assert got is not None
        self.assertEqual(got.outcome, outcome)
        self.assertEqual(_ids(store.query(TaskQuery(statuses=frozenset({S.SUCCEEDED})))), ["big"])

    def test_fidelity_through_query(self) -> None:
        store = self.open_store()
        original = full_snapshot()
        store.create(original)
        store.create(snap("other"))
        (got,) = store.query(TaskQuery(owner="node-a"))
        self.assertSnapshotEqual(got, original)

    def test_fidelity_transitions_round_trip(self) -> None:
        store = self.open_store()
        base = snap("tr", at=datetime(2026, 3, 1, 9, 0, 0, 654321, tzinfo=TZ_ODD))
        store.create(base)
        nxt, record = step(
            base, S.QUEUED, actor="运维·张三", reason='手动排队：发布窗口 "夜间"', at=base.created_at
        )
        nxt2, record2 = step(nxt, S.CANCELLED, actor=None, reason=None)
        store.save(nxt2, expect_version=0, transitions=[record, record2])
        history = store.history("tr")
        self.assertEqual(history, [record, record2])
        for got, want in zip(history, [record, record2], strict=True):
            self.assertIs(got.from_status, want.from_status)
            self.assertIs(got.to_status, want.to_status)
            self.assertEqual(got.at, want.at)
            self.assertIsNotNone(got.at.utcoffset())

    def test_outcome_must_be_json(self) -> None:
        store = self.open_store()
        with self.assertRaises(ConfigurationError):
            store.create(snap("bad-set", outcome={1, 2}))
        with self.assertRaises(ConfigurationError):
            store.create(snap("bad-nan", outcome={"x": math.nan}))
        self.assertIsNone(store.get("bad-set"))
        self.assertIsNone(store.get("bad-nan"))
        store.create(snap("ok"))
        bad, record = step(snap("ok"), S.QUEUED, outcome=object())
        with self.assertRaises(ConfigurationError):
            store.save(bad, expect_version=0, transitions=[record])
        self.assertNeverSaved(store, "ok")

    # ===============================================================================================
    # 可存储值的上限（用户指南 §13、持久层实现指南 §5.2）：每个后端都必须存得下恰好在上限上的值
    # ===============================================================================================

    def test_values_at_every_limit_round_trip(self) -> None:
        """每个文本字段取到上限长度、且全用 4 字节的 UTF-8 字符（🚀）：PostgreSQL 的 btree 索引行
        （task_id、name、owner、pipeline_id）与 GIN 索引项（标签）都要放得下；priority 取两端。"""
        store = self.open_store()
        wide = "🚀"  # UTF-8 下 4 个字节：按字节计的限制在这里最先被撞到
        tags = frozenset(f"{i:02d}" + wide * (MAX_TAG_LENGTH - 2) for i in range(MAX_TAGS))
        failure = Failure(
            FailureKind.EXCEPTION,
            "失" * MAX_FAILURE_MESSAGE_LENGTH,
            retryable=True,
            exc_type="x" * MAX_TEXT_LENGTH,
            traceback=wide * MAX_TRACEBACK_LENGTH,
        )
        self.assertEqual(len(failure.message), MAX_FAILURE_MESSAGE_LENGTH, "恰好在上限上的失败说明不截断")
        self.assertEqual(len(failure.traceback or ""), MAX_TRACEBACK_LENGTH)
        cases = []
        for index, priority in enumerate((MAX_PRIORITY, MIN_PRIORITY)):
            task_id = f"{index}" + wide * (MAX_ID_LENGTH - 1)
            cases.append(
                snap(
                    task_id,
                    name=f"{index}" + wide * (MAX_ID_LENGTH - 1),
                    label=wide * MAX_LABEL_LENGTH,
                    bucket_key=wide * MAX_BUCKET_KEY_LENGTH,
                    bucket=7,
                    description=wide * MAX_DESCRIPTION_LENGTH,
                    executor=wide * MAX_TEXT_LENGTH,
                    owner=f"{index}" + wide * (MAX_ID_LENGTH - 1),
                    lease_owner=wide * MAX_TEXT_LENGTH,
                    lease_until=T0 + timedelta(seconds=30),
                    pipeline_id=wide * MAX_ID_LENGTH,
                    node_id=wide * MAX_ID_LENGTH,
                    tags=tags,
                    priority=priority,
                    failure=failure,
                    progress=Progress(
                        done=1, total=2, unit=wide * MAX_PROGRESS_UNIT_LENGTH, message=wide * MAX_TEXT_LENGTH
                    ),
                )
            )
        for original in cases:
            store.create(original)
            self.assertSnapshotEqual(store.get(original.task_id), original)
        self.assertEqual(len(store.query(TaskQuery(tag=min(tags)))), 2)
        self.assertEqual(_ids(store.query(TaskQuery(owner=cases[0].owner))), [cases[0].task_id])
        self.assertEqual(
            _ids(store.query(TaskQuery(pipeline_id=wide * MAX_ID_LENGTH))), sorted(_ids(cases))[::-1]
        )
        # 迁移记录的 actor / reason 也取到上限。
        first = cases[0]
        nxt, record = step(first, S.QUEUED, actor=wide * MAX_TEXT_LENGTH, reason=wide * MAX_TEXT_LENGTH)
        store.save(nxt, expect_version=0, transitions=[record])
        self.assertEqual(store.history(first.task_id), [record])

    def test_outcome_at_the_size_limit_round_trips_and_one_byte_more_is_refused(self) -> None:
        """返回值编码后恰好 MAX_JSON_BYTES 字节：存得下、原样读回；多一个字节：拒绝，什么也不写。"""
        store = self.open_store()
        base = snap("max-outcome")
        store.create(base)
        running, records = walk(base, S.QUEUED, S.STARTING, S.RUNNING)
        # JSON 文本是 '"' + 内容 + '"'：内容 MAX_JSON_BYTES - 2 字节时总长恰好是上限。
        fits = "x" * (MAX_JSON_BYTES - 2)
        over, over_record = step(
            running, S.SUCCEEDED, outcome=fits + "x", finished_at=T0 + timedelta(hours=1)
        )
        with self.assertRaises(ConfigurationError):
            store.save(over, expect_version=0, transitions=[*records, over_record])
        got = store.get("max-outcome")
        assert got is not None
        self.assertEqual(got.status_version, 0, "被拒绝的 save 不能留下任何改动")
        self.assertEqual(store.history("max-outcome"), [])
        done, last = step(running, S.SUCCEEDED, outcome=fits, finished_at=T0 + timedelta(hours=1))
        store.save(done, expect_version=0, transitions=[*records, last])
        got = store.get("max-outcome")
        assert got is not None
        self.assertEqual(got.status, S.SUCCEEDED)
        self.assertTrue(got.outcome == fits, "恰好 16 MiB 的返回值没有原样往返")

    def test_unstorable_values_are_refused_even_when_construction_was_bypassed(self) -> None:
        """``evolve`` 不做校验：后端写入前必须再查一次（``checks.check_snapshot``），规则与构造时同一份。"""
        store = self.open_store()
        base = snap("bypass")
        bad_fields: list[dict[str, Any]] = [
            {"label": "a\x00b"},
            {"label": "x" * (MAX_LABEL_LENGTH + 1)},
            {"bucket_key": "k\ud800"},
            {"description": "d" * (MAX_DESCRIPTION_LENGTH + 1)},
            {"owner": "o" * (MAX_ID_LENGTH + 1)},
            {"priority": MAX_PRIORITY + 1},
            {"priority": MIN_PRIORITY - 1},
            {"tags": frozenset(f"t{i}" for i in range(MAX_TAGS + 1))},
            {"outcome": {"k": "a\x00b"}},
            {"outcome": ["\ud800"]},
        ]
        for fields in bad_fields:
            with self.subTest(fields=repr(fields)[:60]):
                with self.assertRaises(ConfigurationError):
                    store.create(base.evolve(**fields))
                self.assertIsNone(store.get("bypass"))
        store.create(base)
        for fields in bad_fields:
            with self.subTest(save=repr(fields)[:60]):
                bad, record = step(base, S.QUEUED)
                with self.assertRaises(ConfigurationError):
                    store.save(bad.evolve(**fields), expect_version=0, transitions=[record])
        self.assertNeverSaved(store, "bypass")

    # ===============================================================================================
    # copies
    # ===============================================================================================

    def test_returned_outcome_is_a_copy(self) -> None:
        store = self.open_store()
        store.create(snap("copy", outcome={"rows": [1, 2, 3], "meta": {"k": "v"}}))
        first = store.get("copy")
        assert first is not None
        first.outcome["rows"].append(4)
        first.outcome["meta"]["k"] = "changed"
        first.outcome["new"] = True
        (queried,) = store.query()
        queried.outcome["rows"].clear()
        again = store.get("copy")
        assert again is not None
        self.assertEqual(again.outcome, {"rows": [1, 2, 3], "meta": {"k": "v"}})

    def test_stored_outcome_is_copied_on_the_way_in(self) -> None:
        store = self.open_store()
        outcome: dict[str, Any] = {"rows": [1, 2]}
        store.create(snap("in", outcome=outcome))
        outcome["rows"].append(3)
        outcome["extra"] = 1
        got = store.get("in")
        assert got is not None
        self.assertEqual(got.outcome, {"rows": [1, 2]})

        later = {"total": [10]}
        nxt, record = step(snap("in", outcome={"rows": [1, 2]}), S.QUEUED, outcome=later)
        store.save(nxt, expect_version=0, transitions=[record])
        later["total"].append(20)
        got = store.get("in")
        assert got is not None
        self.assertEqual(got.outcome, {"total": [10]})

    def test_returned_history_is_a_copy(self) -> None:
        store = self.open_store()
        current, records = walk(snap("hist-copy"), S.QUEUED, S.STARTING)
        store.create(current, records)
        history = store.history("hist-copy")
        history.clear()
        self.assertEqual(store.history("hist-copy"), records)

    def test_command_payload_is_copied(self) -> None:
        store = self.open_store()
        store.create(snap("pay"))
        payload: dict[str, Any] = {"grace": 5, "list": [1]}
        submitted = store.submit_command("pay", CommandAction.STOP, payload=payload)
        payload["list"].append(2)
        submitted.payload["list"].append(3)
        (claimed,) = store.claim_commands("w", lease=60)
        self.assertEqual(dict(claimed.payload), {"grace": 5, "list": [1]})
