"""Offsets a fetch leaves out are read a second time before the engine goes past them.

Kafka leaves offsets out of a partition's records for good reasons: transaction markers,
aborted transactions, compaction. A broker can also leave them out by mistake. Tansu 0.6.0
advances a partition's high watermark before it writes the batch under it, and a fetch in
between returns the later batches without that one (docs/torture-long.md, finding 4). A
consumer that goes on after what it was given never reads that batch, and once it commits past
it, neither does the group: the records are lost.

So the engine goes past missing offsets only when two fetches agree that they are missing,
or when the source said what left them out (:mod:`~consumerkit.offsets.skipped`: transaction
markers, aborted transactions). On any other gap it dispatches the records before it, reads the
partition again from the gap, and keeps what the first fetch returned (a :class:`Sighting`) to
compare with. Such a gap costs one more fetch; a fetch without gaps costs two comparisons.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from ..envelope import RecordLike
from .skipped import Skipped


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


def unbroken(records: Sequence[RecordLike], expected: int | None, seen: Sighting | None,
             skipped: Skipped | None = None) -> tuple[int, int | None, int]:
    """How many of ``records`` (one partition's fetch, offsets increasing) come before the
    first gap not yet confirmed, that gap's first offset (``None``: no such gap), and how many
    gaps before it ``skipped`` explained.

    ``expected`` is the offset the fetch should start at (``None``: not known, as at a new
    group's first fetch); ``seen`` is the sighting of the fetch before, if that one stopped
    at a gap; ``skipped`` holds the offsets the source said it passed over (transaction
    markers, aborted transactions): a gap they fill is passed at once."""
    if not records:
        return 0, None, 0
    first, last = records[0].offset, records[-1].offset
    if expected is not None and first < expected:
        expected = None  # a committed offset that moved after the fetch began: trust the fetch
    if (expected is None or first == expected) and last - first + 1 == len(records):
        return len(records), None, 0  # the usual case: contiguous
    explained = 0
    for i, record in enumerate(records):
        offset = record.offset
        if expected is not None and offset != expected:
            if skipped is not None and skipped.covers(expected, offset):
                explained += 1
            elif seen is None or not seen.agrees(expected, offset):
                return i, expected, explained
        expected = offset + 1
    return len(records), None, explained
