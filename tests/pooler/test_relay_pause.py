"""A relay behind PgBouncer in transaction mode stays visible while it pauses after a failed
batch: its leases are renewed during the pause as during a send, so ``live_relays()``,
``slot_owners()`` and the cleanup's refusal see it however long the pause."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from consumerkit import Postgres, RetryPolicy
from consumerkit.errors import ConfigurationError
from consumerkit.outbox import Outbox, OutboxEvent, OutboxTable, Relay
from consumerkit.outbox.admin import cleanup, live_relays, slot_owners
from consumerkit.outbox.table import SLOTS

from ..outbox.conftest import RelayRunning, wait_until
from .conftest import PgBouncer

TTL = 2.0  # short leases: the pause outlives several of them quickly


class _BrokerDown:
    """A sink that fails every batch whole, as a broker that cannot be reached does."""

    def __init__(self) -> None:
        self.batches = 0

    async def open(self) -> None:
        pass

    async def send(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        self.batches += 1
        raise ConnectionError("broker unreachable")

    async def close(self) -> None:
        pass


async def test_a_relay_paused_after_a_failed_batch_is_seen_for_longer_than_its_leases(
    pgbouncer: Callable[..., PgBouncer], pg_pool: asyncpg.Pool[asyncpg.Record],
    outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    bouncer = pgbouncer(pool_size=2)
    async with pg_pool.acquire() as writer, writer.transaction():
        await outbox.add(writer, event_type="step", aggregate_type="account",
                         aggregate_id="a-0", payload={"n": 0},
                         occurred_at=datetime.now(UTC) - timedelta(days=30))
    sink = _BrokerDown()
    # the first pause lasts 60 s (stop() ends it): far longer than the leases
    relay = Relay(Postgres(dsn=bouncer.dsn, schema=outbox_table.schema, pooler="transaction"),
                  sink, table=outbox_table.table,
                  handle_signals=False, poll_interval=0.1,
                  name="paused", retry=RetryPolicy(initial_delay=60.0, max_delay=60.0))
    assert relay._leases is not None
    relay._leases.ttl = TTL
    async with RelayRunning(relay):

        async def paused() -> bool:
            return relay.pauses >= 1

        await wait_until(paused, 30, "the relay paused after its failed batch")
        since = await pg_pool.fetchval("SELECT clock_timestamp()")

        async def leases_outlived() -> bool:  # in the database's clock, as the leases are
            return bool(await pg_pool.fetchval(
                "SELECT clock_timestamp() > $1::timestamptz + $2::float8 * interval '1 second'",
                since, 2 * TTL))

        await wait_until(leases_outlived, 30, f"{2 * TTL}s of the pause")
        assert relay.pauses == 1, "the pause ended early"
        assert sink.batches == 1
        async with pg_pool.acquire() as conn:
            assert await live_relays(conn, outbox_table) == 1
            owners = await slot_owners(conn, outbox_table)
            assert len(owners) == SLOTS
            assert set(owners.values()) == {relay._leases.holder}
            with pytest.raises(ConfigurationError, match="is running: its pending rows"):
                await cleanup(conn, timedelta(days=1), table=outbox_table)
    async with pg_pool.acquire() as conn:  # stopped: gone at once, and the row is garbage
        assert await live_relays(conn, outbox_table) == 0
        assert await slot_owners(conn, outbox_table) == {}
        assert await cleanup(conn, timedelta(days=1), table=outbox_table) == 1
