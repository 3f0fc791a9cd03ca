"""The lock table and the CPU per message as consumer processes are added: 1, 2, 4, 8 and 12
processes drain a backlog of one topic (12 partitions, ``keys`` keys, ``keys x per_key``
events), with the claim's wait of today (``guard``) and that of the versions before it
(``advisory``: one ``pg_advisory_xact_lock`` per id) in turn on the same server.

Each run is a fresh schema and topic, the processes of ``tests.harness.fleet`` (a Consumer's
defaults for batching: 5,000 in flight, batches of 500, concurrency 4). Per run: the seconds
from the first record published to the last effect, the peak of lock-table entries (every
kind in ``pg_locks``, sampled every 10 ms) and of the backends holding them, and the CPU per
message of the consumer processes, of the database server (its postmaster and children) and
of the whole machine over that time. Run: ``python -m benchmarks.lock_scaling [--postgres
DSN] [--bootstrap HOST:PORT]`` (without them an embedded PostgreSQL 18 and a Tansu broker are
started; the server's settings are printed, and should be PostgreSQL's defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import tempfile
import uuid
from pathlib import Path

import asyncpg

from consumerkit.dedup.policy import DedupPolicy
from consumerkit.dedup.rows import claim_many_ddl
from consumerkit.testing.services import start_postgres, start_tansu
from tests.harness.fleet import Drained, drain

from . import cpu
from .workload import create_topic

PARTITIONS = 12
BODIES = ("advisory", "guard")


async def _run(dsn: str, bootstrap: str, body: str, processes: int, keys: int, per_key: int,
               server: int | None, workdir: Path) -> Drained:
    schema = f"bench_locks_{uuid.uuid4().hex[:8]}"
    topic = await create_topic(bootstrap, PARTITIONS)

    async def wait_as(conn: asyncpg.Connection[asyncpg.Record]) -> None:
        await conn.execute(claim_many_ddl(schema, DedupPolicy(), body))

    try:
        result = await drain(dsn, bootstrap, topic, schema, processes, keys=keys,
                             per_key=per_key, workdir=workdir,
                             meter=lambda: cpu.reading(server), prepare=wait_as)
    finally:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()
    return result


def _row(body: str, processes: int, r: Drained) -> str:
    def us(seconds: float) -> str:
        return f"{seconds / r.events * 1e6:,.0f}"

    database = r.metered.get("database")
    failed = sum(text.count("out of shared memory") for text in r.logs.values())
    ok = "every event once" if (r.effects, r.distinct) == (r.events, r.events) else (
        f"{r.effects - r.distinct} duplicate, {r.events - r.distinct} missing")
    return (f"| {body} | {processes} | {r.events / r.seconds:,.0f} | {r.peak_entries:,} | "
            f"{r.peak_backends} | {us(r.consumer_cpu)} | "
            f"{us(database) if database is not None else 'not measured'} | "
            f"{us(r.metered.get('machine', 0.0))} | {ok}"
            f"{f', {failed} out of shared memory' if failed else ''} |")


async def main(dsn: str, bootstrap: str, counts: list[int], keys: int, per_key: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        version = await conn.fetchval("SHOW server_version")
        settings = {r["name"]: r["setting"] for r in await conn.fetch(
            "SELECT name, setting FROM pg_settings WHERE name IN ('max_connections',"
            " 'max_locks_per_transaction', 'max_prepared_transactions')")}
        server = cpu.postmaster(await conn.fetchval("SELECT pg_backend_pid()"))
    finally:
        await conn.close()
    print(f"PostgreSQL {version}; {settings}; {keys * per_key} events of {keys} keys over "
          f"{PARTITIONS} partitions", flush=True)
    print("| body | processes | events/s | lock-table entries at peak | backends at peak | "
          "consumers' CPU µs/msg | database CPU µs/msg | machine CPU µs/msg | outcome |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|", flush=True)
    with tempfile.TemporaryDirectory(prefix="ck-locks-") as tmp:
        for processes in counts:
            for body in BODIES:
                workdir = Path(tmp) / f"{body}-{processes}"
                workdir.mkdir()
                result = await _run(dsn, bootstrap, body, processes, keys, per_key, server,
                                    workdir)
                print(_row(body, processes, result), flush=True)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", help="a DSN (default: an embedded PostgreSQL 18)")
    parser.add_argument("--bootstrap", help="a broker (default: a Tansu broker)")
    parser.add_argument("--processes", default="1,2,4,8,12", help="comma-separated counts")
    parser.add_argument("--keys", type=int, default=3000)
    parser.add_argument("--per-key", type=int, default=8)
    args = parser.parse_args()
    logging.getLogger("consumerkit.schema").setLevel(logging.ERROR)  # migrate's superuser note
    with contextlib.ExitStack() as stack:
        dsn = args.postgres
        if dsn is None:
            postgres = start_postgres()
            stack.callback(postgres.stop)
            dsn = postgres.dsn
        bootstrap = args.bootstrap
        if bootstrap is None:
            broker = start_tansu()
            stack.callback(broker.stop)
            bootstrap = broker.bootstrap
        counts = [int(n) for n in args.processes.split(",")]
        asyncio.run(main(dsn, bootstrap, counts, args.keys, args.per_key))


if __name__ == "__main__":
    cli()
