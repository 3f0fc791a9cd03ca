"""Outbox relay benchmark: relay throughput and commit-to-ack latency, on real services.

    python -m benchmarks.outbox [--rows 50000] [--aggregates 1000] [--rate 500]
                                [--seconds 10] [--poll 0.1] [--postgres DSN] [--kafka BOOTSTRAP]

1. Throughput: 1, and separately 2, relays, each its own OS process
   (``benchmarks.outbox_relay_worker``), publish ``--rows`` events over ``--aggregates``
   aggregates to a topic of 8 partitions. The rows are written in one transaction that stays
   open until the relays have settled (every slot held, each relay within its fair share), so
   start-up and slot balancing fall outside the timed window; the clock starts at its COMMIT.
   Rate = rows / time until the outbox table is empty (judged from PostgreSQL).
2. Latency: one relay; a writer commits one event per transaction at ``--rate`` events/s for
   ``--seconds``; latency = broker ack (when the sink's send returns) - writer commit, both on
   this process's clock. Once with NOTIFY, once polling every ``--poll`` seconds.
3. Cleanup: the batched retention delete (``cleanup``) of the same number of rows.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import asyncpg

from consumerkit import Postgres, migrate
from consumerkit.outbox import (
    KafkaSink,
    NewEvent,
    Outbox,
    OutboxEvent,
    OutboxTable,
    Relay,
    cleanup,
    live_relays,
)
from consumerkit.outbox.admin import slot_owners
from consumerkit.outbox.table import SLOTS
from consumerkit.transport.kafka_admin import create_topic

from .broker import producer_flags, traits
from .context import services
from .outbox_cpu import CpuMeter, broker_pids
from .relay_check import PARTITIONS

NO_IDEMPOTENCE = {"enable_idempotence": False}  # Tansu has no idempotent producer
ROOT = Path(__file__).resolve().parents[1]
SETTLE_TIMEOUT = 60.0


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
    await migrate(conn, dedup=None, outboxes=[table])
    topic = f"ck-bench-outbox-{uuid.uuid4().hex[:8]}"
    await create_topic(bootstrap, topic, PARTITIONS,
                       replication_factor=traits(bootstrap).replication_factor)
    return table, topic


async def _fill(conn: asyncpg.Connection[asyncpg.Record], table: OutboxTable, rows: int,
                aggregates: int, *, notify: bool = False) -> None:
    writer = Outbox(table.schema, table.table, notify=notify)
    for start in range(0, rows, 1000):
        await writer.add_many(conn, [
            NewEvent("bench.event", "bench", f"a-{n % aggregates}", {"n": n, "pad": "x" * 64})
            for n in range(start, min(rows, start + 1000))])


def start_relay(dsn: str, bootstrap: str, table: OutboxTable, topic: str,
                name: str, uvloop: bool = True) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.outbox_relay_worker", "--dsn", dsn, "--bootstrap",
         bootstrap, "--schema", table.schema, "--topic", topic, "--name", name,
         *producer_flags(bootstrap), *([] if uvloop else ["--no-uvloop"])],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


async def settled(conn: asyncpg.Connection[asyncpg.Record], table: OutboxTable,
                  relays: list[subprocess.Popen[bytes]]) -> None:
    """Wait until ``relays`` are all live and hold every slot, each within its fair share."""
    fair = math.ceil(SLOTS / len(relays))
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        if any(r.poll() is not None for r in relays):
            raise RuntimeError("a relay process exited before the run")
        owners = await slot_owners(conn, table)
        shares = [list(owners.values()).count(pid) for pid in set(owners.values())]
        if (await live_relays(conn, table) == len(relays) and len(owners) == SLOTS
                and len(shares) == len(relays) and max(shares) <= fair):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"relays not settled after {SETTLE_TIMEOUT:g}s: {shares}")
        await asyncio.sleep(0.05)


def stop_relays(relays: list[subprocess.Popen[bytes]]) -> list[int]:
    for r in relays:
        if r.poll() is None:
            r.send_signal(signal.SIGTERM)
    codes = []
    for r in relays:
        try:
            codes.append(r.wait(30))
        except subprocess.TimeoutExpired:
            r.kill()
            codes.append(r.wait(10))
    return codes


async def throughput(dsn: str, bootstrap: str, rows: int, aggregates: int,
                     relays: int) -> tuple[float, float, dict[str, float]]:
    """(events/s, seconds, CPU seconds per process group: relays, their PostgreSQL backends,
    the broker) of ``relays`` relay processes draining ``rows`` pre-written rows."""
    conn = await asyncpg.connect(dsn)
    table, topic = await _fresh(conn, bootstrap)
    running: list[subprocess.Popen[bytes]] = []
    try:
        fill = conn.transaction()
        await fill.start()  # invisible to the relays until the clock starts
        await _fill(conn, table, rows, aggregates, notify=True)
        running = [start_relay(dsn, bootstrap, table, topic, f"{table.schema}-{i}")
                   for i in range(relays)]
        watcher = await asyncpg.connect(dsn)
        try:
            await settled(watcher, table, running)
            backends = [r["pid"] for r in await watcher.fetch(
                "SELECT pid FROM pg_stat_activity WHERE application_name LIKE $1",
                f"consumerkit-relay {table.schema}-%")]
            meter = CpuMeter({"relays": [r.pid for r in running], "postgres": backends,
                              "broker": broker_pids(int(bootstrap.rpartition(":")[2]))})
            await fill.commit()
            start = time.monotonic()
            while True:  # drained is judged from PostgreSQL
                if running and any(r.poll() is not None for r in running):
                    raise RuntimeError("a relay process died during the run")
                if not await watcher.fetchval(f"SELECT count(*) FROM {table.events}"):
                    break
                await asyncio.sleep(0.01)
            elapsed = time.monotonic() - start
            cpu = meter.read()
        finally:
            await watcher.close()
        if any(await asyncio.to_thread(stop_relays, running)):
            raise RuntimeError("a relay process did not stop cleanly")
        return rows / elapsed, elapsed, cpu
    finally:
        if conn.is_in_transaction():
            await conn.execute("ROLLBACK")
        await asyncio.to_thread(stop_relays, running)
        await conn.execute(f'DROP SCHEMA "{table.schema}" CASCADE')
        await conn.close()


async def latency(dsn: str, bootstrap: str, rate: int, seconds: float, notify: bool,
                  poll: float) -> tuple[float, float, int]:
    """(p50 ms, p99 ms, events) from writer commit to broker ack."""
    conn = await asyncpg.connect(dsn)
    table, topic = await _fresh(conn, bootstrap)
    sink = TimedSink(bootstrap, route=topic, kafka_options=NO_IDEMPOTENCE)
    sink.acked = {}
    relay = Relay(Postgres(dsn=dsn, schema=table.schema), sink, notify=notify, poll_interval=poll,
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
        async with conn.transaction():
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
        rate, elapsed, cpu = await throughput(dsn, bootstrap, args.rows, args.aggregates,
                                              relays)
        used = ", ".join(f"{name} {seconds:.2f}" for name, seconds in cpu.items())
        lines.append(f"throughput, {relays} relay(s), {args.rows} rows: {rate:,.0f} events/s "
                     f"(CPU s in {elapsed:.2f} s: {used})")
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
