"""Webhooks: a relay posting outbox events to a partner's endpoint, and the endpoint that applies
each of them once.

Both sides share a secret in the Standard Webhooks form (``whsec_`` + base64): the sink signs
every request with it and the receiver refuses (401) what it cannot verify. The receiving side
runs under any ASGI server, for example (the ``payments`` table must exist, see
docs/webhooks.md)::

    export CONSUMERKIT_POSTGRES_DSN=postgresql://payments@db/payments
    export PAYMENTS_WEBHOOK_SECRETS="whsec_..."   # during a rotation: "whsec_new whsec_old"
    uvicorn --factory examples.webhooks:create_app
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeAlias

from pydantic import BaseModel

from consumerkit import (
    HandlerContext,
    Postgres,
    Timeouts,
    WebhookReceiver,
    WebhookSink,
    handler,
)
from consumerkit.outbox import OutboxEvent, Relay

Lifespan: TypeAlias = Callable[[object], contextlib.AbstractAsyncContextManager[None]]

# -- receiving ---------------------------------------------------------------------------------


class PaymentCaptured(BaseModel):
    payment_id: str
    order_id: str
    amount_cents: int


@handler("payment.captured")
async def record_payment(event: PaymentCaptured, ctx: HandlerContext) -> None:
    await ctx.tx.execute(
        "INSERT INTO payments (payment_id, order_id, amount_cents) VALUES ($1, $2, $3)",
        event.payment_id, event.order_id, event.amount_cents)


def build_receiver(postgres_dsn: str, secrets: Sequence[str],
                   schema: str = "consumerkit") -> WebhookReceiver:
    return WebhookReceiver(
        [record_payment], namespace="payments-webhook", secrets=secrets,
        postgres=Postgres(dsn=postgres_dsn, schema=schema), timeouts=Timeouts(handler=10.0),
        max_body_bytes=64 * 1024)


def create_app() -> WebhookReceiver:
    return build_receiver(os.environ["CONSUMERKIT_POSTGRES_DSN"],
                          os.environ["PAYMENTS_WEBHOOK_SECRETS"].split())


def lifespan_for(receiver: WebhookReceiver) -> Lifespan:
    @contextlib.asynccontextmanager
    async def lifespan(app: object) -> AsyncIterator[None]:
        async with receiver:  # open: connect, migrate; close: stop maintenance, close the pool
            yield

    return lifespan


# -- sending -----------------------------------------------------------------------------------


def build_sink(secrets: Sequence[str]) -> WebhookSink:
    return WebhookSink(
        "https://partner.example.com/hooks/payments", secrets=secrets,
        timeout=10.0, concurrency=16)


def build_relay(postgres_dsn: str, secrets: Sequence[str]) -> Relay:
    return Relay(Postgres(dsn=postgres_dsn), build_sink(secrets))


PARTNER_URLS = {
    "payment.captured": "https://partner.example.com/hooks/payments",
    "refund.issued": "https://partner.example.com/hooks/refunds",
}


def partner_url(event: OutboxEvent) -> str:
    return PARTNER_URLS[event.event_type]


def build_routed_sink(secrets: Sequence[str], token: str) -> WebhookSink:
    # a partner that also wants its own bearer token: headers= are never shown either
    return WebhookSink(partner_url, secrets=secrets,
                       headers={"Authorization": f"Bearer {token}"})
