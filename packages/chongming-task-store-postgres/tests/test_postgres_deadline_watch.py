"""看门线程的叫醒规则（``_deadline.Deadlines``）：它在等一个较晚的期限时，登记进来一个更早的期限必须叫醒
它按时切断；不比它醒得早的登记不叫醒它（省掉每次存储调用一次线程切换），醒来重扫时照样看得到。"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from chongming_task.stores.postgres._deadline import Deadlines


@pytest.fixture
def watch() -> Iterator[tuple[Deadlines, list[tuple[socket.socket, socket.socket]]]]:
    """一个 ``Deadlines`` 与两对本地套接字（登记 a 端，b 端读得到切断）；结束时关看门线程与全部套接字。"""
    deadlines = Deadlines("test")
    pairs = [socket.socketpair(socket.AF_UNIX) for _ in range(2)]
    yield deadlines, pairs
    deadlines.close()
    for a, b in pairs:
        a.close()
        b.close()


def _cut_within(sock: socket.socket, seconds: float) -> bool:
    """``seconds`` 秒内套接字是否被切断（对端 recv 读到 EOF）。"""
    sock.settimeout(seconds)
    try:
        data = sock.recv(1)
    except TimeoutError:
        return False
    assert data == b""
    return True


def _counting_notifies(deadlines: Deadlines) -> list[int]:
    """把看门线程的条件变量的 notify 换成计数的版本，返回计数器（一项的列表）。"""
    count = [0]
    real = deadlines._cond.notify

    def notify(n: int = 1) -> None:
        count[0] += 1
        real(n)

    deadlines._cond.notify = notify  # type: ignore[method-assign]
    return count


def test_earlier_deadline_wakes_a_watcher_waiting_on_a_later_one(
    watch: tuple[Deadlines, list[tuple[socket.socket, socket.socket]]],
) -> None:
    deadlines, [(late_a, _), (soon_a, soon_b)] = watch
    late_key, late = deadlines.arm(late_a.fileno(), 30.0)
    time.sleep(0.05)  # 看门线程已起来、在等 30 秒的那个期限
    _, soon = deadlines.arm(soon_a.fileno(), 0.2)
    assert _cut_within(soon_b, 5.0), "更早的期限没有叫醒看门线程：5 秒内没有切断"
    assert soon.fired and not late.fired
    deadlines.disarm(late_key)


def test_later_deadline_is_still_cut_after_the_watcher_wakes(
    watch: tuple[Deadlines, list[tuple[socket.socket, socket.socket]]],
) -> None:
    deadlines, [(first_a, first_b), (second_a, second_b)] = watch
    _, first = deadlines.arm(first_a.fileno(), 0.2)
    time.sleep(0.05)
    _, second = deadlines.arm(second_a.fileno(), 0.4)  # 比看门线程醒得晚：不叫醒，醒来重扫时看到
    assert _cut_within(first_b, 5.0)
    assert _cut_within(second_b, 5.0)
    assert first.fired and second.fired


def test_back_to_back_calls_do_not_wake_a_watcher_already_on_a_timed_wait(
    watch: tuple[Deadlines, list[tuple[socket.socket, socket.socket]]],
) -> None:
    # 存储调用一个接一个（调用表在两次之间是空的）：看门线程还在等第一次的期限，后来的期限都比它晚，
    # 一次也不必叫醒它——原来每次从空表登记都叫醒一次，每个存储调用多一次线程切换。
    deadlines, [(a, _), _] = watch
    key, _ = deadlines.arm(a.fileno(), 30.0)
    for _ in range(500):
        if deadlines._wake_at != float("inf"):
            break
        time.sleep(0.01)
    assert deadlines._wake_at != float("inf"), "看门线程没有进入按期限的等待"
    deadlines.disarm(key)
    notifies = _counting_notifies(deadlines)
    for _ in range(100):
        deadlines.disarm(deadlines.arm(a.fileno(), 30.0)[0])
    assert notifies[0] == 0


def test_store_calls_on_one_connection_look_up_its_socket_once(
    postgres_dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """每次存储调用都给连接的套接字登记期限，切断前要核对 inode（描述符号会被复用）。inode 按连接记一次：
    每次调用一次 ``fstat`` 是一次让出 GIL 的系统调用，就在发语句之前——两条执行槽线程时另一条趁机拿走
    GIL，这条要等它跑完一段 Python 才发得出语句。一条连接上 30 次调用只查一次。"""
    from chongming_task.stores.postgres import PostgresTaskStore, _deadline

    store = PostgresTaskStore(postgres_dsn, schema=schema, min_size=1, max_size=1, network_timeout=30.0)
    try:
        store.get("warm-up")
        looked_up: list[int] = []
        real = _deadline.os.fstat

        def counting(fd: int) -> object:
            looked_up.append(fd)
            return real(fd)

        monkeypatch.setattr(_deadline.os, "fstat", counting)
        for _ in range(30):
            assert store.get("missing") is None
        assert len(looked_up) <= 1, looked_up
    finally:
        store.close()
