"""The writer: inside the caller's transaction only, commit order per aggregate, idempotency
keys, one notification per transaction, delete-after-insert for Debezium."""

from __future__ import annotations

import asyncio
from uuid import UUID

import asyncpg
import pytest

from consumerkit.errors import ConfigurationError
from consumerkit.outbox import NewEvent, NotInTransactionError, Outbox, OutboxTable

from .conftest import wait_until


async def test_a_write_outside_a_transaction_is_refused(
    pg_pool: asyncpg.Pool[asyncpg.Record], outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    async with pg_pool.acquire() as conn:
        with pytest.raises(NotInTransactionError, match="inside the caller's transaction"):
            await outbox.add(conn, event_type="e", aggregate_type="a", aggregate_id="1",
                             payload={})
        assert await conn.fetchval(f"SELECT count(*) FROM {outbox_table.events}") == 0


async def test_reserved_headers_and_naive_times_are_refused(
    pg_pool: asyncpg.Pool[asyncpg.Record], outbox: Outbox,
) -> None:
    async with pg_pool.acquire() as conn, conn.transaction():
        with pytest.raises(ConfigurationError, match="set by the relay"):
            await outbox.add(conn, event_type="e", aggregate_type="a", aggregate_id="1",
                             payload={}, headers={"id": "forged"})


async def test_a_second_writer_of_an_aggregate_draws_its_seq_after_the_first_commits(
    pg_pool: asyncpg.Pool[asyncpg.Record], direct_postgres_dsn: str, outbox: Outbox,
    outbox_table: OutboxTable,
) -> None:
    # the two writers connect directly: the wait is found by the second one's backend pid
    first_conn = await asyncpg.connect(direct_postgres_dsn)
    second_conn = await asyncpg.connect(direct_postgres_dsn)
    try:
        first_tx = first_conn.transaction()
        await first_tx.start()
        await outbox.add(first_conn, event_type="e", aggregate_type="a", aggregate_id="x",
                         payload={"n": 1})

        async def second() -> UUID | None:
            async with second_conn.transaction():
                return await outbox.add(second_conn, event_type="e", aggregate_type="a",
                                        aggregate_id="x", payload={"n": 2})

        waiting = asyncio.create_task(second())
        pid = second_conn.get_server_pid()

        async def blocked() -> bool:
            return bool(await pg_pool.fetchval(
                "SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' "
                "AND NOT granted", pid))

        await wait_until(blocked, 10, "the second writer waiting on the aggregate lock")
        # meanwhile another aggregate is not held up
        async with pg_pool.acquire() as other, other.transaction():
            await outbox.add(other, event_type="e", aggregate_type="a", aggregate_id="y",
                             payload={"n": 0})
        await first_tx.commit()
        await asyncio.wait_for(waiting, 10)
    finally:
        await first_conn.close()
        await second_conn.close()
    rows = await pg_pool.fetch(
        f"SELECT aggregateid, payload->>'n' AS n FROM {outbox_table.events} ORDER BY seq")
    # x/2 drew its seq only after x/1 committed: after y/0, written while it waited
    assert [(r["aggregateid"], r["n"]) for r in rows] == [("x", "1"), ("y", "0"), ("x", "2")]


async def test_an_idempotency_key_refuses_a_second_event_even_after_publication(
    pg_pool: asyncpg.Pool[asyncpg.Record], outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    async with pg_pool.acquire() as conn:
        async with conn.transaction():
            first = await outbox.add(conn, event_type="e", aggregate_type="a",
                                     aggregate_id="1", payload={}, dedup_key="order-1:paid")
            again = await outbox.add(conn, event_type="e", aggregate_type="a",
                                     aggregate_id="1", payload={}, dedup_key="order-1:paid")
        assert first is not None
        assert again is None
        await conn.execute(f"DELETE FROM {outbox_table.events}")  # as the relay does on ack
        async with conn.transaction():
            batch = await outbox.add_many(conn, [
                NewEvent("e", "a", "1", {}, dedup_key="order-1:paid"),
                NewEvent("e", "a", "1", {}, dedup_key="order-1:shipped"),
                NewEvent("e", "a", "1", {}, dedup_key="order-1:shipped"),
                NewEvent("e", "a", "2", {}),
            ])
        assert len(batch) == 2
        assert await conn.fetchval(f"SELECT count(*) FROM {outbox_table.events}") == 2


async def test_one_notification_per_committed_transaction_none_for_a_rollback(
    pg_pool: asyncpg.Pool[asyncpg.Record], direct_postgres_dsn: str, outbox: Outbox,
    outbox_table: OutboxTable,
) -> None:
    received: list[str] = []
    listener = await asyncpg.connect(direct_postgres_dsn)  # LISTEN needs a session of its own
    try:
        def on_notify(*args: object) -> None:
            received.append(str(args[3]))  # (connection, pid, channel, payload)

        await listener.add_listener(outbox_table.channel, on_notify)
        async with pg_pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            await outbox.add(conn, event_type="e", aggregate_type="a", aggregate_id="1",
                             payload={})
            await tx.rollback()
            async with conn.transaction():
                for n in range(5):
                    await outbox.add(conn, event_type="e", aggregate_type="a",
                                     aggregate_id=str(n), payload={})
            # a marker notification, sent after the commit above, bounds the wait
            await conn.execute("SELECT pg_notify($1, 'marker')", outbox_table.channel)

        async def marker() -> bool:
            return "marker" in received

        await wait_until(marker, 10, "the marker notification")
        await listener.remove_listener(outbox_table.channel, on_notify)
    finally:
        await listener.close()
    assert received == ["", "marker"]


async def test_delete_after_insert_leaves_no_row(
    pg_pool: asyncpg.Pool[asyncpg.Record], outbox_table: OutboxTable,
) -> None:
    # this server has no logical decoding: the slot check (tests/outbox/test_cdc_slot.py) off
    writer = Outbox(outbox_table.schema, outbox_table.table, delete_after_insert=True,
                    require_slot=False)
    async with pg_pool.acquire() as conn:
        async with conn.transaction():
            added = await writer.add(conn, event_type="e", aggregate_type="a",
                                     aggregate_id="1", payload={"x": 1})
            assert added is not None
        assert await conn.fetchval(f"SELECT count(*) FROM {outbox_table.events}") == 0


async def test_the_version_header_comes_from_the_call_or_the_model(
    pg_pool: asyncpg.Pool[asyncpg.Record], outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    from examples.event_versions import OrderCreated

    order = OrderCreated(order_id="o-1", total_cents=5, first_name="A", last_name="L")
    async with pg_pool.acquire() as conn, conn.transaction():
        await outbox.add(conn, event_type="order.created", aggregate_type="order",
                         aggregate_id="1", payload=order)
        await outbox.add(conn, event_type="order.created", aggregate_type="order",
                         aggregate_id="2", payload={"n": 1}, version=2)
        await outbox.add(conn, event_type="order.created", aggregate_type="order",
                         aggregate_id="3", payload={"n": 1})
        with pytest.raises(ConfigurationError, match="'event_version' header is written from"):
            await outbox.add(conn, event_type="e", aggregate_type="a", aggregate_id="4",
                             payload={}, headers={"event_version": "2"})
        with pytest.raises(ConfigurationError, match="version must be an integer from 1"):
            await outbox.add(conn, event_type="e", aggregate_type="a", aggregate_id="4",
                             payload={}, version=0)
    rows = await pg_pool.fetch(
        f"SELECT aggregateid, headers->>'event_version' AS v FROM {outbox_table.events} "
        "ORDER BY seq")
    assert [(r["aggregateid"], r["v"]) for r in rows] == [("1", "3"), ("2", "2"), ("3", None)]
