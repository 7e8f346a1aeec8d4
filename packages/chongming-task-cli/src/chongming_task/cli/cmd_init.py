"""init 与 schema-sql：明确地建表，以及把建表 SQL 交给 DBA（issue 16.5）。

只读命令从不建表，run 只在新的或空的存储上建表；库里已有别的应用的表、唯独没有我们的时，
要由人明确说"就建在这里"——这就是 ``init``（库里对应 ``create_schema="always"``）。
没有建表权限的运维角色走另一条路：DBA 用 ``schema-sql`` 打印的 SQL 手工建表并授权（用户指南 §9.1）。
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlsplit

import click

from chongming_task.cli.app import cli, json_option, pass_state
from chongming_task.cli.errors import EXIT_OK, CliError
from chongming_task.cli.output import echo_json
from chongming_task.cli.state import AppState
from chongming_task.errors import TaskError
from chongming_task.store_registry import split_url


@cli.command("init")
@json_option
@pass_state
def init_command(state: AppState) -> int:
    """在 --db / --store 指向的存储里建好 chongming-task 的表（库里已有别的表也建；已建好则什么也不做）。"""
    store = state.open_store(create=True, create_schema="always")
    if state.json:
        echo_json({"store": state.store_display, "initialized": True})
    else:
        click.echo(f"存储 {state.store_display} 已就绪：chongming-task 的表已建好（已有的表不受影响）")
    del store  # 由 state.close() 关闭
    return EXIT_OK


@cli.command("schema-sql")
@click.option(
    "--grant", "role", metavar="ROLE", help="Postgres：再打印给只读写、不建表的角色 ROLE 授权的 SQL。"
)
@click.option(
    "--migrate-from",
    "migrate_from",
    type=int,
    metavar="N",
    help="Postgres：改为打印把第 N 版表结构原地升级到当前版本的 SQL（交给表的属主执行）。",
)
@pass_state
def schema_sql_command(state: AppState, role: str | None, migrate_from: int | None) -> int:
    """打印建表 SQL（不连接数据库），交给有权限的账号执行。

    --store postgresql://...?schema=名字 或 --db 文件。
    """
    url = f"sqlite:{state.db}" if state.db is not None else state.store_url
    if url is None:
        raise CliError(
            "schema-sql 要知道是哪种存储：请用 --store postgresql://主机/库名?schema=名字 或 --db tasks.db",
            error="no_store",
        )
    try:
        scheme, url = split_url(url)
    except TaskError as exc:
        raise CliError(state.mask(str(exc))) from exc
    if scheme == "sqlite":
        if role is not None or migrate_from is not None:
            raise CliError(
                "--grant / --migrate-from 只用于 PostgreSQL：SQLite 没有角色，旧文件在可写打开时自动升级"
            )
        from chongming_task.stores.sqlite import SqliteTaskStore

        click.echo(SqliteTaskStore.schema_sql(), nl=False)
        return EXIT_OK
    if scheme not in ("postgresql", "postgres"):
        raise CliError(f"schema-sql 只支持 sqlite 与 postgresql，收到 scheme {scheme!r}")
    try:
        from chongming_task.stores.postgres import PostgresTaskStore
        from chongming_task.stores.postgres._schema import DEFAULT_SCHEMA
    except ImportError as exc:
        raise CliError(
            '没有安装 PostgreSQL 存储：pip install "chongming-task[postgres]"', error="store_unavailable"
        ) from exc
    schema = dict(parse_qsl(urlsplit(url).query)).get("schema", DEFAULT_SCHEMA)
    try:
        if migrate_from is not None:
            click.echo(PostgresTaskStore.migration_sql(schema, migrate_from), nl=False)
        else:
            click.echo(PostgresTaskStore.schema_sql(schema), nl=False)
        if role is not None:
            click.echo("\n" + PostgresTaskStore.grant_sql(schema, role), nl=False)
    except TaskError as exc:
        raise CliError(state.mask(str(exc)), error="configuration") from exc
    return EXIT_OK


__all__ = ["init_command", "schema_sql_command"]
