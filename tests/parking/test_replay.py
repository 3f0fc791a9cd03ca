"""Replaying a parked key applies its records once, in order, through the consumer's
handlers, even while the consumer keeps parking new records of the key; discarding one leaves
an audit row."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from consumerkit import Consumer, HandlerContext, RetryPolicy
from consumerkit.engine.replay import discard_key, replay_key
from consumerkit.errors import ParkingError

from ..integration.ledger import (
    Running,
    Step,
    build,
    make_events,
    publish,
    verify,
    wait_for,
)
from .conftest import Broken, ParkTopic, ledger, parked_key_names, parked_rows

PARK = RetryPolicy(max_attempts=1, on_exhausted="park")


async def test_replay_applies_once_in_order_and_a_second_replay_applies_nothing(
    postgres_dsn: str, kafka_bootstrap: str, park_topic: ParkTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await park_topic(partitions=2)
    broken = Broken()
    broken.brake("key-1", since=2)
    events = make_events(keys=3, per_key=6)
    await publish(kafka_bootstrap, topic, events)
    consumer = build("replay", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=broken,
                     retry=PARK)
    async with Running(consumer):
        await wait_for(lambda: _settled(consumer, len(events)), 60, "every record settled")
    assert consumer.stats.parked == 5
    # a fix that is only partial: the replay stops at the record that still fails
    broken.brake("key-1", since=4)
    with pytest.raises(ParkingError, match=r"replay stopped at .* \(event evt-1-4\) after 1 "
                                           r"attempts: ValueError: key-1 cannot be applied"):
        await replay_key(consumer, b"key-1")
    assert [r["event_id"] for r in await parked_rows(pg_pool, pg_schema)
            if r["replayed_at"] is None] == ["evt-1-4", "evt-1-5", "evt-1-6"]
    broken.fix("key-1")
    report = await replay_key(consumer, b"key-1")
    assert (report.applied, report.duplicates, report.records) == (3, 0, 3)
    verify(await ledger(pg_pool, pg_schema), events)
    assert await parked_rows(pg_pool, pg_schema) == []
    assert await parked_key_names(pg_pool, pg_schema) == []
    again = await replay_key(consumer, b"key-1")
    assert again.not_parked
    assert again.records == 0
    assert again.previously is not None
    assert again.previously[0] == "replayed"
    verify(await ledger(pg_pool, pg_schema), events)
    audit = await pg_pool.fetch(f'SELECT action, records FROM "{pg_schema}".parked_audit')
    assert [(a["action"], a["records"]) for a in audit] == [("replayed", 5)]


async def test_replay_while_the_consumer_parks_more_of_the_key_loses_nothing(
    postgres_dsn: str, kafka_bootstrap: str, park_topic: ParkTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await park_topic(partitions=1)
    broken = Broken()
    broken.brake("key-0")
    rounds = 8
    events = make_events(keys=2, per_key=4 * rounds)
    first, rest = events[:8], events[8:]
    await publish(kafka_bootstrap, topic, first)
    consumer = build("racing", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=broken,
                     retry=PARK)
    async with Running(consumer):
        await wait_for(lambda: _settled(consumer, len(first)), 60, "the first records")
        broken.fix("key-0")

        async def keep_publishing() -> None:
            for start in range(0, len(rest), 6):
                await publish(kafka_bootstrap, topic, rest[start:start + 6])
                await asyncio.sleep(0)

        async def replay_until_unparked() -> int:
            replayed = 0
            while True:  # a key parked again by a record in flight is replayed again
                report = await replay_key(consumer, b"key-0")
                if report.not_parked:
                    return replayed
                replayed += report.records

        replayed, _ = await asyncio.gather(replay_until_unparked(), keep_publishing())
        await wait_for(lambda: _ledger_has(pg_pool, pg_schema, len(events)), 60,
                       "every effect")
    verify(await ledger(pg_pool, pg_schema), events)
    assert replayed >= 4
    assert consumer.stats.parked >= replayed
    assert await parked_key_names(pg_pool, pg_schema) == []


async def test_discard_drops_the_records_and_leaves_an_audit_row(
    postgres_dsn: str, kafka_bootstrap: str, park_topic: ParkTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await park_topic(partitions=1)
    broken = Broken()
    broken.brake("key-1", since=2)
    events = make_events(keys=2, per_key=3)
    await publish(kafka_bootstrap, topic, events)
    consumer = build("discard", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=broken,
                     retry=PARK)
    async with Running(consumer):
        await wait_for(lambda: _settled(consumer, len(events)), 60, "every record settled")
        async with pg_pool.acquire() as conn:
            parked, dropped = await discard_key(conn, pg_schema, consumer.name, b"key-1")
            with pytest.raises(ParkingError, match=r"is not parked \(last discarded by"):
                await discard_key(conn, pg_schema, consumer.name, b"key-1")
        assert (parked.topic, parked.partition, dropped) == (topic, 0, 2)
        # the key is no longer parked: its next record is applied (the fix came meanwhile)
        broken.fix("key-1")
        later = make_events(keys=2, per_key=4)[-1]
        await publish(kafka_bootstrap, topic, [later])
        await wait_for(lambda: _settled(consumer, len(events) + 1), 60, "the later record")
    rows = await ledger(pg_pool, pg_schema)
    assert [r["event_id"] for r in rows if r["key"] == "key-1"] == ["evt-1-1", later.event_id]
    audit = await pg_pool.fetchrow(
        f'SELECT consumer, topic, "partition", key, action, records, actor, done_at '
        f'FROM "{pg_schema}".parked_audit')
    assert audit is not None
    assert (audit["consumer"], audit["topic"], audit["key"], audit["action"],
            audit["records"]) == (consumer.name, topic, b"key-1", "discarded", 2)
    assert "@" in audit["actor"]
    assert await parked_rows(pg_pool, pg_schema) == []


class Gated(Broken):
    """:class:`Broken`, and a handler that holds the record ``gate`` (after its effect, before
    its transaction ends) until ``go`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: str | None = None
        self.reached = asyncio.Event()
        self.go = asyncio.Event()

    async def __call__(self, event: Step, ctx: HandlerContext) -> None:
        if ctx.envelope.event_id == self.gate:
            self.reached.set()
            await self.go.wait()
        await super().__call__(event, ctx)


async def _parked_then_held(
    postgres_dsn: str, kafka_bootstrap: str, park_topic: ParkTopic, pg_schema: str,
) -> tuple[Consumer, Gated, asyncio.Task[Any]]:
    """key-1's last two records parked; a replay of it started and held in its first record."""
    topic = await park_topic(partitions=1)
    gated = Gated()
    gated.brake("key-1", since=2)
    events = make_events(keys=2, per_key=3)
    await publish(kafka_bootstrap, topic, events)
    consumer = build("held", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=gated,
                     retry=PARK)
    async with Running(consumer):
        await wait_for(lambda: _settled(consumer, len(events)), 60, "every record settled")
    gated.fix("key-1")
    gated.gate = "evt-1-2"
    replay = asyncio.create_task(replay_key(consumer, b"key-1"))
    await asyncio.wait_for(gated.reached.wait(), 30)
    return consumer, gated, replay


async def test_a_key_being_replayed_cannot_be_discarded(
    postgres_dsn: str, kafka_bootstrap: str, park_topic: ParkTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    """Else the replay would go on applying the records the audit calls dropped."""
    consumer, gated, replay = await _parked_then_held(
        postgres_dsn, kafka_bootstrap, park_topic, pg_schema)
    try:
        async with pg_pool.acquire() as conn:
            with pytest.raises(ParkingError, match="a replay of key 'key-1' is running: "
                                                   "discard it once the replay has ended"):
                await discard_key(conn, pg_schema, consumer.name, b"key-1")
    finally:
        gated.go.set()
    report = await asyncio.wait_for(replay, 30)
    assert (report.applied, report.records) == (2, 2)
    assert [r["event_id"] for r in await ledger(pg_pool, pg_schema) if r["key"] == "key-1"] == [
        "evt-1-1", "evt-1-2", "evt-1-3"]


async def test_records_deleted_under_a_replay_are_not_applied(
    postgres_dsn: str, kafka_bootstrap: str, park_topic: ParkTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    """Parked records deleted while their replay runs (by hand, or by an older version's
    discard, which did not wait): the record in flight rolls back, and the replay stops."""
    _, gated, replay = await _parked_then_held(
        postgres_dsn, kafka_bootstrap, park_topic, pg_schema)
    try:
        deleted = await pg_pool.execute(
            f'DELETE FROM "{pg_schema}".parked_records WHERE key = $1', b"key-1")
        assert deleted == "DELETE 2"
    finally:
        gated.go.set()
    with pytest.raises(ParkingError, match=r"\(event evt-1-2\): its key was discarded "
                                           "meanwhile; neither it nor any later record"):
        await asyncio.wait_for(replay, 30)
    assert [r["event_id"] for r in await ledger(pg_pool, pg_schema) if r["key"] == "key-1"] == [
        "evt-1-1"]


async def _settled(consumer: object, value: int) -> bool:
    s = consumer.stats  # type: ignore[attr-defined]
    return bool(s.applied + s.duplicates + s.dead_lettered + s.parked >= value)


async def _ledger_has(pool: asyncpg.Pool, schema: str, value: int) -> bool:
    return bool(await pool.fetchval(f'SELECT count(*) FROM "{schema}".ledger') >= value)
