"""Reading a partition again from a gap (:mod:`~consumerkit.offsets.sighting` says why), and
where an ownership's first fetch should have started."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from ..envelope import RecordLike
from ..stats import ConsumerStats
from ..transport.source import Partition, Source
from .sighting import Sighting, unbroken
from .state import PartitionState
from .store import COMMIT_TIMEOUT

log = logging.getLogger("consumerkit.consumer")
trace = logging.getLogger("consumerkit.consumer.offsets")


def through(part: Partition, state: PartitionState, records: Sequence[RecordLike],
            source: Source | None, stats: ConsumerStats) -> Sequence[RecordLike]:
    """The records of a fetch of ``part`` up to its first gap that neither the fetch before
    showed too nor the source explained (``state.skipped``); from that gap on, ``source``
    reads the partition again."""
    if (state.start is not None and state.offsets.watermark() is None
            and records[0].offset < state.start):
        # the first records of an ownership placed at the stored offset come from before it:
        # that offset was outside the log (retention deleted the records, a recreated topic),
        # and the client went where auto_offset_reset says, as for a committed offset
        log.warning("%s/%d: the stored offset %d is outside the log: reading from %d, where "
                    "the client's auto_offset_reset went", *part, state.start,
                    records[0].offset)
        state.start, state.outside, state.offsets.stored = records[0].offset, True, None
    seen, state.sighting = state.sighting, None
    if seen is not None and (hidden := seen.filled(records)):
        stats.hidden_records += hidden
        log.warning("%s/%d: records a second read returned where the first had a gap "
                    "(from offset %d): %d; the broker had hidden them", *part, seen.start,
                    hidden)
    count, again, explained = unbroken(records, state.fetched, seen, state.skipped)
    if explained:
        stats.gaps_explained += explained
        trace.debug("%s/%d: gaps passed at once, the client having skipped them (transaction "
                    "markers, aborted transactions): %d", *part, explained)
    if again is None:
        state.skipped.forget(records[-1].offset + 1)
        return records
    assert source is not None
    state.sighting = Sighting(again, [r.offset for r in records[count:]])
    source.seek(part, again)
    stats.gap_rereads += 1
    trace.debug("%s/%d: offsets missing from %d, read again", *part, again)
    state.skipped.forget(again)
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
