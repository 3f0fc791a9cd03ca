"""The relay's half of the pooler benchmark: one relay process publishing a backlog of
``rows`` outbox rows, through each way of reaching PostgreSQL, runs interleaved.

As ``outbox_peers`` measures it: the rows are written in one transaction held open until the
relay is up and holds every slot, the clock runs from that COMMIT until the outbox is empty,
then the topic is read back (every event, on its key, in its aggregate's order). Behind a
transaction pooler the relay holds its slots as leases and polls (no LISTEN): every relay of
this benchmark polls every 0.1 s, so the wake-up costs at most that.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import asyncpg

from consumerkit.outbox import OutboxTable
from consumerkit.outbox.table import SLOTS

from . import pgbouncer
from .broker import producer_flags
from .outbox import ROOT, _fill, _fresh, settled, stop_relays
from .outbox_peers import _drained
from .relay_check import check, read_topic

Log = Callable[[str], None]
POLL = 0.1
SETTLE_TIMEOUT = 120.0


def _start(dsn: str, bootstrap: str, table: OutboxTable, topic: str, pooler: str,
           uvloop: bool) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.outbox_relay_worker", "--dsn", dsn, "--bootstrap",
         bootstrap, "--schema", table.schema, "--topic", topic, "--name",
         f"{table.schema}-0", "--pooler", pooler, "--poll", str(POLL),
         *producer_flags(bootstrap), *([] if uvloop else ["--no-uvloop"])],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


async def _leased(conn: asyncpg.Connection[asyncpg.Record], table: OutboxTable,
                  relay: subprocess.Popen[bytes]) -> None:
    """Wait until the relay behind a transaction pooler holds a live lease on every slot."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while await conn.fetchval(
            f"SELECT count(*) FROM {table.leases} WHERE expires_at > now()") < SLOTS:
        if relay.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the relay behind the transaction pooler did not take its "
                               "slots")
        await asyncio.sleep(0.05)


async def run_once(direct: str, through: str, pooler: str, bootstrap: str, rows: int,
                   aggregates: int, uvloop: bool) -> dict[str, Any]:
    """One relay draining ``rows`` rows through ``through``: events/s, its check and, behind
    a PgBouncer, the statements and transactions it counted while draining."""
    conn = await asyncpg.connect(direct)
    table, topic = await _fresh(conn, bootstrap)
    relays: list[subprocess.Popen[bytes]] = []
    counted = through != direct
    try:
        fill = conn.transaction()
        await fill.start()
        await _fill(conn, table, rows, aggregates, notify=pooler != "transaction")
        relays = [_start(through, bootstrap, table, topic, pooler, uvloop)]
        watcher = await asyncpg.connect(direct)
        try:
            if pooler == "transaction":
                await _leased(watcher, table, relays[0])
            else:
                await settled(watcher, table, relays)
            before = pgbouncer.counts(through) if counted else None
            await fill.commit()
            seconds = await _drained(watcher, table.events, relays, 300.0)
            spent = pgbouncer.counts(through) - before if before else None
        finally:
            await watcher.close()
        if any(await asyncio.to_thread(stop_relays, relays)):
            raise RuntimeError("the relay process did not stop cleanly")
    finally:
        if conn.is_in_transaction():
            await conn.execute("ROLLBACK")
        await asyncio.to_thread(stop_relays, relays)
        await conn.execute(f'DROP SCHEMA "{table.schema}" CASCADE')
        await conn.close()
    verdict = check(await read_topic(bootstrap, topic, rows), rows, aggregates)
    return {"events_per_s": rows / seconds if verdict.exact else None, "seconds": seconds,
            "exact": verdict.exact, "detail": verdict.detail,
            "statements": spent.statements if spent else None,
            "transactions": spent.transactions if spent else None}


async def measure(direct: str, ways: Sequence[tuple[str, str, str]], bootstrap: str,
                  rows: int, runs: int, log: Log, uvloop: bool = True,
                  aggregates: int = 1_000) -> dict[str, list[dict[str, Any]]]:
    """``{way: [run, ...]}`` for each ``(way, dsn, pooler)``, runs interleaved."""
    samples: dict[str, list[dict[str, Any]]] = {way: [] for way, _dsn, _p in ways}
    for run in range(runs):
        order = list(ways[run % len(ways):]) + list(ways[:run % len(ways)])
        for way, dsn, pooler in order:
            try:
                sample = await run_once(direct, dsn, pooler, bootstrap, rows, aggregates,
                                        uvloop)
            except Exception as exc:  # a crash or a stuck relay is a WRONG run
                sample = {"events_per_s": None, "exact": False,
                          "detail": f"{type(exc).__name__}: {exc}"}
            samples[way].append(sample)
            rate = sample["events_per_s"]
            log(f"relay {way} run {run}: {f'{rate:,.0f} events/s' if rate else '-'}; "
                f"{'exact' if sample['exact'] else 'WRONG'}: {sample['detail']}")
    return samples
