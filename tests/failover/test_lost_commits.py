"""A failover to a standby that missed the last commits, under a running consumer.

The consumer applies records and commits their offsets to Kafka. The standby is held back,
so the transactions of the records applied meanwhile reach the primary alone; the primary
dies and the standby is promoted. With the offsets in Kafka (``offset_store="kafka"``),
those effects are gone with the primary while the group's offsets are already past their
records: nothing applies them again. The test asserts that loss, counted, as a negative
control: the failover really loses what it should. With ``offset_store="postgres"`` the
stored offsets go back with the effects, the consumer reads them again after losing its
connections, and applies those records again: nothing lost, nothing twice, in order."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from consumerkit import migrate
from consumerkit.dedup.redis import RedisDedupCache
from consumerkit.testing.services import MakeTopic
from tests.harness import ReplicatedPostgres
from tests.integration.ledger import (
    Event,
    Running,
    build,
    create_ledger,
    group,
    ledger_rows,
    make_events,
    publish,
    settled,
    wait_for,
)

TIMEOUT = 90.0
SCHEMA = "lost"
KEYS = 6
PARTITIONS = 3


async def committed(bootstrap: str, group_id: str, topic: str, partitions: int) -> int:
    """The group's committed offsets of ``topic``, summed: on a topic written without
    transactions offsets have no gaps, so this counts the records committed."""
    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id,
                             enable_auto_commit=False)
    await probe.start()
    try:
        offsets = [await probe.committed(TopicPartition(topic, p)) for p in range(partitions)]
    finally:
        await probe.stop()
    return sum(o or 0 for o in offsets)


async def _applied(dsn: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return await ledger_rows(conn, SCHEMA)
    finally:
        await conn.close()


def _order_breaks(rows: Sequence[asyncpg.Record]) -> int:
    """Effects not the next of their key's sequence (the first effect after a gap counts)."""
    last: dict[str, int] = {}
    breaks = 0
    for r in rows:
        breaks += r["seq"] != last.get(r["key"], 0) + 1
        last[r["key"]] = r["seq"]
    return breaks


async def _fail_over_under_a_consumer(
        pair: ReplicatedPostgres, bootstrap: str, topic: str, offset_store: str,
        redis_url: str | None = None,
) -> tuple[list[Event], list[Event], list[asyncpg.Record], int]:
    """(every event, those applied while the standby was held back, the effects on the new
    primary in the order applied, the consumer's count of effects applied)."""
    conn = await asyncpg.connect(pair.dsn, timeout=10)
    try:
        await migrate(conn, SCHEMA)
        await create_ledger(conn, SCHEMA)
    finally:
        await conn.close()
    events = make_events(KEYS, 30)  # key by key: seq 1..10 replicated, 11..20 held, 21..30 after
    replicated, held, after = events[:10 * KEYS], events[10 * KEYS:20 * KEYS], events[20 * KEYS:]
    cache = RedisDedupCache(redis_url, retry_interval=0.5) if redis_url else None
    consumer = build("lost", SCHEMA, topic, pair.dsn, bootstrap, migrate=False,
                     offset_store=offset_store, dedup_cache=cache)
    group_id = group("lost", topic)

    async def _committed(records: int) -> bool:
        return await committed(bootstrap, group_id, topic, PARTITIONS) >= records

    async with Running(consumer):
        await publish(bootstrap, topic, replicated)
        await wait_for(lambda: settled(consumer, len(replicated)), TIMEOUT, "the first events")
        await wait_for(lambda: _committed(len(replicated)), TIMEOUT,
                       "the offsets of the first events")
        await asyncio.to_thread(pair.wait_caught_up)

        pair.hold_back()  # from here on the standby misses every commit
        await publish(bootstrap, topic, held)
        await wait_for(lambda: settled(consumer, len(replicated) + len(held)), TIMEOUT,
                       "the events applied while the standby is held back")
        await wait_for(lambda: _committed(len(replicated) + len(held)), TIMEOUT,
                       "their offsets, committed to Kafka")
        assert len(await _applied(pair.primary_dsn)) == len(replicated) + len(held)

        await asyncio.to_thread(pair.kill_primary)
        await asyncio.to_thread(pair.promote)
        await publish(bootstrap, topic, after)

        async def after_applied() -> bool:  # those of each key come after its held ones
            done = {r["event_id"] for r in await _applied(pair.dsn)}
            return all(e.event_id in done for e in after)

        await wait_for(after_applied, TIMEOUT, "the events sent after the failover")

    return events, held, await _applied(pair.dsn), consumer.stats.applied


async def test_with_offsets_in_kafka_a_failover_to_a_lagging_standby_loses_effects(
        pair: ReplicatedPostgres, kafka_bootstrap: str, make_topic: MakeTopic) -> None:
    topic = await make_topic(partitions=PARTITIONS)
    events, held, rows, applied_by_consumer = await _fail_over_under_a_consumer(
        pair, kafka_bootstrap, topic, "kafka")
    applied = Counter(r["event_id"] for r in rows)
    lost = [e for e in events if e.event_id not in applied]
    # the loss: every event applied while the standby was held back, and nothing else
    assert {e.event_id for e in lost} == {e.event_id for e in held}
    assert len(lost) == len(held) == 60
    assert sum(n - 1 for n in applied.values()) == 0  # no duplicate effect
    # each key's sequence jumps from 10 to 21: one order break per key
    assert _order_breaks(rows) == KEYS
    assert applied_by_consumer == len(events)  # the consumer did apply them, once
    print(f"offset_store=kafka: {len(events)} events applied, {len(lost)} lost in the failover, "
          f"{_order_breaks(rows)} keys out of sequence")


@pytest.mark.parametrize("cached", [False, True], ids=["no-cache", "redis-cache"])
async def test_with_offsets_in_postgres_a_failover_to_a_lagging_standby_loses_nothing(
        pair: ReplicatedPostgres, kafka_bootstrap: str, make_topic: MakeTopic,
        request: pytest.FixtureRequest, cached: bool) -> None:
    """With the Redis dedup cache too: it remembers the held-back ids, applied on the
    primary that died; those entries must not count on the promoted standby."""
    topic = await make_topic(partitions=PARTITIONS)
    redis_url = request.getfixturevalue("redis_url") if cached else None
    events, held, rows, applied_by_consumer = await _fail_over_under_a_consumer(
        pair, kafka_bootstrap, topic, "postgres", redis_url)
    applied = Counter(r["event_id"] for r in rows)
    assert [e.event_id for e in events if e.event_id not in applied] == []  # none lost
    assert sum(n - 1 for n in applied.values()) == 0  # no duplicate effect
    assert len(rows) == len(events)
    assert _order_breaks(rows) == 0  # every key in sequence
    # the consumer applied the held-back records twice: once on the primary that died, once
    # again on the promoted standby, where only the second is
    assert applied_by_consumer == len(events) + len(held)
    print(f"offset_store=postgres: {len(events)} events, 0 lost, {len(held)} applied again "
          "after the failover")
