"""契约用例：任务日志（append_logs / read_logs / log_stats，issue 18；存储指南 §11）。

``logs --follow`` 靠"按 seq 续读不丢、不重、不乱序"工作；这里检查的就是它赖以成立的存储语义：
存储分配的序号、每任务的行数上限（丢最旧的并计数）、4 KB 截断、随任务一起删除，以及重试幂等：结果未知的
一批被原样重试（或与上一批部分重叠）时，带身份（``writer`` / ``writer_seq``）的行只写一次、不丢、不乱序。
"""

from __future__ import annotations

import functools
import threading
from datetime import datetime, timedelta

from chongming_task.core.storage.values import (
    LOG_TRUNCATED_MARKER,
    MAX_LOG_LINES,
    MAX_LOG_MESSAGE_BYTES,
    ArchiveReceipt,
    LogLine,
    LogStats,
)
from chongming_task.errors import ConfigurationError
from chongming_task.storage import TaskStore
from chongming_task.testing.contract._base import T0, TZ_SHANGHAI, ContractBase, S, snap, walk


def line(
    task_id: str,
    message: str,
    *,
    attempt: int = 1,
    level: str = "INFO",
    at: datetime | None = None,
    writer: str = "",
    writer_seq: int = 0,
) -> LogLine:
    return LogLine(
        task_id=task_id,
        attempt=attempt,
        at=at or T0,
        level=level,
        message=message,
        writer=writer,
        writer_seq=writer_seq,
    )


def numbered(task_id: str, writer: str, numbers: range, *, attempt: int = 1) -> list[LogLine]:
    """写入者 ``writer`` 的第 numbers 行（正文 ``writer#n``），带幂等身份。"""
    return [line(task_id, f"{writer}#{n}", attempt=attempt, writer=writer, writer_seq=n) for n in numbers]


def messages(store: TaskStore, task_id: str) -> list[tuple[int, str]]:
    return [(g.seq, g.message) for g in store.read_logs(task_id, limit=MAX_LOG_LINES)]


class LogCases(ContractBase):
    """任务日志。"""

    def _task(self, store: TaskStore, task_id: str) -> None:
        store.create(snap(task_id))

    def test_append_and_read_logs_round_trip_in_order(self) -> None:
        store = self.open_store()
        self._task(store, "t")
        at = datetime(2026, 3, 1, 9, 15, 30, 123457, tzinfo=TZ_SHANGHAI)
        lines = [
            line("t", '第一行：含 "引号"、\\ 反斜杠、\n 换行', at=at),
            line("t", "second", level="WARNING", at=at + timedelta(microseconds=1)),
            line("t", "third", level="ERROR", attempt=2),
        ]
        self.assertIsNone(store.append_logs(lines))
        got = store.read_logs("t")
        self.assertEqual([g.seq for g in got], [1, 2, 3], "seq 由存储按任务从 1 起分配")
        for want, have in zip(lines, got, strict=True):
            self.assertIsInstance(have, LogLine)
            self.assertEqual(
                (have.task_id, have.attempt, have.level, have.message, have.truncated),
                (want.task_id, want.attempt, want.level, want.message, False),
            )
            self.assertEqual(have.at, want.at)
            self.assertEqual(have.at.utcoffset(), want.at.utcoffset(), "at 的时区偏移必须原样往返")
        self.assertEqual(got[0].at.microsecond, 123457)

    def test_seq_continues_across_batches_and_ignores_given_seq(self) -> None:
        store = self.open_store()
        self._task(store, "a")
        self._task(store, "b")
        store.append_logs([line("a", "a1"), line("b", "b1"), line("a", "a2")])
        store.append_logs([LogLine(task_id="a", attempt=1, at=T0, level="INFO", message="a3", seq=99)])
        self.assertEqual(
            [(g.seq, g.message) for g in store.read_logs("a")], [(1, "a1"), (2, "a2"), (3, "a3")]
        )
        self.assertEqual(
            [(g.seq, g.message) for g in store.read_logs("b")], [(1, "b1")], "序号按任务各自分配"
        )
        store.append_logs([])  # 空批是空操作
        self.assertEqual(store.log_stats("a"), LogStats(kept=3, dropped=0, last_seq=3))

    def test_read_logs_filters_by_attempt_after_seq_and_limit(self) -> None:
        store = self.open_store()
        self._task(store, "t")
        store.append_logs([line("t", f"m{i}", attempt=1 + i % 2) for i in range(10)])
        self.assertEqual([g.seq for g in store.read_logs("t", after_seq=7)], [8, 9, 10])
        self.assertEqual([g.seq for g in store.read_logs("t", limit=3)], [1, 2, 3])
        self.assertEqual([g.seq for g in store.read_logs("t", after_seq=2, limit=2)], [3, 4])
        second = store.read_logs("t", attempt=2)
        self.assertEqual([g.message for g in second], [f"m{i}" for i in range(1, 10, 2)])
        self.assertEqual([g.seq for g in store.read_logs("t", attempt=1, after_seq=5)], [7, 9])
        self.assertEqual(store.read_logs("t", after_seq=10), [])
        self.assertEqual(store.read_logs("t", attempt=3), [])

    def test_logs_of_unknown_task_are_skipped_and_read_empty(self) -> None:
        store = self.open_store()
        self._task(store, "t")
        store.append_logs([line("ghost", "lost"), line("t", "kept")])
        self.assertEqual([g.message for g in store.read_logs("t")], ["kept"], "别的任务的行照常写入")
        self.assertEqual(store.read_logs("ghost"), [])
        self.assertEqual(store.log_stats("ghost"), LogStats())

    def test_logs_are_bounded_per_task_oldest_dropped_and_counted(self) -> None:
        store = self.open_store()
        self._task(store, "t")
        self._task(store, "quiet")
        total = MAX_LOG_LINES + 5
        store.append_logs([line("t", f"line {i}") for i in range(1, total - 1)])
        store.append_logs(
            [line("t", f"line {i}") for i in range(total - 1, total + 1)] + [line("quiet", "x")]
        )
        stats = store.log_stats("t")
        self.assertEqual(stats, LogStats(kept=MAX_LOG_LINES, dropped=5, last_seq=total))
        got = store.read_logs("t", limit=MAX_LOG_LINES)
        self.assertEqual(len(got), MAX_LOG_LINES)
        self.assertEqual(got[0].seq, 6, "丢掉的是最旧的行")
        self.assertEqual(got[0].message, "line 6")
        self.assertEqual(got[-1].message, f"line {total}")
        self.assertEqual(store.log_stats("quiet"), LogStats(kept=1, dropped=0, last_seq=1), "上限按任务计")

    def test_retried_batch_is_written_once(self) -> None:
        store = self.open_store()
        self._task(store, "t")
        batch = numbered("t", "w1", range(1, 4))
        store.append_logs(batch)
        store.append_logs(batch)  # 结果未知的那一批被原样重试
        self.assertEqual(
            messages(store, "t"), [(1, "w1#1"), (2, "w1#2"), (3, "w1#3")], "重试的行不能写第二遍"
        )
        self.assertEqual(store.log_stats("t"), LogStats(kept=3, dropped=0, last_seq=3), "重复的行不占序号")
        got = store.read_logs("t")
        self.assertEqual({(g.writer, g.writer_seq) for g in got}, {("", 0)}, "读回的行不带写入身份")

    def test_partially_overlapping_batch_adds_only_the_new_lines_in_order(self) -> None:
        store = self.open_store()
        self._task(store, "t")
        store.append_logs(numbered("t", "w1", range(1, 4)))
        store.append_logs(numbered("t", "w1", range(2, 6)))  # 2、3 写过，4、5 是新的
        store.append_logs(numbered("t", "w1", range(5, 7)) + numbered("t", "w1", range(6, 8)))  # 批内也去重
        self.assertEqual(messages(store, "t"), [(n, f"w1#{n}") for n in range(1, 8)])
        self.assertEqual(store.log_stats("t"), LogStats(kept=7, dropped=0, last_seq=7))

    def test_writers_and_tasks_have_independent_identities(self) -> None:
        store = self.open_store()
        self._task(store, "t")
        self._task(store, "u")
        # 两个写入者（例如同一任务的两次尝试在两个进程里）交错写同一个任务；同一写入者的号在别的任务上无关。
        mixed = [
            *numbered("t", "w1", range(1, 3)),
            *numbered("t", "w2", range(1, 3), attempt=2),
            *numbered("u", "w1", range(1, 3)),
            line("t", "anonymous"),
        ]
        store.append_logs(mixed)
        store.append_logs(mixed)
        self.assertEqual(
            [m for _, m in messages(store, "t")],
            ["w1#1", "w1#2", "w2#1", "w2#2", "anonymous", "anonymous"],
            "各写入者的行各写一次、保持给出的顺序；不带身份的行每次都追加",
        )
        self.assertEqual([g.attempt for g in store.read_logs("t", attempt=2)], [2, 2])
        self.assertEqual(messages(store, "u"), [(1, "w1#1"), (2, "w1#2")])
        store.append_logs(numbered("t", "w2", range(3, 4), attempt=2) + numbered("t", "w1", range(2, 4)))
        self.assertEqual([m for _, m in messages(store, "t")][-2:], ["w2#3", "w1#3"])
        self.assertEqual(store.log_stats("t"), LogStats(kept=8, dropped=0, last_seq=8))

    def test_retry_of_a_batch_over_the_bound_neither_duplicates_nor_counts_drops_twice(self) -> None:
        store = self.open_store()
        self._task(store, "t")
        total = MAX_LOG_LINES + 5
        batch = numbered("t", "w1", range(1, total + 1))
        store.append_logs(batch)
        # 最旧的 5 行在第一次写入时就被上限删掉了；重试时它们也不能被当成新行再写回来。
        store.append_logs(batch)
        self.assertEqual(store.log_stats("t"), LogStats(kept=MAX_LOG_LINES, dropped=5, last_seq=total))
        got = messages(store, "t")
        self.assertEqual(got[0], (6, "w1#6"))
        self.assertEqual(got[-1], (total, f"w1#{total}"))
        store.append_logs(numbered("t", "w1", range(total - 1, total + 2)))
        self.assertEqual(store.log_stats("t"), LogStats(kept=MAX_LOG_LINES, dropped=6, last_seq=total + 1))
        self.assertEqual(messages(store, "t")[-1], (total + 1, f"w1#{total + 1}"))

    def test_concurrent_retrying_writers_of_one_task_each_land_once_in_order(self) -> None:
        store = self.open_store()
        self._task(store, "t")
        writers, batches, size = 4, 12, 3
        errors: list[BaseException] = []
        start = threading.Barrier(writers)

        def writer(name: str) -> None:
            try:
                start.wait()
                for b in range(batches):
                    batch = numbered("t", name, range(b * size + 1, (b + 1) * size + 1))
                    store.append_logs(batch)
                    store.append_logs(batch)  # 每一批都被重试一次（回执丢了）
            except BaseException as exc:
                errors.append(exc)

        self.run_threads([functools.partial(writer, f"w{i}") for i in range(writers)])
        self.assertEqual(errors, [])
        got = store.read_logs("t", limit=MAX_LOG_LINES)
        total = writers * batches * size
        self.assertEqual([g.seq for g in got], list(range(1, total + 1)), "并发写入也不重号、不留空洞")
        for i in range(writers):
            mine = [g.message for g in got if g.message.startswith(f"w{i}#")]
            self.assertEqual(mine, [f"w{i}#{n}" for n in range(1, batches * size + 1)], "每行一次、按序")
        self.assertEqual(store.log_stats("t"), LogStats(kept=total, dropped=0, last_seq=total))

    def test_long_messages_are_truncated_with_a_marker(self) -> None:
        store = self.open_store()
        self._task(store, "t")
        long = "日志" * 3000  # 18000 字节
        exact = "x" * MAX_LOG_MESSAGE_BYTES
        store.append_logs([line("t", long), line("t", exact)])
        cut, whole = store.read_logs("t")
        self.assertTrue(cut.truncated)
        self.assertTrue(cut.message.endswith(LOG_TRUNCATED_MARKER))
        self.assertLessEqual(len(cut.message.encode("utf-8")), MAX_LOG_MESSAGE_BYTES)
        self.assertTrue(long.startswith(cut.message[: -len(LOG_TRUNCATED_MARKER)]))
        self.assertFalse(whole.truncated, "正好 4 KB 的正文不截断")
        self.assertEqual(whole.message, exact)

    def test_prune_deletes_logs_with_the_task(self) -> None:
        store = self.open_store()
        done, records = walk(snap("done", finished_at=T0), S.QUEUED, S.RUNNING, S.SUCCEEDED)
        store.create(done, records)
        self._task(store, "live")
        store.append_logs([line("done", "bye", writer="w1", writer_seq=1), line("live", "hi")])
        self.assertEqual(store.prune(keep_terminal=0), 1)
        self.assertEqual(store.read_logs("done"), [])
        self.assertEqual(store.log_stats("done"), LogStats(), "被删任务的日志计数也要清掉")
        self.assertEqual([g.message for g in store.read_logs("live")], ["hi"])
        # 同名任务重新建出来，序号从 1 重新开始：不会接上被删任务的旧行；写入者的水位线也随任务删了。
        store.create(snap("done"))
        store.append_logs([line("done", "again", writer="w1", writer_seq=1)])
        self.assertEqual([(g.seq, g.message) for g in store.read_logs("done")], [(1, "again")])

    def test_delete_archived_deletes_logs_with_the_task(self) -> None:
        store = self.open_store()
        done, records = walk(snap("done", finished_at=T0), S.QUEUED, S.RUNNING, S.SUCCEEDED)
        store.create(done, records)
        store.append_logs([line("done", "bye", writer="w1", writer_seq=1)])
        exported = store.export_finished(T0 + timedelta(days=1))
        self.assertEqual([item.snapshot.task_id for item in exported], ["done"])
        store.delete_archived(ArchiveReceipt.of(tasks=exported))
        self.assertIsNone(store.get("done"))
        self.assertEqual(store.read_logs("done"), [])
        self.assertEqual(store.log_stats("done"), LogStats())
        store.create(snap("done"))
        store.append_logs([line("done", "again", writer="w1", writer_seq=1)])
        self.assertEqual([g.message for g in store.read_logs("done")], ["again"], "水位线随任务删掉")

    def test_log_arguments_are_checked(self) -> None:
        store = self.open_store()
        self._task(store, "t")
        for bad in (line("t", "x"), "text", [{"task_id": "t"}], None):
            with self.assertRaises(ConfigurationError, msg=f"append_logs({bad!r})"):
                store.append_logs(bad)  # type: ignore[arg-type]
        with self.assertRaises(ConfigurationError):
            store.append_logs([line("t", "ok"), line("t", "含 NUL\x00")])
        self.assertEqual(store.read_logs("t"), [], "整批不写")
        for kwargs in ({"attempt": -1}, {"after_seq": "3"}, {"limit": 0}, {"limit": True}):
            with self.assertRaises(ConfigurationError, msg=f"read_logs({kwargs})"):
                store.read_logs("t", **kwargs)
        with self.assertRaises(ConfigurationError):
            store.read_logs(["t"])  # type: ignore[arg-type]
        with self.assertRaises(ConfigurationError):
            LogLine(task_id="t", attempt=1, at=datetime(2026, 1, 1), level="INFO", message="naive")
        with self.assertRaises(ConfigurationError):
            LogLine(task_id="t", attempt=1, at=T0, level="", message="x")
        for writer, writer_seq in (("w", 0), ("", 1), ("w" * 65, 1), ("写入者", 1), ("w\x00", 1), ("w", -1)):
            with self.assertRaises(ConfigurationError, msg=f"writer={writer!r}, writer_seq={writer_seq!r}"):
                line("t", "x", writer=writer, writer_seq=writer_seq)

    # ===============================================================================================
    # _append_log_lines：运行时日志缓冲的受信入口（默认就是 append_logs；内存存储跳过重复的检查与复制）
    # ===============================================================================================

    def test_trusted_log_append_writes_exactly_like_append_logs(self) -> None:
        """同一串批次一份经公开的 append_logs 写给任务 ``p``、一份经受信入口写给任务 ``h``：读回的行
        （除任务号）与计数逐项相同——序号、去重水位线、每任务上限、跳过不存在的任务、一行一批地追加很多次。"""
        store = self.open_store()
        self._task(store, "p")
        self._task(store, "h")

        def script(task_id: str) -> list[list[LogLine]]:
            batches: list[list[LogLine]] = [
                [line(task_id, f"单行 {i}", attempt=1 + i % 3)] for i in range(40)
            ]
            batches += [
                numbered(task_id, "w1", range(1, 4)),
                numbered(task_id, "w1", range(2, 6)),  # 部分重叠：2、3 写过
                numbered(task_id, "w1", range(2, 6)),  # 原样重试
                [line("ghost", "lost"), *numbered(task_id, "w2", range(1, 3), attempt=2)],
                [line(task_id, f"x{i}", level="WARNING") for i in range(MAX_LOG_LINES)],  # 越过上限
                numbered(task_id, "w1", range(5, 8)),
                [line(task_id, "末行", writer="w2", writer_seq=3, attempt=2)],
            ]
            return batches

        for batch in script("p"):
            store.append_logs(batch)
        for batch in script("h"):
            store._append_log_lines(batch)

        def shape(task_id: str) -> list[tuple[object, ...]]:
            got = store.read_logs(task_id, limit=MAX_LOG_LINES)
            return [
                (g.seq, g.attempt, g.at, g.level, g.message, g.truncated, g.writer, g.writer_seq) for g in got
            ]

        self.assertEqual(shape("h"), shape("p"))
        self.assertEqual({g.task_id for g in store.read_logs("h")}, {"h"})
        total = 40 + 5 + 2 + MAX_LOG_LINES + 2 + 1
        self.assertEqual(
            store.log_stats("h"), LogStats(kept=MAX_LOG_LINES, dropped=total - MAX_LOG_LINES, last_seq=total)
        )
        self.assertEqual(store.log_stats("h"), store.log_stats("p"))
        self.assertEqual(shape("h")[-1][4], "末行")
        self.assertEqual(store.read_logs("ghost"), [])
        self.assertEqual(
            [g.seq for g in store.read_logs("h", attempt=2, after_seq=total - 5)],
            [total],
            "按尝试、按序号续读",
        )

    def test_trusted_log_append_keeps_order_across_many_small_batches(self) -> None:
        """运行时每次尝试结束写一两行：一行一批地写几十次，行数从少到多（内存存储在这里换存放方式），
        序号连续、顺序不变，按尝试与 after_seq 续读照常。"""
        store = self.open_store()
        self._task(store, "t")
        for n in range(1, 71):
            store._append_log_lines([line("t", f"m{n}", attempt=1 + n // 30, writer="w", writer_seq=n)])
            if n in (1, 31, 33, 70):
                self.assertEqual(messages(store, "t"), [(i, f"m{i}") for i in range(1, n + 1)])
        store._append_log_lines([line("t", "m70", writer="w", writer_seq=70)])  # 重试：不再写
        self.assertEqual(store.log_stats("t"), LogStats(kept=70, dropped=0, last_seq=70))
        self.assertEqual([g.seq for g in store.read_logs("t", attempt=2)], list(range(30, 60)))
        self.assertEqual([g.seq for g in store.read_logs("t", after_seq=65, limit=2)], [66, 67])

    def test_trusted_log_append_lines_are_deleted_with_the_task(self) -> None:
        store = self.open_store()
        done, records = walk(snap("done", finished_at=T0), S.QUEUED, S.RUNNING, S.SUCCEEDED)
        store.create(done, records)
        store._append_log_lines([line("done", "bye", writer="w1", writer_seq=1)])
        self.assertEqual(store.prune(keep_terminal=0), 1)
        self.assertEqual((store.read_logs("done"), store.log_stats("done")), ([], LogStats()))
        store.create(snap("done"))
        store._append_log_lines([line("done", "again", writer="w1", writer_seq=1)])
        self.assertEqual(messages(store, "done"), [(1, "again")], "序号与水位线随任务删掉")
