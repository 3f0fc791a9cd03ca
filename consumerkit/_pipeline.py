"""The correctness path for one record, top to bottom.

decode -> [ BEGIN; claim the event id (dedup row, first statement); handler; COMMIT ]
       -> retries with back-off -> dead letter if exhausted or undecodable.

The offset is never touched here: the caller marks the record done only when ``process``
returns an outcome other than ``ABANDONED``, and commits offsets after that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from enum import StrEnum
from typing import TYPE_CHECKING

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from ._decode import Decoded, Decoder, header_map
from ._failures import (
    ClaimBlocked,
    ConnectionLost,
    HandlerEndedTransaction,
    HandlerFailure,
    TransactionReplaced,
    connection_lost,
    describe,
    judge,
)
from ._xact import Mark, check, mark, verify
from .context import HandlerContext
from .deadletter.entry import DeadLetterEntry
from .deadletter.writer import DeadLetterWriter, wait_or_abandon
from .dedup.policy import ExpiredPolicy
from .envelope import RecordLike
from .errors import DeadLetter, DecodeError, Retry, is_retriable
from .observability.logging import message_fields
from .observability.observer import Observer
from .retry import RetryPolicy
from .stats import ConsumerStats, StatsObserver
from .types import Claim, ClaimRequest, ClaimStatus, DbConnection, DedupCache, DedupStore

if TYPE_CHECKING:
    from .observability.tracing import Tracing
    from .outbox.writer import Outbox

log = logging.getLogger("consumerkit.pipeline")


_LOST_CONNECTIONS_PER_MESSAGE = 10


class Outcome(StrEnum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    DEAD_LETTERED = "dead_lettered"
    EXPIRED_SKIPPED = "expired_skipped"
    ABANDONED = "abandoned"  # not finished: the offset must not move past it


class BatchItemFailed(Exception):
    """A handler failed inside a batch, which rolled back as a whole."""

    def __init__(self, item: Decoded, failure: HandlerFailure) -> None:
        super().__init__(str(failure))
        self.item = item
        self.failure = failure


class Pipeline:
    def __init__(
        self, *, consumer: str, namespace: str, pool: asyncpg.Pool, dedup: DedupStore,
        decoder: Decoder, retry: RetryPolicy, dead_letters: DeadLetterWriter,
        expired: ExpiredPolicy, stats: ConsumerStats, concurrency: int,
        handler_timeout: float | None, cache: DedupCache | None = None,
        outbox: Outbox | None = None, observer: Observer | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        self.consumer = consumer
        self.namespace = namespace
        self.pool = pool
        self.dedup = dedup
        self.cache = cache
        self.outbox = outbox
        self.decoder = decoder
        self.retry = retry
        self.dead_letters = dead_letters
        self.expired = expired
        self.stats = stats
        # outcomes are counted once, here, by whoever subscribed (stats, metrics, logs, traces)
        self.observe: Observer = observer if observer is not None else _stats_only(stats)
        self.tracing = tracing
        self.maintenance_wanted = asyncio.Event()
        self.handler_timeout = handler_timeout
        # transactions at once; records waiting for a retry or an outage hold no slot
        self.slots = asyncio.Semaphore(concurrency)

    async def process(self, record: RecordLike, abandon: asyncio.Event) -> Outcome:
        """Apply ``record`` exactly once in effect; ``abandon`` interrupts waits (shutdown,
        revoked partition) and yields ``ABANDONED``."""
        self.observe.delivered(1)
        try:
            decoded = self.decoder.decode(record)
        except DecodeError as exc:
            return await self.dead_letter(record, exc.reason, exc.detail, 0, None, abandon)
        return await self.process_decoded(record, decoded, abandon)

    async def process_decoded(
        self, record: RecordLike, decoded: Decoded, abandon: asyncio.Event,
        failed: HandlerFailure | None = None,
    ) -> Outcome:
        """Apply a decoded record in a transaction of its own, retrying as the policy says;
        ``failed`` is how its handler failed in a batch (its first attempt)."""
        if failed is None and await self._known(decoded.envelope.event_id):
            return await self.settle(Claim(ClaimStatus.DUPLICATE), record, decoded, 0, abandon)
        attempt = outages = lost = 0
        while True:
            attempt += 1
            try:
                if failed is not None:  # judged below like any failed attempt
                    raised, failed = failed, None
                    raise raised
                claim = await self._attempt(decoded, attempt)
            except Exception as raised:
                error, outage = judge(raised)
                if isinstance(raised, ConnectionLost) and raised.during_handler:
                    lost += 1  # a handler that keeps killing its connection is no outage
                    outage = lost <= _LOST_CONNECTIONS_PER_MESSAGE
            else:
                return await self.settle(claim, record, decoded, attempt, abandon)
            if outage:
                attempt -= 1  # the database is away: wait for it, do not spend attempts
                outages += 1
                delay = self.retry.delay(min(outages, 8))
                log.warning("database unavailable (%s), retrying in %.2fs",
                            describe(error), delay, extra=message_fields(
                                record, decoded.envelope, handler=decoded.route.name,
                                attempt=attempt + 1, consumer=self.consumer))
            elif isinstance(error, DeadLetter) or not is_retriable(error):
                reason = ("dead_lettered_by_handler" if isinstance(error, DeadLetter)
                          else "handler_failed")
                return await self.dead_letter(
                    record, reason, describe(error), attempt, decoded, abandon)
            elif attempt >= self.retry.max_attempts:
                detail = f"gave up after {attempt} attempts: {describe(error)}"
                return await self.dead_letter(
                    record, "handler_failed", detail, attempt, decoded, abandon)
            else:
                delay = self._retry_delay(error, attempt)
                self.observe.retry(record, decoded.envelope, decoded.route.name, attempt,
                                   delay, error)
            if await wait_or_abandon(abandon, delay):
                return self._abandoned(record)

    def _retry_delay(self, error: BaseException, attempt: int) -> float:
        if isinstance(error, Retry) and error.delay is not None:
            return error.delay
        return self.retry.delay(attempt)

    async def _attempt(self, decoded: Decoded, attempt: int) -> Claim:
        async with self.slots:
            conn = await self.pool.acquire()
            try:
                return await self._transaction(conn, decoded, attempt)
            except Exception as exc:
                if connection_lost(conn):  # whoever raised, the connection died under us
                    failure = isinstance(exc, HandlerFailure)
                    cause = exc.cause if isinstance(exc, HandlerFailure) else exc
                    raise ConnectionLost(cause, during_handler=failure) from exc
                raise
            finally:
                await self._release(conn)

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[PoolConnectionProxy[asyncpg.Record]]:
        conn = await self.pool.acquire()
        try:
            yield conn
        finally:
            await self._release(conn)

    async def _release(self, conn: PoolConnectionProxy[asyncpg.Record]) -> None:
        """Give the connection back. If asyncpg cannot reset it (a query the handler left
        running, a dead socket) it has already terminated it; the attempt's own outcome,
        success or failure, is what counts, not this."""
        try:
            await self.pool.release(conn)
        except Exception as exc:
            log.warning("discarded a connection that could not be reset: %s", describe(exc))

    async def _transaction(self, conn: DbConnection, decoded: Decoded, attempt: int) -> Claim:
        env = decoded.envelope
        request = ClaimRequest(env, decoded.route.name)
        handled = committed = False
        claim: Claim | None = None
        try:
            # pinned: the claim's lock-then-look-up needs a fresh snapshot per statement
            async with conn.transaction(isolation="read_committed"):
                (claim,) = await self._claim(conn, [request])
                if claim.status is ClaimStatus.CLAIMED:
                    token = await mark(conn)
                    handled = True
                    await self._handle(conn, decoded, attempt, token=token)
            committed = True
        except HandlerFailure:
            raise
        except Exception as exc:
            if handled:  # COMMIT failed after the handler ran: a deferred constraint, or a
                raise HandlerFailure(exc) from exc  # query the handler left running
            raise
        finally:
            if claim is not None and claim.status is ClaimStatus.CLAIMED:
                await self._ended(conn, [request], committed)
        return claim

    async def apply_batch(self, items: list[Decoded]) -> list[Claim]:
        """Apply ``items`` in one transaction: one bulk claim, each claimed item's handler in
        order, one COMMIT. Raises if anything fails; nothing of the batch is applied then."""
        known = await self.known_many([d.envelope.event_id for d in items], count=False)
        todo = [d for d in items if d.envelope.event_id not in known]
        fresh: list[Claim] = []
        if todo:
            async with self._connection() as conn:  # the batcher holds the slot
                fresh = await self._batch_transaction(conn, todo)
            self.stats.batches += 1
        # counted only now: a batch that fails is applied again one by one, asking again
        self.stats.cache_hits += sum(d.envelope.event_id in known for d in items)
        claims = iter(fresh)
        return [Claim(ClaimStatus.DUPLICATE) if d.envelope.event_id in known else next(claims)
                for d in items]

    async def _batch_transaction(self, conn: DbConnection, items: list[Decoded]) -> list[Claim]:
        requests = [ClaimRequest(d.envelope, d.route.name) for d in items]
        claimed: list[ClaimRequest] = []
        committed = False
        try:
            async with conn.transaction(isolation="read_committed"):
                claims = await self._claim(conn, requests)
                token = await mark(conn) if any(
                    c.status is ClaimStatus.CLAIMED for c in claims) else ""
                # one deadline for the batch: one that overruns rolls back, and its records
                # then run one by one, each with a handler_timeout of its own
                async with asyncio.timeout(self.handler_timeout):
                    for decoded, request, claim in zip(items, requests, claims, strict=True):
                        if claim.status is ClaimStatus.CLAIMED:
                            claimed.append(request)
                            try:
                                await self._handle(conn, decoded, 1, token=token, alone=False)
                            except HandlerFailure as exc:
                                if isinstance(exc.cause, asyncpg.InFailedSQLTransactionError):
                                    raise  # an earlier handler swallowed an error: not this one
                                raise BatchItemFailed(decoded, exc) from exc
                # once for all: no handler left the transaction aborted, or rolled it back
                # and began another (the batch then rolls back and its records run one by one)
                if claimed:
                    await verify(conn, token, what=f"a batch of {len(items)} records", log=log,
                                 rolled_back=TransactionReplaced("a handler of the batch rolled "
                                                                 "its transaction back and "
                                                                 "began another"))
            committed = True
        finally:
            if claimed:
                await self._ended(conn, claimed, committed)
        return claims

    async def _claim(self, conn: DbConnection, requests: list[ClaimRequest]) -> list[Claim]:
        try:
            return await self.dedup.claim_many(
                conn, self.namespace, requests, enforce_window=self.expired != "apply")
        except asyncpg.CheckViolationError as exc:  # no partition for now()
            self.maintenance_wanted.set()
            raise ClaimBlocked(exc) from exc
        except asyncpg.LockNotAvailableError as exc:  # a stalled holder of the event
            raise ClaimBlocked(exc) from exc

    async def _ended(self, conn: DbConnection, claimed: list[ClaimRequest], committed: bool,
                     ) -> None:
        await self.dedup.ended(conn, self.namespace, claimed, committed)
        if committed and self.cache is not None:
            await self.cache.remember(self.namespace, [r.envelope.event_id for r in claimed])

    async def _known(self, event_id: str) -> bool:
        return bool(await self.known_many([event_id]))

    async def known_many(self, event_ids: list[str], *, count: bool = True) -> set[str]:
        if self.cache is None:
            return set()
        known = await self.cache.known(self.namespace, event_ids)
        if count:
            self.stats.cache_hits += len(known)
        return known

    async def _handle(
        self, conn: DbConnection, decoded: Decoded, attempt: int, *, token: str = "",
        alone: bool = True,
    ) -> None:
        """Run the handler; ``alone`` when it has the transaction to itself, marked with
        ``token`` (see :mod:`~consumerkit._xact`). In a batch the caller bounds the whole
        batch by ``handler_timeout`` and checks once, at the end, that the transaction is
        still its own and not aborted."""
        ctx = HandlerContext(conn, decoded.envelope, attempt, handler=decoded.route.name,
                             outbox=self.outbox)
        started = time.perf_counter()
        try:
            try:
                if self.tracing is not None:  # the handler runs in the message's span
                    with self.tracing.activate(decoded.envelope):
                        await self._call(decoded, ctx, alone)
                else:
                    await self._call(decoded, ctx, alone)
            finally:
                seconds = time.perf_counter() - started
            if not conn.is_in_transaction():
                if alone or await check(conn, token) is not Mark.COMMITTED:
                    raise HandlerEndedTransaction("the handler ended the transaction itself")
                # it committed the batch's claims early: the records after it go on in a
                # transaction of their own, or their effects would be lost (logged at the end)
                await conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
            # a handler that swallowed a database error leaves the transaction aborted;
            # COMMIT would then silently roll back and the event would be lost. One that
            # rolled it back and began another has lost the claim.
            if alone:
                await verify(conn, token, what=f"event {decoded.envelope.event_id}", log=log,
                             rolled_back=HandlerEndedTransaction(
                                 "the handler rolled the transaction back and began another"))
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we are being cancelled (shutdown, revocation): not the handler's doing
            raise HandlerFailure(exc) from exc  # the handler raised CancelledError by itself
        except Exception as exc:
            raise HandlerFailure(exc) from exc
        finally:  # out of the try above, which makes any error the handler's
            self.observe.handler_finished(decoded.route.name, seconds)

    async def _call(self, decoded: Decoded, ctx: HandlerContext, alone: bool) -> None:
        if alone:
            async with asyncio.timeout(self.handler_timeout):
                await decoded.route.func(decoded.event, ctx)
        else:
            await decoded.route.func(decoded.event, ctx)

    async def settle(
        self, claim: Claim, record: RecordLike, decoded: Decoded, attempt: int,
        abandon: asyncio.Event,
    ) -> Outcome:
        if claim.status is ClaimStatus.CLAIMED:
            self.observe.applied(record, decoded.envelope, decoded.route.name)
            return Outcome.APPLIED
        if claim.status is ClaimStatus.DUPLICATE:
            self.observe.duplicate(record, decoded.envelope, decoded.route.name,
                                   claim.original_seen_at)
            return Outcome.DUPLICATE
        if self.expired == "skip":
            self.observe.expired_skipped(record, decoded.envelope, decoded.route.name)
            return Outcome.EXPIRED_SKIPPED
        when = decoded.envelope.event_time
        detail = (f"event time {when.isoformat() if when else '?'} is older than the dedup "
                  "retention; the original may have been forgotten")
        return await self.dead_letter(record, "expired", detail, attempt, decoded, abandon)

    async def dead_letter(
        self, record: RecordLike, reason: str, detail: str, attempts: int,
        decoded: Decoded | None, abandon: asyncio.Event,
    ) -> Outcome:
        headers = header_map(record)
        wire = self.decoder.wire
        entry = DeadLetterEntry(
            consumer=self.consumer, topic=record.topic, partition=record.partition,
            offset=record.offset, key=record.key, value=record.value,
            headers=list(record.headers or ()), reason=reason, detail=detail, attempts=attempts,
            event_id=decoded.envelope.event_id if decoded else _lenient(headers, wire.id_header),
            event_type=decoded.envelope.event_type if decoded else _lenient(
                headers, wire.event_type_header),
        )
        if not await self.dead_letters.write(entry, abandon):
            return self._abandoned(record)
        self.stats.dead_letter_failures = self.dead_letters.failures
        self.observe.dead_lettered(record, decoded.envelope if decoded else None,
                                   decoded.route.name if decoded else "", reason, detail,
                                   attempts)
        return Outcome.DEAD_LETTERED

    def _abandoned(self, record: RecordLike) -> Outcome:
        self.observe.abandoned((record,))
        return Outcome.ABANDONED


def _stats_only(stats: ConsumerStats) -> Observer:
    return StatsObserver(stats)


def _lenient(headers: dict[str, bytes], name: str) -> str | None:
    raw = headers.get(name)
    return raw.decode(errors="replace")[:200] if raw is not None else None
