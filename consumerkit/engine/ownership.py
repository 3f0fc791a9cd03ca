"""Where an ownership of a partition begins and ends: the rebalance callbacks, a rewind when
the database moved back, and the drain at stop. Each end follows one order: abandon queued
work, give running handlers a bounded time, cancel the rest, commit what is done."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..offsets.state import PartitionState
from ..transport.source import Partition

if TYPE_CHECKING:
    from .runner import Engine

log = logging.getLogger("consumerkit.consumer")


class Ownership:
    """Begins and ends the ownerships of ``engine``'s partitions: it calls the rebalance
    callbacks, :meth:`rewind` and :meth:`drain` here."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._rewinds: set[asyncio.Task[None]] = set()

    def cancel_rewinds(self) -> None:
        """The run ends: the partitions waiting to be owned again are not."""
        for task in self._rewinds:
            task.cancel()

    # called by the transport (through the engine) during a group rebalance

    async def on_assigned(self, partitions: list[Partition]) -> None:
        # always fresh: aiokafka resumes from the committed offset, unless the database
        # keeps the offsets (then from there, once read)
        placing = self.engine.commits.database is not None
        fresh = [PartitionState(part, placing=placing) for part in partitions]
        for state in fresh:
            self.engine.states[state.partition] = state
        if self.engine.parking is not None:
            self.engine.parking.assigned(partitions)
        await self.engine.commits.place(fresh)
        self.engine.joined.set()
        log.info("assigned %s", sorted(partitions))

    async def on_revoked(self, partitions: list[Partition]) -> None:
        """Abandon queued work of the revoked partitions, give running handlers
        ``revoke_timeout`` to finish, cancel the rest (they roll back; the new owner applies
        them), commit what is done, then forget the partitions."""
        if not partitions:
            return  # aiokafka announces an empty revocation before the first join
        states = [s for p in partitions if (s := self.engine.states.get(p)) is not None]
        for state in states:
            state.abandon.set()
        if self.engine.batcher is not None:
            self.engine.batcher.sweep()  # their groups still waiting for a batch give up at once
        if not await _drained(states, self.engine.revoke_timeout):
            log.warning("cancelling handlers of revoked partitions still busy after %.1fs",
                        self.engine.revoke_timeout)
            for state in states:
                state.kill()
            await _drained(states, self.engine.revoke_timeout / 2)
        await self.engine.commits.commit(states)
        for state in states:
            self.engine.states.pop(state.partition, None)
            self.engine.owners.pop(state, None)
            self.engine.pipeline.observe.lag(*state.partition, None)
        if self.engine.parking is not None:
            self.engine.parking.revoked(partitions)
        self.engine.stats.revocations += 1
        log.info("revoked %s", sorted(partitions))

    def rewind(self, state: PartitionState, offset: int) -> None:
        """The database moved back under ``state``: end its ownership at once (its work is
        abandoned, nothing more of it is stored), and own the partition again from
        ``offset`` once that work has drained (as a revocation would leave it)."""
        state.rewound = True
        state.abandon.set()
        if self.engine.batcher is not None:
            self.engine.batcher.sweep()
        task = asyncio.create_task(self._own_again(state, offset))
        self._rewinds.add(task)
        task.add_done_callback(self._rewinds.discard)

    async def _own_again(self, state: PartitionState, offset: int) -> None:
        if not await _drained([state], self.engine.revoke_timeout):
            state.kill()
            await _drained([state], self.engine.revoke_timeout / 2)
        part = state.partition
        if self.engine.states.get(part) is not state or self.engine.stopping.is_set():
            return  # revoked meanwhile: its next owner reads from the stored offset
        again = PartitionState(part, start=offset, fetched=offset)
        again.offsets.stored = offset
        self.engine.owners.pop(state, None)
        self.engine.states[part] = again
        if self.engine.source is not None:
            self.engine.source.seek(part, offset)

    async def drain(self, timeout: float, force: asyncio.Event) -> None:
        """Stop dispatching, let running handlers finish (abandon waits and queued work),
        cancel what is still running after ``timeout`` or when ``force`` is set, commit."""
        for state in self.engine.states.values():
            state.abandon.set()
        if self.engine.batcher is not None:
            self.engine.batcher.sweep()
        join = asyncio.ensure_future(self.engine.lanes.join())
        forced = asyncio.ensure_future(force.wait())
        done, _ = await asyncio.wait({join, forced}, timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        forced.cancel()
        if join not in done:
            join.cancel()
            log.warning("cancelling %d in-flight messages at shutdown", self.engine.in_flight)
            if self.engine.executor is not None:
                await self.engine.executor.cancel()
        if self.engine.batcher is not None:
            await self.engine.batcher.close()
        await self.engine.commits.commit(list(self.engine.states.values()))


async def _drained(states: list[PartitionState], timeout: float) -> bool:
    """Wait until none of ``states`` has work in flight; False after ``timeout``."""
    waits = [asyncio.ensure_future(s.drained.wait()) for s in states]
    if not waits:
        return True
    _, late = await asyncio.wait(waits, timeout=timeout)
    for task in late:
        task.cancel()
    return not late
