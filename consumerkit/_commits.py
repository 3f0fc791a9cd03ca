"""Offset commits: each owned partition's contiguous watermark, committed here and nowhere
else, never past a record still in flight."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping

from ._assignment import PartitionState
from .errors import TransportError
from .stats import ConsumerStats
from .transport.source import Partition, Source

log = logging.getLogger("consumerkit.consumer")
# every offset commit, when sent and when answered (with the engine's fetch traces, at DEBUG):
# what it takes to tell which commit went past a record that was never applied
trace = logging.getLogger("consumerkit.consumer.offsets")

COMMIT_TIMEOUT = 10.0  # an unreachable broker must not hang a revocation or a shutdown
COMMIT_RETRY_DELAY = 1.0


class Commits:
    """Commits the watermarks of ``states`` (the engine's partitions, kept up to date by it)
    whenever ``wanted`` is set, and when the engine asks (a revocation, a shutdown)."""

    def __init__(self, states: Mapping[Partition, PartitionState], stats: ConsumerStats,
                 ) -> None:
        self.states = states
        self.stats = stats
        self.source: Source | None = None
        self.wanted = asyncio.Event()  # a record finished: its partition may commit further
        self._lock = asyncio.Lock()

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            await self.wanted.wait()
            self.wanted.clear()
            if not await self.commit(list(self.states.values())):
                await asyncio.sleep(COMMIT_RETRY_DELAY)  # then try again, even if idle
                self.wanted.set()

    async def commit(self, states: Iterable[PartitionState]) -> bool:
        """Commit the contiguous watermark of each state; False if the broker refused or did
        not answer within ``COMMIT_TIMEOUT`` (the records are then simply read again)."""
        if self.source is None:
            return False
        async with self._lock:
            offsets = {s.partition: off for s in states
                       if (off := s.offsets.committable()) is not None}
            if not offsets:
                return True
            if trace.isEnabledFor(logging.DEBUG):
                # a process killed before the answer may have committed all the same
                trace.debug("committing %s", offsets_text(offsets))
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow our own cancel
                async with asyncio.timeout(COMMIT_TIMEOUT):
                    await self.source.commit(offsets)
            except (TransportError, TimeoutError) as exc:
                log.warning("offset commit failed (%s); it will be retried",
                            exc if str(exc) else type(exc).__name__)
                return False
            except Exception:  # never let the committer die silently
                log.exception("offset commit failed; it will be retried")
                return False
            for part, off in offsets.items():
                if (state := self.states.get(part)) is not None:
                    state.offsets.committed = off
            if trace.isEnabledFor(logging.DEBUG):
                trace.debug("committed %s", offsets_text(offsets))
            self.stats.commits += 1
            return True


def offsets_text(offsets: Mapping[Partition, int]) -> str:
    return " ".join(f"{topic}/{number}:{off}" for (topic, number), off in sorted(offsets.items()))
