"""What the ``Source`` protocol promises the engine, checked on every source: Kafka (a real
broker, Tansu here) and the in-memory one the test kit runs on."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import pytest
from aiokafka import AIOKafkaProducer

from consumerkit.envelope import RecordLike
from consumerkit.testing.services import MakeTopic
from consumerkit.transport.kafka import KafkaSource, default_partition
from consumerkit.transport.memory import MemoryBroker
from consumerkit.transport.source import Partition, RebalanceHandler, Source

from ..brokers import IDEMPOTENCE

DEADLINE = 30.0  # generous: joining a group on a real broker takes a few seconds


class Callbacks:
    """A rebalance handler that notes what it was told, and the records seen before."""

    def __init__(self) -> None:
        self.assigned: list[Partition] = []
        self.revoked: list[Partition] = []

    async def on_assigned(self, partitions: list[Partition]) -> None:
        self.assigned.extend(partitions)

    async def on_revoked(self, partitions: list[Partition]) -> None:
        self.revoked.extend(partitions)


class Backend(Protocol):
    async def topic(self, partitions: int) -> str: ...

    async def produce(self, topic: str, key: bytes, value: bytes,
                      headers: Sequence[tuple[str, bytes]], timestamp: int) -> None: ...

    def source(self, topic: str, group: str, rebalance: RebalanceHandler) -> Source: ...


class KafkaBackend:
    def __init__(self, bootstrap: str, make_topic: MakeTopic,
                 producer: AIOKafkaProducer) -> None:
        self.bootstrap = bootstrap
        self.make_topic = make_topic
        self.producer = producer

    async def topic(self, partitions: int) -> str:
        return await self.make_topic(partitions)

    async def produce(self, topic: str, key: bytes, value: bytes,
                      headers: Sequence[tuple[str, bytes]], timestamp: int) -> None:
        await self.producer.send_and_wait(topic, value=value, key=key, headers=list(headers),
                                          timestamp_ms=timestamp)

    def source(self, topic: str, group: str, rebalance: RebalanceHandler) -> Source:
        return KafkaSource(topics=[topic], group_id=group, bootstrap=self.bootstrap,
                           options={"session_timeout_ms": 3000,
                                    "heartbeat_interval_ms": 300},
                           rebalance=rebalance)


class MemoryBackend:
    def __init__(self) -> None:
        self.broker = MemoryBroker()

    async def topic(self, partitions: int) -> str:
        name = f"t-{uuid.uuid4().hex[:8]}"
        self.broker.create_topic(name, partitions)
        return name

    async def produce(self, topic: str, key: bytes, value: bytes,
                      headers: Sequence[tuple[str, bytes]], timestamp: int) -> None:
        self.broker.append(topic, value, key=key, headers=headers, timestamp=timestamp)

    def source(self, topic: str, group: str, rebalance: RebalanceHandler) -> Source:
        return self.broker.source(topics=[topic], group_id=group, rebalance=rebalance)


@pytest.fixture(params=["kafka", "memory"])
async def backend(request: pytest.FixtureRequest, kafka_bootstrap: str,
                  make_topic: MakeTopic) -> AsyncIterator[Backend]:
    if request.param == "memory":
        yield MemoryBackend()
        return
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=IDEMPOTENCE)
    await producer.start()
    try:
        yield KafkaBackend(kafka_bootstrap, make_topic, producer)
    finally:
        await producer.stop()


async def fetch_until(source: Source, count: int, timeout: float = DEADLINE,
                      ) -> list[RecordLike]:
    """Fetch until ``count`` records came (or the deadline passed)."""
    got: list[RecordLike] = []
    async with asyncio.timeout(timeout):
        while len(got) < count:
            for records in (await source.fetch(100, 500)).values():
                got.extend(records)
    return got


async def fetch_for(source: Source, seconds: float) -> list[RecordLike]:
    """Everything fetched during ``seconds`` (to show that nothing comes)."""
    got: list[RecordLike] = []
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while loop.time() < end:
        for records in (await source.fetch(100, 500)).values():
            got.extend(records)
    return got


def group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


async def test_records_keep_their_fields_and_offsets_increase(backend: Backend) -> None:
    topic = await backend.topic(3)
    sent = [(f"key-{n % 5}".encode(), f"v{n}".encode(), [("id", f"e{n}".encode())],
             1_700_000_000_000 + n) for n in range(20)]
    for key, value, headers, timestamp in sent:
        await backend.produce(topic, key, value, headers, timestamp)
    callbacks = Callbacks()
    source = backend.source(topic, group(), callbacks)
    await source.start()
    try:
        got = await fetch_until(source, 20)
    finally:
        await source.stop()
    assert sorted(callbacks.assigned) == [(topic, p) for p in range(3)]
    assert len(got) == 20
    by_value = {r.value: r for r in got}
    for key, value, headers, timestamp in sent:
        record = by_value[value]
        assert record.key == key
        assert [(k, v) for k, v in record.headers] == headers
        assert record.timestamp == timestamp
        assert record.partition == default_partition(key, 3)  # Kafka's partitioner
    for part in range(3):
        offsets = [r.offset for r in got if r.partition == part]
        assert offsets == list(range(len(offsets)))
    order = {value: n for n, (_, value, _, _) in enumerate(sent)}
    for part in range(3):  # within a partition, in the order produced
        produced = [order[r.value] for r in got if r.partition == part and r.value]
        assert produced == sorted(produced)


@pytest.mark.slow  # a real group waits for the member that left (about 10 s)
async def test_a_new_member_reads_from_the_committed_offset(backend: Backend) -> None:
    topic = await backend.topic(1)
    for n in range(10):
        await backend.produce(topic, b"k", f"v{n}".encode(), [], 1_700_000_000_000)
    name = group()
    first = backend.source(topic, name, Callbacks())
    await first.start()
    try:
        assert len(await fetch_until(first, 10)) == 10
        await first.commit({(topic, 0): 4})  # 4..9 fetched but not committed
    finally:
        await first.stop()
    callbacks = Callbacks()
    second = backend.source(topic, name, callbacks)
    await second.start()
    try:
        again = await fetch_until(second, 6)
        assert callbacks.assigned == [(topic, 0)]
        assert [r.offset for r in again] == [4, 5, 6, 7, 8, 9]
        assert await fetch_for(second, 0.5) == []
    finally:
        await second.stop()


async def test_a_seek_reads_the_partition_again_from_the_offset_given(
    backend: Backend,
) -> None:
    topic = await backend.topic(1)
    for n in range(8):
        await backend.produce(topic, b"k", f"v{n}".encode(), [], 1_700_000_000_000)
    source = backend.source(topic, group(), Callbacks())
    await source.start()
    try:
        assert [r.offset for r in await fetch_until(source, 8)] == list(range(8))
        source.seek((topic, 0), 3)
        again = await fetch_until(source, 5)
        assert [(r.offset, r.value) for r in again] == [(n, f"v{n}".encode())
                                                        for n in range(3, 8)]
        assert await fetch_for(source, 0.5) == []  # then it goes on after them, once
        # records fetched past the offset and not yet returned are dropped, not returned
        source.seek((topic, 0), 0)
        first: list[RecordLike] = []
        async with asyncio.timeout(DEADLINE):
            while not first:
                first = [r for records in (await source.fetch(100, 2)).values()
                         for r in records]
        assert [r.offset for r in first] == [0, 1]
        source.seek((topic, 0), 1)
        rest = await fetch_until(source, 7)
        assert [r.offset for r in rest] == list(range(1, 8))
        assert await fetch_for(source, 0.5) == []
    finally:
        await source.stop()


async def test_paused_partitions_deliver_nothing_until_resumed(backend: Backend) -> None:
    topic = await backend.topic(2)
    for n in range(4):
        await backend.produce(topic, f"k{n}".encode(), f"a{n}".encode(), [], 1_700_000_000_000)
    source = backend.source(topic, group(), Callbacks())
    await source.start()
    try:
        await fetch_until(source, 4)
        source.pause(True)
        for n in range(4):
            await backend.produce(topic, f"k{n}".encode(), f"b{n}".encode(), [],
                                  1_700_000_000_000)
        assert await fetch_for(source, 1.0) == []
        source.pause(False)
        later = await fetch_until(source, 4)
        assert sorted(r.value or b"" for r in later) == [b"b0", b"b1", b"b2", b"b3"]
    finally:
        await source.stop()


async def test_end_and_committed_offsets_are_told_for_the_lag(backend: Backend) -> None:
    topic = await backend.topic(1)
    part = (topic, 0)
    for n in range(10):  # one send at a time: Tansu's end offset follows the last batch
        await backend.produce(topic, b"k", f"v{n}".encode(), [], 1_700_000_000_000)
    source = backend.source(topic, group(), Callbacks())
    await source.start()
    try:
        assert len(await fetch_until(source, 10)) == 10
        assert await source.committed(part) is None
        await source.commit({part: 4})
        assert await source.committed(part) == 4
        assert await source.end_offsets([part]) == {part: 10}
    finally:
        await source.stop()


async def test_plain_records_leave_no_offset_skipped(
    backend: Backend, caplog: pytest.LogCaptureFixture,
) -> None:
    # offsets a source says it skipped are gaps passed without a second read: records never
    topic = await backend.topic(2)
    for n in range(12):
        await backend.produce(topic, f"key-{n % 4}".encode(), b"v", [], 1_700_000_000_000)
    source = backend.source(topic, group(), Callbacks())
    with caplog.at_level(logging.WARNING, "consumerkit.consumer"):
        await source.start()
        try:
            assert len(await fetch_until(source, 12)) == 12
            assert source.skipped() == {}
        finally:
            await source.stop()
    # the Kafka source found aiokafka's fetcher as it knows it (else every marker is reread)
    assert [r.getMessage() for r in caplog.records] == []
