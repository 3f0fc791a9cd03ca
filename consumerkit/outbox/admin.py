"""Operating an outbox: failed rows (list, count, retry, skip), live relays and their slots,
and, for tables that Debezium reads (no built-in relay), the batched retention delete or, for
an outbox kept in time partitions, their maintenance."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from ..dedup.layout import existing_layout
from ..dedup.partitions import MaintenanceReport, maintain
from ..errors import ConfigurationError, StartupError
from ..types import DbConnection
from .retention import plan
from .table import SLOTS, OutboxTable


@dataclass(frozen=True, slots=True)
class FailedEvent:
    """A row that stopped being retried: it blocks the later rows of its aggregate."""

    event_id: UUID
    event_type: str
    aggregate_type: str
    aggregate_id: str
    attempts: int
    last_error: str
    failed_at: datetime


async def failed_events(conn: DbConnection, table: OutboxTable | None = None,
                        limit: int = 100) -> list[FailedEvent]:
    """FAILED rows, oldest first."""
    t = table or OutboxTable()
    rows = await conn.fetch(
        f"""SELECT event_id, event_type, aggregatetype, aggregateid, attempts, last_error,
                   updated_at FROM {t.failures} WHERE failed ORDER BY seq LIMIT $1""", limit)
    return [FailedEvent(*r.values()) for r in rows]


async def count_failed(conn: DbConnection, table: OutboxTable | None = None) -> int:
    """How many rows are FAILED: alert when it is above zero."""
    t = table or OutboxTable()
    count: int = await conn.fetchval(f"SELECT count(*) FROM {t.failures} WHERE failed")
    return count


def _which(event_ids: Sequence[UUID] | None, all_failed: bool) -> list[UUID] | None:
    if all_failed == (event_ids is not None):
        raise ConfigurationError("pass event ids, or all_failed=True, not both")
    return None if all_failed else list(event_ids or [])


async def retry_failed(conn: DbConnection, event_ids: Sequence[UUID] | None = None, *,
                       all_failed: bool = False, table: OutboxTable | None = None) -> int:
    """Clear the failure state of FAILED rows: they are published again at once, attempts
    counted from zero. Returns how many rows were retried."""
    t = table or OutboxTable()
    ids = _which(event_ids, all_failed)
    status = await conn.execute(
        f"DELETE FROM {t.failures} WHERE failed AND ($1::uuid[] IS NULL OR event_id = ANY($1))",
        ids)
    await conn.execute("SELECT pg_notify($1, '')", t.channel)
    return int(status.split()[-1])


async def skip_failed(conn: DbConnection, event_ids: Sequence[UUID] | None = None, *,
                      all_failed: bool = False, table: OutboxTable | None = None) -> int:
    """Delete FAILED rows without publishing them, which unblocks their aggregates. Their
    events are never sent. Returns how many rows were skipped."""
    t = table or OutboxTable()
    ids = _which(event_ids, all_failed)
    async with conn.transaction():
        seqs = [r["seq"] for r in await conn.fetch(
            f"""DELETE FROM {t.failures} WHERE failed
                AND ($1::uuid[] IS NULL OR event_id = ANY($1)) RETURNING seq""", ids)]
        await conn.execute(f"DELETE FROM {t.events} WHERE seq = ANY($1::bigint[])", seqs)
        await conn.execute("SELECT pg_notify($1, '')", t.channel)
    return len(seqs)


async def locking_relays(conn: DbConnection, table: OutboxTable | None = None) -> int:
    """How many relays of this outbox hold its member lock now (relays on a session: direct,
    or behind a pooler in session mode)."""
    t = table or OutboxTable()
    cls, obj = t.members_lock
    count: int = await conn.fetchval(
        """SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 2""",
        cls, obj)
    return count


async def leasing_relays(conn: DbConnection, table: OutboxTable | None = None) -> int:
    """How many relays hold live leases on this outbox (relays behind a transaction pooler;
    0 before the lease tables exist)."""
    t = table or OutboxTable()
    if await conn.fetchval("SELECT to_regclass($1)", t.members) is None:
        return 0
    count: int = await conn.fetchval(
        f"SELECT count(*) FROM {t.members} WHERE expires_at > now()")
    return count


async def live_relays(conn: DbConnection, table: OutboxTable | None = None) -> int:
    """How many relays of this outbox are alive now: the holders of its member lock, and
    the relays whose membership lease is live (behind a transaction pooler, including one
    paused after a failed batch: it keeps renewing)."""
    return await locking_relays(conn, table) + await leasing_relays(conn, table)


async def slot_owners(conn: DbConnection,
                      table: OutboxTable | None = None) -> dict[int, int | str]:
    """``{slot: owner}`` for every slot of this outbox a relay holds now: the backend pid of
    a relay holding it by a session lock, or the lease holder (``name/run id``) of a relay
    behind a transaction pooler. Once all :data:`~consumerkit.outbox.table.SLOTS` are held
    by ``live_relays()`` distinct owners, each within its fair share, the relays have
    settled."""
    t = table or OutboxTable()
    rows = await conn.fetch(
        """SELECT objid::bigint AS slot, pid FROM pg_locks
           WHERE locktype = 'advisory' AND granted AND mode = 'ExclusiveLock'
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND classid = $1::bigint::oid AND objsubid = 2 AND objid::bigint < $2""",
        t.lock_class, SLOTS)
    owners: dict[int, int | str] = {r["slot"]: r["pid"] for r in rows}
    if await conn.fetchval("SELECT to_regclass($1)", t.leases) is not None:
        leased = await conn.fetch(
            f"SELECT slot, holder FROM {t.leases} WHERE expires_at > now()")
        owners.update({r["slot"]: r["holder"] for r in leased})
    return owners


async def cleanup(conn: DbConnection, older_than: timedelta, *,
                  table: OutboxTable | None = None, batch: int = 5000) -> int:
    """Delete outbox rows and idempotency keys older than ``older_than``, ``batch`` rows per
    short transaction (no long lock, no long snapshot). For outboxes read by Debezium: a
    table with a built-in relay needs none (published rows are deleted), and the call is
    refused while a relay of this outbox is connected, or when the outbox keeps its rows in
    time partitions (:func:`maintain_outbox` drops those whole). Each batch holds the relays'
    member lock alone and finds no relay holding leases (relays behind a transaction
    pooler), in its own transaction: no session state, so it works through any pooler. A
    relay that starts meanwhile waits for the batch in progress; a later batch of events finds
    it and stops the cleanup with the same error. Returns the outbox rows deleted."""
    t = table or OutboxTable()
    if batch < 1:
        raise ConfigurationError("cleanup batch must be at least 1")
    _outside_transaction(conn, "cleanup")
    if await existing_layout(conn, t.schema, t.table) == "partitioned":
        raise ConfigurationError(
            f"outbox {t.schema}.{t.table} keeps its rows in time partitions: maintain_outbox "
            "(consumerkit outbox maintain) drops them whole")
    leases = await conn.fetchval("SELECT to_regclass($1)", t.members) is not None

    async def no_relay() -> None:  # a relay's pending rows are not garbage
        if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1, $2)",
                                   *t.members_lock) or (leases and await conn.fetchval(
                f"SELECT EXISTS (SELECT 1 FROM {t.members} WHERE expires_at > now())")):
            raise ConfigurationError(
                f"a relay of {t.schema}.{t.table} is running: its pending rows are not garbage")

    deleted = await delete_older(conn, t.events, "occurred_at", "seq", older_than, batch,
                                 no_relay)
    # idempotency keys are the writers', not a relay's pending rows
    await delete_older(conn, t.keys, "created_at", "dedup_key", older_than, batch)
    return deleted


async def maintain_outbox(conn: DbConnection, table: OutboxTable) -> MaintenanceReport:
    """For an outbox with a retention: make its partitions ahead and drop whole those past
    the retention (the dedup table's :func:`~consumerkit.dedup.partitions.maintain`), then
    delete its idempotency keys older than the retention in batches. Call it outside a
    transaction, on a schedule (a quarter of the partition interval is plenty); processes
    may run it at once. A consumer whose ``Outbox`` has a retention runs it with its own
    dedup maintenance."""
    _outside_transaction(conn, "outbox maintenance")
    wanted = plan(table)
    if await existing_layout(conn, table.schema, table.table) != "partitioned":
        raise StartupError(f"outbox {table.schema}.{table.table} is not partitioned: run "
                           "consumerkit migrate --outbox-retention first")
    report = await maintain(conn, table.schema, wanted)
    await delete_older(conn, table.keys, "created_at", "dedup_key", wanted.retention, 5000)
    return report


async def delete_older(conn: DbConnection, target: str, column: str, key: str,
                       older_than: timedelta, batch: int,
                       guard: Callable[[], Awaitable[None]] | None = None) -> int:
    """Delete the rows of ``target`` whose ``column`` is older than ``older_than``, ``batch``
    at a time (by ``key``), each batch its own transaction, ``guard`` first in it (it raises
    to stop); how many were deleted."""
    deleted = 0
    while True:
        async with conn.transaction():
            if guard is not None:
                await guard()
            status = await conn.execute(
                f"""DELETE FROM {target} WHERE {key} IN (
                        SELECT {key} FROM {target} WHERE {column} < now() - $1::interval
                        LIMIT $2)""", older_than, batch)
        n = int(status.split()[-1])
        deleted += n
        if n < batch:
            return deleted


def _outside_transaction(conn: DbConnection, what: str) -> None:
    if conn.is_in_transaction():
        raise ConfigurationError(f"{what} runs its own short transactions: call it outside one")
