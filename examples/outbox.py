"""The transactional outbox: writing events with the business change, running the relay,
handling failed rows, and cleaning up an outbox that Debezium reads, or keeping its rows for a
retention in time partitions."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

import asyncpg
from pydantic import BaseModel

from consumerkit import Postgres, migrate
from consumerkit.outbox import (
    KafkaSink,
    NewEvent,
    Outbox,
    OutboxRetention,
    OutboxTable,
    Relay,
    cleanup,
    count_failed,
    failed_events,
    maintain_outbox,
    retry_failed,
    skip_failed,
)


class OrderPlaced(BaseModel):
    order_id: str
    amount: int


outbox = Outbox(schema="consumerkit", table="outbox")


async def place_order(conn: asyncpg.Connection, order_id: str, amount: int) -> UUID | None:
    async with conn.transaction():
        await conn.execute("INSERT INTO orders (id, amount) VALUES ($1, $2)", order_id, amount)
        return await outbox.add(
            conn, event_type="order.placed", aggregate_type="order", aggregate_id=order_id,
            payload=OrderPlaced(order_id=order_id, amount=amount),
            headers={"correlation_id": order_id},
            dedup_key=f"order.placed:{order_id}",  # optional: refuses a second such event
        )


async def ship_lines(conn: asyncpg.Connection, order_id: str, lines: list[str]) -> None:
    async with conn.transaction():
        await outbox.add_many(conn, [
            NewEvent("line.shipped", "order", order_id, {"order_id": order_id, "line": line})
            for line in lines
        ])


async def create_tables(conn: asyncpg.Connection) -> None:
    await migrate(conn, dedup=None, outboxes=[OutboxTable("consumerkit", "outbox")])


def build_relay(bootstrap: str, dsn: str) -> Relay:
    sink = KafkaSink(
        bootstrap,
        route="events.{aggregate_type}",  # or "{aggregate_type}", "events.{event_type}"
        kafka_options={"enable_idempotence": True},  # False for brokers without it
    )
    return Relay(Postgres(dsn=dsn, schema="consumerkit"), sink, table="outbox", batch_size=500)


async def run_relay(bootstrap: str, dsn: str) -> None:
    relay = build_relay(bootstrap, dsn)
    await relay.run()  # until relay.stop(), SIGTERM or SIGINT


async def failed_rows(conn: asyncpg.Connection) -> None:
    table = OutboxTable("consumerkit", "outbox")
    if await count_failed(conn, table):  # alert when above zero
        for event in await failed_events(conn, table):
            print(event.event_id, event.event_type, event.attempts, event.last_error)


async def retry_or_skip(conn: asyncpg.Connection, retry: list[UUID], skip: list[UUID]) -> None:
    table = OutboxTable("consumerkit", "outbox")
    await retry_failed(conn, retry, table=table)  # published again at once, in order
    await skip_failed(conn, skip, table=table)  # deleted unpublished: the aggregate moves on


debezium_outbox = Outbox(schema="public", table="outbox", delete_after_insert=True,
                         notify=False)


async def nightly_cleanup(conn: asyncpg.Connection) -> int:
    table = OutboxTable("public", "outbox")
    return await cleanup(conn, timedelta(days=7), table=table, batch=5000)


kept_outbox = Outbox(schema="public", table="outbox", notify=False,
                     retention=OutboxRetention(retention=timedelta(days=7)))


async def create_the_kept_outbox(conn: asyncpg.Connection) -> None:
    # as the owner: the partitioned table, its partitions ahead and the publication
    await migrate(conn, dedup=None, outboxes=[kept_outbox.table])


async def every_six_hours(conn: asyncpg.Connection) -> None:
    # partitions made ahead, those past the retention dropped whole; outside a transaction
    await maintain_outbox(conn, kept_outbox.table)
