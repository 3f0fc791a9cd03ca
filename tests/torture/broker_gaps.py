"""Does the broker hide, from readers at the tail of a partition, batches that concurrent
producers are appending? No consumerkit here: plain aiokafka producers and readers against the
embedded Tansu broker.

``python -m tests.torture.broker_gaps [--producers 4] [--seconds 60] [--pace 0.002]
[--readers 3] [--reread]``: each producer sends batches of 1 to 9 records to one partition,
one batch every ``pace`` seconds; each reader follows the tail and notes every jump in the
offsets it takes. At the end a reader from offset 0 reads the whole log. A jump over offsets
that the log holds is a batch the broker kept from a reader for good (a reader's next fetch
starts after what it was given). Exit status 1 when that happened.

With ``--reread`` the readers defend themselves as the consumer's engine does
(``consumerkit/offsets/sighting.py``): they take a fetch up to its first gap, read again from
there, and go past the gap only when the second read shows it too.

Tansu 0.6.0's storage advances a partition's high watermark before it writes the batch that
watermark covers; a fetch in between lists the batches written so far and returns the later
one (docs/torture-long.md, finding 4).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from consumerkit.offsets.sighting import Sighting, unbroken
from consumerkit.testing.services import start_tansu

TOPIC = "gaps"
PART = TopicPartition(TOPIC, 0)


@dataclass(slots=True)
class Run:
    batches: int = 0
    delivered: int = 0
    jumps: list[tuple[int, int]] = field(default_factory=list)  # (expected, taken)
    rereads: int = 0  # gaps read a second time (--reread)
    filled: int = 0  # records a second read returned where the first had a gap (--reread)


async def _produce(bootstrap: str, run: Run, pace: float, stop: asyncio.Event) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=False, linger_ms=0)
    await producer.start()
    try:
        while not stop.is_set():
            batch = producer.create_batch()
            for _ in range(1 + run.batches % 9):
                batch.append(key=None, value=b"x" * 50, timestamp=None)
            batch.close()
            await (await producer.send_batch(batch, TOPIC, partition=0))
            run.batches += 1
            await asyncio.sleep(pace)
    finally:
        await producer.stop()


async def _follow(bootstrap: str, run: Run, stop: asyncio.Event, reread: bool) -> None:
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                              auto_offset_reset="earliest", isolation_level="read_committed",
                              fetch_max_wait_ms=5)
    await reader.start()
    reader.assign([PART])
    expected, seen = 0, None
    try:
        while not stop.is_set():
            fetched = await reader.getmany(PART, timeout_ms=50, max_records=500)
            records = fetched.get(PART, [])
            if reread and records:
                if seen is not None:
                    run.filled += seen.filled(records)
                count, again, _ = unbroken(records, expected, seen)
                seen = None
                if again is not None:
                    seen = Sighting(again, [r.offset for r in records[count:]])
                    reader.seek(PART, again)
                    run.rereads += 1
                    records = records[:count]
            for record in records:
                if record.offset != expected:
                    run.jumps.append((expected, record.offset))
                expected = record.offset + 1
                run.delivered += 1
    finally:
        await reader.stop()


async def _whole_log(bootstrap: str) -> list[int]:
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                              auto_offset_reset="earliest")
    await reader.start()
    reader.assign([PART])
    offsets: list[int] = []
    try:
        while fetched := await reader.getmany(PART, timeout_ms=2000, max_records=5000):
            offsets += [record.offset for record in fetched[PART]]
    finally:
        await reader.stop()
    return offsets


async def measure(producers: int, seconds: float, pace: float, readers: int,
                  reread: bool = False) -> int:
    broker = start_tansu()
    try:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(TOPIC, num_partitions=1, replication_factor=1)])
        finally:
            await admin.close()
        run, stop = Run(), asyncio.Event()
        tasks = [asyncio.create_task(_produce(broker.bootstrap, run, pace, stop))
                 for _ in range(producers)]
        tasks += [asyncio.create_task(_follow(broker.bootstrap, run, stop, reread))
                  for _ in range(readers)]
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not any(t.done() for t in tasks):
            await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*tasks)
        log = await _whole_log(broker.bootstrap)
    finally:
        broker.stop()
    present = set(log)
    hidden = sorted({o for start, end in run.jumps for o in range(start, end) if o in present})
    print(f"{producers} producers, {readers} readers, {seconds:g} s: {run.batches} batches, "
          f"{len(log)} records in the log (contiguous: {log == list(range(len(log)))}), "
          f"{run.delivered} delivered to the readers at the tail")
    print(f"jumps over offsets the log holds: {len([j for j in run.jumps if j[0] in present])}"
          f", {len(hidden)} offsets never given to the reader that jumped"
          + (f" (first jumps: {run.jumps[:5]})" if run.jumps else ""))
    if reread:
        print(f"gaps read again: {run.rereads}, records the second read returned where the "
              f"first had a gap: {run.filled}")
    return 1 if hidden else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--pace", type=float, default=0.002, help="seconds between batches")
    parser.add_argument("--readers", type=int, default=3)
    parser.add_argument("--reread", action="store_true",
                        help="read a gap again before going past it, as the consumer does")
    args = parser.parse_args()
    sys.exit(asyncio.run(measure(args.producers, args.seconds, args.pace, args.readers,
                                 args.reread)))


if __name__ == "__main__":
    main()
