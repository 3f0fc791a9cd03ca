"""The first step of a record's path: fetch a poll's records, note the ownership of each
partition they belong to, and ask the dedup cache once which were applied before."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..envelope import RecordLike
from ..offsets.state import PartitionState
from ..transport.source import Partition, Source
from .pipeline import Pipeline

# each ownership's first offset, jumps between fetches and dropped fetches, at DEBUG (with the
# commits): what it takes to tell which commit went past a record that was never applied
trace = logging.getLogger("consumerkit.consumer.offsets")

Fetched = tuple[dict[Partition, list[RecordLike]], dict[Partition, PartitionState | None]]
"""Records fetched, and the state of each partition when they came."""


async def fetch_records(source: Source, states: dict[Partition, PartitionState],
                        poll_timeout_ms: int, max_records: int) -> Fetched:
    """Fetch, and note which ownership of each partition the records belong to, in the
    same step (no await between): a rebalance can come before they are dispatched (the
    cache lookup awaits), and they must not reach the next ownership's lanes."""
    fetched = await source.fetch(poll_timeout_ms, max_records)
    for part, ranges in source.skipped().items():
        # facts about the log: kept by whichever ownership reads the partition now
        if (state := states.get(part)) is not None:
            state.skipped.add(ranges)
    for part in list(fetched):
        state = states.get(part)
        if state is not None and state.placing:
            # fetched before the ownership's stored offset is read: dropped now, not at
            # dispatch (after awaits, by which time the seek may have come and gone)
            records = fetched.pop(part)
            if records and state.first_seen is None:
                state.first_seen = records[0].offset
    return fetched, {part: states.get(part) for part in fetched}


async def known_offsets(
    pipeline: Pipeline, fetched: dict[Partition, list[RecordLike]],
) -> dict[Partition, set[int]]:
    """Offsets of the records of ``fetched`` whose event ids the dedup cache knows were
    applied: one lookup per poll, before anything is decoded."""
    if pipeline.cache is None:
        return {}
    event_id = pipeline.decoder.event_id
    ids: list[str] = []
    where: list[tuple[Partition, int]] = []
    for part, records in fetched.items():
        for record in records:
            if (i := event_id(record)) is not None:
                ids.append(i)
                where.append((part, record.offset))
    known = await pipeline.applier.known(ids)
    offsets: dict[Partition, set[int]] = {}
    for i, (part, offset) in zip(ids, where, strict=True):
        if i in known:
            offsets.setdefault(part, set()).add(offset)
    return offsets


def trace_fetch(part: Partition, fetched: int | None, records: Sequence[RecordLike]) -> None:
    """Log where a fetch leaves offsets out (transaction markers do, on a topic written in
    transactions)."""
    first, last = records[0].offset, records[-1].offset
    if fetched is not None and first != fetched:
        trace.debug("%s/%d: offsets jump from %d to %d", *part, fetched, first)
    if last - first + 1 != len(records):
        trace.debug("%s/%d: %d records fetched between offsets %d and %d", *part,
                    len(records), first, last)
