"""A signed request refused for good still settles its ``webhook-id``.

The signature covers ``webhook-id``, ``webhook-timestamp`` and the body, not the routing
headers (``X-Event-Type``): that is the Standard Webhooks scheme. If a signed request is
refused without a claim (404 no handler for its event type, 400 a payload its handler's model
refuses), a party that captured it could send it again within the tolerance with another
``X-Event-Type`` and have another handler apply the same body. So a refusal of a verified
request claims its ``webhook-id`` first, in a transaction of its own, with the handler
``(refused:<reason>)``: any later request with that id is a duplicate whatever its headers.

The cost is that the id is spent: a sender that fixes the cause (a handler deployed for the
type) must not expect the same id to be applied later. ``docs/security.md`` says how to find
such rows and what to do.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import asyncpg

from ..envelope import Envelope, Record
from ..shared.failures import describe
from ..shared.webhook import headers as wh
from ..types import ClaimRequest, DedupStore

log = logging.getLogger("consumerkit.webhook")

_ACQUIRE_TIMEOUT = 10.0  # seconds, as for an applied request

UNCLAIMABLE = frozenset({"missing_event_id", "invalid_event_id", "oversized"})
"""Refusals that leave nothing to claim: no usable id, or a body never read in full."""


async def claim_refused(pool: asyncpg.Pool, store: DedupStore, namespace: str, record: Record,
                        reason: str) -> bool:
    """Claim the verified request's id as refused for ``reason``; False when the claim
    failed (the caller answers "try again later" then: a refusal it could not record could
    be replayed)."""
    headers = dict(record.headers)
    event_id, event_type = headers.get(wh.IDEMPOTENCY_KEY.lower()), headers.get(
        wh.EVENT_TYPE.lower())
    if reason in UNCLAIMABLE or not event_id:
        return True
    envelope = Envelope(
        event_id=event_id.decode(), id_source="header",
        event_type=event_type.decode(errors="replace")[:200] if event_type else None,
        key=None, topic=record.topic, partition=-1, offset=-1,
        timestamp=datetime.now(UTC))
    request = ClaimRequest(envelope, f"(refused:{reason})")
    try:
        async with pool.acquire(timeout=_ACQUIRE_TIMEOUT) as conn, conn.transaction():
            await store.claim_many(conn, namespace, [request], enforce_window=False)
    except Exception as exc:
        log.warning("could not record the refusal of webhook %s: %s", envelope.event_id,
                    describe(exc))
        return False
    return True
