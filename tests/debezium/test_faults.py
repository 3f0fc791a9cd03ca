"""Faults on the Debezium path: the Connect worker SIGKILLed mid-stream re-sends from its last
flushed position when started again, and the consumer absorbs every re-sent record; a
PostgreSQL restarted, or the partition's leader broker killed, under the connector and the
consumer loses nothing."""

from __future__ import annotations

import asyncio

import pytest

from tests.harness import KafkaCluster, LogicalPostgres

from ..outbox.conftest import read_all
from .conftest import MakeCdc, new_cdc
from .flow import applied, check_once_in_order, consuming, wait_applied, write_steps
from .test_worker import ids_of

pytestmark = pytest.mark.slow
KEYS = [f"k{i}" for i in range(4)]


async def test_a_worker_killed_mid_stream_resends_and_each_event_applies_once(
    make_cdc: MakeCdc,
) -> None:
    cdc = await make_cdc(3)
    dsn, schema, bootstrap = cdc.postgres.dsn, cdc.table.schema, cdc.kafka.bootstrap
    # offsets are flushed on a graceful stop only, so the kill below always loses some
    worker = await asyncio.to_thread(cdc.start, 600_000)
    first = await write_steps(dsn, cdc.outbox, cdc.topic, KEYS, 0, 5)
    async with consuming(dsn, bootstrap, schema, [cdc.topic]):
        await wait_applied(dsn, schema, len(first))
        await asyncio.to_thread(worker.terminate)  # flushes: the position is after `first`
        await asyncio.to_thread(worker.start)
        writing = asyncio.create_task(write_steps(dsn, cdc.outbox, cdc.topic, KEYS, 5, 20))
        await wait_applied(dsn, schema, len(first) + 20)  # mid-stream
        await asyncio.to_thread(worker.kill)
        second = await writing  # the rest lands while no worker runs
        await asyncio.to_thread(worker.start)
        last = await write_steps(dsn, cdc.outbox, cdc.topic, KEYS, 25, 1)  # after any resend
        written = first + second + last
        await wait_applied(dsn, schema, len(written))
        records = await read_all(bootstrap, [cdc.topic],
                                 lambda found: {w.event_id for w in written} <= set(
                                     ids_of(found)))
    resent = len(records) - len(set(ids_of(records)))
    assert resent >= 20, f"the kill should make Debezium re-send what it sent ({resent})"
    check_once_in_order(await applied(dsn, schema), written)


async def test_postgres_restarted_under_the_connector_loses_nothing(make_cdc: MakeCdc) -> None:
    cdc = await make_cdc(3)
    dsn, schema, bootstrap = cdc.postgres.dsn, cdc.table.schema, cdc.kafka.bootstrap
    worker = await asyncio.to_thread(cdc.start)
    first = await write_steps(dsn, cdc.outbox, cdc.topic, KEYS, 0, 5)
    async with consuming(dsn, bootstrap, schema, [cdc.topic]):
        await wait_applied(dsn, schema, len(first))
        await asyncio.to_thread(cdc.postgres.restart)  # an immediate stop: a crash
        second = await write_steps(dsn, cdc.outbox, cdc.topic, KEYS, 5, 5)
        await asyncio.to_thread(worker.wait_running)  # the task reconnected by itself
        await wait_applied(dsn, schema, len(first) + len(second))
    check_once_in_order(await applied(dsn, schema), first + second)


async def test_the_partition_leader_killed_under_the_connector_loses_nothing(
    cdc_postgres: LogicalPostgres, kafka_cluster: KafkaCluster,
) -> None:
    """Connect (at Debezium's Kafka version) publishing to the three-node cluster of the Kafka
    tests: the leader of the topic's partition dies mid-stream; its producer (acks=all,
    retrying without end) goes on with the new leader, and every event applies once."""
    cdc = await new_cdc(cdc_postgres, kafka_cluster, 1, replication=3)
    dsn, schema, bootstrap = cdc.postgres.dsn, cdc.table.schema, kafka_cluster.bootstrap
    worker = await asyncio.to_thread(cdc.start)
    try:
        first = await write_steps(dsn, cdc.outbox, cdc.topic, KEYS, 0, 5)
        async with consuming(dsn, bootstrap, schema, [cdc.topic]):
            await wait_applied(dsn, schema, len(first))
            writing = asyncio.create_task(write_steps(dsn, cdc.outbox, cdc.topic, KEYS, 5, 15))
            leader = await kafka_cluster.leader(cdc.topic)
            await asyncio.to_thread(leader.kill)
            second = await writing
            await wait_applied(dsn, schema, len(first) + len(second), timeout=240)
        check_once_in_order(await applied(dsn, schema), first + second)
    finally:
        await asyncio.to_thread(worker.stop)
