"""What the receiver answers, for every outcome of a request (the Responses table of
docs/webhooks.md): 2xx applied now or before, 4xx never retry this request, 5xx try again."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import asyncpg

from ..dedup.policy import ExpiredPolicy
from ..display import displayable
from ..errors import DeadLetter, Retry, is_retriable
from ..shared.failures import ClaimBlocked, HandlerFailure, describe, judge
from ..types import Claim, ClaimStatus
from ._asgi import Send, respond

log = logging.getLogger("consumerkit.webhook")

DETAIL_LIMIT = 1000
"""Characters kept of an error's detail: it may quote the request (a 10 KB event type)."""


def error(code: str, detail: str) -> dict[str, Any]:
    """An error body; the detail is escaped and cut, as it may quote what the sender sent."""
    return {"error": code, "detail": displayable(detail, DETAIL_LIMIT)}


async def refuse(send: Send, status: int, code: str, detail: str,
                 headers: Sequence[tuple[str, str]] = ()) -> None:
    await respond(send, status, error(code, detail), headers)


async def unavailable(send: Send, code: str, detail: str, retry_after: int) -> None:
    await respond(send, 503, error(code, detail), [("Retry-After", str(retry_after))])


async def settled(send: Send, key: str, claim: Claim, expired: ExpiredPolicy) -> None:
    """The transaction committed: applied, a duplicate, or an expired event."""
    if claim.status is ClaimStatus.CLAIMED:
        await respond(send, 200, {"status": "applied", "event_id": key})
    elif claim.status is ClaimStatus.DUPLICATE:
        seen = claim.original_seen_at.isoformat() if claim.original_seen_at else None
        await respond(send, 200, {"status": "duplicate", "event_id": key,
                                  "first_seen_at": seen}, [("Idempotent-Replayed", "true")])
    elif expired == "skip":  # logged by the receiver's observers
        await respond(send, 200, {"status": "expired_skipped", "event_id": key})
    else:
        await refuse(send, 422, "expired", "the event is older than the dedup retention; its "
                     "original may have been forgotten, so it is not applied")


def _for_good(cause: BaseException) -> bool:
    """Whether the handler's failure is the event's own fault: a refusal, an error marked not
    retriable, or a row the database refuses for its values (SQLSTATE classes 22 and 23, or
    asyncpg refusing a parameter), which no later delivery of the same body can change."""
    data = isinstance(cause, asyncpg.DataError) or (
        isinstance(cause, asyncpg.PostgresError) and str(cause.sqlstate)[:2] in ("22", "23"))
    return isinstance(cause, DeadLetter) or not is_retriable(cause) or data


def rejected(raised: Exception) -> bool:
    """Whether the handler refused the event for good (answered 422 ``rejected``)."""
    cause, _ = judge(raised)
    return (isinstance(raised, HandlerFailure) and not isinstance(raised, ClaimBlocked)
            and not isinstance(cause, Retry) and _for_good(cause))


async def failed(send: Send, key: str, raised: Exception, retry_after: int,
                 fields: dict[str, object] | None = None) -> None:
    """The attempt raised ``raised`` and rolled back (see ``_apply.apply``); ``fields`` are
    the message's log fields."""
    if isinstance(raised, ClaimBlocked) and isinstance(raised.cause,
                                                       asyncpg.LockNotAvailableError):
        await unavailable(send, "in_progress", "another request is applying this "
                          "Idempotency-Key", retry_after)
        return
    cause, outage = judge(raised)
    in_handler = isinstance(raised, HandlerFailure) and not isinstance(raised, ClaimBlocked)
    if isinstance(cause, Retry):
        delay = retry_after if cause.delay is None else max(0, round(cause.delay))
        await unavailable(send, "retry", cause.reason, delay)
    elif outage or (isinstance(cause, TimeoutError) and not in_handler):
        log.warning("webhook %s not applied, database unavailable: %s", key, describe(cause),
                    extra=fields)
        await unavailable(send, "unavailable", "the database is unavailable", retry_after)
    elif not in_handler:
        log.error("webhook %s not applied: %s", key, describe(cause), exc_info=cause,
                  extra=fields)
        await refuse(send, 500, "internal_error", describe(cause))
    elif _for_good(cause):
        log.warning("webhook %s refused by its handler: %s", key, describe(cause), extra=fields)
        await refuse(send, 422, "rejected", describe(cause))
    else:
        log.warning("webhook %s failed in its handler: %s", key, describe(cause), extra=fields)
        await refuse(send, 500, "handler_failed", describe(cause))
