"""Twelve consumer processes with a Consumer's default batching drain a backlog of one topic
(12 partitions, 3,000 keys, 24,000 events) on PostgreSQL with default settings: every event
applied once, no ``out of shared memory`` anywhere, and the lock table's peak (entries of every
kind in ``pg_locks``, sampled while they run) far below the server's 6,400.

With the per-id advisory locks of the claim before the guard, each of the 48 transactions in
flight held an entry per id (up to 500): the peak went past the table's size (8,406 measured
with them put back, against a bound of 3,072)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from consumerkit.testing.services import MakeTopic, start_postgres
from tests.harness.fleet import drain

pytestmark = pytest.mark.slow

PROCESSES = 12
ENTRIES_PER_TRANSACTION = 64
"""A bound on a consumer transaction's lock-table entries: its claim's (the dedup partitions
and their indexes, the guard, the names table: 20 to 30 measured) and the handler's tables."""
PEAK_BOUND = PROCESSES * 4 * ENTRIES_PER_TRANSACTION  # 4: a Consumer's concurrency with batches
DEFAULTS = {"max_connections": "100", "max_locks_per_transaction": "64"}


@contextlib.asynccontextmanager
async def default_server(dsn: str) -> AsyncIterator[str]:
    """``dsn`` if its server has PostgreSQL's default lock-table size, else a server of
    this test's own (stopped after it)."""
    conn = await asyncpg.connect(dsn)
    try:
        settings = {n: await conn.fetchval(f"SHOW {n}") for n in DEFAULTS}
    finally:
        await conn.close()
    if settings == DEFAULTS:
        yield dsn
        return
    server = await asyncio.to_thread(start_postgres)
    try:
        yield server.dsn
    finally:
        await asyncio.to_thread(server.stop)


async def test_twelve_consumer_processes_stay_far_from_the_lock_table(
    embedded_postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    tmp_path: Path,
) -> None:
    topic = await make_topic(partitions=PROCESSES)
    async with default_server(embedded_postgres_dsn) as dsn:
        run = await drain(dsn, kafka_bootstrap, topic, pg_schema, PROCESSES, keys=3000,
                          per_key=8, workdir=tmp_path)
    print(f"{PROCESSES} consumer processes drained {run.events} events in {run.seconds:.1f}s; "
          f"lock-table entries at peak {run.peak_entries} held by {run.peak_backends} "
          f"backends (bound {PEAK_BOUND})")
    assert (run.effects, run.distinct) == (run.events, run.events)
    assert run.violations == 0
    assert not [name for name, text in run.logs.items() if "out of shared memory" in text]
    assert 0 < run.peak_entries <= PEAK_BOUND
