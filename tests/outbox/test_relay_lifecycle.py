"""Relays over their lifetime, in one process: two relays split the slots without overlap; the
one left takes every slot of a relay that stops, is cancelled mid-batch or loses its
PostgreSQL backends mid-batch, and publishes every aggregate in order; ``stop()`` lets the
batch in flight finish and records it, so the next relay sends nothing again and loses
nothing."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Sequence
from uuid import UUID

import asyncpg
import orjson

from consumerkit import Postgres
from consumerkit.outbox import (
    SLOTS,
    KafkaSink,
    NewEvent,
    Outbox,
    OutboxEvent,
    OutboxTable,
    Relay,
    live_relays,
)
from consumerkit.outbox.admin import slot_owners
from consumerkit.outbox.webhook import WebhookSink
from consumerkit.testing.services import MakeTopic
from tests.webhooks.conftest import Reply, ScriptedEndpoint, serve

from ..brokers import PRODUCER_OPTIONS
from ..pooling import POOLER, direct_only
from .conftest import Published, RelayRunning, pending, read_all, wait_until

ALL_SLOTS = frozenset(range(SLOTS))
AGGREGATES = [f"agg-{i}" for i in range(48)]
TIMEOUT = 60.0

Written = dict[UUID, tuple[str, int, int]]  # event id -> (aggregate, n, slot)


class GatedSink(KafkaSink):
    """The real Kafka sink, except that while ``gate`` is closed a batch waits at it before
    it is sent. Remembers the batch waiting and the events acknowledged."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(bootstrap, route=topic, kafka_options=dict(PRODUCER_OPTIONS))
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting: list[OutboxEvent] = []
        self.sent: list[OutboxEvent] = []

    async def send(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        if not self.gate.is_set():
            self.waiting = list(events)
            await self.gate.wait()
        results = await super().send(events)
        self.sent.extend(e for e, r in zip(events, results, strict=True) if r is None)
        return results

    def sent_ids(self) -> set[UUID]:
        return {e.event_id for e in self.sent}


def kafka_relay(dsn: str, table: OutboxTable, bootstrap: str, topic: str,
                name: str) -> tuple[Relay, GatedSink]:
    sink = GatedSink(bootstrap, topic)
    relay = Relay(Postgres(dsn=dsn, schema=table.schema, pooler=POOLER), sink, table=table.table,
                  name=f"{table.schema}-{name}", handle_signals=False, rebalance_interval=0.2,
                  poll_interval=0.2)
    return relay, sink


async def write(pool: asyncpg.Pool[asyncpg.Record], outbox: Outbox, n: int) -> Written:
    """Event ``n`` of every aggregate, in one transaction, with the slot each one landed in."""
    async with pool.acquire() as conn, conn.transaction():
        ids = await outbox.add_many(conn, [
            NewEvent("step.recorded", "ledger", a, {"aggregate": a, "n": n})
            for a in AGGREGATES])
        slots = {r["id"]: r["slot"] for r in await conn.fetch(
            f"SELECT id, slot FROM {outbox.table.events} WHERE id = ANY($1::uuid[])", ids)}
    return {i: (a, n, slots[i]) for i, a in zip(ids, AGGREGATES, strict=True)}


async def held_at_gate(pool: asyncpg.Pool[asyncpg.Record], outbox: Outbox, relay: Relay,
                       sink: GatedSink) -> tuple[Written, set[UUID]]:
    """Close ``sink``'s gate, write one event per aggregate, and wait until ``relay``'s batch
    of the events in its slots waits at the gate; the events written and those held."""
    slots = relay.slots
    sink.gate.clear()
    written = await write(pool, outbox, 1)
    held = {i for i, (_, _, slot) in written.items() if slot in slots}
    assert held

    async def at_gate() -> bool:
        return {e.event_id for e in sink.waiting} == held

    await wait_until(at_gate, TIMEOUT, "the relay's batch waiting at the gate")
    return written, held


async def owners(pool: asyncpg.Pool[asyncpg.Record], table: OutboxTable) -> dict[int, int | str]:
    async with pool.acquire() as conn:
        return await slot_owners(conn, table)


async def relays_live(pool: asyncpg.Pool[asyncpg.Record], table: OutboxTable) -> int:
    async with pool.acquire() as conn:
        return await live_relays(conn, table)


async def settled(pool: asyncpg.Pool[asyncpg.Record], table: OutboxTable,
                  *relays: Relay) -> bool:
    """Each relay holds its fair share, and every slot is held."""
    fair = -(-SLOTS // len(relays))
    return (all(len(r.slots) == fair for r in relays)
            and len(await owners(pool, table)) == SLOTS)


async def assert_split(pool: asyncpg.Pool[asyncpg.Record], table: OutboxTable,
                       relays: Sequence[Relay]) -> dict[int, int | str]:
    """The relays' slots are disjoint and cover every slot, and ``pg_locks`` agrees: each
    relay's slots are held by one backend of its own. Returns ``{slot: pid}``."""
    held = await owners(pool, table)
    assert set(held) == ALL_SLOTS
    for i, relay in enumerate(relays):
        for other in relays[i + 1:]:
            assert relay.slots.isdisjoint(other.slots), (relay.name, other.name)
    assert frozenset().union(*(r.slots for r in relays)) == ALL_SLOTS
    pids = [{held[s] for s in r.slots} for r in relays]
    assert all(len(p) == 1 for p in pids), pids
    assert len(set().union(*pids)) == len(relays)
    return held


async def backends(pool: asyncpg.Pool[asyncpg.Record], relay: Relay) -> list[int]:
    """The pids of the relay's PostgreSQL connections."""
    rows = await pool.fetch("SELECT pid FROM pg_stat_activity WHERE application_name = $1",
                            f"consumerkit-relay {relay.name}"[:63])
    return [r["pid"] for r in rows]


async def no_backends(pool: asyncpg.Pool[asyncpg.Record], relay: Relay) -> bool:
    """No connection of the relay is left. Behind a transaction pooler, whose server
    connections are shared and stay pooled under the last client's name: its membership was
    given back on the way out."""
    if relay._leases is not None:
        return not await pool.fetchval(
            f"SELECT count(*) FROM {relay.table.members} WHERE holder = $1",
            relay._leases.holder)
    return not await backends(pool, relay)


async def drained(pool: asyncpg.Pool[asyncpg.Record], table: OutboxTable) -> bool:
    return await pending(pool, table) == 0


def event_ids(records: list[Published]) -> list[UUID]:
    return [UUID(r.headers["id"].decode()) for r in records]


def first_order(records: list[Published], written: Written) -> dict[str, list[int]]:
    """Per aggregate, the ``n`` of its events in the order they first reached the broker;
    fails on an event that was never written."""
    order: dict[str, list[int]] = {}
    seen: set[UUID] = set()
    for event_id, record in zip(event_ids(records), records, strict=True):
        if event_id in seen:
            continue
        seen.add(event_id)
        payload = orjson.loads(record.value or b"")
        assert written[event_id][:2] == (payload["aggregate"], payload["n"])
        order.setdefault(payload["aggregate"], []).append(payload["n"])
    return order


async def test_two_relays_split_the_slots_and_the_one_left_takes_all_after_a_stop(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, kafka_bootstrap: str,
    make_topic: MakeTopic, outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    """Two relays settle on disjoint halves of the slots and each sends only the events of its
    own. Once one stops, it holds nothing and has no connection left, the other owns every
    slot and publishes the next event of every aggregate, in order."""
    topic = await make_topic(partitions=4)
    a, sink_a = kafka_relay(postgres_dsn, outbox_table, kafka_bootstrap, topic, "a")
    b, sink_b = kafka_relay(postgres_dsn, outbox_table, kafka_bootstrap, topic, "b")
    async with contextlib.AsyncExitStack() as stack:
        running_a = RelayRunning(a)
        await stack.enter_async_context(running_a)
        await stack.enter_async_context(RelayRunning(b))
        await wait_until(lambda: settled(pg_pool, outbox_table, a, b), TIMEOUT,
                         "two relays settled")
        await assert_split(pg_pool, outbox_table, [a, b])
        assert await relays_live(pg_pool, outbox_table) == 2
        slots_a, slots_b = a.slots, b.slots

        before = await write(pg_pool, outbox, 1)
        await wait_until(lambda: drained(pg_pool, outbox_table), TIMEOUT, "first events out")
        assert (a.slots, b.slots) == (slots_a, slots_b)  # nothing moved meanwhile
        assert sink_a.sent
        assert sink_b.sent
        assert {before[e.event_id][2] for e in sink_a.sent} <= slots_a
        assert {before[e.event_id][2] for e in sink_b.sent} <= slots_b

        a.stop()
        assert running_a.task is not None
        async with asyncio.timeout(TIMEOUT):
            await running_a.task
        assert not a.slots
        await wait_until(lambda: settled(pg_pool, outbox_table, b), TIMEOUT,
                         "the relay left owning every slot")
        await assert_split(pg_pool, outbox_table, [b])
        await wait_until(lambda: no_backends(pg_pool, a), TIMEOUT, "a's connections closed")
        assert await relays_live(pg_pool, outbox_table) == 1

        after = await write(pg_pool, outbox, 2)
        assert {slot for _, _, slot in after.values()} & slots_a, "no aggregate of a's slots"
        await wait_until(lambda: drained(pg_pool, outbox_table), TIMEOUT, "second events out")
        assert set(after) <= sink_b.sent_ids()

    written = before | after
    records = await read_all(kafka_bootstrap, [topic],
                             lambda found: set(written) <= set(event_ids(found)))
    assert first_order(records, written) == {agg: [1, 2] for agg in AGGREGATES}


async def test_a_relay_cancelled_mid_batch_leaves_its_slots_and_rows_to_the_other(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, kafka_bootstrap: str,
    make_topic: MakeTopic, outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    """A relay whose task is cancelled while its batch waits to be sent (a sibling task failed,
    the program is shutting down) closes its connections on the way out: the other relay
    takes every slot and publishes the abandoned batch and the next events, in order."""
    topic = await make_topic(partitions=4)
    a, sink_a = kafka_relay(postgres_dsn, outbox_table, kafka_bootstrap, topic, "a")
    b, sink_b = kafka_relay(postgres_dsn, outbox_table, kafka_bootstrap, topic, "b")
    async with RelayRunning(b):
        task_a = asyncio.create_task(a.run())
        try:
            await wait_until(lambda: settled(pg_pool, outbox_table, a, b), TIMEOUT,
                             "two relays settled")
            first, abandoned = await held_at_gate(pg_pool, outbox, a, sink_a)
            task_a.cancel()
            await asyncio.wait({task_a}, timeout=TIMEOUT)
            assert task_a.cancelled()
        finally:
            task_a.cancel()
            await asyncio.wait({task_a}, timeout=TIMEOUT)
        assert not a.slots
        await wait_until(lambda: no_backends(pg_pool, a), TIMEOUT, "a's connections closed")
        await wait_until(lambda: settled(pg_pool, outbox_table, b), TIMEOUT,
                         "the relay left owning every slot")
        await assert_split(pg_pool, outbox_table, [b])
        second = await write(pg_pool, outbox, 2)
        await wait_until(lambda: drained(pg_pool, outbox_table), TIMEOUT, "everything out")
        assert abandoned | set(second) <= sink_b.sent_ids()
        assert not sink_a.sent

    written = first | second
    records = await read_all(kafka_bootstrap, [topic],
                             lambda found: set(written) <= set(event_ids(found)))
    assert first_order(records, written) == {agg: [1, 2] for agg in AGGREGATES}


@direct_only("terminates the relay's own backends; behind PgBouncer it has none (shared "
             "server connections; lost leases: tests/pooler/test_relay_leases.py)")
async def test_a_relay_whose_backends_die_mid_batch_loses_its_slots_to_the_other(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, kafka_bootstrap: str,
    make_topic: MakeTopic, outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    """Relay a hangs in a send when its PostgreSQL backends are terminated: it owns nothing any
    more, and while it still hangs the other relay takes every slot and publishes a's pending
    rows and the next event of every aggregate. Released, a reconnects and the two split the
    slots again. On the broker every aggregate is in order, and only rows of a's stale batch
    may appear twice (the duplicates the docs allow)."""
    topic = await make_topic(partitions=4)
    a, sink_a = kafka_relay(postgres_dsn, outbox_table, kafka_bootstrap, topic, "a")
    b, sink_b = kafka_relay(postgres_dsn, outbox_table, kafka_bootstrap, topic, "b")
    async with RelayRunning(a), RelayRunning(b):
        try:
            await wait_until(lambda: settled(pg_pool, outbox_table, a, b), TIMEOUT,
                             "two relays settled")
            first, stuck = await held_at_gate(pg_pool, outbox, a, sink_a)
            killed = await backends(pg_pool, a)
            assert len(killed) == 2  # the lock connection and the one that claims and deletes
            await pg_pool.execute("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) pid",
                                  killed)

            async def a_owns_nothing() -> bool:
                return not a.slots

            await wait_until(a_owns_nothing, TIMEOUT, "a noticing its lost lock connection")
            await wait_until(lambda: settled(pg_pool, outbox_table, b), TIMEOUT,
                             "b owning every slot")
            await assert_split(pg_pool, outbox_table, [b])
            second = await write(pg_pool, outbox, 2)
            await wait_until(lambda: drained(pg_pool, outbox_table), TIMEOUT,
                             "b publishing a's rows and the second events")
            assert stuck | set(second) <= sink_b.sent_ids()  # all of it while a hangs

            sink_a.gate.set()
            await wait_until(lambda: settled(pg_pool, outbox_table, a, b), TIMEOUT,
                             "the relays split again")
            await assert_split(pg_pool, outbox_table, [a, b])
            third = await write(pg_pool, outbox, 3)
            await wait_until(lambda: drained(pg_pool, outbox_table), TIMEOUT, "third events out")
        finally:
            sink_a.gate.set()  # never leave a hanging

    written = first | second | third
    records = await read_all(kafka_bootstrap, [topic],
                             lambda found: set(written) <= set(event_ids(found)))
    assert first_order(records, written) == {agg: [1, 2, 3] for agg in AGGREGATES}
    twice = {i for i, n in Counter(event_ids(records)).items() if n > 1}
    assert twice <= stuck


async def test_stop_lets_the_batch_in_flight_finish_and_the_next_relay_sends_nothing_again(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, outbox: Outbox,
    outbox_table: OutboxTable,
) -> None:
    """``stop()`` during a send: ``run()`` waits for the batch (a held request, then the next
    event of its aggregate), records it and returns, without starting another batch. A new
    relay then delivers only what was left, each event exactly once, in order per
    aggregate."""
    app = ScriptedEndpoint()
    gate = asyncio.Event()

    async def add(aggregate: str, n: int) -> str:
        async with pg_pool.acquire() as conn, conn.transaction():
            added = await outbox.add(conn, event_type="e", aggregate_type="order",
                                     aggregate_id=aggregate, payload={"n": n})
        assert added is not None
        return str(added)

    held1, held2, other1 = await add("held", 1), await add("held", 2), await add("other", 1)
    app.script(held1, Reply(gate=gate))
    async with serve(app, lifespan="off") as url:
        relay = Relay(Postgres(dsn=postgres_dsn, schema=outbox_table.schema, pooler=POOLER),
                      WebhookSink(url, timeout=TIMEOUT),
                      handle_signals=False)
        task = asyncio.create_task(relay.run())
        try:
            async with asyncio.timeout(TIMEOUT):
                await app.arrival(held1).wait()
            relay.stop()
            late = await add("late", 1)  # written after stop(): for the next relay
            done, _ = await asyncio.wait({task}, timeout=0.5)
            assert not done, "run() returned with a batch in flight"
            gate.set()
            async with asyncio.timeout(TIMEOUT):
                await task
        finally:
            gate.set()
            task.cancel()
            await asyncio.wait({task}, timeout=TIMEOUT)
        assert relay.published == 3
        assert sorted(app.answered) == sorted([held1, held2, other1])
        assert [k for k in app.answered if k != other1] == [held1, held2]
        assert await pending(pg_pool, outbox_table) == 1  # only the late event

        held3 = await add("held", 3)
        fresh = Relay(Postgres(dsn=postgres_dsn, schema=outbox_table.schema, pooler=POOLER),
                      WebhookSink(url, timeout=TIMEOUT),
                      handle_signals=False)
        async with RelayRunning(fresh):
            await wait_until(lambda: drained(pg_pool, outbox_table), TIMEOUT,
                             "the rest delivered")
        assert fresh.published == 2

    keys = [r.key for r in app.requests]
    assert Counter(keys) == Counter([held1, held2, other1, late, held3])
    assert [k for k in keys if k in (held1, held2, held3)] == [held1, held2, held3]

