"""测试起 Python 子进程的入口：经预导入的模板进程 fork（``prefork_server.py``），省掉每个子进程的解释器启动
与导入本仓库（``import chongming_task`` + 存储后端 + CLI，空闲时约 0.3 秒 CPU，负载 5 时 0.5–1 秒墙钟）。

套件里有几百个这样的子进程：崩溃矩阵每次试验一个工作节点、归档 kill -9 每次一个、组提交崩溃、CLI 的
"另一个终端"……它们测的是被杀之后存储怎样、命令行输出什么，与解释器怎样启动无关。

``python_popen(argv, **kwargs)`` 与 ``subprocess.Popen([sys.executable, *argv], **kwargs)`` 用法相同（返回的
就是一个 ``subprocess.Popen`` 子类：pid、stdin/stdout/stderr 管道、poll / wait / communicate / kill /
send_signal / returncode 语义相同，被 SIGKILL 的 returncode 是 -9）；``python_run`` 对应 ``subprocess.run``。
``argv`` 是解释器之后的部分：``[script, *args]`` 或 ``["-c", code, *args]``；控制台脚本
（``.venv/bin/chongming-task``）就是一个 Python 脚本，照 ``[脚本路径, *args]`` 跑，
``sys.argv[0]`` 与直接执行它时相同。

环境变量 ``CHONGMING_TEST_PREFORK=0`` 时退回真正的 ``subprocess.Popen``（排查"是不是模板进程的问题"时用）。
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SERVER = Path(__file__).with_name("prefork_server.py")
PRELOAD = (
    "chongming_task",
    "chongming_task.store_registry",
    "chongming_task.stores.sqlite",
    "chongming_task.stores.postgres",
    "chongming_task.core.archive",
    "chongming_task.cli",
)


class PreforkServer:
    """一个模板进程与通向它的控制 socket；请求串行（一把锁），回答是子进程 pid。"""

    def __init__(self, preload: Sequence[str] = PRELOAD) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock = ours
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER), str(theirs.fileno()), *preload],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        theirs.close()
        if self._readline() != "READY":
            raise RuntimeError(f"预导入模板进程没有就绪（退出码 {self.process.poll()}）")

    def _readline(self) -> str:
        data = b""
        while not data.endswith(b"\n"):
            chunk = self._sock.recv(64)
            if not chunk:
                raise RuntimeError("预导入模板进程意外退出")
            data += chunk
        return data.decode().strip()

    def fork(self, argv: list[str], env: dict[str, str], cwd: str | None, fds: list[int]) -> int:
        request = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
        with self._lock:
            # 长度前缀（8 字节）与 fd 一起发，正文随后：流式 socket 不保留消息边界，
            # 参数可以很长（100 KB 的 URL）。
            socket.send_fds(self._sock, [struct.pack("!Q", len(request))], fds)
            self._sock.sendall(request)
            return int(self._readline())

    def close(self) -> None:
        self._sock.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class ForkedPopen(subprocess.Popen[Any]):
    """由模板进程 fork 出来的子进程，接口与 subprocess.Popen 相同。

    子进程不是本进程的子进程（是模板的），所以不能 waitpid：模板回收它后把原始退出状态写进一根管道，
    ``_try_wait`` / ``_internal_poll`` 读这根管道代替 waitpid，之后的换算（``_handle_exitstatus``）沿用基类。
    """

    def __init__(
        self, server: PreforkServer, argv: Sequence[str | bytes | os.PathLike[str]], **kwargs: Any
    ) -> None:
        self._server = server
        self._status_fd = -1
        self._status = b""
        # 字节参数（非 UTF-8 的 argv）按新解释器的规则解成 str（文件系统编码 + surrogateescape）；JSON 把
        # 孤立的代理字符转义成 \udcxx，子进程里还原成同一个 str——与新解释器的 sys.argv 一致。
        super().__init__([sys.executable, *(os.fsdecode(arg) for arg in argv)], **kwargs)

    def _execute_child(  # type: ignore[override]
        self,
        args: list[str],
        executable: Any,
        preexec_fn: Any,
        close_fds: bool,
        pass_fds: Sequence[int],
        cwd: Any,
        env: Any,
        startupinfo: Any,
        creationflags: int,
        shell: bool,
        p2cread: int,
        p2cwrite: int,
        c2pread: int,
        c2pwrite: int,
        errread: int,
        errwrite: int,
        *unsupported: Any,
    ) -> None:
        if shell or preexec_fn is not None or pass_fds or executable is not None:
            raise ValueError("python_popen 不支持 shell / preexec_fn / pass_fds / executable")
        environment = dict(os.environ if env is None else env)
        fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1]
        fds.append(errwrite if errwrite != -1 else 2)
        status_r, status_w = os.pipe()
        try:
            # 没给 cwd 时与 Popen 相同：子进程在本进程此刻的当前目录（不是模板启动时的目录）。
            directory = os.getcwd() if cwd is None else os.fspath(cwd)
            pid = self._server.fork(list(args[1:]), environment, directory, [*fds, status_w])
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        self.pid = pid
        self._status_fd = status_r
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _read_status(self, block: bool) -> int | None:
        """模板写来的 waitpid 状态；还没退出（且不阻塞）时 None。调用方持有 _waitpid_lock。"""
        if not block and not select.select([self._status_fd], [], [], 0)[0]:
            return None
        while True:
            chunk = os.read(self._status_fd, 64)
            if not chunk:
                break
            self._status += chunk
        os.close(self._status_fd)
        self._status_fd = -1
        if not self._status.strip():
            raise RuntimeError(f"预导入模板进程没有报告子进程 {self.pid} 的退出状态（模板退出了？）")
        return int(self._status)

    def _internal_poll(self, _deadstate: int | None = None, *_: Any, **__: Any) -> int | None:
        if self.returncode is None:
            if not self._waitpid_lock.acquire(False):
                return None
            try:
                if self.returncode is None and self._status_fd != -1:
                    status = self._read_status(block=False)
                    if status is not None:
                        self._handle_exitstatus(status)
            except OSError:
                if _deadstate is not None:
                    self.returncode = _deadstate
            finally:
                self._waitpid_lock.release()
        return self.returncode

    def _try_wait(self, wait_flags: int) -> tuple[int, int]:
        status = self._read_status(block=not wait_flags & os.WNOHANG)
        return (0, 0) if status is None else (self.pid, status)


_server: PreforkServer | None = None
_server_lock = threading.Lock()


def _enabled() -> bool:
    return os.environ.get("CHONGMING_TEST_PREFORK", "1").strip() not in ("0", "false", "no")


def shared_server() -> PreforkServer:
    """本进程（pytest 会话）共用的模板进程，第一次用时启动；pytest 退出时控制 socket 关闭，模板随之退出。"""
    global _server
    with _server_lock:
        if _server is None or _server.process.poll() is not None:
            _server = PreforkServer()
        return _server


def close_shared_server() -> None:
    global _server
    with _server_lock:
        if _server is not None:
            _server.close()
            _server = None


def python_popen(argv: Sequence[str | bytes | os.PathLike[str]], **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen([sys.executable, *argv], **kwargs)``，但经预导入的模板进程 fork。"""
    if not _enabled():
        return subprocess.Popen([sys.executable, *argv], **kwargs)
    return ForkedPopen(shared_server(), argv, **kwargs)


def python_run(
    argv: Sequence[str | bytes | os.PathLike[str]],
    *,
    input: Any = None,
    timeout: float | None = None,
    check: bool = False,
    capture_output: bool = False,
    **kwargs: Any,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run([sys.executable, *argv], ...)`` 的对应物（同样的超时与 check 语义）。"""
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    with python_popen(argv, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        except BaseException:
            process.kill()
            raise
        code = process.poll()
    assert code is not None
    if check and code:
        raise subprocess.CalledProcessError(code, process.args, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(process.args, code, stdout, stderr)
