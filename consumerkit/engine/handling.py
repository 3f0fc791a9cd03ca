"""The handler calls of one transaction, once its records are claimed.

:class:`Handling` runs them (:func:`~consumerkit.engine.plan.plan`: per-key order, a batch
handler's events in one call) under one ``handler_timeout``, sends the writes they deferred
(``ctx.defer``), then checks once that the transaction is still the one that made the claims.
Who a failure is charged to is said in :mod:`consumerkit.engine.apply`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncpg

from ..context import BatchContext, HandlerContext
from ..observability.observer import Observer
from ..registry import Route
from ..shared.deferred import Deferred
from ..shared.failures import (
    HandlerEndedTransaction,
    HandlerFailure,
    TransactionReplaced,
    connection_lost,
)
from ..types import DbConnection
from .decode import Decoded
from .plan import Call, culprit, plan
from .xact import Mark, check, verify

if TYPE_CHECKING:
    from ..observability.tracing import Tracing
    from ..outbox.writer import Outbox

log = logging.getLogger("consumerkit.pipeline")


class RecordFailed(HandlerFailure):
    """The handler of ``item`` failed (raised, or ended the transaction itself); the whole
    transaction rolled back."""

    def __init__(self, item: Decoded, cause: BaseException) -> None:
        super().__init__(cause)
        self.item = item


@dataclass(frozen=True, slots=True)
class Handling:
    """What the handler calls need: whom to tell (``observe``), their deadline, and what
    handlers may use (outbox, tracing)."""

    observe: Observer
    handler_timeout: float | None
    outbox: Outbox | None
    tracing: Tracing | None

    async def run(self, conn: DbConnection, items: list[Decoded], attempt: int,
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
