"""docs/cli.md 不会过时：把文档里的走查原样重跑一遍，输出必须与文档一致。

文档里 ```console 代码块中以 ``$ `` 开头的行是命令，其后直到下一条命令的行是它的输出（stdout 与
stderr 按终端里看到的顺序合在一起）。块前的 HTML 注释是给本测试的指令，渲染后看不见：

* ``<!-- cli-doc: background -->``：下一个块的命令在后台运行（"终端 1"），等它打印出 "→ running" 再往下走；
* ``<!-- cli-doc: wait-status ID STATUS -->``：等任务 ID 在 tasks.db 里到达 STATUS；
  ``<!-- cli-doc: wait-progress ID -->``：等它的进度回写到 tasks.db；
* ``<!-- cli-doc: sigint -->``：给后台命令发 SIGINT（Ctrl-C）；
* ``<!-- cli-doc: join -->``：等后台命令结束，比对它那个块的输出。

命令末尾的 ``; echo "退出码 $?"`` 会被识别：输出最后追加一行退出码。比较前两边做同样的归一化：
时间、时长、批数这些每次都不同的部分换成占位符，进度行（何时打印取决于时机）整行去掉，连续空白压成一个。

重新生成文档里的输出（在仓库根目录）：

    CHONGMING_UPDATE_DOCS=1 pytest packages/chongming-task-cli/tests/test_cli_doc.py
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prefork import python_popen, python_run

from chongming_task.stores.sqlite import SqliteTaskStore

REPO_ROOT = Path(__file__).resolve().parents[3]
DOC = REPO_ROOT / "docs" / "cli.md"
EXIT_SUFFIX = '; echo "退出码 $?"'
UPDATE = os.environ.get("CHONGMING_UPDATE_DOCS", "") not in ("", "0")

pytestmark = pytest.mark.slow


@dataclass
class Command:
    text: str  # 文档里写的命令（已去掉 "$ "，续行已拼好）
    expected: list[str]
    first_line: int  # 输出在文档里的起止行号（0 起），供 UPDATE 模式回写
    end_line: int


@dataclass
class Block:
    directives: list[str]
    commands: list[Command] = field(default_factory=list)


def parse(lines: list[str]) -> list[Block]:
    blocks: list[Block] = []
    pending: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        match = re.match(r"<!-- cli-doc: (.+?) -->", line.strip())
        if match:
            pending.append(match.group(1))
        elif line.strip() == "```console":
            block = Block(pending)
            pending = []
            index += 1
            current: Command | None = None
            while lines[index].strip() != "```":
                text = lines[index]
                if text.startswith("$ "):
                    command = text[2:]
                    while command.endswith("\\"):
                        index += 1
                        command = command[:-1] + " " + lines[index].strip()
                    current = Command(command, [], index + 1, index + 1)
                    block.commands.append(current)
                elif current is not None:
                    current.expected.append(text)
                    current.end_line = index + 1
                index += 1
            blocks.append(block)
        elif line.strip() and pending and not pending_waits_for_block(pending):
            blocks.append(Block(pending))  # 不跟着代码块的指令（join、sigint、wait-status）单独成一步
            pending = []
        index += 1
    if pending:
        blocks.append(Block(pending))
    return blocks


def pending_waits_for_block(directives: list[str]) -> bool:
    """background 要跟着下一个代码块；其余指令遇到正文就地生效。"""
    return "background" in directives


_NORMALIZE: list[tuple[re.Pattern[str], str]] = [
    # 默认的 owner 是 主机名:pid（必须排在时间之前：pid 可能凑巧像 "12:34:56" 的一部分）
    (re.compile(re.escape(socket.gethostname()) + r":\d+"), "<主机名:pid>"),
    (re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d+)?([+-]\d{2}:\d{2})?"), "<时间>"),
    (re.compile(r"\d{2}:\d{2}:\d{2}"), "<时间>"),
    (re.compile(r"\b\d+(\.\d+)?s\b"), "<时长>"),
    (re.compile(r"\b\d+m\d{2}s\b|\b\d+h\d{2}m\b"), "<时长>"),
    (re.compile(r"\b\d+ batch\b"), "<N> batch"),
    (re.compile(r"共处理 \d+ 批"), "共处理 <N> 批"),
    (re.compile(r"返回值：\d+"), "返回值：<N>"),
    (re.compile(r"(^|\s)\d+(\s*)$"), r"\1<N>\2"),  # status 明细里 outcome 等行尾的数字（批数）
]
_PROGRESS_LINE = re.compile(r"^\[\d{2}:\d{2}:\d{2}\] \S+ 进度 ")


def normalize(lines: list[str], *, volatile_numbers: bool) -> list[str]:
    result = []
    for line in lines:
        if _PROGRESS_LINE.match(line):
            continue  # 进度行何时打印取决于时机：整行不比
        text = line.rstrip()
        for pattern, replacement in _NORMALIZE:
            if pattern.pattern.startswith("(^|") and not volatile_numbers:
                continue
            text = pattern.sub(replacement, text)
        text = re.sub(r"-{2,}", "--", text)
        text = re.sub(r"\s+", " ", text)
        result.append(text)
    while result and not result[-1]:
        result.pop()
    return result


def argv_for(command: str) -> tuple[list[str], bool]:
    with_exit = command.endswith(EXIT_SUFFIX)
    if with_exit:
        command = command[: -len(EXIT_SUFFIX)]
    words = shlex.split(command)
    assert words[0] == "chongming-task", f"文档里的命令必须以 chongming-task 开头：{command}"
    return words[1:], with_exit


class Walkthrough:
    def __init__(self, workdir: Path, cli_argv: Any, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.cli_argv = cli_argv
        self.env = env
        self.background: tuple[Command, subprocess.Popen[str], bool] | None = None
        self.collected: list[str] = []
        self.mismatches: list[str] = []
        self.actual: dict[int, list[str]] = {}  # 输出起始行号 → 实际输出（UPDATE 模式回写用）

    def check(self, command: Command, output: str) -> None:
        actual = output.rstrip("\n").splitlines()
        self.actual[command.first_line] = actual
        volatile = "orders-worker" in command.text or "worker" in command.text
        want = normalize(command.expected, volatile_numbers=volatile)
        got = normalize(actual, volatile_numbers=volatile)
        if want != got:
            self.mismatches.append(
                f"$ {command.text}\n--- 文档 ---\n" + "\n".join(want) + "\n--- 实际 ---\n" + "\n".join(got)
            )

    def run(self, command: Command) -> None:
        args, with_exit = argv_for(command.text)
        # 经预导入的模板进程 fork（tests/support/prefork.py），省掉每条命令的解释器启动与导入。
        proc = python_run(
            self.cli_argv(*args)[1:], cwd=self.workdir, env=self.env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, timeout=60,
        )  # fmt: skip
        output = proc.stdout + (f"退出码 {proc.returncode}\n" if with_exit else "")
        self.check(command, output)

    def start(self, command: Command) -> None:
        args, with_exit = argv_for(command.text)
        proc = python_popen(
            self.cli_argv(*args)[1:], cwd=self.workdir, env=self.env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        self.collected = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            self.collected.append(line)
            if "→ running" in line:
                break
        assert any("→ running" in line for line in self.collected), "".join(self.collected)
        self.background = (command, proc, with_exit)

    def directive(self, text: str) -> None:
        name, *params = text.split()
        if name in ("wait-status", "wait-progress"):
            # wait-progress：等进度回写到存储（旁路每秒回写一次），免得 ps 的 PROGRESS 列时有时无。
            task_id, *status = params
            deadline = time.monotonic() + 20
            while True:
                with SqliteTaskStore(str(self.workdir / "tasks.db")) as store:
                    snapshot = store.get(task_id)
                if snapshot is not None and (
                    snapshot.progress is not None
                    if name == "wait-progress"
                    else snapshot.status.value == status[0]
                ):
                    return
                assert time.monotonic() < deadline, f"{task_id} 没有到达 {status}"
                time.sleep(0.05)
        assert self.background is not None, f"指令 {name} 之前没有后台命令"
        command, proc, with_exit = self.background
        if name == "sigint":
            proc.send_signal(signal.SIGINT)
        elif name == "join":
            rest, _ = proc.communicate(timeout=30)
            output = "".join(self.collected) + rest
            output += f"退出码 {proc.returncode}\n" if with_exit else ""
            self.check(command, output)
            self.background = None
        elif name != "background":
            raise AssertionError(f"未知指令 {name}")


def test_cli_doc_walkthrough_still_matches(tmp_path: Path, cli_process_tools: Any) -> None:
    cli_argv, cli_env = cli_process_tools
    lines = DOC.read_text(encoding="utf-8").splitlines()
    blocks = parse(lines)
    assert sum(len(b.commands) for b in blocks) >= 15
    env = cli_env()
    walk = Walkthrough(tmp_path, cli_argv, env)
    for block in blocks:
        if "background" in block.directives:
            assert len(block.commands) == 1
            for text in block.directives:
                if text != "background":
                    walk.directive(text)
            walk.start(block.commands[0])
            continue
        for text in block.directives:
            walk.directive(text)
        for command in block.commands:
            if command.text.startswith("export "):
                key, _, value = command.text[len("export ") :].partition("=")
                env[key] = str(REPO_ROOT / value) if key == "PYTHONPATH" else value
                continue
            walk.run(command)
    assert walk.background is None, "文档里的后台命令没有 join"
    if UPDATE:
        for first in sorted(walk.actual, reverse=True):
            command = next(c for b in blocks for c in b.commands if c.first_line == first)
            end = command.end_line if command.expected else first
            lines[first:end] = walk.actual[first]
        DOC.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return
    assert not walk.mismatches, "docs/cli.md 与实际输出不一致：\n\n" + "\n\n".join(walk.mismatches)
