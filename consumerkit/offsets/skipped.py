"""Offsets a fetch passed over for a reason the broker gave, kept per partition so a gap they
fill is passed without reading it again (:mod:`~consumerkit.offsets.sighting` says why other
gaps are read again).

On a topic written in transactions every commit or abort leaves a marker (a control batch) in
the log, and under ``read_committed`` the batches of aborted transactions are left out too: the
client reads those batches and drops them. The source says which offsets it dropped so
(:meth:`~consumerkit.transport.source.Source.skipped`); they are facts about the log, true for
every later read, so a range is kept until the partition's reading has gone past it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from operator import itemgetter

LIMIT = 1024
"""Ranges kept per partition at most: the lowest are forgotten first (a gap they would have
explained is read again, which is slower, never wrong)."""
_start = itemgetter(0)


class Skipped:
    """Offset ranges ``[first, end)`` that hold no record for this reader: sorted, disjoint,
    touching ones merged."""

    __slots__ = ("_ranges",)

    def __init__(self) -> None:
        self._ranges: list[tuple[int, int]] = []

    def add(self, ranges: Iterable[tuple[int, int]]) -> None:
        for first, end in ranges:
            if first < end:
                self._insert(first, end)
        del self._ranges[:-LIMIT]

    def _insert(self, first: int, end: int) -> None:
        ranges = self._ranges
        if not ranges or first > ranges[-1][1]:
            ranges.append((first, end))  # the usual case: past everything kept
            return
        i = bisect_right(ranges, first, key=_start)
        if i and ranges[i - 1][1] >= first:  # overlaps or touches the one before
            i -= 1
            first = min(first, ranges[i][0])
        j = i
        while j < len(ranges) and ranges[j][0] <= end:
            end = max(end, ranges[j][1])
            j += 1
        ranges[i:j] = [(first, end)]

    def covers(self, first: int, end: int) -> bool:
        """Whether every offset from ``first`` to ``end - 1`` lies in a kept range."""
        i = bisect_right(self._ranges, first, key=_start) - 1  # the last starting by first
        return i >= 0 and end <= self._ranges[i][1]

    def forget(self, below: int) -> None:
        """Drop the ranges that end at or before ``below`` (read past)."""
        ranges = self._ranges
        n = 0
        while n < len(ranges) and ranges[n][1] <= below:
            n += 1
        if n:
            del ranges[:n]

    def __len__(self) -> int:
        return len(self._ranges)
