"""InMemoryTaskStore 基准：一个任务完整生命周期的吞吐（create、4 次带迁移记录的 save、10 次 touch、get）。

    python bench/bench_memory_store.py

同一次运行里量两条基线再量我们，打印比值：

* 下限基线：一把锁 + dict 直接赋值，不校验、不复制——任何正确实现都不可能比它快。
* 朴素基线：每次读写都把整份快照 to_dict / JSON / from_dict 走一遍（"最省事的深拷贝"）。
  InMemoryTaskStore 只对容器型 outcome 做 JSON，应明显快于它。

只打印数字，不判对错。
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from chongming_task.models import Progress, TaskSnapshot, Transition
from chongming_task.states import TaskStatus
from chongming_task.stores.memory import InMemoryTaskStore

S = TaskStatus
T0 = datetime(2026, 1, 1, tzinfo=UTC)
LIFECYCLE = [S.QUEUED, S.STARTING, S.RUNNING, S.SUCCEEDED]
TOUCHES = 10
TASKS = 5000


def _steps(snapshot: TaskSnapshot) -> list[tuple[TaskSnapshot, Transition, int]]:
    out = []
    for status in LIFECYCLE:
        version = snapshot.status_version + 1
        at = T0 + timedelta(seconds=version)
        changes: dict[str, object] = {"status": status, "status_version": version}
        if status is S.SUCCEEDED:
            changes.update(outcome={"rows": 120, "files": ["a.csv", "b.csv"]}, finished_at=at)
        record = Transition(snapshot.task_id, snapshot.status, status, "bench", None, None, version, at)
        out.append((snapshot.evolve(**changes), record, version - 1))
        snapshot = out[-1][0]
    return out


class _Floor:
    """下限基线：锁 + dict。"""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict[str, TaskSnapshot] = {}
        self.history: dict[str, list[Transition]] = {}

    def create(self, snapshot: TaskSnapshot) -> None:
        with self.lock:
            self.rows[snapshot.task_id] = snapshot
            self.history[snapshot.task_id] = []

    def save(self, snapshot: TaskSnapshot, *, expect_version: int, transitions: list[Transition]) -> None:
        with self.lock:
            self.rows[snapshot.task_id] = snapshot
            self.history[snapshot.task_id].extend(transitions)

    def touch(self, task_id: str, *, progress: Progress) -> bool:
        with self.lock:
            self.rows[task_id] = self.rows[task_id].evolve(progress=progress)
            return True

    def get(self, task_id: str) -> TaskSnapshot | None:
        with self.lock:
            return self.rows.get(task_id)


class _Naive(_Floor):
    """朴素基线：整份快照经 JSON 存取。"""

    def __init__(self) -> None:
        super().__init__()
        self.texts: dict[str, str] = {}

    def create(self, snapshot: TaskSnapshot) -> None:
        with self.lock:
            self.texts[snapshot.task_id] = json.dumps(snapshot.to_dict())
            self.history[snapshot.task_id] = []

    def save(self, snapshot: TaskSnapshot, *, expect_version: int, transitions: list[Transition]) -> None:
        text = json.dumps(snapshot.to_dict())
        with self.lock:
            current = json.loads(self.texts[snapshot.task_id])
            if current["status_version"] != expect_version:
                raise RuntimeError("conflict")
            self.texts[snapshot.task_id] = text
            self.history[snapshot.task_id].extend(transitions)

    def touch(self, task_id: str, *, progress: Progress) -> bool:
        with self.lock:
            data = json.loads(self.texts[task_id])
            data["progress"] = progress.to_dict()
            self.texts[task_id] = json.dumps(data)
            return True

    def get(self, task_id: str) -> TaskSnapshot | None:
        with self.lock:
            text = self.texts.get(task_id)
        return None if text is None else TaskSnapshot.from_dict(json.loads(text))


def _run(
    store: object, plans: list[tuple[TaskSnapshot, list[tuple[TaskSnapshot, Transition, int]]]]
) -> float:
    create: Callable[..., None] = store.create  # type: ignore[attr-defined]
    save: Callable[..., None] = store.save  # type: ignore[attr-defined]
    touch: Callable[..., bool] = store.touch  # type: ignore[attr-defined]
    get: Callable[[str], TaskSnapshot | None] = store.get  # type: ignore[attr-defined]
    progress = [Progress(done=i, total=TOUCHES) for i in range(TOUCHES)]
    started = time.perf_counter()
    for base, steps in plans:
        create(base)
        for i, (snapshot, record, expect) in enumerate(steps):
            save(snapshot, expect_version=expect, transitions=[record])
            if i == 2:  # running：进度上报
                for p in progress:
                    touch(base.task_id, progress=p)
        get(base.task_id)
    return time.perf_counter() - started


def main() -> None:
    plans = []
    for i in range(TASKS):
        base = TaskSnapshot(
            task_id=f"bench-{i}", name="bench", created_at=T0, tags=frozenset({"io"}), bucket=i % 16
        )
        plans.append((base, _steps(base)))
    results = {}
    for label, factory in (
        ("floor", _Floor),
        ("naive-json", _Naive),
        ("InMemoryTaskStore", InMemoryTaskStore),
    ):
        best = min(_run(factory(), plans) for _ in range(3))
        results[label] = best
        print(f"{label:>18}: {TASKS / best:10.0f} 任务生命周期/秒  （{best * 1e6 / TASKS:6.1f} µs/任务）")
    ours = results["InMemoryTaskStore"]
    print(f"InMemoryTaskStore / 下限基线 耗时比 = {ours / results['floor']:.2f}（越接近 1 越好）")
    print(
        f"朴素 JSON 基线 / InMemoryTaskStore 耗时比 = {results['naive-json'] / ours:.2f}（>1 表示我们更快）"
    )


if __name__ == "__main__":
    main()
