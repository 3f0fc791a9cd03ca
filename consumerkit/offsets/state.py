"""What the consumer knows about each partition it owns right now."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from ..transport.source import Partition
from .sighting import Sighting
from .skipped import Skipped
from .watermark import PartitionOffsets


@dataclass(slots=True, eq=False)
class PartitionState:
    """One owned partition: its offset watermark, its work in flight, and whether that work
    should be abandoned (partition revoked, consumer stopping) or even cut short (``kill``:
    a revoked partition whose handlers outlive the rebalance)."""

    partition: Partition
    offsets: PartitionOffsets = field(default_factory=PartitionOffsets)
    abandon: asyncio.Event = field(default_factory=asyncio.Event)
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    running: set[asyncio.Task[None]] = field(default_factory=set)
    pending: int = 0
    killed: bool = False
    # where the next fetch should start: one past the last record handed out (a gap's first
    # offset while the gap is read again), before the first fetch the group's committed
    # offset, None when not known; a floor for the end offset
    fetched: int | None = None
    sighting: Sighting | None = None  # a gap the next fetch should show again
    # offsets the source passed over for a reason (transaction markers, aborted transactions)
    skipped: Skipped = field(default_factory=Skipped)
    # where this ownership began, as the offset store said (None: the broker's committed
    # offset, or the partition's start): the floor a database that moved back rewinds to
    start: int | None = None
    # the database moved back under this ownership: it ends, and stores nothing more
    rewound: bool = False
    placed: bool = True  # False: its stored offset could not be read when it began
    # its stored offset is being read: what comes is dropped, and the first offset that came
    # kept (where the broker started it), to read again from there if nothing is stored
    placing: bool = False
    # the stored offset was outside the log: the client went where auto_offset_reset says,
    # and the row is set there, backwards if need be
    outside: bool = False
    first_seen: int | None = None

    def __post_init__(self) -> None:
        self.drained.set()

    def submitted(self, offset: int) -> None:
        self.offsets.started(offset)
        self.pending += 1
        self.drained.clear()

    def settled(self, count: int = 1) -> None:
        self.pending -= count
        if self.pending == 0:
            self.drained.set()

    def kill(self) -> None:
        """Cancel the handlers still running for this partition (their transactions roll back;
        the partition's new owner applies those records)."""
        self.killed = True
        for task in self.running:
            task.cancel()
