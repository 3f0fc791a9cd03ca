"""An outbox kept for a retention in time partitions, through Debezium: the connector reads the
partitions through the publication ``consumerkit.migrate`` made with ``publish_via_partition_root``,
so every insert carries the root table's name its ``table.include.list`` and the EventRouter
expect; a partition dropped by maintenance while it streams disturbs nothing; consumerkit
applies each event once, in order, and the rows stay for the retention."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import asyncpg

from consumerkit.dedup.partitions import maintain, partition_floor
from consumerkit.outbox import OutboxRetention, maintain_outbox
from consumerkit.outbox.retention import plan

from .conftest import MakeCdc, create_topic
from .flow import ECHO, STEP, applied, check_once_in_order, consuming, wait_applied, write_steps

DAY = timedelta(days=1)


async def test_a_retained_outbox_reaches_kafka_by_its_root_table_and_applies_once(
    make_cdc: MakeCdc,
) -> None:
    cdc = await make_cdc(3, retention=OutboxRetention(retention=2 * DAY))
    echo = f"{cdc.topic}.echo"
    await create_topic(cdc.kafka.bootstrap, echo, 2)
    await asyncio.to_thread(cdc.start)
    dsn, schema, table = cdc.postgres.dsn, cdc.table.schema, cdc.table
    keys = [f"k{i}" for i in range(4)]
    written = await write_steps(dsn, cdc.outbox, cdc.topic, keys, 0, 5)

    # maintenance while the connector streams: partitions made as ten days ago, past the
    # retention, detached and dropped whole
    conn = await asyncpg.connect(dsn)
    try:
        now: datetime = await conn.fetchval("SELECT now()")
        await maintain(conn, schema, plan(table), now=now - 10 * DAY)
        report = await maintain_outbox(conn, table)
    finally:
        await conn.close()
    old = f"outbox_p{partition_floor(now - 10 * DAY, DAY):%Y%m%d%H}"
    assert old in report.dropped
    assert cdc.worker is not None
    cdc.worker.wait_running(60)  # still streaming after the DDL

    written += await write_steps(dsn, cdc.outbox, cdc.topic, keys, 5, 5)
    # the consumer publishes its echoes through the same retained outbox (and maintains it)
    async with consuming(dsn, cdc.kafka.bootstrap, schema, [cdc.topic, echo], echo_to=echo,
                         outbox=cdc.outbox):
        await wait_applied(dsn, schema, 2 * len(written))
    rows = await applied(dsn, schema)
    check_once_in_order(rows, written)
    echoes = [r for r in rows if r["event_type"] == ECHO]
    assert sorted(r["causation_id"] for r in echoes) == sorted(w.event_id for w in written)
    assert len([r for r in rows if r["event_type"] == STEP]) == len(written)

    # kept for the retention: every event is still in the table, each in a day's partition
    conn = await asyncpg.connect(dsn)
    try:
        kept = await conn.fetch(f"SELECT tableoid::regclass::text AS part FROM {table.events}")
    finally:
        await conn.close()
    assert len(kept) == 2 * len(written)
    assert all(r["part"].startswith(f"{schema}.outbox_p") for r in kept)
