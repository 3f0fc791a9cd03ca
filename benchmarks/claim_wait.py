"""The claim's wait: the guard table against the per-id advisory locks, on the claim loop.

The set-based loop's dedup step (``set-based-claim`` in the suite) is one call of
consumerkit's claim function per poll batch, then the commit. This benchmark runs that loop
with no broker: ``workers`` connections, each claiming batches of ``batch`` fresh ids (UUIDv4
text, as a producer's header carries them), one transaction per batch. The two claim bodies
take turns on the same table, round after round, in one run:

- ``advisory``: the wait of migration steps 5-6, one ``pg_advisory_xact_lock`` per id;
- ``guard``: the wait of step 8, the guard table's unique index (``consumerkit.dedup.guard``).

Per body: ids claimed per second (median of its rounds, and the ratio guard / advisory of
each pair of rounds), WAL bytes per id, and the peak of lock-table entries (all of
``pg_locks``, sampled every 20 ms). Then ``sustain`` seconds of the guard alone, sampled every
``every`` seconds: the guard's heap and index sizes, its dead tuples and autovacuum runs, on
the server's own autovacuum settings. Run: ``python -m benchmarks.claim_wait [--postgres DSN]``
(without a DSN an embedded PostgreSQL 18 is started).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from datetime import datetime

import asyncpg

from consumerkit import migrate
from consumerkit.dedup import PostgresDedupStore
from consumerkit.dedup.policy import DedupPolicy
from consumerkit.dedup.rows import claim_many_ddl
from consumerkit.envelope import Envelope
from consumerkit.types import ClaimRequest

SCHEMA = "bench_claim_wait"
POLICY = DedupPolicy()
Conn = asyncpg.Connection


def _requests(size: int) -> list[ClaimRequest]:
    now = datetime.now().astimezone()
    return [ClaimRequest(Envelope(
        event_id=str(uuid.uuid4()), id_source="header", event_type="order.created", key="k",
        topic="orders", partition=0, offset=n, timestamp=now), "apply") for n in range(size)]


async def _loop(conn: Conn, store: PostgresDedupStore, batch: int, until: float) -> int:
    claimed = 0
    while time.monotonic() < until:
        requests = _requests(batch)
        async with conn.transaction(isolation="read_committed"):
            await store.claim_many(conn, "bench", requests)
        claimed += batch
    return claimed


async def _peak_entries(observer: Conn, until: float) -> int:
    peak = 0
    while time.monotonic() < until:
        peak = max(peak, int(await observer.fetchval("SELECT count(*) FROM pg_locks")))
        await asyncio.sleep(0.02)
    return peak


async def _round(conns: list[Conn], observer: Conn, store: PostgresDedupStore, wait: str,
                 batch: int, seconds: float) -> dict[str, float]:
    await observer.execute(claim_many_ddl(SCHEMA, POLICY, wait))
    lsn = await observer.fetchval("SELECT pg_current_wal_lsn()")
    started = time.monotonic()
    until = started + seconds
    *counts, peak = await asyncio.gather(
        *(_loop(c, store, batch, until) for c in conns), _peak_entries(observer, until))
    elapsed = time.monotonic() - started
    wal = await observer.fetchval("SELECT pg_current_wal_lsn() - $1::pg_lsn", lsn)
    ids = sum(counts)
    return {"ids_per_s": ids / elapsed, "wal_per_id": float(wal) / ids, "peak": peak}


async def _guard_stats(observer: Conn) -> dict[str, int]:
    row = await observer.fetchrow(
        "SELECT pg_relation_size(s.relid) AS heap,"
        " pg_relation_size($1::regclass) AS idx, s.n_dead_tup AS dead,"
        " s.n_tup_ins AS inserted, s.autovacuum_count AS autovacuums"
        " FROM pg_stat_user_tables AS s WHERE s.schemaname = $2"
        " AND s.relname = 'processed_events_guard'",
        f"{SCHEMA}.processed_events_guard_pkey", SCHEMA)
    assert row is not None
    return {key: int(value) for key, value in row.items()}


async def run(dsn: str, workers: int, batch: int, rounds: int, seconds: float,
              sustain: float, every: float) -> None:
    observer = await asyncpg.connect(dsn)
    await observer.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    await migrate(observer, SCHEMA, POLICY)
    version = await observer.fetchval("SHOW server_version")
    settings = {r["name"]: r["setting"] for r in await observer.fetch(
        "SELECT name, setting FROM pg_settings WHERE name IN ('max_connections',"
        " 'max_locks_per_transaction', 'autovacuum', 'autovacuum_naptime',"
        " 'autovacuum_vacuum_threshold', 'autovacuum_vacuum_scale_factor')")}
    print(f"PostgreSQL {version}; {settings}")
    conns = [await asyncpg.connect(dsn) for _ in range(workers)]
    store = PostgresDedupStore(SCHEMA, POLICY)
    for conn in conns:  # prepared statements and the function's plans, off the clock
        await _loop(conn, store, batch, time.monotonic() + 0.5)
    results: dict[str, list[dict[str, float]]] = {"advisory": [], "guard": []}
    for n in range(rounds):
        order = ("advisory", "guard") if n % 2 == 0 else ("guard", "advisory")
        for wait in order:
            results[wait].append(await _round(conns, observer, store, wait, batch, seconds))
    print(f"\n{workers} connections, claims of {batch} fresh ids, {rounds} rounds of "
          f"{seconds:g} s per body, alternating")
    print("| body | ids/s (median) | rounds | WAL bytes/id | lock-table entries at peak |")
    print("|---|---:|---|---:|---:|")
    for wait, rows in results.items():
        each = ", ".join(f"{r['ids_per_s']:,.0f}" for r in rows)
        print(f"| {wait} | {statistics.median(r['ids_per_s'] for r in rows):,.0f} | {each} | "
              f"{statistics.median(r['wal_per_id'] for r in rows):,.0f} | "
              f"{max(r['peak'] for r in rows):,.0f} |")
    ratios = [g["ids_per_s"] / a["ids_per_s"]
              for g, a in zip(results["guard"], results["advisory"], strict=True)]
    print(f"guard / advisory per round: {', '.join(f'{r:.2f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.2f}x")
    if sustain > 0:
        await observer.execute(claim_many_ddl(SCHEMA, POLICY, "guard"))
        print(f"\nguard alone for {sustain:g} s, {workers} connections")
        print("| s | ids/s | guard heap | guard index | dead tuples | inserted | autovacuums |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        started = time.monotonic()
        end = started + sustain
        while time.monotonic() < end:
            until = min(end, time.monotonic() + every)
            t0 = time.monotonic()
            ids = sum(await asyncio.gather(*(_loop(c, store, batch, until) for c in conns)))
            rate = ids / (time.monotonic() - t0)
            s = await _guard_stats(observer)
            print(f"| {time.monotonic() - started:.0f} | {rate:,.0f} | "
                  f"{s['heap'] / 2**20:.1f} MiB | {s['idx'] / 2**20:.1f} MiB | "
                  f"{s['dead']:,} | {s['inserted']:,} | {s['autovacuums']} |")
    for conn in conns:
        await conn.close()
    await observer.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
    await observer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", help="DSN (default: an embedded PostgreSQL 18)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--sustain", type=float, default=180.0)
    parser.add_argument("--every", type=float, default=15.0)
    args = parser.parse_args()
    server = None
    dsn = args.postgres
    if dsn is None:
        from consumerkit.testing.services import start_postgres
        server = start_postgres()
        dsn = server.dsn
    try:
        asyncio.run(run(dsn, args.workers, args.batch, args.rounds, args.seconds,
                        args.sustain, args.every))
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
