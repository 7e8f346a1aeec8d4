"""崩溃矩阵：工作节点在生命周期的随机时刻被 SIGKILL，之后存储必须自洽、可恢复。

每个存储（SQLite 文件、Postgres）跑 56 次试验，7 种"杀在哪里"各 8 次：

* random：READY 之后的随机时刻；
* submit：第 k 次 SUBMIT 刚打印之后（提交中途）；
* save：写入最密集的阶段里的随机时刻（每次迁移都写穿，落在一次 save 事务中间的概率很高）；
* paused / stopping / retry_wait：存储里看到有任务处于该状态之后的随机几毫秒；
* command_held：工作节点认领了一条指令、还没标记完成时（它故意拖 0.12 秒才完成）。

每次之后检查：

1. 存储能重新打开；该试验的每个任务历史无空洞、从 pending 起、每步都是转移表里的边、末条等于快照；
   被杀时正在提交的那个任务要么完整存在、要么完全不存在；
2. 租约过期后 reconcile(dry_run=True) 与 reconcile() 的分类与规则表逐条一致（占资源 → LOST，
   其余非终态 → adoptable），LOST 的历史末条是 reconcile 写的，之后再没有"运行中"的任务；
   租约未过期时 reconcile 不碰它；
3. 死进程持有的、未完成的指令在指令租约过期后全部可被重新认领（deliveries 递增），
   已完成的不会再被投递。

四条试验"车道"并行（各自一个 SQLite 文件 / 一个 Postgres schema）。一次试验的大半是等：等杀的时机、等存储
静止、等任务租约与指令租约（1 秒）过期——测试进程与工作节点合起来只用一个核的一小部分（两条车道时 CPU 约是
墙钟的 15%），所以四条车道把每个矩阵的墙钟减半（第十六轮：SQLite 53 → 24 秒），试验数与检查不变。

另有一组"进程执行器监督进程"试验（issue 22.3）：工作节点用 ProcessExecutor（spawn / forkserver 交替），
被杀前记下它的全部后代进程（任务子进程、forkserver），被杀后除了上面三条，还要求这些后代在
``ORPHAN_EXIT_BOUND`` 秒内全部退出——存储说 ``lost`` 的任务，不许还有子进程在后台接着跑、接着写。
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prefork import python_popen
from reliability_support import check_history, expected_reconcile, peek_commands, report

from chongming_task import CommandAction, Controller, TaskStatus, open_store
from chongming_task.runtime.executors.process import ORPHAN_EXIT_BOUND
from chongming_task.runtime.reconcile import TRIGGER_RECONCILE
from chongming_task.states import NON_TERMINAL_STATUSES, RESOURCE_HOLDING_STATUSES
from chongming_task.storage import TaskQuery, TaskStore

S = TaskStatus
WORKER = Path(__file__).with_name("crash_worker.py")
LEASE_TTL = 0.5
COMMAND_LEASE = max(LEASE_TTL, 1.0)  # Controller 认领指令的租约：max(lease_ttl, 1 秒)
SCENARIOS = ("random", "submit", "save", "paused", "stopping", "retry_wait", "command_held")
TRIALS_PER_SCENARIO = 8
LANES = 4
PROCESS_LANES = 2  # 进程执行器车道：每个任务一个 spawn 的解释器，CPU 吃满；四条反而更慢（19 → 26 秒）
TARGET_TIMEOUT = 6.0


@dataclass
class Trial:
    scenario: str
    index: int
    target_hit: bool = False
    states_at_kill: collections.Counter[str] = field(default_factory=collections.Counter)
    tasks: int = 0
    lost: int = 0
    adoptable: int = 0
    commands: int = 0
    commands_held_by_dead: int = 0
    commands_redelivered: int = 0
    held_lines_not_done: int = 0
    missing_last_submit: bool = False
    descendants: int = 0
    survivors: list[int] = field(default_factory=list)
    seconds: float = 0.0


def _alive(pid: int) -> bool:
    """进程还在跑（僵尸不算：它只是还没被回收）。"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def descendants_of(pid: int) -> set[int]:
    """pid 的全部后代（按 /proc/<pid>/task/*/children 递归）。"""
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        try:
            listed = list(Path(f"/proc/{current}/task").glob("*/children"))
        except OSError:
            # 这个后代在遍历之间退出了（/proc/<pid> 已经没了）：它没有还活着的子进程要等，跳过它
            # （一次干净 CI 里见过：FileNotFoundError 出在 scandir，原来只有读 children 在 try 里）。
            continue
        for children in listed:
            try:
                pids = {int(text) for text in children.read_text().split()}
            except OSError:
                continue
            frontier.extend(pids - found)
            found |= pids
    return found


class WorkerProcess:
    """crash_worker.py 子进程 + 一个读 stdout 的线程（行事件可被等待）。"""

    def __init__(self, url: str, owner: str, prefix: str, seed: int, executor: str = "thread") -> None:
        # 经预导入的模板进程 fork（tests/support/prefork.py）：每次试验省掉解释器启动与导入，被杀的照样是
        # 一个独立的 OS 进程，READY 照样在打开存储、建好 Controller 之后才打印。
        self.proc = python_popen(
            [str(WORKER), url, owner, prefix, str(seed), str(LEASE_TTL), executor],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
        )
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.strip())
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[list[str]], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.lines):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.proc.poll() is not None:
                    return predicate(self.lines)
                self._cond.wait(remaining)
            return True

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        if self.proc.stderr is not None:
            self.stderr = self.proc.stderr.read()
            self.proc.stderr.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def tagged(self, tag: str) -> list[str]:
        with self._cond:
            return [line.split(" ", 1)[1] for line in self.lines if line.startswith(tag + " ")]


def trial_snapshots(store: TaskStore, prefix: str) -> dict[str, Any]:
    return {s.task_id: s for s in store.query() if s.task_id.startswith(prefix)}


def settle(store: TaskStore, prefix: str, timeout: float = 5.0) -> None:
    """等存储静止：该试验所有任务的版本号相隔 0.1 秒的两次读取完全相同（或超时）。"""
    deadline = time.monotonic() + timeout
    previous = None
    while time.monotonic() < deadline:
        current = {k: v.status_version for k, v in trial_snapshots(store, prefix).items()}
        if current == previous:
            return
        previous = current
        time.sleep(0.1)


def wait_for_state(store: TaskStore, prefix: str, status: TaskStatus, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    query = TaskQuery(statuses=frozenset({status}))
    while time.monotonic() < deadline:
        if any(s.task_id.startswith(prefix) for s in store.query(query)):
            return True
        time.sleep(0.01)
    return False


def console_loop(store: TaskStore, prefix: str, stop: threading.Event, rng: random.Random) -> None:
    """测试进程扮演运维控制台：随机给该试验的未终结任务写 stop / pause / resume 指令。"""
    query = TaskQuery(statuses=NON_TERMINAL_STATUSES)
    actions = [CommandAction.PAUSE, CommandAction.RESUME, CommandAction.STOP, CommandAction.PAUSE]
    while not stop.wait(rng.uniform(0.03, 0.08)):
        live = [s.task_id for s in store.query(query) if s.task_id.startswith(prefix)]
        if not live:
            continue
        action = rng.choice(actions)
        payload = {"timeout": 0.5} if action is CommandAction.PAUSE else {}
        store.submit_command(rng.choice(live), action, issuer="console", reason="崩溃矩阵", payload=payload)


def run_trial(
    url: str, lane: int, index: int, scenario: str, console_store: TaskStore, executor: str = "thread"
) -> Trial:
    started = time.monotonic()
    trial = Trial(scenario, index)
    rng = random.Random(1000 * lane + index)
    owner = f"dead-{lane}-{index}"
    prefix = f"L{lane}T{index:03d}-"
    worker = WorkerProcess(url, owner, prefix[:-1], rng.randrange(1 << 30), executor)
    stop_console = threading.Event()
    console = threading.Thread(
        target=console_loop, args=(console_store, prefix, stop_console, random.Random(index)), daemon=True
    )
    try:
        assert worker.wait_for(lambda lines: "READY" in lines, 30), f"工作节点没有就绪：{worker.lines}"
        console.start()
        if scenario == "random":
            time.sleep(rng.uniform(0.0, 1.5))
            trial.target_hit = True
        elif scenario == "submit":
            k = rng.randint(1, 12)
            trial.target_hit = worker.wait_for(
                lambda lines: sum(line.startswith("SUBMIT ") for line in lines) >= k, TARGET_TIMEOUT
            )
            time.sleep(rng.uniform(0.0, 0.003))
        elif scenario == "save":
            time.sleep(rng.uniform(0.15, 0.9))
            trial.target_hit = True
        elif scenario in ("paused", "stopping", "retry_wait"):
            trial.target_hit = wait_for_state(console_store, prefix, S(scenario), TARGET_TIMEOUT)
            time.sleep(rng.uniform(0.0, 0.05))
        elif scenario == "command_held":

            def holding(lines: list[str]) -> bool:
                held = {line[5:] for line in lines if line.startswith("HELD ")}
                done = {line[5:] for line in lines if line.startswith("DONE ")}
                return bool(held - done)

            trial.target_hit = worker.wait_for(holding, TARGET_TIMEOUT)
            time.sleep(rng.uniform(0.0, 0.08))
    finally:
        watched = descendants_of(worker.proc.pid) if executor != "thread" else set()
        worker.kill()
        killed_at = time.monotonic()
        stop_console.set()
        console.join(timeout=10)
    if executor != "thread":
        # 监督进程死了：它的子进程（连同 forkserver）必须在界限内全部退出。
        trial.descendants = len(watched)
        while any(_alive(pid) for pid in watched) and time.monotonic() < killed_at + ORPHAN_EXIT_BOUND:
            time.sleep(0.005)
        trial.survivors = [pid for pid in watched if _alive(pid)]
        for pid in trial.survivors:  # 别让失败的试验把进程留在机器上
            os.kill(pid, signal.SIGKILL)

    # 1. 存储能打开；历史自洽。
    store = open_store(url)
    recoverer: Controller | None = None
    try:
        # 进程死了，服务器上可能还有它最后一条已经收到、正在执行的自动提交语句（Postgres 照样会提交它）：
        # 等存储里这一试验的版本号连续两次读都不再变，再拿它当"被杀那一刻"的基准。
        settle(store, prefix)
        snapshots = trial_snapshots(store, prefix)
        trial.tasks = len(snapshots)
        for task_id in snapshots:
            check_history(store, task_id)
        snapshots = trial_snapshots(store, prefix)  # 重读：上面的检查期间不会有人再写
        trial.states_at_kill.update(s.status.value for s in snapshots.values())
        submitted = worker.tagged("SUBMIT")
        missing = [t for t in submitted if t not in snapshots]
        assert missing in ([], submitted[-1:]), (
            f"除了被杀时正在提交的那个，提交过的任务都必须在存储里：{missing}"
        )
        trial.missing_last_submit = bool(missing)

        # 租约未过期的任务，reconcile 一律不碰。
        recoverer = Controller(store=store, owner=f"recoverer-{lane}")
        early = recoverer.reconcile(dry_run=True)
        probe_time = recoverer.clock.now()
        for lost in early.lost:
            before = snapshots.get(lost.task_id)
            if before is not None:
                assert before.lease_until is None or before.lease_until < probe_time

        # 2. 等任务租约与指令租约都过期。
        leases = [s.lease_until for s in snapshots.values() if not s.is_terminal and s.lease_until]
        wait_until_wall = max(leases).timestamp() + 0.05 if leases else 0.0
        time.sleep(max(0.0, wait_until_wall - time.time()))
        time.sleep(max(0.0, killed_at + COMMAND_LEASE + 0.05 - time.monotonic()))

        expected_lost, expected_adoptable = expected_reconcile(snapshots.values())
        preview = recoverer.reconcile(dry_run=True)
        assert {s.task_id for s in preview.lost if s.task_id.startswith(prefix)} == expected_lost
        assert {s.task_id for s in preview.adoptable if s.task_id.startswith(prefix)} == expected_adoptable
        unchanged = trial_snapshots(store, prefix)
        assert {k: v.status_version for k, v in unchanged.items()} == {
            k: v.status_version for k, v in snapshots.items()
        }, "dry_run 不许写任何状态"

        result = recoverer.reconcile()
        assert {s.task_id for s in result.lost if s.task_id.startswith(prefix)} == expected_lost
        assert {s.task_id for s in result.adoptable if s.task_id.startswith(prefix)} == expected_adoptable
        assert not [s for s in result.skipped if s.task_id.startswith(prefix)]
        trial.lost, trial.adoptable = len(expected_lost), len(expected_adoptable)
        after = trial_snapshots(store, prefix)
        for task_id, snapshot in after.items():
            _, history = check_history(store, task_id)
            assert snapshot.status not in RESOURCE_HOLDING_STATUSES, f"{task_id} 仍停在 {snapshot.status}"
            if task_id in expected_lost:
                assert snapshot.status is S.LOST and snapshot.failure is not None
                assert history[-1].trigger == TRIGGER_RECONCILE and history[-1].actor == f"recoverer-{lane}"
                assert owner in snapshot.failure.message
            else:
                assert snapshot.status_version == snapshots[task_id].status_version
        again = recoverer.reconcile()
        assert not [s for s in again.lost if s.task_id.startswith(prefix)], "第二次 reconcile 不应再有 LOST"

        # 3. 死进程持有的指令：租约过期后全部重新投递；已完成的不再投递。
        rows = [r for r in peek_commands(url) if r.task_id.startswith(prefix)]
        pending = {r.command_id: r for r in rows if not r.completed}
        held_by_dead = {cid for cid, r in pending.items() if r.claimant == owner}
        claimed = store.claim_commands(
            f"redeliver-{lane}", lease=60.0, limit=10_000, task_ids=list(after) or ["-"]
        )
        assert {c.command_id for c in claimed} == set(pending), "未完成的指令必须全部可被重新认领"
        for command in claimed:
            if command.command_id in held_by_dead:
                assert command.deliveries == pending[command.command_id].deliveries + 1
        known = {r.command_id for r in rows}
        held_not_done = set(worker.tagged("HELD")) - set(worker.tagged("DONE"))
        assert held_not_done <= known
        trial.commands = len(rows)
        trial.commands_held_by_dead = len(held_by_dead)
        trial.commands_redelivered = sum(1 for c in claimed if c.command_id in held_by_dead)
        trial.held_lines_not_done = len(held_not_done)
    finally:
        if recoverer is not None:
            recoverer.close()
        store.close()
    trial.seconds = time.monotonic() - started
    return trial


def run_matrix(
    store_kind: str,
    url_for_lane: Callable[[int, int], str],
    figures_dir: Path,
    *,
    scenarios: tuple[str, ...] = SCENARIOS,
    trials_per_scenario: int = TRIALS_PER_SCENARIO,
    executor_for: Callable[[int], str] = lambda index: "thread",
    lane_count: int = LANES,
) -> dict[str, Any]:
    plan = [(scenario, n) for n in range(trials_per_scenario) for scenario in scenarios]
    lanes: list[list[tuple[int, str]]] = [[] for _ in range(lane_count)]
    for index, (scenario, _) in enumerate(plan):
        lanes[index % lane_count].append((index, scenario))
    started = time.monotonic()

    def run_lane(lane: int) -> list[Trial]:
        results: list[Trial] = []
        console_store: TaskStore | None = None
        console_url: str | None = None
        try:
            for index, scenario in lanes[lane]:
                url = url_for_lane(lane, index)
                if url != console_url:
                    if console_store is not None:
                        console_store.close()
                    console_store, console_url = open_store(url), url
                results.append(run_trial(url, lane, index, scenario, console_store, executor_for(index)))
        finally:
            if console_store is not None:
                console_store.close()
        return results

    with ThreadPoolExecutor(max_workers=lane_count) as pool:
        trials = [t for lane_results in pool.map(run_lane, range(lane_count)) for t in lane_results]
    by_scenario: dict[str, dict[str, Any]] = {}
    for scenario in scenarios:
        group = [t for t in trials if t.scenario == scenario]
        states: collections.Counter[str] = collections.Counter()
        for t in group:
            states.update(t.states_at_kill)
        by_scenario[scenario] = {
            "trials": len(group),
            "target_hit": sum(t.target_hit for t in group),
            "tasks": sum(t.tasks for t in group),
            "lost": sum(t.lost for t in group),
            "adoptable": sum(t.adoptable for t in group),
            "states_at_kill": dict(sorted(states.items())),
        }
    figures = {
        "store": store_kind,
        "trials": len(trials),
        "seconds": round(time.monotonic() - started, 1),
        "tasks_checked": sum(t.tasks for t in trials),
        "lost": sum(t.lost for t in trials),
        "adoptable": sum(t.adoptable for t in trials),
        "killed_mid_submit": sum(t.missing_last_submit for t in trials),
        "commands": sum(t.commands for t in trials),
        "commands_held_by_dead": sum(t.commands_held_by_dead for t in trials),
        "commands_redelivered": sum(t.commands_redelivered for t in trials),
        "trials_killed_while_holding_command": sum(t.held_lines_not_done > 0 for t in trials),
        "child_processes_at_kill": sum(t.descendants for t in trials),
        "surviving_child_processes": sum(len(t.survivors) for t in trials),
        "by_scenario": by_scenario,
    }
    report(figures_dir, f"crash_matrix_{store_kind}", figures)
    return figures


def check_coverage(figures: dict[str, Any]) -> None:
    """矩阵必须真的覆盖到各个阶段，而不只是"跑了 56 次"。"""
    assert figures["trials"] >= 50
    by = figures["by_scenario"]
    for scenario in ("paused", "stopping", "retry_wait", "command_held"):
        assert by[scenario]["target_hit"] >= TRIALS_PER_SCENARIO // 2, f"{scenario} 阶段几乎没被命中：{by}"
    assert figures["lost"] > 0 and figures["adoptable"] > 0
    assert figures["commands_redelivered"] > 0, "没有任何一次试验杀在持有指令的时候"


@pytest.mark.slow
def test_crash_matrix_sqlite(tmp_path: Path, figures_dir: Path) -> None:
    figures = run_matrix(
        "sqlite", lambda lane, index: f"sqlite:///{tmp_path}/trial-{index:03d}.db", figures_dir
    )
    check_coverage(figures)


@pytest.mark.slow
@pytest.mark.postgres
def test_crash_matrix_postgres(pg_schema_factory: Callable[[str], str], figures_dir: Path) -> None:
    lane_urls = [pg_schema_factory(f"crash{lane}") for lane in range(LANES)]
    figures = run_matrix("postgres", lambda lane, index: lane_urls[lane], figures_dir)
    check_coverage(figures)


PROCESS_SCENARIOS = ("random", "save", "paused", "stopping")


@pytest.mark.slow
def test_crash_matrix_process_executor_supervisors(tmp_path: Path, figures_dir: Path) -> None:
    """ProcessExecutor 的监督进程被 SIGKILL：存储照样自洽可恢复，子进程一个都不留（issue 22.3）。"""
    figures = run_matrix(
        "sqlite_process_executor",
        lambda lane, index: f"sqlite:///{tmp_path}/proc-trial-{index:03d}.db",
        figures_dir,
        scenarios=PROCESS_SCENARIOS,
        trials_per_scenario=3,
        executor_for=lambda index: "process:forkserver" if index % 2 else "process:spawn",
        lane_count=PROCESS_LANES,
    )
    assert figures["trials"] == len(PROCESS_SCENARIOS) * 3
    assert figures["child_processes_at_kill"] > 0, f"没有一次试验杀在子进程活着的时候：{figures}"
    assert figures["lost"] > 0, figures
    assert figures["surviving_child_processes"] == 0, figures
