"""Parked keys behind a real PgBouncer in transaction mode: a consumer parks them, a replay
and a discard work through the pooler, and no advisory lock is left on a backend that other
clients share (the replay's lock is held by a transaction, never by a session)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import asyncpg
import pytest

from consumerkit import Postgres, RetryPolicy
from consumerkit.engine.replay import _exclusive, discard_key, replay_key
from consumerkit.errors import ParkingError
from consumerkit.parking.entry import ParkedKey

from ..integration.ledger import Running, build, make_events, publish, verify, wait_for
from ..parking.conftest import Broken, ParkTopic, ledger, parked_key_names
from .conftest import PgBouncer

PARK = RetryPolicy(max_attempts=1, on_exhausted="park")


async def _advisory_locks(pool: asyncpg.Pool) -> int:
    count: int = await pool.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
    return count


async def test_replay_and_discard_through_the_pooler_leave_no_lock_behind(
    pgbouncer: Callable[..., PgBouncer], kafka_bootstrap: str, park_topic: ParkTopic,
    pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    bouncer = pgbouncer(pool_size=3)
    topic = await park_topic(partitions=2)
    broken = Broken()
    broken.brake("key-1", since=2)
    broken.brake("key-2", since=3)
    events = make_events(keys=3, per_key=4)
    await publish(kafka_bootstrap, topic, events)
    consumer = build("pooled-park", pg_schema, topic, bouncer.dsn, kafka_bootstrap,
                     fail=broken, retry=PARK,
                     postgres=Postgres(pooler="transaction"))

    async def settled() -> bool:
        stats = consumer.stats
        return stats.applied + stats.parked >= len(events)

    async with Running(consumer):
        await wait_for(settled, 60, "every record applied or parked")
    assert consumer.stats.parked == 5
    broken.fix("key-1")
    report = await replay_key(consumer, b"key-1")
    assert (report.applied, report.duplicates, report.records) == (3, 0, 3)
    assert await _advisory_locks(pg_pool) == 0
    conn = await asyncpg.connect(bouncer.dsn, statement_cache_size=0)
    try:
        _, dropped = await discard_key(conn, pg_schema, consumer.name, b"key-2")
    finally:
        await conn.close()
    assert dropped == 2
    assert await _advisory_locks(pg_pool) == 0
    assert await parked_key_names(pg_pool, pg_schema) == []
    verify(await ledger(pg_pool, pg_schema),
           [e for e in events if not (e.key == "key-2" and e.seq >= 3)])


async def test_the_key_lock_stays_with_its_holder_while_another_client_takes_a_backend(
    pgbouncer: Callable[..., PgBouncer], pg_pool: asyncpg.Pool,
) -> None:
    """A session lock taken through the pooler stays on the backend that served it, which
    the pooler lends to the next client as soon as the statement ends; the unlock may reach
    another backend, and the lock outlives the replay. Held by a transaction, it cannot."""
    bouncer = pgbouncer(pool_size=2)
    key = ParkedKey("c", "t", 0, b"k", "handler_failed", "ValueError", datetime.now(UTC), 1,
                    None)
    holder = await asyncpg.connect(bouncer.dsn, statement_cache_size=0)
    other = await asyncpg.connect(bouncer.dsn, statement_cache_size=0)
    try:
        async with _exclusive(holder, "s", key, "busy {key}"):
            # the most recently used backend goes to the next client (PgBouncer is LIFO)
            busy = other.transaction()
            await busy.start()
            await other.fetchval("SELECT pg_backend_pid()")
            with pytest.raises(ParkingError, match="busy 'k'"):
                async with _exclusive(other, "s", key, "busy {key}"):
                    pass
        await busy.rollback()
    finally:
        await holder.close()
        await other.close()
    assert await _advisory_locks(pg_pool) == 0
