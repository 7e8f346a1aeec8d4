"""持久层契约：TaskStore 抽象基类（值类型见 ``values``，入参校验见 ``checks``）。

五类流量刻意分开，因为写入频次与一致性要求不同：

* 快照（create / save / get / query / stats / bucket_counts）：参与乐观并发（status_version）。
* 审计轨迹（append / history）：只追加，按 (task_id, version) 幂等。
* 高频旁路（touch）：进度、心跳、租约。不碰版本号，也不与 save 冲突——save 从不改写这四个
  字段，它们只由 create（初值）与 touch 写入。否则进度上报会与状态写入持续冲突。
* 控制指令（submit_command / claim_commands / complete_command / release_command）：跨进程控制的
  媒介。取走指令带租约：持有者崩溃后租约到期，指令可被重新取走。
* 节点成员（publish_node / list_nodes / remove_node）：每个节点定期发布"我是谁、负责哪些桶、
  活到什么时候"。它是运维检查（桶重复 / 空洞、孤儿任务）的权威来源，与任务数据互不影响。
* 任务日志（append_logs / read_logs / log_stats）：``ctx.log`` 的行按旁路节奏批量写入，按任务与尝试
  读回；每任务最多 ``MAX_LOG_LINES`` 行（丢最旧的、计数），正文截断在 4 KB。随任务一起删除。
* 维护：prune（按个数）与归档保留（export_transitions / export_finished / delete_archived /
  purge_commands，按时间窗口，先归档再删除，见存储指南 §9）。

每个后端都必须通过 ``chongming_task.testing.store_contract.StoreContract``。逐条语义见
docs/store-guide.md（持久层实现指南）。
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Any, ClassVar, TypeVar

from chongming_task.core.closing import ClosesOnExit
from chongming_task.core.records import PackedTransition, unpack_transition
from chongming_task.core.storage import checks
from chongming_task.core.storage.claiming import (
    ClaimStart,
    QueuedClaim,
    check_claim,
    check_claim_start,
    start_claimed,
)
from chongming_task.core.storage.values import (
    ArchiveDeleted,
    ArchivedTask,
    ArchiveReceipt,
    ClaimRequest,
    Command,
    CommandAction,
    CommandSubmission,
    LogLine,
    LogStats,
    NodeRecord,
    PartitionArchived,
    SaveRequest,
    TaskQuery,
    TaskStats,
    TouchUpdate,
)
from chongming_task.errors import ConfigurationError, StoreError, TaskError
from chongming_task.models import Progress, TaskSnapshot, Transition

# 签名与入参检查只写在基类里的公开方法 → 后端实现的钩子（只收一个已检查的值）。
_HOOKS = {
    "save": "_save",
    "touch": "_touch",
    "submit_command": "_submit_command",
    "claim_commands": "_claim_commands",
}


def _public_override(public: str) -> Any:
    def hook(self: TaskStore, request: object) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__} 直接覆盖了 {public}，基类的 {public} 不会调用 {_HOOKS[public]}"
        )

    return hook


ArchiveWrite = Callable[[list[Transition]], None]
"""按分区归档时接收一批迁移记录的回调：返回时这批必须已经持久落盘。"""


_STARTS_ON_CLAIM: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()
"""``TaskStore.starts_on_claim`` 按类的结果（弱引用：测试里临时定义的子类用完即可回收）。"""

_SAVES_ON_CLAIM: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()
"""``TaskStore.saves_on_claim`` 里"实现 ``_claim_and_start`` 的类自己声明了 ``claim_start_saves``"
按类的结果。"""

_CLAIM_START_PARTS = (
    "claim_queued",
    "_claim_queued",
    "save",
    "_save",
    "_save_direct",
    "_save_next",
    "save_many",
)
"""``claim_queued(..., start=...)`` 的一次提交替代的那几环（见 ``TaskStore.starts_on_claim``）。"""


def _shadows(cls: type, publics: tuple[str, ...], direct: str) -> bool:
    """``cls`` 上的某个公开方法（``publics`` 之一）是否来自 MRO 里比快路径 ``direct`` 更靠前的类。

    为什么看 MRO 而不是只看 ``cls.__dict__``：改写 save 的不一定是子类自己，也可以是排在具体存储之前的
    混入类（``class Faulty(FaultMixin, SqliteTaskStore)``，混入类本身不是 TaskStore，``__init_subclass__``
    轮不到它）。只看 ``cls.__dict__`` 时这种组合的写穿会沿父类的快路径绕过混入类的 save。同一个类里两者
    都改了（各后端自己）不算：那个类的快路径本来就是为它的 save 写的。"""
    mro = cls.__mro__

    def owner(name: str) -> int:
        return next((index for index, klass in enumerate(mro) if name in klass.__dict__), len(mro))

    return min(owner(public) for public in publics) < owner(direct)


class TaskStore(ClosesOnExit, ABC):
    """持久层契约（六类流量 + 维护）。

    ``save`` / ``touch`` / ``submit_command`` / ``claim_commands`` 的签名与入参检查只写在这里：公开方法检查
    一次，把结果装成一个值（``SaveRequest`` / ``TouchUpdate`` / ``CommandSubmission`` / ``ClaimRequest``）
    交给后端实现的抽象钩子 ``_save`` / ``_touch`` / ``_submit_command`` / ``_claim_commands``（内置后端曾各抄
    一份签名与检查）。兼容：公开方法不是 final，直接覆盖公开方法的旧式第三方后端照常可用——定义子类时
    基类发现公开方法被覆盖，就不再要求对应的钩子（``__init_subclass__``）。

    实现必须线程安全；多进程共享同一存储时语义不变。
    """

    group_commit_writers: ClassVar[int] = 4
    """组提交（``save_many``）时同一进程里至多几个写事务同时进行。一次只允许一个写者的存储（SQLite）取 1：
    多开只会在存储的写锁上互相等；能并发提交的存储可以取几个，两个线程同时写时仍并行提交（Postgres 却取 1：
    与 ``group_commit_creates`` 一起，写者只有一个时提交线程的 create 才会排着、与执行槽的写合进同一批）。"""

    group_commit: ClassVar[bool] = True
    """写穿是否经组提交（``save_many`` 合批）。合批省的是提交（一次事务、一次刷盘）；内存存储的 save 只是在
    一把锁内改几个字典，没有可省的提交，取 False：写穿直接调用 ``save``（同样只在写完后返回、同样的逐项
    结果），少一层排队与唤醒。"""

    group_commit_creates: ClassVar[bool] = False
    """单个提交的 create 是否也经组提交、与同一时刻排着的 save 合进一个事务（``write_many``）。一次只允许一个
    写者的存储（SQLite）上，提交线程的 create 与执行槽的 save 本来就在写锁前排队、各占一个事务；合进同一个
    事务，每个任务少一次提交（几个被改到的页只写一次 WAL）。只有把 ``write_many`` 覆盖成一个事务的存储才
    取 True：默认实现是两个事务，合批省不下提交。"""

    calls_before_commit: ClassVar[bool] = False
    """存储是否在本线程的每个写事务里、COMMIT 之前调用 ``commit_hooks.before_commit()``（见那里）。为真时
    组提交把"一批写完、叫醒这一批里定时睡着的调用方"推迟到下一个写事务的 COMMIT 之前（那些调用方至多睡到
    自己的定时到点，没有下一个事务也照样醒来）；为假（默认）时提交完立刻叫醒。只是叫醒的时机，与持久性无关：
    调用方那一项在叫醒之前早已提交。"""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for public, hook in _HOOKS.items():
            overridden = getattr(cls, public) is not getattr(TaskStore, public)
            if overridden and getattr(getattr(cls, hook), "__isabstractmethod__", False):
                setattr(cls, hook, _public_override(public))
        if _shadows(cls, ("create",), "_create_direct"):
            # 同理：子类改了 create 却没改写穿落库的入口，父类的 _create_direct 会绕过它。
            cls._create_direct = TaskStore._create_direct  # type: ignore[method-assign]
        if _shadows(cls, ("save", "_save"), "_save_direct"):
            # 子类改了 save（包一层、注入故障、记日志……）却没改写穿入口：父类的 _save_direct 会绕过它。
            # 退回默认实现，写穿照样经过子类的 save。
            cls._save_direct = TaskStore._save_direct  # type: ignore[method-assign]
        if _shadows(cls, ("save", "_save", "_save_direct"), "_save_next"):
            # 同理：子类改了 save 或写穿入口 _save_direct，父类的 _save_next 会绕过它们。
            cls._save_next = TaskStore._save_next  # type: ignore[method-assign]
        if _shadows(cls, ("append_logs",), "_append_log_lines"):
            # 同理：子类改了 append_logs 却没改运行时的入口，父类的快路径会绕过它。
            cls._append_log_lines = TaskStore._append_log_lines  # type: ignore[method-assign]

    # -- snapshots ----------------------------------------------------------------------------------

    @abstractmethod
    def create(self, snapshot: TaskSnapshot, transitions: Sequence[Transition] = ()) -> None:
        """写入新任务（连同已有的迁移记录）。task_id 已存在 → DuplicateTaskId，什么也不写。

        旁路字段（progress / last_heartbeat_at / lease_*）以快照里的值为初值。outcome 必须能通过
        ``check_json_value``，否则 ConfigurationError，什么也不写。
        """

    def save(
        self,
        snapshot: TaskSnapshot,
        *,
        expect_version: int,
        transitions: Sequence[Transition] = (),
        lease_expired_before: datetime | None = None,
    ) -> None:
        """原子地写入快照与它新增的迁移记录。

        存储中的 status_version 不等于 expect_version → ConcurrencyConflict，什么也不写。
        ``lease_expired_before`` 给出时，写入还要求存储里的租约此刻仍已过期（lease_until 为空或早于它），
        否则同样 ConcurrencyConflict、什么也不写：reconcile 判 LOST 的写以它为条件——续租不改版本号，
        没有这个条件，一个恰好在 reconcile 读与写之间续上租约的节点会被误判（docs/distributed.md §7.3）。
        任务不存在 → TaskNotFound。不改写旁路字段（progress / last_heartbeat_at / lease_*）。
        参数自相矛盾（``validate_save`` 不通过、outcome 不是 JSON）→ ConfigurationError，什么也不写。

        入参经 ``checks.check_save`` 检查一次，后端实现 ``_save``。
        """
        self._save(checks.check_save(snapshot, expect_version, transitions, lease_expired_before))

    @abstractmethod
    def _save(self, request: SaveRequest) -> None:
        """后端实现 save 的地方（入参已检查，outcome 的 JSON 检查归后端）。"""

    def _save_direct(
        self, snapshot: TaskSnapshot, expect_version: int, transitions: Sequence[Transition]
    ) -> None:
        """写穿不经组提交时（``group_commit = False``）每次迁移调用的 save：语义、报错与
        ``save(snapshot, expect_version=..., transitions=...)`` 完全相同，默认实现就是它。

        为什么单开一个入口：公开的 save 面对任意调用方，每次都把整份快照查一遍（十来个文本字段、迁移记录查
        三遍）再装成 ``SaveRequest``。写入就在本进程、持着自己的锁完成的存储（内存存储）手里有上一版，可以
        覆盖它：在锁内相对上一版检查（``checks.check_save_since``，只查变了的字段），不造中间值。检查一项
        也不少——存不下的值、接不上的迁移记录照样 ConfigurationError、什么也不写——省的只是重复的那部分。
        要把快照与版本号交给别的进程（SQL）的存储没有"锁内的上一版"可比，保持默认。
        """
        self.save(snapshot, expect_version=expect_version, transitions=transitions)

    def _save_next(self, snapshot: TaskSnapshot, record: Transition, packed: PackedTransition) -> None:
        """写穿不经组提交时每次迁移最常见的那一次写：存储正好落后 ``record`` 这一条。语义、报错与
        ``_save_direct(snapshot, record.version - 1, (record,))`` 完全相同，默认实现就是它。

        调用方担保（同 ``_create_direct``）：``record`` 是状态机刚为 ``snapshot`` 记下的那条迁移（属于这个
        任务、版本与目标状态就是快照的），``packed`` 是它的紧凑形式（``StateMachine.last_packed``）。
        为什么单开一个入口：内存存储的历史本来就存这种元组，不必再打包一次；记录是状态机按构造接上的，不必再逐项对一遍版本
        链——可存储性、版本冲突、任务不存在、存储已关闭照样检查、照样报错。要把记录交给别的进程（SQL）的
        存储保持默认。
        """
        self._save_direct(snapshot, record.version - 1, (record,))

    def _create_direct(self, snapshot: TaskSnapshot, packed: tuple[PackedTransition, ...]) -> None:
        """写穿落库新任务时调用的 create（``WriteThrough.create``）：语义、报错与
        ``create(snapshot, [unpack_transition(snapshot.task_id, p) for p in packed])`` 完全相同，默认实现
        就是它。

        调用方担保：``packed`` 是这个任务的状态机自己的历史（``StateMachine.packed_transitions``）——每条都
        来自一条合法的迁移记录、版本从 1 起连续、属于 ``snapshot.task_id``。为什么单开一个入口：内存存储的
        历史本来就存这种紧凑元组，公开的 create 要的 Transition 是状态机现造、存储再拆回去的（每个提交一次）；
        快照照样整份检查。要把记录交给别的进程（SQL）的存储保持默认。
        """
        task_id = snapshot.task_id
        self.create(snapshot, [unpack_transition(task_id, record) for record in packed])

    def create_many(
        self, items: Sequence[tuple[TaskSnapshot, Sequence[Transition]]]
    ) -> list[TaskError | None]:
        """批量 create（``Controller.submit_many`` 用）：``[(snapshot, transitions), ...]``，返回逐项结果
        （``None`` = 写进去了；否则是这一项的 create 会抛的异常，如 DuplicateTaskId、ConfigurationError）。

        每一项的语义与单独一次 ``create`` 完全相同；一项失败不影响别的项。SQL 后端覆盖为一次事务；
        这里的默认实现逐项调用 ``create``，第三方后端不必改。整批的事务失败（连接断了、写锁超时）直接抛出
        StoreError：此时每一项都按"这次 create 结果未知"处理（调用方读回对照，见 ``save_many``）。
        """
        return [_outcome(partial(self.create, snapshot, transitions)) for snapshot, transitions in items]

    def save_many(self, requests: Sequence[SaveRequest]) -> list[TaskError | None]:
        """组提交：多个任务的 save 一次写完，返回逐项结果（``None`` = 已提交；否则是这一项单独 save 会抛的
        异常：ConcurrencyConflict、TaskNotFound、ConfigurationError）。

        * 逐项语义与 ``save`` 相同：版本不符的那一项什么也不写，**不连累同批的其他项**（它们照常提交）。
        * 整批事务本身失败（提交失败、连接断了、写锁超时）→ 抛出 StoreError：同批每一项都当作"自己的
          save 抛了这个异常"，与今天一次失败的 save 语义完全一样（结果未知，写穿层下次先读回对照，
          runtime/fencing.py）。不在这里逐项重试：故障期间逐项重试会让一批 N 项各等满一次超时。
        * SQL 后端覆盖为一次事务；默认实现逐项调用 ``save``（第三方后端不必改）。
        """
        return [_outcome(partial(self._save_one, r)) for r in requests]

    def write_many(
        self,
        creates: Sequence[tuple[TaskSnapshot, Sequence[Transition]]],
        saves: Sequence[SaveRequest],
    ) -> tuple[list[TaskError | None], list[TaskError | None]]:
        """组提交的混合批：几个新任务的 create 与几个任务的 save 一次写完，返回 (create 的逐项结果, save 的
        逐项结果)，顺序与入参相同。

        * 逐项语义与 ``create_many`` / ``save_many`` 的同一项完全相同：重复 id、版本冲突、任务不见了、存不下
          的值只是那一项的结果（什么也不写），不连累同批别的项。
        * 同一批里的 create 与 save 互不依赖：调用方（组提交）只在一个任务的 create 提交之后才会为它 save，
          所以不会有"为同批里刚建的任务 save"的项。
        * 整批事务失败 → 抛出 StoreError，每一项都按"这次写结果未知"处理（与 ``save_many`` 相同）。
        * 默认实现先 ``create_many`` 再 ``save_many``（两个事务；第三方后端不必改）；SQL 后端覆盖为一个事务，
          并把 ``group_commit_creates`` 设为 True。
        """
        created = self.create_many(creates) if creates else []
        saved = self.save_many(saves) if saves else []
        return created, saved

    def _save_one(self, r: SaveRequest) -> None:
        # lease_expired_before 只在给出时才传：没有这个参数的旧第三方后端也能用默认的 save_many。
        if r.lease_expired_before is None:
            self.save(r.snapshot, expect_version=r.expect_version, transitions=r.transitions)
        else:
            self.save(
                r.snapshot,
                expect_version=r.expect_version,
                transitions=r.transitions,
                lease_expired_before=r.lease_expired_before,
            )

    @abstractmethod
    def get(self, task_id: str) -> TaskSnapshot | None:
        """单个快照；不存在返回 None。返回的对象与存储无共享可变状态（改返回的 outcome 不影响存储）。"""

    @abstractmethod
    def query(self, query: TaskQuery | None = None) -> list[TaskSnapshot]:
        """按条件查询，语义与 ``TaskQuery.apply`` 逐条一致。"""

    @abstractmethod
    def stats(self, query: TaskQuery | None = None) -> TaskStats:
        """满足条件（忽略 limit）的任务按状态计数。"""

    @abstractmethod
    def bucket_counts(self, query: TaskQuery | None = None) -> dict[int, int]:
        """满足条件（忽略 limit）的任务按桶计数；无桶任务不计。"""

    # -- history ------------------------------------------------------------------------------------

    @abstractmethod
    def append(self, transitions: Sequence[Transition]) -> None:
        """只追加；(task_id, version) 已存在的记录被忽略（幂等，先写者为准）。

        批中有存储里不存在的任务 → TaskNotFound，整批不写（否则会留下 prune 永远删不掉的孤儿历史）。
        """

    @abstractmethod
    def history(self, task_id: str) -> list[Transition]:
        """某任务的全部迁移记录，按版本升序。"""

    # -- side channel -------------------------------------------------------------------------------

    def touch(
        self,
        task_id: str,
        *,
        progress: Progress | None = None,
        heartbeat_at: datetime | None = None,
        lease_owner: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        """更新旁路字段（None 表示不改）。不递增 status_version，不与 save 冲突。任务不存在返回 False。

        入参经 ``checks.check_touch`` 检查一次，后端实现 ``_touch``，只处理一个 ``TouchUpdate``。
        """
        update = TouchUpdate(task_id, progress, heartbeat_at, lease_owner, lease_until)
        return self._touch(checks.check_touch(update))

    @abstractmethod
    def _touch(self, update: TouchUpdate) -> bool:
        """后端实现 touch 的地方（入参已检查）。"""

    def touch_many(self, updates: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """批量 touch：``[(task_id, {"progress": ..., ...}), ...]``。后端可覆盖为一次事务。"""
        for task_id, fields in updates:
            self.touch(task_id, **fields)

    def renew_leases(self, lease_owner: str, task_ids: Iterable[str], lease_until: datetime) -> None:
        """续租：把一批任务的 ``lease_owner`` / ``lease_until`` 写成同一组值。

        每一项与 ``touch(task_id, lease_owner=..., lease_until=...)`` 相同：不递增 status_version、不与 save
        冲突、不存在的 task_id 跳过，其余字段不动。控制器每 lease_ttl/3 给全部在管的任务续租，积压十万个
        排队任务时逐项 ``touch_many``（每项一个字段字典、一次检查、一行编码）每轮就是几秒 CPU；而这批行写的
        是同一组值，后端可以覆盖 ``_renew_leases`` 为一条语句。入参在这里检查一次（持有者非空、到期时刻带
        时区、task_ids 是字符串的集合）。
        """
        ids = checks.renew_args(lease_owner, task_ids, lease_until)
        if ids:
            self._renew_leases(lease_owner, ids, lease_until)

    def _renew_leases(self, lease_owner: str, task_ids: frozenset[str], lease_until: datetime) -> None:
        """后端实现 renew_leases 的地方（入参已检查、非空）。默认逐项 touch_many：没覆盖它的第三方后端
        结果相同，只是慢些。"""
        fields = {"lease_owner": lease_owner, "lease_until": lease_until}
        self.touch_many([(task_id, fields) for task_id in sorted(task_ids)])

    # -- durable tasks (issue 19) -------------------------------------------------------------------

    def claim_queued(
        self,
        holder: str,
        *,
        names: Iterable[str],
        buckets: Iterable[int] | None = None,
        limit: int,
        lease_until: datetime,
        start: ClaimStart | None = None,
    ) -> list[TaskSnapshot]:
        """原子地认领至多 ``limit`` 个待执行的持久任务，按认领顺序返回认领之后的快照。

        判据与顺序见 ``chongming_task.core.storage.claiming``：queued、带配方、无人持有、名字在 ``names`` 里、
        桶在 ``buckets`` 里（None 不限）；priority 大的先，再按创建先后。认领写 owner / lease_owner /
        lease_until，不改状态与版本号。同一任务无论多少认领者并发来取，只有一个取得到。入参在这里检查一次，
        后端实现 ``_claim_queued``；没实现它的后端（老的第三方后端）抛 ConfigurationError，不能跑 worker。

        给了 ``start``（``ClaimStart``）时，认领到的任务在同一个事务里开始：每个都由状态机推进到 ``starting``
        （``claiming.start_claimed``：attempt + 1、started_at = ``start.at``、执行器名、queued → starting 的
        迁移记录），交回开始之后的快照；状态机不让开始的（尝试预算已用完）只认领，照不给 ``start`` 时的样子
        交回（仍是 queued）。worker 用它把"认领"与"starting"两次提交并成一次。后端实现 ``_claim_and_start``；
        默认实现是先认领、再逐个 ``save`` starting（结果相同，只是多几次提交），所以只实现了认领的后端也能用。

        ``start.save``（``SaveRequest``）给出时，认领之前同一个事务先写这次 save（worker 把刚空出的槽上那个
        任务的终态并进来）：它写不成（ConcurrencyConflict / TaskNotFound / ConfigurationError）→ 什么也不写、
        抛出它；写成了、认领取不到任务 → save 照样提交，返回空列表。事务本身失败（StoreError）时两部分都按
        结果未知处理。默认实现先 ``save``、再认领（两次提交；save 抛错就不认领）。
        """
        request = check_claim(holder, names, buckets, limit, lease_until)
        if start is None:
            return self._claim_queued(request)
        start = check_claim_start(start)
        if start.save is not None and not self.saves_on_claim:
            # 实现 _claim_and_start 的类没声明认得 start.save（老的第三方后端会把它静默丢掉——终态就丢了）：
            # 先单独 save（抛错时不认领），再照旧认领并开始。两次提交，结果与合并的写相同。
            self._save_one(start.save)
            start = ClaimStart(start.at, start.executor)
        return self._claim_and_start(request, start)

    def _claim_queued(self, request: QueuedClaim) -> list[TaskSnapshot]:
        """后端实现 claim_queued 的地方（入参已检查）。"""
        raise ConfigurationError(
            f"{type(self).__name__} 不支持持久任务的认领（没有实现 _claim_queued）：worker 需要一个实现了它的"
            "存储（内置的内存 / SQLite / PostgreSQL 存储都支持）"
        )

    def _claim_and_start(self, request: QueuedClaim, start: ClaimStart) -> list[TaskSnapshot]:
        """后端实现 ``claim_queued(..., start=...)`` 的地方（入参已检查）。默认：认领一次、starting 逐个再写
        （见 ``claim_queued``）。``start.save`` 只交给声明了 ``claim_start_saves`` 的实现
        （见 ``saves_on_claim``），这里收到的总是 None。"""
        claimed = self.claim_queued(
            request.holder,
            names=request.names,
            buckets=request.buckets,
            limit=request.limit,
            lease_until=request.lease_until,
        )
        result: list[TaskSnapshot] = []
        for snapshot in claimed:
            begun = start_claimed(snapshot, start)
            if begun is not None:
                try:
                    self.save(begun[0], expect_version=snapshot.status_version, transitions=begun[1])
                except TaskError:
                    # 认领已提交、starting 没写成（结果未知或被别的写者抢先）：交回认领到的那份，由 worker 照
                    # 旧路径开始它（它的 starting 带版本条件，不会把别人的写覆盖掉）。
                    begun = None
            result.append(snapshot if begun is None else begun[0])
        return result

    @property
    def starts_on_claim(self) -> bool:
        """这个存储的 ``claim_queued(..., start=...)`` 是不是一次提交（worker 据此决定用它，还是认领、
        starting 分开写）。

        是：类自己（或某个基类）覆盖了 ``_claim_and_start``，并且比它更下层的子类没有再改写认领或 save 的
        任何一环。为什么要看后者：合并的实现不经过 ``_claim_queued`` / ``save`` 这些方法，给它们加了料的子类
        （计数、注入故障、加闸门的测试替身、只覆盖公开方法的旧式后端）就会被绕过——这时 worker 照旧分两步写，
        子类改写的那一环仍在路径上。
        """
        kind = type(self)
        known = _STARTS_ON_CLAIM.get(kind)
        if known is None:
            # 按类记下（worker 每认领一次都问一遍，不每次把 MRO 扫一遍）。只看类字典，实例上的属性不影响它；
            # 第一次问过之后再改类字典（给类打补丁）不会被看见——与 __init_subclass__ 里的入口选择同一个前提。
            mro = kind.__mro__
            combined = next(i for i, cls in enumerate(mro) if "_claim_and_start" in cls.__dict__)
            known = mro[combined] is not TaskStore and not any(
                name in cls.__dict__ for cls in mro[:combined] for name in _CLAIM_START_PARTS
            )
            _STARTS_ON_CLAIM[kind] = known
        return known

    claim_start_saves: ClassVar[bool] = False
    """实现了 ``_claim_and_start`` 的类在自己的类体里设为 True，声明它认得 ``start.save``：在同一个事务里先写
    它（写不成就什么也不写、抛出它）。只看实现 ``_claim_and_start`` 的那个类自己的声明
    （见 ``saves_on_claim``）。"""

    @property
    def saves_on_claim(self) -> bool:
        """这个存储的 ``claim_queued(..., start=ClaimStart(save=...))`` 是不是一次提交（worker 据此决定要不要
        让空出的槽把终态与下一次认领并成一次提交：不是一次提交时并起来省不下什么，分开写的失败语义更简单）。

        是：``starts_on_claim`` 成立，并且实现 ``_claim_and_start`` 的那个类自己声明了 ``claim_start_saves``。
        为什么只认那个类自己的声明、不认继承来的：子类覆盖了 ``_claim_and_start``（不调用父类、或自己拼写）
        却不知道 ``start.save`` 时，继承来的 True 会让 save 被静默丢掉——终态就丢了；没声明时基类先单独
        save、再调用它（``claim_queued``），照样正确。
        """
        kind = type(self)
        known = _SAVES_ON_CLAIM.get(kind)
        if known is None:
            owner = next(cls for cls in kind.__mro__ if "_claim_and_start" in cls.__dict__)
            known = owner.__dict__.get("claim_start_saves", False) is True
            _SAVES_ON_CLAIM[kind] = known
        return known and self.starts_on_claim

    # -- commands -----------------------------------------------------------------------------------

    def submit_command(
        self,
        task_id: str,
        action: CommandAction | str,
        *,
        issuer: str | None = None,
        reason: str | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> Command:
        """写一条指令。任务不存在 → TaskNotFound。指令记下任务当时的桶号，供按桶认领。

        入参经 ``checks.command_args`` 检查一次，后端实现 ``_submit_command``。
        """
        verb, body = checks.command_args(task_id, action, issuer, reason, payload)
        return self._submit_command(CommandSubmission(task_id, verb, issuer, reason, body))

    @abstractmethod
    def _submit_command(self, submission: CommandSubmission) -> Command:
        """后端实现 submit_command 的地方（入参已检查，payload 的 JSON 检查归后端）。"""

    def claim_commands(
        self,
        claimant: str,
        *,
        lease: float,
        limit: int = 100,
        task_ids: Iterable[str] | None = None,
        buckets: Iterable[int] | None = None,
        holder: str | None = None,
    ) -> list[Command]:
        """取走未完成、且未被认领或租约已过期的指令（按提交先后），设租约 ``lease`` 秒。

        被取走的指令在租约内对任何认领者（包括持有者自己）不可见；``lease_until <= now`` 即过期，
        可被重新取走（deliveries 加一）。"先后"须由存储自己的顺序号决定：同一时刻提交的指令也要有序。
        ``now`` 取自存储注入的时钟（若有）。``task_ids`` / ``buckets`` 同时给出时取交集；桶为空的
        指令不会被按桶认领。``holder`` 给出时只取任务行此刻的 ``owner`` 等于它的任务的指令（在认领的
        同一事务里对照任务行：任务被 adopt 换了持有者，指令随之归新持有者；已删除的任务的指令不会被按
        持有者认领），与另两个过滤条件取交集。``lease`` 不是正的有限秒数 → ConfigurationError。

        入参经 ``checks.claim_args`` 检查一次，后端实现 ``_claim_commands``。
        """
        wanted_tasks, wanted_buckets = checks.claim_args(claimant, lease, limit, task_ids, buckets)
        wanted_holder = checks.check_holder(holder)
        return self._claim_commands(
            ClaimRequest(claimant, lease, limit, wanted_tasks, wanted_buckets, wanted_holder)
        )

    @abstractmethod
    def _claim_commands(self, request: ClaimRequest) -> list[Command]:
        """后端实现 claim_commands 的地方（入参已检查、过滤集合已规范化）。"""

    @abstractmethod
    def complete_command(self, command_id: str, claimant: str) -> bool:
        """标记执行完毕。仅当指令由 ``claimant`` 持有（或已由它完成，幂等）时返回 True。

        租约过期但尚未被别人接手时，原持有者仍可完成；一旦被别人重新取走，原持有者得到 False。
        未知的 command_id → False。
        """

    @abstractmethod
    def release_command(self, command_id: str, claimant: str) -> bool:
        """交还指令：立即可被其他认领者取走。仅当由 ``claimant`` 持有且尚未完成时返回 True。

        取到不属于自己的指令时必须交还，而不是完成——完成会让真正的持有者永远收不到它。
        """

    # -- membership ---------------------------------------------------------------------------------

    @abstractmethod
    def publish_node(self, record: NodeRecord) -> None:
        """写入（或整体替换）``record.owner`` 的成员记录：按 owner 覆盖，后写者为准。

        节点按固定节奏调用它作为心跳。不是 NodeRecord → ConfigurationError，什么也不写。
        ``buckets`` 的 None 与空集合、时间的原始时区偏移与微秒、info 里的任意 JSON 都必须原样往返。
        """

    @abstractmethod
    def list_nodes(self) -> list[NodeRecord]:
        """全部成员记录（包括已过期的），按 owner 升序（码点序，与 Python 的 str 比较一致）。

        存储不判断死活、也不自动清理过期记录：那是检查者拿自己的"现在"去判断的事。
        """

    @abstractmethod
    def remove_node(self, owner: str) -> bool:
        """删除某节点的记录（节点正常退出时调用）。删掉了返回 True，本来就没有返回 False。

        owner 不是非空字符串 → ConfigurationError。
        """

    # -- task logs (issue 18；存储指南 §11) ---------------------------------------------------------

    @abstractmethod
    def append_logs(self, lines: Sequence[LogLine]) -> None:
        """批量追加日志行（一批可跨多个任务）。存储按任务分配 ``seq``（接着该任务已分配的最大序号，
        从 1 起、不复用；入参里的 seq 被忽略），批内同一任务的行按给出的顺序编号。

        重试幂等：带身份（``writer`` / ``writer_seq``）的行，若 writer_seq 不大于该任务上这个写入者已接受的
        最大号，就是写过的，跳过——不分配 seq、不算进 dropped（``values.unseen_log_lines`` 说明为什么是水位线
        而不是唯一约束）。水位线随任务一起删除。结果未知的一批原样重试，行只写一次、不丢、不乱序。

        每任务只保留最新的 ``MAX_LOG_LINES`` 行：超出的最旧行在同一事务里删掉。存储里不存在的任务的
        行被跳过（任务可能刚被 prune 掉：日志是尽力而为，不能让一批因此整体失败）。不是 LogLine 的
        序列、正文存不下（NUL、孤立代理项）→ ConfigurationError，整批不写。
        """

    def _append_log_lines(self, lines: list[LogLine]) -> None:
        """运行时自己的日志缓冲（``runtime/task_logs.LogSink``）调用的追加入口：语义与 ``append_logs``
        完全相同（分配 seq、水位线去重、每任务上限、跳过不存在的任务），默认实现就是它。

        调用方担保：``lines`` 是一个交出所有权的 list，每一项都是合法的 ``LogLine``，正文与级别存得下（没有
        NUL、孤立代理项——缓冲造行时已转义）。为什么单开一个入口：公开的 append_logs 面对任意调用方，每批都要
        逐行查类型、查正文（``checks.append_logs_args``）；运行时每个写日志的任务至少一批，而这些行出自同一处、
        刚刚检查过。写入就在本进程完成的存储（内存存储）覆盖它，省掉重复的检查与复制；要把行交给别的进程
        （SQL）的存储，检查相对一次往返微不足道，保持默认。
        """
        self.append_logs(lines)

    @abstractmethod
    def read_logs(
        self, task_id: str, *, attempt: int | None = None, after_seq: int | None = None, limit: int = 1000
    ) -> list[LogLine]:
        """某任务仍保存的日志行，按 seq 升序：只要 ``attempt``（给出时）的、seq 严格大于 ``after_seq``
        （给出时）的，最多 ``limit`` 行（1..10000）。任务不存在返回空列表。只读。"""

    @abstractmethod
    def log_stats(self, task_id: str) -> LogStats:
        """某任务的日志计数（仍保存的行数、被丢掉的最旧行数、最后的 seq）。任务不存在返回全 0。"""

    # -- upkeep -------------------------------------------------------------------------------------

    @abstractmethod
    def prune(self, keep_terminal: int) -> int:
        """删除最旧的终态任务（按 finished_at；缺 finished_at 的视为最旧）及其历史、指令与日志，
        只保留最新 keep_terminal 个。

        绝不删除非终态任务。返回删除的任务数。keep_terminal 为负 → ConfigurationError。
        """

    # -- retention: archive-then-delete (issue 20；存储指南 §9) ---------------------------------------
    #
    # 四个方法一起实现"时间窗口保留"：存储只负责"按批导出"与"按回执删除"，归档文件、水位线与崩溃恢复
    # 由 ``chongming_task.core.archive.Archiver`` 负责。两半分开，是因为"什么算已经落盘"只有写文件的
    # 一方知道：存储绝不自己决定删什么，只删归档器交回来的那些行（``ArchiveReceipt``）。

    @abstractmethod
    def export_transitions(
        self, before: datetime, *, after: tuple[str, int] | None = None, limit: int = 1000
    ) -> list[Transition]:
        """全部任务（包括常驻的非终态任务）在线历史里"每条都早于 ``before`` 的最长前缀"，按
        ``(task_id, version)`` 升序，键集分页：``after`` 是上一批最后一条的键，``limit`` 是批大小。

        前缀规则与扫描算法见 ``chongming_task.core.storage.retention``（后端直接调用它，不要另写一份）。
        只读，不删除任何东西。``before`` 不带时区、``limit`` 不在 1..100000、``after`` 形状不对 →
        ConfigurationError。
        """

    @abstractmethod
    def export_finished(
        self, before: datetime, *, after: str | None = None, limit: int = 100
    ) -> list[ArchivedTask]:
        """``finished_at`` 早于 ``before`` 的终态任务（缺 ``finished_at`` 的按 ``created_at``），按 task_id
        升序、键集分页；每项带它仍在线的全部历史与全部指令。只读。参数错误 → ConfigurationError。
        """

    @abstractmethod
    def delete_archived(self, receipt: ArchiveReceipt) -> ArchiveDeleted:
        """删除回执里列出的、已经持久归档的行，别的一概不删；幂等（已经不在的行跳过，重放是空操作）。

        * 迁移记录按键删。
        * 指令按 id 删，但只删已完成的、或者属于回执里被整体删掉的任务的——还在等待执行的指令不能丢。
        * 任务（快照，连同它的日志行：日志不归档）只在它仍是终态、``status_version`` 与回执一致、
          并且删完回执里的行之后不再有任何迁移记录与指令时才删：否则会留下孤儿行，或者删掉一个归档之后又变化了的任务。
        * SQL 后端分成短事务（每批几百行）执行：写穿的监督进程不会被长时间挡在写锁外。
        参数不是 ArchiveReceipt → ConfigurationError。返回实际删掉的行数。
        """

    @abstractmethod
    def purge_commands(self, completed_before: datetime) -> int:
        """删除 ``completed_at`` 早于 ``completed_before`` 的已完成指令（不归档：它们只在"持有者重复
        完成"的幂等窗口内有用）。未完成的指令永远不删。返回删除条数；参数不带时区 → ConfigurationError。
        """

    # 可选能力：按时间分区的后端（PostgreSQL）可以整块归档、丢弃过期分区，代替逐行删除。默认没有分区。

    def expired_partitions(self, before: datetime) -> list[str]:
        """整个时间范围都早于 ``before`` 的迁移记录分区名，从旧到新。没有分区的后端返回 ``[]``。"""
        checks.check_aware("before", before, required=True)
        return self._expired_partitions(before)

    def _expired_partitions(self, before: datetime) -> list[str]:
        return []

    def archive_partition(
        self, name: str, before: datetime, write: ArchiveWrite, *, batch: int = 5000
    ) -> PartitionArchived:
        """把分区 ``name`` 里属于"可归档前缀"的行按批交给 ``write``（它返回时这批必须已经持久落盘），
        然后丢弃整个分区（不属于前缀的行先移回在线表）。整个过程是一个事务：``write`` 抛异常或丢弃
        不成，什么也不删（``dropped=False``），已写出的段由归档器按键逐行删除。"""
        return self._archive_partition(name, before, write, batch)

    def _archive_partition(
        self, name: str, before: datetime, write: ArchiveWrite, batch: int
    ) -> PartitionArchived:
        """分区后端覆盖它（参数检查也在那里）；默认没有分区。"""
        raise StoreError(f"{type(self).__name__} 没有迁移记录分区，不能按分区归档 {name!r}")

    @abstractmethod
    def close(self) -> None:
        """释放资源。幂等；关闭后再调用其他方法 → StoreError。"""


P = TypeVar("P")


def prepare_batch(prepare: Sequence[Callable[[], P]]) -> tuple[list[TaskError | None], list[tuple[int, P]]]:
    """``save_many`` / ``create_many`` 覆盖实现的共同前半：逐项做入参检查、准备好要执行的东西（还不碰存储）。

    返回 (逐项结果, 要执行的 (下标, 准备好的项))：检查不过的项（ConfigurationError 等）直接成为它自己的结果，
    根本不进事务；其余项的结果先是 None，由后端执行后填上。
    """
    results: list[TaskError | None] = [None] * len(prepare)
    work: list[tuple[int, P]] = []
    for index, make in enumerate(prepare):
        try:
            work.append((index, make()))
        except TaskError as exc:
            results[index] = exc
    return results, work


def _outcome(write: Callable[[], None]) -> TaskError | None:
    try:
        write()
    except TaskError as exc:
        return exc
    return None


__all__ = ["TaskStore", "prepare_batch"]
