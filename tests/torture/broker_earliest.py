"""Does the broker's "earliest" offset pass records when producers append to a fresh partition
at once? No consumerkit here: plain aiokafka producers and readers against the embedded Tansu
broker.

``python -m tests.torture.broker_earliest [--rounds 100] [--producers 2]``: each round creates
a topic of four partitions, and every producer appends one batch (of 6, 7, ... records) to
every partition at the same time. Then one reader reads the topic from the offset the broker
names as the beginning (``seek_to_beginning``, what ``auto_offset_reset="earliest"`` does) and
another from offset 0. Exit status 1 when the reader from 0 misses a record (the broker lost
an acknowledged batch); the reader from "earliest" missing some is the fault this measures.

Tansu 0.6.0's storage answers "earliest" with the batch object it stored first in time, not
the one of the lowest offset (``list_offsets`` in ``tansu-storage/src/dynostore.rs``
compares ``last_modified``). Two producers' batches get offsets 0 and 6 in one order and are
stored in the other now and then; "earliest" is then 6, and a reader from there never reads
offsets 0 to 5, though the log holds them. "Latest" is the base offset of the batch stored
last, plus one. Apache Kafka answers both from the log's offsets.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from consumerkit.testing.services import start_tansu

PARTITIONS = 4


@dataclass(slots=True)
class Tally:
    rounds: int = 0
    records: int = 0
    wrong_earliest: int = 0  # partitions whose "earliest" was past offset 0
    missed_from_earliest: int = 0
    missed_from_zero: int = 0


async def append_at_once(producers: list[AIOKafkaProducer], topic: str) -> int:
    """One batch of every producer to every partition, all sent at once; returns the count."""
    async def one(producer: AIOKafkaProducer, partition: int, size: int) -> int:
        batch = producer.create_batch()
        for i in range(size):
            batch.append(key=f"{partition}-{size}-{i}".encode(), value=b"x" * 50,
                         timestamp=None, headers=[])
        batch.close()
        await (await producer.send_batch(batch, topic, partition=partition))
        return size

    sizes = await asyncio.gather(*(one(p, part, 6 + i) for part in range(PARTITIONS)
                                   for i, p in enumerate(producers)))
    return sum(sizes)


async def read(bootstrap: str, topic: str, expected: int, from_zero: bool) -> int:
    """How many records a reader takes from the start, until it has them all or 3 s pass."""
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                              enable_auto_commit=False)
    await reader.start()
    parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    reader.assign(parts)
    if from_zero:
        for tp in parts:
            reader.seek(tp, 0)
    else:
        await reader.seek_to_beginning(*parts)
    seen: set[tuple[int, int]] = set()
    deadline = time.monotonic() + 3.0
    try:
        while len(seen) < expected and time.monotonic() < deadline:
            for tp, records in (await reader.getmany(timeout_ms=200)).items():
                seen.update((tp.partition, r.offset) for r in records)
    finally:
        await reader.stop()
    return len(seen)


async def one_round(bootstrap: str, producers: list[AIOKafkaProducer], tally: Tally) -> None:
    topic = f"earliest-{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
        sent = await append_at_once(producers, topic)
    finally:
        await admin.close()
    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await probe.start()
    try:
        starts = await probe.beginning_offsets(
            [TopicPartition(topic, p) for p in range(PARTITIONS)])
    finally:
        await probe.stop()
    tally.rounds += 1
    tally.records += sent
    tally.wrong_earliest += sum(1 for offset in starts.values() if offset > 0)
    tally.missed_from_earliest += sent - await read(bootstrap, topic, sent, from_zero=False)
    tally.missed_from_zero += sent - await read(bootstrap, topic, sent, from_zero=True)


async def run_on(bootstrap: str, rounds: int, producers: int = 2) -> Tally:
    """``rounds`` rounds against the broker at ``bootstrap``."""
    tally = Tally()
    clients = [AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
               for _ in range(producers)]
    for client in clients:
        await client.start()
    try:
        for _ in range(rounds):
            await one_round(bootstrap, clients, tally)
    finally:
        for client in clients:
            await client.stop()
    return tally


async def run(rounds: int, producers: int) -> Tally:
    with start_tansu() as broker:
        return await run_on(broker.bootstrap, rounds, producers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.torture.broker_earliest")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--producers", type=int, default=2)
    args = parser.parse_args(argv)
    started = time.monotonic()
    tally = asyncio.run(run(args.rounds, args.producers))
    print(f"{tally.rounds} rounds ({tally.rounds * PARTITIONS} fresh partitions, "
          f"{tally.records} records, {args.producers} producers) in "
          f"{time.monotonic() - started:.0f} s:\n"
          f"  partitions whose 'earliest' was past offset 0: {tally.wrong_earliest}\n"
          f"  records a reader from 'earliest' missed: {tally.missed_from_earliest}\n"
          f"  records a reader from offset 0 missed: {tally.missed_from_zero}")
    return 1 if tally.missed_from_zero else 0


if __name__ == "__main__":
    sys.exit(main())
