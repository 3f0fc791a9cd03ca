"""Server-side counters read around each measurement: commits, WAL syncs, statements, and the
size of the peer's dedup table.

``pg_stat_database.xact_commit`` and ``pg_stat_wal`` (``pg_stat_io`` for WAL syncs from PostgreSQL
18 on) are server-wide (or database-wide):
anything else using the same PostgreSQL during a run is counted too, so they are upper bounds
on a shared machine. Statements come from ``pg_stat_statements`` when the extension is loaded
(it needs ``shared_preload_libraries``); without it the figure is reported as unavailable.
Backends flush their statistics when they exit, and every peer closes its connections before
the second reading.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    import asyncpg

    Connection: TypeAlias = asyncpg.Connection[asyncpg.Record]


@dataclass(frozen=True, slots=True)
class Counters:
    commits: int
    wal_syncs: int | None  # None before PostgreSQL 14
    wal_bytes: int | None
    statements: int | None  # None without pg_stat_statements


async def statements_available(conn: Connection) -> bool:
    """Whether ``pg_stat_statements`` can be read here (installed and preloaded)."""
    if not await conn.fetchval(
            "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'"):
        return False
    try:
        await conn.fetchval("SELECT count(*) FROM pg_stat_statements")
    except Exception:  # not in shared_preload_libraries: the view raises
        return False
    return True


async def snapshot(conn: Connection, statements: bool) -> Counters:
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    commits = int(await conn.fetchval(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"))
    wal = None
    version = int(await conn.fetchval("SHOW server_version_num"))
    if version >= 180000:  # 18 moved the WAL sync count to pg_stat_io's WAL rows
        wal = await conn.fetchrow(
            "SELECT (SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE object = 'wal') "
            "AS wal_sync, wal_bytes FROM pg_stat_wal")
    elif version >= 140000:
        wal = await conn.fetchrow("SELECT wal_sync, wal_bytes FROM pg_stat_wal")
    calls = None
    if statements:
        calls = int(await conn.fetchval(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"))
    return Counters(commits, int(wal["wal_sync"]) if wal else None,
                    int(wal["wal_bytes"]) if wal else None, calls)


def per_message(before: Counters, after: Counters, messages: int) -> dict[str, float | None]:
    def delta(a: int | None, b: int | None) -> float | None:
        return None if a is None or b is None or messages <= 0 else (b - a) / messages

    return {
        "commits_per_msg": delta(before.commits, after.commits),
        "wal_syncs_per_msg": delta(before.wal_syncs, after.wal_syncs),
        "wal_bytes_per_msg": delta(before.wal_bytes, after.wal_bytes),
        "statements_per_msg": delta(before.statements, after.statements),
    }


async def relation_bytes(conn: Connection, schema: str, table: str | None) -> int:
    """Total size of ``schema.table`` with its indexes, TOAST and partitions (0 if absent)."""
    if table is None:
        return 0
    return int(await conn.fetchval(
        "SELECT CASE WHEN c.relkind = 'p' THEN (SELECT coalesce(sum("
        "pg_total_relation_size(t.relid)), 0) FROM pg_partition_tree(c.oid) AS t) "
        "ELSE pg_total_relation_size(c.oid) END FROM pg_class AS c "
        "WHERE c.oid = to_regclass($1::text)", f'"{schema}"."{table}"') or 0)
