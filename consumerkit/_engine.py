"""The running loop of a consumer: fetch, hand records to keyed lanes, commit watermarks,
and follow rebalances. Offsets are committed here and nowhere else."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from functools import partial

from ._assignment import PartitionState
from ._ordering import KeyedExecutor
from ._pipeline import Outcome, Pipeline
from .envelope import RecordLike
from .errors import TransportError
from .stats import ConsumerStats
from .transport.kafka import KafkaSource, Partition

log = logging.getLogger("consumerkit.consumer")


class Engine:
    """Owns the partition states, the keyed executor and the offset commits."""

    def __init__(
        self, *, pipeline: Pipeline, max_in_flight: int, batch_size: int,
        revoke_timeout: float, stats: ConsumerStats, poll_timeout_ms: int = 100,
    ) -> None:
        self.pipeline = pipeline
        # lanes never outnumber records in flight; the pipeline bounds transactions
        self.executor = KeyedExecutor(max_in_flight)
        self.max_in_flight = max_in_flight
        self.batch_size = batch_size
        self.revoke_timeout = revoke_timeout
        self.stats = stats
        self.poll_timeout_ms = poll_timeout_ms
        self.source: KafkaSource | None = None
        self.states: dict[Partition, PartitionState] = {}
        self.in_flight = 0
        self.stopping = asyncio.Event()
        self.assigned = asyncio.Event()
        self._room = asyncio.Event()
        self._commit_wanted = asyncio.Event()
        self._commit_lock = asyncio.Lock()

    # -- rebalance callbacks (called by the transport during a group rebalance) ------------

    async def on_assigned(self, partitions: list[Partition]) -> None:
        for part in partitions:
            self.states.setdefault(part, PartitionState(part))
        log.info("assigned %s", sorted(partitions))
        self.assigned.set()

    async def on_revoked(self, partitions: list[Partition]) -> None:
        """Abandon queued work of the revoked partitions, let running handlers finish, commit
        what is done, then forget the partitions (the new owner resumes from the commit)."""
        states = [s for p in partitions if (s := self.states.get(p)) is not None]
        for state in states:
            state.abandon.set()
        drained = [asyncio.ensure_future(s.drained.wait()) for s in states]
        if drained:
            _, late = await asyncio.wait(drained, timeout=self.revoke_timeout)
            for task in late:
                task.cancel()
            if late:
                log.warning("%d revoked partitions still busy after %.1fs", len(late),
                            self.revoke_timeout)
        await self.commit(states)
        for state in states:
            self.states.pop(state.partition, None)
        log.info("revoked %s", sorted(partitions))

    # -- the fetch loop ---------------------------------------------------------------------

    async def run(self, source: KafkaSource) -> None:
        """Fetch and dispatch until ``stopping`` is set; raise a lane's failure if one broke."""
        self.source = source
        committer = asyncio.create_task(self._commit_loop(), name="consumerkit-commit")
        try:
            while not self.stopping.is_set():
                if self.executor.errors:
                    raise self.executor.errors[0]
                room = self.max_in_flight - self.in_flight
                if room <= 0:
                    self._room.clear()
                    await self._room.wait()
                    continue
                batches = await source.fetch(self.poll_timeout_ms, min(room, self.batch_size))
                for part, records in batches.items():
                    self._dispatch(part, records)
        finally:
            committer.cancel()
            await asyncio.gather(committer, return_exceptions=True)
        if self.executor.errors:
            raise self.executor.errors[0]

    def _dispatch(self, part: Partition, records: Iterable[RecordLike]) -> None:
        state = self.states.get(part)
        if state is None or state.abandon.is_set():
            return  # fetched before a revocation: the new owner reads these again
        for record in records:
            state.submitted(record.offset)
            self.in_flight += 1
            lane = (record.topic, record.partition, record.key)
            self.executor.submit(lane, partial(self._job, state, record))

    async def _job(self, state: PartitionState, record: RecordLike) -> None:
        try:
            if state.abandon.is_set():
                return
            outcome = await self.pipeline.process(record, state.abandon)
            if outcome is not Outcome.ABANDONED:
                state.offsets.finished(record.offset)
                self._commit_wanted.set()
        finally:
            state.settled()
            self.in_flight -= 1
            self._room.set()

    def wake(self) -> None:
        """Unblock the fetch loop (used when stopping)."""
        self._room.set()

    # -- offsets ----------------------------------------------------------------------------

    async def _commit_loop(self) -> None:
        while True:
            await self._commit_wanted.wait()
            self._commit_wanted.clear()
            await self.commit(list(self.states.values()))

    async def commit(self, states: Iterable[PartitionState]) -> bool:
        """Commit the contiguous watermark of each state; False if the broker refused."""
        if self.source is None:
            return False
        async with self._commit_lock:
            offsets = {s.partition: off for s in states
                       if (off := s.offsets.committable()) is not None}
            if not offsets:
                return True
            try:
                await self.source.commit(offsets)
            except TransportError as exc:
                log.warning("%s; it is retried with the next commit", exc)
                return False
            for part, off in offsets.items():
                if (state := self.states.get(part)) is not None:
                    state.offsets.committed = off
            self.stats.commits += 1
            return True

    async def drain(self, timeout: float, force: asyncio.Event) -> None:
        """Stop dispatching, let running handlers finish (abandon waits and queued work),
        cancel what is still running after ``timeout`` or when ``force`` is set, commit."""
        for state in self.states.values():
            state.abandon.set()
        join = asyncio.ensure_future(self.executor.join())
        forced = asyncio.ensure_future(force.wait())
        done, _ = await asyncio.wait({join, forced}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        forced.cancel()
        if join not in done:
            join.cancel()
            log.warning("cancelling %d in-flight messages at shutdown", self.in_flight)
            await self.executor.cancel()
        await self.commit(list(self.states.values()))
