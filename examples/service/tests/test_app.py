"""The billing service's own tests, as a team writes them: its handler in the real consumer on
consumerkit's test kit, against the PostgreSQL the pytest plugin provides (no broker)."""

from __future__ import annotations

import asyncpg
from billing.app import SCHEMA_SQL, OrderCreated, charge

from consumerkit import Postgres
from consumerkit.testing import TestConsumer


async def test_an_order_is_charged_once_however_often_it_arrives(
    consumerkit_dsn: str, consumerkit_schema: str,
) -> None:
    conn = await asyncpg.connect(consumerkit_dsn)
    try:
        await conn.execute(SCHEMA_SQL)
        async with TestConsumer(
                [charge], postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema)) as kit:
            order = OrderCreated(order_id="o-1", amount=5)
            kit.publish(order, key="o-1", event_id="order-1")
            kit.publish(order, key="o-1", event_id="order-1")  # the broker's redelivery
            await kit.drain()
        assert [s.event_id for s in kit.applied] == ["order-1"]
        assert [s.event_id for s in kit.duplicates] == ["order-1"]
        rows = await conn.fetch("SELECT order_id, amount FROM charges")
        assert [(r["order_id"], r["amount"]) for r in rows] == [("o-1", 5)]
    finally:
        await conn.close()
