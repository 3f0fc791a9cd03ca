"""Failover-ready connections: a consumer and a relay given the multi-host DSN
(``target_session_attrs=read-write``) wait out the death of the primary and go on, on the
promoted standby, with nothing lost and nothing applied twice."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from consumerkit import Postgres, migrate
from consumerkit.outbox import NewEvent, Outbox, OutboxTable, Relay
from consumerkit.outbox.kafka import KafkaSink
from consumerkit.testing.services import MakeTopic
from tests.harness import ReplicatedPostgres
from tests.integration.ledger import (
    Running,
    create_ledger,
    ledger_rows,
    make_events,
    publish,
    settled,
    verify,
    wait_for,
)
from tests.integration.ledger import build as build_consumer
from tests.outbox.conftest import RelayRunning, read_all

TIMEOUT = 90.0
SCHEMA = "failover"


async def _prepared(dsn: str) -> Outbox:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await migrate(conn, SCHEMA)
        await create_ledger(conn, SCHEMA)
        await migrate(conn, dedup=None, outboxes=[OutboxTable(SCHEMA)])
    finally:
        await conn.close()
    return Outbox(SCHEMA)


async def _write(dsn: str, outbox: Outbox, tag: str, count: int) -> None:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        async with conn.transaction():
            await outbox.add_many(conn, [NewEvent("step.recorded", "ledger", f"agg-{i % 4}",
                                                  {"tag": tag, "n": i}) for i in range(count)])
    finally:
        await conn.close()


async def test_a_consumer_and_a_relay_go_on_after_a_failover(
        pair: ReplicatedPostgres, kafka_bootstrap: str, make_topic: MakeTopic,
        caplog: pytest.LogCaptureFixture) -> None:
    dsn = pair.dsn
    outbox = await _prepared(dsn)
    source, published = await make_topic(partitions=3), await make_topic(partitions=3)
    before, after = make_events(6, 10), make_events(6, 20)[60:]
    consumer = build_consumer("failover", SCHEMA, source, dsn, kafka_bootstrap, migrate=False)
    relay = Relay(Postgres(dsn=dsn, schema=SCHEMA), KafkaSink(kafka_bootstrap, route=published,
                                 kafka_options={"enable_idempotence": False}),
                  name="failover", handle_signals=False,
                  rebalance_interval=0.2, poll_interval=0.2)
    async with Running(consumer), RelayRunning(relay):
        await publish(kafka_bootstrap, source, before)
        await _write(dsn, outbox, "before", 20)
        await wait_for(lambda: settled(consumer, len(before)), TIMEOUT, "the first events")
        await read_all(kafka_bootstrap, [published], lambda found: len(found) >= 20)
        await asyncio.to_thread(pair.wait_caught_up)

        await asyncio.to_thread(pair.kill_primary)
        # records arrive while no server takes writes: waited out, not dead-lettered
        await publish(kafka_bootstrap, source, after)

        async def both_waiting() -> bool:
            said = {r.getMessage().split(" (")[0].split(" paused")[0] for r in caplog.records}
            return {"database unavailable", "outbox relay failover"} <= said

        await wait_for(both_waiting, TIMEOUT, "the consumer and the relay to find no primary")
        await asyncio.to_thread(pair.promote)

        await _write(dsn, outbox, "after", 20)
        await wait_for(lambda: settled(consumer, len(before) + len(after)), TIMEOUT,
                       "the events sent during the failover")
        found = await read_all(kafka_bootstrap, [published], lambda found: len(found) >= 40)

    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        assert await conn.fetchval("SELECT inet_server_port()") == pair.primary_port
        verify(await ledger_rows(conn, SCHEMA), before + after)
        assert await conn.fetchval(f"SELECT count(*) FROM {SCHEMA}.dead_letters") == 0
        assert await conn.fetchval(f"SELECT count(*) FROM {OutboxTable(SCHEMA).events}") == 0
    finally:
        await conn.close()
    assert consumer.stats.dead_lettered == 0
    assert sorted(p.headers["id"] for p in found) == sorted({p.headers["id"] for p in found})
    assert len(found) == 40
