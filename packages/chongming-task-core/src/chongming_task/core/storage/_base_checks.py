"""不依赖存储值类型的入参校验（``checks`` 的下半部分）。

拆成两个文件只为避免导入环：``values`` 里的值类型在构造时要用这些校验（时间带时区、JSON 可序列化、
节点名），而 ``checks`` 的上半部分（指令动作、节点记录）又要用到值类型。后端与第三方实现一律从
``chongming_task.core.storage.checks`` 导入——那里重新导出这里的全部名字。
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from chongming_task.core.compact_json import acyclic_encoder
from chongming_task.core.json_depth import check_json_depth
from chongming_task.core.numbers import MAX_SECONDS, check_seconds
from chongming_task.core.records import (
    MAX_ID_LENGTH,
    MAX_JSON_BYTES,
    MAX_TEXT_LENGTH,
    check_storable_changes,
    check_storable_fields,
    check_storable_text,
)
from chongming_task.errors import ConfigurationError
from chongming_task.models import Progress, TaskSnapshot, Transition

# 严格的紧凑 JSON（不许 NaN / Infinity）：输出与 ``json.JSONEncoder(ensure_ascii=False, allow_nan=False,
# separators=(",", ":")).encode`` 逐字相同。编码之前 check_json_value 已用 check_json_depth 量过深度：带环的值
# 深度无限、在那里就被拒绝了，到得了编码器的值都无环，可以用不查循环引用的编码器（约快三倍，见
# core/compact_json.py）。
_encode_strict = acyclic_encoder(allow_nan=False)

MAX_LEASE_SECONDS = MAX_SECONDS  # 与其它时长参数同一个上限（10 年）

TOUCH_FIELDS = frozenset({"progress", "heartbeat_at", "lease_owner", "lease_until"})
"""touch / touch_many 接受的参数名（heartbeat_at 写进快照的 last_heartbeat_at）。"""


def check_aware(name: str, value: object, *, required: bool = False) -> None:
    """带时区的 datetime（``required=False`` 时也可以是 None）。

    naive 时间在不同机器上会被按不同的本地时区解释，所以一律拒绝。
    """
    if (required or value is not None) and (not isinstance(value, datetime) or value.utcoffset() is None):
        raise ConfigurationError(f"{name} 必须是带时区的 datetime，收到 {value!r}")


# json 编码器把 NUL 写成 \u0000，字面的反斜杠写成 \\：只有前面是偶数个反斜杠的 \u0000 才是 NUL。
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def check_json_value(value: Any, *, what: str = "outcome", max_bytes: int = MAX_JSON_BYTES) -> str:
    """把值序列化为严格 JSON 文本，并确认每个后端都存得下它；否则抛 ConfigurationError 说明原因。

    这是 JSON 值（任务返回值、指令 payload、节点 info）唯一的可存储性检查：返回时（result_invalid）与
    各后端写入时调用的是同一个函数（用户指南 §13、持久层实现指南 §5.2）：

    * 可 JSON 序列化、无 NaN / inf、嵌套不超过 ``MAX_JSON_DEPTH`` 层；
    * 字符串（含键）里没有 NUL（PostgreSQL 的 jsonb 存不下）与孤立代理项（编码不成 UTF-8）；
    * 编码后的 UTF-8 不超过 ``max_bytes`` 字节（默认 ``MAX_JSON_BYTES`` = 16 MiB）。
    """
    if value is None:
        return "null"  # 最常见的返回值：不必为它走一遍编码器
    # 先量深度（非递归）：标准库编码器是递归的，过深的值抛的是 RecursionError，不是"不可序列化"。
    check_json_depth(value, what=what)
    try:
        text = _encode_strict(value)  # 深度已量过（无环），见 _encode_strict
    except (TypeError, ValueError, RecursionError) as exc:
        # 中文名词与"必须"之间不留空格；英文标识符（outcome、NodeRecord.info）后面照常空一格。
        gap = " " if what[-1:].isascii() else ""
        raise ConfigurationError(
            f"{what}{gap}必须可 JSON 序列化（dict / list / str / 数字 / bool / None）：{exc}"
        ) from None
    check_json_text(text, what=what, max_bytes=max_bytes)
    return text


def check_json_text(text: str, *, what: str, max_bytes: int = MAX_JSON_BYTES) -> None:
    """已编码的 JSON 文本（``ensure_ascii=False``）的可存储性：大小、NUL、孤立代理项（见上）。"""
    # 热路径：ASCII 文本的字符数就是字节数，也不可能含代理项；字符数已超上限时不必编码就知道超了
    # （每个字符至少一个字节）。
    if text.isascii() or len(text) > max_bytes:
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise ConfigurationError(
                f"{what} 里的字符串不能包含无法用 UTF-8 表示的字符（孤立的代理项，如 \\ud800）："
                "任何存储都无法保存它，请先清洗文本"
            ) from None
    if size > max_bytes:
        raise ConfigurationError(
            f"{what} 太大（编码后至少 {size} 字节，上限 {max_bytes} 字节 = {max_bytes / 2**20:g} MiB）："
            "请把大数据写进文件或对象存储，只返回它的路径 / key"
        )
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise ConfigurationError(
            f"{what} 里的字符串不能包含 NUL 字符（\\x00）：PostgreSQL 的 jsonb 无法保存它，请先去掉或转义"
        )


def check_node_owner(owner: object) -> str:
    """节点名：非空字符串、不含 NUL（PostgreSQL 的 text 存不下 NUL）。"""
    if not isinstance(owner, str) or not owner:
        raise ConfigurationError(f"节点名 owner 必须是非空字符串（例如 'node-a'），收到 {owner!r}")
    if "\x00" in owner:
        raise ConfigurationError("节点名 owner 不能包含 NUL 字符（\\x00）")
    check_storable_text("节点名 owner", owner, limit=MAX_ID_LENGTH, optional=False)
    return owner


def check_bucket(name: str, value: object) -> int:
    """桶号：非负整数（bool 不算整数——True 当桶号几乎总是写错了）。"""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{name} 里只能放非负整数桶号，收到 {value!r}")
    return value


def check_key(name: str, value: object) -> str:
    """按键读取的参数（task_id、command_id）：必须是字符串。

    键来自无类型代码（CLI、配置）时，列表之类的值会在 dict 查找里变成 TypeError、在 SQL 里变成驱动错误：
    在入口处说清楚。
    """
    if not isinstance(value, str):
        raise ConfigurationError(f"{name} 必须是字符串，收到 {value!r}")
    return value


def check_optional_text(name: str, value: object) -> None:
    """可为 None 的文本参数（issuer、reason、lease_owner……）：与快照文本字段同一份可存储性规则。"""
    check_storable_text(name, value, limit=MAX_TEXT_LENGTH)


def check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{name} 必须是非负整数，收到 {value!r}")


def check_positive_seconds(name: str, value: object) -> float:
    """正的有限秒数（超时、租约、间隔），不超过 10 年（core/numbers.py 的唯一数值检查点）。"""
    return check_seconds(name, value)


def check_claimant(value: object) -> None:
    """认领者（指令的 claimant、持久任务的持有者）：非空字符串，且与快照文本同一份可存储性规则——认领把它写进
    任务的 ``owner`` / ``lease_owner``，存储里的每个值都必须是查过的（``check_save_since`` 依赖这一点）。"""
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"认领者 claimant 必须是非空字符串，收到 {value!r}")
    check_storable_text("认领者 claimant", value, limit=MAX_ID_LENGTH, optional=False)


def check_holder(value: object) -> str | None:
    """claim_commands 的 ``holder`` 过滤：None（不限）或非空字符串。"""
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigurationError(f"持有者 holder 必须是非空字符串或 None，收到 {value!r}")
    return value


def check_snapshot(snapshot: object, like: TaskSnapshot | None = None) -> TaskSnapshot:
    """create / save 的快照：类型，以及与快照构造时同一份的可存储性检查（``check_storable_fields``）。

    状态机用不经校验的 ``evolve`` 复制快照，第三方代码也可能这样做：写入前再查一次，存不下的值在
    这里得到 ConfigurationError，而不是一个后端存下、另一个后端报驱动错误。

    ``like``：同一批里刚查过（整份查过，或经这里相对于查过的快照查过）的另一个快照。给了就只查与它不是同一个
    对象的字段（``check_storable_changes``）：create_many 的一批通常是同一个模板复制出来的，文本字段与标签都
    是同一批对象，十万个任务逐个整份再查一遍结果不会变。
    """
    if not isinstance(snapshot, TaskSnapshot):
        raise ConfigurationError(f"存储只接受 TaskSnapshot，收到 {type(snapshot).__name__}")
    if like is None:
        check_storable_fields(snapshot)
    else:
        check_storable_changes(like, snapshot)
    return snapshot


def check_transitions(task_id: str | None, transitions: Sequence[Transition]) -> None:
    """每条都是 Transition；给了 task_id 时还必须都属于它（append 的批可以跨任务，传 None）。"""
    for record in transitions:
        if not isinstance(record, Transition):
            raise ConfigurationError(f"迁移记录必须是 Transition，收到 {type(record).__name__}")
        if task_id is not None and record.task_id != task_id:
            raise ConfigurationError(f"迁移记录属于任务 {record.task_id!r}，不属于 {task_id!r}")


def validate_save(snapshot: TaskSnapshot, expect_version: int, transitions: Sequence[Transition]) -> None:
    """save() 的参数一致性：迁移记录必须正好覆盖 expect_version+1 .. snapshot.status_version。

    各后端在写入之前调用它，保证历史不会因调用方的错误而出现空洞或重复。没有迁移记录时快照版本必须等于
    expect_version（只改不涉及状态的字段）：版本前进了却不带记录，存储里的历史就缺了那几版（``_check_no_jump``）。
    """
    _check_expect_version(snapshot, expect_version)
    if transitions:
        check_transitions(None, transitions)  # 先确认都是 Transition，才能读 version
        _check_record_versions(snapshot, expect_version, transitions)
        check_transitions(snapshot.task_id, transitions)
        _check_last_record(snapshot, transitions)
    else:
        _check_no_jump(snapshot, expect_version)


def validate_checked_save(
    snapshot: TaskSnapshot, expect_version: int, transitions: Sequence[Transition]
) -> None:
    """``validate_save`` 去掉逐条检查的那一半，给刚 ``check_transitions(snapshot.task_id, transitions)`` 过的
    调用方（``checks.check_save``、``check_save_since``）：只查 expect_version、记录的版本号与末条的状态。

    为什么单开：save 的入参检查原来是 ``check_transitions(task_id)`` 再 ``validate_save``，而后者自己又把
    记录逐条查两遍（先查类型、再查归属）——同一条检查每次 save 跑三遍，前一遍通过之后后两遍不可能失败。
    调用方那一遍与 ``validate_save`` 里的两遍查的是同一件事（每条都是 Transition、都属于这个任务），所以
    ``check_transitions(task_id)`` + 本函数与 ``check_transitions(task_id)`` + ``validate_save`` 对任何入参的
    结果都一样：同样的入参被拒、同样的报错、同样的先后（归属与类型先于版本号）。调用方必须先做那一遍——
    不做时记录的类型与归属就没人查了（契约套件的 ``test_save_rejects_records_that_are_not_its_own`` 与变种
    ``SaveTrustsItsRecords`` 守着这一点）。"""
    _check_expect_version(snapshot, expect_version)
    if transitions:
        _check_record_versions(snapshot, expect_version, transitions)
        _check_last_record(snapshot, transitions)
    else:
        _check_no_jump(snapshot, expect_version)


def _check_expect_version(snapshot: TaskSnapshot, expect_version: int) -> None:
    if isinstance(expect_version, bool) or not isinstance(expect_version, int) or expect_version < 0:
        raise ConfigurationError(f"expect_version 必须是非负整数，收到 {expect_version!r}")
    if snapshot.status_version < expect_version:
        raise ConfigurationError(
            f"快照版本 {snapshot.status_version} 小于 expect_version {expect_version}：版本号只能前进"
        )


def _check_no_jump(snapshot: TaskSnapshot, expect_version: int) -> None:
    """（没有随附迁移记录）快照版本必须就是 expect_version。

    为什么要单独查：版本号的检查原来只在"有记录"时做，于是 ``save(v2 的快照, expect_version=0)`` 什么记录
    也不带就能通过——存储把快照写到 v2，历史里却一条也没有。历史没有空洞（每一版都有一条记录说明它从哪来）
    是存储的基本承诺（持久层实现指南 §2.2）：读回对照、归档、``StateMachine.from_snapshot`` 都靠它。这一条
    放在所有后端共用的入参检查里，任何后端、任何写入口（save / save_many / 写穿的 ``_save_direct`` /
    认领时一并提交的 save）都拒绝它。"""
    if snapshot.status_version != expect_version:
        missing = f"{expect_version + 1}" + (
            f" … {snapshot.status_version}" if snapshot.status_version > expect_version + 1 else ""
        )
        raise ConfigurationError(
            f"快照版本 {snapshot.status_version} 比 expect_version {expect_version} 新，"
            f"却没有随 save 提交迁移记录：历史不能有空洞——请把版本 {missing} 的迁移记录随 save 一起提交；"
            "只改不涉及状态的字段时，快照版本应保持 expect_version 不变"
        )


def _check_record_versions(
    snapshot: TaskSnapshot, expect_version: int, transitions: Sequence[Transition]
) -> None:
    """（记录已确认都是 Transition）版本正好是 expect_version+1 .. snapshot.status_version：不留空洞、
    不重复。"""
    versions = [t.version for t in transitions]
    expected = list(range(expect_version + 1, snapshot.status_version + 1))
    if versions != expected:
        raise ConfigurationError(f"随 save 提交的迁移记录版本必须正好是 {expected}，收到 {versions}")


def _check_last_record(snapshot: TaskSnapshot, transitions: Sequence[Transition]) -> None:
    if transitions[-1].to_status is not snapshot.status:
        raise ConfigurationError("最后一条迁移记录的目标状态必须等于快照状态")


def check_save_since(
    previous: TaskSnapshot, snapshot: TaskSnapshot, expect_version: int, transitions: Sequence[Transition]
) -> None:
    """与 save 同样的入参检查（``check_snapshot`` + ``check_transitions`` + ``validate_checked_save``），但
    相对于存储里的上一版 ``previous``：可存储性只查变了的字段（``check_storable_changes``）。

    给写入就在本进程、持着存储自己的锁完成的存储用（``TaskStore._save_direct``）：``previous`` 是锁内
    读到的、当初整份查过才存下的那一版。常见情形（一条接得上的迁移记录、文本字段原样沿用）只是几次比较；
    任何不寻常的入参（空的或接不上的迁移记录、非 int 的版本号）都交给完整的 ``check_transitions`` /
    ``validate_save``，报错与 save 一字不差。调用方先确认 ``snapshot`` 是 TaskSnapshot。
    """
    check_storable_changes(previous, snapshot)
    task_id = snapshot.task_id
    if transitions and expect_version.__class__ is int and expect_version >= 0:
        version = expect_version
        for record in transitions:
            version += 1
            if record.__class__ is not Transition or record.version != version or record.task_id != task_id:
                break
        else:
            if version == snapshot.status_version and transitions[-1].to_status is snapshot.status:
                return
    check_transitions(task_id, transitions)
    validate_checked_save(snapshot, expect_version, transitions)  # 记录刚查过：不再逐条查第二、三遍


def validate_lease(lease: float) -> None:
    if (
        isinstance(lease, bool)
        or not isinstance(lease, (int, float))
        or not math.isfinite(lease)
        or lease <= 0
    ):
        raise ConfigurationError(f"指令租约必须是正的秒数，收到 {lease!r}")
    if lease > MAX_LEASE_SECONDS:
        # 否则 now + lease 越过 datetime 的上限，在后端深处变成 OverflowError。
        raise ConfigurationError(f"指令租约过长（{lease!r} 秒）：上限是 {MAX_LEASE_SECONDS} 秒（10 年）")


def touch_args(
    task_id: object,
    progress: object,
    heartbeat_at: object,
    lease_owner: object,
    lease_until: object,
) -> None:
    """touch 的入参（None 表示不改）。每个运行中的任务每几秒 touch 一次：检查都是 O(1) 的类型判断。"""
    check_key("task_id", task_id)
    if progress is not None and not isinstance(progress, Progress):
        raise ConfigurationError(f"progress 必须是 Progress，收到 {type(progress).__name__}")
    check_aware("heartbeat_at", heartbeat_at)
    check_optional_text("lease_owner", lease_owner)
    check_aware("lease_until", lease_until)


def touch_many_fields(fields: object) -> dict[str, Any]:
    """touch_many 一项里的字段字典：只接受 ``TOUCH_FIELDS``。"""
    if not isinstance(fields, dict):
        raise ConfigurationError(f"touch_many 的每一项必须是 (task_id, dict)，收到 {fields!r}")
    unknown = set(fields) - TOUCH_FIELDS
    if unknown:
        raise ConfigurationError(f"touch_many 里有未知字段 {sorted(unknown)}：只接受 {sorted(TOUCH_FIELDS)}")
    return fields


def renew_args(lease_owner: object, task_ids: Iterable[Any], lease_until: object) -> frozenset[str]:
    """renew_leases 的入参：非空的持有者、带时区的到期时刻、task_id 的集合（规范化为 frozenset）。"""
    if not isinstance(lease_owner, str) or not lease_owner:
        raise ConfigurationError(f"lease_owner 必须是非空字符串，收到 {lease_owner!r}")
    check_optional_text("lease_owner", lease_owner)
    check_aware("lease_until", lease_until, required=True)
    ids = id_set("task_ids", task_ids, str)
    if ids is None:
        raise ConfigurationError("renew_leases 需要 task_ids（要续租的任务；不能是 None）")
    return ids


def id_set(name: str, values: Iterable[Any] | None, kind: type) -> frozenset[Any] | None:
    """task_ids / buckets 这类过滤集合：None 表示不限；单个值（而不是集合）是常见误用，明确拒绝。

    桶号还必须非负（与 ``TaskQuery.buckets`` 一致）：负的桶号不可能出现在任何任务上，多半是算错了。
    """
    if values is None:
        return None
    if isinstance(values, (str, int)):
        raise ConfigurationError(f"{name} 必须是集合（例如 [{values!r}]），不能是单个值")
    result = frozenset(values)
    if kind is str and set(map(type, result)) <= {str}:
        return result  # 最常见：指令轮询的上万个 task_id，省掉逐个的 isinstance 与分支
    for item in result:
        if isinstance(item, bool) or not isinstance(item, kind):
            raise ConfigurationError(f"{name} 里只能放 {kind.__name__}，收到 {item!r}")
        if kind is int:
            check_bucket(name, item)
    return result


def claim_args(
    claimant: object,
    lease: float,
    limit: object,
    task_ids: Iterable[Any] | None,
    buckets: Iterable[Any] | None,
) -> tuple[frozenset[str] | None, frozenset[int] | None]:
    """claim_commands 的入参：校验认领者、租约与 limit，返回规范化后的 (task_ids, buckets) 过滤集合。"""
    check_claimant(claimant)
    validate_lease(lease)
    check_count("limit", limit)
    return id_set("task_ids", task_ids, str), id_set("buckets", buckets, int)
