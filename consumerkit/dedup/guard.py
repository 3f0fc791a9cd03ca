"""How a claim waits for a concurrent claim of the same id: a unique index, not a lock per id.

Each dedup table has a guard, ``{table}_guard``: an UNLOGGED table of (namespace key, event
key) with a primary key, the event key a 64-bit hash of the id. The claim inserts its batch's
distinct keys there in sorted order, ``ON CONFLICT DO NOTHING``, then deletes them again by
the addresses the insert returned:

- a concurrent claim of an id has an uncommitted guard entry for it, so the insert waits for
  that transaction to end (the unique check's dirty snapshot reports a tuple whose inserting
  transaction is in progress as live, without looking at its deletion: the first claim's own
  delete does not release the second one early). The wait is a lock on the first
  transaction's id: one lock-table entry, whatever the batch size;
- sorted inserts make two batches sharing ids wait for each other, never deadlock;
- two ids with the same hash only make one claim wait for the other, never one id look like
  another (the lookup that follows compares the ids themselves). A hash, not the id: a row of
  two bigints is about half the size of one holding the id's text, and the claim loop ran
  about a tenth faster with it (``benchmarks/claim_wait.md``);
- the entries are deleted by the transaction that made them, so the guard holds no live row:
  its dead tuples and index entries are for autovacuum and the index's own clean-up to
  reclaim. UNLOGGED: the entries are transient, so they write no WAL, and a crash empties
  the table (nothing to recover: no transaction survives a crash either);
- the insert runs under the claim's ``lock_timeout``, so a holder that never ends makes the
  waiter fail with ``lock_not_available`` (55P03), as the per-id advisory locks did.

The claim function of an older version took one ``pg_advisory_xact_lock`` per id instead
(:data:`ADVISORY_WAIT`): each one an entry in PostgreSQL's shared lock table, which a dozen
consumers on default settings fill. The migration to the guard goes through a transitional
body that takes both (:func:`wait_for_older_transactions`, :mod:`consumerkit.schema`).
"""

from __future__ import annotations

import asyncio
import time

from ..errors import StartupError
from ..shared.identifiers import identifier, qualified
from ..types import DbConnection

GUARD_WAIT = """
    WITH entered AS (
        INSERT INTO %(guard)s (namespace_key, event_key)
        SELECT DISTINCT v_ns, hashtextextended(e, %(seed)d) FROM unnest(v_ids) AS e ORDER BY 2
        ON CONFLICT DO NOTHING RETURNING ctid
    ) SELECT array_agg(ctid) INTO v_entries FROM entered;
    -- our entries are dead to everyone once we end, but a concurrent claim of the same id
    -- still waits for our transaction: the deletion is not looked at while we run
    DELETE FROM %(guard)s AS g WHERE g.ctid = ANY (v_entries);
"""
"""Statements of the claim function's wait: the guard's unique index does the waiting."""

ADVISORY_WAIT = """
    PERFORM pg_advisory_xact_lock(h)
       FROM unnest(ARRAY(SELECT DISTINCT hashtextextended(p_namespace || chr(31) || e, %(seed)d)
                           FROM unnest(p_event_ids) AS e ORDER BY 1)) AS h;
"""
"""The wait of the claim functions before the guard: one advisory lock per id, in sorted
order. The transitional body takes these too, so that it waits for claims of the old body and
they wait for it."""


def guard_name(table: str) -> str:
    """The guard table's name, unquoted (validated: 63 characters)."""
    name = f"{table}_guard"
    identifier(name, "dedup guard table name")
    return name


def guard_ddl(schema: str, table: str) -> list[str]:
    """The guard table of ``table``: two 64-bit keys, 40-byte rows."""
    guard = qualified(schema, guard_name(table))
    key = identifier(f"{table}_guard_pkey", "dedup guard index name")
    return [f"""CREATE UNLOGGED TABLE {guard} (
            namespace_key bigint NOT NULL,
            event_key bigint NOT NULL,
            CONSTRAINT {key} PRIMARY KEY (namespace_key, event_key)
        )"""]


# every transaction of this database's client backends, by its virtual transaction id: a
# lock each transaction holds on itself, listed whatever the role (pg_stat_activity hides
# other roles' transaction start from a role without pg_read_all_stats)
_TRANSACTIONS = """
SELECT l.virtualxid AS vxid, l.pid, a.state, a.xact_start
  FROM pg_catalog.pg_locks AS l
  JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
 WHERE l.locktype = 'virtualxid' AND l.granted AND l.mode = 'ExclusiveLock'
   AND a.datname = current_database() AND a.backend_type = 'client backend'
   AND l.pid <> pg_catalog.pg_backend_pid()
"""


async def wait_for_older_transactions(conn: DbConnection, timeout: float, why: str) -> None:
    """Return once every transaction of this database that was running when called has
    ended (``conn`` itself excluded, and outside a transaction). Raises
    :class:`StartupError` naming the pid of one still running after ``timeout`` seconds."""
    older = {row["vxid"]: row for row in await conn.fetch(_TRANSACTIONS)}
    deadline = time.monotonic() + timeout
    delay = 0.01
    while older:
        running = {row["vxid"] for row in await conn.fetch(_TRANSACTIONS)}
        older = {vxid: row for vxid, row in older.items() if vxid in running}
        if not older:
            return
        if time.monotonic() >= deadline:
            row = min(older.values(), key=lambda r: r["pid"])
            state = row["state"] or "state hidden from this role"
            raise StartupError(
                f"{why}: the transaction of pid {row['pid']} ({state}) is still running "
                f"after {timeout:g}s; end it (pg_terminate_backend) or run the migration "
                "again later")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.2)
