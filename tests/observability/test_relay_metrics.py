"""A relay with ``metrics_port``: /readyz once started, pending rows counted, then published
with their publish latency, and a row given up on counted as failed."""

from __future__ import annotations

import asyncpg

from consumerkit import Metrics, Postgres, migrate
from consumerkit.outbox import KafkaSink, Outbox, OutboxTable, Relay
from consumerkit.testing.services import MakeTopic, free_port

from ..brokers import PRODUCER_OPTIONS
from ..outbox.conftest import RelayRunning, wait_until
from .scrape import get, samples, value


async def test_pending_then_published_on_the_metrics_port(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, kafka_bootstrap: str,
    make_topic: MakeTopic, pg_schema: str,
) -> None:
    topic = await make_topic(partitions=2)
    table = OutboxTable(pg_schema, "outbox")
    outbox = Outbox(pg_schema, "outbox")
    async with pg_pool.acquire() as conn:
        await migrate(conn, dedup=None, outboxes=[table])
        async with conn.transaction():
            for i in range(5):
                await outbox.add(conn, event_type="order.placed", aggregate_type=topic,
                                 aggregate_id=f"o-{i}", payload={"n": i})
            # routed to an invalid topic name: refused for good, given up on at once
            await outbox.add(conn, event_type="order.placed", aggregate_type="no such topic",
                             aggregate_id="x", payload={})
    port = free_port()
    sink = KafkaSink(kafka_bootstrap, route="{aggregate_type}",
                     kafka_options=dict(PRODUCER_OPTIONS))
    relay = Relay(Postgres(dsn=postgres_dsn, schema=pg_schema), sink,
                  metrics=Metrics(port=port, host="127.0.0.1"),
                  table="outbox", handle_signals=False)
    relay.backlog_interval = 3600  # the first round's count, taken before it publishes
    label = f"{pg_schema}.outbox"
    assert await relay.readiness() == "starting"
    async with RelayRunning(relay):
        await wait_until(lambda: _ready(port), 30, "/readyz to turn 200")
        await wait_until(lambda: _gauge(port, "consumerkit_outbox_pending", label, 6), 30,
                         "6 rows pending")
        oldest = value(await samples(port), "consumerkit_outbox_oldest_pending_seconds",
                       outbox=label)
        assert oldest is not None
        assert oldest >= 0
        relay.backlog_interval = 0.05
        await wait_until(lambda: _gauge(port, "consumerkit_outbox_pending", label, 1), 30,
                         "only the row given up on pending")
        await wait_until(lambda: _gauge(port, "consumerkit_outbox_failed", label, 1), 30,
                         "one row given up on")
        found = await samples(port)
        assert value(found, "consumerkit_outbox_published_total", outbox=label) == 5
        assert value(found, "consumerkit_outbox_publish_seconds_count", outbox=label) == 5
        assert value(found, "consumerkit_outbox_publish_failures_total", outbox=label,
                     result="given_up") == 1
        assert value(found, "consumerkit_ready", role="relay", name=relay.name) == 1
        assert await relay.readiness() is None
    assert await relay.readiness() == "stopping"
    assert (await get(port, "/healthz"))[0] == 0  # the endpoint closed with the relay


async def _ready(port: int) -> bool:
    return (await get(port, "/readyz"))[0] == 200


async def _gauge(port: int, name: str, outbox: str, wanted: float) -> bool:
    return value(await samples(port), name, outbox=outbox) == wanted
