"""What retention costs in each layout: dropping a day's partition vs deleting the same rows.

:func:`measure_cleanup` fills one day of expired rows into a partitioned dedup table and the
same rows into a table of the ``"table"`` layout, then times :func:`maintain` on each: the
partitioned run drops the day's partition, the table run deletes the rows in batches of
10,000. Both are the code paths consumers run. The rows are checkpointed first, as a day-old
partition would be. The VACUUM the DELETE leaves to do is timed apart; the WAL, bloat and
replication lag it causes are not counted. Figures vary with the machine: compare the two
numbers of one run, not runs with each other.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from consumerkit import migrate
from consumerkit.dedup.guard import guard_name
from consumerkit.dedup.names import FUNCTION as NAME_KEY
from consumerkit.dedup.partitions import maintain, partition_floor, partition_name
from consumerkit.dedup.policy import DedupPolicy
from consumerkit.dedup.rows import claim_function
from consumerkit.shared.identifiers import qualified
from consumerkit.types import DbConnection

_FILL = """
INSERT INTO {table} (seen_at, namespace_key, handler_key, uuids)
SELECT $1::timestamptz + b * (interval '1 day' / ceil($2::numeric / 500)),
       {name_key}('billing'), {name_key}('examples.billing.charge'),
       ARRAY(SELECT md5('evt' || g)::uuid
               FROM generate_series(b * 500 + 1, least((b + 1) * 500, $2)) AS g)
  FROM generate_series(0, ceil($2::numeric / 500)::int - 1) AS b
"""
# ids stored as a consumer stores them: UUIDs, one row per claim of a full batch of 500


@dataclass(frozen=True, slots=True)
class CleanupCost:
    """Seconds :func:`maintain` took to remove ``rows`` expired rows in each layout."""

    rows: int
    drop_seconds: float
    delete_seconds: float
    vacuum_seconds: float  # the VACUUM the DELETE leaves to do, timed right after it
    dropped: list[str]
    deleted: int

    @property
    def ratio(self) -> float:
        """How many times longer the batched DELETE took than the partition drop."""
        return self.delete_seconds / self.drop_seconds

    @property
    def ratio_with_vacuum(self) -> float:
        """The same, counting the VACUUM that reclaims the deleted rows."""
        return (self.delete_seconds + self.vacuum_seconds) / self.drop_seconds


async def measure_cleanup(
    conn: DbConnection, schema: str, rows: int = 200_000, *,
    tables: tuple[str, str] = ("cost_partitioned", "cost_table"),
) -> CleanupCost:
    """Fill ``rows`` rows of one expired day into each layout (tables ``tables`` in
    ``schema``, created here and dropped again at the end) and time their cleanup. The
    partitioned table holds the current partitions and that one old day's."""
    retention = timedelta(days=7)
    partitioned = DedupPolicy(retention=retention, table=tables[0])
    table = DedupPolicy(retention=retention, table=tables[1], layout="table")

    try:
        # created as in production, with the current partitions
        await migrate(conn, schema, partitioned)
        await migrate(conn, schema, table)
        now: datetime = await conn.fetchval("SELECT now()")
        day = partition_floor(now - retention - timedelta(days=3), timedelta(days=1))
        parent = qualified(schema, partitioned.table)
        part = qualified(schema, partition_name(partitioned.table, day))
        await conn.execute(f"CREATE TABLE {part} (LIKE {parent} INCLUDING DEFAULTS)")
        await conn.execute(
            f"ALTER TABLE {parent} ATTACH PARTITION {part} FOR VALUES "
            f"FROM ('{day.isoformat()}') TO ('{(day + timedelta(days=1)).isoformat()}')")
        for policy in (partitioned, table):
            await conn.execute(_FILL.format(table=qualified(schema, policy.table),
                                            name_key=qualified(schema, NAME_KEY)), day, rows)
            await conn.execute(f"ANALYZE {qualified(schema, policy.table)}")
        await _checkpoint(conn)
        started = time.perf_counter()
        dropped = await maintain(conn, schema, partitioned)
        drop_seconds = time.perf_counter() - started
        started = time.perf_counter()
        deleted = await maintain(conn, schema, table)
        delete_seconds = time.perf_counter() - started
        started = time.perf_counter()
        await conn.execute(f"VACUUM {qualified(schema, table.table)}")
        vacuum_seconds = time.perf_counter() - started
    finally:
        for policy in (partitioned, table):
            # CASCADE: the table's {table}_ids view goes with it
            await conn.execute(
                f"DROP TABLE IF EXISTS {qualified(schema, policy.table)} CASCADE")
            await conn.execute(
                f"DROP TABLE IF EXISTS {qualified(schema, guard_name(policy.table))}")
            claim_many = claim_function(schema, policy.table, "claim_many")
            await conn.execute(f"DROP FUNCTION IF EXISTS {claim_many}")
    return CleanupCost(rows, drop_seconds, delete_seconds, vacuum_seconds, dropped.dropped,
                       deleted.deleted)


async def _checkpoint(conn: DbConnection) -> None:
    """Write the filled rows out, as they would be a day after they arrived: the DELETE then
    pays its full-page WAL images and the DROP finds no dirty buffers. Needs superuser or
    ``pg_checkpoint``; without it the rows stay in memory (the DELETE looks cheaper)."""
    with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
        await conn.execute("CHECKPOINT")
