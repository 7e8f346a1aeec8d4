"""``logs TASK [--attempt N] [--follow] [--json]``：读任务持久化的日志（issue 18；docs/cli.md "日志：logs"）。

只读打开存储（与 history 相同），从任何进程都能读。``--follow`` 按 seq 续读新行，直到任务落终态：
先看状态、再把新行读干净——持有者在每次尝试落终态之前就把这次尝试的日志写进了存储（见
``chongming_task.runtime.task_logs``），所以"看到终态之后读到的"就是全部，不会漏掉最后几行，也不会
把哪一行读两次（续读条件是 seq 严格大于已打印的最大 seq）。Ctrl-C 安静地以 130 退出（与 shell 约定一致）。
"""

from __future__ import annotations

import sys
import time

import click

from chongming_task.cli.app import cli, json_option, pass_state
from chongming_task.cli.errors import EXIT_OK, CliError
from chongming_task.cli.output import echo_json, echo_json_line, echo_text, fmt_time
from chongming_task.cli.params import NON_NEGATIVE_INT, seconds_option
from chongming_task.cli.state import AppState
from chongming_task.storage import MAX_LOG_LINES, LogLine, TaskStore

EXIT_INTERRUPTED = 130
"""``--follow`` 被 Ctrl-C 打断：128 + SIGINT，shell 与 ``kubectl logs -f`` 都是这个约定。"""

PAGE = 1000
"""一次读多少行（每任务本来最多只存 MAX_LOG_LINES 行）。"""


def _render(line: LogLine) -> str:
    return f"{fmt_time(line.at)}  {line.level:<7}  #{line.attempt}  {line.message}"


class _Printer:
    """按 seq 打印，记住打印过的最大 seq；发现序号跳了（追得太慢、旧行已被上限丢掉）就在 stderr 说一声。"""

    def __init__(self, as_json: bool, follow: bool, attempt: int | None) -> None:
        self.as_json = as_json
        self.follow = follow
        self.attempt = attempt
        self.last_seq = 0
        self.collected: list[LogLine] = []

    def emit(self, lines: list[LogLine]) -> None:
        for line in lines:
            if self.attempt is None and line.seq > self.last_seq + 1 and self.last_seq:
                skipped = line.seq - self.last_seq - 1
                click.echo(f"（跳过了 {skipped} 行：已超出每任务 {MAX_LOG_LINES} 行的上限被丢弃）", err=True)
            self.last_seq = line.seq
            if self.as_json and not self.follow:
                self.collected.append(line)
            elif self.as_json:
                echo_json_line(line.to_dict())
            else:
                echo_text(_render(line))
        if self.follow:
            sys.stdout.flush()

    def drain(self, store: TaskStore, task_id: str) -> None:
        """读到没有新行为止（分页）。"""
        while True:
            lines = store.read_logs(task_id, attempt=self.attempt, after_seq=self.last_seq, limit=PAGE)
            self.emit(lines)
            if len(lines) < PAGE:
                return


@cli.command("logs")
@click.argument("task_id")
@click.option("--attempt", type=NON_NEGATIVE_INT, default=None, metavar="N", help="只看第 N 次尝试的日志。")
@click.option("--follow", "-f", is_flag=True, help="持续输出新行，直到任务结束（Ctrl-C 退出）。")
@seconds_option("--interval", 0.5, "--follow 的轮询间隔（秒）。", metavar="S")
@json_option
@pass_state
def logs_command(state: AppState, task_id: str, attempt: int | None, follow: bool, interval: float) -> int:
    """任务持久化的日志（ctx.log 写的行）：时间、级别、第几次尝试、正文。每任务保留最新 1000 行。"""
    store = state.open_store(readonly=True)
    try:
        if store.get(task_id) is None:
            raise CliError(
                f"找不到任务 {task_id!r}（存储 {state.store_display}）：请用 ps 查看已有的任务 id",
                error="task_not_found",
            )
        printer = _Printer(state.json, follow, attempt)
        if not state.json:
            stats = store.log_stats(task_id)
            if stats.dropped:
                click.echo(
                    f"（最旧的 {stats.dropped} 行已超出每任务 {MAX_LOG_LINES} 行的上限被丢弃）", err=True
                )
            if stats.last_seq:
                # 从仍保存的第一行接着读，开头那段已丢弃的行不再报"跳过"。
                printer.last_seq = stats.dropped
        if not follow:
            printer.drain(store, task_id)
            if state.json:
                echo_json([line.to_dict() for line in printer.collected])
            return EXIT_OK
        try:
            while True:
                snapshot = store.get(task_id)
                # 先看状态再读：终态之前的行已全部落库，终态之后读干净就是全部。
                printer.drain(store, task_id)
                if snapshot is None or snapshot.is_terminal:
                    return EXIT_OK
                time.sleep(interval)
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
    finally:
        store.close()


__all__ = ["EXIT_INTERRUPTED", "logs_command"]
