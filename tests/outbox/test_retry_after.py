"""A webhook's ``Retry-After``: the relay waits max(back-off, Retry-After) for that event, never
beyond the policy's ``max_delay``; other aggregates are not held."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime
from uuid import uuid4

import asyncpg
import pytest

from consumerkit import Postgres, WebhookError
from consumerkit.outbox import Outbox, OutboxEvent, OutboxTable, Relay
from consumerkit.outbox.settle import settle
from consumerkit.outbox.webhook import WebhookSink
from consumerkit.retry import RetryPolicy
from tests.webhooks.conftest import Reply, ScriptedEndpoint, serve

from ..pooling import POOLER
from .conftest import RelayRunning, pending, wait_until

POLICY = RetryPolicy(max_attempts=5, initial_delay=1.0, max_delay=10.0)


def _event(aggregate: str = "o-1") -> OutboxEvent:
    return OutboxEvent(seq=1, event_id=uuid4(), event_type="e", aggregate_type="order",
                       aggregate_id=aggregate, payload=b"{}", occurred_at=datetime.now(UTC))


@pytest.mark.parametrize(("retry_after", "low", "high"), [
    (None, 0.5, 1.0),  # the back-off alone: attempt 1 waits 1 s, jittered down to half
    (0.2, 0.5, 1.0),  # asked for less than the back-off: the back-off
    (4.0, 4.0, 4.0),  # asked for more: exactly that
    (600.0, 10.0, 10.0),  # asked for more than max_delay: max_delay
])
def test_a_failure_waits_the_longer_of_back_off_and_retry_after_capped(
    retry_after: float | None, low: float, high: float,
) -> None:
    error = WebhookError("answered 429", status=429, retry_after=retry_after)
    for seed in range(20):
        [failure] = settle([_event()], [error], POLICY, random.Random(seed)).failures
        assert low <= failure.delay <= high


async def test_the_relay_waits_what_the_receiver_asked_for(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, outbox: Outbox,
    outbox_table: OutboxTable,
) -> None:
    app = ScriptedEndpoint()
    async with pg_pool.acquire() as conn, conn.transaction():
        slow = await outbox.add(conn, event_type="e", aggregate_type="order",
                                aggregate_id="o-slow", payload={"n": 1})
        other = await outbox.add(conn, event_type="e", aggregate_type="order",
                                 aggregate_id="o-other", payload={"n": 2})
    assert slow is not None
    assert other is not None
    app.script(str(slow), Reply(429, (("Retry-After", "2"),)))
    async with serve(app, lifespan="off") as url:
        relay = Relay(Postgres(dsn=postgres_dsn, schema=outbox_table.schema, pooler=POOLER),
                      WebhookSink(url, timeout=2.0), handle_signals=False,
            retry=RetryPolicy(max_attempts=5, initial_delay=0.05, max_delay=5.0))
        async with RelayRunning(relay):
            await wait_until(lambda: _answered(app, str(slow), 1), 30, "the 429")
            refused_at = time.monotonic()
            await wait_until(lambda: _answered(app, str(other), 1), 30, "the other aggregate")
            assert time.monotonic() - refused_at < 1.5  # not held by the 429 of another one

            async def drained() -> bool:
                return await pending(pg_pool, outbox_table) == 0

            await wait_until(drained, 30, "the retried event delivered")
            waited = time.monotonic() - refused_at
    assert app.answered.count(str(slow)) == 2
    assert waited >= 1.8, f"retried after {waited:.2f}s, before the 2 s Retry-After"


async def _answered(app: ScriptedEndpoint, key: str, times: int) -> bool:
    return app.answered.count(key) >= times
