"""Testing handlers with consumerkit's test kit: a team's test module (docs/testing.md).

The handlers of ``examples/billing.py`` and ``examples/saga.py`` run in the real consumer
(keyed lanes, one transaction with the dedup claim, retries, dead letters, offset commits)
against a real PostgreSQL, fed from memory: no broker. ``consumerkit_dsn`` and
``consumerkit_schema`` come from consumerkit's pytest plugin, which installing consumerkit
enables. Run with pytest and pytest-asyncio (``asyncio_mode = "auto"``); consumerkit's own
suite runs these tests in ``tests/testing/test_examples.py``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from consumerkit import Postgres
from consumerkit.testing import TestConsumer
from examples import saga
from examples.billing import SCHEMA_SQL, OrderCancelled, OrderCreated, billing


@pytest.fixture
async def kit(consumerkit_dsn: str, consumerkit_schema: str) -> AsyncIterator[TestConsumer]:
    conn = await asyncpg.connect(consumerkit_dsn)  # search_path: the test's fresh schema
    try:
        await conn.execute(SCHEMA_SQL)
    finally:
        await conn.close()
    async with TestConsumer([billing],
                            postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                            topics=["orders"]) as kit:
        yield kit


async def charges(dsn: str) -> dict[str, int]:
    conn = await asyncpg.connect(dsn)
    try:
        return {r["order_id"]: r["amount"] for r in await conn.fetch("SELECT * FROM charges")}
    finally:
        await conn.close()


async def test_an_order_is_charged(kit: TestConsumer, consumerkit_dsn: str) -> None:
    kit.publish(OrderCreated(order_id="o-1", amount=250), key="o-1")
    await kit.drain()
    assert await charges(consumerkit_dsn) == {"o-1": 250}
    assert len(kit.applied) == 1


async def test_a_redelivered_order_is_charged_once(
    kit: TestConsumer, consumerkit_dsn: str,
) -> None:
    created = kit.publish(OrderCreated(order_id="o-1", amount=250), key="o-1")
    kit.redeliver(created)  # the producer sent it twice
    await kit.drain()
    kit.replay(0)  # a crash before the offset commit: everything is read again
    await kit.drain()
    assert await charges(consumerkit_dsn) == {"o-1": 250}
    assert len(kit.applied) == 1
    assert len(kit.duplicates) == 3  # the redelivery, then both records again


async def test_events_of_one_order_apply_in_order(
    kit: TestConsumer, consumerkit_dsn: str,
) -> None:
    for n in range(20):  # one key per order: its events share a partition and a lane
        kit.publish(OrderCreated(order_id=f"o-{n}", amount=n), key=f"o-{n}")
        kit.publish(OrderCancelled(order_id=f"o-{n}"), key=f"o-{n}")
    kit.publish(OrderCreated(order_id="o-kept", amount=7), key="o-kept")
    await kit.drain()
    assert await charges(consumerkit_dsn) == {"o-kept": 7}


async def test_a_failing_handler_fails_the_test(kit: TestConsumer) -> None:
    kit.publish(OrderCreated(order_id="o-1", amount=1), key="o-1")
    kit.publish(OrderCreated(order_id="o-1", amount=2), key="o-1")  # a second charge
    with pytest.raises(asyncpg.UniqueViolationError):
        await kit.drain()  # the handler's first error, raised here


async def test_a_failing_event_is_dead_lettered_and_the_rest_applied(
    kit: TestConsumer, consumerkit_dsn: str,
) -> None:
    kit.publish(OrderCreated(order_id="o-1", amount=1), key="o-1")
    kit.publish(OrderCreated(order_id="o-1", amount=2), key="o-1")
    kit.publish(OrderCreated(order_id="o-2", amount=3), key="o-2")
    await kit.drain(fail_fast=False)  # retried as the policy says, then dead-lettered
    (dead,) = kit.dead_letters
    assert dead.reason == "handler_failed"
    assert "UniqueViolationError" in dead.detail
    assert await charges(consumerkit_dsn) == {"o-1": 1, "o-2": 3}


async def test_the_saga_step_emits_one_event_per_order(
    consumerkit_dsn: str, consumerkit_schema: str,
) -> None:
    consumer = saga.build("unused:9092", consumerkit_dsn, schema=consumerkit_schema)
    conn = await asyncpg.connect(consumerkit_dsn)
    try:
        await conn.execute(saga.SCHEMA_SQL)
        async with TestConsumer.like(consumer) as kit:  # its handlers, outbox and settings
            created = kit.publish(saga.OrderCreated(order_id="o-1", amount=5), key="o-1")
            kit.redeliver(created)
            await kit.drain()
        emitted = await conn.fetch("SELECT type, aggregateid FROM outbox")
        assert [tuple(r) for r in emitted] == [("payment.completed", "o-1")]
    finally:
        await conn.close()
