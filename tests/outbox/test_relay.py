"""The relay against PostgreSQL and the broker: the wire format, delete on ack, no UPDATE on
the outbox table, late commits, routing, polling without NOTIFY."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg
import orjson
from pydantic import BaseModel

from consumerkit import Postgres
from consumerkit.outbox import KafkaSink, Outbox, OutboxTable, Relay
from consumerkit.testing.services import MakeTopic
from consumerkit.transport.kafka_admin import create_topic

from ..brokers import PRODUCER_OPTIONS
from ..pooling import POOLER, THROUGH_POOLER
from .conftest import RelayRunning, pending, read_all, wait_until

SINK_OPTIONS = PRODUCER_OPTIONS


class OrderPlaced(BaseModel):
    order_id: str
    amount: int


def relay_for(dsn: str, table: OutboxTable, bootstrap: str, route: str,
              listen_dsn: str | None = None, **options: object) -> Relay:
    sink = KafkaSink(bootstrap, route=route, kafka_options=dict(SINK_OPTIONS))
    postgres = Postgres(dsn=dsn, schema=table.schema, pooler=POOLER, listen_dsn=listen_dsn)
    return Relay(postgres, sink, table=table.table, handle_signals=False,
                 **options)  # type: ignore[arg-type]


async def test_publishes_the_wire_format_and_deletes_on_ack_without_updates(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, kafka_bootstrap: str,
    make_topic: MakeTopic, outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    topic = await make_topic(partitions=2)
    await pg_pool.execute(f"""
        CREATE FUNCTION {outbox_table.schema}.no_update() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN RAISE EXCEPTION 'the outbox table must never see an UPDATE'; END $$;
        CREATE TRIGGER no_update BEFORE UPDATE ON {outbox_table.events}
        FOR EACH ROW EXECUTE FUNCTION {outbox_table.schema}.no_update()""")
    at = datetime(2024, 5, 1, 12, 30, 15, 250000, tzinfo=UTC)
    async with pg_pool.acquire() as conn, conn.transaction():
        first = await outbox.add(conn, event_type="order.placed", aggregate_type="order",
                                 aggregate_id="o-1", payload=OrderPlaced(order_id="o-1",
                                                                         amount=3),
                                 headers={"correlation_id": "c-1"}, occurred_at=at)
        second = await outbox.add(conn, event_type="order.paid", aggregate_type="order",
                                  aggregate_id="o-1", payload={"order_id": "o-1"})
    assert first is not None
    assert first.version == 7
    assert second is not None

    async with RelayRunning(relay_for(postgres_dsn, outbox_table, kafka_bootstrap, topic)):
        await wait_until(lambda: _empty(pg_pool, outbox_table), 30, "outbox drained")
        records = await read_all(kafka_bootstrap, [topic], lambda found: len(found) >= 2)

    assert [r.headers["id"] for r in records] == [str(first).encode(), str(second).encode()]
    one = records[0]
    assert one.key == b"o-1"
    assert orjson.loads(one.value or b"") == {"order_id": "o-1", "amount": 3}
    assert one.headers["event_type"] == b"order.placed"
    assert one.headers["aggregate_type"] == b"order"
    assert one.headers["correlation_id"] == b"c-1"
    assert datetime.fromisoformat(one.headers["occurred_at"].decode()) == at
    assert one.timestamp == int(at.timestamp() * 1000)
    assert records[0].partition == records[1].partition


async def _empty(pool: asyncpg.Pool[asyncpg.Record], table: OutboxTable) -> bool:
    return await pending(pool, table) == 0


async def test_a_row_committed_late_is_published(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, kafka_bootstrap: str,
    make_topic: MakeTopic, outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    topic = await make_topic(partitions=1)
    relay = relay_for(postgres_dsn, outbox_table, kafka_bootstrap, topic)
    async with RelayRunning(relay):
        late = await pg_pool.acquire()
        try:
            tx = late.transaction()
            await tx.start()
            held = await outbox.add(late, event_type="e", aggregate_type="a",
                                    aggregate_id="late", payload={"n": 0})
            async with pg_pool.acquire() as conn, conn.transaction():
                after = await outbox.add(conn, event_type="e", aggregate_type="a",
                                         aggregate_id="early", payload={"n": 1})
            await wait_until(lambda: _published(relay, 1), 30, "the early event published")
            await tx.commit()
        finally:
            await pg_pool.release(late)
        await wait_until(lambda: _published(relay, 2), 30, "the late event published")
    records = await read_all(kafka_bootstrap, [topic], lambda found: len(found) >= 2)
    assert [r.headers["id"] for r in records] == [str(after).encode(), str(held).encode()]


async def _published(relay: Relay, n: int) -> bool:
    return relay.published >= n


async def test_routes_by_template_and_polls_without_notify(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, kafka_bootstrap: str,
    outbox_table: OutboxTable,
) -> None:
    prefix = f"ck-route-{outbox_table.schema}"
    for kind in ("placed", "paid"):  # the relay creates no topic
        await create_topic(kafka_bootstrap, f"{prefix}.order.{kind}", 1)
    writer = Outbox(outbox_table.schema, outbox_table.table, notify=False)
    async with pg_pool.acquire() as conn, conn.transaction():
        for kind in ("placed", "paid"):
            await writer.add(conn, event_type=kind, aggregate_type="order", aggregate_id="o",
                             payload={"kind": kind})
    relay = relay_for(postgres_dsn, outbox_table, kafka_bootstrap,
                      prefix + ".{aggregate_type}.{event_type}", notify=False,
                      poll_interval=0.05)
    async with RelayRunning(relay):
        await wait_until(lambda: _published(relay, 2), 30, "both events published")
        async with pg_pool.acquire() as conn, conn.transaction():
            await writer.add(conn, event_type="placed", aggregate_type="order",
                             aggregate_id="o2", payload={"kind": "again"})
        await wait_until(lambda: _published(relay, 3), 30, "a polled event published")
    topics = [f"{prefix}.order.placed", f"{prefix}.order.paid"]
    records = await read_all(kafka_bootstrap, topics, lambda found: len(found) >= 3)
    by_topic = {t: sorted(orjson.loads(r.value or b"")["kind"] for r in records if r.topic == t)
                for t in topics}
    assert by_topic == {topics[0]: ["again", "placed"], topics[1]: ["paid"]}


async def test_notify_wakes_the_relay_before_its_poll_interval(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, direct_postgres_dsn: str,
    kafka_bootstrap: str, make_topic: MakeTopic, outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    topic = await make_topic(partitions=1)
    # behind a transaction pooler the relay LISTENs on a direct connection of its own
    relay = relay_for(postgres_dsn, outbox_table, kafka_bootstrap, topic, poll_interval=600,
                      rebalance_interval=600,
                      listen_dsn=direct_postgres_dsn if THROUGH_POOLER else None)
    async with RelayRunning(relay):
        await wait_until(lambda: _owns_slots(relay), 30, "slots owned")
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with pg_pool.acquire() as conn, conn.transaction():
            await outbox.add(conn, event_type="e", aggregate_type="a", aggregate_id="x",
                             payload={})
        await wait_until(lambda: _published(relay, 1), 30, "the event published")
        assert loop.time() - start < 10  # far below the 600 s poll: the notification woke it


async def _owns_slots(relay: Relay) -> bool:
    return bool(relay.slots)
