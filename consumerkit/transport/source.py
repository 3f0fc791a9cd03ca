"""The seam the engine reads from: a consumer-group member that fetches records, pauses, and
commits explicit offsets, announcing partition assignments through rebalance callbacks.

Two sources implement it: :class:`~consumerkit.transport.kafka.KafkaSource` (aiokafka) and
:class:`~consumerkit.transport.memory.MemorySource` (for tests, no broker). Both run the same
engine, pipeline and dedup store; ``tests/contract/test_sources.py`` holds them to this contract.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from ..envelope import RecordLike

Partition = tuple[str, int]
"""(topic, partition number)."""


class RebalanceHandler(Protocol):
    """What a source calls when its share of the partitions changes (the engine)."""

    async def on_revoked(self, partitions: list[Partition]) -> None: ...
    async def on_assigned(self, partitions: list[Partition]) -> None: ...


class Source(Protocol):
    """A member of a consumer group, for the engine.

    - :meth:`start` joins the group; partitions are announced to the :class:`RebalanceHandler`
      given at construction (``on_assigned`` before any of their records is fetched,
      ``on_revoked`` before another member may read them), from within :meth:`fetch`.
    - :meth:`fetch` returns, per assigned partition that is not paused, records in increasing
      offset order starting at the committed offset (the partition's start if none), then
      continuing after what it returned (or at the offset given to :meth:`seek`); an empty
      dict after ``timeout_ms`` if nothing came. Offsets it leaves out are gaps the engine
      reads again (:mod:`~consumerkit.offsets.sighting`), unless :meth:`skipped`, asked right
      after each fetch, says what left them out.
      After a (re)assignment, reading resumes from the committed offset: records fetched but
      not committed are delivered again.
    - :meth:`commit` stores ``{partition: next offset to read}`` for the group; a source never
      commits on its own. A failed commit raises :class:`~consumerkit.errors.TransportError`.
    - :meth:`stop` leaves the group; other members take its partitions from the committed
      offsets. The engine has committed what it finished before it stops the source.
    """

    topics: list[str]

    async def start(self) -> None: ...

    async def fetch(self, timeout_ms: int, max_records: int) -> dict[Partition, list[RecordLike]]:
        ...

    def skipped(self) -> Mapping[Partition, Sequence[tuple[int, int]]]:
        """The offset ranges ``[first, end)`` that the fetches since the last call passed over
        for a reason the broker gave, per partition: transaction markers (control batches)
        and the batches of aborted transactions, which no ``read_committed`` reader ever
        gets. A gap they fill is passed without reading it again; a source that cannot tell
        returns nothing, and each of its gaps is read again."""
        ...

    def pause(self, paused: bool) -> None:
        """Pause every assigned partition (fetch still serves the group), or resume them."""
        ...

    def seek(self, part: Partition, offset: int) -> None:
        """Have the next records of ``part`` (an assigned partition) start at ``offset``:
        records fetched past it and not yet returned are dropped."""
        ...

    async def commit(self, offsets: Mapping[Partition, int]) -> None: ...

    async def end_offsets(self, parts: Sequence[Partition]) -> dict[Partition, int]:
        """The offset the next record of each of ``parts`` will get (for the lag)."""
        ...

    async def committed(self, part: Partition) -> int | None:
        """The group's committed offset of ``part`` (``None``: none yet)."""
        ...

    async def stop(self) -> None: ...
