"""监督进程被 SIGKILL 之后，ProcessExecutor 的子进程不许活下来（issue 22.3）。

修之前：30 次崩溃试验里有 8 次留下了子进程（共 19 个），它们继续跑、继续写，而存储已经说它们 ``lost``。
现在子进程有两道保险（用户指南 §7.3、设计说明「进程执行器的子进程不比监督进程活得久」）：

* Linux 上子进程启动时 ``prctl(PR_SET_PDEATHSIG, SIGKILL)``：父进程（forkserver，或 spawn 时派生它的那条
  常驻监视线程）一死，内核立刻杀掉子进程——握着 GIL 的任务也逃不掉；
* 控制管道读到 EOF（监督进程没了，它那一端被内核关闭）时，子进程的监听线程立刻 ``os._exit``。

这里每次试验起一个真实的监督进程（Controller + ProcessExecutor，几个永不结束的任务，其中一个一直握着
GIL），等子进程都 running 之后 SIGKILL 它，断言在 ``ORPHAN_EXIT_BOUND`` 秒内一个子进程（连同 forkserver）
都不剩。
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from chongming_task.runtime.executors.process import ORPHAN_EXIT_BOUND

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="按 Linux 的 /proc 检查进程")

SUPERVISOR = Path(__file__).with_name("orphan_supervisor.py")
TRIALS = ["forkserver", "spawn", "forkserver", "spawn", "forkserver"]
FOREVER_TASKS = 2


def alive(pid: int) -> bool:
    """进程还在跑（僵尸不算：它的父进程已经没了，只是还没被 init 回收）。"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def read_pids(proc: subprocess.Popen[str], timeout: float) -> list[int]:
    found: list[list[int]] = []

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("PIDS "):
                found.append(json.loads(line[5:]))
                return

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    thread.join(timeout)
    if not found:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"监督进程没能在 {timeout} 秒内让任务跑起来：{err[-2000:]}")
    return found[0]


def test_children_die_with_a_sigkilled_supervisor(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SUPERVISOR.parent), *sys.path])}
    survivors: list[int] = []
    latencies: list[float] = []
    for start_method in TRIALS:
        proc = subprocess.Popen(
            [sys.executable, str(SUPERVISOR), start_method, str(FOREVER_TASKS)],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        children = read_pids(proc, timeout=60)
        assert len(children) == FOREVER_TASKS + 1 and all(alive(pid) for pid in children)
        watched = set(children)
        if start_method == "forkserver":  # forkserver 本身也不许留下
            watched |= {parent_of(pid) for pid in children} - {proc.pid}
        killed_at = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
        deadline = killed_at + ORPHAN_EXIT_BOUND
        while any(alive(pid) for pid in watched) and time.monotonic() < deadline:
            time.sleep(0.005)
        left = [pid for pid in watched if alive(pid)]
        latencies.append(time.monotonic() - killed_at)
        survivors.extend(left)
        for pid in left:  # 别让失败的试验把进程留在机器上
            os.kill(pid, signal.SIGKILL)
    print(f"试验 {len(TRIALS)} 次，存活 {len(survivors)} 个；最慢 {max(latencies) * 1000:.0f} ms 全部退出")
    assert survivors == [], f"监督进程被杀 {ORPHAN_EXIT_BOUND} 秒后仍有子进程存活：{survivors}"
