"""A consumer that parks: the culprit and every later record of its key wait, in order, while
other keys flow and the offsets move on; a restarted consumer still holds the key."""

from __future__ import annotations

import logging

import asyncpg
import orjson
import pytest
from prometheus_client import CollectorRegistry

from consumerkit import Consumer, HandlerContext, Limits, RetryPolicy, handler
from consumerkit.logs import MESSAGE_FIELDS, JsonFormatter

from ..integration.ledger import (
    Running,
    Step,
    build,
    group,
    ledger_handler,
    make_events,
    publish,
    verify,
    wait_for,
)
from .conftest import Broken, ParkTopic, committed_total, ledger, parked_key_names, parked_rows

PARK = RetryPolicy(max_attempts=2, initial_delay=0.01, max_delay=0.02, on_exhausted="park")


@pytest.mark.parametrize("max_batch", [1, 500])
async def test_a_failing_key_is_parked_in_order_while_other_keys_flow(
    postgres_dsn: str, kafka_bootstrap: str, park_topic: ParkTopic, pg_schema: str,
    pg_pool: asyncpg.Pool, max_batch: int, caplog: pytest.LogCaptureFixture,
) -> None:
    topic = await park_topic(partitions=2)
    broken = Broken()
    broken.brake("key-1", since=2)
    events = make_events(keys=4, per_key=5)
    await publish(kafka_bootstrap, topic, events)
    registry = CollectorRegistry()
    consumer = build("parks", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=broken,
                     retry=PARK,
                     limits=Limits(max_batch=max_batch),
                     registry=registry)
    caplog.set_level(logging.WARNING, logger="consumerkit.pipeline")
    async with Running(consumer):
        await wait_for(lambda: _settled(consumer, len(events)), 60, "every record settled")
        # a new record of the parked key joins the park; one of another key is applied
        later = make_events(keys=4, per_key=6)[-4:]
        await publish(kafka_bootstrap, topic, later)
        await wait_for(lambda: _settled(consumer, len(events) + 4), 60, "the later records")
    stats = consumer.stats
    assert (stats.parked, stats.dead_lettered) == (5, 0)
    flowing = [e for e in [*events, *later] if e.key != "key-1" or e.seq == 1]
    verify(await ledger(pg_pool, pg_schema), flowing)
    parked = await parked_rows(pg_pool, pg_schema)
    assert [(r["key"], r["event_id"]) for r in parked] == [
        ("key-1", f"evt-1-{seq}") for seq in range(2, 7)]  # in offset order
    assert [r["reason"] for r in parked] == ["handler_failed", *["key_parked"] * 4]
    assert parked[0]["attempts"] == 2  # its retries ran out first
    assert await parked_key_names(pg_pool, pg_schema) == ["key-1"]
    # the offsets moved past the parked records
    assert await committed_total(kafka_bootstrap, group("parks", topic), topic, 2) == 24
    # counted, gauged and logged with the message's fields, one line per parked record
    labels = {"consumer": consumer.name}
    assert registry.get_sample_value(
        "consumerkit_messages_total", {**labels, "topic": topic, "outcome": "parked"}) == 5
    assert registry.get_sample_value("consumerkit_parked_keys", labels) == 1
    assert registry.get_sample_value("consumerkit_parked_records", labels) == 5
    lines = [orjson.loads(JsonFormatter().format(r)) for r in caplog.records
             if r.getMessage().startswith("parked ")]
    assert [(line["event_id"], line["key"], line["topic"]) for line in lines] == [
        (f"evt-1-{seq}", "key-1", topic) for seq in range(2, 7)]
    assert lines[0]["attempt"] == 2
    fields = {"event_id", "event_type", "key", "topic", "partition", "offset", "handler",
              "consumer"}
    assert fields <= set(MESSAGE_FIELDS)
    assert all(line["level"] == "WARNING" and line["consumer"] == consumer.name
               and fields <= set(line) for line in lines)


async def test_a_restarted_consumer_still_parks_the_key(
    postgres_dsn: str, kafka_bootstrap: str, park_topic: ParkTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await park_topic(partitions=2)
    broken = Broken()
    broken.brake("key-0", since=1)
    first = make_events(keys=2, per_key=2)
    await publish(kafka_bootstrap, topic, first)

    @handler("step.recorded", on_exhausted="park")  # the handler's choice; policy default
    async def record(event: Step, ctx: HandlerContext) -> None:
        await ledger_handler(pg_schema, broken)(event, ctx)

    def consumer() -> Consumer:
        return build("restart", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                     handlers=[record], retry=RetryPolicy(max_attempts=1))

    before = consumer()
    async with Running(before):
        await wait_for(lambda: _settled(before, len(first)), 60, "the first records")
    broken.fix("key-0")  # fixed, but its key stays parked until replayed
    after = consumer()
    second = make_events(keys=2, per_key=4)[len(first):]
    await publish(kafka_bootstrap, topic, second)
    async with Running(after):
        await wait_for(lambda: _settled(after, len(second)), 60, "the later records")
    assert after.stats.parked == 2
    verify(await ledger(pg_pool, pg_schema),
           [e for e in [*first, *second] if e.key == "key-1"])
    assert [r["event_id"] for r in await parked_rows(pg_pool, pg_schema)] == [
        f"evt-0-{seq}" for seq in range(1, 5)]


async def _settled(consumer: object, value: int) -> bool:
    s = consumer.stats  # type: ignore[attr-defined]
    return bool(s.applied + s.duplicates + s.dead_lettered + s.parked >= value)


async def test_a_member_that_takes_over_the_partition_in_a_rebalance_parks_the_key(
    postgres_dsn: str, kafka_bootstrap: str, park_topic: ParkTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await park_topic(partitions=2)
    broken = Broken()
    broken.brake("key-0", since=2)
    first = make_events(keys=2, per_key=3)
    await publish(kafka_bootstrap, topic, first)
    a = build("handover", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=broken,
              retry=PARK)
    b = build("handover", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=broken,
              retry=PARK)
    async with Running(b):
        async with Running(a):
            await wait_for(lambda: _stored(pg_pool, pg_schema, 4, 2), 60, "the first records")
        # a left: b owns every partition now, the parked key's included
        await wait_for(lambda: _owns(b, 2), 60, "b owning both partitions")
        broken.fix("key-0")  # fixed, but the key stays parked until replayed
        later = make_events(keys=2, per_key=5)[len(first):]
        await publish(kafka_bootstrap, topic, later)
        await wait_for(lambda: _stored(pg_pool, pg_schema, 6, 4), 60, "the later records")
    assert b.stats.parked >= 2  # the later records of the key, parked by their new owner
    verify(await ledger(pg_pool, pg_schema),
           [e for e in [*first, *later] if e.key == "key-1" or e.seq == 1])
    assert [r["event_id"] for r in await parked_rows(pg_pool, pg_schema)] == [
        f"evt-0-{seq}" for seq in range(2, 6)]


async def _stored(pool: asyncpg.Pool, schema: str, applied: int, parked: int) -> bool:
    """Whether the ledger holds ``applied`` effects and ``parked`` records are parked."""
    return (len(await ledger(pool, schema)) >= applied
            and len(await parked_rows(pool, schema)) >= parked)


async def _owns(consumer: Consumer, partitions: int) -> bool:
    return len(consumer.assignment) == partitions
