"""chongming-task-store-postgres 的发行元数据：postgresql / postgres 两个方案指向同一个类。"""

from importlib.metadata import distribution

from packaging.requirements import Requirement


def test_postgres_store_metadata() -> None:
    dist = distribution("chongming-task-store-postgres")
    assert dist.version == "0.1.0"
    requires = {
        (r.name, str(r.specifier), str(r.marker or "")) for r in map(Requirement, dist.requires or [])
    }
    assert requires == {
        ("chongming-task-core", "==0.1.0", ""),
        # 3.2 起才有 RawCursor：组提交的批量语句预先编好 $n 原样发出（stores/postgres/_sql.numbered）。
        ("psycopg", ">=3.2", ""),
        ("psycopg-pool", ">=3.2", ""),
        ("psycopg", ">=3.2", 'extra == "binary"'),
    }
    eps = {ep.name: ep.value for ep in dist.entry_points if ep.group == "chongming_task.stores"}
    target = "chongming_task.stores.postgres:PostgresTaskStore"
    assert eps == {"postgresql": target, "postgres": target}
