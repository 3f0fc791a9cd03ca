"""One dead letter applied again through the consumer's own transaction path.

The handler is wrapped so that the entry is marked ``replayed`` by a statement of the
handler's own transaction (after the dedup claim, before the outbox's writes and the
commit): the effects and the mark commit together, or neither. An entry no longer waiting
when it is marked (replayed or discarded meanwhile) rolls its transaction back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import asyncpg

from ..deadletter import store
from ..deadletter.store import StoredDeadLetter
from ..dedup.stores import store_for
from ..errors import DeadLetter, DeadLetterError, DecodeError, is_retriable
from ..observability.observer import Observer
from ..shared.failures import describe, judge
from ..types import ClaimStatus
from .apply import Applier
from .decode import Decoded
from .systemic import systemic_cause

if TYPE_CHECKING:
    from ..consumer import Consumer

log = logging.getLogger("consumerkit.deadletter")

OUTAGE_WAITS = 30
"""Waits for a database that is away before an entry's replay gives up (capped back-off:
a few minutes); the entry stays waiting, nothing is applied."""


class _Gone(Exception):
    """The entry was no longer waiting when its replay marked it: replayed or discarded by
    someone else meanwhile; the effects roll back."""

    retriable = False


class Replayer:
    """Applies dead letters through ``consumer``'s decoder, dedup store, handlers and
    outbox (no dedup cache and no offsets: a replay moves no consumer's position)."""

    def __init__(self, consumer: Consumer, pool: asyncpg.Pool, observe: Observer) -> None:
        self.pool = pool
        self.observe = observe
        self.decoder = consumer.decoder()
        self.retry = consumer.retry
        self.applier = Applier(
            namespace=consumer.name, dedup=store_for(consumer.schema, consumer.dedup),
            observe=observe, handler_timeout=consumer.handler_timeout,
            enforce_window=consumer.dedup.expired != "apply", outbox=consumer.outbox)

    async def replay(self, entry: StoredDeadLetter, schema: str, note: str | None,
                     ) -> tuple[str, str | None]:
        """Apply ``entry`` once; the outcome (``replayed``, ``duplicates``, ``failed``,
        ``gone``) and, when it failed, why."""
        record = entry.record()
        try:
            decoded = self.decoder.decode(record)
        except DecodeError as exc:
            return "failed", f"{exc.reason}: {exc.detail}"
        mark = store.mark_replayed_sql(schema)
        marked = _marking(decoded, mark, entry.id, note)
        attempt = outages = 0
        while True:
            attempt += 1
            try:
                [claim] = await self.applier.apply(self.pool.acquire, [marked], attempt)
                break
            except Exception as raised:
                error, outage = judge(raised)
                if isinstance(error, _Gone):
                    return "gone", None
                if (cause := systemic_cause(error)) is not None:  # every entry would hit it
                    raise DeadLetterError(
                        f"replay stopped at dead letter #{entry.id}: {cause.sqlstate} "
                        f"{describe(cause)}; it and the entries not replayed yet stay waiting"
                    ) from None
                if outage and outages < OUTAGE_WAITS:
                    attempt -= 1
                    outages += 1
                    delay = self.retry.delay(min(outages, 8))
                    log.warning("replaying dead letter #%d: not its fault (%s), trying again "
                                "in %.1fs", entry.id, describe(error), delay)
                    await asyncio.sleep(delay)
                    continue
                if isinstance(error, DeadLetter):
                    return "failed", f"dead_lettered_by_handler: {describe(error)}"
                if outage or not is_retriable(error) or attempt >= self.retry.max_attempts:
                    return "failed", (f"handler_failed: after {attempt} attempts: "
                                      f"{describe(error)}")
                await asyncio.sleep(self.retry.delay(attempt))
        name = decoded.route.name
        if claim.status is ClaimStatus.CLAIMED:
            self.observe.applied(record, decoded.envelope, name)
            return "replayed", None
        if claim.status is ClaimStatus.DUPLICATE:  # applied before: only the mark is left
            self.observe.duplicate(record, decoded.envelope, name, claim.original_seen_at)
            async with self.pool.acquire() as conn:
                done = await conn.execute(mark, entry.id, note)
            return ("duplicates", None) if done != "UPDATE 0" else ("gone", None)
        return "failed", ("expired: older than the dedup window, so whether it was applied "
                          "cannot be known (DedupPolicy(expired='apply') replays it anyway)")


def _marking(decoded: Decoded, mark: str, entry_id: int, note: str | None) -> Decoded:
    """``decoded`` with a handler that also marks the entry replayed in its transaction."""
    func = decoded.route.func

    async def apply_and_mark(event: Any, ctx: Any) -> None:
        await func(event, ctx)
        if await ctx.tx.execute(mark, entry_id, note) == "UPDATE 0":
            raise _Gone

    route = dataclasses.replace(decoded.route, func=apply_and_mark)
    return dataclasses.replace(decoded, route=route)
