"""Contiguous offset watermarks: never commit past a message still in flight."""

from __future__ import annotations

import heapq
from collections.abc import Collection


class PartitionOffsets:
    """Tracks the offsets of one partition handed out for processing.

    ``committable()`` is the offset to commit (the next one to read): one past the highest
    offset below which every tracked message is done. Messages may finish in any order.
    ``committed`` is the last offset the broker took; ``stored`` the highest an offset store
    in the database is known to hold (its commit answered), and ``commits`` the count of
    transactions its row is known to hold: a database that moved back holds fewer.
    """

    __slots__ = ("_done", "_in_flight", "_next", "commits", "committed", "stored")

    def __init__(self, start: int | None = None) -> None:
        self._next: int | None = start  # everything below is done
        self._in_flight: list[int] = []  # min-heap of started offsets
        self._done: set[int] = set()
        self.committed: int | None = None  # the last offset sent to the broker
        self.stored: int | None = None  # the highest offset a database store confirmed
        self.commits: int | None = None  # the highest count of commits its row confirmed

    def started(self, offset: int) -> None:
        if self._next is None:
            self._next = offset
        heapq.heappush(self._in_flight, offset)

    def finished(self, offset: int) -> None:
        self._done.add(offset)
        heap = self._in_flight
        while heap and heap[0] in self._done:
            done = heapq.heappop(heap)
            self._done.discard(done)
            self._next = done + 1

    def confirmed(self, offset: int, commits: int | None) -> None:
        """A commit that stored ``offset`` was answered, its row then at ``commits``."""
        if self.stored is None or offset > self.stored:
            self.stored = offset
        if commits is not None and (self.commits is None or commits > self.commits):
            self.commits = commits

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def watermark(self, also_done: Collection[int] = ()) -> int | None:
        """The contiguous watermark, counting ``also_done`` (offsets in flight) as done: a
        transaction's own records, whose outcome commits with the offset it stores."""
        if self._next is None:
            return None
        heap, done, nxt = self._in_flight, self._done, self._next
        if not heap:
            return nxt
        if not also_done:
            return heap[0] if heap[0] > nxt else nxt
        # the least offset in flight that is neither done nor ours, walking the heap in order
        # from its root: only the offsets below the answer are visited
        frontier = [(heap[0], 0)]
        size, highest = len(heap), heap[0]
        while frontier:
            offset, at = heapq.heappop(frontier)
            if offset not in done and offset not in also_done:
                return offset if offset > nxt else nxt
            highest = offset
            for child in (2 * at + 1, 2 * at + 2):
                if child < size:
                    heapq.heappush(frontier, (heap[child], child))
        return highest + 1 if highest + 1 > nxt else nxt

    def committable(self) -> int | None:
        """The offset to commit now, or ``None`` if nothing new since the last commit."""
        watermark = self.watermark()
        if watermark is None or (self.committed is not None and watermark <= self.committed):
            return None
        return watermark
