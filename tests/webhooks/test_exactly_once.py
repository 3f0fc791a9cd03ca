"""The two acceptance criteria of webhooks, on real PostgreSQL and real HTTP servers:

- a receiver that fails twice, times out once and then accepts gets the event, published from
  the outbox by the relay through :class:`WebhookSink`, with every attempt recorded;
- the receiving endpoint applies the effect once under repeated posts, sequential or
  concurrent, and the whole chain (outbox, relay, sink, receiver) applies each event once.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import TypeAlias

import asyncpg
import httpx
import orjson

from consumerkit import Postgres, RetryPolicy, WebhookSink, migrate
from consumerkit.outbox import Outbox, OutboxTable, Relay
from consumerkit.webhook import generate_secret

from .conftest import Reply, ScriptedEndpoint, wait_until
from .handlers import CONTROL, create_effects, effects_of, order_id, receiving

Pool: TypeAlias = "asyncpg.Pool[asyncpg.Record]"
FAST_RETRY = RetryPolicy(max_attempts=10, initial_delay=0.05, max_delay=0.2)


async def post(client: httpx.AsyncClient, order: str, key: str) -> httpx.Response:
    return await client.post("/orders", content=orjson.dumps({"order_id": order, "amount": 5}),
                             headers={"Idempotency-Key": key, "X-Event-Type": "order.paid"})


# -- the endpoint applies the effect once ------------------------------------------------------

async def test_the_endpoint_applies_the_effect_once_under_repeated_posts(
    postgres_dsn: str, pg_schema: str, pg_pool: Pool,
) -> None:
    await create_effects(pg_pool, pg_schema)
    sequential, burst = str(uuid.uuid4()), str(uuid.uuid4())
    async with receiving(postgres_dsn, pg_schema, pool_size=25) as url, \
            httpx.AsyncClient(base_url=url, timeout=30) as client:
        order = order_id()
        answers = [await post(client, order, sequential) for _ in range(5)]
        order = order_id()
        answers_burst = await asyncio.gather(*(post(client, order, burst) for _ in range(20)))

    assert [a.status_code for a in answers] == [200] * 5
    assert [a.json()["status"] for a in answers] == ["applied"] + ["duplicate"] * 4
    assert all(a.headers["idempotent-replayed"] == "true" for a in answers[1:])
    assert all(a.json()["first_seen_at"] for a in answers[1:])
    assert [a.status_code for a in answers_burst] == [200] * 20
    assert sorted(a.json()["status"] for a in answers_burst) == ["applied"] + ["duplicate"] * 19
    assert await effects_of(pg_pool, pg_schema, sequential) == 1
    assert await effects_of(pg_pool, pg_schema, burst) == 1


async def test_posts_waiting_on_an_open_transaction_see_its_commit_as_a_duplicate(
    postgres_dsn: str, pg_schema: str, pg_pool: Pool,
) -> None:
    """The first post holds its transaction open; 12 more of the same key provably wait on the
    claim lock (PostgreSQL shows them waiting), then all answer "duplicate" once it commits."""
    await create_effects(pg_pool, pg_schema)
    namespace, order, key = f"p{uuid.uuid4().hex[:8]}", order_id(), str(uuid.uuid4())
    started, release = CONTROL.hold(order)

    async def waiting_on_locks() -> bool:
        count: int = await pg_pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 "
            "AND wait_event_type = 'Lock'", f"consumerkit:webhook:{namespace}")
        return count == 12

    async with receiving(postgres_dsn, pg_schema, namespace, pool_size=20) as url, \
            httpx.AsyncClient(base_url=url, timeout=30) as client:
        first = asyncio.create_task(post(client, order, key))
        await asyncio.wait_for(started.wait(), timeout=10)
        rest = [asyncio.create_task(post(client, order, key)) for _ in range(12)]
        await wait_until(waiting_on_locks, "12 claims waiting on the first one's lock")
        release.set()
        assert (await first).json()["status"] == "applied"
        statuses = [(r.status_code, r.json()["status"]) for r in await asyncio.gather(*rest)]
    assert statuses == [(200, "duplicate")] * 12
    assert await effects_of(pg_pool, pg_schema, key) == 1


# -- the relay delivers through the sink ------------------------------------------------------

@contextlib.asynccontextmanager
async def relaying(dsn: str, table: OutboxTable, sink: WebhookSink) -> AsyncIterator[Relay]:
    relay = Relay(Postgres(dsn=dsn, schema=table.schema), sink, table=table.table, retry=FAST_RETRY,
                  poll_interval=0.05, handle_signals=False)
    task = asyncio.create_task(relay.run())
    try:
        await wait_until(lambda: _started(relay, task), "the relay to start")
        yield relay
    finally:
        relay.stop()
        await asyncio.wait_for(task, timeout=30)


async def _started(relay: Relay, task: asyncio.Task[None]) -> bool:
    if task.done():
        task.result()  # re-raise why it stopped
    return relay.started.is_set()


async def outbox_in(pool: Pool, schema: str) -> tuple[Outbox, OutboxTable]:
    table = OutboxTable(schema, "outbox")
    async with pool.acquire() as conn:
        await migrate(conn, dedup=None, outboxes=[table])
    return Outbox(schema, "outbox"), table


async def test_a_receiver_that_fails_twice_times_out_once_then_accepts_gets_the_event(
    postgres_dsn: str, pg_schema: str, pg_pool: Pool, endpoint: tuple[ScriptedEndpoint, str],
) -> None:
    app, url = endpoint
    outbox, table = await outbox_in(pg_pool, pg_schema)
    async with pg_pool.acquire() as conn, conn.transaction():
        event_id = await outbox.add(conn, event_type="order.paid", aggregate_type="order",
                                    aggregate_id="o-1", payload={"order_id": "o-1", "amount": 5})
    key = str(event_id)
    accept = asyncio.Event()
    app.script(key, Reply(500), Reply(502), Reply(hang=True), Reply(200, gate=accept))

    async def attempts_recorded() -> bool:
        row = await pg_pool.fetchrow(
            f"SELECT attempts, last_error, failed FROM {table.failures} WHERE event_id = $1",
            event_id)
        return row is not None and row["attempts"] == 3 and len(app.requests) == 4

    async def delivered() -> bool:
        left: int = await pg_pool.fetchval(f"SELECT count(*) FROM {table.events}")
        return left == 0

    async with relaying(postgres_dsn, table, WebhookSink(f"{url}/hooks", timeout=2.0)):
        await wait_until(attempts_recorded, "three failed attempts recorded")
        row = await pg_pool.fetchrow(f"SELECT * FROM {table.failures} WHERE event_id = $1",
                                     event_id)
        assert row is not None
        assert "timed out after 2.0s" in row["last_error"]
        assert not row["failed"]
        accept.set()
        await wait_until(delivered, "the event acknowledged and deleted")

    assert [r.key for r in app.requests] == [key] * 4
    assert [r.headers["x-event-attempt"] for r in app.requests] == ["1", "2", "3", "4"]
    assert orjson.loads(app.requests[-1].body) == {"order_id": "o-1", "amount": 5}
    assert await pg_pool.fetchval(f"SELECT count(*) FROM {table.failures}") == 0


async def test_a_4xx_answer_makes_the_outbox_row_failed(
    postgres_dsn: str, pg_schema: str, pg_pool: Pool, endpoint: tuple[ScriptedEndpoint, str],
) -> None:
    app, url = endpoint
    outbox, table = await outbox_in(pg_pool, pg_schema)
    async with pg_pool.acquire() as conn, conn.transaction():
        event_id = await outbox.add(conn, event_type="order.paid", aggregate_type="order",
                                    aggregate_id="o-2", payload={"order_id": "o-2"})
    app.script(str(event_id), Reply(422, body=b'{"error": "invalid_payload"}'))

    async def failed() -> bool:
        return bool(await pg_pool.fetchval(
            f"SELECT failed FROM {table.failures} WHERE event_id = $1", event_id))

    async with relaying(postgres_dsn, table, WebhookSink(url)):
        await wait_until(failed, "the row marked FAILED")
    error = await pg_pool.fetchval(
        f"SELECT last_error FROM {table.failures} WHERE event_id = $1", event_id)
    assert error.startswith("PermanentSendError: POST")
    assert "422" in error
    assert len(app.requests) == 1


async def test_outbox_to_receiver_applies_each_event_once(
    postgres_dsn: str, pg_schema: str, pg_pool: Pool,
) -> None:
    """Outbox -> relay -> sink -> receiver -> handler, with a receiver whose handler fails the
    first delivery of one event: every event is applied once, and in per-aggregate order."""
    await create_effects(pg_pool, pg_schema)
    outbox, table = await outbox_in(pg_pool, pg_schema)
    orders = [order_id() for _ in range(6)]
    CONTROL.fail[orders[2]] = 1
    async with pg_pool.acquire() as conn, conn.transaction():
        ids = [await outbox.add(conn, event_type="order.paid", aggregate_type="customer",
                                aggregate_id=f"c-{n % 2}", payload={"order_id": o, "amount": n})
               for n, o in enumerate(orders)]

    async def delivered() -> bool:
        left: int = await pg_pool.fetchval(f"SELECT count(*) FROM {table.events}")
        return left == 0

    secret = generate_secret()  # the whole chain signed: the sink signs, the receiver verifies
    async with receiving(postgres_dsn, pg_schema, secrets=secret) as url, \
            relaying(postgres_dsn, table, WebhookSink(f"{url}/orders", secrets=secret)):
        await wait_until(delivered, "every event delivered")

    assert CONTROL.fail[orders[2]] == 0  # its first delivery failed in the handler
    rows = await pg_pool.fetch(
        f'SELECT event_id, amount FROM "{pg_schema}".effects ORDER BY seq')
    assert sorted(r["event_id"] for r in rows) == sorted(str(i) for i in ids)
    for parity in (0, 1):  # each aggregate's effects in outbox order
        amounts = [r["amount"] for r in rows if r["amount"] % 2 == parity]
        assert amounts == sorted(amounts)
