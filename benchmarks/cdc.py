"""The outbox relay against Debezium, on the same table, PostgreSQL and Kafka, in one run.

    python -m benchmarks.cdc [--rows 5000] [--aggregates 200] [--rate 200] [--seconds 10]
                             [--docs]

Services of its own: PostgreSQL with ``wal_level=logical`` (``start_logical_postgres``), one
Apache Kafka node at the version Debezium is built against, and a Kafka Connect worker with
the outbox connector as deployed (``start_debezium``). Needs Java 17 and Maven.

For each way out (the relay first, then Debezium, whose slot must not see the relay's rows):

Debezium runs twice: as deployed (the example file: ``poll.interval.ms`` at Debezium's 500 ms
default), and with ``poll.interval.ms=50``, the setting that bounds its latency at low rates.

1. Throughput: ``--rows`` events over ``--aggregates`` aggregates, committed in one
   transaction; events/s = rows / (commit until the last is readable on Kafka).
2. Latency: one event per transaction at ``--rate`` events/s for ``--seconds``; latency =
   the moment a Kafka consumer has it - the writer's commit, both on this process's clock.
3. Cost, over both phases: WAL bytes per event (``pg_current_wal_lsn`` before and after) and
   the database's CPU seconds per event (the postmaster and its children, from ``/proc``).

The relay writes with NOTIFY and deletes each row once published; in Debezium mode the writer
deletes each row in the inserting transaction (``delete_after_insert``), Debezium's pattern.
``--docs`` writes the table into ``benchmarks/cdc.md`` and ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer

from consumerkit import Postgres, migrate
from consumerkit.outbox import (
    KafkaSink,
    NewEvent,
    Outbox,
    OutboxTable,
    Relay,
    prepare_cdc,
)
from consumerkit.transport.kafka_admin import create_topic
from tests.harness import LogicalPostgres, start_debezium, start_kafka, start_logical_postgres
from tests.harness.connect_jars import DEBEZIUM_KAFKA_VERSION

from .outbox_cpu import cpu_seconds

HERE = Path(__file__).resolve().parent
SECTION = HERE / "cdc.md"
PAGE = HERE.parent / "docs" / "benchmarks.md"
HEADING = "## Relay against Debezium"


@dataclass
class Phase:
    name: str
    rate: float = 0.0  # events/s, throughput
    p50: float = 0.0  # ms, commit to readable
    p99: float = 0.0
    wal_per_event: float = 0.0  # bytes
    cpu_per_event: float = 0.0  # database CPU ms


def database_cpu(postgres: LogicalPostgres) -> float:
    """CPU seconds of the postmaster, its reaped children and its live ones."""
    pid = int((postgres.pgdata / "postmaster.pid").read_text().split()[0])
    stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    tick = 100.0
    total = sum(int(x) for x in stat[11:15]) / tick  # utime, stime, cutime, cstime
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            total += cpu_seconds(int(entry.name)) or 0.0
    return total


class Arrivals:
    """A Kafka reader noting when each event id first arrives (this process's clock)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.seen: dict[str, float] = {}
        self._reader = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None,
                                        auto_offset_reset="earliest", fetch_max_wait_ms=10)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Arrivals:
        await self._reader.start()
        self._task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        while True:
            batch = await self._reader.getmany(timeout_ms=100)
            now = time.monotonic()
            for records in batch.values():
                for r in records:
                    event_id = dict(r.headers).get("id", b"").decode()
                    self.seen.setdefault(event_id, now)

    async def wait(self, ids: set[str], timeout: float = 300) -> float:
        deadline = time.monotonic() + timeout
        while not ids <= self.seen.keys():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(ids - self.seen.keys())} of {len(ids)} events "
                                   f"not on Kafka after {timeout:g}s")
            await asyncio.sleep(0.01)
        return max(self.seen[i] for i in ids)

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._reader.stop()


async def measure(name: str, dsn: str, outbox: Outbox, aggregate: str, arrivals: Arrivals,
                  postgres: LogicalPostgres, args: argparse.Namespace) -> Phase:
    conn = await asyncpg.connect(dsn)
    phase = Phase(name)
    try:
        wal0 = await conn.fetchval("SELECT pg_current_wal_lsn()")
        cpu0 = database_cpu(postgres)
        events = [NewEvent("bench.step", aggregate, f"a{i % args.aggregates}", {"i": i})
                  for i in range(args.rows)]
        async with conn.transaction():
            ids = {str(x) for x in await outbox.add_many(conn, events)}
        committed = time.monotonic()
        phase.rate = args.rows / (await arrivals.wait(ids) - committed)
        latencies = []
        interval = 1.0 / args.rate
        start = time.monotonic()
        for n in range(int(args.rate * args.seconds)):
            await asyncio.sleep(max(0.0, start + n * interval - time.monotonic()))
            async with conn.transaction():
                event_id = str(await outbox.add(conn, event_type="bench.step",
                                                aggregate_type=aggregate,
                                                aggregate_id=f"a{n % args.aggregates}",
                                                payload={"n": n}))
            latencies.append((event_id, time.monotonic()))
        await arrivals.wait({i for i, _ in latencies})
        ms = sorted((arrivals.seen[i] - t) * 1000 for i, t in latencies)
        phase.p50 = statistics.median(ms)
        phase.p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
        total = args.rows + len(latencies)
        wal = await conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)", wal0)
        phase.wal_per_event = float(wal) / total
        phase.cpu_per_event = (database_cpu(postgres) - cpu0) * 1000 / total
    finally:
        await conn.close()
    return phase


async def run(args: argparse.Namespace) -> list[Phase]:
    with start_logical_postgres() as postgres, start_kafka(
            brokers=1, version=DEBEZIUM_KAFKA_VERSION) as kafka:
        table = OutboxTable(f"bench_{uuid.uuid4().hex[:8]}", "outbox")
        conn = await asyncpg.connect(postgres.dsn)
        try:
            await migrate(conn, dedup=None, outboxes=[table])
        finally:
            await conn.close()
        aggregate = f"bench.{table.schema}"
        relayed = f"relay.{aggregate}"
        for topic in (aggregate, relayed):
            await create_topic(kafka.bootstrap, topic, 8, {})
        phases = []
        relay = Relay(Postgres(dsn=postgres.dsn, schema=table.schema), KafkaSink(kafka.bootstrap,
            route="relay.{aggregate_type}"),
                      handle_signals=False)
        running = asyncio.create_task(relay.run())
        try:
            await asyncio.wait_for(relay.started.wait(), 60)
            async with Arrivals(kafka.bootstrap, relayed) as arrivals:
                phases.append(await measure("relay (NOTIFY)", postgres.dsn,
                                            Outbox(table.schema, table.table), aggregate,
                                            arrivals, postgres, args))
        finally:
            relay.stop()
            await asyncio.wait_for(running, 60)
        cdc_writer = Outbox(table.schema, table.table, notify=False, delete_after_insert=True)
        conn = await asyncpg.connect(postgres.dsn)
        try:  # the slot only now: it must not see the relay's rows
            await prepare_cdc(conn, table)
        finally:
            await conn.close()
        for name, overrides in (("Debezium (delete after insert)", {}),
                                ("Debezium, poll.interval.ms=50", {"poll.interval.ms": "50"})):
            worker = await asyncio.to_thread(
                functools.partial(start_debezium, kafka.bootstrap, postgres, table=table,
                                  slot=table.replication_slot, overrides=overrides))
            try:
                async with Arrivals(kafka.bootstrap, aggregate) as arrivals:
                    phases.append(await measure(name, postgres.dsn, cdc_writer, aggregate,
                                                arrivals, postgres, args))
            finally:
                await asyncio.to_thread(worker.stop)
        return phases


def table_md(phases: list[Phase], args: argparse.Namespace) -> str:
    rows = "\n".join(
        f"| {p.name} | {p.rate:,.0f} | {p.p50:.1f} | {p.p99:.1f} | {p.wal_per_event:,.0f} "
        f"| {p.cpu_per_event:.3f} |" for p in phases)
    return (f"{HEADING}\n\n"
            f"`python -m benchmarks.cdc --rows {args.rows} --aggregates {args.aggregates} "
            f"--rate {args.rate:g} --seconds {args.seconds:g}`: the same outbox table, one "
            "PostgreSQL with `wal_level=logical` and `fsync=off`, one Apache Kafka "
            f"{DEBEZIUM_KAFKA_VERSION} node and a standalone Kafka Connect worker running "
            "the connector of `examples/debezium_outbox.json` (the last row adds "
            "`poll.interval.ms=50`), all on the same two shared cores; the relay first, then "
            "Debezium. Throughput: rows committed in one "
            "transaction until the last is readable on Kafka. Latency: one event per "
            "transaction at the given rate, commit until a Kafka consumer has it. WAL and "
            "database CPU per event over both parts (the relay's DELETEs and, with Debezium, "
            "the writer's own DELETE and the walsender's decoding included).\n\n"
            "| way out | events/s | commit to Kafka p50 (ms) | p99 (ms) | WAL bytes/event "
            "| database CPU ms/event |\n|---|---|---|---|---|---|\n" + rows + "\n")


def write_docs(section: str) -> None:
    SECTION.write_text(section)
    page = PAGE.read_text()
    at = page.find(f"\n{HEADING}\n")
    if at >= 0:
        end = page.find("\n## ", at + 1)
        page = page[:at] + (page[end:] if end >= 0 else "\n")
    PAGE.write_text(page.rstrip("\n") + "\n\n" + section)


def main(argv: list[str] | None = None,
         runner: Callable[[argparse.Namespace], Coroutine[Any, Any, list[Phase]]] = run,
         ) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cdc", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--aggregates", type=int, default=200)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--docs", action="store_true", help="write the table into the docs")
    args = parser.parse_args(argv)
    section = table_md(asyncio.run(runner(args)), args)
    print(section)
    if args.docs:
        write_docs(section)


if __name__ == "__main__":
    main()
