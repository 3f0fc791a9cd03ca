"""Through a real PgBouncer in transaction mode (prepared statements not tracked, as before
1.21, and tracked, as 1.21+ can) a consumer applies every event once in key order; the relay
publishes through a session-mode one."""

from __future__ import annotations

from collections.abc import Callable

import asyncpg
import orjson
import pytest

from consumerkit import Limits, Postgres
from consumerkit.outbox import KafkaSink, Outbox, OutboxTable, Relay
from consumerkit.testing.services import MakeTopic

from ..brokers import PRODUCER_OPTIONS
from ..integration.conftest import LedgerTopic
from ..integration.ledger import (
    Running,
    build,
    ledger_rows,
    make_events,
    publish,
    settled,
    verify,
    wait_for,
)
from ..outbox.conftest import RelayRunning, pending, read_all, wait_until
from .conftest import PgBouncer


@pytest.mark.parametrize("max_batch", [1, 50], ids=["per-record", "batched"])
@pytest.mark.parametrize("prepared_statements", [0, 200], ids=["pgbouncer-1.18", "ps-200"])
async def test_a_consumer_applies_every_event_once_in_key_order(
    pgbouncer: Callable[..., PgBouncer], kafka_bootstrap: str, ledger_topic: LedgerTopic,
    pg_schema: str, pg_pool: asyncpg.Pool, max_batch: int, prepared_statements: int,
) -> None:
    # fewer backends than the consumer's connections: each transaction may land on any;
    # PgBouncer 1.21+ may track prepared statements (max_prepared_statements) or not
    bouncer = pgbouncer(pool_size=3, prepared_statements=prepared_statements)
    topic = await ledger_topic(partitions=4)
    events = make_events(keys=20, per_key=20)
    await publish(kafka_bootstrap, topic, events)
    await publish(kafka_bootstrap, topic, events[::10])  # 40 duplicates
    consumer = build("pooled", pg_schema, topic, bouncer.dsn, kafka_bootstrap,
                     postgres=Postgres(pooler="transaction"),
                     limits=Limits(max_batch=max_batch))
    async with Running(consumer):
        await wait_for(lambda: settled(consumer, 440), 120, "440 deliveries settled")
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), events)
    assert consumer.stats.applied == 400
    assert consumer.stats.duplicates == 40
    assert consumer.stats.dead_lettered == 0


async def test_the_relay_publishes_through_a_session_pooler(
    pgbouncer: Callable[..., PgBouncer], pg_pool: asyncpg.Pool[asyncpg.Record],
    kafka_bootstrap: str, make_topic: MakeTopic, outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    bouncer = pgbouncer(mode="session", pool_size=4)
    topic = await make_topic(partitions=2)
    async with pg_pool.acquire() as conn, conn.transaction():
        for i in range(20):
            await outbox.add(conn, event_type="order.placed", aggregate_type="order",
                             aggregate_id=f"o-{i % 3}", payload={"n": i})
    sink = KafkaSink(kafka_bootstrap, route=topic, kafka_options=dict(PRODUCER_OPTIONS))
    relay = Relay(Postgres(dsn=bouncer.dsn, schema=outbox_table.schema, pooler="session"), sink,
                  table=outbox_table.table,
                  handle_signals=False, notify=False,
                  poll_interval=0.2)

    async def drained() -> bool:
        return await pending(pg_pool, outbox_table) == 0

    async with RelayRunning(relay):
        await wait_until(drained, 60, "outbox drained through PgBouncer")
        records = await read_all(kafka_bootstrap, [topic], lambda found: len(found) >= 20)
    assert len(records) == 20
    for key in (b"o-0", b"o-1", b"o-2"):  # each aggregate in the order written
        numbers = [orjson.loads(r.value or b"")["n"] for r in records if r.key == key]
        assert numbers == sorted(numbers)
