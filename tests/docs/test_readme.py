"""README 的快速上手必须原样可运行（同一目录连跑两遍也行），README 里的相对链接必须指向真实存在的文件。"""

from __future__ import annotations

import re
from pathlib import Path

from prefork import python_run

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_quick_start_runs_as_shown(tmp_path: Path) -> None:
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "README 里应当有一段可运行的快速上手"
    for index, code in enumerate(blocks):
        script = tmp_path / f"readme_{index}.py"
        script.write_text(code, encoding="utf-8")
        # 两遍，同一个目录：第二遍面对的是第一遍留下的 quickstart.db（用户照着 README 再跑一次就是这样）。
        for attempt in ("第一遍", "第二遍"):
            # 经预导入的模板进程 fork（tests/support/prefork.py），省掉解释器启动与导入。
            result = python_run([str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, (
                f"README 第 {index + 1} 段 python 代码{attempt}失败：\n{result.stderr}"
            )
            assert "sync-A" in result.stdout and "succeeded" in result.stdout
            assert "sync-C" in result.stdout and "stopped" in result.stdout


def test_relative_links_resolve() -> None:
    text = README.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" in target:
            continue
        assert (ROOT / target).exists(), f"README 链接指向不存在的路径：{target}"
