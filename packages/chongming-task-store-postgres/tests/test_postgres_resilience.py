"""连接丢失：坏连接被连接池换掉；数据库不可达期间调用很快抛 StoreError；恢复后自动好转。

不重启共享的数据库服务器（别的测试还在用它），而是用两种办法制造故障：
``pg_terminate_backend`` 杀掉本存储的后端进程（等同于服务器重启时连接被断开），以及一个
本地 TCP 转发器——关掉它就是"数据库宕机"，重新打开就是"数据库回来了"。
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from chongming_task.errors import StoreError
from chongming_task.states import TaskStatus
from chongming_task.stores.postgres import PostgresTaskStore
from chongming_task.testing.store_contract import snap, step

pytestmark = pytest.mark.postgres


def _terminate(admin: Any, application_name: str) -> int:
    rows = admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
        [application_name],
    ).fetchall()
    # 等服务器那边真的结束它们，避免下面的断言与终止过程赛跑。
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application_name]
        ).fetchone()
        if left == (0,):
            break
        time.sleep(0.02)
    return len(rows)


def test_terminated_backends_are_replaced_transparently(postgres_dsn: str, schema: str, admin: Any) -> None:
    app = f"ct-term-{secrets.token_hex(4)}"
    store = PostgresTaskStore(postgres_dsn, schema=schema, min_size=3, max_size=3, application_name=app)
    try:
        base = snap("survivor")
        store.create(base)
        for _ in range(3):
            assert store.get("survivor") is not None
        assert _terminate(admin, app) >= 1

        # 池里的空闲连接全是死的；借出前的检查发现它们、换成新连接，调用方毫无察觉。
        queued, record = step(base, TaskStatus.QUEUED)
        store.save(queued, expect_version=0, transitions=[record])
        got = store.get("survivor")
        assert got is not None and got.status is TaskStatus.QUEUED
        store.create(snap("after-terminate"))
        assert len(store.query()) == 2

        # 再来一次：重连之后的连接同样可以被替换。
        assert _terminate(admin, app) >= 1
        assert store.touch("survivor", lease_owner="node-a")
        assert store.history("survivor") == [record]
        assert store.pool.get_stats().get("connections_lost", 0) >= 1
    finally:
        store.close()


class _Proxy:
    """最简单的 TCP 转发器：stop() = 数据库宕机（拒绝新连接、切断已有连接），start() = 恢复。"""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self._listener: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            # 只 close 不够：另一个线程正阻塞在 accept() 上，内核里的监听套接字会一直活到它返回。
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def proxy(postgres_dsn: str) -> Iterator[_Proxy]:
    params = conninfo_to_dict(postgres_dsn)
    host = str(params.get("host") or "127.0.0.1")
    if host.startswith("/"):
        pytest.skip("CHONGMING_TEST_POSTGRES 走的是 Unix 套接字，这个用例需要 TCP 地址")
    forwarder = _Proxy((host, int(params.get("port") or 5432)))
    forwarder.start()
    yield forwarder
    forwarder.stop()


def test_outage_raises_store_error_quickly_and_recovers(
    postgres_dsn: str, schema: str, proxy: _Proxy
) -> None:
    dsn = make_conninfo(postgres_dsn, host="127.0.0.1", port=str(proxy.port))
    store = PostgresTaskStore(dsn, schema=schema, pool_timeout=1.0, connect_timeout=2.0)
    try:
        store.create(snap("before-outage"))
        proxy.stop()

        for call in (lambda: store.get("before-outage"), lambda: store.create(snap("during-outage"))):
            started = time.monotonic()
            with pytest.raises(StoreError) as caught:
                call()
            elapsed = time.monotonic() - started
            assert elapsed < 4.0, f"宕机期间的调用挂了 {elapsed:.1f} 秒：应在 pool_timeout 附近失败"
            assert "PostgreSQL" in str(caught.value)
            assert "***" in str(caught.value) or "password" not in str(caught.value)

        time.sleep(1.5)  # 让连接池的重连退避至少走过一轮，确认它不会因此"放弃"
        proxy.start()
        back = time.monotonic()
        while True:
            try:
                got = store.get("before-outage")
                break
            except StoreError:
                if time.monotonic() - back > 20:
                    raise
        recovered_after = time.monotonic() - back
        assert got is not None
        # 连接池重连退避被 reconnect_timeout 收短了：数据库回来之后几秒内就恢复，而不是一两分钟。
        assert recovered_after < 12, f"数据库恢复 {recovered_after:.1f} 秒后存储才好转"
        print(f"数据库恢复后 {recovered_after:.2f} 秒存储恢复")
        store.create(snap("after-outage"))
        assert {s.task_id for s in store.query()} == {"before-outage", "after-outage"}
    finally:
        store.close()


def test_unreachable_server_at_construction_is_a_store_error(postgres_dsn: str) -> None:
    with socket.socket() as probe:  # 一个刚刚空出来、没人监听的端口
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dsn = make_conninfo(postgres_dsn, host="127.0.0.1", port=str(port), password="s3cret")
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        PostgresTaskStore(dsn, connect_timeout=2.0)
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert "连不上 PostgreSQL" in message
    assert "s3cret" not in message, "报错里不能出现口令"
    assert "refused" in message.lower() or "驱动报告" in message
