"""One webhook delivery applied through the consumer's transaction path, top to bottom.

[ BEGIN (READ COMMITTED); claim the Idempotency-Key (dedup row, first statement); handler;
  COMMIT ] (:mod:`consumerkit.engine.apply`, a batch of one) -> the claim's status, or an exception
saying why not -> the outcome reported.

There are no retries here: the sender retries, and a retry finds either no row (the earlier
attempt rolled back: apply now) or a committed row (answer "duplicate").
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from ..dedup.policy import ExpiredPolicy
from ..engine.apply import Applier
from ..engine.decode import Decoded
from ..envelope import RecordLike
from ..observability.observer import Observer
from ..shared.failures import describe
from ..types import Claim, ClaimStatus

log = logging.getLogger("consumerkit.webhook")


async def apply(pool: asyncpg.Pool, applier: Applier, decoded: Decoded, attempt: int, *,
                acquire_timeout: float) -> Claim:
    """Claim the event and, if it is new, run its handler, all in one transaction.

    Raises :class:`ClaimBlocked` (no partition for now, or the key is held by another
    transaction past the claim lock timeout), :class:`HandlerFailure` (the handler raised, or
    the commit failed after it ran), or the error of acquiring a connection or of the claim.
    """
    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[PoolConnectionProxy[asyncpg.Record]]:
        conn = await pool.acquire(timeout=acquire_timeout)
        try:
            yield conn
        finally:
            try:
                await pool.release(conn)
            except Exception as exc:  # the outcome stands; asyncpg discarded the connection
                log.warning("discarded a connection that could not be reset: %s",
                            describe(exc))

    [claim] = await applier.apply(connect, [decoded], attempt)
    return claim


def report(observer: Observer, record: RecordLike, decoded: Decoded, claim: Claim,
           expired: ExpiredPolicy) -> None:
    """Tell ``observer`` the outcome of an applied delivery (an expired event that is not
    skipped is refused, not counted)."""
    env, route = decoded.envelope, decoded.route.name
    if claim.status is ClaimStatus.CLAIMED:
        observer.applied(record, env, route)
    elif claim.status is ClaimStatus.DUPLICATE:
        observer.duplicate(record, env, route, claim.original_seen_at)
    elif expired == "skip":
        observer.expired_skipped(record, env, route)
