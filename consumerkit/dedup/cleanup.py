"""Retention for the "table" layout: delete expired rows in small batches.

Each batch is its own short transaction: it deletes at most ``batch_size`` rows whose
``seen_at`` is before the horizon, found through the ``seen_at`` index and deleted by their
physical address (a TID scan). Short transactions keep row locks, WAL bursts and the
replication lag they cause small, and let vacuum reclaim space between batches. Claims are not
blocked: a DELETE takes only ``ROW EXCLUSIVE`` on the table, and a claim reads rows without
locking them (an id whose row is being deleted was expired anyway).

``lock_timeout`` bounds every batch: a batch that cannot get its locks in time rolls back and
the rest of the work is left to the next run. Maintainers of one table take turns batch by
batch (an advisory lock), so they never fight over the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import asyncpg

from ..errors import ConfigurationError, StartupError
from ..shared.identifiers import qualified
from ..types import DbConnection
from .layout import check_layout, check_lean_rows
from .policy import DedupPolicy
from .retention import longest, register

BATCH_SIZE = 10_000


@dataclass(frozen=True, slots=True)
class Cleanup:
    """What :func:`delete_expired` did: event ids deleted, and whether it reached the horizon
    (``False`` when a batch gave up on a lock; the next run continues)."""

    deleted: int
    finished: bool


async def clean_table(
    conn: DbConnection, schema: str, policy: DedupPolicy, *, now: datetime | None,
    namespace: str | None, lock_seed: int, lock_timeout: timedelta,
    batch_size: int = BATCH_SIZE,
) -> Cleanup:
    """Maintenance of a ``"table"`` layout table: register ``namespace``'s retention, then
    delete the rows older than the longest registered retention (or ``policy.retention`` if
    longer) plus ``policy.clock_skew``, as seen from ``now`` (default: the database's)."""
    if now is not None and now.tzinfo is None:
        raise ConfigurationError("maintenance time must be timezone-aware")
    async with conn.transaction():
        if await check_layout(conn, schema, policy) is None:
            raise StartupError(f"dedup table {schema}.{policy.table} does not exist: run migrate")
        await check_lean_rows(conn, schema, policy)
        if namespace is not None:
            await register(conn, schema, policy.table, namespace, policy.retention)
        retention = max(policy.retention,
                        await longest(conn, schema, policy.table) or policy.retention)
        moment: datetime = now if now is not None else await conn.fetchval("SELECT now()")
    return await delete_expired(
        conn, schema, policy.table, moment - (retention + policy.clock_skew),
        lock_seed=lock_seed, lock_timeout=lock_timeout, batch_size=batch_size)


async def delete_expired(
    conn: DbConnection, schema: str, table: str, horizon: datetime, *, lock_seed: int,
    lock_timeout: timedelta = timedelta(seconds=2), batch_size: int = BATCH_SIZE,
) -> Cleanup:
    """Delete the rows of ``schema.table`` with ``seen_at < horizon``, ``batch_size`` rows
    (each holding the ids of one claim) per transaction; returns the ids deleted. Run it
    outside a transaction, or every batch becomes one savepoint of the caller's transaction
    and nothing is released before it ends."""
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    name = qualified(schema, table)
    delete = (
        f"WITH gone AS (DELETE FROM {name} WHERE ctid = ANY (ARRAY("
        f"SELECT ctid FROM {name} WHERE seen_at < $1 ORDER BY seen_at LIMIT $2)) "
        "RETURNING coalesce(cardinality(uuids), 0) + coalesce(cardinality(texts), 0) AS ids) "
        "SELECT count(*) AS rows, coalesce(sum(ids), 0)::bigint AS ids FROM gone")
    timeout = f"{max(1, lock_timeout // timedelta(milliseconds=1))}ms"
    deleted = 0
    while True:
        try:
            async with conn.transaction():
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1, $2)),"
                    " set_config('lock_timeout', $3, true)",
                    f"consumerkit.maintain\x1f{schema}.{table}", lock_seed, timeout)
                gone = await conn.fetchrow(delete, horizon, batch_size)
        except asyncpg.LockNotAvailableError:
            return Cleanup(deleted, finished=False)
        assert gone is not None  # an aggregate always answers one row
        deleted += gone["ids"]
        if gone["rows"] < batch_size:
            return Cleanup(deleted, finished=True)
