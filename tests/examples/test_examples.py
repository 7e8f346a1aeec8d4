"""每个编号示例（examples/NN_*.py）都是一条测试：在子进程里跑（cwd 是临时目录），必须以 0 退出。

示例自己断言自己的说法，所以"跑通"就等于"文档里讲的行为是真的"。12_postgres_multinode 需要真实的
PostgreSQL：它带 ``postgres`` 标记，DSN 来自根 conftest 的 ``postgres_dsn`` 夹具（没有 DSN 时跳过；
CI 设了 CHONGMING_REQUIRE_POSTGRES=1，跳过即失败）。
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NUMBERED = sorted(EXAMPLES.glob("[0-9][0-9]_*.py"))
POSTGRES_EXAMPLES = {"12_postgres_multinode.py"}
TIMEOUT = 60


def _run(
    script: Path, cwd: Path, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CHONGMING_TEST_POSTGRES"}
    env.update(extra_env or {})
    env["PYTHONUNBUFFERED"] = "1"
    return subprocess.run(
        [sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )


def _check(result: subprocess.CompletedProcess[str], script: Path, cwd: Path) -> None:
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
def test_postgres_example_exits_cleanly_without_dsn(script: Path, tmp_path: Path) -> None:
    result = _run(script, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "CHONGMING_TEST_POSTGRES" in result.stdout
