"""契约用例：节点成员表：publish_node / list_nodes / remove_node 的往返、覆盖、排序与并发发布。"""

from __future__ import annotations

import functools
import json
import math
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from chongming_task.errors import (
    ConfigurationError,
)
from chongming_task.storage import (
    NodeRecord,
)
from chongming_task.testing.contract._base import (
    T0,
    TZ_ODD,
    TZ_SHANGHAI,
    ContractBase,
    node,
)


class NodeCases(ContractBase):
    """节点成员表。"""

    __test__: ClassVar[bool] = False

    # ===============================================================================================
    # membership (publish_node / list_nodes / remove_node)
    # ===============================================================================================

    def assertNodeEqual(self, got: NodeRecord, want: NodeRecord) -> None:
        self.assertEqual(got, want, f"节点 {want.owner!r} 的记录没有原样往返")
        self.assertIsInstance(got, NodeRecord)
        self.assertEqual(got.buckets is None, want.buckets is None, "buckets 的 None（不限定）与集合必须区分")
        if want.buckets is not None:
            self.assertIsInstance(got.buckets, frozenset, "buckets 必须还原成 frozenset")
        for name in ("heartbeat_at", "expires_at"):
            value, expected = getattr(got, name), getattr(want, name)
            self.assertIsInstance(value, datetime)
            # datetime 相等只比时刻：偏移要单独比，否则改写成 UTC 的后端也能蒙混过关。
            self.assertEqual(value.utcoffset(), expected.utcoffset(), f"{name} 的时区偏移变了")
            self.assertEqual(value.isoformat(), expected.isoformat(), f"{name} 没有逐字往返")
        self.assertEqual(json.dumps(got.info, sort_keys=True), json.dumps(want.info, sort_keys=True))

    def test_publish_node_round_trips_every_field(self) -> None:
        store = self.open_store()
        heartbeat = datetime(2026, 3, 1, 9, 15, 30, 123457, tzinfo=TZ_SHANGHAI)
        original = node(
            "节点-甲:4321",
            buckets={0, 5, 63, 17},
            num_buckets=64,
            heartbeat_at=heartbeat,
            expires_at=datetime(2026, 2, 28, 21, 46, 0, 1, tzinfo=TZ_ODD),
            info={
                "hostname": "机房-北京-07",
                "pid": 4321,
                "version": "0.1.0",
                "big": 2**53 + 1,
                "嵌套": {
                    "list": [1, 2.5, None, True, "文本"],
                    "empty": {},
                    "引号": '含 "双引号" 与 \\ 反斜杠',
                },
            },
        )
        self.assertIsNone(store.publish_node(original))
        got = store.list_nodes()
        self.assertEqual(len(got), 1)
        self.assertNodeEqual(got[0], original)
        self.assertEqual(got[0].expires_at.microsecond, 1)
        self.assertEqual(got[0].info["big"], 2**53 + 1, "大整数不能经浮点走样")
        self.assertIsInstance(got[0].info["big"], int)

    def test_node_buckets_none_and_empty_set_are_distinct(self) -> None:
        store = self.open_store()
        unlimited = node("unlimited", buckets=None)
        draining = node("draining", buckets=frozenset())
        single = node("single", buckets={7}, num_buckets=8)
        for record in (unlimited, draining, single):
            store.publish_node(record)
        got = {record.owner: record for record in store.list_nodes()}
        self.assertIsNone(got["unlimited"].buckets, "None 表示不限定桶，不能变成空集合")
        self.assertEqual(got["draining"].buckets, frozenset(), "空集合表示一个桶也不负责，不能变成 None")
        self.assertIsNotNone(got["draining"].buckets)
        for record in (unlimited, draining, single):
            self.assertNodeEqual(got[record.owner], record)

    def test_publish_node_same_owner_replaces_last_writer_wins(self) -> None:
        store = self.open_store()
        first = node("node-a", buckets=range(16), heartbeat_at=T0 + timedelta(seconds=60), info={"pid": 1})
        store.publish_node(first)
        store.publish_node(node("node-b", buckets=range(16, 32)))
        # 第二次写的心跳反而更早：仍然按写入先后覆盖，存储不比较时间。
        second = node(
            "node-a", buckets=None, num_buckets=32, heartbeat_at=T0, ttl=5.0, info={"pid": 2, "新": "值"}
        )
        store.publish_node(second)
        got = store.list_nodes()
        self.assertEqual([record.owner for record in got], ["node-a", "node-b"], "同一 owner 只能有一条记录")
        self.assertNodeEqual(got[0], second)
        self.assertNotIn("新", first.info)

    def test_remove_node(self) -> None:
        store = self.open_store()
        for owner in ("node-a", "node-b", "节点-丙"):
            store.publish_node(node(owner))
        self.assertIs(store.remove_node("node-b"), True)
        self.assertIs(store.remove_node("node-b"), False, "删第二次：本来就没有了")
        self.assertIs(store.remove_node("never-published"), False)
        self.assertIs(store.remove_node("Node-A"), False, "owner 区分大小写")
        self.assertEqual([record.owner for record in store.list_nodes()], ["node-a", "节点-丙"])
        store.publish_node(node("node-b"))  # 删掉之后可以重新发布
        self.assertEqual(len(store.list_nodes()), 3)

    def test_list_nodes_is_ordered_by_owner_code_points(self) -> None:
        store = self.open_store()
        owners = [
            "node-b",
            "Node-a",
            "node-a",
            "节点-甲",
            "node-10",
            "node-9",
            "a b",
            "node_a",
            "Ünïcödé",
            "z",
        ]
        for i, owner in enumerate(reversed(owners)):
            store.publish_node(node(owner, heartbeat_at=T0 + timedelta(seconds=i)))
        self.assertEqual([record.owner for record in store.list_nodes()], sorted(owners))

    def test_list_nodes_includes_expired_records(self) -> None:
        store = self.open_store()
        long_dead = node("crashed", heartbeat_at=T0 - timedelta(days=3), ttl=30.0)
        alive = node("alive", heartbeat_at=datetime.now(UTC), ttl=3600.0)
        store.publish_node(long_dead)
        store.publish_node(alive)
        got = {record.owner: record for record in store.list_nodes()}
        self.assertEqual(set(got), {"crashed", "alive"}, "过期的记录也要列出：判断死活是检查者的事")
        self.assertNodeEqual(got["crashed"], long_dead)
        self.assertFalse(got["crashed"].alive(T0))
        self.assertTrue(got["alive"].alive(datetime.now(UTC)))

    def test_node_record_and_membership_validation(self) -> None:
        store = self.open_store()
        naive = datetime(2026, 3, 1, 8, 0, 0)
        bad_records: list[tuple[str, Callable[[], object]]] = [
            ("空 owner", lambda: node("")),
            ("owner 非字符串", lambda: node(42)),  # type: ignore[arg-type]
            ("owner 含 NUL", lambda: node("node\x00a")),
            ("桶号越界", lambda: node("n", buckets={64}, num_buckets=64)),
            ("负桶号", lambda: node("n", buckets={-1})),
            ("布尔桶号", lambda: node("n", buckets={True})),
            ("桶集合写成单个整数", lambda: node("n", buckets=3)),  # type: ignore[arg-type]
            ("桶数为 0", lambda: node("n", buckets=None, num_buckets=0)),
            ("桶数为布尔", lambda: node("n", buckets=None, num_buckets=True)),
            ("心跳时间不带时区", lambda: node("n", heartbeat_at=naive)),
            ("到期时间不带时区", lambda: node("n", expires_at=naive)),
            ("到期早于心跳", lambda: node("n", ttl=-1.0)),
            ("info 不是对象", lambda: node("n", info=[1, 2])),  # type: ignore[arg-type]
            ("info 不可 JSON 序列化", lambda: node("n", info={"x": object()})),
            ("info 含 NaN", lambda: node("n", info={"x": math.nan})),
        ]
        for label, build in bad_records:
            with self.subTest(case=label), self.assertRaises(ConfigurationError):
                build()
        for bad in (None, "node-a", node("node-a").to_dict()):
            with self.subTest(record=type(bad).__name__), self.assertRaises(ConfigurationError):
                store.publish_node(bad)  # type: ignore[arg-type]
        for owner in ("", None, 42):
            with self.subTest(owner=owner), self.assertRaises(ConfigurationError):
                store.remove_node(owner)  # type: ignore[arg-type]
        self.assertEqual(store.list_nodes(), [], "被拒绝的写入不能留下任何记录")
        with self.assertRaises(ConfigurationError):
            node("n").alive(naive)

    def test_node_record_dict_round_trip(self) -> None:
        original = node(
            "节点-乙", buckets={1, 2, 3}, heartbeat_at=datetime(2026, 3, 1, 9, 0, 0, 5, tzinfo=TZ_ODD)
        )
        data = original.to_dict()
        self.assertEqual(json.loads(json.dumps(data)), data, "to_dict 必须是纯 JSON")
        self.assertEqual(data["buckets"], [1, 2, 3])
        again = NodeRecord.from_dict(json.loads(json.dumps(data, ensure_ascii=False)))
        self.assertNodeEqual(again, original)
        self.assertIsNone(NodeRecord.from_dict(node("n", buckets=None).to_dict()).buckets)
        odd: dict[Any, Any] = {"t": (1, 2), 3: "键"}
        normalized = node("n", info=odd)
        self.assertEqual(normalized.info, {"t": [1, 2], "3": "键"}, "info 在构造时就规范成 JSON 的样子")

    def test_node_info_is_copied_in_and_out(self) -> None:
        store = self.open_store()
        info: dict[str, Any] = {"tags": ["a"], "nested": {"k": 1}}
        record = node("node-a", info=info)
        store.publish_node(record)
        record.info["tags"].append("改了原对象")
        first = store.list_nodes()[0]
        self.assertEqual(first.info, {"tags": ["a"], "nested": {"k": 1}}, "存储里的那份不能跟着原对象变")
        first.info["nested"]["k"] = 999
        self.assertEqual(store.list_nodes()[0].info["nested"], {"k": 1}, "改返回的记录不能影响存储")

    def test_membership_is_independent_of_tasks(self) -> None:
        store = self._prune_fixture()
        store.publish_node(node("node-a", buckets={0}))
        self.assertEqual(store.stats().total, 11, "发布节点不能改动任务")
        self.assertEqual(store.prune(keep_terminal=0), 5)
        self.assertEqual([record.owner for record in store.list_nodes()], ["node-a"], "prune 不能删节点记录")
        store.remove_node("node-a")
        self.assertEqual(store.stats().unfinished, 6)

    def test_concurrent_publishers_from_threads(self) -> None:
        store = self.open_store()
        writers, rounds = 6, 20
        errors: list[BaseException] = []
        shared_versions: set[str] = set()
        start = threading.Barrier(writers)

        def publisher(i: int) -> None:
            try:
                start.wait()
                for r in range(rounds):
                    beat = T0 + timedelta(seconds=r)
                    store.publish_node(
                        node(f"w-{i}", buckets={i, r % 8}, heartbeat_at=beat, info={"round": r})
                    )
                    # 所有线程同时覆盖同一个 owner：最后只能剩一条，且是某一次完整的写入。
                    store.publish_node(
                        node("shared", buckets={i}, heartbeat_at=beat, info={"by": i, "round": r})
                    )
                    if r % 5 == 0:
                        self.assertIn(f"w-{i}", {record.owner for record in store.list_nodes()})
            except BaseException as exc:
                errors.append(exc)

        for i in range(writers):
            for r in range(rounds):
                shared_versions.add(json.dumps({"by": i, "round": r, "bucket": i}, sort_keys=True))
        self.run_threads([functools.partial(publisher, i) for i in range(writers)])
        self.assertEqual(errors, [])
        got = {record.owner: record for record in store.list_nodes()}
        self.assertEqual(set(got), {f"w-{i}" for i in range(writers)} | {"shared"})
        for i in range(writers):
            last = node(
                f"w-{i}",
                buckets={i, (rounds - 1) % 8},
                heartbeat_at=T0 + timedelta(seconds=rounds - 1),
                info={"round": rounds - 1},
            )
            self.assertNodeEqual(got[f"w-{i}"], last)
        shared = got["shared"]
        assert shared.buckets is not None
        self.assertEqual(len(shared.buckets), 1)
        torn = json.dumps({**shared.info, "bucket": next(iter(shared.buckets))}, sort_keys=True)
        self.assertIn(torn, shared_versions, "同一 owner 的记录被拼成了两次写入的混合体")
        self.assertEqual(shared.heartbeat_at, T0 + timedelta(seconds=shared.info["round"]))
