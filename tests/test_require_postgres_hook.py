"""根目录 conftest.py 的"CI 上 Postgres 测试不许跳过"规则确实生效。

做法：把仓库根目录的 conftest.py 原样复制进 pytester 的临时目录，在子进程里跑几个小测试文件，
分别在设置 / 不设置 CHONGMING_REQUIRE_POSTGRES 时比对结果。用子进程是为了让环境变量与
conftest 模块都和外层这次 pytest 会话完全隔离。
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

SAMPLE_TESTS = """
import unittest

import pytest


def test_uses_dsn_fixture(postgres_dsn):
    assert postgres_dsn.startswith("postgresql://")


@pytest.mark.postgres
def test_marked_with_unrelated_reason():
    pytest.skip("no database here")


class TestContractStyle(unittest.TestCase):
    def test_unittest_skip_mentions_variable(self):
        raise unittest.SkipTest("CHONGMING_TEST_POSTGRES not set")


def test_unrelated_skip_stays_skipped():
    pytest.skip("only on windows")


@pytest.mark.postgres
@pytest.mark.xfail(reason="known bug", strict=True)
def test_xfail_is_not_a_skip():
    raise AssertionError("boom")


def test_plain_pass():
    pass
"""


@pytest.fixture
def sample(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makeconftest(ROOT_CONFTEST.read_text(encoding="utf-8"))
    pytester.makeini("[pytest]\nmarkers =\n    postgres: needs PostgreSQL\n")
    pytester.makepyfile(test_sample=SAMPLE_TESTS)
    for name in ("CHONGMING_TEST_POSTGRES", "CHONGMING_REQUIRE_POSTGRES", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    return pytester


def test_without_require_postgres_tests_skip(sample: pytest.Pytester) -> None:
    result = sample.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=1, skipped=4, xfailed=1)
    result.stdout.fnmatch_lines(["*CHONGMING_TEST_POSTGRES*"])


def test_with_require_postgres_skips_become_failures(
    sample: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHONGMING_REQUIRE_POSTGRES", "1")
    result = sample.runpytest_subprocess("-p", "no:cacheprovider", "-rfEs")
    # 三个 Postgres 跳过（夹具、标记、unittest 的 SkipTest）都变红；无关的跳过与 xfail 不受影响。
    # 夹具里的跳过发生在 setup 阶段，pytest 把 setup 失败记作 error，其余两个记作 failed。
    result.assert_outcomes(passed=1, failed=2, errors=1, skipped=1, xfailed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    for pattern in (
        "ERROR*test_uses_dsn_fixture*",
        "FAILED*test_marked_with_unrelated_reason*",
        "FAILED*test_unittest_skip_mentions_variable*",
    ):
        result.stdout.fnmatch_lines([pattern])
    assert "CHONGMING_REQUIRE_POSTGRES=1" in result.stdout.str()


def test_require_postgres_zero_means_off(sample: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHONGMING_REQUIRE_POSTGRES", "0")
    result = sample.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=4, xfailed=1)


def test_dsn_fixture_returns_the_variable(sample: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHONGMING_REQUIRE_POSTGRES", "1")
    monkeypatch.setenv("CHONGMING_TEST_POSTGRES", "postgresql://nobody@127.0.0.1:1/none")
    result = sample.runpytest_subprocess("-p", "no:cacheprovider", "-k", "dsn_fixture")
    result.assert_outcomes(passed=1, deselected=5)


def test_module_level_skip_fails_collection(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(ROOT_CONFTEST.read_text(encoding="utf-8"))
    pytester.makepyfile(
        test_module_skip='import pytest\npsycopg = pytest.importorskip("psycopg_not_installed_anywhere")\n\n'
        "def test_never_runs():\n    pass\n"
    )
    monkeypatch.delenv("CHONGMING_REQUIRE_POSTGRES", raising=False)
    assert pytester.runpytest_subprocess("-p", "no:cacheprovider").parseoutcomes() == {"skipped": 1}

    monkeypatch.setenv("CHONGMING_REQUIRE_POSTGRES", "1")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    assert result.ret != 0
