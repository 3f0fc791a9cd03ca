"""``consumerkit check --processes N``: the entries the deployment's dedup claims hold in
PostgreSQL's shared lock table, counted against the table's size.

The server's lock table has room for ``max_locks_per_transaction x (max_connections +
max_prepared_transactions)`` entries, shared by every client: once it is full, any
statement that needs one more fails with ``out of shared memory``, the service's own
included. A claim holds a lock on each dedup partition of its window and on each of their
indexes (it probes them all), on the guard and the names table, on its own transaction, and
on one transaction it waits for. Each consumer process runs ``concurrency`` such
transactions at once.

The entries of one claim are measured: a claim of one id, in a transaction rolled back, on
this server's own partitions. A window still filling up (fewer partitions than its retention
keeps) is projected to its full size from the entries one partition costs. Every entry of
``pg_locks`` is counted: PostgreSQL 18 keeps about ``max_locks_per_transaction`` of a
backend's weak relation locks outside the table (the fast path), so the count is an upper
bound there; PostgreSQL 17 and older keep 16 at most, and a claim's partitions overflow them.
"""

from __future__ import annotations

import argparse
import math
from datetime import timedelta
from typing import Any

import asyncpg

from ..dedup.partitions import list_partitions
from ..dedup.policy import DedupPolicy
from ..dedup.postgres import PostgresDedupStore
from ..envelope import Envelope
from ..types import ClaimRequest, DbConnection
from .check_connections import Findings
from .errors import database

WAITED = 1  # the lock a claim takes on the transaction of a concurrent claim it waits for
AHEAD = timedelta(days=1)  # the claim probes the partitions starting up to a day ahead

_SIZE = """SELECT current_setting('max_locks_per_transaction')::int AS per_tx,
                  current_setting('max_connections')::int AS connections,
                  current_setting('max_prepared_transactions')::int AS prepared"""
_OWN = "SELECT count(*) FROM pg_catalog.pg_locks WHERE pid = pg_catalog.pg_backend_pid()"
_INDEXES = "SELECT count(*) FROM pg_catalog.pg_index WHERE indrelid = to_regclass($1)"


async def measure_claim(conn: DbConnection, schema: str, policy: DedupPolicy) -> int:
    """The lock-table entries (all kinds) a transaction holds after one claim of ``policy``'s
    table, in a transaction rolled back: nothing stays behind."""
    store = PostgresDedupStore(schema, policy)
    request = ClaimRequest(Envelope(
        event_id="consumerkit-check-locks", id_source="header", event_type="check", key=None,
        topic="check", partition=0, offset=0, timestamp=None), "check")
    tx = conn.transaction(isolation="read_committed")
    await tx.start()
    try:
        await store.claim_many(conn, "consumerkit check", [request], enforce_window=False)
        return int(await conn.fetchval(_OWN))
    finally:
        await tx.rollback()


def window_partitions(policy: DedupPolicy) -> int:
    """The most partitions a claim probes once the window is full: those retention keeps
    (plus the clock-skew margin and the previous one), the current one and those up to a
    day ahead."""
    step = policy.partition_interval
    kept = math.ceil((policy.retention + policy.clock_skew) / step) + 1
    return kept + 1 + min(policy.premake, math.ceil(AHEAD / step))


async def per_claim(conn: DbConnection, schema: str, policy: DedupPolicy,
                    ) -> tuple[int, str]:
    """The entries of one claim's transaction, and how they were found (for the message)."""
    measured = await measure_claim(conn, schema, policy) + WAITED
    if policy.layout == "table":
        return measured, f"{measured} per claim (measured, the table layout)"
    now = await conn.fetchval("SELECT now()")
    parts = [p for p in await list_partitions(conn, schema, policy.table)
             if p.lower is None or p.lower <= now + AHEAD]
    full = window_partitions(policy)
    how = f"{measured} per claim (measured over the {len(parts)} dedup partition(s) present"
    if not parts or len(parts) >= full:
        return measured, how + ")"
    each = 1 + int(await conn.fetchval(_INDEXES, f'"{schema}"."{parts[-1].name}"'))
    projected = measured + (full - len(parts)) * each
    return projected, (f"{projected} per claim (measured {measured} over the {len(parts)} "
                       f"dedup partition(s) present, + {each} for each of the "
                       f"{full - len(parts)} more a full window of {full} holds)")


async def check_locks(dsn: str | None, args: argparse.Namespace, schema: str,
                      policy: DedupPolicy, concurrency: int, report: Findings) -> None:
    if args.processes is None:
        return
    try:
        async with database(dsn) as conn:
            size: Any = await conn.fetchrow(_SIZE)
            entries, how = await per_claim(conn, schema, policy)
    except (OSError, TimeoutError, ValueError, asyncpg.InterfaceError):
        return  # PostgreSQL's own check says why
    except asyncpg.PostgresError as exc:  # a missing table is reported by the tables' check
        report.note(f"lock-table entries of a claim not measured: {str(exc).splitlines()[0]}")
        return
    want = args.processes * concurrency * entries
    room = size["per_tx"] * (size["connections"] + size["prepared"])
    formula = (f"{args.processes} consumer process(es) x {concurrency} transaction(s) in "
               f"flight (limits.concurrency) x {how} = {want}")
    server = (f"{room} (max_locks_per_transaction {size['per_tx']} x (max_connections "
              f"{size['connections']} + max_prepared_transactions {size['prepared']}))")
    if want > room:
        report.problem(f"lock-table entries the claims hold: {formula}, more than the server's "
                       f"lock table has room for: {server}; when it is full every client of "
                       "the database fails with 'out of shared memory': raise "
                       "max_locks_per_transaction, lower limits.concurrency, or keep fewer dedup "
                       "partitions (a longer partition_interval)")
    else:
        report.ok(f"lock-table entries the claims hold: {formula}, within {server}")
