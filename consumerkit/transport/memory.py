"""An in-memory broker and its :class:`~consumerkit.transport.source.Source`, for tests.

It behaves as a Kafka consumer group does where exactly-once effects depend on it: topics have
partitions, a keyed record goes to the partition Kafka's default partitioner picks, offsets
increase per partition, records keep their key, headers and timestamp, each group's committed
offsets are stored (and every commit is kept, for tests to inspect), and a member that is
(re)assigned a partition reads it again from the committed offset. A partition is handed to a
new member only after its previous owner revoked it. The consumer runs its ordinary engine,
pipeline and dedup store on top: nothing here decides what is applied.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..envelope import Record, RecordLike
from ..errors import ConfigurationError, StartupError, TransportError
from .kafka import default_partition
from .source import Partition, RebalanceHandler


@dataclass(slots=True)
class _Group:
    committed: dict[Partition, int] = field(default_factory=dict)
    commits: list[dict[Partition, int]] = field(default_factory=list)
    members: list[MemorySource] = field(default_factory=list)
    owner: dict[Partition, MemorySource] = field(default_factory=dict)
    target: dict[Partition, MemorySource] = field(default_factory=dict)
    resets: dict[Partition, int] = field(default_factory=dict)  # applied once revoked


class MemoryBroker:
    """Topics, partitions and consumer groups held in memory (one event loop)."""

    def __init__(self) -> None:
        self._logs: dict[str, list[list[Record]]] = {}
        self._groups: dict[str, _Group] = {}
        self._round_robin = itertools.count()

    # -- topics ---------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1) -> None:
        if partitions < 1:
            raise ConfigurationError("a topic needs at least one partition")
        if name in self._logs:
            raise ConfigurationError(f"topic {name} already exists")
        self._logs[name] = [[] for _ in range(partitions)]

    def topics(self) -> dict[str, int]:
        """``{topic: number of partitions}``."""
        return {name: len(logs) for name, logs in self._logs.items()}

    def records(self, topic: str, partition: int) -> Sequence[Record]:
        return tuple(self._log(topic, partition))

    def end_offsets(self, topic: str) -> dict[Partition, int]:
        """``{partition: offset the next record will get}``."""
        return {(topic, p): len(log) for p, log in enumerate(self._topic(topic))}

    def append(
        self, topic: str, value: bytes | None, *, key: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] = (), timestamp: int | None = None,
        partition: int | None = None,
    ) -> Record:
        """Append a record as a producer would: to ``partition`` if given, else to the
        partition of ``key`` (Kafka's default partitioner), else round robin. ``timestamp``
        (milliseconds) defaults to now."""
        logs = self._topic(topic)
        if partition is None:
            partition = (default_partition(key, len(logs)) if key is not None
                         else next(self._round_robin) % len(logs))
        log = self._log(topic, partition)
        record = Record(
            topic=topic, partition=partition, offset=len(log), key=key, value=value,
            headers=tuple(headers),
            timestamp=int(time.time() * 1000) if timestamp is None else timestamp)
        log.append(record)
        self._wake(topic)
        return record

    # -- groups ---------------------------------------------------------------------------

    def committed(self, group_id: str) -> dict[Partition, int]:
        """The group's committed offsets (next offset to read), per partition."""
        return dict(self._group(group_id).committed)

    def resetting(self, group_id: str) -> bool:
        """Whether a :meth:`reset` still waits for a member to revoke its partitions."""
        return bool(self._group(group_id).resets)

    def commits(self, group_id: str) -> list[dict[Partition, int]]:
        """Every commit the group made, in order."""
        return [dict(c) for c in self._group(group_id).commits]

    def reset(self, group_id: str, offsets: Mapping[Partition, int]) -> None:
        """Set the group's committed offsets (as ``kafka-consumer-groups --reset-offsets``
        does). A partition a member holds is revoked first (its commits on revocation land
        before the reset), then read again from the new offset."""
        group = self._group(group_id)
        for part, offset in offsets.items():
            self._log(*part)
            if offset < 0:
                raise ConfigurationError("offsets are never negative")
            owner = group.owner.get(part)
            if owner is None:
                group.committed[part] = offset
            else:
                group.resets[part] = offset
                owner._wakeup.set()

    def source(
        self, *, topics: Sequence[str], group_id: str, rebalance: RebalanceHandler,
    ) -> MemorySource:
        return MemorySource(self, topics=topics, group_id=group_id, rebalance=rebalance)

    # -- for the sources ------------------------------------------------------------------

    def _topic(self, topic: str) -> list[list[Record]]:
        try:
            return self._logs[topic]
        except KeyError:
            raise ConfigurationError(f"unknown topic {topic}") from None

    def _log(self, topic: str, partition: int) -> list[Record]:
        logs = self._topic(topic)
        if not 0 <= partition < len(logs):
            raise ConfigurationError(f"topic {topic} has no partition {partition}")
        return logs[partition]

    def _group(self, group_id: str) -> _Group:
        return self._groups.setdefault(group_id, _Group())

    def _wake(self, topic: str) -> None:
        for group in self._groups.values():
            for member in group.members:
                if topic in member.topics:
                    member._wakeup.set()

    def _join(self, member: MemorySource) -> None:
        group = self._group(member.group_id)
        group.members.append(member)
        self._assign(group)

    def _leave(self, member: MemorySource) -> None:
        group = self._group(member.group_id)
        group.members.remove(member)
        for part in [p for p, m in group.owner.items() if m is member]:
            del group.owner[part]
        self._assign(group)

    def _assign(self, group: _Group) -> None:
        """Spread the partitions of every member's topics over the members, round robin."""
        group.target = {}
        for topic in sorted({t for m in group.members for t in m.topics}):
            takers = [m for m in group.members if topic in m.topics]
            for part in range(len(self._topic(topic))):
                group.target[(topic, part)] = takers[part % len(takers)]
        for member in group.members:
            member._wakeup.set()


class MemorySource:
    """A member of a consumer group of a :class:`MemoryBroker` (the
    :class:`~consumerkit.transport.source.Source` protocol)."""

    def __init__(
        self, broker: MemoryBroker, *, topics: Sequence[str], group_id: str,
        rebalance: RebalanceHandler,
    ) -> None:
        self.broker = broker
        self.topics = list(topics)
        self.group_id = group_id
        self._rebalance = rebalance
        self._owned: set[Partition] = set()
        self._position: dict[Partition, int] = {}
        self._paused = False
        self._started = False
        self._turn = 0  # which partition is served first, in turn
        self._wakeup = asyncio.Event()

    async def start(self) -> None:
        missing = sorted(t for t in self.topics if t not in self.broker.topics())
        if missing:
            raise StartupError(f"topics missing on the broker: {', '.join(missing)}")
        self._started = True
        self.broker._join(self)

    async def stop(self) -> None:
        if self._started:
            self._started = False
            self.broker._leave(self)
            self._owned.clear()

    def pause(self, paused: bool) -> None:
        self._paused = paused

    async def fetch(self, timeout_ms: int, max_records: int) -> dict[Partition, list[RecordLike]]:
        deadline = asyncio.get_running_loop().time() + timeout_ms / 1000
        while True:
            self._wakeup.clear()
            await self._follow_group()
            fetched = self._take(max_records)
            remaining = deadline - asyncio.get_running_loop().time()
            if fetched or remaining <= 0:
                return fetched
            try:
                async with asyncio.timeout(remaining):
                    await self._wakeup.wait()
            except TimeoutError:
                pass

    def skipped(self) -> dict[Partition, list[tuple[int, int]]]:
        return {}  # its logs have no markers: offsets follow each other

    def seek(self, part: Partition, offset: int) -> None:
        if part in self._owned:
            self._position[part] = offset

    async def commit(self, offsets: Mapping[Partition, int]) -> None:
        if not offsets:
            return
        group = self.broker._group(self.group_id)
        foreign = sorted(p for p in offsets if group.owner.get(p) is not self)
        if foreign:  # as Kafka refuses a commit from a member that lost the partition
            raise TransportError(f"commit refused: partitions not owned here: {foreign}")
        group.committed.update(offsets)
        group.commits.append(dict(offsets))

    async def end_offsets(self, parts: Sequence[Partition]) -> dict[Partition, int]:
        return {p: len(self.broker._log(*p)) for p in parts}

    async def committed(self, part: Partition) -> int | None:
        return self.broker._group(self.group_id).committed.get(part)

    async def _follow_group(self) -> None:
        """Revoke what the group now gives to others (or was reset), then take the partitions
        assigned here that no other member still holds."""
        if not self._started:
            return
        group = self.broker._group(self.group_id)
        revoked = sorted(p for p in self._owned
                         if p in group.resets or group.target.get(p) is not self)
        if revoked:
            await self._rebalance.on_revoked(revoked)
            for part in revoked:
                self._owned.discard(part)
                self._position.pop(part, None)
                if group.owner.get(part) is self:
                    del group.owner[part]
                if part in group.resets:
                    group.committed[part] = group.resets.pop(part)
            if any(m is not self for m in group.members):
                for member in group.members:
                    member._wakeup.set()
        assigned = sorted(p for p, m in group.target.items()
                          if m is self and p not in self._owned and p not in group.owner)
        if assigned:
            for part in assigned:
                group.owner[part] = self
                self._owned.add(part)
                self._position[part] = group.committed.get(part, 0)
            await self._rebalance.on_assigned(assigned)

    def _take(self, max_records: int) -> dict[Partition, list[RecordLike]]:
        if self._paused or not self._owned:
            return {}
        fetched: dict[Partition, list[RecordLike]] = {}
        room = max_records
        owned = sorted(self._owned)
        self._turn += 1
        for part in owned[self._turn % len(owned):] + owned[:self._turn % len(owned)]:
            if room <= 0:
                break
            start = self._position[part]
            records = self.broker._log(*part)[start:start + room]
            if records:
                fetched[part] = list(records)
                self._position[part] = start + len(records)
                room -= len(records)
        return fetched
