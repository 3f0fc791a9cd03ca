"""Who needs a dedup table's rows for how long.

Several consumers (namespaces) may share one dedup table with different retentions. Each
registers its retention; maintenance drops a partition only when it is older than the LONGEST
registered retention, so a consumer keeping 1 day (or an operator running the CLI with its
defaults) never drops rows that a consumer keeping 30 days still needs. A stale registration
only keeps partitions longer than necessary: the safe direction.
"""

from __future__ import annotations

from datetime import timedelta

from ..shared.identifiers import qualified
from ..types import DbConnection

TABLE = "consumerkit_retention"


def retention_ddl(schema: str) -> list[str]:
    return [f"""CREATE TABLE IF NOT EXISTS {qualified(schema, TABLE)} (
        dedup_table text NOT NULL,
        namespace text NOT NULL,
        retention interval NOT NULL,
        updated_at timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (dedup_table, namespace)
    )"""]


async def register(
    conn: DbConnection, schema: str, table: str, namespace: str, retention: timedelta,
) -> None:
    """Record (or update) the retention ``namespace`` needs for ``table``."""
    await conn.execute(
        f"INSERT INTO {qualified(schema, TABLE)} (dedup_table, namespace, retention) "
        "VALUES ($1, $2, $3) ON CONFLICT (dedup_table, namespace) "
        "DO UPDATE SET retention = EXCLUDED.retention, updated_at = now()",
        table, namespace, retention)


async def longest(conn: DbConnection, schema: str, table: str) -> timedelta | None:
    """The longest retention registered for ``table`` (``None`` if nobody registered)."""
    value: timedelta | None = await conn.fetchval(
        f"SELECT max(retention) FROM {qualified(schema, TABLE)} WHERE dedup_table = $1", table)
    return value


async def registrations(conn: DbConnection, schema: str) -> list[tuple[str, str, timedelta]]:
    """Every (dedup table, namespace, retention) registered in ``schema``."""
    rows = await conn.fetch(
        f"SELECT dedup_table, namespace, retention FROM {qualified(schema, TABLE)} "
        "ORDER BY dedup_table, namespace")
    return [(r["dedup_table"], r["namespace"], r["retention"]) for r in rows]
