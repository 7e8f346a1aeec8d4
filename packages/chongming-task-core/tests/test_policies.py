"""策略对象：重试判定、退避序列与抖动、超时、并发额度、结算方式、汇合方式、分桶。"""

from __future__ import annotations

import os
import pathlib
import random
import subprocess
import sys
from typing import Any

import pytest

from chongming_task.errors import (
    ConfigurationError,
    TaskCancelled,
    TaskError,
    TaskExecutionError,
)
from chongming_task.policies import (
    NO_RETRY,
    NO_TIMEOUT,
    AggregationMode,
    AggregationPolicy,
    Backoff,
    BucketPolicy,
    ConcurrencyPolicy,
    ExponentialBackoff,
    FixedBackoff,
    Jitter,
    JoinMode,
    RetryPolicy,
    Timeout,
)

CORE_SRC = pathlib.Path(__file__).resolve().parents[1] / "src"


# -- RetryPolicy ---------------------------------------------------------------------------------------


def test_retry_policy_defaults() -> None:
    policy = RetryPolicy()
    assert policy.max_attempts == 1
    assert policy.retry_on == (Exception,)
    assert policy.give_up_on == ()
    assert isinstance(policy.backoff, ExponentialBackoff)
    assert policy.backoff.jitter is Jitter.FULL
    assert not policy.should_retry(RuntimeError("x"), attempt=1)  # 1 表示不重试


def test_guide_example_decisions() -> None:
    policy = RetryPolicy(
        max_attempts=5,
        backoff=ExponentialBackoff(base=1, factor=2, max_delay=300),
        retry_on=(Exception,),
        give_up_on=(ValueError, KeyError),
    )
    assert policy.should_retry(RuntimeError("网络抖动"), attempt=1)
    assert policy.should_retry(ConnectionError("断了"), attempt=4)
    assert not policy.should_retry(RuntimeError("网络抖动"), attempt=5)  # 预算用完
    assert not policy.should_retry(ValueError("坏数据"), attempt=1)
    assert not policy.should_retry(KeyError("缺列"), attempt=1)
    assert not policy.should_retry(
        UnicodeDecodeError("utf-8", b"\xff", 0, 1, "x"), attempt=1
    )  # ValueError 子类


def test_give_up_on_wins_over_retry_on() -> None:
    policy = RetryPolicy(max_attempts=3, retry_on=(ValueError,), give_up_on=(ValueError,))
    assert not policy.is_retryable(ValueError("x"))
    narrower = RetryPolicy(max_attempts=3, retry_on=(LookupError,), give_up_on=(KeyError,))
    assert narrower.is_retryable(IndexError("x"))
    assert not narrower.is_retryable(KeyError("x"))


def test_retry_on_limits_what_is_retried() -> None:
    policy = RetryPolicy(max_attempts=3, retry_on=(TimeoutError,))
    assert policy.should_retry(TimeoutError(), attempt=1)
    assert not policy.should_retry(RuntimeError(), attempt=1)
    single = RetryPolicy(max_attempts=3, retry_on=OSError)  # type: ignore[arg-type]
    assert single.retry_on == (OSError,)


@pytest.mark.parametrize(
    "policy",
    [
        RetryPolicy(max_attempts=10),
        RetryPolicy(max_attempts=10, retry_on=(BaseException,)),
        RetryPolicy(max_attempts=10, retry_on=(TaskCancelled,)),
    ],
)
def test_task_cancelled_is_never_retried(policy: RetryPolicy) -> None:
    assert not policy.is_retryable(TaskCancelled("停"))
    assert not policy.should_retry(TaskCancelled("停"), attempt=1)


def test_base_exceptions_are_not_retried_by_default() -> None:
    policy = RetryPolicy(max_attempts=3)
    assert not policy.is_retryable(KeyboardInterrupt())
    assert policy.is_retryable(TaskExecutionError("x"))
    assert policy.is_retryable(TaskError("x"))


def test_attempt_budget() -> None:
    policy = RetryPolicy(max_attempts=3, backoff=FixedBackoff(0))
    assert [policy.should_retry(RuntimeError(), attempt=n) for n in (1, 2, 3, 4)] == [
        True,
        True,
        False,
        False,
    ]
    assert not NO_RETRY.should_retry(RuntimeError(), attempt=1)


def test_delay_for_delegates_to_backoff() -> None:
    policy = RetryPolicy(max_attempts=3, backoff=ExponentialBackoff(base=2, factor=3, jitter=Jitter.NONE))
    assert [policy.delay_for(n) for n in (1, 2, 3)] == [2, 6, 18]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": -1}, "max_attempts"),
        ({"max_attempts": 1.5}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"backoff": 5}, "backoff"),
        ({"retry_on": "ValueError"}, "retry_on"),
        ({"retry_on": (ValueError, "x")}, "retry_on"),
        ({"give_up_on": (int,)}, "give_up_on"),
    ],
)
def test_retry_policy_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        RetryPolicy(**kwargs)


# -- backoff -------------------------------------------------------------------------------------------


def test_fixed_backoff() -> None:
    backoff = FixedBackoff(2.5)
    assert [backoff.delay(n) for n in (1, 2, 50, 10**9)] == [2.5] * 4
    assert FixedBackoff(0).delay(1) == 0
    assert FixedBackoff(delay=3).delay_seconds == 3.0
    assert isinstance(backoff, Backoff)


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "1", None, True])
def test_fixed_backoff_validation(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"FixedBackoff\.delay"):
        FixedBackoff(bad)


def test_exponential_backoff_without_jitter_is_exact_and_capped() -> None:
    backoff = ExponentialBackoff(base=1, factor=2, max_delay=300, jitter=Jitter.NONE)
    assert [backoff.delay(n) for n in range(1, 12)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    assert backoff.delay(0) == 1  # attempt 从 1 起；更小的值按第一次算
    other = ExponentialBackoff(base=0.5, factor=3, max_delay=10, jitter=Jitter.NONE)
    assert [other.delay(n) for n in range(1, 6)] == [0.5, 1.5, 4.5, 10, 10]
    flat = ExponentialBackoff(base=7, factor=1, max_delay=5, jitter=Jitter.NONE)
    assert [flat.delay(n) for n in (1, 2, 10**400)] == [5, 5, 5]


@pytest.mark.parametrize("attempt", [1025, 10**6, 10**18, 10**400])
def test_huge_attempt_numbers_do_not_overflow(attempt: int) -> None:
    # 2 ** 1024 已经超出 float：不封顶的实现在这里就会 OverflowError。
    factors = (2, 10, 1e300) if attempt < 10**6 else (1.0001, 2, 10, 1e300)
    for factor in factors:
        backoff = ExponentialBackoff(base=1, factor=factor, max_delay=300, jitter=Jitter.NONE)
        assert backoff.delay(attempt) == 300
        assert 0 <= ExponentialBackoff(base=1, factor=factor, max_delay=300).delay(attempt) < 300


def test_extreme_parameters_near_float_limits() -> None:
    backoff = ExponentialBackoff(base=1, factor=1e308, max_delay=1e308, jitter=Jitter.NONE)
    assert [backoff.delay(n) for n in (1, 2, 3)] == [1, 1e308, 1e308]
    assert ExponentialBackoff(base=500, factor=2, max_delay=300, jitter=Jitter.NONE).delay(1) == 300


def test_full_jitter_stays_in_zero_to_delay() -> None:
    backoff = ExponentialBackoff(base=1, factor=2, max_delay=60)
    assert backoff.jitter is Jitter.FULL
    rng = random.Random(20261002)
    for attempt in range(1, 12):
        ceiling = backoff.ceiling(attempt)
        samples = [backoff.delay(attempt, rng) for _ in range(2000)]
        assert all(0 <= s < ceiling for s in samples)
        # 真的是在整个区间里均匀取值，而不是贴着某一端：
        assert min(samples) < ceiling * 0.05
        assert max(samples) > ceiling * 0.95
        assert 0.45 * ceiling < sum(samples) / len(samples) < 0.55 * ceiling


def test_full_jitter_is_reproducible_with_a_seeded_rng() -> None:
    backoff = ExponentialBackoff()
    first = [backoff.delay(n, random.Random(7)) for n in range(1, 6)]
    second = [backoff.delay(n, random.Random(7)) for n in range(1, 6)]
    assert first == second
    assert 0 <= backoff.delay(3) < 4  # 不给 rng 用模块级的 random


def test_jitter_accepts_values() -> None:
    assert ExponentialBackoff(jitter="none").jitter is Jitter.NONE  # type: ignore[arg-type]
    assert [j.value for j in Jitter] == ["none", "full"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base": 0}, "base"),
        ({"base": -1}, "base"),
        ({"base": float("nan")}, "base"),
        ({"max_delay": 0}, "max_delay"),
        ({"max_delay": float("inf")}, "max_delay"),
        ({"factor": 0.5}, "factor"),
        ({"factor": 0}, "factor"),
        ({"jitter": "half"}, "jitter"),
        ({"base": "1"}, "base"),
    ],
)
def test_exponential_backoff_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ExponentialBackoff(**kwargs)


# -- Timeout -------------------------------------------------------------------------------------------


def test_timeout_values() -> None:
    timeout = Timeout(start=30, per_attempt=600, idle=60)
    assert (timeout.start, timeout.per_attempt, timeout.idle) == (30, 600, 60)
    assert not timeout.is_unlimited
    assert Timeout().is_unlimited and NO_TIMEOUT.is_unlimited
    assert Timeout(idle=0.5).idle == 0.5


@pytest.mark.parametrize("field", ["start", "per_attempt", "idle"])
@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "30", True])
def test_timeout_must_be_positive_or_none(field: str, bad: Any) -> None:
    with pytest.raises(ConfigurationError, match=rf"Timeout\.{field}"):
        Timeout(**{field: bad})


def test_timeout_message_is_chinese_and_says_what_to_do() -> None:
    with pytest.raises(ConfigurationError) as info:
        Timeout(idle=0)
    assert "必须大于 0" in str(info.value) and "None" in str(info.value)


# -- ConcurrencyPolicy ---------------------------------------------------------------------------------


def test_concurrency_policy() -> None:
    policy = ConcurrencyPolicy(max_parallel=20, limits={"db": 4, "gpu": 1}, priority=3)
    assert policy.max_parallel == 20
    assert dict(policy.limits) == {"db": 4, "gpu": 1}
    assert policy.priority == 3
    with pytest.raises(TypeError):
        policy.limits["db"] = 5  # type: ignore[index]
    assert policy == ConcurrencyPolicy(max_parallel=20, limits={"gpu": 1, "db": 4}, priority=3)
    assert hash(policy) == hash(ConcurrencyPolicy(max_parallel=20, limits={"gpu": 1, "db": 4}, priority=3))
    assert ConcurrencyPolicy().max_parallel is None


def test_concurrency_policy_copies_limits() -> None:
    limits = {"db": 4}
    policy = ConcurrencyPolicy(limits=limits)
    limits["db"] = 100
    assert policy.limits["db"] == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_parallel": 0}, "max_parallel"),
        ({"max_parallel": 2.0}, "max_parallel"),
        ({"limits": [("db", 4)]}, "limits"),
        ({"limits": {"db": 0}}, "limits"),
        ({"limits": {"": 1}}, "limits"),
        ({"limits": {3: 1}}, "limits"),
        ({"priority": "high"}, "priority"),
        ({"priority": 1.5}, "priority"),
    ],
)
def test_concurrency_policy_validation(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        ConcurrencyPolicy(**kwargs)


# -- AggregationPolicy / JoinMode ----------------------------------------------------------------------


def test_aggregation_policies() -> None:
    assert AggregationPolicy.fail_fast().is_fail_fast
    assert AggregationPolicy.fail_fast().mode is AggregationMode.FAIL_FAST
    assert not AggregationPolicy.all_settled().is_fail_fast
    assert AggregationPolicy.all_settled() == AggregationPolicy.all_settled()
    assert AggregationPolicy() == AggregationPolicy.fail_fast()  # 默认 fail_fast


@pytest.mark.parametrize("call", [lambda: AggregationPolicy.quorum(2), lambda: AggregationPolicy.quorum()])
def test_quorum_is_refused_with_an_explanation(call: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        call()
    message = str(info.value)
    assert "quorum" in message
    assert "扇出" in message and "DAG" in message  # 说明为什么
    assert "all_settled()" in message  # 告诉你改用什么


def test_aggregation_mode_values_are_validated() -> None:
    assert AggregationPolicy("all_settled").mode is AggregationMode.ALL_SETTLED  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="quorum"):
        AggregationPolicy("quorum")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="fail_fast"):
        AggregationPolicy("majority")  # type: ignore[arg-type]


def test_join_mode_members() -> None:
    assert [m.name for m in JoinMode] == ["ALL_SUCCEEDED", "ALL_SETTLED", "ANY_SUCCEEDED"]
    assert JoinMode("any_succeeded") is JoinMode.ANY_SUCCEEDED


# -- BucketPolicy --------------------------------------------------------------------------------------

KEYS = ["tenant-A", "tenant-B", "orders", "租户A", "2026-10-02", "x" * 300, "🙂"]


def test_bucket_for_is_stable_and_in_range() -> None:
    policy = BucketPolicy(num_buckets=64)
    for key in KEYS:
        bucket = policy.bucket_for(key)
        assert 0 <= bucket < 64
        assert policy.bucket_for(key) == bucket
        assert BucketPolicy(64).bucket_for(key) == bucket
    assert BucketPolicy().num_buckets == 64
    assert BucketPolicy(1).bucket_for("anything") == 0


def test_bucket_for_pinned_values() -> None:
    # 钉死几组取值：实现一旦改了（换哈希、换字节序、换 digest 长度），已落库的任务会全部换桶。
    import hashlib

    for key in KEYS:
        digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
        assert BucketPolicy(64).bucket_for(key) == int.from_bytes(digest, "big") % 64
        assert BucketPolicy(7).bucket_for(key) == int.from_bytes(digest, "big") % 7


def test_bucket_for_spreads_keys() -> None:
    policy = BucketPolicy(16)
    buckets = {policy.bucket_for(f"tenant-{index}") for index in range(400)}
    assert len(buckets) == 16


_PROBE = (
    "import json, sys\n"
    "from chongming_task.policies import BucketPolicy\n"
    "keys = json.loads(sys.argv[1])\n"
    "print(json.dumps({'buckets': [BucketPolicy(64).bucket_for(k) for k in keys],"
    " 'hashes': [hash(k) for k in keys]}))\n"
)


def _probe_in_subprocess(seed: str) -> dict[str, list[int]]:
    import json

    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(CORE_SRC)}
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(KEYS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_bucket_for_is_equal_across_processes_with_different_hash_seeds() -> None:
    first = _probe_in_subprocess("1")
    second = _probe_in_subprocess("2")
    # 前提成立：内置 hash() 在两个进程里确实不同（否则这条用例什么也证明不了）。
    assert first["hashes"] != second["hashes"]
    assert first["buckets"] == second["buckets"]
    assert first["buckets"] == [BucketPolicy(64).bucket_for(k) for k in KEYS]


@pytest.mark.parametrize("bad", [0, -3, 2.0, "64", True, None])
def test_bucket_policy_validation(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="num_buckets"):
        BucketPolicy(bad)


@pytest.mark.parametrize("bad", ["", None, 42, b"tenant"])
def test_bucket_for_refuses_bad_keys(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="bucket_key"):
        BucketPolicy(8).bucket_for(bad)


def test_validate_buckets() -> None:
    policy = BucketPolicy(16)
    assert policy.validate_buckets(range(16)) == frozenset(range(16))
    assert policy.validate_buckets([3, 3, 5]) == frozenset({3, 5})
    assert policy.validate_buckets([]) == frozenset()


@pytest.mark.parametrize(
    ("buckets", "message"), [([16], "越界"), ([-1], "越界"), ([1, 99], "0..15"), (["3"], "整数")]
)
def test_validate_buckets_range_errors(buckets: list[Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        BucketPolicy(16).validate_buckets(buckets)


def test_policies_are_immutable() -> None:
    for policy in (
        RetryPolicy(),
        FixedBackoff(1),
        ExponentialBackoff(),
        Timeout(idle=5),
        ConcurrencyPolicy(),
        AggregationPolicy.fail_fast(),
        BucketPolicy(8),
    ):
        with pytest.raises(AttributeError):
            policy.anything = 1  # type: ignore[attr-defined]


_BAD_CONSTRUCTIONS: list[tuple[str, Any]] = [
    ("RetryPolicy", lambda: RetryPolicy(max_attempts=0)),
    ("FixedBackoff", lambda: FixedBackoff(-1)),
    ("ExponentialBackoff", lambda: ExponentialBackoff(factor=0.5)),
    ("Timeout", lambda: Timeout(per_attempt=-5)),
    ("ConcurrencyPolicy", lambda: ConcurrencyPolicy(limits={"db": 0})),
    ("AggregationPolicy", lambda: AggregationPolicy.quorum(2)),
    ("BucketPolicy", lambda: BucketPolicy(0)),
    ("BucketPolicy.validate_buckets", lambda: BucketPolicy(4).validate_buckets([4])),
]


@pytest.mark.parametrize(("owner", "build"), _BAD_CONSTRUCTIONS, ids=[o for o, _ in _BAD_CONSTRUCTIONS])
def test_every_policy_explains_bad_input_in_chinese(owner: str, build: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        build()
    message = str(info.value)
    assert any("\u4e00" <= ch <= "\u9fff" for ch in message), message
    assert len(message) > 10


def test_configuration_error_is_never_retried_unless_named() -> None:
    """配置错误不会在两次尝试之间自己变好（issue 16.9）；只有 retry_on 点名它时才重试。"""
    from chongming_task.errors import ConfigurationError, DuplicateTaskId

    default = RetryPolicy(max_attempts=3)
    assert not default.is_retryable(ConfigurationError("没有配置产物目录"))
    assert not default.should_retry(DuplicateTaskId("x"), attempt=1)
    assert not RetryPolicy(max_attempts=3, retry_on=(ValueError,)).is_retryable(ConfigurationError("x"))
    assert default.is_retryable(ValueError("普通的值错误照旧重试"))
    named = RetryPolicy(max_attempts=3, retry_on=(ConfigurationError,))
    assert named.is_retryable(ConfigurationError("x"))
    assert not named.is_retryable(ValueError("x"))
