"""DAG 管道：把登记过的任务按依赖串起来。

语义（用户指南 §10）：

* 等待上游的节点处于 ``blocked``——一个真正的任务状态，不进待执行队列，不占并发额度。
* 汇合（逐节点）：ALL_SUCCEEDED（默认，全部上游成功才放行）、ALL_SETTLED（全部上游落终态即放行，
  用于清理/通知/汇总）、ANY_SUCCEEDED（任一上游成功即放行；全部上游都没成功 → skipped）。
  汇合条件再也不可能满足的节点落 ``skipped``（failure.kind = dependency_failed），它的下游随之判定。
* 结算（整条管道）：fail_fast()（默认）——首个真失败（failed）即取消其余已经放行、尚未落终态的
  节点（``cancelled``）；CANCELLED 本身不触发连坐。all_settled()——等全部节点落终态再统一判定。
* 管道判定：每个节点都 succeeded → succeeded；否则有 failed 或 lost → failed；否则有人工停止
  （stopped）→ stopped；其余（被连坐的 cancelled、被跳过的 skipped）→ cancelled。注意 ALL_SETTLED
  的审计节点在上游失败后照常运行，它自己成功也不会把管道"洗白"成 succeeded。

实现：每个节点记着"还差几个上游落地""有几个上游成功"，上游落地时只更新它的直接下游——
整体 O(节点 + 边)，不会在每次完成时重扫整张图。

协调在节点落终态的那个线程里、就地做（见 ``PipelineRun._on_transition``）：放行下游、跳过下游、有空额度
就地启动刚放行的第一个节点（线程执行器把它接力到本线程，串行链上每个节点不经任何线程交接）。锁的规矩：

* 监听器在落地节点自己的锁内运行。就地碰的别的节点只有"还在 blocked、还没被判定"的直接下游（判定在管道锁内
  做，判定过的节点再没人去碰）：取锁的方向永远顺着 DAG 的边（上游 → 下游），不会成环；管道锁只护计数与判定，
  持有它时不取任何别的锁。
* 放行与放行之后启动排队任务是一步（``PipelineHost.release_nodes``：一次落地判定放行的整批节点，放行完
  拿到额度的就地启动、各上各的线程（线程执行器一次结算只接力一个），整批至多叫醒后台循环一次）。就地启动与控制器
  让额度时就地启动下一个排队任务是同一个方向：持有一个刚落终态的节点的锁、去取排队任务的锁——持有排队
  任务锁的线程从不回头取已落终态的节点的锁。
* 跳过会让下游落终态、再触发它的下游：同一线程里的嵌套落地排进线程局部的队列、由最外层按顺序处理，
  一条一万个节点的链被跳过也不会递归一万层。
* 两件事仍交给宿主的后台循环（``defer``，在任何锁之外）：fail_fast 的连坐取消（要去取已放行、可能在跑的
  任意节点的锁），以及人工停止（stopped）的节点的后续判定——stop_all / close / PipelineRun.stop 正按顺序
  一个个停节点，就地跳过下游会让还没轮到的下游被记成 skipped，而它们是被人停的（stopped）。

管道结构只在内存里，不落库（任务的函数与参数从未持久化）。进程重启后跑到一半的管道无法续跑：
占着执行资源的节点会被 reconcile() 判为 lost，排队或阻塞中的节点报告为 adoptable。
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from chongming_task.core.locks import YieldingLock
from chongming_task.core.numbers import check_seconds
from chongming_task.errors import CircularDependency, ConfigurationError, TaskError
from chongming_task.models import Outcome, TaskSnapshot, Transition, validate_task_id
from chongming_task.policies import AggregationPolicy, JoinMode
from chongming_task.runtime.gc_pause import gc_paused
from chongming_task.runtime.interruptible import wait_event
from chongming_task.states import TERMINAL_STATUSES, TaskStatus

if TYPE_CHECKING:
    from chongming_task.runtime.pipeline_host import NodeFields, NodeSubmit, PipelineHost
    from chongming_task.runtime.taskrun import TaskRun

S = TaskStatus
logger = logging.getLogger(__name__)

# 每个节点落地都要比一次的成员存成模块常量：3.11 上读枚举类的属性（``S.SUCCEEDED``）经 EnumType 的
# ``__getattr__``，约 180 ns，读模块常量约 16 ns（见 bench/README.md 第十九轮 rt19）。
_SUCCEEDED = S.SUCCEEDED
_FAILED = S.FAILED
_STOPPED = S.STOPPED
_ALL_SUCCEEDED = JoinMode.ALL_SUCCEEDED
_ALL_SETTLED = JoinMode.ALL_SETTLED

GC_PAUSE_MIN_NODES = 1000
"""节点数不少于它的管道，建节点期间暂停循环 GC（同 ``Controller.submit_many``，见 runtime/gc_pause.py）。"""

# 本线程正在处理的节点落地：None 表示本线程此刻没有在处理（见 PipelineRun._on_transition）。
_draining = threading.local()


@dataclass(frozen=True)
class NodeHandle:
    """``pipeline.node(...)`` 的返回值，可放进别的节点的 ``depends_on``。"""

    pipeline: Pipeline = field(repr=False, compare=False)
    node_id: str


@dataclass
class _NodeSpec:
    node_id: str
    task_name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    depends_on: tuple[str, ...]
    join: JoinMode


class Pipeline:
    """一条 DAG 的定义（可多次提交，每次得到一个独立的 PipelineRun）。"""

    def __init__(self, name: str, *, aggregation: AggregationPolicy | None = None) -> None:
        validate_task_id(name, what="管道名")
        aggregation = aggregation if aggregation is not None else AggregationPolicy.fail_fast()
        if not isinstance(aggregation, AggregationPolicy):
            raise ConfigurationError(
                f"aggregation 必须是 AggregationPolicy.fail_fast() 或 .all_settled()，收到 {aggregation!r}"
            )
        self.name = name
        self.aggregation = aggregation
        self._nodes: dict[str, _NodeSpec] = {}
        self._name_counts: dict[str, int] = {}

    def node(
        self,
        task_name: str,
        *args: Any,
        node_id: str | None = None,
        depends_on: Iterable[NodeHandle | str] = (),
        join: JoinMode = JoinMode.ALL_SUCCEEDED,
        **kwargs: Any,
    ) -> NodeHandle:
        """加一个节点。第一个位置参数是已登记的任务名，其后才是传给任务的参数。

        ``node_id`` 省略时取任务名，同名多次自动加 ``#2`` / ``#3``；显式给出的重复 id 报错。
        """
        if not isinstance(task_name, str) or not task_name:
            raise ConfigurationError(f"node() 的第一个参数必须是已登记的任务名（字符串），收到 {task_name!r}")
        if node_id is None:
            count = self._name_counts.get(task_name, 0) + 1
            candidate = task_name if count == 1 else f"{task_name}#{count}"
            while candidate in self._nodes:
                count += 1
                candidate = f"{task_name}#{count}"
            self._name_counts[task_name] = count
            node_id = candidate
        else:
            validate_task_id(node_id, what="node_id")
            if node_id in self._nodes:
                raise ConfigurationError(f"管道 {self.name!r} 里已有节点 {node_id!r}；node_id 必须唯一")
        if not isinstance(join, JoinMode):
            try:
                join = JoinMode(join)
            except ValueError:
                raise ConfigurationError(
                    f"join 只能是 JoinMode.ALL_SUCCEEDED / ALL_SETTLED / ANY_SUCCEEDED，收到 {join!r}"
                ) from None
        if isinstance(depends_on, (str, NodeHandle)):
            depends_on = [depends_on]
        upstream: list[str] = []
        for dep in depends_on:
            if isinstance(dep, NodeHandle):
                if dep.pipeline is not self:
                    raise ConfigurationError(
                        f"节点 {node_id!r} 依赖了另一条管道（{dep.pipeline.name!r}）的节点 {dep.node_id!r}；"
                        "依赖只能指向同一条管道里的节点"
                    )
                upstream.append(dep.node_id)
            elif isinstance(dep, str):
                upstream.append(dep)
            else:
                raise ConfigurationError(f"depends_on 里只能放 node() 返回的句柄或节点 id，收到 {dep!r}")
        if node_id in upstream:
            raise CircularDependency([node_id, node_id])
        self._nodes[node_id] = _NodeSpec(
            node_id, task_name, args, dict(kwargs), tuple(dict.fromkeys(upstream)), join
        )
        return NodeHandle(self, node_id)

    @property
    def node_ids(self) -> list[str]:
        return list(self._nodes)

    def topological_order(self) -> list[str]:
        """Kahn 算法，O(节点 + 边)。有未知依赖或成环时报错（环会被完整指出）。

        一遍扫过全部节点同时查未知依赖、记入度、建下游表（报的仍是定义顺序里第一个未知依赖）；下游表只为
        有下游的节点建列表——一万个节点的管道每次提交都走这里（每节点原来约一百二十条字节码）。"""
        nodes = self._nodes
        indegree: dict[str, int] = {}
        downstream: dict[str, list[str]] = {}
        for node_id, spec in nodes.items():
            deps = spec.depends_on
            indegree[node_id] = len(deps)
            for dep in deps:
                if dep not in nodes:
                    raise ConfigurationError(f"节点 {node_id!r} 依赖的 {dep!r} 不在管道 {self.name!r} 里")
                children = downstream.get(dep)
                if children is None:
                    downstream[dep] = [node_id]
                else:
                    children.append(node_id)
        # 先进先出：同层节点保持定义顺序（建任务的先后也就是 list_tasks 的显示顺序）。
        ready = collections.deque([node_id for node_id, n in indegree.items() if not n])
        order: list[str] = []
        append = order.append
        popleft = ready.popleft
        while ready:
            current = popleft()
            append(current)
            children = downstream.get(current)
            if children is not None:
                for child in children:
                    left = indegree[child] - 1
                    indegree[child] = left
                    if not left:
                        ready.append(child)
        if len(order) != len(nodes):
            raise CircularDependency(self._find_cycle({n for n, d in indegree.items() if d > 0}))
        return order

    def _find_cycle(self, remaining: set[str]) -> list[str]:
        # 剩下的节点每个都至少有一个上游也在剩余集合里：沿上游走，必然回到走过的节点。
        start = min(remaining)
        path: list[str] = []
        seen: dict[str, int] = {}
        current = start
        while current not in seen:
            seen[current] = len(path)
            path.append(current)
            current = next(dep for dep in self._nodes[current].depends_on if dep in remaining)
        cycle = [*path[seen[current] :], current]
        cycle.reverse()  # 按依赖方向（上游 → 下游）给出
        return cycle

    def __len__(self) -> int:
        return len(self._nodes)

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}, nodes={len(self._nodes)}, aggregation={self.aggregation.mode.value})"


@dataclass(frozen=True)
class PipelineOutcome:
    """管道落地后的结果：整体判定 + 每个节点的 Outcome。"""

    status: TaskStatus
    nodes: dict[str, Outcome]

    @property
    def ok(self) -> bool:
        return self.status is S.SUCCEEDED

    @property
    def failed_nodes(self) -> list[str]:
        return [node_id for node_id, outcome in self.nodes.items() if outcome.status in (S.FAILED, S.LOST)]


def pipeline_verdict(statuses: Iterable[TaskStatus]) -> TaskStatus:
    """管道判定规则（见模块文档）。"""
    seen = set(statuses)
    if seen <= {S.SUCCEEDED}:
        return S.SUCCEEDED
    if seen & {S.FAILED, S.LOST}:
        return S.FAILED
    if S.STOPPED in seen:
        return S.STOPPED
    return S.CANCELLED


class _NodeState:
    """一个节点在这次运行里的编排状态。计数、``released`` 与 ``upstream_values`` 只在管道锁内读写
    （``released`` 之后不再有人写 ``upstream_values``：放行时把它交出去、这里置 None，交出去的字典不能再
    被改）。

    用 ``__slots__``、没有下游的共用一个空元组、只有一个下游的存一元组、没有成功上游的不建字典、放行之后不留
    字典：一万个节点的管道里每个节点少两三个被循环 GC 追踪的容器，节点状态在整条管道跑完之前一直活着，
    它挂着的容器每次全量回收都要扫一遍。"""

    __slots__ = (
        "downstream",
        "pending_upstream",
        "released",
        "spec",
        "succeeded_upstream",
        "task_id",
        "upstream_values",
    )

    def __init__(self, spec: _NodeSpec, task_id: str) -> None:
        self.spec = spec
        self.task_id = task_id
        self.downstream: tuple[str, ...] | list[str] = ()
        self.pending_upstream = len(spec.depends_on)
        self.succeeded_upstream = 0
        self.released = False
        self.upstream_values: dict[str, Any] | None = None


class PipelineRun:
    """一次提交的管道。节点是控制器里的普通任务（task_id = ``<run_id>:<node_id>``）。"""

    def __init__(self, host: PipelineHost, pipeline: Pipeline) -> None:
        self.host = host
        self.pipeline = pipeline
        self.pipeline_id = f"{pipeline.name}-{os.urandom(4).hex()}"
        self.aggregation = pipeline.aggregation
        self._nodes: dict[str, _NodeState] = {}
        self._runs: dict[str, TaskRun] = {}
        self._remaining = len(pipeline)
        self._done = threading.Event()
        # 管道锁只护计数与判定（几步字典操作，持有时不取别的锁、不做 I/O）。宽扇出里两个执行槽的线程各自落地
        # 叶子、都来抢它：普通 Lock 会在 GIL 下排成车队（每次加锁两次上下文切换，design.md §18），所以用
        # 拿不到先让出 GIL 的 YieldingLock，同控制器锁。
        self._lock = YieldingLock()
        self._fail_fast_fired = False

    @property
    def controller(self) -> PipelineHost:
        """提交这条管道的宿主（旧名，等同 ``host``）。"""
        return self.host

    # -- submission ---------------------------------------------------------------------------------

    def _submit(self) -> None:
        order = self.pipeline.topological_order()
        specs = self.pipeline._nodes
        # 每个不同的任务名确认一次（宿主每次确认要拿一次它的锁；一万个节点通常只用几个任务名）。
        for task_name in {specs[node_id].task_name: None for node_id in order}:
            self.host.resolve_task(task_name)
        if not order:
            self._done.set()
            return
        # 一大条管道的节点对象全部活着、都不是垃圾：建它们期间暂停循环 GC（同 submit_many）。
        pause = gc_paused() if len(order) >= GC_PAUSE_MIN_NODES else contextlib.nullcontext()
        with pause:
            self._create_nodes(order, specs)
        # 根节点一批放行（至多叫醒后台循环一次），有额度的就地启动。
        roots = []
        for node_id in order:
            state = self._nodes[node_id]
            if not state.spec.depends_on:
                state.released = True
                roots.append((self._runs[node_id], None))
        self.host.release_nodes(roots)

    def _create_nodes(self, order: list[str], specs: dict[str, _NodeSpec]) -> None:
        nodes = self._nodes
        prefix = f"{self.pipeline_id}:"
        for node_id in order:
            spec = specs[node_id]
            nodes[node_id] = _NodeState(spec, prefix + node_id)
            for dep in spec.depends_on:
                upstream = nodes[dep]
                downstream = upstream.downstream
                # 只有一个下游的（长链的每个节点、扇出的每个叶子）存一元组：只装字符串的元组在一次回收之后就
                # 不再被循环 GC 追踪，列表则一直被追踪、每次全量回收都要扫。第二个下游起才换成列表。
                if not downstream:
                    upstream.downstream = (node_id,)
                elif downstream.__class__ is tuple:
                    upstream.downstream = [*downstream, node_id]
                else:
                    downstream.append(node_id)  # type: ignore[union-attr]
        # 先把全部节点以 blocked 建好、挂上监听器，再放行根节点：否则一个极快的根节点可能在下游
        # 节点建好之前就落地，协调逻辑会找不到它的下游。
        label_prefix = f"{self.pipeline.name}/"
        submits: list[NodeSubmit] = []
        for node_id in order:
            spec = nodes[node_id].spec
            fields: NodeFields = {
                "task_id": nodes[node_id].task_id,
                "label": label_prefix + node_id,
                "pipeline_id": self.pipeline_id,
                "node_id": node_id,
                "upstream": {},
            }
            submits.append((spec.task_name, spec.args, spec.kwargs, fields))
        # 全部节点一次写事务落库（Controller.submit_nodes，同 submit_many）。监听器是本运行的同一个绑定方法
        # （按快照的 node_id 认节点），不为每个节点造一个闭包。
        listener = self._on_transition
        runs = self._runs
        for node_id, run in zip(order, self.host.submit_nodes(submits), strict=True):
            runs[node_id] = run
            run.machine.add_listener(listener)

    # -- coordination -------------------------------------------------------------------------------

    def _on_transition(self, snapshot: TaskSnapshot, record: Transition) -> None:
        """节点状态机的监听器（在这个节点的锁内）。落终态时就地协调它的下游（规矩见模块说明）。"""
        if record.to_status not in TERMINAL_STATUSES:
            return
        if record.to_status is _STOPPED:
            # 人工停止的后续判定交给后台循环：停止扫荡正一个个停节点，等它停完再判，没轮到的下游才会
            # 如实落 stopped 而不是被就地跳过（同原来所有判定都在后台循环里做时的顺序）。
            self.host.defer(lambda: _drain(self, snapshot))
            return
        _drain(self, snapshot)

    def _settle(self, snapshot: TaskSnapshot) -> None:
        """一个节点落了终态：在管道锁内更新它的直接下游的计数、判定谁放行 / 跳过，锁外执行判定。"""
        node_id = snapshot.node_id
        assert node_id is not None  # 管道节点的快照总带着 node_id（submit_nodes 给的）
        status = snapshot.status
        succeeded = status is _SUCCEEDED
        release: list[_NodeState] = []
        skip: list[tuple[_NodeState, str]] = []
        cancel: list[str] | None = None
        nodes = self._nodes
        outcome = snapshot.outcome
        # 每个节点落地都走：不经 with（YieldingLock 的 __enter__ / __exit__ 是两层 Python 调用，见 locks.py）
        lock = self._lock
        if not lock.try_acquire():
            lock.acquire()
        try:
            state = nodes[node_id]
            self._remaining -= 1
            finished = self._remaining == 0
            for child_id in state.downstream:
                child = nodes[child_id]
                if child.released:  # 已判定过（放行 / 跳过 / 停止）：不再改它，交出去的上游值也不再写
                    continue
                child.pending_upstream -= 1
                if succeeded:
                    child.succeeded_upstream += 1
                    values = child.upstream_values
                    if values is None:
                        child.upstream_values = {node_id: outcome}
                    else:
                        values[node_id] = outcome
                    # 上游成功时只可能放行、不可能跳过：就地按汇合规则判（同 _verdict 的放行分支），不为每个
                    # 下游调一次 _verdict（宽扇出的根节点落地要判一万个）。
                    join = child.spec.join
                    if join is _ALL_SETTLED:
                        if child.pending_upstream:
                            continue
                    elif join is _ALL_SUCCEEDED and child.succeeded_upstream != len(child.spec.depends_on):
                        continue
                    # 余下的：ALL_SUCCEEDED 全部成功了，或 ANY_SUCCEEDED（一个成功的上游就够了）
                    child.released = True
                    release.append(child)
                    continue
                reason = self._verdict(child, node_id)
                if reason is None:
                    continue
                child.released = True
                if reason:
                    skip.append((child, reason))
                else:
                    release.append(child)
            if status is _FAILED and self.aggregation.is_fail_fast and not self._fail_fast_fired:
                # 首个真失败：连坐的范围是"此刻已经放行的节点"（含这次刚判定放行的），在判定的同一次加锁里
                # 定下来；之后才放行的节点不算（同原来一次扫过全部节点的语义）。
                self._fail_fast_fired = True
                cancel = [other for other, s in nodes.items() if s.released and other != node_id]
        finally:
            lock.release()
        runs = self._runs
        if cancel is not None:
            # 这次刚判定放行的节点不就地放行（否则它可能马上被启动、赶在连坐之前跑起来）：与别的已放行节点
            # 一起交给后台循环，放行后立即取消（同原来在同一步里放行、再取消）。
            fresh = {child.spec.node_id: child.upstream_values for child in release}
            release = []
            targets = cancel
            self.host.defer(lambda: self._cancel_released(node_id, targets, fresh))
        for child, reason in skip:
            runs[child.spec.node_id].mark_dependency_failed(reason)
        if release:
            # 放行那一刻的成功上游值交给任务（TaskRun 在每次尝试开始时把它交给 ctx.input / ctx.upstream），
            # 一批放行完有空额度就在本线程里就地启动：不叫醒后台循环、再转一手（串行链上每个节点一次线程
            # 交接；宽扇出一次放行上万个下游，整批只叫醒一次）。线程执行器把在结算中启动的尝试接力到本线程。
            batch: list[tuple[TaskRun, dict[str, Any] | None]] = []
            for child in release:
                batch.append((runs[child.spec.node_id], child.upstream_values))
                # 交出去了（TaskRun.release 把它并进任务自己的字典）：放行之后没人再读写它（见 _NodeState），
                # 不让每个节点拖着一个字典活到整条管道跑完（长链里每个节点一个，都被循环 GC 追踪着）。
                child.upstream_values = None
            self.host.release_nodes(batch)
        if finished:
            self._done.set()

    @staticmethod
    def _verdict(child: _NodeState, failed_upstream: str | None) -> str | None:
        """（管道锁内）按汇合规则判定：None = 还不能定；"" = 放行；非空字符串 = 跳过，值是原因。

        ``_settle`` 只为没成功的上游调用它（上游成功时只可能放行，那一支在 ``_settle`` 里就地判，同这里的
        放行分支）；完整的规则仍都写在这里。"""
        join = child.spec.join
        if join is _ALL_SUCCEEDED:
            if failed_upstream is not None:
                return f"上游 {failed_upstream!r} 没有成功，汇合条件（全部上游成功）不可能满足"
            return "" if child.succeeded_upstream == len(child.spec.depends_on) else None
        if join is _ALL_SETTLED:
            return "" if child.pending_upstream == 0 else None
        # ANY_SUCCEEDED
        if child.succeeded_upstream > 0:
            return ""
        if child.pending_upstream == 0:
            return "全部上游都已落地，没有一个成功（汇合条件：任一上游成功）"
        return None

    def _cancel_released(
        self, cause: str, targets: list[str], fresh: dict[str, dict[str, Any] | None]
    ) -> None:
        """（后台循环，任何锁之外）fail_fast：取消失败那一刻已放行、尚未落终态的节点。"""
        reason = f"fail_fast：节点 {cause!r} 失败，取消其余已放行的节点"
        for node_id in targets:
            run = self._runs[node_id]
            if node_id in fresh:
                run.release(fresh[node_id])
            if run.machine.status.is_terminal:
                continue
            with contextlib.suppress(TaskError):  # 恰好在此刻落了终态：以它自己的结果为准
                run.cancel(reason=reason)

    # -- public API ---------------------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> PipelineOutcome:
        """等全部节点落终态。超时抛 TimeoutError，不改变任何状态。"""
        check_seconds("wait() 的 timeout", timeout, low=0.0, low_open=False, allow_none=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        if not wait_event(self._done.wait, timeout):  # 主线程按片等：Ctrl-C 立刻生效
            raise TimeoutError(f"等待管道 {self.pipeline_id!r} 超时（{timeout} 秒）；状态未改变")
        for run in self._runs.values():
            # 计完数时每个节点都已落地（协调在节点自己的落地处理之后运行）：不为已落地的节点造等待用的
            # Event。没落地的（理论上不会有）照旧等它。
            if not run.done:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                run.wait(timeout=remaining)
        return self.outcome()

    def outcome(self) -> PipelineOutcome:
        nodes = {node_id: Outcome.from_snapshot(run.snapshot) for node_id, run in self._runs.items()}
        return PipelineOutcome(status=self.status, nodes=nodes)

    def stop(self, *, reason: str | None = None) -> int:
        """人工停止整条管道：每个未落地的节点都收到停止请求（阻塞/排队中的立即落 stopped）。

        返回发出的请求数。
        """
        issued = 0
        for run in self._runs.values():
            if run.machine.can_stop:
                run.stop(reason=reason or "人工停止管道")
                issued += 1
        return issued

    @property
    def status(self) -> TaskStatus:
        """未全部落地时：有节点在占执行资源 → running，否则 → queued/blocked 里靠前的那个；落地后 → 判定。"""
        # 集合：判定只看出现过哪些状态；一万个节点时不为每个节点调一次 is_terminal，也不在列表里线性找候选。
        statuses = {run.status for run in self._runs.values()}
        if statuses and statuses <= TERMINAL_STATUSES:
            return pipeline_verdict(statuses)
        for candidate in (
            S.RUNNING,
            S.STARTING,
            S.PAUSING,
            S.STOPPING,
            S.PAUSED,
            S.RETRY_WAIT,
            S.QUEUED,
            S.BLOCKED,
        ):
            if candidate in statuses:
                return S.RUNNING if candidate in (S.STARTING, S.PAUSING, S.STOPPING) else candidate
        return S.PENDING

    @property
    def snapshot(self) -> dict[str, TaskSnapshot]:
        """每个节点的当前快照（node_id → TaskSnapshot）。"""
        return {node_id: run.snapshot for node_id, run in self._runs.items()}

    @property
    def runs(self) -> dict[str, TaskRun]:
        return dict(self._runs)

    def task_id_of(self, node_id: str) -> str:
        return self._nodes[node_id].task_id

    def __repr__(self) -> str:
        return f"PipelineRun({self.pipeline_id!r}, status={self.status.value})"


def _drain(run: PipelineRun, snapshot: TaskSnapshot) -> None:
    """处理一个节点的落地；处理中本线程里又有节点落地（跳过的下游、就地跑完的内联任务）时，排进线程局部的
    队列、由最外层这一次按顺序处理——不沿着 DAG 递归。一项出错只记日志，不挡住队列里别的项。"""
    queue: collections.deque[tuple[PipelineRun, TaskSnapshot]] | None = getattr(_draining, "queue", None)
    if queue is not None:
        queue.append((run, snapshot))
        return
    queue = _draining.queue = collections.deque([(run, snapshot)])
    try:
        while queue:
            owner, settled = queue.popleft()
            try:
                owner._settle(settled)
            except Exception:
                logger.exception("管道 %s 处理节点 %s 的落地时出错", owner.pipeline_id, settled.node_id)
    finally:
        _draining.queue = None


def submit_pipeline(host: PipelineHost, pipeline: Pipeline) -> PipelineRun:
    if not isinstance(pipeline, Pipeline):
        raise ConfigurationError(f"submit_pipeline() 需要一个 Pipeline，收到 {pipeline!r}")
    run = PipelineRun(host, pipeline)
    run._submit()
    return run


__all__ = ["NodeHandle", "Pipeline", "PipelineOutcome", "PipelineRun", "pipeline_verdict", "submit_pipeline"]
