"""A relay behind PgBouncer in transaction mode, given a direct DSN to LISTEN on, is woken by
a commit to the outbox long before its poll interval, as a direct relay is."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg
import pytest

from consumerkit import Postgres
from consumerkit.errors import ConfigurationError
from consumerkit.outbox import KafkaSink, Outbox, OutboxTable, Relay
from consumerkit.testing.services import MakeTopic

from ..brokers import PRODUCER_OPTIONS
from ..outbox.conftest import RelayRunning, wait_until
from .conftest import PgBouncer


async def test_a_relay_behind_the_pooler_listens_on_its_direct_dsn(
    pgbouncer: Callable[..., PgBouncer], pg_pool: asyncpg.Pool[asyncpg.Record],
    direct_postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, outbox: Outbox,
    outbox_table: OutboxTable,
) -> None:
    bouncer = pgbouncer(pool_size=2)
    topic = await make_topic(partitions=1)
    sink = KafkaSink(kafka_bootstrap, route=topic, kafka_options=dict(PRODUCER_OPTIONS))
    relay = Relay(Postgres(dsn=bouncer.dsn, schema=outbox_table.schema, pooler="transaction",
                           listen_dsn=direct_postgres_dsn), sink, table=outbox_table.table,
                  handle_signals=False, poll_interval=600,
                  rebalance_interval=600, name="listening")
    assert relay.notify
    async with RelayRunning(relay):

        async def listening() -> bool:
            return relay._listener is not None and relay._listener.listening

        await wait_until(listening, 30, "the relay listening on its direct connection")
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with pg_pool.acquire() as conn, conn.transaction():
            await outbox.add(conn, event_type="e", aggregate_type="a", aggregate_id="x",
                             payload={})

        async def published() -> bool:
            return relay.published == 1

        await wait_until(published, 30, "the event published")
        assert loop.time() - start < 10  # far below the 600 s poll: the notification woke it


async def test_a_listen_dsn_without_a_transaction_pooler_is_refused(
    direct_postgres_dsn: str,
) -> None:
    sink = KafkaSink("127.0.0.1:1", route="t")
    try:
        with pytest.raises(ConfigurationError, match=r"Postgres\(listen_dsn=...\) is for "
                           "pooler='transaction'"):
            Relay(Postgres(dsn=direct_postgres_dsn, listen_dsn=direct_postgres_dsn), sink)
    finally:
        await sink.close()
