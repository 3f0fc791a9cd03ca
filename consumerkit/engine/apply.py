"""One transaction for a list of decoded records: the correctness path, top to bottom.

    ids the dedup cache knows -> DUPLICATE, no transaction
    BEGIN (READ COMMITTED); claim the rest (one statement); mark the transaction;
    the handler calls (:func:`plan`: per-key order; a batch handler's events in one call);
    the deferred writes (``ctx.defer``); the closing check; COMMIT -> the cache remembers

One record is a batch of one: a consumer's per-record attempts, its batches and the webhook
receiver all apply records here. Retries, outage waits, the fallback one by one and dead
letters wrap this (see :mod:`~consumerkit.engine.pipeline` and :mod:`~consumerkit.engine.batch`).

What a failure is charged to:

- a handler that raises, or ends the transaction itself, fails its own record
  (:class:`RecordFailed`), except for ``InFailedSQLTransactionError``: an earlier handler
  may have swallowed the error, so no record is blamed;
- a batch handler's call of several events that raises blames none of them: one by one, the
  culprit is found;
- a deferred write that fails is charged to the record that queued it, when one record did,
  whichever handler's statement sent it (an error a handler recovered from blames no one);
- anything after the claim that no single handler raised (``handler_timeout`` running out,
  the closing check, ``COMMIT``) is a :class:`HandlerFailure` that blames no record;
- a failure before any handler ran (the connection, ``BEGIN``, the claim) is raised as it is.

When the transaction holds one fresh record, a handler that commits the transaction itself
fails its record, and one that rolls it back and begins another is found by the closing check
and charged to it; with several, a commit goes on in a new transaction (the claims of records
not yet handled were committed with it) and a rollback fails the whole transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg

from ..context import BatchContext, HandlerContext
from ..observability.observer import Observer
from ..registry import Route
from ..shared import faults
from ..shared.deferred import Deferred
from ..shared.failures import (
    ClaimBlocked,
    HandlerEndedTransaction,
    HandlerFailure,
    TransactionReplaced,
    connection_lost,
)
from ..types import Claim, ClaimRequest, ClaimStatus, DbConnection, DedupCache, DedupStore
from .decode import Decoded
from .frozen import maker
from .plan import Call, culprit, plan
from .xact import Mark, check, mark, verify

if TYPE_CHECKING:
    from ..observability.tracing import Tracing
    from ..offsets.recheck import Recheck, Written
    from ..outbox.writer import Outbox

log = logging.getLogger("consumerkit.pipeline")

_request = maker(ClaimRequest)

CACHED = Claim(ClaimStatus.DUPLICATE, cached=True)
"""The claim of a record the dedup cache knows was applied: no transaction was needed."""


class RecordFailed(HandlerFailure):
    """The handler of ``item`` failed (raised, or ended the transaction itself); the whole
    transaction rolled back."""

    def __init__(self, item: Decoded, cause: BaseException) -> None:
        super().__init__(cause)
        self.item = item


@dataclass(frozen=True, slots=True)
class Applier:
    """How records are applied: the dedup store and cache, the handlers' deadline, what
    handlers may use (outbox, tracing) and whom to tell (``observe``)."""

    namespace: str
    dedup: DedupStore
    observe: Observer
    handler_timeout: float | None
    enforce_window: bool = True
    cache: DedupCache | None = None
    outbox: Outbox | None = None
    tracing: Tracing | None = None
    maintenance_wanted: asyncio.Event | None = None  # set when no dedup partition covers now
    offsets: Recheck | None = None  # the database keeps the offsets: written in the transaction

    def _cache_namespace(self) -> str | None:
        """The dedup cache's namespace, or None while it must not be used. With the offsets
        in the database, the cache speaks for one timeline of it: a failover or a restore
        that moved the database back starts a new one, where ids cached before (effects the
        database may have lost) count for nothing; and between a lost connection and the
        check that follows, the cache is not asked at all."""
        if self.offsets is None:
            return self.namespace
        epoch = self.offsets.epoch
        return None if self.offsets.pending or not epoch else f"{self.namespace}@{epoch}"

    async def known(self, event_ids: Sequence[str]) -> set[str]:
        """The ids among ``event_ids`` that the dedup cache knows were applied."""
        if self.cache is None or not event_ids:
            return set()
        namespace = self._cache_namespace()
        if namespace is None:
            return set()
        return await self.cache.known(namespace, event_ids)

    async def apply(self, connect: Connect | DbConnection, items: Sequence[Decoded],
                    attempt: int = 1) -> list[Claim]:
        """Apply ``items`` in one transaction on a connection from ``connect`` (or on the
        connection given): one claim for all, each fresh record's handler, one COMMIT.
        Returns each item's claim, in order. Raises if anything fails (see the module's
        text); nothing of ``items`` is applied then. The dedup cache is asked first: records
        it knows need no connection, so they settle during a database outage too."""
        source = connect if callable(connect) else _holding(connect)
        known = (await self.known([d.envelope.event_id for d in items])
                 if self.cache is not None else set())
        todo = [d for d in items if d.envelope.event_id not in known] if known else list(items)
        fresh: list[Claim] = []
        if todo:
            async with source() as conn:
                if self.offsets is not None:  # the database did not move back meanwhile
                    await self.offsets.ready(conn, todo)
                fresh = await self._transaction(conn, todo, attempt)
        if not known:
            return fresh
        claims = iter(fresh)
        return [CACHED if d.envelope.event_id in known else next(claims) for d in items]

    async def _transaction(self, conn: DbConnection, items: list[Decoded], attempt: int,
                           ) -> list[Claim]:
        requests = [_request(d.envelope, d.route.name) for d in items]
        claimed: list[ClaimRequest] = []
        written: Written = []
        committed = handling = False
        outside = faults.inject("claim_outside_tx")
        try:
            if outside:  # broken on purpose (see faults): the claim commits by itself
                claims = await self._claim(conn, requests)
            # pinned: the claim's lock-then-look-up needs a fresh snapshot per statement
            async with conn.transaction(isolation="read_committed"):
                if not outside:
                    claims = await self._claim(conn, requests)
                fresh = [(d, r) for d, r, c in zip(items, requests, claims, strict=True)
                         if c.status is ClaimStatus.CLAIMED]
                if fresh:
                    claimed = [r for _, r in fresh]
                    faults.inject("after_claim")
                    if faults.inject("cache_before_commit"):  # broken on purpose: see faults
                        await self._remember(claimed)
                    token = await mark(conn)
                    handling = True
                    await self._handle_all(conn, [d for d, _ in fresh], attempt, token)
                if self.offsets is not None:
                    written = await self.offsets.write(conn, items, claims)
                if fresh:
                    faults.inject("before_commit")
            committed = True
            if self.offsets is not None:
                self.offsets.confirm(written)
            if claimed:
                faults.inject("after_commit")
        except HandlerFailure:
            raise
        except Exception as exc:
            if handling:  # after the handlers ran: COMMIT failed (a deferred constraint, or a
                raise HandlerFailure(exc) from exc  # query a handler left running), or so
            raise
        finally:
            if claimed:
                await self._ended(conn, claimed, committed)
        return claims

    async def _claim(self, conn: DbConnection, requests: list[ClaimRequest]) -> list[Claim]:
        if faults.inject("claim_skipped"):  # broken on purpose: see faults
            return [Claim(ClaimStatus.CLAIMED) for _ in requests]
        try:
            return await self.dedup.claim_many(
                conn, self.namespace, requests, enforce_window=self.enforce_window)
        except asyncpg.CheckViolationError as exc:  # no partition for now()
            if self.maintenance_wanted is not None:
                self.maintenance_wanted.set()
            raise ClaimBlocked(exc) from exc
        except asyncpg.LockNotAvailableError as exc:  # a stalled holder of the event
            raise ClaimBlocked(exc) from exc

    async def _ended(self, conn: DbConnection, claimed: list[ClaimRequest], committed: bool,
                     ) -> None:
        await self.dedup.ended(conn, self.namespace, claimed, committed)
        if committed and await self._remember(claimed):
            faults.inject("after_cache_write")

    async def _remember(self, claimed: list[ClaimRequest]) -> bool:
        """Tell the dedup cache (if one may be used now) that ``claimed`` were applied."""
        namespace = self._cache_namespace()
        if self.cache is None or namespace is None:
            return False
        await self.cache.remember(namespace, [r.envelope.event_id for r in claimed])
        return True

    async def _handle_all(self, conn: DbConnection, items: list[Decoded], attempt: int,
                          token: str) -> None:
        """Run the handler calls of the claimed ``items`` under one ``handler_timeout``, send
        the writes they deferred, then check once that the transaction is still the one that
        made the claims (``token``), and not aborted."""
        sole = len(items) == 1
        deferred = Deferred(conn)
        calls = plan(items)
        try:
            async with asyncio.timeout(self.handler_timeout):
                for index in range(len(calls)):
                    await self._handle(conn, calls, index, attempt, token, deferred, sole)
                try:
                    await deferred.flush()
                except Exception as exc:
                    owner = culprit(deferred, calls, exc)
                    if owner is None or connection_lost(conn):  # no record's doing
                        raise
                    raise RecordFailed(owner, exc) from exc
            what = (f"event {items[0].envelope.event_id}" if sole
                    else f"a batch of {len(items)} records")
            # a handler that swallowed a database error left the transaction aborted (COMMIT
            # would roll back silently, and the events be lost); one that rolled it back and
            # began another lost the claims
            await verify(conn, token, what=what, log=log, rolled_back=HandlerEndedTransaction(
                "the handler rolled the transaction back and began another") if sole
                else TransactionReplaced("a handler of the batch rolled its transaction back "
                                         "and began another"))
        except HandlerFailure:
            raise
        except Exception as exc:
            raise HandlerFailure(exc) from exc
        finally:
            deferred.closed = True  # nothing sends a later defer: it raises instead

    async def _handle(self, conn: DbConnection, calls: list[Call], index: int, attempt: int,
                      token: str, deferred: Deferred, sole: bool) -> None:
        route, records = calls[index]
        own = records[0] if len(records) == 1 else None  # the record to blame, if one
        started = time.perf_counter()
        try:
            try:
                if route.batch:
                    await self._call_batch(conn, route, records, attempt, deferred, index)
                else:
                    await self._call(conn, records[0], attempt, deferred, index)
            finally:
                seconds = time.perf_counter() - started
            if not conn.is_in_transaction():
                if sole or await check(conn, token) is not Mark.COMMITTED:
                    raise HandlerEndedTransaction("the handler ended the transaction itself")
                # it committed the claims of the records after it too: they go on in a
                # transaction of their own, or their effects would be lost (logged at the end)
                await conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we are being cancelled (shutdown, revocation, the deadline): not its
            if own is None:  # doing; it raised CancelledError itself
                raise HandlerFailure(exc) from exc
            raise RecordFailed(own, exc) from exc
        except asyncpg.InFailedSQLTransactionError as exc:
            # an earlier handler may have swallowed the error: blame no record (alone, the
            # record is tried again all the same)
            raise HandlerFailure(exc) from exc
        except Exception as exc:
            if deferred.owners(exc) is not None:  # it failed because a deferred write did
                own = culprit(deferred, calls, exc)
            # a batch handler's call of several records: found one by one; a connection that
            # died under the call: no record's doing, each is tried again on its own
            if own is None or connection_lost(conn):
                raise HandlerFailure(exc) from exc
            raise RecordFailed(own, exc) from exc
        finally:  # out of the try above, which makes any error the handler's
            self.observe.handler_finished(route.name, seconds)

    async def _call_batch(self, conn: DbConnection, route: Route, records: list[Decoded],
                          attempt: int, deferred: Deferred, index: int) -> None:
        envelopes = [d.envelope for d in records]
        ctx = BatchContext(conn, envelopes, attempt, handler=route.name, outbox=self.outbox,
                           deferred=deferred, owner=index, publishes=route.publishes)
        events = [d.event for d in records]
        if self.tracing is not None:  # one span for the call, linked to its messages' spans
            with self.tracing.activate_batch(route.name, envelopes):
                await route.func(events, ctx)
        else:
            await route.func(events, ctx)

    async def _call(self, conn: DbConnection, decoded: Decoded, attempt: int,
                    deferred: Deferred, index: int) -> None:
        ctx = HandlerContext(conn, decoded.envelope, attempt, handler=decoded.route.name,
                             outbox=self.outbox, deferred=deferred, owner=index,
                             publishes=decoded.route.publishes)
        if self.tracing is not None:  # the handler runs in the message's span
            with self.tracing.activate(decoded.envelope):
                await decoded.route.func(decoded.event, ctx)
        else:
            await decoded.route.func(decoded.event, ctx)


Connect = Callable[[], AbstractAsyncContextManager[DbConnection]]
"""Where :meth:`Applier.apply` gets its connection (and gives it back), once it needs one."""


def _holding(conn: DbConnection) -> Connect:
    """A connection in hand as a :data:`Connect` (its caller gives it back)."""
    @contextlib.asynccontextmanager
    async def held() -> AsyncIterator[DbConnection]:
        yield conn

    return held
