"""Dedup cleanup under load: dropping an expired day's partition against deleting its rows.

Each pass: a consumerkit consumer (defaults) joins a fresh topic and schema; then its dedup
table gets ``rows`` ids seen in one UTC day nine days ago (past the default 7-day retention;
filled after the consumer's start-up maintenance, which would remove them at once), then
vacuumed and written out by a ``CHECKPOINT``, as a day-old partition would be; the consumer
then consumes a paced workload (``latency``); ``at`` seconds in, the cleanup runs on its own
connection:

- ``drop``: default (partitioned) layout; ``consumerkit.dedup.maintain`` drops the expired
  day's partition, timed as a whole (what the consumer's own maintenance does);
- ``delete``: the consumer uses ``DedupPolicy(layout="table")`` and ``maintain`` deletes the
  same rows in batches of 10,000, one transaction each (its own maintenance path), then a
  ``VACUUM`` of the table is timed apart. If the installed consumerkit has no table layout,
  the rows go to the partitioned table and the pass deletes them itself, slice by slice.

Both remove the same rows; the pass checks none is left. The consumer's p99 latency while the
cleanup runs (events sent from its start to at least one second later) is compared with its
p99 before. Passes alternate drop, delete; ``repeats`` times.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

import asyncpg

from consumerkit.dedup import DedupPolicy, maintain
from consumerkit.dedup.partitions import partition_floor, partition_name

from .effects import q
from .latency import Latencies, Pace, measure_latency
from .peer_consumerkit import ConsumerkitPeer, prefill_dedup, variant
from .peers import Peer
from .runner import Log

DAY = timedelta(days=1)


@dataclass(frozen=True, slots=True)
class CleanupSpec:
    rows: int = 200_000
    pace: Pace = field(default_factory=lambda: Pace(events=1500, rate=300.0))
    at: float = 2.0  # seconds after publishing starts
    batch: int = 10_000
    repeats: int = 1


async def _old_day(conn: asyncpg.Connection[asyncpg.Record]) -> datetime:
    now: datetime = await conn.fetchval("SELECT now()")
    return partition_floor(now - 9 * DAY, DAY)


TABLE_LAYOUT = "layout" in DedupPolicy.__dataclass_fields__


def _peer(method: str) -> type[ConsumerkitPeer]:
    if method == "delete" and TABLE_LAYOUT:
        return variant({"dedup": DedupPolicy(layout="table")}, "consumerkit[layout=table]")
    return ConsumerkitPeer


def _fill(rows: int) -> Any:
    async def setup(peer: Peer, conn: asyncpg.Connection[asyncpg.Record]) -> None:
        ck = cast(ConsumerkitPeer, peer)
        await prefill_dedup(conn, ck.env.schema, ck.consumer.dedup, ck.env.group, rows,
                            await _old_day(conn), DAY)
        await conn.execute(f"VACUUM (ANALYZE) {q(ck.env.schema)}.{ck.consumer.dedup.table}")
        with contextlib.suppress(asyncpg.InsufficientPrivilegeError):
            await conn.execute("CHECKPOINT")
    return setup


def _operation(method: str, spec: CleanupSpec) -> Any:
    async def run(peer: Peer) -> dict[str, Any]:
        ck = cast(ConsumerkitPeer, peer)
        policy, schema = ck.consumer.dedup, ck.env.schema
        table = f"{q(schema)}.{policy.table}"
        conn = await asyncpg.connect(ck.env.dsn, timeout=15)
        try:
            day = await _old_day(conn)
            result: dict[str, Any] = {"method": method, "start": time.time()}
            started = time.perf_counter()
            if method == "drop" or TABLE_LAYOUT:
                report = await maintain(conn, schema, policy)
                result["dropped"] = report.dropped
                result["deleted"] = getattr(report, "deleted", 0)
                result["deferred"] = report.deferred
            else:
                slices = max(1, math.ceil(spec.rows / spec.batch))
                deleted = 0
                for i in range(slices):
                    status = await conn.execute(
                        f"DELETE FROM {table} WHERE seen_at >= $1 AND seen_at < $2",
                        day + DAY * i / slices, day + DAY * (i + 1) / slices)
                    deleted += int(status.split()[-1])
                result["deleted"] = deleted
            result["seconds"] = time.perf_counter() - started
            result["end"] = time.time()
            if method == "delete":
                started = time.perf_counter()
                vacuumed = table if TABLE_LAYOUT else \
                    f"{q(schema)}.{q(partition_name(policy.table, day))}"
                await conn.execute(f"VACUUM {vacuumed}")
                result["vacuum_seconds"] = time.perf_counter() - started
            result["left"] = int(await conn.fetchval(
                f"SELECT count(*) FROM {table} WHERE seen_at < $1", day + DAY))
            return result
        finally:
            await conn.close()
    return run


def _summary(lat: Latencies, rows: int) -> dict[str, Any]:
    op = lat.operation
    start = op.get("start")
    end = max(op.get("end", 0.0), (start or 0.0) + 1.0)
    exact = lat.exact and op.get("left") == 0 and not op.get("deferred")
    return {
        "method": op.get("method"), "rows": rows, "removed": op.get("deleted"),
        "dropped": op.get("dropped"), "seconds": op.get("seconds"),
        "vacuum_seconds": op.get("vacuum_seconds"), "left": op.get("left"),
        "exact": exact, "detail": lat.detail,
        "baseline": lat.summary(end=start), "during": lat.summary(start, end),
        "points": [[round(s - (start or 0.0), 4), round(v * 1000, 3)] for s, v in lat.points],
    }


async def measure_cleanup(dsn: str, bootstrap: str, spec: CleanupSpec,
                          log: Log) -> list[dict[str, Any]]:
    passes = []
    for repeat in range(1, spec.repeats + 1):
        for method in ("drop", "delete"):
            lat = await measure_latency(_peer(method), dsn, bootstrap, None, spec.pace,
                                        joined=_fill(spec.rows),
                                        during=_operation(method, spec), at=spec.at)
            summary = {"repeat": repeat, **_summary(lat, spec.rows)}
            passes.append(summary)
            log(f"cleanup {method} of {spec.rows:,} rows: {summary['seconds'] or 0:.3f}s; "
                f"p99 before {summary['baseline']['p99_ms']} ms, during "
                f"{summary['during']['p99_ms']} ms; {'exact' if summary['exact'] else 'WRONG'}"
                f": {summary['detail']}")
    return passes
