"""Where an ownership of a partition begins and ends: the rebalance callbacks, a rewind when
the database moved back, and the drain at stop. Each end follows one order: abandon queued
work, give running handlers a bounded time, cancel the rest, commit what is done."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..offsets.state import PartitionState
from ..offsets.tracker import Tracker
from ..parking.lot import ParkingLot
from ..stats import ConsumerStats
from ..transport.source import Partition, Source
from .batch import Batcher
from .lanes import KeyedExecutor, KeyedLanes
from .pipeline import Pipeline

log = logging.getLogger("consumerkit.consumer")


class Ownership:
    """The ownership half of :class:`~consumerkit.engine.runner.Engine` (which sets these)."""

    pipeline: Pipeline
    parking: ParkingLot | None
    batcher: Batcher | None
    executor: KeyedExecutor[Any] | None
    lanes: KeyedLanes[Any]
    _owners: dict[PartitionState, Any]
    revoke_timeout: float
    stats: ConsumerStats
    source: Source | None
    states: dict[Partition, PartitionState]
    joined: asyncio.Event
    in_flight: int
    stopping: asyncio.Event
    commits: Tracker
    _rewinds: set[asyncio.Task[None]]

    # called by the transport during a group rebalance

    async def on_assigned(self, partitions: list[Partition]) -> None:
        # always fresh: aiokafka resumes from the committed offset, unless the database
        # keeps the offsets (then from there, once read)
        placing = self.commits.database is not None
        fresh = [PartitionState(part, placing=placing) for part in partitions]
        for state in fresh:
            self.states[state.partition] = state
        if self.parking is not None:
            self.parking.assigned(partitions)
        await self.commits.place(fresh)
        self.joined.set()
        log.info("assigned %s", sorted(partitions))

    async def on_revoked(self, partitions: list[Partition]) -> None:
        """Abandon queued work of the revoked partitions, give running handlers
        ``revoke_timeout`` to finish, cancel the rest (they roll back; the new owner applies
        them), commit what is done, then forget the partitions."""
        if not partitions:
            return  # aiokafka announces an empty revocation before the first join
        states = [s for p in partitions if (s := self.states.get(p)) is not None]
        for state in states:
            state.abandon.set()
        if self.batcher is not None:
            self.batcher.sweep()  # their groups still waiting for a batch give up at once
        if not await _drained(states, self.revoke_timeout):
            log.warning("cancelling handlers of revoked partitions still busy after %.1fs",
                        self.revoke_timeout)
            for state in states:
                state.kill()
            await _drained(states, self.revoke_timeout / 2)
        await self.commits.commit(states)
        for state in states:
            self.states.pop(state.partition, None)
            self._owners.pop(state, None)
            self.pipeline.observe.lag(*state.partition, None)
        if self.parking is not None:
            self.parking.revoked(partitions)
        self.stats.revocations += 1
        log.info("revoked %s", sorted(partitions))

    def rewind(self, state: PartitionState, offset: int) -> None:
        """The database moved back under ``state``: end its ownership at once (its work is
        abandoned, nothing more of it is stored), and own the partition again from
        ``offset`` once that work has drained (as a revocation would leave it)."""
        state.rewound = True
        state.abandon.set()
        if self.batcher is not None:
            self.batcher.sweep()
        task = asyncio.create_task(self._own_again(state, offset))
        self._rewinds.add(task)
        task.add_done_callback(self._rewinds.discard)

    async def _own_again(self, state: PartitionState, offset: int) -> None:
        if not await _drained([state], self.revoke_timeout):
            state.kill()
            await _drained([state], self.revoke_timeout / 2)
        part = state.partition
        if self.states.get(part) is not state or self.stopping.is_set():
            return  # revoked meanwhile: its next owner reads from the stored offset
        again = PartitionState(part, start=offset, fetched=offset)
        again.offsets.stored = offset
        self._owners.pop(state, None)
        self.states[part] = again
        if self.source is not None:
            self.source.seek(part, offset)

    async def drain(self, timeout: float, force: asyncio.Event) -> None:
        """Stop dispatching, let running handlers finish (abandon waits and queued work),
        cancel what is still running after ``timeout`` or when ``force`` is set, commit."""
        for state in self.states.values():
            state.abandon.set()
        if self.batcher is not None:
            self.batcher.sweep()
        join = asyncio.ensure_future(self.lanes.join())
        forced = asyncio.ensure_future(force.wait())
        done, _ = await asyncio.wait({join, forced}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        forced.cancel()
        if join not in done:
            join.cancel()
            log.warning("cancelling %d in-flight messages at shutdown", self.in_flight)
            if self.executor is not None:
                await self.executor.cancel()
        if self.batcher is not None:
            await self.batcher.close()
        await self.commits.commit(list(self.states.values()))


async def _drained(states: list[PartitionState], timeout: float) -> bool:
    """Wait until none of ``states`` has work in flight; False after ``timeout``."""
    waits = [asyncio.ensure_future(s.drained.wait()) for s in states]
    if not waits:
        return True
    _, late = await asyncio.wait(waits, timeout=timeout)
    for task in late:
        task.cancel()
    return not late
