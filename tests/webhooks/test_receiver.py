"""WebhookReceiver under uvicorn on real PostgreSQL: the status code contract for every kind of
request, what the handler sees, and what is (not) written."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import TypeAlias

import asyncpg
import httpx
import orjson
import pytest

from consumerkit import (
    ConfigurationError,
    DedupPolicy,
    Postgres,
    PostgresDedupStore,
    Timeouts,
    WebhookReceiver,
)
from consumerkit.dedup.policy import ExpiredPolicy
from consumerkit.errors import StartupError

from .conftest import serve, wait_until
from .handlers import (
    CONTROL,
    HANDLERS,
    create_effects,
    effects_of,
    order_id,
    receiving,
)

Pool: TypeAlias = "asyncpg.Pool[asyncpg.Record]"


def body(order: str, amount: int = 5) -> bytes:
    return orjson.dumps({"order_id": order, "amount": amount})


def headers(key: str | None = None, event_type: str | None = "order.paid",
            **extra: str) -> dict[str, str]:
    found = {"Idempotency-Key": key or str(uuid.uuid4())}
    if event_type is not None:
        found["X-Event-Type"] = event_type
    return found | {name.replace("_", "-"): value for name, value in extra.items()}


@pytest.fixture
async def url(postgres_dsn: str, pg_schema: str, pg_pool: Pool) -> AsyncIterator[str]:
    await create_effects(pg_pool, pg_schema)
    async with receiving(postgres_dsn, pg_schema, max_body_bytes=1000) as base:
        yield base


@pytest.fixture
async def client(url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=url, timeout=20) as c:
        yield c


async def claimed(pool: Pool, schema: str, key: str) -> bool:
    async with pool.acquire() as conn:
        return await PostgresDedupStore(schema).seen(conn, "partner", key) is not None


# -- applied ---------------------------------------------------------------------------------

async def test_a_delivery_is_applied_and_the_handler_sees_its_envelope(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str,
) -> None:
    order, key = order_id(), str(uuid.uuid4())
    occurred = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    reply = await client.post("/orders", content=body(order), headers=headers(
        key, X_Event_Occurred_At=occurred.isoformat(), X_Event_Aggregate_Id="agg-1",
        X_Event_Aggregate_Type="order", X_Event_Correlation_Id="c-9", X_Event_Attempt="3",
        Authorization="Bearer private"))
    assert reply.status_code == 200
    assert reply.json() == {"status": "applied", "event_id": key}
    assert await effects_of(pg_pool, pg_schema, key) == 1
    envelope, attempt = CONTROL.seen[order]
    assert (envelope.event_id, envelope.id_source, envelope.event_type) == (
        key, "header", "order.paid")
    # /orders routes to no handler by topic: the bounded namespace, not the path
    assert (envelope.topic, envelope.partition, envelope.offset) == ("webhook:partner", -1, -1)
    assert envelope.key == "agg-1"
    assert (envelope.aggregate_type, envelope.correlation_id) == ("order", "c-9")
    assert envelope.occurred_at == envelope.event_time == occurred
    assert envelope.timestamp is not None
    assert abs(envelope.timestamp - datetime.now(UTC)) < timedelta(minutes=1)
    assert attempt == 3
    assert "authorization" not in envelope.headers  # only the event's own headers
    assert envelope.headers["x-event-correlation-id"] == b"c-9"


async def test_a_topic_route_takes_deliveries_without_an_event_type(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str,
) -> None:
    order, key = order_id(), str(uuid.uuid4())
    reply = await client.post("/legacy", content=body(order), headers=headers(key, None))
    assert reply.status_code == 200
    assert await effects_of(pg_pool, pg_schema, key) == 1
    assert CONTROL.seen[order][0].event_type is None
    assert CONTROL.seen[order][1] == 1  # no X-Event-Attempt: the first


# -- refused: 4xx ------------------------------------------------------------------------------

@pytest.mark.parametrize(("case", "status", "code"), [
    ("no key", 400, "missing_event_id"),
    ("empty key", 400, "missing_event_id"),
    ("long key", 400, "invalid_event_id"),
    ("not json", 400, "invalid_json"),
    ("wrong payload", 400, "invalid_payload"),
    ("bad occurred-at", 400, "invalid_header"),
    ("no event type", 400, "missing_event_type"),
    ("unknown event type", 404, "unknown_event_type"),
])
async def test_a_bad_request_is_refused_with_a_clear_error_and_nothing_claimed(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str, case: str, status: int,
    code: str,
) -> None:
    key, content = str(uuid.uuid4()), body(order_id())
    sent = headers(key)
    if case == "no key":
        del sent["Idempotency-Key"]
    elif case == "empty key":
        sent["Idempotency-Key"] = ""
    elif case == "long key":
        key = sent["Idempotency-Key"] = "k" * 201
    elif case == "not json":
        content = b'{"order_id": '
    elif case == "wrong payload":
        content = b'{"order_id": "o", "amount": "lots"}'
    elif case == "bad occurred-at":
        sent["X-Event-Occurred-At"] = "yesterday"
    elif case == "no event type":
        del sent["X-Event-Type"]
    else:
        sent["X-Event-Type"] = "order.teleported"
    reply = await client.post("/orders", content=content, headers=sent)
    assert reply.status_code == status
    assert reply.headers["content-type"] == "application/json"
    error = reply.json()
    assert error["error"] == code
    assert error["detail"]
    assert not await claimed(pg_pool, pg_schema, key)


async def test_an_oversized_body_is_413_with_or_without_a_length(
    client: httpx.AsyncClient,
) -> None:
    big = body(order_id()) + b" " * 1000
    reply = await client.post("/orders", content=big, headers=headers())
    assert (reply.status_code, reply.json()["error"]) == (413, "oversized")

    async def chunks() -> AsyncIterator[bytes]:  # chunked: no Content-Length to go by
        for _ in range(20):
            yield b" " * 100

    reply = await client.post("/orders", content=chunks(), headers=headers())
    assert "content-length" not in reply.request.headers
    assert (reply.status_code, reply.json()["error"]) == (413, "oversized")


async def test_only_post_is_allowed(client: httpx.AsyncClient) -> None:
    reply = await client.get("/orders")
    assert reply.status_code == 405
    assert reply.headers["allow"] == "POST"


async def test_a_handler_refusing_the_event_is_422_and_rolled_back(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str,
) -> None:
    order, key = order_id(), str(uuid.uuid4())
    CONTROL.refuse.add(order)
    reply = await client.post("/orders", content=body(order), headers=headers(key))
    assert (reply.status_code, reply.json()["error"]) == (422, "rejected")
    assert "amount over the limit" in reply.json()["detail"]
    assert not await claimed(pg_pool, pg_schema, key)


async def test_a_handler_that_restarts_the_transaction_applies_nothing(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str,
) -> None:
    """ROLLBACK then BEGIN in the handler drops the claim; the effect written after it must
    not commit without one (a repeated post would apply it again)."""
    order, key = order_id(), str(uuid.uuid4())
    CONTROL.restart.add(order)
    reply = await client.post("/orders", content=body(order), headers=headers(key))
    assert reply.status_code == 422, reply.text
    assert "began another" in reply.json()["detail"]
    assert await effects_of(pg_pool, pg_schema, key) == 0
    assert not await claimed(pg_pool, pg_schema, key)


@pytest.mark.parametrize(("expired", "status", "outcome", "effects"), [
    ("dead_letter", 422, "expired", 0), ("skip", 200, "expired_skipped", 0),
    ("apply", 200, "applied", 1),
])
async def test_an_event_older_than_the_dedup_window_follows_the_expired_policy(
    postgres_dsn: str, pg_schema: str, pg_pool: Pool, expired: ExpiredPolicy, status: int,
    outcome: str, effects: int,
) -> None:
    await create_effects(pg_pool, pg_schema)
    key = str(uuid.uuid4())
    old = (datetime.now(UTC) - timedelta(days=30)).isoformat()
    async with receiving(postgres_dsn, pg_schema, dedup=DedupPolicy(expired=expired)) as url, \
            httpx.AsyncClient(base_url=url) as client:
        reply = await client.post("/orders", content=body(order_id()),
                                  headers=headers(key, X_Event_Occurred_At=old))
    assert reply.status_code == status
    assert outcome in (reply.json().get("status"), reply.json().get("error"))
    assert await effects_of(pg_pool, pg_schema, key) == effects


# -- try again: 5xx ---------------------------------------------------------------------------

async def test_a_failing_handler_is_500_rolled_back_and_applied_on_the_retry(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str, caplog: pytest.LogCaptureFixture,
) -> None:
    order, key = order_id(), str(uuid.uuid4())
    CONTROL.fail[order] = 1
    sent = headers(key, Authorization="Bearer receiver-secret")
    with caplog.at_level(logging.DEBUG):
        first = await client.post("/orders", content=body(order), headers=sent)
    assert (first.status_code, first.json()["error"]) == (500, "handler_failed")
    assert f"ledger refused {order}" in first.json()["detail"]
    assert await effects_of(pg_pool, pg_schema, key) == 0  # the insert was rolled back
    assert not await claimed(pg_pool, pg_schema, key)
    assert f"ledger refused {order}" in caplog.text
    assert "receiver-secret" not in caplog.text

    second = await client.post("/orders", content=body(order), headers=sent)
    assert (second.status_code, second.json()["status"]) == (200, "applied")
    assert await effects_of(pg_pool, pg_schema, key) == 1


async def test_a_retry_signal_is_503_with_its_delay(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str,
) -> None:
    order, key = order_id(), str(uuid.uuid4())
    CONTROL.retry.add(order)
    reply = await client.post("/orders", content=body(order), headers=headers(key))
    assert (reply.status_code, reply.json()["error"]) == (503, "retry")
    assert reply.headers["retry-after"] == "2"
    assert not await claimed(pg_pool, pg_schema, key)


async def test_a_key_held_past_the_claim_lock_timeout_is_503_then_a_duplicate(
    postgres_dsn: str, pg_schema: str, pg_pool: Pool,
) -> None:
    await create_effects(pg_pool, pg_schema)
    order, key = order_id(), str(uuid.uuid4())
    started, release = CONTROL.hold(order)
    policy = DedupPolicy(claim_lock_timeout=timedelta(milliseconds=200))
    async with receiving(postgres_dsn, pg_schema, dedup=policy, retry_after=7) as url, \
            httpx.AsyncClient(base_url=url, timeout=20) as client:
        first = asyncio.create_task(
            client.post("/orders", content=body(order), headers=headers(key)))
        await asyncio.wait_for(started.wait(), timeout=10)
        second = await client.post("/orders", content=body(order), headers=headers(key))
        assert (second.status_code, second.json()["error"]) == (503, "in_progress")
        assert second.headers["retry-after"] == "7"
        release.set()
        assert (await first).json()["status"] == "applied"
        third = await client.post("/orders", content=body(order), headers=headers(key))
    assert third.json()["status"] == "duplicate"
    assert await effects_of(pg_pool, pg_schema, key) == 1


async def test_a_handler_past_its_timeout_is_500_and_rolled_back(
    postgres_dsn: str, pg_schema: str, pg_pool: Pool,
) -> None:
    await create_effects(pg_pool, pg_schema)
    order, key = order_id(), str(uuid.uuid4())
    _started, release = CONTROL.hold(order)
    async with receiving(postgres_dsn, pg_schema, timeouts=Timeouts(handler=0.2)) as url, \
            httpx.AsyncClient(base_url=url, timeout=20) as client:
        reply = await client.post("/orders", content=body(order), headers=headers(key))
    release.set()
    assert (reply.status_code, reply.json()["error"]) == (500, "handler_failed")
    assert "TimeoutError" in reply.json()["detail"]
    assert await effects_of(pg_pool, pg_schema, key) == 0


async def test_a_receiver_not_opened_answers_503(postgres_dsn: str, pg_schema: str) -> None:
    async with receiving(postgres_dsn, pg_schema, lifespan="off") as url, \
            httpx.AsyncClient(base_url=url) as client:
        reply = await client.post("/orders", content=body(order_id()), headers=headers())
    assert (reply.status_code, reply.json()["error"]) == (503, "not_started")
    assert reply.headers["retry-after"] == "5"


# -- lifecycle and configuration ----------------------------------------------------------------

async def test_a_given_pool_is_used_and_left_open(
    pg_pool: Pool, pg_schema: str, postgres_dsn: str,
) -> None:
    await create_effects(pg_pool, pg_schema)
    pool: Pool = await asyncpg.create_pool(postgres_dsn, min_size=1, max_size=3,
                                           server_settings={"search_path": pg_schema})
    try:
        receiver = WebhookReceiver(HANDLERS, namespace="partner", pool=pool,
                                   postgres=Postgres(schema=pg_schema), allow_unsigned=True)
        key = str(uuid.uuid4())
        async with serve(receiver) as url, httpx.AsyncClient(base_url=url) as client:
            reply = await client.post("/orders", content=body(order_id()), headers=headers(key))
        assert reply.json()["status"] == "applied"
        assert await pool.fetchval("SELECT count(*) FROM effects WHERE event_id = $1", key) == 1
        assert "a given pool" in repr(receiver)
    finally:
        await pool.close()


async def test_an_unreachable_database_fails_open_without_showing_the_password() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening
        dsn = f"postgresql://app:pw-do-not-show@127.0.0.1:{sock.getsockname()[1]}/app"
        receiver = WebhookReceiver(HANDLERS, namespace="partner", postgres=Postgres(dsn=dsn),
                                   allow_unsigned=True)
        with pytest.raises(StartupError) as info:
            await receiver.open()
    assert "pw-do-not-show" not in str(info.value)
    assert "pw-do-not-show" not in repr(receiver)


ONE_OF = r"give exactly one of postgres=Postgres\(dsn=\.\.\.\) and pool="
DSN = "postgresql://x/y"


@pytest.mark.parametrize(("options", "message"), [
    (dict, ONE_OF),
    (lambda: {"postgres": Postgres(schema="ours")}, ONE_OF),
    (lambda: {"postgres": Postgres(dsn=DSN), "pool": object()}, ONE_OF),
    (lambda: {"postgres": Postgres(dsn=DSN), "namespace": "bad name"}, "invalid namespace"),
    (lambda: {"postgres": Postgres(dsn=DSN), "max_body_bytes": 0}, "max_body_bytes"),
    (lambda: {"postgres": Postgres(dsn=DSN), "timeouts": Timeouts(handler=0)},
     r"Timeouts\.handler must be greater than 0"),
    (lambda: {"postgres": Postgres(dsn=DSN, schema="Bad-Schema")},
     r"Postgres\.schema: invalid schema name"),
    (lambda: {"postgres": Postgres(dsn=DSN, pooler="statement")},  # type: ignore[arg-type]
     r"Postgres\.pooler must be 'none', 'session' or 'transaction'"),
    (lambda: {"postgres": Postgres(dsn=DSN), "tolerance": 0}, "tolerance must be positive"),
    (lambda: {"postgres": {"dsn": DSN}}, r"postgres= takes a Postgres\(\.\.\.\), not dict"),
    (lambda: {"postgres": Postgres(dsn=DSN), "timeouts": 5.0},
     r"timeouts= takes a Timeouts\(\.\.\.\), not float"),
])
def test_bad_settings_are_refused(options: Callable[[], dict[str, object]],
                                  message: str) -> None:
    def build() -> WebhookReceiver:  # the groups themselves may refuse a value: inside raises
        given = {"namespace": "partner", "allow_unsigned": True, **options()}
        return WebhookReceiver(HANDLERS, **given)  # type: ignore[arg-type]

    with pytest.raises(ConfigurationError, match=message) as refused:
        build()
    assert "\n" not in str(refused.value)


def test_the_groups_give_the_database_and_the_handler_timeout() -> None:
    receiver = WebhookReceiver(HANDLERS, namespace="partner", allow_unsigned=True,
                               postgres=Postgres(dsn=DSN, schema="ours", pooler="transaction"))
    assert (receiver.schema, receiver.pooler, receiver.timeouts.handler) == (
        "ours", "transaction", 30.0)  # a sender waits for the answer: half a consumer's



async def test_a_missing_dedup_partition_is_503_and_maintenance_recreates_it_at_once(
    postgres_dsn: str, pg_schema: str, pg_pool: Pool,
) -> None:
    """Someone dropped the dedup partitions: the claim fails for want of one, the request is
    answered 503 (send it again), and maintenance runs at once instead of within the hour."""
    await create_effects(pg_pool, pg_schema)
    partitions_sql = (
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "JOIN pg_class p ON p.oid = i.inhparent JOIN pg_namespace n ON n.oid = p.relnamespace "
        "WHERE n.nspname = $1 AND p.relname = 'processed_events'")

    async def recreated() -> bool:
        return bool(await pg_pool.fetch(partitions_sql, pg_schema))

    key = str(uuid.uuid4())
    async with receiving(postgres_dsn, pg_schema,
                         maintenance_interval=timedelta(hours=1)) as url, \
            httpx.AsyncClient(base_url=url, timeout=20) as client:
        for part in await pg_pool.fetch(partitions_sql, pg_schema):
            await pg_pool.execute(f'DROP TABLE "{pg_schema}"."{part["relname"]}"')
        refused = await client.post("/orders", content=body(order_id()), headers=headers(key))
        assert (refused.status_code, refused.json()["error"]) == (503, "unavailable")
        await wait_until(recreated, "maintenance to recreate the partitions")
        retried = await client.post("/orders", content=body(order_id()), headers=headers(key))
    assert retried.json()["status"] == "applied"
    assert await effects_of(pg_pool, pg_schema, key) == 1
