"""契约用例：读侧查询：query 的每个过滤条件与排序、stats 与 bucket_counts 的计数。"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from chongming_task.models import TaskSnapshot
from chongming_task.storage import QueryOrder, TaskQuery, TaskStats, TaskStore
from chongming_task.testing.contract._base import (
    T0,
    TZ_ODD,
    TZ_SHANGHAI,
    ContractBase,
    S,
    _ids,
    _query_dataset,
    snap,
)


class QueryCases(ContractBase):
    """query / stats / bucket_counts。"""

    # ===============================================================================================
    # query
    # ===============================================================================================

    def _loaded(self) -> tuple[TaskStore, list[TaskSnapshot]]:
        store = self.open_store()
        dataset = _query_dataset()
        for snapshot in dataset:
            store.create(snapshot)
        return store, dataset

    def assertQuery(self, store: TaskStore, dataset: list[TaskSnapshot], query: TaskQuery) -> list[str]:
        want = _ids(query.apply(dataset))
        got = _ids(store.query(query))
        self.assertEqual(got, want, f"查询结果与 TaskQuery.apply 的参照语义不一致：{query}")
        return got

    def test_query_without_filter_returns_all_newest_first(self) -> None:
        store, dataset = self._loaded()
        self.assertEqual(len(self.assertQuery(store, dataset, TaskQuery())), len(dataset))
        self.assertEqual(_ids(store.query()), _ids(store.query(TaskQuery())))
        self.assertEqual(_ids(store.query())[0], _ids(TaskQuery().apply(dataset))[0])

    def test_query_statuses(self) -> None:
        store, dataset = self._loaded()
        self.assertTrue(self.assertQuery(store, dataset, TaskQuery(statuses=frozenset({S.RUNNING}))))
        self.assertTrue(self.assertQuery(store, dataset, TaskQuery(statuses=frozenset({S.FAILED, S.PAUSED}))))
        self.assertEqual(store.query(TaskQuery(statuses=frozenset({S.LOST}))), [])

    def test_query_name_prefix_percent_is_literal(self) -> None:
        store, dataset = self._loaded()
        self.assertEqual(
            set(self.assertQuery(store, dataset, TaskQuery(name_prefix="extract%"))),
            {s.task_id for s in dataset if s.name == "extract%daily"},
        )
        got = self.assertQuery(store, dataset, TaskQuery(name_prefix="100%"))
        self.assertEqual({s.name for s in store.query(TaskQuery(name_prefix="100%"))}, {"100%_done"})
        self.assertTrue(got)

    def test_query_name_prefix_underscore_is_literal(self) -> None:
        store, dataset = self._loaded()
        self.assertEqual({s.name for s in store.query(TaskQuery(name_prefix="extract_"))}, {"extract_daily"})
        self.assertEqual({s.name for s in store.query(TaskQuery(name_prefix="ext_"))}, {"ext_ract"})
        self.assertQuery(store, dataset, TaskQuery(name_prefix="extract_"))

    def test_query_name_prefix_backslash_is_literal(self) -> None:
        store, dataset = self._loaded()
        self.assertEqual({s.name for s in store.query(TaskQuery(name_prefix="load\\r"))}, {"load\\raw"})
        self.assertEqual({s.name for s in store.query(TaskQuery(name_prefix="load\\\\"))}, {"load\\\\raw"})
        self.assertEqual(
            {s.name for s in store.query(TaskQuery(name_prefix="load\\"))}, {"load\\raw", "load\\\\raw"}
        )
        self.assertQuery(store, dataset, TaskQuery(name_prefix="load\\"))

    def test_query_name_prefix_is_case_sensitive_and_handles_cjk(self) -> None:
        store, dataset = self._loaded()
        self.assertEqual({s.name for s in store.query(TaskQuery(name_prefix="Extract"))}, {"Extract"})
        self.assertNotIn("Extract", {s.name for s in store.query(TaskQuery(name_prefix="extract"))})
        self.assertEqual({s.name for s in store.query(TaskQuery(name_prefix="加载"))}, {"加载-日报"})
        self.assertEqual(len(store.query(TaskQuery(name_prefix=""))), len(dataset))
        self.assertQuery(store, dataset, TaskQuery(name_prefix="extract"))

    def test_query_tag_matches_whole_tags_only(self) -> None:
        store, dataset = self._loaded()
        io = self.assertQuery(store, dataset, TaskQuery(tag="io"))
        self.assertTrue(io)
        for snapshot in store.query(TaskQuery(tag="io")):
            self.assertIn("io", snapshot.tags)
        self.assertTrue(self.assertQuery(store, dataset, TaskQuery(tag="iox")))
        self.assertTrue(self.assertQuery(store, dataset, TaskQuery(tag="cpu")))
        self.assertEqual(store.query(TaskQuery(tag="i")), [], "标签按整个字符串匹配，不是子串")

    def test_query_bucket(self) -> None:
        store, dataset = self._loaded()
        for bucket in (0, 1, 3):
            got = self.assertQuery(store, dataset, TaskQuery(bucket=bucket))
            self.assertTrue(got)
        self.assertEqual(store.query(TaskQuery(bucket=99)), [])

    def test_query_buckets(self) -> None:
        store, dataset = self._loaded()
        got = self.assertQuery(store, dataset, TaskQuery(buckets=frozenset({1, 2})))
        self.assertTrue(got)
        self.assertEqual(store.query(TaskQuery(buckets=frozenset())), [], "空的桶集合不匹配任何任务")

    def test_query_bucket_and_buckets_intersect(self) -> None:
        store, dataset = self._loaded()
        both = self.assertQuery(store, dataset, TaskQuery(bucket=1, buckets=frozenset({1, 2})))
        self.assertEqual(set(both), set(_ids(store.query(TaskQuery(bucket=1)))))
        self.assertEqual(store.query(TaskQuery(bucket=1, buckets=frozenset({2, 3}))), [])

    def test_query_owner(self) -> None:
        store, dataset = self._loaded()
        self.assertTrue(self.assertQuery(store, dataset, TaskQuery(owner="node-a")))
        self.assertEqual(store.query(TaskQuery(owner="node-z")), [])

    def test_query_pipeline_id(self) -> None:
        store, dataset = self._loaded()
        self.assertTrue(self.assertQuery(store, dataset, TaskQuery(pipeline_id="p1")))
        self.assertEqual(store.query(TaskQuery(pipeline_id="p9")), [])

    def test_query_created_after_is_strict(self) -> None:
        store, dataset = self._loaded()
        boundary = T0 + timedelta(seconds=5)
        got = self.assertQuery(store, dataset, TaskQuery(created_after=boundary))
        self.assertNotIn(
            True, [s.created_at == boundary for s in store.query(TaskQuery(created_after=boundary))]
        )
        self.assertEqual(len(got), sum(1 for s in dataset if s.created_at > boundary))
        # 同一时刻换个时区写法，结果不变：比较的是时刻。
        self.assertEqual(_ids(store.query(TaskQuery(created_after=boundary.astimezone(TZ_ODD)))), got)

    def test_query_created_before_is_strict(self) -> None:
        store, dataset = self._loaded()
        boundary = T0 + timedelta(seconds=4)
        got = self.assertQuery(store, dataset, TaskQuery(created_before=boundary))
        self.assertEqual(len(got), 12)  # 0..3 秒各三个；4 秒那三个不算
        window = self.assertQuery(
            store, dataset, TaskQuery(created_after=T0 + timedelta(seconds=2), created_before=boundary)
        )
        self.assertEqual(len(window), 3)
        self.assertEqual(store.query(TaskQuery(created_after=boundary, created_before=boundary)), [])

    def test_query_lease_expired_before(self) -> None:
        store, dataset = self._loaded()
        cutoff = T0 + timedelta(seconds=10)
        got = set(self.assertQuery(store, dataset, TaskQuery(lease_expired_before=cutoff)))
        no_lease = {s.task_id for s in dataset if s.lease_until is None}
        expired = {s.task_id for s in dataset if s.lease_until is not None and s.lease_until < cutoff}
        exactly = {s.task_id for s in dataset if s.lease_until == cutoff}
        self.assertTrue(no_lease and expired and exactly)
        self.assertEqual(got, no_lease | expired, "租约为空或早于该时刻的才算过期；恰好等于不算")

    def test_query_lease_expired_before_sees_touched_leases(self) -> None:
        store = self.open_store()
        store.create(snap("leased"))
        cutoff = T0 + timedelta(seconds=30)
        self.assertEqual(_ids(store.query(TaskQuery(lease_expired_before=cutoff))), ["leased"])
        store.touch("leased", lease_owner="n1", lease_until=cutoff + timedelta(seconds=1))
        self.assertEqual(store.query(TaskQuery(lease_expired_before=cutoff)), [])
        store.touch("leased", lease_until=cutoff - timedelta(microseconds=1))
        self.assertEqual(_ids(store.query(TaskQuery(lease_expired_before=cutoff))), ["leased"])

    def test_query_limit(self) -> None:
        store, dataset = self._loaded()
        self.assertEqual(len(self.assertQuery(store, dataset, TaskQuery(limit=5))), 5)
        self.assertEqual(len(store.query(TaskQuery(limit=1000))), len(dataset))
        self.assertEqual(len(self.assertQuery(store, dataset, TaskQuery(tag="io", limit=2))), 2)

    def test_query_limit_zero_returns_nothing(self) -> None:
        store, _ = self._loaded()
        self.assertEqual(store.query(TaskQuery(limit=0)), [])

    def _tied_creation_times(self) -> TaskStore:
        """三个同一时刻创建的任务（b c a），前后各差一微秒的 z-early 与 0-late：排序要按 task_id 破平局。"""
        store = self.open_store()
        for task_id in ("b", "c", "a"):
            store.create(snap(task_id, at=T0))
        store.create(snap("z-early", at=T0 - timedelta(microseconds=1)))
        store.create(snap("0-late", at=T0 + timedelta(microseconds=1)))
        return store

    def test_query_oldest_first_breaks_ties_by_task_id(self) -> None:
        store = self._tied_creation_times()
        got = _ids(store.query(TaskQuery(order=QueryOrder.OLDEST_FIRST)))
        self.assertEqual(got, ["z-early", "a", "b", "c", "0-late"])
        self.assertEqual(
            _ids(store.query(TaskQuery(order=QueryOrder.OLDEST_FIRST, limit=2))), ["z-early", "a"]
        )

    def test_query_newest_first_breaks_ties_by_task_id(self) -> None:
        store = self._tied_creation_times()
        got = _ids(store.query(TaskQuery(order=QueryOrder.NEWEST_FIRST)))
        self.assertEqual(got, ["0-late", "c", "b", "a", "z-early"])
        self.assertEqual(_ids(store.query(TaskQuery(limit=2))), ["0-late", "c"])

    def test_query_orders_by_instant_across_utc_offsets(self) -> None:
        store = self.open_store()
        # 文本上 "09:00+08:00" 排在 "02:00+00:00" 之后，但它其实早一个钟头。
        store.create(snap("shanghai-0100utc", at=datetime(2026, 3, 1, 9, 0, tzinfo=TZ_SHANGHAI)))
        store.create(snap("utc-0200", at=datetime(2026, 3, 1, 2, 0, tzinfo=UTC)))
        store.create(snap("odd-0030utc", at=datetime(2026, 2, 28, 21, 0, tzinfo=TZ_ODD)))
        self.assertEqual(
            _ids(store.query(TaskQuery(order=QueryOrder.OLDEST_FIRST))),
            ["odd-0030utc", "shanghai-0100utc", "utc-0200"],
        )
        after = TaskQuery(created_after=datetime(2026, 3, 1, 1, 30, tzinfo=UTC))
        self.assertEqual(_ids(store.query(after)), ["utc-0200"])

    def test_query_filter_combinations(self) -> None:
        store, dataset = self._loaded()
        queries = [
            TaskQuery(statuses=frozenset({S.PENDING, S.QUEUED, S.RUNNING}), tag="io"),
            TaskQuery(
                statuses=frozenset({S.SUCCEEDED, S.FAILED, S.STOPPED}),
                bucket=1,
                order=QueryOrder.OLDEST_FIRST,
            ),
            TaskQuery(name_prefix="extract", owner="node-a"),
            TaskQuery(name_prefix="100%", tag="io", buckets=frozenset({0, 1, 2, 3})),
            TaskQuery(
                pipeline_id="p1",
                created_after=T0 + timedelta(seconds=2),
                lease_expired_before=T0 + timedelta(seconds=20),
            ),
            TaskQuery(owner="node-b", buckets=frozenset({1, 3}), limit=3, order=QueryOrder.OLDEST_FIRST),
            TaskQuery(tag="cpu", created_before=T0 + timedelta(seconds=8), limit=4),
            TaskQuery(bucket=2, buckets=frozenset({2, 3}), pipeline_id="p2", statuses=frozenset(S)),
            TaskQuery(
                statuses=frozenset({S.RUNNING, S.PAUSED, S.PENDING}),
                name_prefix="ext",
                tag="io",
                owner="node-a",
                created_after=T0 - timedelta(seconds=1),
                created_before=T0 + timedelta(seconds=100),
                lease_expired_before=T0 + timedelta(seconds=100),
                order=QueryOrder.OLDEST_FIRST,
                limit=10,
            ),
            TaskQuery(name_prefix="load\\", statuses=frozenset({S.SUCCEEDED, S.PAUSED, S.RUNNING}), limit=0),
        ]
        for query in queries:
            self.assertQuery(store, dataset, query)

    # ===============================================================================================
    # stats / bucket_counts
    # ===============================================================================================

    def test_stats_counts_by_status(self) -> None:
        store, dataset = self._loaded()
        stats = store.stats()
        self.assertIsInstance(stats, TaskStats)
        want = TaskStats({status: sum(1 for s in dataset if s.status is status) for status in S})
        self.assertEqual(stats.counts, want.counts)
        self.assertEqual(stats.total, len(dataset))
        self.assertEqual(store.stats(None).counts, want.counts)

    def test_stats_with_query_ignores_limit(self) -> None:
        store, dataset = self._loaded()
        query = TaskQuery(tag="io", limit=1)
        want = TaskStats(
            {status: sum(1 for s in dataset if s.status is status and query.matches(s)) for status in S}
        )
        self.assertEqual(store.stats(query).counts, want.counts)
        self.assertGreater(store.stats(query).total, 1)

    def test_stats_on_empty_store(self) -> None:
        store = self.open_store()
        stats = store.stats()
        self.assertEqual(stats.total, 0)
        self.assertEqual(stats[S.RUNNING], 0)

    def test_bucket_counts(self) -> None:
        store, dataset = self._loaded()
        want: dict[int, int] = {}
        for s in dataset:
            if s.bucket is not None:
                want[s.bucket] = want.get(s.bucket, 0) + 1
        self.assertEqual(store.bucket_counts(), want)
        self.assertNotIn(None, store.bucket_counts(), "无桶任务不计入")

    def test_bucket_counts_with_query_ignores_limit(self) -> None:
        store, dataset = self._loaded()
        query = TaskQuery(statuses=frozenset({S.PENDING, S.QUEUED, S.RUNNING, S.PAUSED}), limit=1)
        want: dict[int, int] = {}
        for s in dataset:
            if s.bucket is not None and query.matches(s):
                want[s.bucket] = want.get(s.bucket, 0) + 1
        self.assertEqual(store.bucket_counts(query), want)
        self.assertEqual(store.bucket_counts(TaskQuery(owner="nobody")), {})
