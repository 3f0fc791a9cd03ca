"""One transaction for a list of decoded records: the correctness path, top to bottom.

    ids the dedup cache knows -> DUPLICATE, no transaction
    BEGIN (READ COMMITTED); claim the rest (one statement); mark the transaction;
    the handler calls (:mod:`~consumerkit.engine.handling`: per-key order; a batch
    handler's events in one call); the deferred writes (``ctx.defer``); the closing check;
    COMMIT -> the cache remembers

One record is a batch of one: a consumer's per-record attempts, its batches and the webhook
receiver all apply records here. Retries, outage waits, the fallback one by one and dead
letters wrap this (see :mod:`~consumerkit.engine.pipeline` and :mod:`~consumerkit.engine.batch`).

What a failure is charged to:

- a handler that raises, or ends the transaction itself, fails its own record
  (:class:`~consumerkit.engine.handling.RecordFailed`), except for
  ``InFailedSQLTransactionError``: an earlier handler may have swallowed the error, so no
  record is blamed;
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
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg

from ..observability.observer import Observer
from ..shared import faults
from ..shared.failures import ClaimBlocked, HandlerFailure
from ..types import Claim, ClaimRequest, ClaimStatus, DbConnection, DedupCache, DedupStore
from .decode import Decoded
from .frozen import maker
from .handling import Handling
from .xact import mark

if TYPE_CHECKING:
    from ..observability.tracing import Tracing
    from ..offsets.recheck import Recheck, Written
    from ..outbox.writer import Outbox

_request = maker(ClaimRequest)

CACHED = Claim(ClaimStatus.DUPLICATE, cached=True)
"""The claim of a record the dedup cache knows was applied: no transaction was needed."""


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
                    await Handling(self.observe, self.handler_timeout, self.outbox,
                                   self.tracing).run(conn, [d for d, _ in fresh], attempt, token)
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


Connect = Callable[[], AbstractAsyncContextManager[DbConnection]]
"""Where :meth:`Applier.apply` gets its connection (and gives it back), once it needs one."""


def _holding(conn: DbConnection) -> Connect:
    """A connection in hand as a :data:`Connect` (its caller gives it back)."""
    @contextlib.asynccontextmanager
    async def held() -> AsyncIterator[DbConnection]:
        yield conn

    return held
