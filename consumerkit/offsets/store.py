"""Where a consumer group keeps each partition's next offset to read: the seam, and the broker.

Two stores implement :class:`OffsetStore`: :class:`KafkaOffsets` (the group's committed offsets
on the broker) and :class:`~consumerkit.offsets.postgres.PostgresOffsets` (a table beside the
effects, written in their transactions). ``tests/contract/test_offset_stores.py`` holds both
to this contract; a third store is one more class and one more parameter there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, Protocol

from ..transport.source import Partition, Source

COMMIT_TIMEOUT = 10.0  # an unreachable store must not hang a revocation or a shutdown

OffsetStoreName = Literal["kafka", "postgres"]
OFFSET_STORES: tuple[OffsetStoreName, ...] = ("kafka", "postgres")


class OffsetStore(Protocol):
    """A consumer group's offsets, per partition: the next offset to read.

    - :meth:`load` answers for the partitions that have an offset stored, and leaves out
      those that have none (a new group, a new partition).
    - :meth:`save` stores ``{partition: next offset}``; it raises when the store refuses or
      cannot be reached (the caller tries again later), and leaves other partitions as they
      are.
    """

    name: OffsetStoreName

    async def load(self, parts: Sequence[Partition]) -> dict[Partition, int]: ...

    async def save(self, offsets: Mapping[Partition, int]) -> None: ...


class KafkaOffsets:
    """The group's committed offsets on the broker, through the consumer's own source: what
    lag tools read."""

    name: OffsetStoreName = "kafka"

    def __init__(self, source: Source) -> None:
        self.source = source

    async def load(self, parts: Sequence[Partition]) -> dict[Partition, int]:
        found: dict[Partition, int] = {}
        for part in parts:
            if (offset := await self.source.committed(part)) is not None:
                found[part] = offset
        return found

    async def save(self, offsets: Mapping[Partition, int]) -> None:
        await self.source.commit(offsets)
