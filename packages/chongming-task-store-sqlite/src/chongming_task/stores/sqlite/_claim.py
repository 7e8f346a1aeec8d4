"""SqliteTaskStore 认领持久任务（``claim_queued``，判据见 ``core/storage/claiming.py``）。

整个"挑出前 N 个 → 写上持有者 → 读回"在一个 ``BEGIN IMMEDIATE`` 写事务里：SQLite 同一时刻只有一个写事务，
所以两个进程不可能挑中同一个任务（后到的一方等写锁，拿到锁时先前认领的行已不满足 ``owner IS NULL``）。
挑选沿部分索引 ``tasks_claimable``（priority DESC, created_key, task_id）走前 N 步即止。
"""

from __future__ import annotations

import sqlite3
from typing import Any

from chongming_task.core.storage.claiming import QueuedClaim
from chongming_task.models import TaskSnapshot
from chongming_task.stores.sqlite import _codec as codec
from chongming_task.stores.sqlite import _sql

_CLAIMABLE = "status = 'queued' AND owner IS NULL AND recipe IS NOT NULL"
_ORDER = "priority DESC, created_key, task_id"


def claim_statement(request: QueuedClaim) -> tuple[str, list[Any]]:
    """挑选语句：满足判据的前 ``limit`` 个 task_id（按认领顺序）。"""
    params: list[Any] = []
    clauses = [_CLAIMABLE, _sql.in_clause("name", request.names, params)]
    if request.buckets is not None:
        clauses.append(_sql.in_clause("bucket", request.buckets, params))
    params.append(request.limit)
    return f"SELECT task_id FROM tasks WHERE {' AND '.join(clauses)} ORDER BY {_ORDER} LIMIT ?", params


def claim(conn: sqlite3.Connection, request: QueuedClaim) -> list[TaskSnapshot]:
    """在调用方开好的写事务里认领（见模块说明）。"""
    select, params = claim_statement(request)
    ids = [row[0] for row in conn.execute(select, params).fetchall()]
    if not ids:
        return []
    until = request.lease_until
    conn.executemany(
        "UPDATE tasks SET owner = ?, lease_owner = ?, lease_until = ?, lease_key = ? WHERE task_id = ?",
        [
            (request.holder, request.holder, codec.dt_text(until), codec.dt_key(until), task_id)
            for task_id in ids
        ],
    )
    order = {task_id: index for index, task_id in enumerate(ids)}
    placeholders = ", ".join("?" for _ in ids)
    rows = conn.execute(f"{_sql.TASK_SELECT} WHERE task_id IN ({placeholders})", ids).fetchall()
    snapshots = [codec.snapshot_from_row(row) for row in rows]
    snapshots.sort(key=lambda snapshot: order[snapshot.task_id])
    return snapshots


__all__ = ["claim", "claim_statement"]
