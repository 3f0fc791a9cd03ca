"""The workload: N messages over K keys, a share of them re-published duplicates, one effect on
a per-key total per distinct event. Built once, published once to a 4-partition topic that
every peer then reads with its own consumer group (or published at a fixed pace while one peer
runs, to measure latency).

Keys are spread ``uniform`` (round robin), ``zipf`` (rank r drawn with weight 1/r, so the
hottest of 10 keys gets ~34 % of the events) or all on one key (``keys=1``)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from pydantic import BaseModel

from .broker import traits

EVENT_TYPE = "bench.amount"
ID_HEADER = "id"
TYPE_HEADER = "event_type"
KeySpread = Literal["uniform", "zipf"]


class Amount(BaseModel):
    """The payload every peer decodes: add ``amount`` to the total of ``key``."""

    key: str
    amount: int


@dataclass(frozen=True, slots=True)
class Message:
    event_id: str
    key: str
    amount: int


@dataclass(frozen=True, slots=True)
class Workload:
    """The messages in publication order and the effects they must produce."""

    messages: tuple[Message, ...]
    totals: dict[str, int]  # key -> sum of amounts over distinct events
    counts: dict[str, int]  # key -> number of distinct events

    @property
    def size(self) -> int:
        return len(self.messages)

    @property
    def distinct(self) -> int:
        return sum(self.counts.values())

    @property
    def duplicates(self) -> int:
        return self.size - self.distinct


def make_workload(events: int, keys: int, dup_rate: float, seed: int = 7,
                  spread: KeySpread = "uniform") -> Workload:
    """``events`` messages in all, of which ``round(events * dup_rate)`` re-publish an earlier
    event (same id, key and payload) at a random later position."""
    if events < 1 or keys < 1 or not 0 <= dup_rate < 1:
        raise ValueError("need events >= 1, keys >= 1 and 0 <= dup_rate < 1")
    rng = random.Random(seed)
    dups = round(events * dup_rate)
    distinct = events - dups
    if spread == "zipf":
        ranks = rng.choices(range(keys), weights=[1 / (r + 1) for r in range(keys)], k=distinct)
    else:
        ranks = [i % keys for i in range(distinct)]
    originals = [Message(f"e-{i}", f"key-{rank}", rng.randint(1, 100))
                 for i, rank in enumerate(ranks)]
    ordered: list[tuple[float, Message]] = [(float(i), m) for i, m in enumerate(originals)]
    for _ in range(dups):
        i = rng.randrange(distinct)
        ordered.append((rng.uniform(i, distinct), originals[i]))
    ordered.sort(key=lambda pair: pair[0])
    totals: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for m in originals:
        totals[m.key] += m.amount
        counts[m.key] += 1
    return Workload(tuple(m for _, m in ordered), dict(totals), dict(counts))


async def create_topic(bootstrap: str, partitions: int = 4, timeout: float = 15.0) -> str:
    """A fresh topic with ``partitions`` partitions whose leaders are known."""
    name = f"ckbench-{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(
            name, num_partitions=partitions,
            replication_factor=traits(bootstrap).replication_factor)])
        errors = [err for err in response.topic_errors if err[1] != 0]
        if errors:
            raise RuntimeError(f"creating topic {name} failed: {errors}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            described = await admin.describe_topics([name])
            ready = [p for t in described if t["topic"] == name and t["error_code"] == 0
                     for p in t["partitions"] if p["error_code"] == 0 and p["leader"] >= 0]
            if len(ready) == partitions:
                return name
            await asyncio.sleep(0.05)
        raise TimeoutError(f"topic {name} lacks {partitions} ready partitions")
    finally:
        await admin.close()


async def publish(bootstrap: str, topic: str, workload: Workload) -> None:
    """Publish every message (key = the aggregate key, headers ``id`` and ``event_type``),
    ``acks="all"``, idempotent where the broker has it (not Tansu: :mod:`.broker`)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=traits(bootstrap).idempotence, linger_ms=5)
    await producer.start()
    try:
        event_type = EVENT_TYPE.encode()
        futures = [
            await producer.send(
                topic, key=m.key.encode(),
                value=Amount(key=m.key, amount=m.amount).model_dump_json().encode(),
                headers=[(ID_HEADER, m.event_id.encode()), (TYPE_HEADER, event_type)])
            for m in workload.messages
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def publish_paced(bootstrap: str, topic: str, workload: Workload,
                        rate: float) -> dict[str, float]:
    """Publish one message every ``1 / rate`` seconds; returns the send time (``time.time()``,
    also the record timestamp) of each event's first message, by event id."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=traits(bootstrap).idempotence, linger_ms=0)
    await producer.start()
    sent: dict[str, float] = {}
    try:
        event_type = EVENT_TYPE.encode()
        futures = []
        start = time.monotonic()
        for i, m in enumerate(workload.messages):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            now = time.time()
            sent.setdefault(m.event_id, now)
            futures.append(await producer.send(
                topic, key=m.key.encode(), timestamp_ms=int(now * 1000),
                value=Amount(key=m.key, amount=m.amount).model_dump_json().encode(),
                headers=[(ID_HEADER, m.event_id.encode()), (TYPE_HEADER, event_type)]))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return sent


async def delete_topic(bootstrap: str, topic: str) -> None:
    """Best effort: the topic is only test data."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    await admin.start()
    try:
        with contextlib.suppress(Exception):  # a leftover topic harms nothing
            await asyncio.wait_for(admin.delete_topics([topic]), timeout=10)
    finally:
        await admin.close()
