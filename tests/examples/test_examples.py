"""每个编号示例（examples/NN_*.py）都是一条测试：在子进程里跑（cwd 是临时目录），必须以 0 退出。

示例自己断言自己的说法，所以"跑通"就等于"文档里讲的行为是真的"。12_postgres_multinode 需要真实的
PostgreSQL：它带 ``postgres`` 标记，DSN 来自根 conftest 的 ``postgres_dsn`` 夹具（没有 DSN 时跳过；
CI 设了 CHONGMING_REQUIRE_POSTGRES=1，跳过即失败）。

示例自己"跳过"时以退出码 77 结束（不是 0：什么都没验证不能冒充验证通过），这里把它转成 pytest 的跳过，
于是 CHONGMING_REQUIRE_POSTGRES=1 时同样按失败处理。
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from prefork import python_run

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NUMBERED = sorted(EXAMPLES.glob("[0-9][0-9]_*.py"))
POSTGRES_EXAMPLES = {"12_postgres_multinode.py"}
TIMEOUT = 60
EXIT_SKIPPED = 77
"""示例表示"跳过"的退出码（与 examples/12_postgres_multinode.py 的约定一致）。"""
# 由父进程环境决定的两个变量：每条用例自己显式给出，免得 CI 的设置改变"没有 DSN 时"用例的含义。
_CONTROLLED_ENV = ("CHONGMING_TEST_POSTGRES", "CHONGMING_REQUIRE_POSTGRES")


def _run(
    script: Path, cwd: Path, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in _CONTROLLED_ENV}
    env.update(extra_env or {})
    env["PYTHONUNBUFFERED"] = "1"
    # 经预导入的模板进程 fork（tests/support/prefork.py），省掉解释器启动与导入。
    return python_run([str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)


def _check(result: subprocess.CompletedProcess[str], script: Path, cwd: Path) -> None:
    if result.returncode == EXIT_SKIPPED:
        pytest.skip(f"{script.name} 跳过了（退出码 {EXIT_SKIPPED}）：{result.stderr.strip()}")
    assert result.returncode == 0, (
        f"{script.name} 退出码 {result.returncode}\n"
        f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
    )
    assert f"{script.stem}: OK" in result.stdout, f"{script.name} 没有打印结束标记：\n{result.stdout}"
    leftovers = sorted(p.name for p in cwd.iterdir())
    assert leftovers == [], f"{script.name} 在工作目录里留下了文件：{leftovers}（示例只能写临时目录）"


def test_examples_are_numbered_and_documented() -> None:
    names = [p.stem for p in NUMBERED]
    assert [n[:2] for n in names] == [f"{i:02d}" for i in range(1, len(names) + 1)], names
    for script in NUMBERED:
        text = script.read_text(encoding="utf-8")
        assert text.startswith('"""'), f"{script.name} 缺少说明它演示什么的模块文档字符串"
        assert 'if __name__ == "__main__":' in text, f"{script.name} 缺少 __main__ 守卫"


@pytest.mark.parametrize(
    "script", [p for p in NUMBERED if p.name not in POSTGRES_EXAMPLES], ids=lambda p: p.stem
)
def test_example_runs(script: Path, tmp_path: Path) -> None:
    _check(_run(script, tmp_path), script, tmp_path)


@pytest.mark.postgres
@pytest.mark.parametrize("script", [p for p in NUMBERED if p.name in POSTGRES_EXAMPLES], ids=lambda p: p.stem)
def test_postgres_example_runs(script: Path, tmp_path: Path, postgres_dsn: str) -> None:
    _check(_run(script, tmp_path, {"CHONGMING_TEST_POSTGRES": postgres_dsn}), script, tmp_path)


@pytest.mark.parametrize("script", [p for p in NUMBERED if p.name in POSTGRES_EXAMPLES], ids=lambda p: p.stem)
def test_postgres_example_skips_visibly_without_dsn(script: Path, tmp_path: Path) -> None:
    result = _run(script, tmp_path)
    assert result.returncode == EXIT_SKIPPED, result.stdout + result.stderr
    assert result.stderr.startswith("跳过：") and "CHONGMING_TEST_POSTGRES" in result.stderr
    assert f"{script.stem}: OK" not in result.stdout  # 跳过的示例不打印"OK"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script", [p for p in NUMBERED if p.name in POSTGRES_EXAMPLES], ids=lambda p: p.stem)
def test_postgres_example_without_dsn_fails_when_postgres_is_required(script: Path, tmp_path: Path) -> None:
    result = _run(script, tmp_path, {"CHONGMING_REQUIRE_POSTGRES": "1"})
    assert result.returncode not in (0, EXIT_SKIPPED), result.stdout + result.stderr
    assert "CHONGMING_REQUIRE_POSTGRES" in result.stderr and "CHONGMING_TEST_POSTGRES" in result.stderr


def test_a_skip_exit_code_becomes_a_pytest_skip(tmp_path: Path) -> None:
    script = tmp_path / "skipper.py"
    script.write_text(
        "import sys\nprint('跳过：没有 CHONGMING_TEST_POSTGRES', file=sys.stderr)\nsys.exit(77)\n"
    )
    result = _run(script, tmp_path)
    with pytest.raises(pytest.skip.Exception, match="退出码 77"):
        _check(result, script, tmp_path)


# 按固定宽度截断的消息（str(exc)[:40]、failure.message[:50]）会把"该怎么做"那半句切掉，
# 示例照抄出去就是坏榜样。
_CUT_MESSAGE = re.compile(r"(str\(\w+\)|\.message)\[:\d+\]")


@pytest.mark.parametrize("script", NUMBERED, ids=lambda p: p.stem)
def test_examples_print_whole_messages(script: Path) -> None:
    offending = [
        f"{script.name}:{number}: {line.strip()}"
        for number, line in enumerate(script.read_text(encoding="utf-8").splitlines(), start=1)
        if _CUT_MESSAGE.search(line)
    ]
    assert offending == [], "示例不要按固定宽度截断消息：\n" + "\n".join(offending)
