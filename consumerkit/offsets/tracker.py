"""Offset commits: each owned partition's contiguous watermark, committed here and nowhere
else, never past a record still in flight; and where a new ownership starts reading."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping

import asyncpg

from ..errors import TransportError
from ..stats import ConsumerStats
from ..transport.source import Partition, Source
from .postgres import PostgresOffsets
from .recheck import Recheck, Rewound
from .state import PartitionState
from .store import COMMIT_TIMEOUT

log = logging.getLogger("consumerkit.consumer")
# every offset commit, when sent and when answered (with the engine's fetch traces, at DEBUG):
# what it takes to tell which commit went past a record that was never applied
trace = logging.getLogger("consumerkit.consumer.offsets")

COMMIT_RETRY_DELAY = 1.0
# what a store that cannot be reached raises: the commit is tried again later
_UNREACHABLE = (TransportError, TimeoutError, OSError, asyncpg.PostgresError,
                asyncpg.InterfaceError)


class Tracker:
    """Commits the watermarks of ``states`` (the engine's partitions, kept up to date by it)
    whenever ``wanted`` is set, and when the engine asks (a revocation, a shutdown): to the
    database first when it keeps the offsets (``database``), then to the broker, so lag tools
    see them. A partition whose ownership the database moved back stores nothing more."""

    def __init__(self, states: Mapping[Partition, PartitionState], stats: ConsumerStats,
                 ) -> None:
        self.states = states
        self.stats = stats
        self.source: Source | None = None
        self.database: PostgresOffsets | None = None  # set when offset_store="postgres"
        self.recheck: Recheck | None = None  # with the database: its moved-back check
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
        """Commit the contiguous watermark of each state; False if a store refused or did
        not answer within ``COMMIT_TIMEOUT`` (the records are then simply read again)."""
        if self.source is None:
            return False
        states = list(states)
        async with self._lock:
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow our own cancel
                async with asyncio.timeout(COMMIT_TIMEOUT):
                    offsets = await self._store(states)
                    if not offsets:
                        return True
                    if trace.isEnabledFor(logging.DEBUG):
                        # a process killed before the answer may have committed all the same
                        trace.debug("committing %s", offsets_text(offsets))
                    await self.source.commit(offsets)
            except _UNREACHABLE as exc:
                log.warning("offset commit failed (%s); it will be retried",
                            exc if str(exc) else type(exc).__name__)
                return False
            except Rewound as exc:  # the check now owed reads the partition again
                log.warning("offset commit abandoned: %s", exc)
                return False
            except Exception:  # never let the committer die silently
                log.exception("offset commit failed; it will be retried")
                return False
            # the states the offsets came from: one owned anew meanwhile (revoked and
            # assigned, or rewound) commits from its own offsets, not these
            for state in states:
                if state.partition in offsets:
                    state.offsets.committed = offsets[state.partition]
            if trace.isEnabledFor(logging.DEBUG):
                trace.debug("committed %s", offsets_text(offsets))
            self.stats.commits += 1
            return True

    async def _store(self, states: list[PartitionState]) -> dict[Partition, int]:
        """The offsets to commit to the broker, stored in the database first if it keeps
        them. The watermarks are read after the moved-back check, on the connection that
        stores them: a watermark read before could claim records the database lost."""
        if self.database is None:
            return _committable(states)
        async with self.database.pool.acquire() as conn:
            if self.recheck is not None:
                await self.recheck.ready(conn)
            offsets = _committable(states)
            behind = {s.partition: offsets[s.partition] for s in states
                      if s.partition in offsets
                      and (s.offsets.stored is None or s.offsets.stored < offsets[s.partition])}
            outside = {s.partition for s in states if s.outside}
            # in a transaction: a row found gone back must not keep a watermark from memory
            async with conn.transaction():
                counts = await self.database.write_in(conn, behind, reset=outside)
                if self.recheck is not None:
                    self.recheck.went_back(states, counts)
        for state in states:
            if state.partition in behind:
                state.offsets.confirmed(behind[state.partition], counts[state.partition])
                state.outside = False
        return offsets

    async def place(self, states: list[PartitionState]) -> None:
        """Where each new ownership (made with ``placing`` set) starts: the offset the
        database holds, or where the broker started it where the database holds none (an
        offset outside the log: see :func:`~consumerkit.offsets.gaps.through`).
        Without an answer in time the ownerships start from the broker's offsets, and the
        moved-back check places them before any of their records is applied."""
        if self.database is None or self.source is None or not states:
            return
        parts = [s.partition for s in states]
        try:
            async with asyncio.timeout(COMMIT_TIMEOUT):
                async with self.database.pool.acquire() as conn:
                    stored = await self.database.rows(conn, parts)
        except Exception as exc:  # whatever broke, the ownerships must not stay placing
            # (their records would be dropped at every fetch): the check places them
            log.warning("cannot read the stored offsets of %s (%r): they are read again before "
                        "anything of them is applied", sorted(parts), exc)
            stored = {}
            if self.recheck is not None:
                for state in states:
                    state.placed = False
                self.recheck.lost()
        for state in states:  # no await from here: nothing is fetched in between
            state.placing = False
            part, row = state.partition, stored.get(state.partition)
            if row is None:
                if state.first_seen is not None:  # dropped while placing: read them again
                    self.source.seek(part, state.first_seen)
                continue
            start = row[0]
            state.offsets.confirmed(*row)
            state.start = state.fetched = start
            self.source.seek(part, start)
            if trace.isEnabledFor(logging.DEBUG):
                trace.debug("%s/%d: starting at the stored offset %d", *part, start)


def _committable(states: Iterable[PartitionState]) -> dict[Partition, int]:
    return {s.partition: off for s in states
            if not s.rewound and (off := s.offsets.committable()) is not None}


def offsets_text(offsets: Mapping[Partition, int]) -> str:
    return " ".join(f"{topic}/{number}:{off}" for (topic, number), off in sorted(offsets.items()))
