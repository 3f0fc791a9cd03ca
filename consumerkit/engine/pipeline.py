"""A record's way through the consumer, top to bottom, with the default settings.

key parked on this partition: park the record -> decode (undecodable: dead letter)
       -> apply it in a transaction (:mod:`~consumerkit.engine.apply`)
       -> on failure: wait out an outage, or a failure every record would hit (the consumer
          stalls, :mod:`~consumerkit.engine.stall`), or retry with back-off -> dead letter if
          exhausted (or park its key, with ``on_exhausted="park"``)
       -> settle: the outcome told to the observers.

With batches, the batcher (:mod:`~consumerkit.engine.batch`) applies many records at once through
the same transaction (:meth:`Pipeline.apply_batch`) and falls back to :meth:`Pipeline.
process_decoded` for each record of a batch that failed.

The offset is never touched here: the caller marks the record done only when ``process``
returns an outcome other than ``ABANDONED``, and commits offsets after that.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import asyncpg

from ..deadletter.writer import DeadLetterWriter, wait_or_abandon
from ..dedup.policy import ExpiredPolicy
from ..envelope import RecordLike
from ..errors import DeadLetter, DecodeError, Retry, is_retriable
from ..observability.logging import message_fields
from ..observability.observer import Observer
from ..retry import RetryPolicy
from ..shared.failures import ConnectionLost, HandlerFailure, describe, judge
from ..stats import ConsumerStats, StatsObserver
from ..types import Claim, ClaimStatus, DedupCache, DedupStore
from .apply import Applier
from .connections import Connections
from .decode import Decoded, Decoder
from .outcome import Outcome
from .stall import Breaker, key_of
from .unapplied import Unapplied

if TYPE_CHECKING:
    from ..observability.tracing import Tracing
    from ..offsets.recheck import Recheck
    from ..outbox.writer import Outbox
    from ..parking.lot import ParkingLot

log = logging.getLogger("consumerkit.pipeline")
__all__ = ["Outcome", "Pipeline"]  # Outcome: imported from here by the engine and tests


_LOST_CONNECTIONS_PER_MESSAGE = 10


class Pipeline:
    """A record's attempts; what is not applied goes through :attr:`unapplied`."""

    def __init__(
        self, *, consumer: str, namespace: str, pool: asyncpg.Pool, dedup: DedupStore,
        decoder: Decoder, retry: RetryPolicy, dead_letters: DeadLetterWriter,
        expired: ExpiredPolicy, stats: ConsumerStats, concurrency: int,
        handler_timeout: float | None, cache: DedupCache | None = None,
        outbox: Outbox | None = None, observer: Observer | None = None,
        tracing: Tracing | None = None, parking: ParkingLot | None = None,
        breaker: Breaker | None = None, offsets: Recheck | None = None,
    ) -> None:
        self.consumer = consumer
        self.breaker = breaker  # None: no failure stalls (every one is the record's)
        self.parking = parking
        self.namespace = namespace
        self.pool = pool
        self.cache = cache
        self.decoder = decoder
        self.retry = retry
        self.dead_letters = dead_letters
        self.expired = expired
        self.stats = stats
        # outcomes are counted once, by whoever subscribed (stats, metrics, logs, traces)
        self.observe: Observer = observer if observer is not None else _stats_only(stats)
        self.maintenance_wanted = asyncio.Event()
        self.handler_timeout = handler_timeout
        self.unapplied = Unapplied(
            consumer=consumer, parking=parking, retry=retry, decoder=decoder,
            dead_letters=dead_letters, stats=stats, observe=self.observe)
        self.applier = Applier(
            namespace=namespace, dedup=dedup, observe=self.observe,
            handler_timeout=handler_timeout, enforce_window=expired != "apply", cache=cache,
            outbox=outbox, tracing=tracing, maintenance_wanted=self.maintenance_wanted,
            offsets=offsets)
        # transactions at once; records waiting for a retry or an outage hold no slot
        self.slots = asyncio.Semaphore(concurrency)
        self.connections = Connections(pool, self.slots)

    async def process(self, record: RecordLike, abandon: asyncio.Event) -> Outcome:
        """Apply ``record`` exactly once in effect; ``abandon`` interrupts waits (shutdown,
        revoked partition) and yields ``ABANDONED``."""
        self.observe.delivered(1)
        if (parked := await self.unapplied.join_park([record], abandon)) is not None:
            return parked
        try:
            decoded = self.decoder.decode(record)
        except DecodeError as exc:
            return await self.unapplied.undecodable(record, exc, abandon)
        return await self.process_decoded(record, decoded, abandon)

    async def process_decoded(
        self, record: RecordLike, decoded: Decoded, abandon: asyncio.Event,
        failed: HandlerFailure | None = None,
    ) -> Outcome:
        """Apply a decoded record in a transaction of its own, retrying as the policy says;
        ``failed`` is how its handler failed in a batch (its first attempt)."""
        if (parked := await self.unapplied.join_park([record], abandon, decoded)) is not None:
            return parked  # an earlier record of its key was parked (in its batch, say)
        if self.breaker is None:
            return await self._retried(record, decoded, abandon, failed)
        try:
            return await self._retried(record, decoded, abandon, failed, self.breaker)
        finally:
            self.breaker.done(decoded)  # if it probed a stall: another record will

    async def _retried(
        self, record: RecordLike, decoded: Decoded, abandon: asyncio.Event,
        failed: HandlerFailure | None, breaker: Breaker | None = None,
    ) -> Outcome:
        attempt = outages = lost = 0
        while True:
            attempt += 1
            # stalled: wait until it is over, or until this record is the one to try
            if (breaker is not None and breaker.blocks(decoded.route.name) and failed is None
                    and not await breaker.turn(decoded, abandon)):
                return self.unapplied.abandoned(record)
            try:
                if failed is not None:  # judged below like any failed attempt
                    raised, failed = failed, None
                    raise raised
                claim = await self._attempt(decoded, attempt)
            except Exception as raised:
                error, outage = judge(raised, stopping=abandon.is_set())
                if isinstance(raised, ConnectionLost) and raised.during_handler:
                    lost += 1  # a handler that keeps killing its connection is no outage
                    outage = lost <= _LOST_CONNECTIONS_PER_MESSAGE
            else:
                if breaker is not None:
                    breaker.resolved(decoded, ran=claim.status is ClaimStatus.CLAIMED)
                return await self.settle(claim, record, decoded, attempt, abandon)
            stall = (None if outage or breaker is None else
                     breaker.failed(decoded.route.name, key_of(record), error, decoded))
            if stall is None and not outage and breaker is not None:
                breaker.leave(decoded)  # a failure of its own: if it probed, the next one
            if stall is not None:
                assert breaker is not None
                attempt -= 1  # not the record's fault: no attempt spent, never dead-lettered
                delay = breaker.stall(decoded, stall)
                if delay is None:
                    continue  # another record tries for all: wait for it (above)
                log.info("stalled (%s), trying again in %.2fs", stall.reason, delay,
                         extra=message_fields(record, decoded.envelope,
                                              handler=decoded.route.name, consumer=self.consumer))
            elif outage:
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
                return await self.unapplied.exhausted(
                    record, decoded, reason, describe(error), attempt, abandon)
            elif attempt >= self.retry.max_attempts:
                detail = f"gave up after {attempt} attempts: {describe(error)}"
                return await self.unapplied.exhausted(
                    record, decoded, "handler_failed", detail, attempt, abandon)
            else:
                delay = self._retry_delay(error, attempt)
                self.observe.retry(record, decoded.envelope, decoded.route.name, attempt,
                                   delay, error)
            if await wait_or_abandon(abandon, delay):
                return self.unapplied.abandoned(record)

    def _retry_delay(self, error: BaseException, attempt: int) -> float:
        if isinstance(error, Retry) and error.delay is not None:
            return error.delay
        return self.retry.delay(attempt)

    async def _attempt(self, decoded: Decoded, attempt: int) -> Claim:
        [claim] = await self.applier.apply(self.connections.attempt, [decoded], attempt)
        return claim

    async def apply_batch(self, items: Sequence[Decoded]) -> list[Claim]:
        """Apply ``items`` in one transaction (the batcher holds the slot). Raises if anything
        fails; nothing of the batch is applied then."""
        return await self.applier.apply(self.connections.batch, items)

    def settled(self, claim: Claim, record: RecordLike, decoded: Decoded) -> Outcome | None:
        """The outcome of a claim that needs no waiting (applied, duplicate, skipped), told
        to the observers; ``None`` for an expired record that goes to the dead letters
        (:meth:`settle`). Synchronous: a batch settles its records without a coroutine
        each."""
        if claim.status is ClaimStatus.CLAIMED:
            self.observe.applied(record, decoded.envelope, decoded.route.name)
            if self.breaker is not None:
                self.breaker.succeeded(decoded.route.name, decoded)
            return Outcome.APPLIED
        if claim.status is ClaimStatus.DUPLICATE:
            if claim.cached:
                self.observe.cache_hits(1)
            self.observe.duplicate(record, decoded.envelope, decoded.route.name,
                                   claim.original_seen_at)
            return Outcome.DUPLICATE
        if self.expired == "skip":
            self.observe.expired_skipped(record, decoded.envelope, decoded.route.name)
            return Outcome.EXPIRED_SKIPPED
        return None

    async def settle(
        self, claim: Claim, record: RecordLike, decoded: Decoded, attempt: int,
        abandon: asyncio.Event,
    ) -> Outcome:
        if (outcome := self.settled(claim, record, decoded)) is not None:
            return outcome
        return await self.unapplied.expired_dead_letter(record, decoded, attempt, abandon)

def _stats_only(stats: ConsumerStats) -> Observer:
    return StatsObserver(stats)
