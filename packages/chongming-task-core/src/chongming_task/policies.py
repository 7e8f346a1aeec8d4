"""策略对象：重试、退避、超时、并发额度、管道结算、汇合方式、分桶。

每个策略在构造时校验参数，错误消息说明该怎么改。策略是不可变值对象，可以在线程、
进程之间共享。
"""

from __future__ import annotations

import enum
import hashlib
import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from chongming_task.core.numbers import MAX_SECONDS, check_int, check_number
from chongming_task.core.records import MAX_BUCKET_KEY_LENGTH, MAX_PRIORITY, MIN_PRIORITY, check_storable_text
from chongming_task.errors import ConfigurationError, TaskCancelled


def _require_number(
    owner: str, name: str, value: object, *, positive: bool, allow_none: bool = False, bounded: bool = True
) -> None:
    """策略里的秒数参数（经 core/numbers.py 这唯一的数值检查点）：有限，默认不超过 10 年。

    ``bounded=False`` 只给退避用：退避是纯值对象，算出的等待由运行时在使用处夹到 10 年以内，
    所以 ``max_delay=1e308`` 这类"几乎永远"的写法照样合法。
    """
    check_number(
        f"{owner}.{name}",
        value,
        low=0,
        low_open=positive,
        high=MAX_SECONDS if bounded else None,
        unit="秒",
        hint="不想限制请传 None" if allow_none else "",
        allow_none=allow_none,
    )


def _require_positive_int(owner: str, name: str, value: object) -> int:
    return check_int(f"{owner}.{name}", value, low=1)


class Jitter(enum.StrEnum):
    """退避抖动。FULL：在 [0, delay) 内均匀取值，避免整批任务在同一时刻集体重试。"""

    NONE = "none"
    FULL = "full"


@runtime_checkable
class Backoff(Protocol):
    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """第 ``attempt`` 次尝试失败后，下一次开始前要等的秒数（attempt 从 1 起）。"""
        ...


@dataclass(frozen=True)
class FixedBackoff:
    """固定间隔。测试里 ``FixedBackoff(0)`` 去掉重试等待。"""

    delay_seconds: float = 0.0

    def __init__(self, delay: float = 0.0) -> None:
        _require_number("FixedBackoff", "delay", delay, positive=False, bounded=False)
        object.__setattr__(self, "delay_seconds", float(delay))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        return self.delay_seconds


@dataclass(frozen=True)
class ExponentialBackoff:
    """指数退避：``min(max_delay, base * factor ** (attempt - 1))``，默认叠加 FULL 抖动。"""

    base: float = 1.0
    factor: float = 2.0
    max_delay: float = 300.0
    jitter: Jitter = Jitter.FULL

    def __post_init__(self) -> None:
        _require_number("ExponentialBackoff", "base", self.base, positive=True, bounded=False)
        _require_number("ExponentialBackoff", "max_delay", self.max_delay, positive=True, bounded=False)
        # factor < 1 会让等待越来越短；上限不必设（ceiling() 在指数大到必然封顶时不做乘方）。
        check_number("ExponentialBackoff.factor", self.factor, low=1, hint="小于 1 会让等待越来越短")
        jitter: object = self.jitter
        if not isinstance(jitter, Jitter):
            try:
                object.__setattr__(self, "jitter", Jitter(jitter))  # type: ignore[arg-type]
            except ValueError:
                raise ConfigurationError(
                    f"ExponentialBackoff.jitter 只能是 Jitter.NONE 或 Jitter.FULL，收到 {self.jitter!r}"
                ) from None

    def ceiling(self, attempt: int) -> float:
        """不含抖动的等待上限：``min(max_delay, base * factor ** (attempt - 1))``。"""
        exponent = max(0, attempt - 1)
        # 指数大到必然超过 max_delay 时直接封顶：factor ** exponent 会溢出（OverflowError）；
        # 与一个 float 阈值比较的是整数本身，所以 attempt 再大（10**400）也不会溢出。
        if self.factor == 1:
            return float(min(self.max_delay, self.base))
        if exponent > self._cap_exponent():
            return float(self.max_delay)
        try:
            return float(min(self.max_delay, self.base * self.factor**exponent))
        except OverflowError:  # 阈值附近的极端参数（factor 接近 float 上限）：同样是封顶
            return float(self.max_delay)

    def _cap_exponent(self) -> float:
        # base * factor**e >= max_delay  <=>  e >= log(max_delay / base) / log(factor)；+1 留出浮点余量。
        return max(0.0, math.log(self.max_delay / self.base) / math.log(self.factor)) + 1.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        ceiling = self.ceiling(attempt)
        if self.jitter is Jitter.NONE:
            return ceiling
        return (rng or random).random() * ceiling  # random() ∈ [0, 1)：结果 ∈ [0, ceiling)


def _exception_types(owner: str, name: str, value: object) -> tuple[type[BaseException], ...]:
    if isinstance(value, type):
        value = (value,)
    if not isinstance(value, (tuple, list, frozenset, set)):
        raise ConfigurationError(
            f"{owner}.{name} 必须是异常类型的元组，例如 (ValueError, KeyError)，收到 {value!r}"
        )
    for item in value:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise ConfigurationError(f"{owner}.{name} 里只能放异常类型，收到 {item!r}")
    return tuple(value)


@dataclass(frozen=True)
class RetryPolicy:
    """重试策略。max_attempts 是总尝试次数（含首次），1 表示不重试。"""

    max_attempts: int = 1
    backoff: Backoff = field(default_factory=ExponentialBackoff)
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    give_up_on: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        _require_positive_int("RetryPolicy", "max_attempts", self.max_attempts)
        if not isinstance(self.backoff, Backoff):
            raise ConfigurationError(
                "RetryPolicy.backoff 必须是 FixedBackoff(...) 或 ExponentialBackoff(...)，"
                f"收到 {self.backoff!r}"
            )
        object.__setattr__(self, "retry_on", _exception_types("RetryPolicy", "retry_on", self.retry_on))
        object.__setattr__(self, "give_up_on", _exception_types("RetryPolicy", "give_up_on", self.give_up_on))

    def is_retryable(self, exc: BaseException) -> bool:
        """这个异常本身是否值得重试（不看次数）。取消永不重试；give_up_on 优先于 retry_on。

        ConfigurationError（例如没配产物目录就读 ``ctx.artifact_dir``）默认不重试：配置不会在两次尝试
        之间自己变好，重试只会把同一个错误再报几遍、白等几轮退避。只有 retry_on 里**点名**了
        ConfigurationError（或它的子类）时才照办——宽泛的 ``(Exception,)`` / ``(ValueError,)`` 不算。
        """
        if isinstance(exc, TaskCancelled):
            return False
        if self.give_up_on and isinstance(exc, self.give_up_on):
            return False
        if isinstance(exc, ConfigurationError):
            return any(issubclass(kind, ConfigurationError) for kind in self.retry_on) and isinstance(
                exc, self.retry_on
            )
        return isinstance(exc, self.retry_on)

    def should_retry(self, exc: BaseException, attempt: int) -> bool:
        """第 ``attempt`` 次尝试因 ``exc`` 失败后，是否再试一次。"""
        return attempt < self.max_attempts and self.is_retryable(exc)

    def delay_for(self, attempt: int, rng: random.Random | None = None) -> float:
        return self.backoff.delay(attempt, rng)


NO_RETRY = RetryPolicy(max_attempts=1, backoff=FixedBackoff(0))


@dataclass(frozen=True)
class Timeout:
    """三档相互独立的超时（秒），取最早到期者；None 表示不限。

    start：从提交到真正开始执行；per_attempt：单次尝试总时长；idle：距最近一次 checkpoint 的静默时长。
    """

    start: float | None = None
    per_attempt: float | None = None
    idle: float | None = None

    def __post_init__(self) -> None:
        for name in ("start", "per_attempt", "idle"):
            _require_number("Timeout", name, getattr(self, name), positive=True, allow_none=True)

    @property
    def is_unlimited(self) -> bool:
        return self.start is None and self.per_attempt is None and self.idle is None


NO_TIMEOUT = Timeout()


@dataclass(frozen=True)
class ConcurrencyPolicy:
    """并发额度：全局槽位、按标签的具名资源额度、默认优先级。

    只有写进 limits 的标签受限；一个任务带多个受限标签时每个资源都要有余量；名额按占槽的
    任务计（含暂停的：暂停不释放执行槽，也就不释放资源名额）。
    """

    max_parallel: int | None = None
    limits: Mapping[str, int] = field(default_factory=dict)
    priority: int = 0

    def __post_init__(self) -> None:
        if self.max_parallel is not None:
            _require_positive_int("ConcurrencyPolicy", "max_parallel", self.max_parallel)
        if not isinstance(self.limits, Mapping):
            raise ConfigurationError(
                f"ConcurrencyPolicy.limits 必须是 {{标签: 名额}} 字典，收到 {self.limits!r}"
            )
        for tag, amount in self.limits.items():
            key: object = tag
            if not isinstance(key, str) or not key:
                raise ConfigurationError(f"ConcurrencyPolicy.limits 的键必须是非空字符串标签，收到 {tag!r}")
            _require_positive_int("ConcurrencyPolicy", f"limits[{tag!r}]", amount)
        object.__setattr__(self, "limits", MappingProxyType(dict(self.limits)))
        check_int("ConcurrencyPolicy.priority", self.priority, low=MIN_PRIORITY, high=MAX_PRIORITY)

    def __hash__(self) -> int:
        return hash((self.max_parallel, tuple(sorted(self.limits.items())), self.priority))


class AggregationMode(enum.StrEnum):
    FAIL_FAST = "fail_fast"
    ALL_SETTLED = "all_settled"


@dataclass(frozen=True)
class AggregationPolicy:
    """整条管道的结算方式。只有 fail_fast() 与 all_settled() 两种。"""

    mode: AggregationMode = AggregationMode.FAIL_FAST

    def __post_init__(self) -> None:
        mode: object = self.mode
        if isinstance(mode, AggregationMode):
            return
        if isinstance(mode, str) and mode.strip().lower() == "quorum":
            AggregationPolicy.quorum()
        try:
            object.__setattr__(self, "mode", AggregationMode(mode))  # type: ignore[arg-type]
        except ValueError:
            raise ConfigurationError(
                f"未知的结算方式 {mode!r}："
                "请用 AggregationPolicy.fail_fast() 或 AggregationPolicy.all_settled()"
            ) from None

    @classmethod
    def fail_fast(cls) -> AggregationPolicy:
        """首个真失败即取消其余已放行的节点（CANCELLED 本身不触发连坐）。"""
        return cls(AggregationMode.FAIL_FAST)

    @classmethod
    def all_settled(cls) -> AggregationPolicy:
        """等所有节点落终态，再统一判定。"""
        return cls(AggregationMode.ALL_SETTLED)

    @classmethod
    def quorum(cls, *args: object, **kwargs: object) -> AggregationPolicy:
        raise ConfigurationError(
            "不支持 quorum：它描述的是同一件事的 N 份副本成功 k 份，属于扇出分组，而不是节点各异的 DAG。"
            "请改用 AggregationPolicy.all_settled()，在下游节点里按上游结果自行计数。"
        )

    @property
    def is_fail_fast(self) -> bool:
        return self.mode is AggregationMode.FAIL_FAST


class JoinMode(enum.StrEnum):
    """节点的汇合语义：何时放行。"""

    ALL_SUCCEEDED = "all_succeeded"
    ALL_SETTLED = "all_settled"
    ANY_SUCCEEDED = "any_succeeded"


DEFAULT_NUM_BUCKETS = 64


@dataclass(frozen=True)
class BucketPolicy:
    """分桶：``bucket = blake2b(key) % num_buckets``。

    绝不用内置 hash()：CPython 对 str 的 hash 带进程级随机盐，同一个键在不同进程里会落到
    不同的桶。blake2b 在任何进程、任何机器上结果都一样。
    """

    num_buckets: int = DEFAULT_NUM_BUCKETS

    def __post_init__(self) -> None:
        _require_positive_int("BucketPolicy", "num_buckets", self.num_buckets)

    def bucket_for(self, key: str) -> int:
        """同一个 key 在任何进程、任何机器上都得到同一个桶号（blake2b，与 PYTHONHASHSEED 无关）。"""
        checked: object = key
        if not isinstance(checked, str) or not checked:
            raise ConfigurationError(
                f"bucket_key 必须是非空字符串（租户 id、数据源、日期分区……），收到 {key!r}"
            )
        # 与快照的 bucket_key 同一份规则（长度、NUL、孤立代理项）：否则孤立代理项在下面的 encode 里变成
        # 裸的 UnicodeEncodeError，或者算出了桶号、却永远写不进存储（issue 22.5 / 22.7）。
        check_storable_text("bucket_key", key, limit=MAX_BUCKET_KEY_LENGTH, optional=False)
        digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.num_buckets

    def validate_buckets(self, buckets: Iterable[int]) -> frozenset[int]:
        """校验桶号都在 [0, num_buckets) 内；越界立刻报错（放过去的症状是任务永远排队）。"""
        checked: object = buckets
        if isinstance(checked, (str, bytes)) or not isinstance(checked, Iterable):
            raise ConfigurationError(
                f"桶号必须以集合给出（例如 range(0, 16) 或 [0, 1, 2]），收到 {buckets!r}"
            )
        result: set[int] = set()
        for bucket in buckets:
            if isinstance(bucket, bool) or not isinstance(bucket, int):
                raise ConfigurationError(f"桶号必须是整数，收到 {bucket!r}")
            if not 0 <= bucket < self.num_buckets:
                raise ConfigurationError(
                    f"桶号 {bucket} 越界：桶数为 {self.num_buckets}，合法范围是 0..{self.num_buckets - 1}"
                )
            result.add(bucket)
        return frozenset(result)


__all__ = [
    "NO_RETRY",
    "NO_TIMEOUT",
    "AggregationMode",
    "AggregationPolicy",
    "Backoff",
    "BucketPolicy",
    "ConcurrencyPolicy",
    "ExponentialBackoff",
    "FixedBackoff",
    "Jitter",
    "JoinMode",
    "RetryPolicy",
    "Timeout",
]
