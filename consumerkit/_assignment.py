"""What the consumer knows about each partition it owns right now."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ._offsets import PartitionOffsets
from .transport.source import Partition

if TYPE_CHECKING:
    from ._gaps import Sighting


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
