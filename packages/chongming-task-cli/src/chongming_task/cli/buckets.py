"""``--owned-buckets`` 的写法：``0-15``、``0-3,8,10-12``。

解析与 ``--num-buckets`` 的校验分两步：解析只看语法（不依赖别的选项），校验在全局选项都到齐之后
做——两个选项可能分别来自命令行与环境变量，谁先被 click 处理并不确定。
"""

from __future__ import annotations

from collections.abc import Iterable

from chongming_task.cli.errors import CliError


def parse_bucket_spec(spec: str) -> frozenset[int]:
    """``"0-3,8,10-12"`` → {0, 1, 2, 3, 8, 10, 11, 12}。语法不对时给出一句中文说明。"""
    text = spec.strip()
    if not text:
        raise CliError("--owned-buckets 不能为空：写成 0-15 或 0-3,8,10-12；不想限定就不要给这个选项")
    result: set[int] = set()
    for raw in text.split(","):
        part = raw.strip()
        low_text, dash, high_text = part.partition("-")
        try:
            low = _bucket_number(low_text)
            high = _bucket_number(high_text) if dash else low
        except ValueError:
            raise CliError(
                f"--owned-buckets {spec!r} 写法不对：{part!r} 不是桶号或区间；"
                "请写成 0-15 或 0-3,8,10-12（桶号是非负整数）"
            ) from None
        if high < low:
            raise CliError(f"--owned-buckets {spec!r} 里的区间 {part!r} 反了：请写成 {high}-{low}")
        result.update(range(low, high + 1))
    return frozenset(result)


def _bucket_number(text: str) -> int:
    stripped = text.strip()
    if not stripped.isdigit():  # 拒绝 "+3"、"-1"、"1e2" 这类 int() 能接受或半接受的写法
        raise ValueError(text)
    return int(stripped)


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


__all__ = ["check_buckets", "format_bucket_spec", "parse_bucket_spec"]
