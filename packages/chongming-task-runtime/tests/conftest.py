"""运行时测试的公共配置。

进程执行器的用例需要**模块级**任务函数，而且子进程（spawn / forkserver）必须能按名字 import 它们。
``--import-mode=importlib`` 下测试文件本身不可导入，所以这些任务放在本目录的
``chongming_runtime_test_tasks.py`` 里，并把本目录放进 ``sys.path`` 与 ``PYTHONPATH``：
forkserver / spawn 子进程都会继承父进程启动它们时的 ``sys.path``。
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)

if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
_existing = os.environ.get("PYTHONPATH", "")
if _HERE not in _existing.split(os.pathsep):
    os.environ["PYTHONPATH"] = _HERE + (os.pathsep + _existing if _existing else "")
