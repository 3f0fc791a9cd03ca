"""A broker restart on a dedicated Tansu (memory storage, so the restart loses every topic): the
relay pauses while the broker is gone, waits until the topic exists again, and then delivers
every event committed during the outage and after it.

Why the relay checks the topic after a failed send: Tansu with memory storage, restarted on the
same port, acknowledges produce requests for a topic it no longer has (a producer that kept its
metadata sends them without asking first), and the partitions written that way are
inconsistent: re-creating the topic answers "already exists", a later produce can fail with
UnknownError (the broker's log shows ``AlreadyExists`` for the batch file at offset 0), and a
record acknowledged at an offset inside an earlier batch is never readable. The first test
reproduces this with aiokafka alone, no consumerkit code; a Kafka broker answers such a produce
with UNKNOWN_TOPIC_OR_PARTITION instead, which a producer retries.
"""

from __future__ import annotations

import asyncio
from uuid import UUID

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError

from consumerkit import Postgres
from consumerkit.outbox import KafkaSink, Outbox, OutboxTable, Relay, count_failed
from consumerkit.retry import RetryPolicy
from consumerkit.testing.services import TansuBroker, free_port, start_tansu
from consumerkit.transport.kafka_admin import create_topic

from ..pooling import POOLER
from .conftest import RelayRunning, pending, read_all, wait_until

pytestmark = pytest.mark.slow  # two broker restarts


async def _restart(broker: TansuBroker) -> TansuBroker:
    await asyncio.to_thread(broker.stop)
    return await asyncio.to_thread(start_tansu, broker.port)


async def _read_values(bootstrap: str, topic: str) -> set[bytes]:
    reader = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None,
                              auto_offset_reset="earliest", enable_auto_commit=False)
    await reader.start()
    found: set[bytes] = set()
    try:
        quiet = 0
        while quiet < 3:
            batch = await reader.getmany(timeout_ms=300)
            found.update(r.value for records in batch.values() for r in records if r.value)
            quiet = 0 if batch else quiet + 1
    finally:
        await reader.stop()
    return found


async def test_tansu_after_a_restart_acknowledges_records_of_a_topic_it_lost() -> None:
    """The broker quirk, with aiokafka only: not a consumerkit behaviour."""
    broker = await asyncio.to_thread(start_tansu, free_port())
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all",
                                enable_idempotence=False, request_timeout_ms=3000)
    try:
        await create_topic(broker.bootstrap, "t", 4)
        await producer.start()
        for partition in range(4):  # the producer now holds the topic's metadata
            await producer.send_and_wait("t", b"first", partition=partition)
        broker = await _restart(broker)
        assert "t" not in (await producer.client.fetch_all_metadata()).topics()

        acked: set[bytes] = set()
        for partition in range(4):  # sent on the cached metadata: acknowledged all the same
            batch = producer.create_batch()
            values = [f"ghost-{partition}-{i}".encode() for i in range(3)]
            for value in values:
                batch.append(key=None, value=value, timestamp=None)
            batch.close()
            await (await producer.send_batch(batch, "t", partition=partition))
            acked.update(values)
        await create_topic(broker.bootstrap, "t", 4)  # Tansu answers "already exists"
        refused = 0
        for n in range(8):
            value = f"later-{n}".encode()
            try:
                await producer.send_and_wait("t", value=value, partition=n % 4)
            except KafkaError:  # UnknownError: the quirk itself
                refused += 1
            else:
                acked.add(value)
        unreadable = acked - await _read_values(broker.bootstrap, "t")
        assert refused or unreadable, "Tansu no longer shows the quirk: revisit this module"
        print(f"\nTansu after a restart: {refused} produces refused, acknowledged but never "
              f"readable: {sorted(unreadable)}")
    finally:
        await producer.stop()
        await asyncio.to_thread(broker.stop)


async def test_the_relay_delivers_everything_committed_during_and_after_a_broker_restart(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, outbox: Outbox,
    outbox_table: OutboxTable,
) -> None:
    broker = await asyncio.to_thread(start_tansu, free_port())
    topic = "ck-restart"
    await create_topic(broker.bootstrap, topic, 4)
    sink = KafkaSink(broker.bootstrap, route=topic, kafka_options={
        "enable_idempotence": False, "request_timeout_ms": 2000, "metadata_max_age_ms": 1000})
    relay = Relay(Postgres(dsn=postgres_dsn, schema=outbox_table.schema, pooler=POOLER), sink,
                  handle_signals=False,
                  retry=RetryPolicy(max_attempts=3, initial_delay=0.2, max_delay=0.5))

    async def add(tag: str, count: int) -> list[UUID]:
        ids = []
        for n in range(count):
            async with pg_pool.acquire() as conn, conn.transaction():
                added = await outbox.add(conn, event_type="e", aggregate_type="a",
                                         aggregate_id=f"agg-{n % 5}", payload={tag: n})
            assert added is not None
            ids.append(added)
        return ids

    async def drained() -> bool:
        return await pending(pg_pool, outbox_table) == 0

    try:
        async with RelayRunning(relay):
            await add("before", 20)
            await wait_until(drained, 30, "the events before the restart published")
            await asyncio.to_thread(broker.stop)
            during = await add("during", 20)  # committed while the broker is gone
            paused = relay.pauses

            async def tried() -> bool:  # paused once more, or published something
                return relay.pauses > paused or await pending(pg_pool, outbox_table) < 20

            await wait_until(tried, 30, "the relay pausing for the outage")
            broker = await asyncio.to_thread(start_tansu, broker.port)
            paused = relay.pauses  # now it tries the restarted broker, topic not yet there
            await wait_until(tried, 30, "the relay trying the restarted broker")
            assert await pending(pg_pool, outbox_table) == 20, "published to a missing topic"
            await create_topic(broker.bootstrap, topic, 4)
            after = await add("after", 20)
            await wait_until(drained, 60, "the outbox drained after the restart")
        async with pg_pool.acquire() as conn:
            assert await count_failed(conn, outbox_table) == 0
        wanted = set(during) | set(after)
        records = await read_all(broker.bootstrap, [topic], lambda found: wanted <= {
            UUID(r.headers["id"].decode()) for r in found}, timeout=30)
        ids = [UUID(r.headers["id"].decode()) for r in records]
        assert wanted <= set(ids)
        firsts = list(dict.fromkeys(ids))
        for aggregate in range(5):
            mine = [e for n, e in enumerate(during + after) if n % 5 == aggregate]
            assert [i for i in firsts if i in mine] == mine
    finally:
        await asyncio.to_thread(broker.stop)
