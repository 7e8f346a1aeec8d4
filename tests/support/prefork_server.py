"""测试用的"预导入模板进程"（fork server）：导入一次本仓库与它的依赖，之后按请求 fork 出子进程去跑
``python <script> args`` / ``python -c <code> args``，省掉每个子进程的解释器启动与导入（负载 5 时 0.5–1 秒）。

只被 ``prefork.py``（同目录）启动：``python prefork_server.py <控制 socket 的 fd> <预导入的模块>...``。

协议（控制 socket 上一问一答，客户端持锁串行）：

* 请求：一段 JSON（``argv``：解释器之后的参数，即 ``[script, *args]``、``["-c", code, *args]`` 或
  ``["-m", module, *args]``；``env``；
  ``cwd``）加 SCM_RIGHTS 附带的四个 fd：子进程的 stdin / stdout / stderr，以及"退出状态"管道的写端；
* 回答：子进程的 pid（十进制）。子进程退出后，本进程把 ``waitpid`` 得到的原始状态（十进制一行）写进那个
  管道再关掉——客户端据此得到与 ``subprocess.Popen`` 完全相同的 returncode（被 SIGKILL 就是 -9）。

为什么子进程与新起的解释器等价（这些子进程测的是"被杀之后存储怎样"、"命令行输出什么"，不是解释器启动）：

* 模板只导入模块，不开线程、不开连接、不碰 fd 0/1/2 的缓冲（启动时检查只有一个线程）；
* 子进程里：信号处置、std 流（按子进程的 ``PYTHONUNBUFFERED`` / ``PYTHONIOENCODING`` 重建）、``os.environ``、
  ``sys.argv``、``sys.path``（``sys.path[0]`` 与 ``PYTHONPATH`` 段按子进程的参数与环境重算）、
  ``sys.dont_write_bytecode``、``__main__`` 模块都换成新解释器会有的样子；除 0/1/2 外的 fd 全部关闭；
* 代码跑完由解释器照常退出（atexit、非守护线程的 join、未捕获异常的回溯与退出码 1、SystemExit 都是
  解释器自己的路径），不是 ``os._exit``；
* ``random`` 在 fork 之后自动重新播种（标准库的 at-fork 钩子）。

唯一的差别是字符串哈希的随机种子在这些子进程之间相同（都继承模板的）；没有测试依赖集合的遍历顺序。
"""

from __future__ import annotations

import importlib
import io
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import types
from typing import Any


def _fresh_streams(env: dict[str, str]) -> None:
    """照新解释器的规则重建 sys.stdin/stdout/stderr（fd 0/1/2 已换成请求给的）。"""
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    encoding, _, errors = (env.get("PYTHONIOENCODING") or "").partition(":")
    encoding = encoding or sys.stdout.encoding
    out_errors = errors or "strict"

    def text(fd: int, mode: str, *, line: bool, errs: str) -> io.TextIOWrapper:
        if mode == "r":
            raw: Any = io.FileIO(fd, "r", closefd=False)
            return io.TextIOWrapper(io.BufferedReader(raw), encoding=encoding, errors=errs)
        raw = io.FileIO(fd, "w", closefd=False)
        if unbuffered:
            return io.TextIOWrapper(raw, encoding=encoding, errors=errs, write_through=True)
        return io.TextIOWrapper(io.BufferedWriter(raw), encoding=encoding, errors=errs, line_buffering=line)

    sys.stdin = sys.__stdin__ = text(0, "r", line=False, errs=out_errors)
    sys.stdout = sys.__stdout__ = text(1, "w", line=os.isatty(1), errs=out_errors)
    sys.stderr = sys.__stderr__ = text(2, "w", line=True, errs=errors or "backslashreplace")


def _become_child(
    request: dict[str, Any], fds: list[int], template_pythonpath: list[str]
) -> tuple[types.CodeType, dict[str, Any]]:
    """fork 出的子进程里：换上请求的 fd、环境、参数与 __main__；返回要执行的代码与它的全局命名空间。"""
    stdin_fd, stdout_fd, stderr_fd = fds[:3]
    for target, fd in ((0, stdin_fd), (1, stdout_fd), (2, stderr_fd)):
        if fd != target:
            os.dup2(fd, target)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    env: dict[str, str] = request["env"]
    os.environ.clear()
    os.environ.update(env)
    if request.get("cwd"):
        os.chdir(request["cwd"])
    _fresh_streams(env)
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))

    argv: list[str] = request["argv"]
    if argv[0] == "-c":
        source, filename, sys.argv, first = argv[1], "<string>", ["-c", *argv[2:]], ""
    elif argv[0] == "-m":
        # 与 ``python -m mod`` 相同：sys.path[0] 是当前目录，runpy 把 sys.argv[0] 换成模块文件的路径。
        source = f"import runpy\nrunpy._run_module_as_main({argv[1]!r})\n"
        filename, sys.argv, first = "<string>", ["-m", *argv[2:]], os.getcwd()
    else:
        path = argv[0]
        with open(path, "rb") as handle:
            source_bytes = handle.read()
        source, filename, sys.argv = source_bytes.decode("utf-8"), path, list(argv)
        first = os.path.dirname(os.path.realpath(path))
    # sys.path = [脚本目录或 ''] + 子进程的 PYTHONPATH + 其余（标准库、site-packages），与新解释器相同。
    rest = sys.path[1:]
    for entry in template_pythonpath:
        if entry in rest:
            rest.remove(entry)
    child_pythonpath = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *[os.path.abspath(p) for p in child_pythonpath], *rest]

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    if filename != "<string>":
        main.__file__ = os.path.abspath(filename)  # 3.9 起 ``python x.py`` 的 __main__.__file__ 是绝对路径
        main.__dict__["__cached__"] = None
    mp_process = sys.modules.get("multiprocessing.process")
    if mp_process is not None:
        # multiprocessing 在导入时记下的启动目录（spawn 的子进程据此找 __main__）：换成子进程的当前目录。
        mp_process.ORIGINAL_DIR = os.path.abspath(os.getcwd())  # type: ignore[attr-defined]
    sys.modules["__main__"] = main
    return compile(source, filename, "exec", dont_inherit=True), main.__dict__


def _receive(control: socket.socket, size: int) -> bytes:
    """从流式 socket 读满 size 个字节（请求的正文跟在长度前缀之后，可能分几次到达）。"""
    data = b""
    while len(data) < size:
        chunk = control.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise SystemExit("客户端在请求中途断开")
        data += chunk
    return data


def serve(control_fd: int) -> tuple[types.CodeType, dict[str, Any]] | None:
    """模板的主循环；只在 fork 出的子进程里返回（要执行的代码与它的全局命名空间）。"""
    control = socket.socket(fileno=control_fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    template_pythonpath = [
        os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
    ]
    status_pipes: dict[int, int] = {}  # 子进程 pid -> 退出状态管道的写端
    control.sendall(b"READY\n")
    while True:
        readable, _, _ = select.select([control, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        while status_pipes:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            fd = status_pipes.pop(pid, None)
            if fd is not None:
                try:
                    os.write(fd, f"{status}\n".encode())
                finally:
                    os.close(fd)
        if control not in readable:
            continue
        header, fds, _, _ = socket.recv_fds(control, 8, 4)
        if not header:  # 客户端（pytest）走了：模板跟着退出，已经在跑的子进程不受影响
            return None
        header += _receive(control, 8 - len(header))
        request = json.loads(_receive(control, struct.unpack("!Q", header)[0]))
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            control.detach()
            return _become_child(request, fds, template_pythonpath)
        status_pipes[pid] = fds[3]
        for fd in fds[:3]:
            os.close(fd)
        control.sendall(f"{pid}\n".encode())


def _preload(modules: list[str]) -> None:
    for name in modules:
        importlib.import_module(name)
    if threading.active_count() != 1:
        raise SystemExit(f"预导入之后有 {threading.active_count()} 个线程：fork 出的子进程会不完整")


if __name__ == "__main__":
    _preload(sys.argv[2:])
    _job = serve(int(sys.argv[1]))
    if _job is not None:
        # 子进程：像 ``python script.py`` 一样在新的 __main__ 里执行；之后的退出（异常的回溯与退出码、
        # SystemExit、atexit、等非守护线程）都走解释器自己的路径。
        exec(_job[0], _job[1])
