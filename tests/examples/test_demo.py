"""make demo 的主流程本身也是一条测试：在临时 SQLite 文件上跑完，退出码 0，输出读回的任务表。"""

from __future__ import annotations

from pathlib import Path

from prefork import python_run

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.py"


def test_demo_runs_main_job_on_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    # 经预导入的模板进程 fork（tests/support/prefork.py），省掉解释器启动与导入。
    result = python_run([str(DEMO), str(db)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "== 实时任务表" in out
    assert f"== 从 {db} 读回的任务表 ==" in out
    readback = out.split(f"== 从 {db} 读回的任务表 ==", 1)[1]
    assert "orders-worker" in readback and "succeeded" in readback
    assert "pause → False" in out and "paused -> running" in out
    assert "stopping -> succeeded" in out
    assert db.exists()
