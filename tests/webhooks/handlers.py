"""Handlers for the receiver tests, steered per order id: each test uses fresh order ids and
tells :data:`CONTROL` how the handler should behave for them."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
from pydantic import BaseModel

from consumerkit import (
    DeadLetter,
    Envelope,
    HandlerContext,
    Postgres,
    Retry,
    WebhookReceiver,
    handler,
)

from .conftest import Lifespan, serve


class OrderPaid(BaseModel):
    order_id: str
    amount: int


@dataclass
class Control:
    fail: dict[str, int] = field(default_factory=dict)  # order id -> failures left
    gates: dict[str, asyncio.Event] = field(default_factory=dict)  # wait after the insert
    started: dict[str, asyncio.Event] = field(default_factory=dict)
    retry: set[str] = field(default_factory=set)
    refuse: set[str] = field(default_factory=set)
    restart: set[str] = field(default_factory=set)  # ROLLBACK, BEGIN, insert again
    seen: dict[str, tuple[Envelope, int]] = field(default_factory=dict)

    def hold(self, order_id: str) -> tuple[asyncio.Event, asyncio.Event]:
        """(started, release): the handler of ``order_id`` sets ``started`` once its insert
        ran, then waits for ``release``."""
        started = self.started.setdefault(order_id, asyncio.Event())
        release = self.gates.setdefault(order_id, asyncio.Event())
        return started, release


CONTROL = Control()


@handler("order.paid")
async def record_payment(event: OrderPaid, ctx: HandlerContext) -> None:
    CONTROL.seen[event.order_id] = (ctx.envelope, ctx.attempt)
    if event.order_id in CONTROL.retry:
        raise Retry(delay=2, reason="ledger busy")
    if event.order_id in CONTROL.refuse:
        raise DeadLetter("amount over the limit")
    await ctx.tx.execute("INSERT INTO effects (event_id, order_id, amount) VALUES ($1, $2, $3)",
                         ctx.envelope.event_id, event.order_id, event.amount)
    if event.order_id in CONTROL.restart:
        await ctx.tx.execute("ROLLBACK")
        await ctx.tx.execute("BEGIN")
        await ctx.tx.execute(
            "INSERT INTO effects (event_id, order_id, amount) VALUES ($1, $2, $3)",
            ctx.envelope.event_id, event.order_id, event.amount)
    if CONTROL.fail.get(event.order_id, 0) > 0:
        CONTROL.fail[event.order_id] -= 1
        raise RuntimeError(f"ledger refused {event.order_id}")
    if event.order_id in CONTROL.gates:
        CONTROL.started[event.order_id].set()
        await CONTROL.gates[event.order_id].wait()


@handler(topic="webhook:/legacy")
async def legacy_payment(event: OrderPaid, ctx: HandlerContext) -> None:
    CONTROL.seen[event.order_id] = (ctx.envelope, ctx.attempt)
    await ctx.tx.execute("INSERT INTO effects (event_id, order_id, amount) VALUES ($1, $2, $3)",
                         ctx.envelope.event_id, event.order_id, event.amount)


HANDLERS = [record_payment, legacy_payment]


def order_id() -> str:
    return f"o-{uuid.uuid4().hex[:12]}"


def with_search_path(dsn: str, schema: str) -> str:
    """``dsn`` with ``search_path`` as a server setting (asyncpg passes unknown parameters)."""
    parts = urlsplit(dsn)
    query = [*parse_qsl(parts.query), ("search_path", schema)]
    return urlunsplit(parts._replace(query=urlencode(query)))


async def create_effects(pool: asyncpg.Pool[asyncpg.Record], schema: str) -> None:
    await pool.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    await pool.execute(f'CREATE TABLE "{schema}".effects '
                       "(seq bigserial PRIMARY KEY, event_id text NOT NULL, "
                       "order_id text NOT NULL, amount int NOT NULL)")


async def effects_of(pool: asyncpg.Pool[asyncpg.Record], schema: str, event_id: str) -> int:
    count: int = await pool.fetchval(
        f'SELECT count(*) FROM "{schema}".effects WHERE event_id = $1', event_id)
    return count


@contextlib.asynccontextmanager
async def receiving(dsn: str, schema: str, namespace: str = "partner", *, lifespan: Lifespan = "on",
                    **options: object) -> AsyncIterator[str]:
    """A :class:`WebhookReceiver` over :data:`HANDLERS` served by uvicorn; yields its URL.
    Without ``secrets`` it accepts unsigned requests (``allow_unsigned``): these tests check
    the HTTP contract behind it; tests/webhooks/test_signatures.py checks the signatures."""
    if "secrets" not in options:
        options["allow_unsigned"] = True
    receiver = WebhookReceiver(
        HANDLERS, namespace=namespace,
        postgres=Postgres(dsn=with_search_path(dsn, schema), schema=schema),
        **options)  # type: ignore[arg-type]
    async with serve(receiver, lifespan=lifespan) as url:
        yield url
