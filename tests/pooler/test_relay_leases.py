"""Relays behind a real PgBouncer in transaction mode, whose slots are leases in a table:
two relays publish every event exactly once in each aggregate's order, while events keep
coming and one of them stops; a relay whose leases ran short publishes nothing."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import orjson
import pytest

from consumerkit import Postgres
from consumerkit.errors import ConfigurationError
from consumerkit.outbox import KafkaSink, NewEvent, Outbox, OutboxEvent, OutboxTable, Relay
from consumerkit.outbox.admin import cleanup
from consumerkit.outbox.slots import SlotOwner
from consumerkit.outbox.table import SLOTS
from consumerkit.testing.services import MakeTopic

from ..brokers import PRODUCER_OPTIONS
from ..outbox.conftest import Published, RelayRunning, pending, read_all, wait_until
from .conftest import PgBouncer

AGGREGATES = 12


def _relay(dsn: str, bootstrap: str, topic: str, table: OutboxTable, name: str) -> Relay:
    sink = KafkaSink(bootstrap, route=topic, kafka_options=dict(PRODUCER_OPTIONS))
    return Relay(Postgres(dsn=dsn, schema=table.schema, pooler="transaction"), sink,
                 table=table.table, handle_signals=False,
                 poll_interval=0.1, batch_size=50, name=name)


async def _write(pool: asyncpg.Pool[asyncpg.Record], outbox: Outbox, first: int,
                 count: int) -> None:
    for n in range(first, first + count):
        async with pool.acquire() as conn, conn.transaction():
            await outbox.add(conn, event_type="step", aggregate_type="account",
                             aggregate_id=f"a-{n % AGGREGATES}", payload={"n": n})


def _check_once_in_order(records: list[Published], total: int) -> None:
    numbers = [orjson.loads(r.value or b"")["n"] for r in records]
    twice = [n for n, c in Counter(numbers).items() if c > 1]
    assert not twice, f"{len(twice)} events published more than once: {sorted(twice)[:10]}"
    assert sorted(numbers) == list(range(total)), "events lost"
    for key in {r.key for r in records}:
        mine = [orjson.loads(r.value or b"")["n"] for r in records if r.key == key]
        assert mine == sorted(mine), f"aggregate {key!r} out of order"


@pytest.mark.parametrize("prepared_statements", [0, 200], ids=["pgbouncer-1.18", "ps-200"])
async def test_two_relays_publish_every_event_once_in_order_while_one_stops(
    pgbouncer: Callable[..., PgBouncer], pg_pool: asyncpg.Pool[asyncpg.Record],
    kafka_bootstrap: str, make_topic: MakeTopic, outbox: Outbox, outbox_table: OutboxTable,
    prepared_statements: int,
) -> None:
    # fewer backends than the relays' connections; with and without PgBouncer's own
    # prepared statements (1.21+), which the relay must not need nor be broken by
    bouncer = pgbouncer(pool_size=3, prepared_statements=prepared_statements)
    topic = await make_topic(partitions=1)  # one partition: the topic's order is the order
    await _write(pg_pool, outbox, 0, 150)
    first = _relay(bouncer.dsn, kafka_bootstrap, topic, outbox_table, "first")
    second = _relay(bouncer.dsn, kafka_bootstrap, topic, outbox_table, "second")
    async with RelayRunning(first), RelayRunning(second):
        await wait_until(lambda: _shared(first, second), 60, "the slots shared by two relays")
        await _write(pg_pool, outbox, 150, 150)
        first.stop()  # its leases are given back: the other takes every slot
        await wait_until(lambda: _alone(second), 60, "every slot leased to the second")
        await _write(pg_pool, outbox, 300, 100)

        async def drained() -> bool:
            return await pending(pg_pool, outbox_table) == 0

        await wait_until(drained, 90, "the outbox drained through PgBouncer")
    records = await read_all(kafka_bootstrap, [topic], lambda found: len(found) >= 400)
    _check_once_in_order(records, 400)
    assert first.published > 0
    assert second.published > 0
    assert first.published + second.published == 400


async def _shared(*relays: Relay) -> bool:
    slots = [r.slots for r in relays]
    return all(slots) and sum(len(s) for s in slots) == SLOTS and not (slots[0] & slots[1])


async def _alone(relay: Relay) -> bool:
    return len(relay.slots) == SLOTS


class _SlowFirstBatch:
    """A broker that takes ``delay`` seconds to take the first batch, then answers at once."""

    def __init__(self, sink: KafkaSink, delay: float) -> None:
        self.sink = sink
        self.delay = delay
        self.sending = asyncio.Event()

    async def open(self) -> None:
        await self.sink.open()

    async def send(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        if not self.sending.is_set():
            self.sending.set()
            await asyncio.sleep(self.delay)  # the fault: acknowledgements that take long
        return await self.sink.send(events)

    async def close(self) -> None:
        await self.sink.close()


async def test_a_batch_sent_for_longer_than_its_leases_keeps_its_slots(
    pgbouncer: Callable[..., PgBouncer], pg_pool: asyncpg.Pool[asyncpg.Record],
    kafka_bootstrap: str, make_topic: MakeTopic, outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    """The leases are renewed while a batch is sent: a second relay waiting for slots takes
    none of them during a send three lease lifetimes long, and publishes no row twice."""
    bouncer = pgbouncer(pool_size=3)
    topic = await make_topic(partitions=1)
    await _write(pg_pool, outbox, 0, 100)
    slow = _relay(bouncer.dsn, kafka_bootstrap, topic, outbox_table, "slow")
    assert slow._leases is not None
    slow._leases.ttl = 2.0  # short leases, so the send outlasts them quickly
    sink = _SlowFirstBatch(KafkaSink(kafka_bootstrap, route=topic,
                                     kafka_options=dict(PRODUCER_OPTIONS)), 3 * 2.0)
    slow.sink = sink
    other = _relay(bouncer.dsn, kafka_bootstrap, topic, outbox_table, "other")
    async with RelayRunning(slow):
        async with asyncio.timeout(60):
            await sink.sending.wait()
        assert len(slow.slots) == SLOTS
        async with RelayRunning(other):

            async def drained() -> bool:
                return await pending(pg_pool, outbox_table) == 0

            await wait_until(drained, 90, "the outbox drained")
    records = await read_all(kafka_bootstrap, [topic], lambda found: len(found) >= 100)
    _check_once_in_order(records, 100)
    assert slow.published + other.published == 100


async def test_a_relay_whose_leases_ran_short_claims_nothing(
    pgbouncer: Callable[..., PgBouncer], pg_pool: asyncpg.Pool[asyncpg.Record],
    kafka_bootstrap: str, outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    """The claim itself checks the lease: once less than half of it is left (renewals no
    longer reached the database), no row is claimed, even for slots the relay thinks its
    own."""
    bouncer = pgbouncer(pool_size=2)
    await _write(pg_pool, outbox, 0, 5)
    relay = _relay(bouncer.dsn, kafka_bootstrap, "unused", outbox_table, "lapsed")
    leases = relay._leases
    assert leases is not None
    owned = await leases.rebalance()
    assert len(owned) == SLOTS
    conn = await asyncpg.connect(bouncer.dsn, statement_cache_size=0)
    try:
        store = relay._store
        assert len(await store.claim(conn, owned, 50)) == 5
        await pg_pool.execute(f"UPDATE {outbox_table.leases} SET expires_at = now() + "
                              f"interval '{leases.ttl / 2 - 1} seconds'")
        assert await store.claim(conn, owned, 50) == []
    finally:
        await conn.close()
        await leases.close()
    assert await pg_pool.fetchval(f"SELECT count(*) FROM {outbox_table.leases}") == 0


def _rows_read(plan: dict[str, Any], alias: str) -> float:
    """Rows the nodes of ``plan`` scanning ``alias`` returned, loops included."""
    own = (plan.get("Actual Rows", 0) * plan.get("Actual Loops", 1)
           if plan.get("Alias") == alias else 0)
    return own + sum(_rows_read(child, alias) for child in plan.get("Plans", []))


async def test_the_claim_behind_leases_reads_a_batch_not_the_whole_backlog(
    pgbouncer: Callable[..., PgBouncer], pg_pool: asyncpg.Pool[asyncpg.Record],
    kafka_bootstrap: str, outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    """The lease check is a filter on the rows read in seq order, which stop at the batch's
    LIMIT: as a join with the leases it read and sorted every pending row for each batch (a
    relay draining a backlog of 20,000 rows through PgBouncer ran at 0.3x of a direct one)."""
    bouncer = pgbouncer(pool_size=2)
    async with pg_pool.acquire() as writer, writer.transaction():
        await outbox.add_many(writer, [NewEvent("step", "account", f"a-{n % 100}", {"n": n})
                                       for n in range(3_000)])
    await pg_pool.execute(f"ANALYZE {outbox_table.events}")
    relay = _relay(bouncer.dsn, kafka_bootstrap, "unused", outbox_table, "reader")
    leases = relay._leases
    assert leases is not None
    owned = await leases.rebalance()
    conn = await asyncpg.connect(bouncer.dsn, statement_cache_size=0)
    try:
        assert len(await relay._store.claim(conn, owned, 50)) == 50
        plan = orjson.loads(await conn.fetchval(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + relay._store._claim, sorted(owned), 50,
            leases.holder, leases.ttl / 2))[0]["Plan"]
    finally:
        await conn.close()
        await leases.close()
    assert _rows_read(plan, "o") <= 500, f"the claim read {_rows_read(plan, 'o'):.0f} rows"


async def test_cleanup_through_the_pooler_refuses_while_a_leasing_relay_lives(
    pgbouncer: Callable[..., PgBouncer], pg_pool: asyncpg.Pool[asyncpg.Record],
    kafka_bootstrap: str, outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    """Its pending rows are not garbage; and the cleanup's lock, held by each batch's
    transaction, leaves nothing on the pooler's backends."""
    bouncer = pgbouncer(pool_size=2)
    async with pg_pool.acquire() as writer, writer.transaction():
        await outbox.add(writer, event_type="step", aggregate_type="account",
                         aggregate_id="a-0", payload={"n": 0},
                         occurred_at=datetime.now(UTC) - timedelta(days=30))
    relay = _relay(bouncer.dsn, kafka_bootstrap, "unused", outbox_table, "living")
    assert relay._leases is not None
    await relay._leases.rebalance()
    conn = await asyncpg.connect(bouncer.dsn, statement_cache_size=0)
    try:
        with pytest.raises(ConfigurationError, match="is running: its pending rows"):
            await cleanup(conn, timedelta(days=1), table=outbox_table)
        await relay._leases.close()
        assert await cleanup(conn, timedelta(days=1), table=outbox_table) == 1
    finally:
        await conn.close()
    locks = await pg_pool.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
    assert locks == 0


async def test_relays_holding_slots_by_locks_and_by_leases_refuse_to_share_an_outbox(
    pgbouncer: Callable[..., PgBouncer], direct_postgres_dsn: str, kafka_bootstrap: str,
    outbox_table: OutboxTable,
) -> None:
    """Neither would see the other's slots: each aggregate could get two publishers."""
    bouncer = pgbouncer(pool_size=2)
    leasing = _relay(bouncer.dsn, kafka_bootstrap, "unused", outbox_table, "leasing")
    assert leasing._leases is not None
    locking = SlotOwner(direct_postgres_dsn, outbox_table, name="locking", on_notify=None)
    try:
        await locking.rebalance()
        with pytest.raises(ConfigurationError, match=r"same Postgres\(pooler=\.\.\.\)"):
            await leasing._leases.rebalance()
        await locking.close()
        assert len(await leasing._leases.rebalance()) == SLOTS
        with pytest.raises(ConfigurationError, match=r"same Postgres\(pooler=\.\.\.\)"):
            await locking.rebalance()
    finally:
        await locking.close()
        await leasing._leases.close()
