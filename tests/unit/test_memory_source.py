"""The in-memory broker's consumer groups: partitions split between members, handed over
only after their owner revoked them, read again from the committed offset."""

from __future__ import annotations

import pytest

from consumerkit.errors import StartupError, TransportError
from consumerkit.transport.memory import MemoryBroker, MemorySource
from consumerkit.transport.source import Partition

Log = list[tuple[str, str, list[Partition]]]


class Member:
    def __init__(self, name: str, log: Log) -> None:
        self.name = name
        self.log = log

    async def on_assigned(self, partitions: list[Partition]) -> None:
        self.log.append((self.name, "assigned", partitions))

    async def on_revoked(self, partitions: list[Partition]) -> None:
        self.log.append((self.name, "revoked", partitions))


async def offsets(source: MemorySource) -> dict[Partition, list[int]]:
    fetched = await source.fetch(0, 1000)
    return {p: [r.offset for r in records] for p, records in fetched.items()}


def broker_with(partitions: int, per_partition: int) -> MemoryBroker:
    broker = MemoryBroker()
    broker.create_topic("t", partitions)
    for p in range(partitions):
        for n in range(per_partition):
            broker.append("t", f"{p}-{n}".encode(), partition=p)
    return broker


async def test_members_split_and_hand_over_after_revoking() -> None:
    broker, log = broker_with(4, 3), Log()
    a = broker.source(topics=["t"], group_id="g", rebalance=Member("a", log))
    await a.start()
    assert set(await offsets(a)) == {("t", p) for p in range(4)}
    await a.commit({("t", p): 2 for p in range(4)})
    b = broker.source(topics=["t"], group_id="g", rebalance=Member("b", log))
    await b.start()
    assert await offsets(b) == {}  # a still holds every partition
    assert await offsets(a) == {}  # a gives up half of them...
    got = await offsets(b)  # ...which b reads from the committed offset
    assert got == {("t", 1): [2], ("t", 3): [2]}
    assert log == [("a", "assigned", [("t", 0), ("t", 1), ("t", 2), ("t", 3)]),
                   ("a", "revoked", [("t", 1), ("t", 3)]),
                   ("b", "assigned", [("t", 1), ("t", 3)])]
    with pytest.raises(TransportError, match="not owned"):
        await a.commit({("t", 1): 3})
    await a.stop()
    assert await offsets(b) == {("t", 0): [2], ("t", 2): [2]}
    assert broker.commits("g") == [{("t", p): 2 for p in range(4)}]


async def test_a_reset_revokes_first_then_rereads() -> None:
    broker, log = broker_with(1, 5), Log()
    source = broker.source(topics=["t"], group_id="g", rebalance=Member("a", log))
    await source.start()
    assert await offsets(source) == {("t", 0): [0, 1, 2, 3, 4]}
    broker.reset("g", {("t", 0): 1})
    assert broker.resetting("g")
    assert await offsets(source) == {("t", 0): [1, 2, 3, 4]}
    assert not broker.resetting("g")
    assert [entry[1] for entry in log] == ["assigned", "revoked", "assigned"]


async def test_paused_fetches_nothing_and_loses_nothing() -> None:
    broker = broker_with(2, 2)
    source = broker.source(topics=["t"], group_id="g", rebalance=Member("a", []))
    await source.start()
    source.pause(True)
    assert await offsets(source) == {}
    source.pause(False)
    assert await offsets(source) == {("t", 0): [0, 1], ("t", 1): [0, 1]}


async def test_keys_pick_a_partition_and_unknown_topics_are_refused() -> None:
    broker = MemoryBroker()
    broker.create_topic("t", 3)
    first = broker.append("t", b"1", key=b"order-7")
    assert {broker.append("t", b"x", key=b"order-7").partition for _ in range(5)} == {
        first.partition}
    assert [r.offset for r in broker.records("t", first.partition)] == list(range(6))
    source = broker.source(topics=["t", "missing"], group_id="g", rebalance=Member("a", []))
    with pytest.raises(StartupError, match="missing"):
        await source.start()
