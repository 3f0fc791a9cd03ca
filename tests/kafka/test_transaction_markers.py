"""Transaction markers on Apache Kafka: the gap every commit or abort leaves in a partition's
offsets is passed without reading the partition again, and a ``read_committed`` consumer
still applies every committed record once and no aborted one.

The consumer that reads again (its source blind to what aiokafka dropped, as before) is run
beside it on the same topic: its rereads show the gaps are there, and that the second-read
defence against a broker hiding records stays correct on Kafka. Runs on the session's Kafka
when ``CONSUMERKIT_TEST_BROKER=kafka``, else on a single node of its own; skips, saying what to
install, without Java or Maven."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from consumerkit import Consumer
from consumerkit.transport.kafka import KafkaSource
from consumerkit.transport.source import Partition, RebalanceHandler, Source
from tests.harness import MissingToolError, start_kafka

from ..brokers import KAFKA_VERSION, ON_KAFKA, REPLICATION_FACTOR
from ..conftest import wait_for_partitions
from ..integration.ledger import (
    Event,
    Running,
    build,
    create_ledger,
    ledger_rows,
    make_events,
    verify,
    wait_for,
)
from .test_broker_failures import send_all

SETTLE = 180.0  # two busy cores
CHUNK = 6  # records per transaction


@pytest.fixture(scope="module")
def bootstrap(request: pytest.FixtureRequest) -> Iterator[str]:
    """The session's Apache Kafka, else a single node started for this module."""
    if ON_KAFKA:
        yield request.getfixturevalue("kafka_bootstrap")
        return
    try:
        cluster = start_kafka(brokers=1, version=KAFKA_VERSION)
    except MissingToolError as exc:
        pytest.skip(str(exc))
    with cluster:
        yield cluster.bootstrap


@asynccontextmanager
async def transactional(bootstrap: str) -> AsyncIterator[Any]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=True, request_timeout_ms=30_000,
                                transactional_id=f"ck-markers-{uuid.uuid4().hex}")
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


async def new_topic(bootstrap: str, partitions: int) -> str:
    name = f"ck-markers-{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(
            name, partitions, replication_factor=REPLICATION_FACTOR if ON_KAFKA else 1)])
        await wait_for_partitions(admin, name, partitions)
    finally:
        await admin.close()
    return name


async def write(producer: Any, topic: str, events: Sequence[Event], tag: str) -> list[Event]:
    """``events`` in transactions of :data:`CHUNK`, every third one preceded by an aborted
    transaction of decoys on the same keys; the decoys are returned."""
    aborted: list[Event] = []
    for n in range(0, len(events), CHUNK):
        chunk = events[n:n + CHUNK]
        if n // CHUNK % 3 == 1:
            decoys = [Event(f"aborted-{tag}-{e.event_id}", e.key, e.seq) for e in chunk]
            aborted += decoys
            await producer.begin_transaction()
            await send_all(producer, topic, decoys)
            await producer.abort_transaction()
        await producer.begin_transaction()
        await send_all(producer, topic, chunk)
        await producer.commit_transaction()
    return aborted


class BlindSource(KafkaSource):
    """The Kafka source as it was before it told what aiokafka dropped: every gap is read
    again."""

    def skipped(self) -> dict[Partition, list[tuple[int, int]]]:
        super().skipped()
        return {}


def blind(consumer: Consumer, bootstrap: str) -> None:
    def source(rebalance: RebalanceHandler) -> Source:
        return BlindSource(topics=consumer.topics, group_id=consumer.name, bootstrap=bootstrap,
                           options=consumer.kafka_consumer_options, rebalance=rebalance)

    consumer.source_factory = source


async def consume(consumer: Consumer, producer: Any, topic: str, later: Sequence[Event],
                  pool: asyncpg.Pool[asyncpg.Record], schema: str, total: int) -> list[Event]:
    """Run ``consumer`` on the backlog, write ``later`` while it runs (markers at the tail),
    and wait for ``total`` effects; the aborted decoys written meanwhile are returned."""
    async with Running(consumer):
        aborted = await write(producer, topic, later, uuid.uuid4().hex[:6])

        async def all_applied() -> bool:
            count = await pool.fetchval(f'SELECT count(*) FROM "{schema}".ledger')
            assert isinstance(count, int)
            return count >= total

        await wait_for(all_applied, SETTLE, "every committed record applied")
    return aborted


async def test_markers_are_passed_without_reading_again_and_aborted_records_never_applied(
    bootstrap: str, postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool[asyncpg.Record],
) -> None:
    topic = await new_topic(bootstrap, partitions=2)
    async with pg_pool.acquire() as conn:
        await create_ledger(conn, pg_schema)
    events = make_events(keys=6, per_key=20)  # 120 committed, 20 transactions
    backlog, later = events[:60], events[60:]
    async with transactional(bootstrap) as producer:
        aborted = await write(producer, topic, backlog, "backlog")
        consumer = build("markers", pg_schema, topic, postgres_dsn, bootstrap)
        aborted += await consume(consumer, producer, topic, later, pg_pool, pg_schema,
                                 len(events))
        async with pg_pool.acquire() as conn:
            verify(await ledger_rows(conn, pg_schema), events)  # an aborted one: a phantom
            await conn.execute(f'TRUNCATE "{pg_schema}".ledger')
        assert len(aborted) >= 30
        assert consumer.stats.applied == len(events)
        assert consumer.stats.gap_rereads == 0
        assert consumer.stats.gaps_explained > 0

        # the topic read from its start by a consumer blind to the markers (a group of its
        # own), more written meanwhile: each gap is read again
        more = [Event(f"more-{k}-{s}", f"more-{k}", s) for s in range(1, 6) for k in range(6)]
        again = build("markers-blind", pg_schema, topic, postgres_dsn, bootstrap)
        blind(again, bootstrap)
        await consume(again, producer, topic, more, pg_pool, pg_schema,
                      len(events) + len(more))
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), [*events, *more])
    assert again.stats.gap_rereads > 0
    assert (again.stats.gaps_explained, again.stats.hidden_records) == (0, 0)
