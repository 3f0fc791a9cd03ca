"""consumerkit on a three-node Apache Kafka (replication factor 3, ``min.insync.replicas=2``,
unclean leader election off) while brokers fail, and under transactional producers:

- the leader of a partition SIGKILLed while a consumer applies its events: no effect lost or
  applied twice, each key's order kept;
- the relay, idempotent producer on with ``acks=all``, publishing through a broker restart:
  nothing lost, no aggregate reordered;
- transactional producers upstream, a share of their transactions aborted: the consumer
  (``isolation_level=read_committed``) applies every committed record once and no aborted one.

Each test skips, saying what to install, where Java or Maven is missing."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from consumerkit import Limits, Postgres, migrate
from consumerkit.outbox import KafkaSink, Outbox, OutboxTable, Relay
from consumerkit.retry import RetryPolicy
from consumerkit.transport.kafka import _CONSUMER_FIXED
from tests.harness import KafkaCluster

from ..integration.ledger import (
    Event,
    Running,
    Step,
    build,
    create_ledger,
    ledger_rows,
    make_events,
    verify,
    wait_for,
)
from ..outbox.conftest import RelayRunning, pending, read_all, wait_until

SETTLE = 240.0  # a killed leader is fenced after its 9 s session, on two busy cores


async def new_topic(cluster: KafkaCluster, partitions: int) -> str:
    name = f"ck-fail-{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, replication_factor=3)])
    finally:
        await admin.close()
    for partition in range(partitions):
        await cluster.leader(name, partition)
    return name


@asynccontextmanager
async def idempotent_producer(cluster: KafkaCluster, **options: Any) -> AsyncIterator[Any]:
    producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, acks="all",
                                enable_idempotence=True, request_timeout_ms=30_000,
                                metadata_max_age_ms=1000, **options)
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


def _record(event: Event) -> dict[str, Any]:
    return {"key": event.key.encode(), "headers": event.wire_headers(),
            "value": Step(key=event.key, seq=event.seq).model_dump_json().encode()}


async def send_all(producer: Any, topic: str, events: Sequence[Event]) -> None:
    """Send in order (per key, one partition: the idempotent producer keeps that order)."""
    sent = [await producer.send(topic, **_record(e)) for e in events]
    await asyncio.gather(*sent)


async def ledger_count(pool: asyncpg.Pool[asyncpg.Record], schema: str) -> int:
    value = await pool.fetchval(f'SELECT count(*) FROM "{schema}".ledger')
    assert isinstance(value, int)
    return value


async def test_a_killed_partition_leader_loses_and_duplicates_no_effect(
    kafka_cluster: KafkaCluster, postgres_dsn: str, pg_schema: str,
    pg_pool: asyncpg.Pool[asyncpg.Record],
) -> None:
    topic = await new_topic(kafka_cluster, partitions=3)
    async with pg_pool.acquire() as conn:
        await create_ledger(conn, pg_schema)
    events = make_events(keys=30, per_key=40)
    half = len(events) // 2
    consumer = build("leader-kill", pg_schema, topic, postgres_dsn, kafka_cluster.bootstrap,
                     limits=Limits(max_batch=20))
    async with idempotent_producer(kafka_cluster) as producer:
        await send_all(producer, topic, events[:half])
        async with Running(consumer):
            async def started_applying() -> bool:
                return await ledger_count(pg_pool, pg_schema) >= 150

            await wait_for(started_applying, SETTLE, "the first effects")
            leader = await kafka_cluster.leader(topic, 0)
            leader.kill()
            assert await ledger_count(pg_pool, pg_schema) < len(events), "mid-stream"
            await send_all(producer, topic, events[half:])  # through the leader's election
            successor = await kafka_cluster.leader(topic, 0)
            assert successor.node_id != leader.node_id

            async def all_applied() -> bool:
                return await ledger_count(pg_pool, pg_schema) >= len(events)

            await wait_for(all_applied, SETTLE, "every effect after the leader's death")
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), events)
    assert consumer.stats.applied == len(events)
    assert consumer.stats.dead_lettered == 0


async def test_the_relay_publishes_through_a_broker_restart_in_order(
    kafka_cluster: KafkaCluster, postgres_dsn: str, pg_schema: str,
    pg_pool: asyncpg.Pool[asyncpg.Record],
) -> None:
    topic = await new_topic(kafka_cluster, partitions=2)
    table = OutboxTable(pg_schema, "outbox")
    async with pg_pool.acquire() as conn:
        await migrate(conn, dedup=None, outboxes=[table])
    outbox = Outbox(pg_schema)
    written: list[tuple[str, uuid.UUID]] = []

    async def add(count: int) -> None:
        for _ in range(count):
            aggregate = f"order-{len(written) % 5}"
            async with pg_pool.acquire() as conn, conn.transaction():
                added = await outbox.add(conn, event_type="order.step", aggregate_type="order",
                                         aggregate_id=aggregate, payload={"n": len(written)})
            assert added is not None
            written.append((aggregate, added))

    # The sink's defaults: the idempotent producer with acks=all.
    sink = KafkaSink(kafka_cluster.bootstrap, route=topic,
                     kafka_options={"request_timeout_ms": 15_000, "metadata_max_age_ms": 1000})
    built = sink._producer._producer
    assert built._txn_manager is not None, "the relay's producer must be idempotent"
    assert built._sender._acks == -1, "the relay's producer must ask for acks=all"
    relay = Relay(Postgres(dsn=postgres_dsn, schema=pg_schema), sink, handle_signals=False,
                  batch_size=20,
                  retry=RetryPolicy(max_attempts=100, initial_delay=0.2, max_delay=1.0))
    async with RelayRunning(relay):
        await add(40)

        async def drained() -> bool:
            return await pending(pg_pool, table) == 0

        await wait_until(drained, SETTLE, "the events before the restart published")
        restarted = await kafka_cluster.leader(topic, 0)
        restarted.kill()
        await add(60)  # published, if at all, while the node is down or its partitions move
        await asyncio.to_thread(restarted.start)
        await add(40)
        await wait_until(drained, SETTLE, "every event published after the restart")
        await asyncio.to_thread(kafka_cluster.wait_ready)
    assert relay.published == len(written)
    wanted = {event_id for _, event_id in written}
    records = await read_all(kafka_cluster.bootstrap, [topic], lambda found: {
        uuid.UUID(r.headers["id"].decode()) for r in found} >= wanted, timeout=SETTLE)
    ids = [uuid.UUID(r.headers["id"].decode()) for r in records]
    assert set(ids) == wanted, "lost or foreign events"
    copies = Counter(ids)
    assert max(copies.values()) == 1, f"published twice: {[i for i, n in copies.items() if n > 1]}"
    for aggregate in {a for a, _ in written}:
        mine = [e for a, e in written if a == aggregate]
        assert [i for i in ids if i in set(mine)] == mine, f"{aggregate} reordered"


async def test_aborted_transactions_are_never_applied(
    kafka_cluster: KafkaCluster, postgres_dsn: str, pg_schema: str,
    pg_pool: asyncpg.Pool[asyncpg.Record],
) -> None:
    assert _CONSUMER_FIXED["isolation_level"] == "read_committed"  # fixed, not a default
    topic = await new_topic(kafka_cluster, partitions=3)
    async with pg_pool.acquire() as conn:
        await create_ledger(conn, pg_schema)
    committed = make_events(keys=12, per_key=30)  # 360, in chunks of 24 per transaction
    chunks = [committed[i:i + 24] for i in range(0, len(committed), 24)]
    aborted: list[Event] = []
    async with idempotent_producer(kafka_cluster, transactional_id=f"ck-tx-{uuid.uuid4().hex}"
                                   ) as producer:
        for n, chunk in enumerate(chunks):
            if n % 3 == 1:  # an aborted transaction between committed ones, on every key
                decoys = [Event(f"aborted-{n}-{e.event_id}", e.key, e.seq) for e in chunk]
                aborted += decoys
                await producer.begin_transaction()
                await send_all(producer, topic, decoys)
                await producer.abort_transaction()
            await producer.begin_transaction()
            await send_all(producer, topic, chunk)
            await producer.commit_transaction()
    assert len(aborted) >= 100
    consumer = build("tx-upstream", pg_schema, topic, postgres_dsn, kafka_cluster.bootstrap)
    async with Running(consumer):
        async def all_applied() -> bool:
            return await ledger_count(pg_pool, pg_schema) >= len(committed)

        await wait_for(all_applied, SETTLE, "every committed record applied")
        # The last transaction committed after the last aborted one: a consumer that had
        # read aborted records would have applied them before reaching it.
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), committed)  # an aborted one is a phantom
    assert consumer.stats.applied == len(committed)
    assert consumer.stats.dead_lettered == 0
