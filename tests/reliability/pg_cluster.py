"""一次性的 PostgreSQL 集群：initdb 到临时目录、pg_ctl 启停、trust 认证、另一个端口。

共享的测试服务器（CHONGMING_TEST_POSTGRES）同时被别的工程师使用，绝不能被停掉或切断；需要
杀服务器、切网络的测试都对着这里起的私有集群做。二进制取 /usr/lib/postgresql/<最新版本>/bin
（或 PATH 里的 initdb）。initdb 拒绝以 root 运行：以 root 跑测试时改用 postgres 系统用户
（runuser），数据目录交给它。
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def find_bindir() -> Path | None:
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3].split(".")[0])
    )
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ThrowawayCluster:
    """``start()`` 之后 ``dsn`` 可用（库 postgres、用户 postgres、trust）；``stop()`` 停掉并删目录。"""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = _free_port()
        self.host = "127.0.0.1"
        self.root = Path(tempfile.mkdtemp(prefix="ct-pgcluster-"))
        self.datadir = self.root / "data"
        self.logfile = self.root / "server.log"
        self._run_as: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError as exc:  # pragma: no cover - 取决于机器
                raise RuntimeError("以 root 运行且没有 postgres 系统用户：initdb 无法运行") from exc
            self._run_as = "postgres"
            shutil.chown(self.root, user="postgres")
            os.chmod(self.root, 0o700)

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres?sslmode=disable&gssencmode=disable"

    def _cmd(self, *args: str) -> list[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        return ["runuser", "-u", self._run_as, "--", *cmd] if self._run_as else cmd

    def _run(self, *args: str, timeout: float = 60) -> None:
        result = subprocess.run(
            self._cmd(*args), capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            log = self.logfile.read_text(errors="replace")[-2000:] if self.logfile.exists() else ""
            raise RuntimeError(f"{' '.join(args[:2])} 失败：{result.stdout}{result.stderr}\n{log}")

    def start(self) -> None:
        if not self.datadir.exists():
            self._run(
                "initdb", "-D", str(self.datadir), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                "--locale=C", "--no-sync",
            )  # fmt: skip
        options = (
            f"-c port={self.port} -c listen_addresses={self.host} -c unix_socket_directories={self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=100"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.datadir),
            "-l",
            str(self.logfile),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self, mode: str = "fast") -> None:
        if (self.datadir / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.datadir), "-m", mode, "-w", "-t", "60", "stop")

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


__all__ = ["ThrowawayCluster", "find_bindir"]
