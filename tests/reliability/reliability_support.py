"""可靠性套件共用的检查与记录工具（测试与子进程脚本都导入它）。

检查一律复用核心的定义：转移表来自 ``chongming_task.states.TRANSITIONS``，历史的连续性由
``StateMachine.from_snapshot`` 校验，审计入口的触发源来自 ``AUDITED_TRIGGERS``，接手的触发源与能被接手的状态
来自 ``TRIGGER_ADOPTED`` / ``ADOPTABLE_STATUSES``——这里不重新编码规则。
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chongming_task.core.state_machine import AUDITED_TRIGGERS, StateMachine
from chongming_task.core.triggers import TRIGGER_ADOPTED
from chongming_task.models import TaskSnapshot, Transition
from chongming_task.states import ADOPTABLE_STATUSES, RESOURCE_HOLDING_STATUSES, TRANSITIONS, TaskStatus
from chongming_task.storage import TaskStore


def check_history(store: TaskStore, task_id: str) -> tuple[TaskSnapshot, list[Transition]]:
    """任务的快照与历史必须自洽：历史（版本 0 之外）非空、从 pending 出发、版本 1..n 无空洞、每步衔接、
    每条记录是转移表里的边（或带审计触发源的显式入口，或持久任务的接手）、末条等于快照。返回 (快照, 历史)。"""
    snapshot = store.get(task_id)
    assert snapshot is not None, f"{task_id}: 存储里找不到快照"
    history = store.history(task_id)
    if snapshot.status_version == 0:  # 刚建、从未迁移过的任务：pending、没有历史
        assert snapshot.status is TaskStatus.PENDING and not history, (
            f"{task_id}: 版本 0 却有历史或不在 pending"
        )
        return snapshot, history
    assert history, f"{task_id}: 有快照却没有任何迁移记录（版本 {snapshot.status_version}）"
    assert history[0].from_status is TaskStatus.PENDING, f"{task_id}: 历史不是从 pending 开始：{history[0]}"
    # 连续性、衔接、与快照一致：交给状态机的构造函数（它拒绝任何不一致的历史）。
    StateMachine.from_snapshot(snapshot, history)
    for record in history:
        assert (
            record.to_status in TRANSITIONS[record.from_status]
            or record.trigger in AUDITED_TRIGGERS
            or is_adoption(record)
        ), (
            f"{task_id}: 版本 {record.version} 的 {record.from_status} -> {record.to_status} "
            f"不是转移表里的边（trigger={record.trigger!r}）"
        )
    return snapshot, history


def is_adoption(record: Transition) -> bool:
    """持久任务被接手的那条记录（``StateMachine.adopt``，用户指南 §9.9）：触发源 ``cluster:adopted``、起止
    状态相同、且是能被接手的状态。三条都要满足——别的触发源的"原地迁移"、占着资源的任务被"接手"都仍然拒绝。"""
    return (
        record.trigger == TRIGGER_ADOPTED
        and record.from_status is record.to_status
        and record.from_status in ADOPTABLE_STATUSES
    )


def expected_reconcile(snapshots: Iterable[TaskSnapshot]) -> tuple[set[str], set[str]]:
    """用户指南 §9.5 的规则表（租约已全部过期时）：占着执行资源 → LOST，其余非终态 → adoptable。"""
    lost: set[str] = set()
    adoptable: set[str] = set()
    for snapshot in snapshots:
        if snapshot.is_terminal:
            continue
        (lost if snapshot.status in RESOURCE_HOLDING_STATUSES else adoptable).add(snapshot.task_id)
    return lost, adoptable


@dataclass(frozen=True)
class CommandRow:
    command_id: str
    task_id: str
    claimant: str | None
    deliveries: int
    completed: bool


def peek_commands(url: str) -> list[CommandRow]:
    """直接读指令表（契约没有"列出全部指令"的方法；这是测试对存储内部的只读窥视）。"""
    if url.startswith("sqlite"):
        path = url.split("sqlite:///", 1)[1] if url.startswith("sqlite:///") else url.split("sqlite:", 1)[1]
        conn = sqlite3.connect(path, timeout=30)
        try:
            rows = conn.execute(
                "SELECT command_id, task_id, claimant, deliveries, completed_at IS NOT NULL FROM commands"
            ).fetchall()
        finally:
            conn.close()
    else:
        from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

        import psycopg

        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        schema = query.pop("schema")
        dsn = urlunsplit(parts._replace(query=urlencode(query)))
        with psycopg.connect(dsn, autocommit=True) as conn:
            columns = "command_id, task_id, claimant, deliveries, completed_at IS NOT NULL"
            rows = conn.execute(f'SELECT {columns} FROM "{schema}".commands').fetchall()
    return [CommandRow(str(r[0]), str(r[1]), r[2], int(r[3]), bool(r[4])) for r in rows]


def wait_until(predicate: Callable[[], Any], timeout: float) -> bool:
    """每 20 毫秒看一次 predicate，最多等 timeout 秒；返回最后一次的结果是否为真。"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def server_sessions(dsn: str, application_name: str) -> list[str]:
    """服务器上某个 ``application_name`` 的会话状态（``pg_stat_activity.state``，排好序）。"""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT state FROM pg_stat_activity WHERE application_name = %s ORDER BY state",
            [application_name],
        ).fetchall()
    return [str(r[0]) for r in rows]


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def report(figures_dir: Path, name: str, figures: dict[str, Any]) -> Path:
    """把数字写成 JSON 并打印一行摘要（-s 时直接可见；否则出现在 -rA 的 captured stdout 里）。"""
    path = figures_dir / f"{name}.json"
    path.write_text(json.dumps(figures, ensure_ascii=False, indent=2, default=str), encoding="utf-8")
    print(f"\n[reliability] {name}: {json.dumps(figures, ensure_ascii=False, default=str)}")
    print(f"[reliability] {name}: 数据已写入 {path}")
    return path


def rss_bytes() -> int:
    """本进程的常驻内存（/proc/self/statm 第二列 × 页大小）。"""
    import os

    with open("/proc/self/statm", encoding="ascii") as handle:
        resident_pages = int(handle.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")
