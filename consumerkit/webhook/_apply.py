"""The correctness path of one webhook delivery, top to bottom.

[ BEGIN (READ COMMITTED); claim the Idempotency-Key (dedup row, first statement); handler;
  COMMIT ] -> the claim's status, or an exception saying why not -> the outcome reported.

There are no retries here: the sender retries, and a retry finds either no row (the earlier
attempt rolled back: apply now) or a committed row (answer "duplicate").
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg

from .._decode import Decoded
from .._failures import ClaimBlocked, HandlerEndedTransaction, HandlerFailure, describe
from .._xact import mark, verify
from ..context import HandlerContext
from ..dedup.policy import ExpiredPolicy
from ..envelope import RecordLike
from ..observability.observer import Observer
from ..types import Claim, ClaimRequest, ClaimStatus, DbConnection, DedupStore

log = logging.getLogger("consumerkit.webhook")


async def apply(
    pool: asyncpg.Pool, store: DedupStore, namespace: str, decoded: Decoded, attempt: int, *,
    enforce_window: bool, handler_timeout: float | None, acquire_timeout: float,
) -> Claim:
    """Claim the event and, if it is new, run its handler, all in one transaction.

    Raises :class:`ClaimBlocked` (no partition for now, or the key is held by another
    transaction past the claim lock timeout), :class:`HandlerFailure` (the handler raised, or
    the commit failed after it ran), or the error of acquiring a connection or of the claim.
    """
    conn = await pool.acquire(timeout=acquire_timeout)
    try:
        return await _transaction(
            conn, store, namespace, decoded, attempt, enforce_window, handler_timeout)
    finally:
        try:
            await pool.release(conn)
        except Exception as exc:  # the outcome above stands; asyncpg discarded the connection
            log.warning("discarded a connection that could not be reset: %s", describe(exc))


async def _transaction(
    conn: DbConnection, store: DedupStore, namespace: str, decoded: Decoded, attempt: int,
    enforce_window: bool, handler_timeout: float | None,
) -> Claim:
    request = ClaimRequest(decoded.envelope, decoded.route.name)
    handled = committed = False
    try:
        # pinned: the claim's lock-then-look-up needs a fresh snapshot per statement
        async with conn.transaction(isolation="read_committed"):
            try:
                [claim] = await store.claim_many(
                    conn, namespace, [request], enforce_window=enforce_window)
            except (asyncpg.CheckViolationError, asyncpg.LockNotAvailableError) as exc:
                raise ClaimBlocked(exc) from exc
            if claim.status is ClaimStatus.CLAIMED:
                token = await mark(conn)
                handled = True
                await _handle(conn, decoded, attempt, handler_timeout, token)
        committed = True
        return claim
    except HandlerFailure:
        raise
    except Exception as exc:
        if handled:  # COMMIT failed after the handler ran (a deferred constraint, say)
            raise HandlerFailure(exc) from exc
        raise
    finally:
        if handled:
            await store.ended(conn, namespace, [request], committed)


async def _handle(
    conn: DbConnection, decoded: Decoded, attempt: int, handler_timeout: float | None,
    token: str,
) -> None:
    ctx = HandlerContext(conn, decoded.envelope, attempt, handler_log(decoded, attempt))
    try:
        async with asyncio.timeout(handler_timeout):
            await decoded.route.func(decoded.event, ctx)
        if not conn.is_in_transaction():
            raise HandlerEndedTransaction("the handler ended the transaction itself")
        # a handler that swallowed a database error leaves the transaction aborted; COMMIT
        # would then roll back silently and the sender would be told "applied". One that
        # rolled it back and began another has lost the claim; one that committed it and
        # began another committed the claim early, and the rest commits now.
        await verify(conn, token, what=f"event {decoded.envelope.event_id}",
                     log=handler_log(decoded, attempt), rolled_back=HandlerEndedTransaction(
                         "the handler rolled the transaction back and began another"))
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # the server is cancelling the request: not the handler's doing
        raise HandlerFailure(exc) from exc
    except Exception as exc:
        raise HandlerFailure(exc) from exc


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


def handler_log(decoded: Decoded, attempt: int | None = None,
                ) -> logging.LoggerAdapter[logging.Logger]:
    """The handler's ``ctx.log``: the same logger and fields as for a Kafka delivery."""
    env = decoded.envelope
    return logging.LoggerAdapter(logging.getLogger("consumerkit.handler"), {
        "event_id": env.event_id, "event_type": env.event_type, "key": env.key,
        "topic": env.topic, "partition": env.partition, "offset": env.offset,
        "handler": decoded.route.name, "attempt": attempt,
    })
