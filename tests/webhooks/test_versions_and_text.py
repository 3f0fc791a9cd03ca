"""The event version read as the sink writes it (``X-Event-Event-Version``), through the real
sink and the real receiver on real PostgreSQL; and what a hostile request cannot put in an
answer's body: a database error's row values, a 10 KB event type, a forged line."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, TypeAlias

import asyncpg
import httpx
import orjson
import pytest
from pydantic import BaseModel

from consumerkit import (
    HandlerContext,
    HandlerRegistry,
    Postgres,
    PostgresDedupStore,
    WebhookError,
    WebhookReceiver,
    WebhookSink,
)
from consumerkit.outbox.event import OutboxEvent
from consumerkit.outbox.sink import PermanentSendError
from consumerkit.webhook import generate_secret

from .conftest import Reply, ScriptedEndpoint, serve
from .handlers import receiving, with_search_path

Pool: TypeAlias = "asyncpg.Pool[asyncpg.Record]"
SECRET = generate_secret()
FORGED = "x\n2026-11-29 00:00:00,000 CRITICAL consumerkit.fake: INJECTED"


class ItemV2(BaseModel):
    """Version 2 of ``item.added``: version 1 called the quantity ``count``."""

    item: str
    quantity: int


def registry() -> HandlerRegistry:
    handlers = HandlerRegistry()

    @handlers.upcaster("item.added", from_version=1)
    def rename_count(doc: dict[str, Any]) -> dict[str, Any]:
        return {"item": doc["item"], "quantity": doc.pop("count")}

    @handlers.handler("item.added", version=2)
    async def add_item(event: ItemV2, ctx: HandlerContext) -> None:
        # items.quantity has a CHECK (>= 0): a negative one fails with the row in DETAIL
        await ctx.tx.execute("INSERT INTO items (event_id, item, quantity) VALUES ($1, $2, $3)",
                             ctx.envelope.event_id, event.item, event.quantity)

    return handlers


@pytest.fixture
async def receiver_url(postgres_dsn: str, pg_schema: str, pg_pool: Pool) -> AsyncIterator[str]:
    await pg_pool.execute(f'CREATE SCHEMA IF NOT EXISTS "{pg_schema}"')
    await pg_pool.execute(f'CREATE TABLE "{pg_schema}".items (event_id text PRIMARY KEY, '
                          "item text NOT NULL, quantity int NOT NULL CHECK (quantity >= 0))")
    receiver = WebhookReceiver(registry(), namespace="items", secrets=SECRET, postgres=Postgres(
        dsn=with_search_path(postgres_dsn, pg_schema), schema=pg_schema))
    async with serve(receiver) as url:
        yield url


def item_event(payload: dict[str, object], version: str | None,
               event_type: str = "item.added", event_id: uuid.UUID | None = None,
               ) -> OutboxEvent:
    return OutboxEvent(
        seq=1, event_id=event_id or uuid.uuid4(), event_type=event_type,
        aggregate_type="item", aggregate_id=str(uuid.uuid4()), payload=orjson.dumps(payload),
        occurred_at=datetime.now(UTC),
        headers={} if version is None else {"event_version": version}, attempts=0)


async def deliver(url: str, event: OutboxEvent) -> BaseException | None:
    sink = WebhookSink(f"{url}/items", secrets=SECRET, timeout=20)
    await sink.open()
    try:
        [result] = await sink.send([event])
    finally:
        await sink.close()
    return result


async def claimed(pool: Pool, schema: str, event_id: uuid.UUID) -> bool:
    async with pool.acquire() as conn:
        return await PostgresDedupStore(schema).seen(conn, "items", str(event_id)) is not None


async def quantity_of(pool: Pool, schema: str, event_id: uuid.UUID) -> int | None:
    found: int | None = await pool.fetchval(
        f'SELECT quantity FROM "{schema}".items WHERE event_id = $1', str(event_id))
    return found


# -- the version, round trip -------------------------------------------------------------------

async def test_versions_1_and_2_are_applied_and_a_bad_one_refused_without_spending_the_id(
    receiver_url: str, pg_pool: Pool, pg_schema: str,
) -> None:
    v1 = item_event({"item": "pen", "count": 3}, None)
    v1_explicit = item_event({"item": "pen", "count": 4}, "1")
    v2 = item_event({"item": "ink", "quantity": 5}, "2")
    assert await deliver(receiver_url, v1) is None
    assert await deliver(receiver_url, v1_explicit) is None
    assert await deliver(receiver_url, v2) is None  # before the fix: upcast_failed, id spent
    assert await quantity_of(pg_pool, pg_schema, v1.event_id) == 3
    assert await quantity_of(pg_pool, pg_schema, v1_explicit.event_id) == 4
    assert await quantity_of(pg_pool, pg_schema, v2.event_id) == 5

    bad = item_event({"item": "cap", "quantity": 6}, "abc")
    refused = await deliver(receiver_url, bad)
    assert isinstance(refused, PermanentSendError)  # before the fix: applied as version 1
    assert "answered 400" in str(refused)
    assert "invalid_version" in str(refused)
    assert "X-Event-Event-Version" in str(refused)
    assert "'abc'" in str(refused)
    assert await quantity_of(pg_pool, pg_schema, bad.event_id) is None
    assert not await claimed(pg_pool, pg_schema, bad.event_id)
    # the sender fixes the version and sends the same id again: applied, not a duplicate
    fixed = item_event({"item": "cap", "quantity": 6}, "2", event_id=bad.event_id)
    assert await deliver(receiver_url, fixed) is None
    assert await quantity_of(pg_pool, pg_schema, bad.event_id) == 6


# -- what an answer's body shows ---------------------------------------------------------------

async def test_a_database_error_answer_shows_neither_the_row_nor_a_forged_line(
    receiver_url: str, pg_pool: Pool, pg_schema: str,
) -> None:
    """The CHECK violation's DETAIL quotes the row (``Failing row contains (...)``), the item
    name with its newline included: kept out of the 500 body."""
    event = item_event({"item": FORGED, "quantity": -1}, "2")
    async with httpx.AsyncClient(base_url=receiver_url, timeout=20) as client:
        reply = await client.post("/items", content=event.payload,
                                  headers=await signed_headers(event))
    assert reply.status_code in (422, 500), reply.text
    detail = reply.json()["detail"]
    assert "CheckViolationError" in detail
    assert "items_quantity_check" in detail
    assert "Failing row" not in detail
    assert "INJECTED" not in detail
    assert "\n" not in detail


async def test_a_10kb_event_type_is_cut_in_the_answer(
    receiver_url: str, pg_pool: Pool, pg_schema: str,
) -> None:
    huge = "t" * 10_240
    event = item_event({"item": "pen", "quantity": 1}, "2", huge)
    async with httpx.AsyncClient(base_url=receiver_url, timeout=20) as client:
        reply = await client.post("/items", content=event.payload,
                                  headers=await signed_headers(event))
    assert reply.status_code == 404
    body = reply.json()
    assert body["error"] == "unknown_event_type"
    assert len(body["detail"]) <= 1000  # before the fix: over 10,240
    assert body["detail"].startswith("no handler for event type 'ttt")
    whole = f"no handler for event type {huge!r}"
    assert body["detail"].endswith(f"… [{len(whole)} characters]")


async def test_an_empty_id_header_is_called_empty(postgres_dsn: str, pg_schema: str) -> None:
    async with receiving(postgres_dsn, pg_schema) as url, \
            httpx.AsyncClient(base_url=url, timeout=20) as client:
        reply = await client.post("/orders", content=b'{"order_id": "o", "amount": 1}',
                                  headers={"Idempotency-Key": "", "X-Event-Type": "order.paid"})
    assert reply.status_code == 400
    assert reply.json() == {"error": "missing_event_id",
                            "detail": "the 'idempotency-key' header is empty"}


async def signed_headers(event: OutboxEvent) -> dict[str, str]:
    """The headers the real sink sends for ``event``, captured by a recording endpoint."""
    seen: list[dict[str, str]] = []

    async def record(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        seen.append({bytes(n).decode(): bytes(v).decode() for n, v in scope["headers"]})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async with serve(record, lifespan="off") as url:
        assert await deliver(url, event) is None
    return {name: value for name, value in seen[0].items()
            if name not in ("host", "content-length", "accept", "accept-encoding",
                            "connection", "user-agent")}


async def test_a_receivers_answer_is_shown_escaped_in_the_senders_error(
    endpoint: tuple[ScriptedEndpoint, str],
) -> None:
    """The excerpt of an answer goes into the relay's logs and the outbox's last error."""
    app, url = endpoint
    app.replies.append(Reply(500, body=b"down\x1b]0;PWNED\x07\x1b[2J" + b"y" * 1000))
    result = await deliver(url, item_event({"item": "pen", "quantity": 1}, "2"))
    assert isinstance(result, WebhookError)
    assert "\x1b" not in str(result)
    assert "answered 500: down\\x1b]0;PWNED\\x07\\x1b[2J" in str(result)
    assert len(str(result)) < 300
