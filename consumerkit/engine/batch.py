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

Groups come in two ways. :meth:`Batcher.process` is awaited by a task of the caller's.
:meth:`Batcher.submit` takes a group from task-less lanes (:class:`~consumerkit.engine.lanes.
KeyedLanes`) and settles it when its batch ends, without a task: a batch gathers the groups
of hundreds of keys, and a task each would cost more than their transaction. Only what has to
wait (a fallback one by one, an expired record's dead letter, a parked key, an undecodable
record) gets a task, tracked by the group's :class:`~consumerkit.engine.settle.Owner` so that a
revocation can cut it short. How a group's records settle: :mod:`consumerkit.engine.settle`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from functools import partial

from ..envelope import RecordLike
from ..errors import DecodeError
from ..shared.failures import HandlerFailure, describe
from .decode import Decoded
from .groups import Group, Groups
from .handling import RecordFailed
from .pipeline import Pipeline
from .settle import Owner, Report, Result, RolledBack, accounted, conclude

log = logging.getLogger("consumerkit.pipeline")

class Batcher:
    def __init__(self, pipeline: Pipeline, max_batch: int) -> None:
        self.pipeline = pipeline
        self.max_batch = max_batch
        # records per batch for now: halved when a batch overruns handler_timeout (slow
        # handlers), doubled back after a full batch that took under a quarter of it
        self.limit = max_batch
        self.on_limit: Callable[[int], None] | None = None  # told when the limit changes
        self.groups = Groups(pipeline)
        self._pending: deque[Group] = deque()
        self._wanted = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def errors(self) -> list[BaseException]:
        """Bugs met while settling a group: the engine stops on the first."""
        return self.groups.errors

    async def process(
        self, records: Sequence[RecordLike], abandon: asyncio.Event, report: Report,
    ) -> None:
        """Apply ``records`` (consecutive records of one key) in order, calling ``report``
        with each record's outcome as soon as it is final. Records left without an outcome
        (abandoned, or cut short by cancellation) count as abandoned."""
        self.pipeline.observe.delivered(len(records))
        await accounted(self.pipeline, records, abandon, report, self._process)

    def submit(self, lane: Hashable, records: list[RecordLike], owner: Owner) -> None:
        """Take ``records`` (consecutive records of one key) into the next batch, without a
        task; ``owner`` hears each record's outcome, then that the group is finished."""
        pipeline = self.pipeline
        pipeline.observe.delivered(len(records))
        if self._closing or owner.abandon.is_set():
            pipeline.observe.abandoned(records)
            owner.finished(lane, records)
            return
        good: list[tuple[RecordLike, Decoded]] | None = None
        # a parked key (or parked keys not loaded yet: the database is asked) has to wait
        if pipeline.parking is None or pipeline.parking.holds_now(records[0]) is False:
            decode = pipeline.decoder.decode
            try:
                good = [(record, decode(record)) for record in records]
            except DecodeError:  # to the dead letters
                good = None
        if good is None:  # the whole way, in a task (the decoding is done again)
            self.groups.spawn(lane, records, owner, self._process)
            return
        self._queue(Group([decoded for _, decoded in good], owner.abandon, owner=owner,
                           lane=lane, records=records, good=good))

    async def _process(
        self, records: Sequence[RecordLike], abandon: asyncio.Event, report: Report,
    ) -> None:
        pipeline = self.pipeline
        if (parked := await pipeline.unapplied.join_park(records, abandon)) is not None:
            for record in records:  # their key is parked: they wait behind it, in order
                report(record, parked)
            return
        good: list[tuple[RecordLike, Decoded]] = []
        for record in records:
            try:
                good.append((record, pipeline.decoder.decode(record)))
            except DecodeError as exc:
                report(record, await pipeline.unapplied.undecodable(record, exc, abandon))
        if not good:
            return
        group = Group([decoded for _, decoded in good], abandon,
                       future=asyncio.get_running_loop().create_future())
        result = await self._apply(group)
        await conclude(self.pipeline, good, result, abandon, report)

    async def _apply(self, group: Group) -> Result:
        assert group.future is not None
        self._queue(group)
        try:
            return await group.future
        except asyncio.CancelledError:
            # the lane was cut short (a revoked partition's handlers outlived the rebalance, or
            # a shutdown): end the transaction holding its records, as the lane's own would
            # end. Left running, a hung handler would keep the claim locks (and so the
            # partition's new owner) and the other groups of the batch waiting.
            if group.batch is not None and not group.batch.done():
                group.batch.cancel()
            raise

    def _queue(self, group: Group) -> None:
        self._pending.append(group)
        self._wanted.set()
        if self._runner is None:
            self._runner = asyncio.create_task(self._run(), name="consumerkit-batcher")

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
                if group.owner is not None:  # a revocation cancels the batch holding them
                    group.owner.running.add(task)
            self._running.add(task)
            task.add_done_callback(partial(self._finished, batch))

    def _finished(self, batch: list[Group], task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self.pipeline.slots.release()
        if task.cancelled():  # before its first step: its groups never heard of it
            for group in batch:
                if group.owner is not None:
                    group.owner.running.discard(task)
                if self._closing:
                    self.groups.cancel(group)
                elif not group.done():
                    self.groups.deliver(group, RolledBack())

    def _take(self) -> list[Group]:
        batch: list[Group] = []
        size = 0
        while self._pending:
            group = self._pending[0]
            if group.done() or group.abandon.is_set():  # gone, or not wanted any more
                self._pending.popleft()
                if not group.done():
                    self.groups.deliver(group, RolledBack())
                continue
            if batch and size + len(group.items) > self.limit:
                break
            batch.append(self._pending.popleft())
            size += len(group.items)
        return batch

    async def _apply_batch(self, batch: list[Group]) -> None:
        items = [item for group in batch for item in group.items]
        started = time.monotonic()
        try:
            claims = await self.pipeline.apply_batch(items)
        except asyncio.CancelledError:
            if self._closing:
                for group in batch:
                    self.groups.cancel(group)
                raise
            # a lane of the batch was cut short: the batch rolled back, and the records of
            # the other lanes still waiting are applied one by one
            waiting = [group for group in batch if not group.done()]
            if waiting:
                self.pipeline.observe.batch(len(items), False)
                log.info("a batch of %d records rolled back (a lane was cut short); applying "
                         "the other %d one by one", len(items),
                         sum(len(group.items) for group in waiting))
            for group in waiting:
                self.groups.deliver(group, RolledBack())
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
                if not group.done():
                    self.groups.deliver(group, outcome)
            return
        finally:
            task = asyncio.current_task()
            for group in batch:
                if group.owner is not None and task is not None:
                    group.owner.running.discard(task)
        if any(not claim.cached for claim in claims):  # a transaction ran
            self.pipeline.observe.batch(len(items), True)
        deadline = self.pipeline.handler_timeout
        if (self.limit < self.max_batch and len(items) >= self.limit and deadline is not None
                and time.monotonic() - started < deadline / 4):
            self._resize(min(self.max_batch, self.limit * 2))
        start = 0
        for group in batch:
            if not group.done():  # its lane was cancelled: its offsets stay uncommitted
                self.groups.deliver(group, claims[start:start + len(group.items)])
            start += len(group.items)

    def sweep(self) -> None:
        """Give up at once the submitted groups still waiting for a batch whose lanes were
        abandoned (a revocation, a stop), instead of when a batch would take them."""
        pending, self._pending = self._pending, deque()
        for group in pending:
            if group.future is None and group.abandon.is_set() and not group.concluded:
                self.groups.deliver(group, RolledBack())
            else:
                self._pending.append(group)

    def _resize(self, limit: int) -> None:
        if limit == self.limit:
            return
        if limit < self.limit:
            log.warning("a batch of %d records overran timeouts.handler: batches now hold at "
                        "most %d", self.limit, limit)
        self.limit = limit
        if self.on_limit is not None:
            self.on_limit(limit)

    async def close(self) -> None:
        """Cancel the batches still running (they roll back), the groups settling in tasks,
        and the gathering task."""
        self._closing = self.groups.closing = True
        tasks = [*self._running, *self.groups.running, *([self._runner] if self._runner else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for group in self._pending:
            self.groups.cancel(group)
        self._pending.clear()

