"""Outbox relay benchmark: relay throughput and commit-to-ack latency, on real services.

    python -m benchmarks.outbox [--rows 50000] [--aggregates 1000] [--rate 500]
                                [--seconds 10] [--poll 0.1] [--postgres DSN] [--kafka BOOTSTRAP]

1. Throughput: ``--rows`` events over ``--aggregates`` aggregates are written to a fresh outbox
   first; then 1, and separately 2, relays (tasks of this process) publish them to a topic of 8
   partitions. Rate = rows / time until the outbox table is empty (judged from PostgreSQL).
2. Latency: one relay; a writer commits one event per transaction at ``--rate`` events/s for
   ``--seconds``; latency = broker ack (when the sink's send returns) - writer commit, both on
   this process's clock. Once with NOTIFY, once polling every ``--poll`` seconds.
3. Cleanup: the batched retention delete (``cleanup``) of the same number of rows.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta

import asyncpg

from consumerkit.outbox import (
    KafkaSink,
    NewEvent,
    Outbox,
    OutboxEvent,
    OutboxTable,
    Relay,
    cleanup,
    migrate_outbox,
)
from consumerkit.transport.kafka import create_topic

from .context import services

NO_IDEMPOTENCE = {"enable_idempotence": False}  # Tansu has no idempotent producer


class TimedSink(KafkaSink):
    """The Kafka sink, noting when each event's ack came back."""

    acked: dict[uuid.UUID, float]

    async def send(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        results = await super().send(events)
        now = time.monotonic()
        for event, result in zip(events, results, strict=True):
            if result is None:
                self.acked.setdefault(event.event_id, now)
        return results


async def _fresh(conn: asyncpg.Connection[asyncpg.Record], bootstrap: str) -> tuple[
        OutboxTable, str]:
    table = OutboxTable(f"ck_bench_{uuid.uuid4().hex[:8]}", "outbox")
    await migrate_outbox(conn, table)
    topic = f"ck-bench-outbox-{uuid.uuid4().hex[:8]}"
    await create_topic(bootstrap, topic, 8)
    return table, topic


async def _fill(conn: asyncpg.Connection[asyncpg.Record], table: OutboxTable, rows: int,
                aggregates: int) -> None:
    writer = Outbox(table.schema, table.table, notify=False)
    for start in range(0, rows, 1000):
        async with conn.transaction():
            await writer.add_many(conn, [
                NewEvent("bench.event", "bench", f"a-{n % aggregates}", {"n": n, "pad": "x" * 64})
                for n in range(start, min(rows, start + 1000))])


async def throughput(dsn: str, bootstrap: str, rows: int, aggregates: int,
                     relays: int) -> float:
    conn = await asyncpg.connect(dsn)
    table, topic = await _fresh(conn, bootstrap)
    try:
        await _fill(conn, table, rows, aggregates)
        running = [Relay(dsn, KafkaSink(bootstrap, route=topic, kafka_options=NO_IDEMPOTENCE),
                         schema=table.schema, handle_signals=False, rebalance_interval=0.2)
                   for _ in range(relays)]
        tasks = [asyncio.create_task(r.run()) for r in running]
        start = time.monotonic()
        while True:  # drained is judged from PostgreSQL
            if not await conn.fetchval(f"SELECT count(*) FROM {table.events}"):
                break
            await asyncio.sleep(0.02)
        elapsed = time.monotonic() - start
        for r in running:
            r.stop()
        await asyncio.gather(*tasks)
        return rows / elapsed
    finally:
        await conn.execute(f'DROP SCHEMA "{table.schema}" CASCADE')
        await conn.close()


async def latency(dsn: str, bootstrap: str, rate: int, seconds: float, notify: bool,
                  poll: float) -> tuple[float, float, int]:
    """(p50 ms, p99 ms, events) from writer commit to broker ack."""
    conn = await asyncpg.connect(dsn)
    table, topic = await _fresh(conn, bootstrap)
    sink = TimedSink(bootstrap, route=topic, kafka_options=NO_IDEMPOTENCE)
    sink.acked = {}
    relay = Relay(dsn, sink, schema=table.schema, notify=notify, poll_interval=poll,
                  handle_signals=False)
    task = asyncio.create_task(relay.run())
    writer = Outbox(table.schema, table.table, notify=notify)
    committed: dict[uuid.UUID, float] = {}
    try:
        await relay.started.wait()
        while True:  # the relay holds its slots before the clock starts
            if relay.slots:
                break
            await asyncio.sleep(0.02)
        total = int(rate * seconds)
        begin = time.monotonic()
        for n in range(total):
            await asyncio.sleep(max(0.0, begin + n / rate - time.monotonic()))  # pacing
            async with conn.transaction():
                added = await writer.add(conn, event_type="bench.event", aggregate_type="bench",
                                         aggregate_id=f"a-{n % 100}", payload={"n": n})
            assert added is not None
            committed[added] = time.monotonic()
        while True:
            if len(sink.acked) >= len(committed):
                break
            await asyncio.sleep(0.02)
        relay.stop()
        await task
    finally:
        await conn.execute(f'DROP SCHEMA "{table.schema}" CASCADE')
        await conn.close()
    waits = sorted((sink.acked[i] - t) * 1000 for i, t in committed.items())
    return statistics.median(waits), waits[int(len(waits) * 0.99) - 1], len(waits)


async def cleanup_speed(dsn: str, bootstrap: str, rows: int) -> float:
    conn = await asyncpg.connect(dsn)
    table, _topic = await _fresh(conn, bootstrap)
    try:
        await _fill(conn, table, rows, 1000)
        start = time.monotonic()
        deleted = await cleanup(conn, timedelta(0), table=table, batch=5000)
        return deleted / (time.monotonic() - start)
    finally:
        await conn.execute(f'DROP SCHEMA "{table.schema}" CASCADE')
        await conn.close()


async def run(dsn: str, bootstrap: str, args: argparse.Namespace) -> list[str]:
    lines = []
    for relays in (1, 2):
        rate = await throughput(dsn, bootstrap, args.rows, args.aggregates, relays)
        lines.append(f"throughput, {relays} relay(s), {args.rows} rows: {rate:,.0f} events/s")
        print(lines[-1], file=sys.stderr, flush=True)
    for notify in (True, False):
        p50, p99, n = await latency(dsn, bootstrap, args.rate, args.seconds, notify, args.poll)
        mode = "NOTIFY" if notify else f"polling every {args.poll}s"
        lines.append(f"latency at {args.rate} events/s, {mode}: p50 {p50:.1f} ms, "
                     f"p99 {p99:.1f} ms ({n} events)")
        print(lines[-1], file=sys.stderr, flush=True)
    speed = await cleanup_speed(dsn, bootstrap, args.rows)
    lines.append(f"cleanup, batches of 5,000: {speed:,.0f} rows/s")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.outbox",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=50_000)
    p.add_argument("--aggregates", type=int, default=1000)
    p.add_argument("--rate", type=int, default=500)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--poll", type=float, default=0.1)
    p.add_argument("--postgres")
    p.add_argument("--kafka")
    args = p.parse_args(argv)
    with services(args.postgres, args.kafka) as svc:
        lines = asyncio.run(run(svc.dsn, svc.bootstrap, args))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
