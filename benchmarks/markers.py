"""Commit-to-apply latency with transactional producers upstream: what the second read of a
transaction marker's gap costs, measured.

One Apache Kafka node (started here unless ``--kafka`` names one), one topic, and a producer
that writes small transactions at a low rate, a share of them aborted: every commit and abort
leaves a marker, a gap in the partition's offsets. Two consumerkit consumers read the topic at
the same time, in groups of their own: one as it runs (its source says which offsets aiokafka
dropped as markers or aborted batches, and the gaps they leave are passed at once) and one whose
source is blind to them, so each such gap is read again, as before. An event's latency runs
from the return of the producer's ``commit_transaction`` to the consumer's ``applied`` (its
transaction committed), both in this process. Events of the first ``--warmup`` seconds are not
counted.

``python -m benchmarks.markers [--kafka BOOTSTRAP] [--postgres DSN] [--transactions 300]
[--rate 10] [--seed 1] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, Kafka, Postgres, handler
from consumerkit.envelope import Envelope, RecordLike
from consumerkit.observability.observer import BaseObserver
from consumerkit.testing.services import start_postgres
from consumerkit.transport.kafka import KafkaSource
from consumerkit.transport.source import Partition, RebalanceHandler, Source
from tests.harness import start_kafka

ABORT_SHARE = 0.2
PARTITIONS = 2
KINDS = ("markers", "rereads")


class Tick(BaseModel):
    n: int


class BlindSource(KafkaSource):
    """The Kafka source blind to what aiokafka dropped: every gap is read again."""

    def skipped(self) -> dict[Partition, list[tuple[int, int]]]:
        super().skipped()
        return {}


class Applied(BaseObserver):
    """When each event's effects committed."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}

    def applied(self, record: RecordLike, envelope: Envelope, handler: str) -> None:
        self.at[envelope.event_id] = time.time()


def consumer(kind: str, topic: str, bootstrap: str, dsn: str, schema: str,
             applied: Applied) -> Consumer:
    table = f'"{schema}".ticks_{kind}'

    @handler("bench.tick")
    async def tick(event: Tick, ctx: HandlerContext) -> None:
        await ctx.tx.execute(f"INSERT INTO {table} (n) VALUES ($1)", event.n)

    made = Consumer(name=f"bench-{kind}-{topic}", handlers=[tick], topics=[topic],
                    postgres=Postgres(dsn=dsn, schema=schema),
                    kafka=Kafka(bootstrap=bootstrap),
                    handle_signals=False, observers=[applied])
    if kind == "rereads":
        def source(rebalance: RebalanceHandler) -> Source:
            return BlindSource(topics=made.topics, group_id=made.name, bootstrap=bootstrap,
                               options=made.kafka_consumer_options, rebalance=rebalance)

        made.source_factory = source
    return made


@contextlib.asynccontextmanager
async def running(made: Consumer) -> AsyncIterator[Consumer]:
    task = asyncio.create_task(made.run())
    started = asyncio.create_task(made.started.wait())
    await asyncio.wait({task, started}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    try:
        yield made
    finally:
        await asyncio.wait_for(made.stop(), 60)
        await task


async def produce(bootstrap: str, topic: str, transactions: int, rate: float,
                  rng: random.Random) -> dict[str, float]:
    """Write ``transactions`` of 1 to 3 events at ``rate`` per second; return the time each
    committed event's transaction returned from its commit."""
    committed: dict[str, float] = {}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=True,
                                transactional_id=f"bench-markers-{uuid.uuid4().hex}")
    await producer.start()
    try:
        n = 0
        for _ in range(transactions):
            began = time.monotonic()
            ids = []
            await producer.begin_transaction()
            for _ in range(rng.randint(1, 3)):
                event_id = str(uuid.uuid4())
                ids.append(event_id)
                n += 1
                await producer.send(topic, orjson.dumps({"n": n}), key=f"k{n % 7}".encode(),
                                    headers=[("id", event_id.encode()),
                                             ("event_type", b"bench.tick")])
            if rng.random() < ABORT_SHARE:
                await producer.abort_transaction()
            else:
                await producer.commit_transaction()
                done = time.time()
                committed.update((i, done) for i in ids)
            await asyncio.sleep(max(0.0, 1 / rate - (time.monotonic() - began)))
    finally:
        await producer.stop()
    return committed


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(bootstrap: str, dsn: str, transactions: int, rate: float, seed: int,
                  warmup: float) -> dict[str, Any]:
    topic = f"bench-markers-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15_000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, replication_factor=1)])
    finally:
        await admin.close()
    schema = f"bench_markers_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(dsn, timeout=15)
    try:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
        for kind in KINDS:
            await conn.execute(f'CREATE TABLE "{schema}".ticks_{kind} (n int NOT NULL)')
        applied = {kind: Applied() for kind in KINDS}
        made = {kind: consumer(kind, topic, bootstrap, dsn, schema, applied[kind])
                for kind in KINDS}
        async with running(made["markers"]), running(made["rereads"]):
            began = time.time()
            committed = await produce(bootstrap, topic, transactions, rate,
                                      random.Random(seed))
            deadline = time.monotonic() + 120
            while any(len(applied[k].at) < len(committed) for k in KINDS):
                if time.monotonic() > deadline:
                    raise TimeoutError("not every committed event applied within 120 s")
                await asyncio.sleep(0.1)
        result: dict[str, Any] = {"transactions": transactions, "rate": rate,
                                  "events": len(committed)}
        for kind in KINDS:
            late = [applied[kind].at[i] - t for i, t in committed.items()
                    if t >= began + warmup]
            stats = made[kind].stats
            result[kind] = {
                "p50_ms": round(1000 * percentile(late, 0.50), 1),
                "p99_ms": round(1000 * percentile(late, 0.99), 1),
                "max_ms": round(1000 * max(late), 1), "counted": len(late),
                "gap_rereads": stats.gap_rereads, "gaps_explained": stats.gaps_explained,
                "applied": stats.applied}
        result["p99_ratio_rereads_to_markers"] = round(
            result["rereads"]["p99_ms"] / max(result["markers"]["p99_ms"], 0.1), 1)
        return result
    finally:
        with contextlib.suppress(Exception):
            await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await conn.close()


@contextlib.contextmanager
def services(kafka: str | None, postgres: str | None) -> Iterator[tuple[str, str]]:
    with contextlib.ExitStack() as stack:
        if kafka is None:
            kafka = stack.enter_context(start_kafka(brokers=1)).bootstrap
        if postgres is None:
            postgres = stack.enter_context(start_postgres()).dsn
        yield kafka, postgres


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kafka", help="an Apache Kafka bootstrap (else one node is started)")
    parser.add_argument("--postgres", help="a PostgreSQL DSN (else an embedded one)")
    parser.add_argument("--transactions", type=int, default=300)
    parser.add_argument("--rate", type=float, default=10.0, help="transactions per second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with services(args.kafka, args.postgres) as (bootstrap, dsn):
        result = asyncio.run(measure(bootstrap, dsn, args.transactions, args.rate, args.seed,
                                     args.warmup))
    if args.json:
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
        return
    print(f"{result['events']} committed events in {args.transactions} transactions at "
          f"{args.rate:g}/s, {ABORT_SHARE:.0%} aborted")
    for kind in KINDS:
        r = result[kind]
        print(f"  {kind:8} p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  max "
              f"{r['max_ms']:7.1f} ms  gap rereads {r['gap_rereads']:4}  gaps explained "
              f"{r['gaps_explained']:4}")
    print(f"  p99 with rereads / p99 without: {result['p99_ratio_rereads_to_markers']:g}")


if __name__ == "__main__":
    main()
