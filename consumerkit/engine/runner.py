"""The running loop of a consumer: fetch, hand records to keyed lanes, and have the
watermarks committed (:mod:`~consumerkit.offsets.tracker`); rebalances are followed in
:mod:`~consumerkit.engine.ownership`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Hashable, Sequence
from functools import partial
from typing import Any

from ..envelope import RecordLike
from ..offsets import gaps as _gaps
from ..offsets.state import PartitionState
from ..offsets.tracker import Tracker
from ..parking.lot import ParkingLot
from ..shared import faults
from ..stats import ConsumerStats
from ..transport.source import Partition, Source
from .batch import Batcher
from .fetch import Fetched, fetch_records, known_offsets, trace, trace_fetch
from .lanes import KeyedExecutor, KeyedLanes
from .ownership import Ownership
from .pipeline import Outcome, Pipeline

log = logging.getLogger("consumerkit.consumer")


class Engine:
    """Owns the partition states, their keyed lanes and the offset commits; what begins and
    ends an ownership (rebalances, rewinds, the drain at stop) is :class:`Ownership`."""

    def __init__(
        self, *, pipeline: Pipeline, max_in_flight: int, batch_size: int, max_batch: int,
        revoke_timeout: float, keepalive: float, stats: ConsumerStats,
        poll_timeout_ms: int = 100, parking: ParkingLot | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.parking = parking  # told of assignments: a partition's parked keys load then
        # with max_batch 1 every record has a transaction (and a task) of its own, else lanes
        # hand groups of records to the batcher, which applies the groups of many lanes in
        # one transaction
        self.batcher = Batcher(pipeline, max_batch) if max_batch > 1 else None
        self.executor: KeyedExecutor[RecordLike] | None = None
        self.lanes: KeyedLanes[RecordLike]
        if self.batcher is None:
            # lanes never outnumber records in flight; the pipeline bounds transactions
            self.lanes = self.executor = KeyedExecutor(self._run_group, max_in_flight)
        else:
            self.lanes = KeyedLanes(self._start_group, max_group=max_batch)
            # a lane's group never outgrows the batches
            self.batcher.on_limit = partial(setattr, self.lanes, "max_group")
        self.owners: dict[PartitionState, _Owner] = {}  # the batcher's view of each partition
        self.max_in_flight = max_in_flight
        self.batch_size = batch_size
        self.revoke_timeout = revoke_timeout
        self.keepalive = keepalive
        self.stats = stats
        self.poll_timeout_ms = poll_timeout_ms
        self.source: Source | None = None
        self.states: dict[Partition, PartitionState] = {}
        self.joined = asyncio.Event()  # the first assignment came (even an empty one)
        self.in_flight = 0
        self.stopping = asyncio.Event()
        self.commits = Tracker(self.states, stats)
        self._room = asyncio.Event()
        if pipeline.breaker is not None:  # a stall that begins or ends: look at the room again
            pipeline.breaker.on_change = self._room.set
        self.ownership = Ownership(self)

    # -- where ownerships begin and end (:class:`Ownership`) --------------------------------

    async def on_assigned(self, partitions: list[Partition]) -> None:
        await self.ownership.on_assigned(partitions)

    async def on_revoked(self, partitions: list[Partition]) -> None:
        await self.ownership.on_revoked(partitions)

    def rewind(self, state: PartitionState, offset: int) -> None:
        self.ownership.rewind(state, offset)

    async def drain(self, timeout: float, force: asyncio.Event) -> None:
        await self.ownership.drain(timeout, force)

    # -- the fetch loop ---------------------------------------------------------------------

    async def run(self, source: Source) -> None:
        """Fetch and dispatch until ``stopping`` is set; raise a lane's failure if one broke.
        With ``max_in_flight`` records in flight, or stalled (:mod:`~consumerkit.engine.stall`), it
        waits for room; if none comes within ``keepalive`` seconds it polls with every
        partition paused, so the member stays in its group (pausing drops prefetched records,
        hence only then)."""
        self.source = self.commits.source = source
        committer = asyncio.create_task(self.commits.run(self.stopping),
                                        name="consumerkit-commit")
        stop = asyncio.ensure_future(self.stopping.wait())
        fetch: asyncio.Future[Fetched] | None = None
        try:
            while not self.stopping.is_set():
                self._raise_bug()
                room = self.max_in_flight - self.in_flight
                if self.pipeline.breaker is not None and self.pipeline.breaker.holding():
                    room = 0  # stalled: no new records until the probe gets through
                if room <= 0 and await self._room_within(self.keepalive, stop):
                    continue
                source.pause(room <= 0)
                fetch = asyncio.ensure_future(
                    fetch_records(source, self.states, self.poll_timeout_ms,
                                  max(1, min(room, self.batch_size))))
                await asyncio.wait({fetch, stop}, return_when=asyncio.FIRST_COMPLETED)
                if not fetch.done():  # stopping: do not wait for a rebalance or a fetch
                    break
                fetched, owners = fetch.result()
                await _gaps.first_offsets(source, fetched, owners, stop)
                known = await known_offsets(self.pipeline, fetched)
                if self._put_back(fetched, owners):
                    continue
                for part, records in fetched.items():
                    self._dispatch(part, records, owners[part], known.get(part, ()))
        finally:
            self.ownership.cancel_rewinds()
            for task in (fetch, stop, committer):
                if task is not None:
                    task.cancel()
            await asyncio.gather(*(t for t in (fetch, stop, committer) if t is not None),
                                 return_exceptions=True)
        self._raise_bug()

    def _put_back(self, fetched: dict[Partition, list[RecordLike]],
                  owners: dict[Partition, PartitionState | None]) -> bool:
        """Whether a stall began while ``fetched`` was on its way (records published after
        it can come in a fetch already waiting): they are read again once it is over."""
        breaker = self.pipeline.breaker
        if breaker is None or not breaker.holding():
            return False
        assert self.source is not None
        for part, records in fetched.items():
            state = self.states.get(part)
            if records and state is owners[part] and state is not None and (
                    not state.abandon.is_set()):
                self.source.seek(part, records[0].offset)
        return True

    def _raise_bug(self) -> None:
        """Raise what broke a lane (a bug), if anything did."""
        if self.lanes.errors:
            raise self.lanes.errors[0]
        if self.batcher is not None and self.batcher.errors:
            raise self.batcher.errors[0]

    async def _room_within(self, timeout: float, stop: asyncio.Future[Any]) -> bool:
        """Wait until a record settles or we stop; False if ``timeout`` passed first."""
        self._room.clear()
        room: asyncio.Future[Any] = asyncio.ensure_future(self._room.wait())
        done, _ = await asyncio.wait({room, stop}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        room.cancel()
        return bool(done)

    def _dispatch(
        self, part: Partition, records: Sequence[RecordLike], owner: PartitionState | None,
        known: Collection[int] = (),
    ) -> None:
        state = self.states.get(part)
        if (state is None or state is not owner or state.abandon.is_set()
                or self.stopping.is_set()):
            # fetched before a revocation or a stop: read again from the commit. Given to a
            # later ownership they would start its watermark past the records still
            # uncommitted before them, and run ahead of them (lost and reordered)
            if records and trace.isEnabledFor(logging.DEBUG):
                trace.debug("%s/%d: dropped offsets %d-%d, fetched for an ownership that "
                            "ended", *part, records[0].offset, records[-1].offset)
            return
        if records:
            if trace.isEnabledFor(logging.DEBUG):
                trace_fetch(part, state.fetched, records)
            records = _gaps.through(part, state, records, self.source, self.stats)
        if records:
            state.fetched = records[-1].offset + 1
        for record in records:
            state.submitted(record.offset)
            if record.offset in known:
                # applied before (the cache holds committed ids only): settled at once, with
                # no lane; the watermark still waits for earlier records of the partition
                observe = self.pipeline.observe
                observe.delivered(1)
                observe.cache_hits(1)
                observe.duplicate(record, None, "", None)
                state.offsets.finished(record.offset)
                state.settled()
                self.commits.wanted.set()
                continue
            if faults.inject("offset_before_commit"):
                state.offsets.finished(record.offset)  # broken on purpose: see faults
                self.commits.wanted.set()
            self.in_flight += 1
            # one lane per key of this ownership of the partition: a zombie left by an earlier
            # ownership never holds up (or breaks) the lanes of the current one
            lane = record.key
            if faults.inject("lanes_ignore_key"):
                lane = str(record.offset % 8).encode()  # broken on purpose: see faults
            self.lanes.submit((state, lane), record)

    def _start_group(self, lane: Hashable, records: list[RecordLike]) -> None:
        """A lane's next group, to the batcher (with batches)."""
        assert self.batcher is not None
        state: PartitionState = lane[0]  # type: ignore[index]
        owner = self.owners.get(state)
        if owner is None:
            owner = self.owners[state] = _Owner(self, state)
        self.batcher.submit(lane, records, owner)

    def _group_finished(self, state: PartitionState, lane: Hashable,
                        records: list[RecordLike]) -> None:
        """Every record of a batcher's group has its outcome: free its place, and go on with
        its lane (or, the partition revoked, give up the rest of the lane)."""
        count = len(records)
        if state.abandon.is_set():
            count += self.lanes.drop(lane)
        else:
            self.lanes.done(lane)
        state.settled(count)
        self.in_flight -= count
        self._room.set()

    async def _run_group(self, lane: Hashable, records: list[RecordLike]) -> None:
        """A lane's next group (one record), in a task of its own (without batches)."""
        state = lane[0]  # type: ignore[index]
        assert isinstance(state, PartitionState)
        task = asyncio.current_task()
        assert task is not None
        state.running.add(task)
        report = partial(self._report, state)
        try:
            if state.abandon.is_set():
                return
            running: RecordLike | None = None
            try:
                for running in records:
                    report(running, await self.pipeline.process(running, state.abandon))
            except asyncio.CancelledError:
                if running is not None:  # the record cut short
                    self.pipeline.observe.abandoned((running,))
                if not state.killed or task.cancelling() > 1:
                    raise
                task.uncancel()  # only these records were cut short: their lane goes on
                return
        finally:
            state.running.discard(task)
            for _ in records:
                state.settled()
            self.in_flight -= len(records)
            self._room.set()

    def _report(self, state: PartitionState, record: RecordLike, outcome: Outcome) -> None:
        if outcome is not Outcome.ABANDONED:
            state.offsets.finished(record.offset)
            self.commits.wanted.set()

class _Owner:
    """A partition's lanes, as the batcher sees them (:class:`~consumerkit.engine.batch.Owner`)."""

    __slots__ = ("abandon", "engine", "running", "state")

    def __init__(self, engine: Engine, state: PartitionState) -> None:
        self.engine = engine
        self.state = state
        self.abandon = state.abandon
        self.running = state.running

    def report(self, record: RecordLike, outcome: Outcome) -> None:
        self.engine._report(self.state, record, outcome)

    def finished(self, lane: Hashable, records: list[RecordLike]) -> None:
        self.engine._group_finished(self.state, lane, records)
