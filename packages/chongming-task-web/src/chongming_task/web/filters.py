"""任务列表的筛选条件与游标分页：URL 查询参数 ⇄ ``TaskFilter`` ⇄ ``TaskQuery``。

所有参数错误都变成 ``BadRequest``（一行中文，说清哪里错、该怎么写），由路由翻成 HTTP 400；
从不把半懂的参数悄悄忽略掉——运维按错的筛选条件"批量停止"是事故。

分页用键集（keyset）而不是 OFFSET：OFFSET 在一百万行上要扫过前面所有行，而且翻页期间有新任务
插入时会重复或漏掉行。键是 (created_at, task_id)，与 ``TaskQuery`` 的排序键一致。
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from chongming_task import ConfigurationError, QueryOrder, TaskQuery, TaskStatus
from chongming_task.storage import MAX_LOG_LINES

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_TEXT_PARAM = 1000
"""筛选文本的长度上限：任务名前缀、标签、持有者。再长只可能是误粘贴或攻击。"""

MAX_LOG_PAGE = MAX_LOG_LINES
"""日志接口一次最多返回的行数：存储每任务本来就只保存这么多。"""

FILTER_KEYS = ("status", "name", "tag", "bucket", "holder", "durable")

_ONE_MICROSECOND = timedelta(microseconds=1)


class BadRequest(ValueError):
    """请求参数不合法：消息直接给用户看（HTTP 400）。"""


@dataclass(frozen=True)
class Cursor:
    """键集游标：上一页最后一行的 (created_at, task_id)。下一页只含排在它之后的行。"""

    created_at: datetime
    task_id: str

    def encode(self) -> str:
        raw = f"{self.created_at.isoformat(timespec='microseconds')}|{self.task_id}".encode()
        return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        try:
            padded = text + "=" * (-len(text) % 4)
            raw = base64.urlsafe_b64decode(padded.encode("ascii")).decode("utf-8")
            stamp, sep, task_id = raw.partition("|")
            created_at = datetime.fromisoformat(stamp)
        except (ValueError, UnicodeError, binascii.Error):
            raise BadRequest("翻页游标 after 无法解析：请从第一页重新翻（去掉 after 参数）") from None
        if not sep or not task_id or created_at.utcoffset() is None:
            raise BadRequest("翻页游标 after 无法解析：请从第一页重新翻（去掉 after 参数）")
        return cls(created_at, task_id)


@dataclass(frozen=True)
class TaskFilter:
    """网页与 JSON API 共用的筛选条件（全部取交集；空表示不限）。"""

    statuses: frozenset[TaskStatus] = field(default_factory=frozenset)
    name_prefix: str | None = None
    tag: str | None = None
    bucket: int | None = None
    holder: str | None = None
    durable: bool | None = None
    """True 只看持久任务（带配方），False 只看非持久的，None 不限；由存储的 ``TaskQuery.durable`` 过滤。"""

    @property
    def empty(self) -> bool:
        return not (
            self.statuses
            or self.name_prefix
            or self.tag
            or self.bucket is not None
            or self.holder
            or self.durable is not None
        )

    def query(
        self,
        *,
        statuses: Iterable[TaskStatus] | None = None,
        limit: int | None = None,
        created_before: datetime | None = None,
    ) -> TaskQuery:
        """对应的 ``TaskQuery``。``statuses`` 给出时与筛选的状态取交集（批量操作只碰它能作用的状态）。"""
        chosen: frozenset[TaskStatus] | None = self.statuses or None
        if statuses is not None:
            wanted = frozenset(statuses)
            chosen = wanted if chosen is None else chosen & wanted
        return TaskQuery(
            statuses=chosen,
            name_prefix=self.name_prefix,
            tag=self.tag,
            bucket=self.bucket,
            owner=self.holder,
            durable=self.durable,
            limit=limit,
            created_before=created_before,
            order=QueryOrder.NEWEST_FIRST,
        )

    def params(self) -> list[tuple[str, str]]:
        """回写成 URL 参数（翻页链接、批量页、SSE 地址都用它，保证看到的与操作的是同一组条件）。"""
        items: list[tuple[str, str]] = [("status", s.value) for s in sorted(self.statuses)]
        if self.name_prefix is not None:
            items.append(("name", self.name_prefix))
        if self.tag is not None:
            items.append(("tag", self.tag))
        if self.bucket is not None:
            items.append(("bucket", str(self.bucket)))
        if self.holder is not None:
            items.append(("holder", self.holder))
        if self.durable is not None:
            items.append(("durable", "1" if self.durable else "0"))
        return items

    def querystring(self, **extra: str | None) -> str:
        items = self.params() + [(k, v) for k, v in extra.items() if v is not None]
        return urlencode(items)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": sorted(s.value for s in self.statuses),
            "name": self.name_prefix,
            "tag": self.tag,
            "bucket": self.bucket,
            "holder": self.holder,
            "durable": self.durable,
        }


def _text(params: Mapping[str, Any], key: str, label: str) -> str | None:
    value = params.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{label}（{key}）必须是字符串")
    if value == "":
        return None  # 表单里留空 = 不限
    if len(value) > MAX_TEXT_PARAM:
        raise BadRequest(f"{label}（{key}）太长：最多 {MAX_TEXT_PARAM} 个字符")
    if "\x00" in value:
        raise BadRequest(f"{label}（{key}）不能包含 NUL 字符")
    return value


def _statuses(values: Iterable[Any]) -> frozenset[TaskStatus]:
    chosen: set[TaskStatus] = set()
    for raw in values:
        if not isinstance(raw, str):
            raise BadRequest("状态（status）必须是字符串")
        for part in raw.split(","):
            part = part.strip()
            if not part:
                continue
            try:
                chosen.add(TaskStatus(part))
            except ValueError:
                known = "、".join(s.value for s in TaskStatus)
                raise BadRequest(f"未知状态 {part!r}：可选 {known}") from None
    return frozenset(chosen)


_DURABLE_VALUES: dict[Any, bool | None] = {
    "": None,
    "all": None,
    "1": True,
    "true": True,
    "yes": True,
    "0": False,
    "false": False,
    "no": False,
}


def _durable(value: Any) -> bool | None:
    """``durable``：1/true/yes 只看持久任务，0/false/no 只看非持久的，留空或 all 不限。

    JSON 里也可以直接写布尔。"""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _DURABLE_VALUES:
        return _DURABLE_VALUES[value.strip().lower()]
    raise BadRequest(
        "持久筛选（durable）只能是 1（只看持久任务）、0（只看非持久任务）或留空（全部），"
        f"收到 {str(value)[:50]!r}"
    )


def _int(value: Any, key: str, label: str, *, low: int, high: int | None) -> int:
    if isinstance(value, bool):
        raise BadRequest(f"{label}（{key}）必须是整数，收到 {value!r}")
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit() and len(value) < 20:
        number = int(value.strip())
    else:
        raise BadRequest(f"{label}（{key}）必须是整数，收到 {str(value)[:50]!r}")
    if number < low or (high is not None and number > high):
        bound = f"{low}–{high}" if high is not None else f">= {low}"
        raise BadRequest(f"{label}（{key}）越界：合法范围是 {bound}，收到 {number}")
    return number


def parse_filter(params: Mapping[str, Any], statuses: Iterable[Any], *, num_buckets: int) -> TaskFilter:
    """从查询参数（或 JSON 对象）解析筛选条件。``statuses`` 是全部 status 参数（可重复、可逗号分隔）。"""
    bucket_raw = params.get("bucket")
    bucket = (
        None if bucket_raw in (None, "") else _int(bucket_raw, "bucket", "桶号", low=0, high=num_buckets - 1)
    )
    result = TaskFilter(
        statuses=_statuses(statuses),
        name_prefix=_text(params, "name", "任务名前缀"),
        tag=_text(params, "tag", "标签"),
        bucket=bucket,
        holder=_text(params, "holder", "持有者"),
        durable=_durable(params.get("durable")),
    )
    try:
        result.query()  # 让 TaskQuery 自己再校验一遍（标签写法等），错误同样是 400
    except ConfigurationError as exc:
        raise BadRequest(str(exc)) from None
    return result


def parse_page_size(value: Any) -> int:
    if value in (None, ""):
        return DEFAULT_PAGE_SIZE
    return _int(value, "limit", "每页条数", low=1, high=MAX_PAGE_SIZE)


def parse_log_args(params: Mapping[str, Any]) -> tuple[int | None, int | None, int]:
    """日志的 ``attempt``（第几次尝试，不给 = 全部）、``after``（只要 seq 大于它的行）与 ``limit``。"""

    def optional(key: str, label: str) -> int | None:
        value = params.get(key)
        return None if value in (None, "") else _int(value, key, label, low=0, high=2**63 - 1)

    attempt = optional("attempt", "尝试次数")
    after = optional("after", "日志序号")
    raw_limit = params.get("limit")
    limit = (
        MAX_LOG_PAGE
        if raw_limit in (None, "")
        else _int(raw_limit, "limit", "日志行数", low=1, high=MAX_LOG_PAGE)
    )
    return attempt, after, limit


def parse_cursor(value: Any) -> Cursor | None:
    if value in (None, ""):
        return None
    if not isinstance(value, str) or len(value) > 2 * MAX_TEXT_PARAM:
        raise BadRequest("翻页游标 after 无法解析：请从第一页重新翻（去掉 after 参数）")
    return Cursor.decode(value)


def page_query(flt: TaskFilter, cursor: Cursor | None, fetch: int) -> TaskQuery:
    """一页的查询：新的在前；有游标时只要 created_at 不晚于游标的行（同一微秒的行由调用方按 task_id 再筛）。

    ``created_before`` 是开区间，所以取"游标时刻 + 1 微秒"：与游标同一时刻、task_id 更小的行不能漏。
    """
    created_before = None if cursor is None else cursor.created_at + _ONE_MICROSECOND
    return replace(flt.query(limit=fetch), created_before=created_before)


__all__ = [
    "DEFAULT_PAGE_SIZE",
    "FILTER_KEYS",
    "MAX_LOG_PAGE",
    "MAX_PAGE_SIZE",
    "BadRequest",
    "Cursor",
    "TaskFilter",
    "page_query",
    "parse_cursor",
    "parse_filter",
    "parse_log_args",
    "parse_page_size",
]
