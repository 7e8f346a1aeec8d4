"""11 最佳实践：多节点部署的完整模板（可以照抄）。

一份代码、多个节点，靠"桶归属"区分哪些任务归谁执行。本示例把两个节点放在同一个进程里（两个
Controller，各自一条 SQLite 连接，共用一个文件）；换成两台机器时只需把 SqliteTaskStore 换成
PostgresTaskStore（见 12_postgres_multinode.py），其余一行不改。

流程（每一步都带断言）：
1. 部署参数与桶划分：``buckets_for_node()`` 把 NUM_BUCKETS 个桶切成互不重叠、没有空洞的几段；
2. 任务定义：模块级 ``@task`` 函数（白名单，按名字提交）；
3. ``build_node()`` 接线：存储、owner、owned_buckets、额度、租约、任务登记；
4. 启动恢复：每个节点启动时 ``reconcile()``，只清理**自己桶里**上次崩溃留下的僵尸任务；
5. 按桶提交：业务键（租户）决定桶，桶决定节点；投错节点在提交那一刻就报错；
6. 跨节点查询与控制：任何节点都看得到全部任务；停别人的任务 = 写一条指令，由持有者执行；
7. 收尾校验：关闭节点后，存储里没有悬空的非终态任务、没有写存储失败、再跑 reconcile 无事可做。

运行：python examples/11_best_practice.py
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from chongming_task import (
    BucketPolicy,
    ConfigurationError,
    Controller,
    FixedBackoff,
    RetryPolicy,
    SqliteTaskStore,
    StateMachine,
    TaskContext,
    TaskQuery,
    TaskStatus,
    Timeout,
    render_table,
    task,
)
from chongming_task.states import NON_TERMINAL_STATUSES

S = TaskStatus

# -- 1) 部署参数与桶划分 -------------------------------------------------------------------------------

NUM_BUCKETS = 8  # 一旦开始使用就不要改：改了之后几乎所有键都会换桶
NODES = ("node-a", "node-b")


def buckets_for_node(index: int, node_count: int, num_buckets: int = NUM_BUCKETS) -> range:
    """第 index 个节点负责的桶：把 [0, num_buckets) 切成 node_count 段连续区间。"""
    if not 0 <= index < node_count <= num_buckets:
        raise ValueError(f"节点序号 {index} / 节点数 {node_count} / 桶数 {num_buckets} 不合法")
    start = index * num_buckets // node_count
    stop = (index + 1) * num_buckets // node_count
    return range(start, stop)


def node_index_for_key(bucket_key: str) -> int:
    """业务键 → 桶 → 节点。路由层（API 网关、定时器）用它决定把任务交给哪个节点提交。"""
    bucket = BucketPolicy(NUM_BUCKETS).bucket_for(bucket_key)
    return next(i for i in range(len(NODES)) if bucket in buckets_for_node(i, len(NODES)))


# -- 2) 任务定义 ---------------------------------------------------------------------------------------


@task(tags={"io"}, retry=RetryPolicy(max_attempts=3, backoff=FixedBackoff(0.05)), timeout=Timeout(idle=30))
def sync_tenant(ctx: TaskContext, tenant: str) -> None:
    """常驻同步一个租户的数据，直到被停止。"""
    batches = 0
    while True:
        ctx.checkpoint()
        batches += 1
        ctx.progress(batches, unit="batch", message=tenant)
        time.sleep(0.02)


@task(tags={"io"})
def tenant_report(ctx: TaskContext, tenant: str) -> dict[str, str]:
    """生成租户日报（短任务）。"""
    ctx.checkpoint()
    return {"tenant": tenant, "path": f"reports/{tenant}.csv"}


# -- 3) build_node()：一个节点的全部接线 ----------------------------------------------------------------


def build_node(name: str, index: int, db: str) -> Controller:
    controller = Controller(
        store=SqliteTaskStore(db),  # 每个节点一条自己的连接；跨机器换成 PostgresTaskStore(dsn)
        owner=name,  # 写进租约与指令，事后可追溯
        num_buckets=NUM_BUCKETS,
        owned_buckets=buckets_for_node(index, len(NODES)),
        max_parallel=8,  # 额度是本进程的账：每个节点各配一份
        max_parallel_per_bucket=4,
        lease_ttl=2.0,  # 崩溃后多久能被发现（生产上默认 30 秒即可）
        graceful_stop=2.0,
    )
    controller.register_all(sync_tenant, tenant_report)
    return controller


def startup(controller: Controller) -> list[str]:
    """4) 启动恢复：先 reconcile，再接新任务。返回被判 lost 的任务 id（需要人工核对/重新提交）。"""
    report = controller.reconcile()
    for snapshot in report.lost:
        print(f"[{controller.owner}] 上次崩溃遗留：{snapshot.task_id} 判为 lost，请核对副作用后决定是否重提")
    for snapshot in report.adoptable:
        print(
            f"[{controller.owner}] 无人接手的排队任务：{snapshot.task_id}（参数不落库，需要调用方重新提交）"
        )
    return [s.task_id for s in report.lost]


# -- 演示用：伪造"上次进程被 kill -9 留下的 running 任务" -------------------------------------------------


def plant_crashed_task(db: str, task_id: str, bucket_key: str) -> None:
    store = SqliteTaskStore(db)
    expired = store.clock.now() - timedelta(minutes=5)
    machine = StateMachine.create(
        task_id,
        "sync_tenant",
        bucket=BucketPolicy(NUM_BUCKETS).bucket_for(bucket_key),
        bucket_key=bucket_key,
        owner="old-process",
        lease_owner="old-process",
        lease_until=expired,
    )
    machine.mark_queued()
    machine.mark_starting(executor="thread")
    machine.mark_running()
    store.create(machine.snapshot, machine.transitions)
    store.close()


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "条件") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}在 {timeout} 秒内没有成立")
        time.sleep(0.02)


def main() -> None:
    # 1) 桶划分：不重叠、无空洞
    parts = [set(buckets_for_node(i, len(NODES))) for i in range(len(NODES))]
    assert set().union(*parts) == set(range(NUM_BUCKETS))
    assert sum(len(p) for p in parts) == NUM_BUCKETS
    tenants = [f"tenant-{n}" for n in range(8)]
    by_node = {i: [t for t in tenants if node_index_for_key(t) == i] for i in range(len(NODES))}
    assert all(by_node.values()), f"示例租户没有覆盖每个节点：{by_node}"
    print("桶划分：", {NODES[i]: list(buckets_for_node(i, len(NODES))) for i in range(len(NODES))})

    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "tasks.db")
        zombie_a, zombie_b = by_node[0][0], by_node[1][0]
        plant_crashed_task(db, "zombie-a", zombie_a)
        plant_crashed_task(db, "zombie-b", zombie_b)

        # 3) + 4) 逐个启动节点：每个节点只清理自己桶里的僵尸
        node_a = build_node("node-a", 0, db)
        assert startup(node_a) == ["zombie-a"]
        assert node_a.get("zombie-b").status is S.RUNNING  # type: ignore[union-attr]  # 不是 a 的桶，不动
        node_b = build_node("node-b", 1, db)
        assert startup(node_b) == ["zombie-b"]
        nodes = [node_a, node_b]

        # 5) 按桶提交：业务键决定节点
        for tenant in tenants:
            node = nodes[node_index_for_key(tenant)]
            node.submit("sync_tenant", tenant, task_id=f"sync-{tenant}", bucket_key=tenant)
        report_run = nodes[node_index_for_key("tenant-0")].submit(
            "tenant_report", "tenant-0", task_id="report-tenant-0", bucket_key="tenant-0"
        )
        assert report_run.wait(timeout=5).value == {"tenant": "tenant-0", "path": "reports/tenant-0.csv"}

        wrong = nodes[1 - node_index_for_key("tenant-1")]
        for bad_submit in (
            lambda: wrong.submit("sync_tenant", "tenant-1", bucket_key="tenant-1"),  # 别人的桶
            lambda: node_a.submit("sync_tenant", "tenant-x"),  # 没给 bucket_key
        ):
            try:
                bad_submit()
            except ConfigurationError as exc:
                print("提交被拒绝：", exc)
            else:
                raise AssertionError("投错节点 / 缺 bucket_key 的提交应当被拒绝")

        wait_until(
            lambda: len(node_a.list_tasks(status=S.RUNNING, name_prefix="sync_tenant")) == len(tenants),
            what="全部同步任务进入 running",
        )

        # 6) 跨节点查询与控制
        everything = node_b.list_tasks(name_prefix="sync_tenant", status=S.RUNNING)
        mine = node_b.list_tasks(buckets=node_b.owned_buckets, status=S.RUNNING, name_prefix="sync_tenant")
        assert len(everything) == len(tenants) and len(mine) == len(by_node[1])
        print(render_table(everything))

        target = f"sync-{by_node[0][0]}"  # 由 node-a 持有
        assert node_b.pause(target, timeout=5) is False  # 跨进程/跨节点：未确认
        wait_until(lambda: node_b.get(target).status is S.PAUSED, what="跨节点暂停生效")  # type: ignore[union-attr]
        assert node_b.resume(target) is True
        wait_until(lambda: node_b.get(target).status is S.RUNNING, what="跨节点恢复生效")  # type: ignore[union-attr]
        assert node_b.stop(target, reason="租户欠费") is True
        outcome = node_b.wait(target, timeout=10)
        assert outcome.status is S.STOPPED
        stopping = next(t for t in node_b.store.history(target) if t.to_status is S.STOPPING)  # type: ignore[union-attr]
        assert stopping.actor == "node-b" and stopping.reason == "租户欠费"
        assert node_a.get(target).owner == "node-a"  # type: ignore[union-attr]  # 任务不迁移：仍归 node-a

        # 7) 收尾校验
        for node in nodes:
            node.close(reason="滚动发布")
            assert not node.persist_failures, node.persist_failures
        checker = SqliteTaskStore(db)
        dangling = checker.query(TaskQuery(statuses=NON_TERMINAL_STATUSES))
        assert dangling == [], [s.task_id for s in dangling]
        stats = checker.stats()
        print("终态统计：", {k: v for k, v in stats.to_dict().items() if v})
        assert stats[S.LOST] == 2 and stats[S.SUCCEEDED] == 1 and stats[S.STOPPED] == len(tenants)
        checker.close()
        restarted = build_node("node-a", 0, db)
        assert restarted.reconcile().total == 0  # 干净关闭之后没有需要恢复的东西
        restarted.close(close_store=True)
        for node in nodes:
            assert node.store is not None
            node.store.close()

    print("11_best_practice: OK")


if __name__ == "__main__":
    main()
