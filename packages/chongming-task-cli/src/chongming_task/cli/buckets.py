"""``--owned-buckets`` 的写法：``0-15``、``0-3,8,10-12``。

解析与 ``--num-buckets`` 的校验分两步：解析只看语法（不依赖别的选项），校验在全局选项都到齐之后
做——两个选项可能分别来自命令行与环境变量，谁先被 click 处理并不确定。
"""

from __future__ import annotations

from collections.abc import Iterable

from chongming_task.cli.errors import CliError

# 命令行接受的桶数上限。桶号要展开成集合、发布进节点登记、在 buckets --all 里逐行列出：
# 不设上限，"--owned-buckets 0-100000000000" 在报任何错之前就吃掉 4 GB 内存（issue 22.9）。
MAX_NUM_BUCKETS = 65536


def parse_bucket_ranges(spec: str) -> list[tuple[int, int]]:
    """``"0-3,8,10-12"`` → [(0, 3), (8, 8), (10, 12)]：只看语法，不展开区间（展开之前要先查范围）。"""
    text = spec.strip()
    if not text:
        raise CliError("--owned-buckets 不能为空：写成 0-15 或 0-3,8,10-12；不想限定就不要给这个选项")
    ranges: list[tuple[int, int]] = []
    for raw in text.split(","):
        part = raw.strip()
        low_text, dash, high_text = part.partition("-")
        try:
            low = _bucket_number(low_text)
            high = _bucket_number(high_text) if dash else low
        except ValueError:
            raise CliError(
                f"--owned-buckets {_short(spec)!r} 写法不对：{_short(part)!r} 不是桶号或区间；"
                "请写成 0-15 或 0-3,8,10-12（桶号是非负整数）"
            ) from None
        if high < low:
            raise CliError(f"--owned-buckets {_short(spec)!r} 里的区间 {part!r} 反了：请写成 {high}-{low}")
        ranges.append((low, high))
    return ranges


def parse_bucket_spec(spec: str, num_buckets: int = MAX_NUM_BUCKETS) -> frozenset[int]:
    """``"0-3,8,10-12"`` → {0, 1, 2, 3, 8, 10, 11, 12}。语法不对、桶号不在 [0, num_buckets) 内时给出
    一句中文说明——范围先按区间端点检查，再展开，所以展开出来的集合不会大于 num_buckets。"""
    ranges = parse_bucket_ranges(spec)
    _check_ranges(ranges, spec, num_buckets)
    result: set[int] = set()
    for low, high in ranges:
        result.update(range(low, high + 1))
    return frozenset(result)


def owned_buckets(spec: str, num_buckets: int) -> frozenset[int]:
    """--owned-buckets 的完整处理：语法 → 按 --num-buckets 查范围 → 展开。"""
    return parse_bucket_spec(spec, num_buckets)


def _check_ranges(ranges: list[tuple[int, int]], spec: str, num_buckets: int) -> None:
    outside = [(max(low, num_buckets), high) for low, high in ranges if high >= num_buckets]
    if not outside:
        return
    shown = ",".join(str(low) if low == high else f"{low}-{high}" for low, high in _merge(outside))
    if len(shown) > 60:
        shown = shown[:57] + "…"
    raise CliError(
        f"--owned-buckets {_short(spec)} 越界：桶号 {shown} 超出 "
        f"--num-buckets {num_buckets} 的范围 0-{num_buckets - 1}；"
        "请改小桶号，或确认 --num-buckets 与其他节点一致"
    )


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


def _short(spec: str) -> str:
    return spec if len(spec) <= 60 else spec[:57] + "…"


def _bucket_number(text: str) -> int:
    stripped = text.strip()
    # 拒绝 "+3"、"-1"、"1e2"、全角数字这类 int() 能接受或半接受的写法；超过 18 位的数字不必转换
    # （int() 对上千位的数字很慢，也有位数上限），反正它一定越界。
    if not stripped.isascii() or not stripped.isdigit():
        raise ValueError(text)
    return int(stripped) if len(stripped) <= 18 else 10**18


def check_buckets(buckets: frozenset[int], spec: str, num_buckets: int) -> frozenset[int]:
    """桶号必须落在 [0, num_buckets) 内：越界的归属永远认领不到任务，放过去只会让任务静默排队。"""
    outside = sorted(b for b in buckets if b >= num_buckets)
    if outside:
        raise CliError(
            f"--owned-buckets {spec} 越界：桶号 {format_bucket_spec(outside)} 超出 "
            f"--num-buckets {num_buckets} 的范围 0-{num_buckets - 1}；"
            "请改小桶号，或确认 --num-buckets 与其他节点一致"
        )
    return buckets


def format_bucket_spec(buckets: Iterable[int]) -> str:
    """{0,1,2,3,8} → ``0-3,8``：报错与输出里用和输入相同的写法。"""
    ordered = sorted(set(buckets))
    parts: list[str] = []
    index = 0
    while index < len(ordered):
        start = end = ordered[index]
        while index + 1 < len(ordered) and ordered[index + 1] == end + 1:
            index += 1
            end = ordered[index]
        parts.append(str(start) if start == end else f"{start}-{end}")
        index += 1
    return ",".join(parts)


__all__ = [
    "MAX_NUM_BUCKETS",
    "check_buckets",
    "format_bucket_spec",
    "owned_buckets",
    "parse_bucket_ranges",
    "parse_bucket_spec",
]
