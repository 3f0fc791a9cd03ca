"""An outbox kept for change data capture: dropping an expired day's partition against deleting
the same rows.

    python -m benchmarks.outbox_retention [--rows 100000] [--postgres DSN]

Two outboxes in one fresh schema: one kept seven days in day partitions
(``OutboxTable(retention=OutboxRetention())``), one plain (the relay's layout, which
``cleanup`` deletes from). Each gets ``--rows`` events stamped in one UTC day nine days ago
(past the retention) and a tenth as many of today, the same payloads, then ``VACUUM (ANALYZE)``
and a ``CHECKPOINT``, as a day-old table would be. Then, twice:

- quiet: ``maintain_outbox`` drops the expired partition; ``cleanup(older_than=7 days)``
  deletes the same rows in batches of 5,000, and the ``VACUUM`` that gives their space back is
  timed apart. Each is timed, with the WAL it wrote (``pg_current_wal_lsn`` before and after);
- loaded: the same again (tables filled anew) while a writer adds one event per transaction
  to the outbox being cleaned, as fast as it can; its commit latency p50/p99 before and
  during each operation.

Both remove the same rows; the run checks none is left and today's rows stay. Services:
``--postgres DSN``, else ``$CONSUMERKIT_TEST_POSTGRES_DSN``, else an embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import asyncpg

from consumerkit import migrate
from consumerkit.dedup.partitions import maintain, partition_floor
from consumerkit.outbox import (
    Outbox,
    OutboxRetention,
    OutboxTable,
    cleanup,
    maintain_outbox,
)
from consumerkit.outbox.retention import plan
from consumerkit.testing.services import start_postgres

DAY = timedelta(days=1)
RETENTION = timedelta(days=7)
_FILL = """INSERT INTO {events} (id, aggregatetype, aggregateid, type, payload, occurred_at{extra})
SELECT gen_random_uuid(), 'orders', 'order-' || (g % 5000), 'order.placed',
       jsonb_build_object('order_id', 'order-' || g, 'amount', g % 977, 'currency', 'EUR',
                          'lines', jsonb_build_array(jsonb_build_object('sku', 'sku-' || g % 89,
                                                                        'qty', g % 7 + 1))),
       $1::timestamptz + (g * $3::interval) {extra_value}
FROM generate_series(1, $2) AS g"""


@dataclass
class Result:
    method: str
    mode: str
    seconds: float
    wal_bytes: int
    removed: int
    vacuum_seconds: float | None = None
    vacuum_wal: int | None = None
    before: list[float] = field(default_factory=list)  # writer commit latencies, ms
    during: list[float] = field(default_factory=list)


async def fill(conn: asyncpg.Connection[asyncpg.Record], table: OutboxTable, rows: int) -> None:
    """``rows`` events of nine days ago and a tenth as many of today."""
    now: datetime = await conn.fetchval("SELECT now()")
    old = partition_floor(now - 9 * DAY, DAY)
    if table.retention is not None:  # its partitions as maintenance made them back then
        await maintain(conn, table.schema, plan(table), now=old + DAY / 2)
    stamp = ", $1::timestamptz + (g * $3::interval)"
    kept = table.retention is not None  # the partition key: the insert's time, set here
    sql = _FILL.format(events=table.events, extra=", created_at" if kept else "",
                       extra_value=stamp if kept else "")
    await conn.execute(sql, old, rows, DAY / (rows + 1))
    recent = max(1, rows // 10)
    await conn.execute(sql, now - timedelta(hours=1), recent, timedelta(hours=1) / (recent + 1))
    await conn.execute(f"VACUUM (ANALYZE) {table.events}")
    with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
        await conn.execute("CHECKPOINT")


async def wal(conn: asyncpg.Connection[asyncpg.Record]) -> int:
    lsn: int = await conn.fetchval("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
    return int(lsn)


class Writer:
    """One event per transaction into ``outbox``, back to back, timing each commit."""

    def __init__(self, dsn: str, outbox: Outbox) -> None:
        self.dsn, self.outbox = dsn, outbox
        self.samples: list[tuple[float, float]] = []  # (start, ms)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Writer:
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(1.0)  # a baseline before the operation
        return self

    async def _run(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            n = 0
            while not self._stop.is_set():
                started = time.perf_counter()
                async with conn.transaction():
                    await self.outbox.add(conn, event_type="order.placed",
                                          aggregate_type="orders", aggregate_id=f"w-{n % 50}",
                                          payload={"n": n})
                self.samples.append((started, (time.perf_counter() - started) * 1000))
                n += 1
                await asyncio.sleep(0.002)
        finally:
            await conn.close()

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.sleep(0.5)
        self._stop.set()
        if self._task is not None:
            await self._task

    def between(self, start: float, end: float) -> list[float]:
        return [ms for at, ms in self.samples if start <= at < end]


async def operate(conn: asyncpg.Connection[asyncpg.Record], table: OutboxTable,
                  ) -> tuple[float, int, int, float | None, int | None]:
    """Remove the expired rows of ``table`` its own way; seconds, WAL, rows, and for the plain
    table the VACUUM's seconds and WAL."""
    column = "occurred_at" if table.retention is None else "created_at"
    count = f"SELECT count(*) FROM {table.events} WHERE {column} < now() - $1::interval"
    before_rows: int = await conn.fetchval(count, RETENTION)
    lsn = await wal(conn)
    started = time.perf_counter()
    if table.retention is not None:
        report = await maintain_outbox(conn, table)
        if not report.dropped or report.deferred:
            raise RuntimeError(f"the expired partition was not dropped: {report}")
    else:
        await cleanup(conn, RETENTION, table=table, batch=5000)
    seconds = time.perf_counter() - started
    written = await wal(conn) - lsn
    removed = before_rows - int(await conn.fetchval(count, RETENTION))
    if table.retention is not None:
        return seconds, written, removed, None, None
    lsn = await wal(conn)
    started = time.perf_counter()
    await conn.execute(f"VACUUM {table.events}")
    return seconds, written, removed, time.perf_counter() - started, await wal(conn) - lsn


async def one_pass(dsn: str, rows: int, mode: str) -> list[Result]:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    tables = {"drop": OutboxTable(schema, "kept", OutboxRetention(RETENTION)),
              "delete": OutboxTable(schema, "plain")}
    results = []
    conn = await asyncpg.connect(dsn)
    try:
        for table in tables.values():
            await migrate(conn, dedup=None, outboxes=[table])
            await fill(conn, table, rows)
        for method, table in tables.items():
            outbox = Outbox(schema, table.table, notify=False, retention=table.retention)
            if mode == "quiet":
                seconds, written, removed, vac, vac_wal = await operate(conn, table)
                results.append(Result(method, mode, seconds, written, removed, vac, vac_wal))
                continue
            async with Writer(dsn, outbox) as writer:
                start = time.perf_counter()
                seconds, written, removed, vac, vac_wal = await operate(conn, table)
                end = max(time.perf_counter(), start + 0.5)
            results.append(Result(method, mode, seconds, written, removed, vac, vac_wal,
                                  writer.between(0.0, start), writer.between(start, end)))
        left = await conn.fetchval(
            f"SELECT (SELECT count(*) FROM {tables['drop'].events}) + "
            f"(SELECT count(*) FROM {tables['delete'].events})")
        assert left >= 2 * max(1, rows // 10), "today's rows must stay"
    finally:
        with contextlib.suppress(asyncpg.PostgresError):
            await conn.execute(f"DROP PUBLICATION IF EXISTS {tables['drop'].publication}")
            await conn.execute(f"DROP SCHEMA {schema} CASCADE")
        await conn.close()
    for r in results:
        assert r.removed == rows, f"{r.method} removed {r.removed} of {rows}"
    return results


def _p(values: list[float], q: float) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.quantiles(values, n=100)[int(q) - 1]:.1f}"


def table_md(results: list[Result], rows: int) -> str:
    lines = [f"`python -m benchmarks.outbox_retention --rows {rows}`: {rows:,} expired rows "
             "(and a tenth as many of today) removed from an outbox kept in day partitions "
             "(drop) and from a plain one (`cleanup`, batches of 5,000, then `VACUUM`)\n",
             "| method | writer | seconds | WAL (KiB) | VACUUM s | VACUUM WAL (KiB) "
             "| writer commit p50 / p99 before (ms) | during (ms) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        vac = "-" if r.vacuum_seconds is None else f"{r.vacuum_seconds:.3f}"
        vac_wal = "-" if r.vacuum_wal is None else f"{r.vacuum_wal / 1024:,.0f}"
        lines.append(
            f"| {r.method} | {r.mode} | {r.seconds:.3f} | {r.wal_bytes / 1024:,.0f} | {vac} "
            f"| {vac_wal} | {_p(r.before, 50)} / {_p(r.before, 99)} "
            f"| {_p(r.during, 50)} / {_p(r.during, 99)} |")
    return "\n".join(lines)


@contextlib.contextmanager
def postgres(dsn: str | None) -> Iterator[str]:
    if dsn:
        yield dsn
        return
    with start_postgres() as server:
        yield server.dsn


async def run(dsn: str, rows: int, log: Callable[[str], None] = print) -> list[Result]:
    results: list[Result] = []
    for mode in ("quiet", "loaded"):
        for r in await one_pass(dsn, rows, mode):
            log(f"{r.method} ({r.mode}): {r.seconds:.3f}s, {r.wal_bytes:,} WAL bytes")
            results.append(r)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.outbox_retention",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--postgres", default=os.environ.get("CONSUMERKIT_TEST_POSTGRES_DSN"))
    args = parser.parse_args(argv)
    with postgres(args.postgres) as dsn:
        print(table_md(asyncio.run(run(dsn, args.rows)), args.rows))


if __name__ == "__main__":
    main()
