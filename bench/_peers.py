"""基准脚本共用的对照组工具：在子进程里跑对照、失败时给一行中文说明、最后打印汇总表。

不是基准脚本本身（`make bench` 只跑 bench_*.py）；bench_*.py 以 ``import _peers`` 使用它
（直接运行脚本时 bench/ 就在 sys.path 最前面）。

汇总表每行：后端、我们、对照、对照的速率、比值、目标、是否达成。表格是 Markdown，
可以直接贴进 bench/README.md。
"""

from __future__ import annotations

import functools
import os
import statistics
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

HERE = Path(__file__).resolve().parent
# DBOS 的队列每秒只跑几十到一百来个工作流：只给它这么多个，免得 make bench 为它多等几分钟。
# 计时前已预热，速率与 N 无关（积压越短对它越有利）。
DBOS_TASKS = 1_000


@dataclass(frozen=True)
class Peer:
    """一个对照组的测量结果：rate 为 None 时 note 说明为什么没有数字。"""

    label: str
    rate: float | None
    note: str = ""
    samples: tuple[float, ...] = ()


@dataclass(frozen=True)
class Goal:
    """对一个对照组的目标：我们 / 对照 ≥ ratio（ahead=True 时要求严格领先，即 > ratio）。"""

    peer: str
    ratio: float
    ahead: bool = False

    def text(self) -> str:
        return f"领先（> {self.ratio:.1f}×）" if self.ahead else f"≥ {self.ratio:.1f}×"

    def met(self, ratio: float) -> bool:
        return ratio > self.ratio if self.ahead else ratio >= self.ratio


def measure(label: str, fn: Callable[[], float | None]) -> Peer:
    """跑一个对照组；没装（fn 返回 None）或失败都不抛出，只记下一行中文原因。"""
    try:
        rate = fn()
    except Exception as exc:  # 对照组失败不能拖垮其余基准
        reason = " ".join(str(exc).split())[-300:] or type(exc).__name__
        return Peer(label, None, f"失败，已跳过：{reason}")
    if rate is None:
        return Peer(label, None, "未安装，已跳过（pip install -r requirements-bench.txt）")
    return Peer(label, rate)


# 我们与主要对照组交替跑几轮：这台 2 核机器的速度几小时里能差一倍（bench/README.md），单次测量的比值会跟着
# 机器漂；交替、每轮对调先后、各取中位数，比值才是同一时段里的比较。
ROUNDS = 3


def measure_alternating(
    rounds: int,
    ours: Callable[[int], float],
    peers: list[tuple[str, Callable[[int], float | None], bool]],
) -> tuple[float, tuple[float, ...], list[Peer]]:
    """我们与对照组交替跑 rounds 轮，返回（我们的中位数，我们每轮的速率，对照组列表）。

    peers 的每项是（名称，fn(round)，是否每轮都跑）：每轮都跑的与我们交替，偶数轮我们先跑、奇数轮对照先跑，
    抵消"先跑的吃到更凉的机器"；只跑一轮的（领先幅度大、又慢的对照，如 DBOS）只在第 0 轮跑。某个对照第一次
    就没装或失败，之后不再重试。Peer.rate 是它各轮速率的中位数，samples 是各轮读数。
    """
    ours_samples: list[float] = []
    samples: dict[str, list[float]] = {label: [] for label, _, _ in peers}
    failed: dict[str, Peer] = {}

    def run_peers(round_index: int) -> None:
        for label, fn, every_round in peers:
            if label in failed or (round_index > 0 and not every_round):
                continue
            peer = measure(label, functools.partial(fn, round_index))
            if peer.rate is None:
                failed[label] = peer
            else:
                samples[label].append(peer.rate)

    for round_index in range(rounds):
        if round_index % 2 == 0:
            ours_samples.append(ours(round_index))
            run_peers(round_index)
        else:
            run_peers(round_index)
            ours_samples.append(ours(round_index))
    results = [
        failed.get(label) or Peer(label, statistics.median(samples[label]), samples=tuple(samples[label]))
        for label, _, _ in peers
    ]
    return statistics.median(ours_samples), tuple(ours_samples), results


def print_rounds(ours_label: str, ours_samples: tuple[float, ...], peers: list[Peer]) -> None:
    """每轮读数一行：看得出比值是稳定的，还是被某一轮的机器快慢带偏。"""

    def fmt(values: tuple[float, ...]) -> str:
        return " / ".join(f"{v:,.0f}" for v in values)

    parts = [f"{ours_label} {fmt(ours_samples)}"]
    parts += [f"{peer.label} {fmt(peer.samples)}" for peer in peers if len(peer.samples) > 1]
    print(f"  每轮读数（交替 {len(ours_samples)} 轮，取中位数）：" + "；".join(parts))


def run_script(name: str, args: list[str], *, timeout: float = 900, what: str) -> float:
    """在子进程里跑 bench/<name>，取标准输出最后一行作为速率（任务/秒）。"""
    try:
        result = subprocess.run(
            [sys.executable, str(HERE / name), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{what} 超过 {timeout:.0f} 秒没跑完") from exc
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0 or not lines:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["（没有输出）"]
        raise RuntimeError(f"{what} 退出码 {result.returncode}：{tail[0].strip()}")
    return float(lines[-1])


def print_peer_line(
    label: str, peer: Peer, ours: float | None, goal: Goal | None, unit: str = "任务/秒"
) -> None:
    if peer.rate is None:
        print(f"  {label}：{peer.note}")
        return
    line = f"  {label}：{peer.rate:,.0f} {unit}"
    if ours is not None:
        line += f"   比值 {ours / peer.rate:.2f}×"
        if goal is not None:
            line += f"（目标：{goal.text()}）"
    print(line)


def print_summary(
    backend: str,
    ours_label: str,
    ours: float | None,
    peers: list[Peer],
    goals: dict[str, Goal],
    extra: tuple[tuple[str, str, bool | None], ...] = (),
) -> None:
    """打印一个后端的汇总表：每个对照一行；extra 是 (项目, 目标, 是否达成) 的附加行。"""
    print(f"\n汇总（{backend}；同一次运行、同一台机器，2 路并发、空任务、保留结果）")
    print("| 后端 | 我们 | 对照 | 对照速率 | 比值 | 目标 | 结论 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    ours_text = f"{ours_label} {ours:,.0f}/s" if ours is not None else f"{ours_label} 未测出"
    for peer in peers:
        goal = goals.get(peer.label)
        goal_text = goal.text() if goal else "—"
        if peer.rate is None or ours is None:
            why = peer.note if peer.rate is None else "我们这一侧未测出"
            print(f"| {backend} | {ours_text} | {peer.label} | — | — | {goal_text} | 未测（{why}） |")
            continue
        ratio = ours / peer.rate
        verdict = "—" if goal is None else ("达成" if goal.met(ratio) else "未达成")
        cells = [backend, ours_text, peer.label, f"{peer.rate:,.0f}/s", f"{ratio:.2f}×", goal_text, verdict]
        print("| " + " | ".join(cells) + " |")
    for item, goal_text, passed in extra:
        verdict = "未测" if passed is None else ("达成" if passed else "未达成")
        print(f"| {backend} | {item} | — | — | — | {goal_text} | {verdict} |")


def verdict(passed: bool) -> str:
    return "达成" if passed else "未达成"


def postgres_reachable(dsn: str, what: str) -> bool:
    """连得上 dsn 就返回 True；连不上时打印一行中文说明（跳过 what）并返回 False。"""
    import psycopg

    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        reason = " ".join(str(exc).split())[:200]
        print(
            f"连不上 Postgres（{reason}）：跳过 {what}；"
            "请检查服务器是否在运行、CHONGMING_TEST_POSTGRES 是否正确"
        )
        return False
    return True


def with_database(dsn: str, name: str) -> str:
    """把连接串里的库名换成 name（同一台服务器、同样的用户与参数）。"""
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


@contextmanager
def throwaway_database(dsn: str, prefix: str) -> Iterator[str]:
    """在 dsn 所在的服务器上建一个一次性数据库，用完 DROP（WITH FORCE 断开残留连接）。"""
    import psycopg

    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(dsn, name)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
