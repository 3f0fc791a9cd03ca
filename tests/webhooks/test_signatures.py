"""Signed webhooks (Standard Webhooks) under uvicorn on real PostgreSQL: what is refused with
401 leaves no row anywhere, rotation works, a valid request applies once, both directions of
interoperability with the reference implementation (``standardwebhooks``), and secrets never
show in logs, reprs or errors."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TypeAlias

import asyncpg
import httpx
import orjson
import pytest
from standardwebhooks.webhooks import Webhook

from consumerkit import ConfigurationError, Postgres, WebhookReceiver, WebhookSink
from consumerkit.outbox.event import OutboxEvent
from consumerkit.shared.webhook.signature import (
    WebhookSecret,
    generate_secret,
    sign_headers,
    verify,
)

from .conftest import ScriptedEndpoint
from .handlers import CONTROL, HANDLERS, create_effects, effects_of, order_id, receiving

Pool: TypeAlias = "asyncpg.Pool[asyncpg.Record]"
SECRET, OLD_SECRET, STRANGER = generate_secret(), generate_secret(), generate_secret()

# The specification's test vector (libraries/python/tests/test_webhooks.py, test_sign_function)
VECTOR_KEY = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
VECTOR_TS = 1614265330
VECTOR_BODY = b'{"test": 2432232314}'
VECTOR_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def body(order: str) -> bytes:
    return orjson.dumps({"order_id": order, "amount": 5})


def signed(content: bytes, *secrets: str, key: str | None = None,
           at: int | None = None) -> dict[str, str]:
    found = sign_headers([WebhookSecret(s) for s in secrets], key or str(uuid.uuid4()),
                         content, at)
    return found | {"X-Event-Type": "order.paid"}


async def rows_anywhere(pool: Pool, schema: str, key: str) -> tuple[int, int, int]:
    """(dedup rows, dead letters, effects) of event ``key``."""
    dedup = await pool.fetchval(
        f'SELECT count(*) FROM "{schema}".processed_events_ids WHERE event_id = $1', key)
    letters = await pool.fetchval(f'SELECT count(*) FROM "{schema}".dead_letters')
    return dedup, letters, await effects_of(pool, schema, key)


@pytest.fixture
async def client(postgres_dsn: str, pg_schema: str, pg_pool: Pool
                 ) -> AsyncIterator[httpx.AsyncClient]:
    """A client of a receiver accepting SECRET and OLD_SECRET (a rotation in progress)."""
    await create_effects(pg_pool, pg_schema)
    async with receiving(postgres_dsn, pg_schema, secrets=[SECRET, OLD_SECRET]) as url, \
            httpx.AsyncClient(base_url=url, timeout=20) as c:
        yield c


# -- the scheme ------------------------------------------------------------------------------

def test_the_specification_test_vector() -> None:
    secret = WebhookSecret(VECTOR_KEY)
    assert secret.sign(VECTOR_ID, VECTOR_TS, VECTOR_BODY) == VECTOR_SIGNATURE
    headers = {"webhook-id": VECTOR_ID.encode(), "webhook-timestamp": str(VECTOR_TS).encode(),
               "webhook-signature": b"v1a,bm90IGEgc3ltbWV0cmljIG9uZQ== " +
               VECTOR_SIGNATURE.encode()}
    assert verify([secret], headers, VECTOR_BODY, now=VECTOR_TS + 10) is None
    assert verify([secret], headers, VECTOR_BODY + b" ", now=VECTOR_TS) is not None


@pytest.mark.parametrize("text", ["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_%%%notbase64",
                                  "whsec_c2hvcnQ=", "", "whsec_"])
def test_a_malformed_secret_is_refused_without_showing_it(text: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        WebhookSecret(text)
    message = str(info.value)
    assert "\n" not in message
    if len(text) > 10:
        assert text.removeprefix("whsec_") not in message


async def test_a_receiver_without_secrets_refuses_to_start_unless_told_so(
    postgres_dsn: str, pg_schema: str, caplog: pytest.LogCaptureFixture,
) -> None:
    with pytest.raises(ConfigurationError) as info:
        WebhookReceiver(HANDLERS, namespace="partner", postgres=Postgres(dsn=postgres_dsn))
    assert "allow_unsigned=True" in str(info.value)
    assert "\n" not in str(info.value)
    unsigned = WebhookReceiver(HANDLERS, namespace="partner", allow_unsigned=True,
                               postgres=Postgres(dsn=postgres_dsn, schema=pg_schema))
    with caplog.at_level(logging.WARNING, "consumerkit.webhook"):
        async with unsigned:  # the unsafe choice is visible in the log
            pass
    assert "accepts unsigned requests" in caplog.text


# -- refused: 401, nothing stored ---------------------------------------------------------------

@pytest.mark.parametrize(("case", "code"), [
    ("unsigned", "missing_signature"),
    ("no timestamp", "missing_signature"),
    ("forged body", "invalid_signature"),
    ("forged unparseable body", "invalid_signature"),  # verified before it is parsed
    ("forged id", "invalid_signature"),
    ("garbage signature", "invalid_signature"),
    ("stale", "stale_timestamp"),
    ("future-dated", "future_timestamp"),
    ("bad timestamp", "malformed_timestamp"),
    ("wrong secret", "invalid_signature"),
])
async def test_a_request_that_does_not_verify_is_401_and_leaves_no_row(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str, case: str, code: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    key, content = str(uuid.uuid4()), body(order_id())
    sent = signed(content, SECRET, key=key)
    if case == "unsigned":
        sent = {"Idempotency-Key": key, "X-Event-Type": "order.paid"}
    elif case == "no timestamp":
        del sent["webhook-timestamp"]
    elif case == "forged body":
        content = body(order_id())  # signature of another body
    elif case == "forged unparseable body":
        content = b'{"order_id": '
    elif case == "forged id":
        key = sent["webhook-id"] = str(uuid.uuid4())
    elif case == "garbage signature":
        sent["webhook-signature"] = "v1,!!! v2,abc v1"
    elif case == "stale":
        sent = signed(content, SECRET, key=key, at=int(time.time()) - 301)
    elif case == "future-dated":
        sent = signed(content, SECRET, key=key, at=int(time.time()) + 301)
    elif case == "bad timestamp":
        sent["webhook-timestamp"] = "yesterday"
    else:
        sent = signed(content, STRANGER, key=key)
    with caplog.at_level(logging.DEBUG):
        reply = await client.post("/orders", content=content, headers=sent)
    assert reply.status_code == 401, reply.text
    assert reply.json()["error"] == code
    assert reply.json()["detail"]
    assert await rows_anywhere(pg_pool, pg_schema, key) == (0, 0, 0)
    assert code in caplog.text
    for secret in (SECRET, OLD_SECRET, STRANGER):
        assert secret[6:] not in caplog.text
        assert secret[6:] not in reply.text


async def test_a_timestamp_just_inside_the_tolerance_is_accepted(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str,
) -> None:
    for at in (int(time.time()) - 240, int(time.time()) + 240):
        key, content = str(uuid.uuid4()), body(order_id())
        reply = await client.post("/orders", content=content,
                                  headers=signed(content, SECRET, key=key, at=at))
        assert reply.json()["status"] == "applied", reply.text


# -- accepted ------------------------------------------------------------------------------------

async def test_a_valid_request_applies_once_and_its_replay_is_a_duplicate(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str,
) -> None:
    key, content = str(uuid.uuid4()), body(order_id())
    sent = signed(content, SECRET, key=key)
    first = await client.post("/orders", content=content, headers=sent)
    assert first.json() == {"status": "applied", "event_id": key}
    replay = await client.post("/orders", content=content, headers=sent)
    assert replay.json()["status"] == "duplicate"
    # the signed webhook-id is the key: an unsigned Idempotency-Key cannot smuggle the replay in
    renamed = await client.post("/orders", content=content,
                                headers=sent | {"Idempotency-Key": str(uuid.uuid4())})
    assert renamed.json() == replay.json() | {"event_id": key}
    assert await rows_anywhere(pg_pool, pg_schema, key) == (1, 0, 1)


@pytest.mark.parametrize("first_type", ["order.refunded", None])
async def test_a_refused_request_replayed_with_another_event_type_runs_no_handler(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str, first_type: str | None,
) -> None:
    """X-Event-Type is not signed (the specification signs id, timestamp and body only): a
    signed request refused without a claim could be sent again, within the tolerance, with
    another type. The refusal spends the id, so the replay is a duplicate."""
    key, content = str(uuid.uuid4()), body(order_id())
    sent = signed(content, SECRET, key=key)
    first_headers = {k: v for k, v in sent.items() if k != "X-Event-Type"}
    if first_type is not None:
        first_headers["X-Event-Type"] = first_type
    first = await client.post("/orders", content=content, headers=first_headers)
    assert first.status_code in (400, 404), first.text
    replay = await client.post("/orders", content=content,
                               headers=first_headers | {"X-Event-Type": "order.paid"})
    assert replay.json()["status"] == "duplicate"
    assert await rows_anywhere(pg_pool, pg_schema, key) == (1, 0, 0)  # no effect, ever
    handler = await pg_pool.fetchval(
        f'SELECT handler FROM "{pg_schema}".processed_events_ids WHERE event_id = $1', key)
    assert handler == f"(refused:{first.json()['error']})"  # what an operator looks for


async def test_a_request_its_handler_rejected_is_not_replayed_to_another_handler(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str,
) -> None:
    order = order_id()
    key, content = str(uuid.uuid4()), body(order)
    sent = signed(content, SECRET, key=key)
    CONTROL.refuse.add(order)
    try:
        first = await client.post("/orders", content=content, headers=sent)
    finally:
        CONTROL.refuse.discard(order)
    assert (first.status_code, first.json()["error"]) == (422, "rejected")
    # /legacy routes by path, without X-Event-Type, to another handler of the same model
    bare = {k: v for k, v in sent.items() if k != "X-Event-Type"}
    replay = await client.post("/legacy", content=content, headers=bare)
    assert replay.json()["status"] == "duplicate"
    assert await rows_anywhere(pg_pool, pg_schema, key) == (1, 0, 0)


async def test_a_refusal_before_the_signature_is_checked_spends_no_id(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str,
) -> None:
    """Only a verified request spends its id: a forged one must not block the real event."""
    key, content = str(uuid.uuid4()), body(order_id())
    forged = signed(content, STRANGER, key=key) | {"X-Event-Type": "order.refunded"}
    assert (await client.post("/orders", content=content, headers=forged)).status_code == 401
    real = await client.post("/orders", content=content, headers=signed(content, SECRET, key=key))
    assert real.json() == {"status": "applied", "event_id": key}


async def test_a_rotation_accepts_the_old_and_the_new_secret(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str,
) -> None:
    for secrets in ([SECRET], [OLD_SECRET], [STRANGER, OLD_SECRET], [SECRET, STRANGER]):
        key, content = str(uuid.uuid4()), body(order_id())
        reply = await client.post("/orders", content=content,
                                  headers=signed(content, *secrets, key=key))
        assert reply.json()["status"] == "applied", reply.text
        assert await effects_of(pg_pool, pg_schema, key) == 1


async def test_a_sink_signing_with_two_secrets_reaches_a_receiver_that_knows_either(
    postgres_dsn: str, pg_schema: str, pg_pool: Pool,
) -> None:
    await create_effects(pg_pool, pg_schema)
    for known in (SECRET, OLD_SECRET):
        outbox_event = event_for(order_id())
        async with receiving(postgres_dsn, pg_schema, secrets=known) as url:
            sink = WebhookSink(f"{url}/orders", secrets=[SECRET, OLD_SECRET])
            await sink.open()
            try:
                assert await sink.send([outbox_event]) == [None]
            finally:
                await sink.close()
        assert await effects_of(pg_pool, pg_schema, str(outbox_event.event_id)) == 1


# -- interoperability with the reference implementation -----------------------------------------

async def test_a_request_signed_by_standardwebhooks_verifies_in_the_receiver(
    client: httpx.AsyncClient, pg_pool: Pool, pg_schema: str,
) -> None:
    key, content = f"msg_{uuid.uuid4().hex}", body(order_id())
    now = datetime.now(UTC)
    signature = Webhook(OLD_SECRET).sign(msg_id=key, timestamp=now, data=content.decode())
    reply = await client.post("/orders", content=content, headers={
        "webhook-id": key, "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature, "X-Event-Type": "order.paid"})
    assert reply.json() == {"status": "applied", "event_id": key}
    assert await rows_anywhere(pg_pool, pg_schema, key) == (1, 0, 1)


async def test_the_sink_s_requests_verify_with_standardwebhooks(
    endpoint: tuple[ScriptedEndpoint, str],
) -> None:
    app, url = endpoint
    outbox_event = event_for(order_id())
    sink = WebhookSink(f"{url}/in", secrets=[SECRET, OLD_SECRET])
    await sink.open()
    try:
        assert await sink.send([outbox_event]) == [None]
    finally:
        await sink.close()
    [request] = app.requests
    assert request.headers["webhook-id"] == str(outbox_event.event_id)
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    for secret in (SECRET, OLD_SECRET):  # each secret alone verifies it
        payload = Webhook(secret).verify(request.body, request.headers)
        assert payload == orjson.loads(outbox_event.payload)
    with pytest.raises(Exception, match="No matching signature"):
        Webhook(STRANGER).verify(request.body, request.headers)


# -- secrets stay secret --------------------------------------------------------------------------

async def test_no_secret_in_any_log_line_repr_or_error(
    postgres_dsn: str, pg_schema: str, pg_pool: Pool, endpoint: tuple[ScriptedEndpoint, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    await create_effects(pg_pool, pg_schema)
    secrets = [SECRET, OLD_SECRET]
    shown: list[str] = []
    with caplog.at_level(logging.DEBUG):
        receiver = WebhookReceiver(HANDLERS, namespace="partner",
                                   postgres=Postgres(dsn=postgres_dsn), secrets=secrets)
        sink = WebhookSink("http://127.0.0.1:9/x", secrets=secrets, timeout=2)
        shown += [repr(receiver), str(receiver), repr(sink), str(sink),
                  repr(WebhookSecret(SECRET)), str(WebhookSecret(SECRET))]
        with pytest.raises(TypeError) as pickled:
            WebhookSecret(SECRET).__reduce__()
        shown.append(str(pickled.value))
        await sink.open()
        try:  # a refused connection: the error message and the log
            [error] = await sink.send([event_for(order_id())])
        finally:
            await sink.close()
        shown.append(repr(error) + str(error))
        async with receiving(postgres_dsn, pg_schema, secrets=secrets) as url, \
                httpx.AsyncClient(base_url=url) as c:
            content = body(order_id())
            for sent in (signed(content, SECRET), signed(content, STRANGER),
                         signed(content + b"x", SECRET)):
                shown.append((await c.post("/orders", content=content, headers=sent)).text)
    shown.append(caplog.text)
    assert "missing_signature" not in caplog.text  # (every request above was signed)
    assert "invalid_signature" in caplog.text
    text = "\n".join(shown)
    for secret in secrets:
        assert secret not in text
        assert secret[6:] not in text
        assert secret[6:20] not in text


def event_for(order: str) -> OutboxEvent:
    return OutboxEvent(seq=1, event_id=uuid.uuid4(), event_type="order.paid",
                       aggregate_type="order", aggregate_id=order,
                       payload=body(order), occurred_at=datetime.now(UTC))
