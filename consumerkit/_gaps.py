"""Offsets a fetch leaves out are read a second time before the engine goes past them.

Kafka leaves offsets out of a partition's records for good reasons: transaction markers,
aborted transactions, compaction. A broker can also leave them out by mistake. Tansu 0.6.0
advances a partition's high watermark before it writes the batch under it, and a fetch in
between returns the later batches without that one (docs/torture-long.md, finding 4). A
consumer that goes on after what it was given never reads that batch, and once it commits past
it, neither does the group: the records are lost.

So the engine goes past missing offsets only when two fetches agree that they are missing. On
a gap it dispatches the records before it, reads the partition again from the gap, and keeps
what the first fetch returned (a :class:`Sighting`) to compare with. A gap costs one more
fetch; a fetch without gaps costs two comparisons.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._commits import COMMIT_TIMEOUT
from .envelope import RecordLike

if TYPE_CHECKING:
    from ._assignment import PartitionState
    from .stats import ConsumerStats
    from .transport.source import Partition, Source

log = logging.getLogger("consumerkit.consumer")
trace = logging.getLogger("consumerkit.consumer.offsets")


@dataclass(slots=True, frozen=True)
class Sighting:
    """What a fetch returned from a gap on: the gap's first offset and the offsets after it,
    increasing."""

    start: int
    offsets: Sequence[int]

    def agrees(self, first: int, after: int) -> bool:
        """Whether this fetch also lacked ``first`` to ``after - 1`` and held ``after``, or
        the second read began past all it held (the client's position was reset, its
        offset out of range: a broker never hides what it has shown)."""
        if first < self.start:
            return False
        if first == self.start and self.offsets and after > self.offsets[-1]:
            return True
        i = bisect_left(self.offsets, after)
        if i == len(self.offsets) or self.offsets[i] != after:
            return False
        return i == 0 or self.offsets[i - 1] < first

    def filled(self, records: Sequence[RecordLike]) -> int:
        """How many of ``records`` (read again from :attr:`start`) sit where this fetch had
        a gap: records the broker had left out."""
        if not self.offsets:
            return 0
        last, seen = self.offsets[-1], set(self.offsets)
        return sum(1 for r in records if r.offset < last and r.offset not in seen)


def unbroken(records: Sequence[RecordLike], expected: int | None,
             seen: Sighting | None) -> tuple[int, int | None]:
    """How many of ``records`` (one partition's fetch, offsets increasing) come before the
    first gap not yet confirmed, and that gap's first offset (``None``: no such gap).

    ``expected`` is the offset the fetch should start at (``None``: not known, as at a new
    group's first fetch); ``seen`` is the sighting of the fetch before, if that one stopped
    at a gap."""
    if not records:
        return 0, None
    first, last = records[0].offset, records[-1].offset
    if expected is not None and first < expected:
        expected = None  # a committed offset that moved after the fetch began: trust the fetch
    if (expected is None or first == expected) and last - first + 1 == len(records):
        return len(records), None  # the usual case: contiguous
    for i, record in enumerate(records):
        offset = record.offset
        if expected is not None and offset != expected and (
                seen is None or not seen.agrees(expected, offset)):
            return i, expected
        expected = offset + 1
    return len(records), None


def through(part: Partition, state: PartitionState, records: Sequence[RecordLike],
            source: Source | None, stats: ConsumerStats) -> Sequence[RecordLike]:
    """The records of a fetch of ``part`` up to its first gap that the fetch before did not
    show too; from that gap on, ``source`` reads the partition again."""
    seen, state.sighting = state.sighting, None
    if seen is not None and (hidden := seen.filled(records)):
        stats.hidden_records += hidden
        log.warning("%s/%d: records a second read returned where the first had a gap "
                    "(from offset %d): %d; the broker had hidden them", *part, seen.start,
                    hidden)
    count, again = unbroken(records, state.fetched, seen)
    if again is None:
        return records
    assert source is not None
    state.sighting = Sighting(again, [r.offset for r in records[count:]])
    source.seek(part, again)
    stats.gap_rereads += 1
    trace.debug("%s/%d: offsets missing from %d, read again", *part, again)
    return records[:count]


async def first_offsets(
    source: Source, fetched: dict[Partition, list[RecordLike]],
    owners: dict[Partition, PartitionState | None], stop: asyncio.Future[Any],
) -> None:
    """Where an ownership's first fetch should have started: the group's committed offset,
    so a gap at its very start is read again too. Without an answer in time, or when
    stopping, the fetch is taken as it came."""
    first = [(part, state) for part, state in owners.items()
             if state is not None and state.fetched is None]
    if not first:
        return
    lookup = asyncio.gather(*(source.committed(part) for part, _ in first),
                            return_exceptions=True)
    await asyncio.wait({lookup, stop}, timeout=COMMIT_TIMEOUT,
                       return_when=asyncio.FIRST_COMPLETED)
    if not lookup.done():
        lookup.cancel()
        await asyncio.gather(lookup, return_exceptions=True)
        if stop.done():
            return  # the records are dropped: nobody dispatches while stopping
    answers: list[object] = (
        list(lookup.result()) if not lookup.cancelled()
        else [TimeoutError("no answer in time")] * len(first))
    for (part, state), offset in zip(first, answers, strict=True):
        if isinstance(offset, int):
            state.fetched = offset
        elif isinstance(offset, BaseException):
            log.warning("%s/%d: cannot read the committed offset (%r): the first fetch of this "
                        "ownership is taken as it came", *part, offset)
        if trace.isEnabledFor(logging.DEBUG):  # None: nothing committed yet
            trace.debug("%s/%d: first offset of this ownership %d (committed: %s)", *part,
                        fetched[part][0].offset,
                        offset if offset is None or isinstance(offset, int) else "unknown")
