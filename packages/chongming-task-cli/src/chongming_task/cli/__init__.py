"""``chongming-task`` 命令行控制台（docs/cli.md）：Controller 之上的一层薄适配。

解析参数、调用库、渲染输出；不引入库里没有的概念，也不绕过任何不变量。模块划分：

* ``app``：命令组、全局选项、错误 → 一行中文 + 退出码（0 / 1 / 3）；
* ``state``：全局选项解析后的状态（存储、Controller、任务模块加载）；
* ``buckets``：``--owned-buckets`` 的写法；``params``：带中文报错的参数类型；
* ``output``：表格、JSON、时间格式、run 的实时进度；
* ``cmd_query`` / ``cmd_logs`` / ``cmd_control`` / ``cmd_run`` / ``cmd_doctor`` / ``cmd_init`` /
  ``cmd_archive`` / ``cmd_durable``（submit / retry / worker）：各命令。
"""

from __future__ import annotations

from collections.abc import Sequence

# 导入命令模块即把命令挂到 cli 组上。
from chongming_task.cli import (
    cmd_archive,
    cmd_control,
    cmd_doctor,
    cmd_durable,
    cmd_init,
    cmd_logs,
    cmd_query,
    cmd_run,
)
from chongming_task.cli.app import cli
from chongming_task.cli.errors import EXIT_FAILED, EXIT_OK, EXIT_TASK_NOT_SUCCEEDED

_COMMAND_MODULES = (cmd_archive, cmd_control, cmd_doctor, cmd_durable, cmd_init, cmd_logs, cmd_query, cmd_run)


def main(argv: Sequence[str] | None = None) -> int:
    """console script 入口：执行命令并以它的退出码退出（0 / 1 / 3）。"""
    code: int = cli.main(argv, prog_name="chongming-task", standalone_mode=False)
    raise SystemExit(code)


__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_TASK_NOT_SUCCEEDED", "cli", "main"]
