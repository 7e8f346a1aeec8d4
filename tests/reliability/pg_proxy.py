"""一个真实的 TCP 代理，挡在 PostgreSQL 前面制造网络故障（测试基础设施，不是打桩）。

客户端（psycopg / libpq）连代理，代理连真正的服务器，两个方向各一个线程按 PostgreSQL 线协议的
消息边界转发字节。故障模式：

* ``pass``：原样转发。
* :meth:`lose_reply`：丢掉"下一条匹配的写"的回执——客户端这一批消息（到 Sync / Flush / 简单查询
  为止）整批转发给服务器，服务器执行并提交（autocommit 下在 Sync 时提交，显式事务在 COMMIT 时），
  代理把服务器发回的一切扣下，等到 ReadyForQuery（这时提交已经发生）就切断两端连接。客户端看到的是
  "连接在语句中途断了"：结果未知，而服务器上其实已经提交——这正是"回执丢失的提交"。
  ``at_commit=True``：匹配的那一批照常放行，丢的是同一连接上**下一个 COMMIT** 那一批的回执——显式事务里
  驱动把 COMMIT 单独发出（psycopg 在 COMMIT 之前先同步一次），要瞄准"这个事务的提交"只能这样认。
* :meth:`blackhole`：两个方向都停止转发，套接字保持打开——对端看到的是挂住，不是拒绝；
  新连接也被接受（内核替代理完成握手），但启动包永远到不了服务器。
* :meth:`blackhole_after`：下一批匹配的客户端消息照常送到服务器，紧接着整个代理进入挂住状态——
  服务器执行了这一批（若它在显式事务里，行锁就留在服务器上），回复与之后的一切都到不了。
  用来把"分区恰好发生在事务两条语句之间"做成确定的。
* :meth:`refuse`：新连接一接受就关闭（拒绝）；已有连接照常。
* :meth:`heal`：恢复转发（挂住期间扣下的字节继续送达，如同分区愈合）。:meth:`cut_all` 切断所有现有连接。

匹配按"这一批消息的字节 + 它通过 Bind 引用的具名预备语句的 SQL 文本"做子串匹配：psycopg 把
执行了 5 次以上的语句预备起来之后只发 Bind(语句名)，代理记下每条连接上 Parse 过的语句，仍能认出它。
参数值（任务 id、状态名）在 Bind 里以文本出现，所以可以精确瞄准"把任务 X 写成 succeeded 的那次 save"。

SSL / GSS 加密请求由代理直接回 'N'（不支持）：代理要看得懂明文协议。
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
from dataclasses import dataclass, field

_SSL_REQUEST = 80877103
_GSS_REQUEST = 80877104
# 一批客户端消息到此为止：服务器在这些消息之后才会（或才可能）提交并回 ReadyForQuery。
_BATCH_END = {b"S", b"H", b"Q", b"X"}


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    chunks: list[bytes] = []
    while n:
        try:
            chunk = sock.recv(n)
        except OSError:
            return None
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _cstring(body: bytes, start: int) -> tuple[bytes, int]:
    end = body.index(b"\x00", start)
    return body[start:end], end + 1


@dataclass
class _Rule:
    """一条"丢回执"规则：批次文本同时包含全部 needles 时命中；``rate`` < 1 时按概率命中。"""

    needles: tuple[bytes, ...]
    remaining: int | None  # None：不限次数
    rate: float = 1.0
    rng: random.Random = field(default_factory=random.Random)
    at_commit: bool = False  # True：丢的是匹配之后本连接上下一个 COMMIT 的回执


class _Link:
    """一条被代理的连接：客户端套接字、服务器套接字、两个转发线程。"""

    def __init__(self, proxy: PgFaultProxy, client: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server: socket.socket | None = None
        self.statements: dict[bytes, bytes] = {}  # 本连接上 Parse 过的具名语句 → SQL
        self.drop_at_ready = False
        self.drop_at_commit = False  # 一条 at_commit 规则已命中：等本连接的下一个 COMMIT
        self.dead = threading.Event()
        self._kill_lock = threading.Lock()

    def start(self) -> None:
        threading.Thread(target=self._client_pump, name="pgproxy-c2s", daemon=True).start()

    def kill(self) -> None:
        with self._kill_lock:
            if self.dead.is_set():
                return
            self.dead.set()
        for sock in (self.client, self.server):
            if sock is None:
                continue
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.proxy._forget(self)

    def _wait_flowing(self) -> bool:
        """挂住期间在这里等：不读也不写，字节留在内核缓冲里。连接被切断则返回 False。"""
        while not self.proxy._flowing.wait(0.05):
            if self.dead.is_set():
                return False
        return not self.dead.is_set()

    def _send(self, sock: socket.socket, data: bytes, *, force: bool = False) -> bool:
        if not force and not self._wait_flowing():
            return False
        try:
            sock.sendall(data)
        except OSError:
            self.kill()
            return False
        return True

    # -- client → server ---------------------------------------------------------------------------

    def _client_pump(self) -> None:
        if not self._startup():
            self.kill()
            return
        batch: list[tuple[bytes, bytes]] = []
        while not self.dead.is_set():
            head = _recv_exact(self.client, 5)
            if head is None:
                break
            kind = head[:1]
            (length,) = struct.unpack("!I", head[1:])
            body = _recv_exact(self.client, length - 4) if length > 4 else b""
            if body is None:
                break
            batch.append((kind, head + body))
            if kind == b"P":
                name, rest = _cstring(body, 0)
                query, _ = _cstring(body, rest)
                if name:
                    self.statements[name] = query
            if kind not in _BATCH_END:
                continue
            raw_batch = b"".join(raw for _, raw in batch)
            text = raw_batch
            for k, raw in batch:
                if k == b"B":
                    _portal, rest = _cstring(raw[5:], 0)
                    statement, _ = _cstring(raw[5:], rest)
                    text += self.statements.get(statement, b"")
            batch.clear()
            if self.drop_at_commit and b"COMMIT" in text:
                self.drop_at_ready = True
            else:
                rule = self.proxy._matching_rule(text)
                if rule is not None and rule.at_commit:
                    self.drop_at_commit = True
                elif rule is not None:
                    self.drop_at_ready = True  # 先立旗再转发：之后服务器发回的每个字节都在旗子之后
            assert self.server is not None
            if self._wait_flowing() and self.proxy._should_cut_after(text):
                self.proxy.blackhole()  # 先挂住再转发：服务器的回复一个字节也回不来
                if not self._send(self.server, raw_batch, force=True):
                    break
                continue
            if not self._send(self.server, raw_batch):
                break
        self.kill()

    def _startup(self) -> bool:
        """启动阶段：拒绝 SSL/GSS 加密请求，转发启动包，连上服务器并启动回程线程。"""
        while True:
            head = _recv_exact(self.client, 8)
            if head is None:
                return False
            length, code = struct.unpack("!II", head)
            rest = _recv_exact(self.client, length - 8) if length > 8 else b""
            if rest is None:
                return False
            if code in (_SSL_REQUEST, _GSS_REQUEST):
                if not self._wait_flowing():
                    return False
                try:
                    self.client.sendall(b"N")
                except OSError:
                    return False
                continue
            break
        try:
            self.server = socket.create_connection(self.proxy.upstream, timeout=10)
            self.server.settimeout(None)
        except OSError:
            return False
        threading.Thread(target=self._server_pump, name="pgproxy-s2c", daemon=True).start()
        return self._send(self.server, head + rest)

    # -- server → client ---------------------------------------------------------------------------

    def _server_pump(self) -> None:
        assert self.server is not None
        while not self.dead.is_set():
            head = _recv_exact(self.server, 5)
            if head is None:
                break
            (length,) = struct.unpack("!I", head[1:])
            body = _recv_exact(self.server, length - 4) if length > 4 else b""
            if body is None:
                break
            if self.drop_at_ready:
                # 回执被"网络"吞掉：扣下服务器的一切回复；等到 ReadyForQuery（提交已完成）就切断连接。
                if head[:1] == b"Z":
                    self.proxy._count_lost()
                    break
                continue
            if not self._send(self.client, head + body):
                break
        self.kill()


class PgFaultProxy:
    """在 127.0.0.1 的随机端口上监听，转发到 ``upstream``（host, port）。线程安全。"""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.host, self.port = self._listener.getsockname()
        self._flowing = threading.Event()
        self._flowing.set()
        self._refusing = False
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._rules: list[_Rule] = []
        self._cut_after: tuple[bytes, ...] | None = None
        self.cut_after_hits = 0
        self.lost_replies = 0
        self.connections = 0
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name="pgproxy-accept", daemon=True)
        self._thread.start()

    # -- fault control -----------------------------------------------------------------------------

    def lose_reply(
        self,
        *needles: bytes | str,
        count: int | None = 1,
        rate: float = 1.0,
        seed: int = 0,
        at_commit: bool = False,
    ) -> None:
        """丢掉接下来 ``count`` 次（None：不限）"批次文本包含全部 needles"的写的回执；rate < 1 按概率命中。
        ``at_commit``：丢的是那一批之后本连接上下一个 COMMIT 的回执（显式事务的提交，见模块说明）。"""
        encoded = tuple(n.encode() if isinstance(n, str) else n for n in needles)
        with self._lock:
            self._rules.append(_Rule(encoded, count, rate, random.Random(seed), at_commit))

    def blackhole_after(self, *needles: bytes | str) -> None:
        """下一批包含全部 needles 的客户端消息送到服务器之后立刻挂住（见模块说明）；只命中一次。"""
        with self._lock:
            self._cut_after = tuple(n.encode() if isinstance(n, str) else n for n in needles)

    def clear_rules(self) -> None:
        with self._lock:
            self._rules.clear()
            self._cut_after = None

    def blackhole(self) -> None:
        self._flowing.clear()

    def refuse(self) -> None:
        self._refusing = True

    def heal(self) -> None:
        self._refusing = False
        self.clear_rules()
        self._flowing.set()

    def cut_all(self) -> None:
        with self._lock:
            links = list(self._links)
        for link in links:
            link.kill()

    def dsn_params(self) -> dict[str, str]:
        return {"host": self.host, "port": str(self.port), "sslmode": "disable", "gssencmode": "disable"}

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut_all()

    # -- internals ---------------------------------------------------------------------------------

    def _matching_rule(self, text: bytes) -> _Rule | None:
        with self._lock:
            for rule in self._rules:
                if rule.remaining == 0 or not all(n in text for n in rule.needles):
                    continue
                if rule.rate < 1.0 and rule.rng.random() >= rule.rate:
                    continue
                if rule.remaining is not None:
                    rule.remaining -= 1
                return rule
        return None

    def _should_cut_after(self, text: bytes) -> bool:
        with self._lock:
            needles = self._cut_after
            if needles is None or not all(n in text for n in needles):
                return False
            self._cut_after = None
            self.cut_after_hits += 1
            return True

    def _count_lost(self) -> None:
        with self._lock:
            self.lost_replies += 1

    def _forget(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._refusing:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()  # RST：对端立刻看到"连接被重置/拒绝"
                continue
            link = _Link(self, client)
            with self._lock:
                self._links.add(link)
                self.connections += 1
            link.start()


__all__ = ["PgFaultProxy"]
