"""12 跨机器多节点（PostgreSQL）：两个节点进程共用一个 Postgres，互相看得见、停得了。

需要环境变量 ``CHONGMING_TEST_POSTGRES``（例如 ``postgresql://postgres@127.0.0.1:5432/test``）；没有它时
在 stderr 打印"跳过：……"并以退出码 77 结束（自动化测试约定的"跳过"，既不是成功也不是失败）；设置了
``CHONGMING_REQUIRE_POSTGRES=1``（CI）时没有它就是失败，退出码 1。

示例用一个一次性的 schema（``?schema=...`` 写在连接串里）隔离自己的表，
结束时删掉它，不碰库里别的数据。

演示并断言（两个真实的 OS 进程，各自一个 Controller + PostgresTaskStore）：
* 节点 A（子进程）按桶提交并执行自己的任务；节点 B（主进程）list_tasks 看得到 A 的任务；
* 节点 B 停 A 的任务：写一条指令，A 经 LISTEN/NOTIFY 即时取走（轮询是兜底），任务落 stopped，
  历史里 actor = node-b；
* 节点 B 的 reconcile() 只看自己的桶，不会动 A 的任务；
* 与 SQLite 版（11_best_practice.py）相比，换掉的只有存储那一行。

运行：CHONGMING_TEST_POSTGRES=postgresql://... python examples/12_postgres_multinode.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

from chongming_task import BucketPolicy, Controller, TaskContext, TaskStatus, open_store, render_table, task

S = TaskStatus
NUM_BUCKETS = 8
OWNED = {"node-a": range(4), "node-b": range(4, 8)}
EXIT_SKIPPED = 77
"""没有数据库可连时的退出码：自动化测试里约定俗成的"跳过"（automake / meson 同样用 77）。"""


@task
def sync_tenant(ctx: TaskContext, tenant: str) -> None:
    """常驻同步，直到被停止。"""
    batches = 0
    while True:
        ctx.checkpoint()
        batches += 1
        ctx.progress(batches, unit="batch")
        time.sleep(0.02)


def wait_until(predicate: Callable[[], bool], timeout: float = 15.0, what: str = "条件") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}在 {timeout} 秒内没有成立")
        time.sleep(0.02)


def build_node(name: str, url: str) -> Controller:
    controller = Controller(
        store=open_store(url),  # 与 SQLite 版唯一的区别
        owner=name,
        num_buckets=NUM_BUCKETS,
        owned_buckets=OWNED[name],
        max_parallel=4,
        lease_ttl=5.0,
        graceful_stop=2.0,
    )
    controller.register_all(sync_tenant)
    return controller


def tenant_in(name: str) -> str:
    """找一个落在该节点桶里的租户键。"""
    node_buckets = OWNED[name]
    policy = BucketPolicy(NUM_BUCKETS)
    return next(t for t in (f"tenant-{n}" for n in range(100)) if policy.bucket_for(t) in node_buckets)


def node_a_process(url: str) -> None:
    """子进程：节点 A。提交一个自己桶里的任务，直到它落终态再收尾。"""
    node = build_node("node-a", url)
    assert node.reconcile().total == 0
    tenant = tenant_in("node-a")
    node.submit("sync_tenant", tenant, task_id="sync-a", bucket_key=tenant)
    outcome = node.wait("sync-a", timeout=60)
    node.close(close_store=True)
    print(f"[node-a] sync-a -> {outcome.status.value}", flush=True)


def main(dsn: str) -> None:
    import psycopg

    schema = f"chongming_example_{uuid.uuid4().hex[:10]}"
    separator = "&" if "?" in dsn else "?"
    url = f"{dsn}{separator}schema={schema}"
    node_b: Controller | None = None
    proc: subprocess.Popen[bytes] | None = None
    try:
        node_b = build_node("node-b", url)  # 首次连接时自动建表
        proc = subprocess.Popen([sys.executable, __file__, "node-a", url])
        wait_until(
            lambda: (snap := node_b.get("sync-a")) is not None and snap.status is S.RUNNING,  # type: ignore[union-attr]
            what="节点 A 的任务进入 running",
        )
        print(render_table(node_b.list_tasks()))
        snap = node_b.get("sync-a")
        assert snap is not None and snap.owner == "node-a" and snap.bucket in OWNED["node-a"]

        # B 的 reconcile 只看 B 的桶：A 的任务不会被碰
        assert node_b.reconcile().total == 0
        assert node_b.get("sync-a").status is S.RUNNING  # type: ignore[union-attr]

        # B 自己的任务照常跑在 B 上
        tenant_b = tenant_in("node-b")
        node_b.submit("sync_tenant", tenant_b, task_id="sync-b", bucket_key=tenant_b)

        # 跨机器停止：一条指令，A 即时取走
        started = time.monotonic()
        assert node_b.stop("sync-a", reason="跨节点停止") is True
        outcome = node_b.wait("sync-a", timeout=15)
        print(f"sync-a 从发出停止到落终态：{time.monotonic() - started:.2f} 秒")
        assert outcome.status is S.STOPPED
        history = node_b.store.history("sync-a")  # type: ignore[union-attr]
        stopping = next(t for t in history if t.to_status is S.STOPPING)
        assert stopping.actor == "node-b" and stopping.reason == "跨节点停止"
        assert proc.wait(timeout=20) == 0

        node_b.close()
        assert node_b.get("sync-b").status is S.STOPPED  # type: ignore[union-attr]
        assert not node_b.persist_failures
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        if node_b is not None:
            node_b.close(close_store=True)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    print("12_postgres_multinode: OK")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "node-a":
        node_a_process(sys.argv[2])
    else:
        dsn = os.environ.get("CHONGMING_TEST_POSTGRES", "").strip()
        if not dsn:
            hint = (
                "没有设置 CHONGMING_TEST_POSTGRES。请给出一个可连接的 PostgreSQL，例如\n"
                "  CHONGMING_TEST_POSTGRES=postgresql://postgres@127.0.0.1:5432/test "
                "python examples/12_postgres_multinode.py"
            )
            # 跳过必须看得出是跳过：退出码 0 会让"什么都没验证"冒充"验证通过"。
            # CI 要求 Postgres 时，跳过即失败。
            if os.environ.get("CHONGMING_REQUIRE_POSTGRES", "").strip() not in ("", "0", "false", "no"):
                print(
                    f"失败：CHONGMING_REQUIRE_POSTGRES=1 要求真的连上 PostgreSQL，但{hint}", file=sys.stderr
                )
                sys.exit(1)
            print(f"跳过：{hint}", file=sys.stderr)
            sys.exit(EXIT_SKIPPED)
        main(dsn)
