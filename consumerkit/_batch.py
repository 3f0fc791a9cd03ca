"""Many records, one transaction: the fast path of the pipeline.

Lanes hand in groups of decoded records (consecutive records of one key, in order). The
batcher gathers the groups of many lanes into one batch and applies it in one transaction on
one connection: one bulk dedup claim, the handlers one after another, one COMMIT (one WAL flush
for the whole batch). At most ``concurrency`` batches run at once; while they run, the next
batch fills up, so batches grow with load and stay small when it is light.

A batch that fails in any way (a handler raising, a swallowed database error, a deadlock, an
outage) has rolled back as a whole: nothing of it is applied. Its records are then applied one
by one through the per-record path, with its retries, back-off and dead letters, so one bad
record costs its neighbours a second try and nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ._apply import RecordFailed
from ._decode import Decoded
from ._failures import HandlerFailure, describe
from ._pipeline import Outcome, Pipeline
from .envelope import RecordLike
from .errors import DecodeError
from .types import Claim

log = logging.getLogger("consumerkit.pipeline")

Report = Callable[[RecordLike, Outcome], None]


@dataclass(frozen=True, slots=True)
class RolledBack:
    """The batch rolled back; ``failed`` is the handler failure that caused it, if any."""

    failed: RecordFailed | None = None


@dataclass(slots=True)
class _Group:
    items: list[Decoded]
    abandon: asyncio.Event
    done: asyncio.Future[list[Claim] | RolledBack] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    batch: asyncio.Task[None] | None = None  # the batch applying it, once taken


class Batcher:
    def __init__(self, pipeline: Pipeline, max_batch: int) -> None:
        self.pipeline = pipeline
        self.max_batch = max_batch
        # records per batch for now: halved when a batch overruns handler_timeout (slow
        # handlers), doubled back after a full batch that took under a quarter of it
        self.limit = max_batch
        self.on_limit: Callable[[int], None] | None = None  # told when the limit changes
        self._pending: deque[_Group] = deque()
        self._wanted = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        self._closing = False

    async def process(
        self, records: Sequence[RecordLike], abandon: asyncio.Event, report: Report,
    ) -> None:
        """Apply ``records`` (consecutive records of one key) in order, calling ``report``
        with each record's outcome as soon as it is final. Records left without an outcome
        (abandoned, or cut short by cancellation) count as abandoned."""
        pipeline = self.pipeline
        pipeline.observe.delivered(len(records))
        reported: list[RecordLike] = []

        def final(record: RecordLike, outcome: Outcome) -> None:
            reported.append(record)  # an ABANDONED outcome is counted by the pipeline itself
            report(record, outcome)

        try:
            await self._process(records, abandon, final)
        finally:
            if len(reported) < len(records):
                done = {id(record) for record in reported}
                pipeline.observe.abandoned([r for r in records if id(r) not in done])

    async def _process(
        self, records: Sequence[RecordLike], abandon: asyncio.Event, report: Report,
    ) -> None:
        pipeline = self.pipeline
        if (parked := await pipeline.join_park(records, abandon)) is not None:
            for record in records:  # their key is parked: they wait behind it, in order
                report(record, parked)
            return
        good: list[tuple[RecordLike, Decoded]] = []
        for record in records:
            try:
                good.append((record, pipeline.decoder.decode(record)))
            except DecodeError as exc:
                report(record, await pipeline.dead_letter(
                    record, exc.reason, exc.detail, 0, None, abandon))
        if not good:
            return
        claims = await self._apply([decoded for _, decoded in good], abandon)
        if isinstance(claims, RolledBack):  # one by one, with retries
            culprit = claims.failed
            for record, decoded in good:
                if abandon.is_set():
                    return
                failed = culprit if culprit and culprit.item is decoded else None
                report(record, await pipeline.process_decoded(record, decoded, abandon, failed))
            return
        for (record, decoded), claim in zip(good, claims, strict=True):
            outcome = pipeline.settled(claim, record, decoded)
            if outcome is None:
                outcome = await pipeline.expired_dead_letter(record, decoded, 1, abandon)
            report(record, outcome)

    async def _apply(
        self, items: list[Decoded], abandon: asyncio.Event,
    ) -> list[Claim] | RolledBack:
        group = _Group(items, abandon)
        self._pending.append(group)
        self._wanted.set()
        if self._runner is None:
            self._runner = asyncio.create_task(self._run(), name="consumerkit-batcher")
        try:
            return await group.done
        except asyncio.CancelledError:
            # the lane was cut short (a revoked partition's handlers outlived the rebalance, or
            # a shutdown): end the transaction holding its records, as the lane's own would
            # end. Left running, a hung handler would keep the claim locks (and so the
            # partition's new owner) and the other groups of the batch waiting.
            if group.batch is not None and not group.batch.done():
                group.batch.cancel()
            raise

    async def _run(self) -> None:
        slots = self.pipeline.slots
        while True:
            if not self._pending:
                self._wanted.clear()
                await self._wanted.wait()
            await slots.acquire()
            await asyncio.sleep(0)  # lanes woken together join the same batch
            batch = self._take()
            if not batch:
                slots.release()
                continue
            task = asyncio.create_task(self._apply_batch(batch))
            for group in batch:
                group.batch = task
            self._running.add(task)
            task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self.pipeline.slots.release()

    def _take(self) -> list[_Group]:
        batch: list[_Group] = []
        size = 0
        while self._pending:
            group = self._pending[0]
            if group.done.done() or group.abandon.is_set():  # gone, or not wanted any more
                self._pending.popleft()
                if not group.done.done():
                    group.done.set_result(RolledBack())
                continue
            if batch and size + len(group.items) > self.limit:
                break
            batch.append(self._pending.popleft())
            size += len(group.items)
        return batch

    async def _apply_batch(self, batch: list[_Group]) -> None:
        items = [item for group in batch for item in group.items]
        started = time.monotonic()
        try:
            claims = await self.pipeline.apply_batch(items)
        except asyncio.CancelledError:
            if self._closing:
                for group in batch:
                    group.done.cancel()
                raise
            # a lane of the batch was cut short: the batch rolled back, and the records of
            # the other lanes still waiting are applied one by one
            waiting = [group for group in batch if not group.done.done()]
            if waiting:
                self.pipeline.observe.batch(len(items), False)
                log.info("a batch of %d records rolled back (a lane was cut short); applying "
                         "the other %d one by one", len(items),
                         sum(len(group.items) for group in waiting))
            for group in waiting:
                group.done.set_result(RolledBack())
            return
        except Exception as exc:
            self.pipeline.observe.batch(len(items), False)
            cause = exc.cause if isinstance(exc, HandlerFailure) else exc
            log.info("a batch of %d records rolled back (%s); applying them one by one",
                     len(items), describe(cause))
            if isinstance(cause, TimeoutError) and not isinstance(exc, RecordFailed):
                self._resize(max(1, len(items) // 2))
            outcome = RolledBack(exc if isinstance(exc, RecordFailed) else None)
            for group in batch:
                if not group.done.done():
                    group.done.set_result(outcome)
            return
        if any(not claim.cached for claim in claims):  # a transaction ran
            self.pipeline.observe.batch(len(items), True)
        deadline = self.pipeline.handler_timeout
        if (self.limit < self.max_batch and len(items) >= self.limit and deadline is not None
                and time.monotonic() - started < deadline / 4):
            self._resize(min(self.max_batch, self.limit * 2))
        start = 0
        for group in batch:
            if not group.done.done():  # its lane was cancelled: its offsets stay uncommitted
                group.done.set_result(claims[start:start + len(group.items)])
            start += len(group.items)

    def _resize(self, limit: int) -> None:
        if limit == self.limit:
            return
        if limit < self.limit:
            log.warning("a batch of %d records overran handler_timeout: batches now hold at "
                        "most %d", self.limit, limit)
        self.limit = limit
        if self.on_limit is not None:
            self.on_limit(limit)

    async def close(self) -> None:
        """Cancel the batches still running (they roll back) and the gathering task."""
        self._closing = True
        tasks = [*self._running, *([self._runner] if self._runner else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for group in self._pending:
            group.done.cancel()
        self._pending.clear()
