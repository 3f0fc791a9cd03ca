"""Contiguous offset watermarks: never commit past a message still in flight."""

from __future__ import annotations

import heapq


class PartitionOffsets:
    """Tracks the offsets of one partition handed out for processing.

    ``committable()`` is the offset to commit (the next one to read): one past the highest
    offset below which every tracked message is done. Messages may finish in any order.
    """

    __slots__ = ("_done", "_in_flight", "_next", "committed")

    def __init__(self, start: int | None = None) -> None:
        self._next: int | None = start  # everything below is done
        self._in_flight: list[int] = []  # min-heap of started offsets
        self._done: set[int] = set()
        self.committed: int | None = None  # the last offset sent to the broker

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

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def committable(self) -> int | None:
        """The offset to commit now, or ``None`` if nothing new since the last commit."""
        if self._next is None:
            return None
        if self._in_flight:
            low = self._in_flight[0]
            watermark = low if low > self._next else self._next
        else:
            watermark = self._next
        if self.committed is not None and watermark <= self.committed:
            return None
        return watermark
