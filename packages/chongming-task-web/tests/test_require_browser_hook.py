"""根目录 conftest.py 的"CI 上浏览器测试不许跳过"规则（CHONGMING_REQUIRE_BROWSER=1）确实生效。

与 tests/test_require_postgres_hook.py 同样的做法：把根 conftest 复制进 pytester 的临时目录，在子进程里跑。
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT_CONFTEST = Path(__file__).resolve().parents[3] / "conftest.py"

SAMPLE = """
import pytest

pytestmark = []


@pytest.mark.browser
def test_browser_without_chromium():
    pytest.skip("需要浏览器：apt-get install -y chromium")


def test_unrelated_skip_stays_skipped():
    pytest.skip("only on windows")


def test_plain_pass():
    pass
"""


@pytest.fixture
def sample(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makeconftest(ROOT_CONFTEST.read_text(encoding="utf-8"))
    pytester.makeini("[pytest]\nmarkers =\n    browser: real browser\n    postgres: needs PostgreSQL\n")
    pytester.makepyfile(test_sample=SAMPLE)
    for name in ("CHONGMING_REQUIRE_BROWSER", "CHONGMING_REQUIRE_POSTGRES", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)
    return pytester


def test_browser_skip_fails_only_when_required(
    sample: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 不设变量时它就是普通的跳过（默认行为）；设了之后，只有 browser 标记的跳过改判为失败。
    monkeypatch.setenv("CHONGMING_REQUIRE_BROWSER", "1")
    result = sample.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1, failed=1)
    result.stdout.fnmatch_lines(["*CHONGMING_REQUIRE_BROWSER=1*不允许跳过*"])
