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


def _cut_within(sock: socket.socket, seconds: float) -> float | None:
    """等到套接字被对端视角切断（recv 读到 EOF），返回用时；超时返回 None。"""
    sock.settimeout(seconds)
    started = time.monotonic()
    try:
        data = sock.recv(1)
    except TimeoutError:
        return None
    assert data == b""
    return time.monotonic() - started


def test_earlier_deadline_wakes_a_watcher_waiting_on_a_later_one(
    watch: tuple[Deadlines, list[tuple[socket.socket, socket.socket]]],
) -> None:
    deadlines, [(late_a, _), (soon_a, soon_b)] = watch
    late_key, late = deadlines.arm(late_a.fileno(), 30.0)
    time.sleep(0.05)  # 看门线程已起来、在等 30 秒的那个期限
    _, soon = deadlines.arm(soon_a.fileno(), 0.2)
    took = _cut_within(soon_b, 5.0)
    assert took is not None, "更早的期限没有叫醒看门线程：5 秒内没有切断"
    assert soon.fired and not late.fired
    deadlines.disarm(late_key)


def test_later_deadline_is_still_cut_after_the_watcher_wakes(
    watch: tuple[Deadlines, list[tuple[socket.socket, socket.socket]]],
) -> None:
    deadlines, [(first_a, first_b), (second_a, second_b)] = watch
    _, first = deadlines.arm(first_a.fileno(), 0.2)
    time.sleep(0.05)
    _, second = deadlines.arm(second_a.fileno(), 0.4)  # 比看门线程醒得晚：不叫醒，醒来重扫时看到
    assert _cut_within(first_b, 5.0) is not None
    assert _cut_within(second_b, 5.0) is not None
    assert first.fired and second.fired
