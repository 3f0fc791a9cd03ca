"""Reading a relay's topic back and checking it: every event there, on its aggregate's key, each
aggregate's events in the order they were written; duplicates counted.

Events carry ``n`` (0 to rows - 1) in a JSON value; event ``n`` belongs to aggregate
``a-{n % aggregates}``, which is also its Kafka key, so each aggregate's events are written in
increasing ``n``. Order is judged on first deliveries: a duplicate (an at-least-once resend
after a crash or a lost ack) comes later by nature and is counted, not held against order.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

PARTITIONS = 8

Record = tuple[bytes | None, bytes]  # key, value, in offset order within a partition


@dataclass(frozen=True, slots=True)
class Verdict:
    exact: bool
    detail: str
    delivered: int = 0
    duplicates: int = 0
    lost: int = 0
    out_of_order: int = 0
    misrouted: int = 0

    @classmethod
    def failed(cls, detail: str) -> Verdict:
        return cls(False, detail)


async def read_topic(bootstrap: str, topic: str, at_least: int, timeout: float = 60.0,
                     ) -> list[list[Record]]:
    """Every record of ``topic`` from the start, per partition in offset order: until at
    least ``at_least`` came and two polls more found nothing (late duplicates count too), or
    ``timeout`` passed (the check then reports what is missing).

    It reads from offset 0 of the fresh topic, not from the beginning the broker names: after
    concurrent first appends, Tansu 0.6 can name a later batch
    (``python -m tests.torture.broker_earliest``)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, metadata_max_age_ms=1000)
    await consumer.start()
    parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(parts)
    for tp in parts:
        consumer.seek(tp, 0)
    records: list[list[Record]] = [[] for _ in range(PARTITIONS)]
    try:
        deadline = time.monotonic() + timeout
        quiet = count = 0
        while quiet < 2 and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=300, max_records=5000)
            for tp, messages in batch.items():
                records[tp.partition].extend((m.key, m.value or b"") for m in messages)
                count += len(messages)
            quiet = quiet + 1 if not batch and count >= at_least else 0
        return records
    finally:
        await consumer.stop()


def check(partitions: list[list[Record]], rows: int, aggregates: int) -> Verdict:
    seen: Counter[int] = Counter()
    last: dict[str, int] = {}
    out_of_order = misrouted = phantom = 0
    for records in partitions:
        for key, value in records:
            n = int(orjson.loads(value)["n"])
            aggregate = f"a-{n % aggregates}"
            if not 0 <= n < rows:
                phantom += 1
                continue
            if key != aggregate.encode():
                misrouted += 1
            seen[n] += 1
            if seen[n] > 1:
                continue
            if last.get(aggregate, -1) > n:
                out_of_order += 1
            last[aggregate] = max(last.get(aggregate, -1), n)
    delivered = sum(seen.values())
    lost = rows - len(seen)
    duplicates = delivered - len(seen)
    exact = not (lost or out_of_order or misrouted or phantom)
    detail = (f"{len(seen):,} of {rows:,} events, {duplicates} duplicates, {lost} lost, "
              f"{out_of_order} out of order, {misrouted} on a wrong key, {phantom} unknown")
    return Verdict(exact, detail, delivered, duplicates, lost, out_of_order, misrouted)
