"""The outbox through Debezium end to end: events written with ``outbox.add`` and emitted by a
handler with ``ctx.publish`` reach Kafka through the EventRouter, and consumerkit applies each
once, per aggregate in order, with its id, type, time and traceparent; the same events
through the relay and through Debezium give the consumer equal envelopes; and a
delete-at-insert outbox whose slot the command made loses none of the events written before
the connector's first start."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections import defaultdict
from datetime import datetime

import asyncpg
import orjson
import pytest

from consumerkit import Consumer, Envelope, HandlerContext, Kafka, Postgres, handler
from consumerkit.outbox import KafkaSink, NewEvent, Outbox, Relay

from ..cli.test_migrate_check import run
from ..outbox.conftest import RelayRunning, read_all
from .conftest import MakeCdc, create_topic
from .flow import (
    ECHO,
    STEP,
    Step,
    applied,
    check_once_in_order,
    consuming,
    wait_applied,
    write_steps,
)


async def test_outbox_and_handler_events_through_debezium_apply_once_in_order(
    make_cdc: MakeCdc,
) -> None:
    cdc = await make_cdc(3)
    echo = f"{cdc.topic}.echo"
    await create_topic(cdc.kafka.bootstrap, echo, 2)
    await asyncio.to_thread(cdc.start)
    dsn, schema = cdc.postgres.dsn, cdc.table.schema
    written = await write_steps(dsn, cdc.outbox, cdc.topic, [f"k{i}" for i in range(6)], 0, 10)

    async with consuming(dsn, cdc.kafka.bootstrap, schema, [cdc.topic, echo], echo_to=echo):
        await wait_applied(dsn, schema, 2 * len(written))
    rows = await applied(dsn, schema)
    check_once_in_order(rows, written)

    # the event time is the writer's, as the relay sends it
    conn = await asyncpg.connect(dsn)
    try:
        times: dict[str, datetime] = {r["id"]: r["occurred_at"] for r in await conn.fetch(
            f"SELECT id::text AS id, occurred_at FROM {cdc.table.events}")}
    finally:
        await conn.close()
    steps = [r for r in rows if r["event_type"] == STEP]
    assert all(r["occurred_at"] == times[r["event_id"]] for r in steps)

    # each ctx.publish went out through the same connector, once, caused by its step
    echoes = [r for r in rows if r["event_type"] == ECHO]
    assert sorted(r["causation_id"] for r in echoes) == sorted(w.event_id for w in written)
    for key in {w.key for w in written}:
        ns = [r["n"] for r in echoes if r["key"] == key]
        assert ns == sorted(ns), f"echoes of {key} out of order"


def _comparable(env: Envelope) -> tuple[Envelope, datetime | None]:
    """The envelope without what differs by nature between two records of one event: where
    it sits (topic, partition, offset), the record time (the relay sends the event time,
    Debezium the commit time; ``event_time`` is ``occurred_at`` in both) and the spelling
    of ``occurred_at`` (``+00:00`` against ``Z``, the same instant, compared parsed)."""
    headers = {k: v for k, v in env.headers.items() if k != "occurred_at"}
    return dataclasses.replace(env, topic="", partition=0, offset=0, timestamp=None,
                               headers=headers), env.occurred_at


async def test_the_relay_and_debezium_give_the_consumer_equal_envelopes(
    make_cdc: MakeCdc,
) -> None:
    cdc = await make_cdc(2)
    relayed = f"relay.{cdc.topic}"
    await create_topic(cdc.kafka.bootstrap, relayed, 2)
    await asyncio.to_thread(cdc.start)
    dsn = cdc.postgres.dsn
    written = await write_steps(dsn, cdc.outbox, cdc.topic, ["a", "b", "c"], 0, 4)

    seen: dict[str, dict[str, tuple[Envelope, Step]]] = {}

    @handler(STEP)
    async def keep(event: Step, ctx: HandlerContext) -> None:
        seen.setdefault(ctx.envelope.event_id, {})[ctx.envelope.topic] = (ctx.envelope, event)

    relay = Relay(Postgres(dsn=dsn, schema=cdc.table.schema), KafkaSink(cdc.kafka.bootstrap,
        route="relay.{aggregate_type}"),
                  handle_signals=False, notify=False,
                  poll_interval=0.2)
    async with RelayRunning(relay):
        # one consumer per copy: a single one would absorb the second copy as a duplicate
        for topic, suffix in ((cdc.topic, "d"), (relayed, "r")):
            consumer = Consumer(
                name=f"eq-{suffix}-{cdc.table.schema}".replace("_", "-"), handlers=[keep],
                topics=[topic],
                postgres=Postgres(dsn=dsn, schema=f"{cdc.table.schema}_{suffix}"),
                kafka=Kafka(bootstrap=cdc.kafka.bootstrap),
                handle_signals=False)
            running = asyncio.create_task(consumer.run())
            try:
                async with asyncio.timeout(180):
                    while sum(topic in v for v in seen.values()) < len(written):
                        await asyncio.sleep(0.2)
            finally:
                await consumer.stop()
                async with asyncio.timeout(60):
                    await running

    assert set(seen) == {w.event_id for w in written}
    for event_id, copies in seen.items():
        (cdc_env, cdc_event), (relay_env, relay_event) = copies[cdc.topic], copies[relayed]
        assert cdc_event == relay_event
        assert _comparable(cdc_env) == _comparable(relay_env), event_id
        assert cdc_env.traceparent is not None
        assert cdc_env.event_time == relay_env.event_time



async def test_events_written_before_the_connectors_first_start_all_arrive(
    make_cdc: MakeCdc, capsys: pytest.CaptureFixture[str],
) -> None:
    """A delete-at-insert outbox keeps its events only in the WAL: a slot the connector made
    at its first start lost the events written before it (824 of 5,792 in a run of the
    issue); the slot ``consumerkit migrate --outbox-cdc`` made keeps them all."""
    cdc = await make_cdc(4)
    dsn, table = cdc.postgres.dsn, cdc.table
    code, out = await run(capsys, "migrate", "--outbox-only", "--outbox-cdc", "--postgres",
                          dsn, "--schema", table.schema)
    assert code == 0, out
    writer = Outbox(table.schema, table.table, notify=False, delete_after_insert=True)
    keys = [f"k{i}" for i in range(40)]
    conn = await asyncpg.connect(dsn)
    try:
        ids = []
        for n in range(5):  # one transaction per round of the 40 aggregates
            async with conn.transaction():
                ids += [str(i) for i in await writer.add_many(conn, [
                    NewEvent(STEP, cdc.topic, key, {"key": key, "n": n}) for key in keys])]
        assert await conn.fetchval(f"SELECT count(*) FROM {table.events}") == 0
    finally:
        await conn.close()

    await asyncio.to_thread(functools.partial(cdc.start, slot=table.replication_slot))
    found = await read_all(cdc.kafka.bootstrap, [cdc.topic], lambda records: set(ids) <= {
        r.headers["id"].decode() for r in records}, timeout=120)
    assert sorted(r.headers["id"].decode() for r in found) == sorted(ids)
    per_key: dict[bytes | None, list[int]] = defaultdict(list)
    for r in sorted(found, key=lambda r: (r.partition, r.offset)):
        assert r.value is not None
        per_key[r.key].append(orjson.loads(r.value)["n"])
    assert all(ns == list(range(5)) for ns in per_key.values()), per_key
