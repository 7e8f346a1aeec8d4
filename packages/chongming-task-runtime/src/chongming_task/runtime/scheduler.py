"""SlotScheduler：Controller 的执行额度账本与就绪队列（纯数据结构，不含线程）。

三种额度叠加：全局槽位（max_parallel）、每桶额度（max_parallel_per_bucket）、按标签的具名资源
额度（ConcurrencyPolicy.limits）。优先级高者先走，同优先级先进先出。

"扫描而不是取队首"：队首若被某个满了的资源（桶或标签）挡住，不让它堵住后面的任务——把它挂到
那个资源的等待堆上，继续看下一个。资源释放时只从它自己的等待堆里取回与空出额度相当的条目，
所以每次调度的代价与队列总长度无关（只有对数级的堆操作），积压 5 万个任务也不会变慢。

线程安全由调用方（Controller 的锁）负责。
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping

# 资源标识：("bucket", 桶号) 或 ("tag", 标签名)。
Resource = tuple[str, object]


# 堆里放 (-优先级, 序号, task_id, 要占的资源)：比较只落在前两个 int 上（C 里完成；序号唯一，永远比不到
# 后两项），不像 order=True 的 dataclass 那样每次比较都调一次 Python 写的 __lt__（出入堆各要比 log n 次）。
# 一个平坦的元组而不是"元组 + 条目对象"：里面只有 int、str 与（多半是共用的空）元组，循环 GC 第一次扫到
# 它就不再追踪它——10 万个排队任务就少 20 万个每次全量回收都要扫的对象（issue 17）。
_Item = tuple[int, int, str, tuple[Resource, ...]]


class SlotScheduler:
    """就绪队列 + 额度账本。``enqueue`` 排队，``take_runnable`` 取出可以启动的任务并预占额度，
    ``release`` 归还额度。暂停的任务不调用 ``release``：暂停不释放执行槽，也不释放资源名额。"""

    def __init__(
        self,
        *,
        max_parallel: int | None,
        tag_limits: Mapping[str, int] | None = None,
        per_bucket: int | None = None,
    ) -> None:
        self.max_parallel = max_parallel
        self.tag_limits = dict(tag_limits or {})
        self.per_bucket = per_bucket
        # 额度只有全局的 max_parallel（没有标签额度、每桶额度）：两种额度在构造之后都不变，算一次。
        self._global_only = not self.tag_limits and per_bucket is None
        self._seq = itertools.count()
        self._ready: list[_Item] = []
        self._parked: dict[Resource, list[_Item]] = {}
        # task_id -> 有效条目的 token。出队/丢弃时删除；堆里残留的旧条目靠 token 识别并跳过（惰性删除）。
        self._queued: dict[str, int] = {}
        self._active: dict[str, tuple[Resource, ...]] = {}
        self._usage: dict[Resource, int] = {}
        self._dirty: set[Resource] = set()
        # 派发冻结的层数（close / stop_all 的扫荡期间 > 0）：冻结时 take_runnable 一个都不取。
        # 为什么需要：扫荡中每停掉一个在跑的任务就让出一个槽，不冻结的话让出的槽会立刻交给下一个
        # 排队任务、把它的任务体跑起来——排队中的任务"不会真的执行任务体"（用户指南 §8.3）就不成立了。
        self._frozen = 0
        # worker 为一次"认领并开始"预留的执行槽数（hold / occupy / unhold）：认领的那次往返期间，本地提交的
        # 任务不能把这几个槽拿走——认领来的任务在存储里已是 starting，不能再回头排队等槽。
        self._held = 0

    # -- dispatch freeze ----------------------------------------------------------------------------

    def freeze(self) -> None:
        """冻结派发（可嵌套）：之后 ``take_runnable`` 返回空，排队、让出额度照常记账。"""
        self._frozen += 1

    def thaw(self) -> None:
        """撤销一层冻结。调用方随后应当 ``take_runnable`` 一次，把冻结期间攒下的空槽派发出去。"""
        if self._frozen > 0:
            self._frozen -= 1

    @property
    def frozen(self) -> bool:
        return self._frozen > 0

    # -- accounting ---------------------------------------------------------------------------------

    def _capacity(self, resource: Resource) -> int | None:
        kind, key = resource
        if kind == "bucket":
            return self.per_bucket
        if kind == "tag":
            return self.tag_limits.get(str(key))
        return None  # "bucket_any"：只计数，不限额

    def _is_full(self, resource: Resource) -> bool:
        capacity = self._capacity(resource)
        return capacity is not None and self._usage.get(resource, 0) >= capacity

    def resources_for(self, bucket: int | None, tags: Iterable[str]) -> tuple[Resource, ...]:
        """一个任务要占的受限资源：有每桶额度时占它的桶，加上每个写进 limits 的标签。"""
        if not self.tag_limits and self.per_bucket is None:
            return ()  # 最常见的配置：只有全局槽位
        resources: list[Resource] = []
        if self.per_bucket is not None and bucket is not None:
            resources.append(("bucket", bucket))
        resources.extend(("tag", tag) for tag in sorted(tags) if tag in self.tag_limits)
        return tuple(resources)

    @property
    def active_count(self) -> int:
        return len(self._active)

    @property
    def queued_count(self) -> int:
        return len(self._queued)

    def is_active(self, task_id: str) -> bool:
        return task_id in self._active

    def is_queued(self, task_id: str) -> bool:
        return task_id in self._queued

    def usage(self, resource: Resource) -> int:
        return self._usage.get(resource, 0)

    def active_in_bucket(self, bucket: int) -> int:
        """某桶当前占用的执行槽数（无论有没有每桶额度都如实计数）。"""
        return self._usage.get(("bucket_any", bucket), 0)

    # -- queue operations ---------------------------------------------------------------------------

    def enqueue(self, task_id: str, *, priority: int, bucket: int | None, tags: Iterable[str]) -> None:
        if task_id in self._queued or task_id in self._active:
            return
        # 只有全局槽位时（最常见）不为算出一个空元组调用 resources_for（结果相同）。
        resources = () if self._global_only else self.resources_for(bucket, tags)
        token = next(self._seq)
        # 记下所在桶（不参与额度判定），供 active_in_bucket 统计。
        tracked = (*resources, ("bucket_any", bucket)) if bucket is not None else resources
        self._queued[task_id] = token
        heapq.heappush(self._ready, (-priority, token, task_id, tracked))

    def discard(self, task_id: str) -> bool:
        """从队列中撤下（排队中被停止、暂停、取消）。堆里的条目惰性删除。"""
        return self._queued.pop(task_id, None) is not None

    def _first_full(self, resources: tuple[Resource, ...]) -> Resource | None:
        for resource in resources:
            if self._is_full(resource):
                return resource
        return None

    # -- slots held for a claim-and-start (runtime/worker.py) ---------------------------------------

    @property
    def only_global_limit(self) -> bool:
        """额度只有全局的 max_parallel（没有标签额度、每桶额度）：认领来的任务不会因别的额度满了而要排队。"""
        return self._global_only

    def hold(self, count: int) -> None:
        """为认领预留 ``count`` 个执行槽（调用方已按空闲槽数算好）：之后 ``take_runnable`` 不会把它们派给
        本地排队的任务。"""
        self._held += count

    def occupy(self, task_id: str, *, bucket: int | None, tags: Iterable[str]) -> None:
        """一个预留的槽交给认领并开始了的任务：它不经排队，直接记为在跑、占上额度。"""
        assert self._held > 0 and task_id not in self._active and task_id not in self._queued
        self._held -= 1
        resources = self.resources_for(bucket, tags)
        self._active[task_id] = (*resources, ("bucket_any", bucket)) if bucket is not None else resources
        for resource in self._active[task_id]:
            self._usage[resource] = self._usage.get(resource, 0) + 1

    @property
    def held_count(self) -> int:
        """此刻为认领预留、还没交出去的执行槽数（几次认领可以同时在进行，各自预留各自的）。"""
        return self._held

    def unhold(self, count: int) -> None:
        """放掉一次认领还没交出去的 ``count`` 个预留槽（认领到的比预留的少）。调用方随后应当
        ``take_runnable`` 一次。只放这一次认领自己剩下的：别的认领可能正同时预留着它们的槽。"""
        assert 0 <= count <= self._held
        self._held -= count

    def _unpark(self) -> bool:
        """把有空余额度的资源的等待条目放回就绪堆；返回是否移动了条目。"""
        moved = False
        for resource in list(self._dirty):
            waiting = self._parked.get(resource)
            capacity = self._capacity(resource)
            if not waiting or capacity is None:
                self._dirty.discard(resource)
                continue
            free = capacity - self._usage.get(resource, 0)
            if free <= 0:
                self._dirty.discard(resource)
                continue
            while waiting and free > 0:
                item = heapq.heappop(waiting)
                if self._queued.get(item[2]) != item[1]:
                    continue  # 已被丢弃的旧条目
                heapq.heappush(self._ready, item)
                free -= 1
                moved = True
            if not waiting:
                del self._parked[resource]
                self._dirty.discard(resource)
        return moved

    def take_runnable(self) -> list[str]:
        """取出现在就能启动的任务（按优先级），并为它们预占全部额度。"""
        # 全局额度满了没有（在跑的 + 为认领预留的 ≥ max_parallel）：每个任务至少判三次，就地算、不另调函数。
        limit = self.max_parallel
        active = self._active
        if self._frozen or (limit is not None and len(active) + self._held >= limit):
            # 冻结或全局额度已满：什么也取不出（满的时候下面的循环也是一个不取就返回，不去放回等待条目）。
            # 逐个提交的任务多半在槽位全满时到来，每个都要问一次（issue 17）。
            return []
        started: list[str] = []
        while True:
            while self._ready and (limit is None or len(active) + self._held < limit):
                item = heapq.heappop(self._ready)
                _, token, task_id, resources = item
                if self._queued.get(task_id) != token:
                    continue
                blocker = self._first_full(resources)
                if blocker is not None:
                    heapq.heappush(self._parked.setdefault(blocker, []), item)
                    continue
                del self._queued[task_id]
                active[task_id] = resources
                for resource in resources:
                    self._usage[resource] = self._usage.get(resource, 0) + 1
                started.append(task_id)
            if (
                (limit is not None and len(active) + self._held >= limit)
                or not self._dirty
                or not self._unpark()
            ):
                return started

    def release(self, task_id: str) -> bool:
        """归还一个已启动任务占用的全部额度（成功、失败、停止、丢失、超时、进入重试等待）。"""
        resources = self._active.pop(task_id, None)
        if resources is None:
            return False
        for resource in resources:
            remaining = self._usage.get(resource, 0) - 1
            if remaining > 0:
                self._usage[resource] = remaining
            else:
                self._usage.pop(resource, None)
            if resource in self._parked:
                self._dirty.add(resource)
        return True

    def queued_ids(self) -> list[str]:
        return list(self._queued)

    def active_ids(self) -> list[str]:
        return list(self._active)


__all__ = ["SlotScheduler"]
