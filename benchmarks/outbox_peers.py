"""consumerkit's outbox relay against faststream-outbox, in one run, on the same PostgreSQL and
broker, with the effects checked exact:

    python -m benchmarks.outbox_peers [--rows 10000] [--aggregates 1000] [--runs 3]
                                      [--peers consumerkit,faststream-outbox,...]

Each run of a peer gets a fresh schema and a fresh topic of 8 partitions, ``rows`` events over
``aggregates`` aggregates written beforehand in one transaction that stays open until the
relay (its own OS process) is up, idle and listening; the clock runs from that COMMIT to the
moment the outbox table is empty (judged from PostgreSQL: both relays delete a row only after
the broker acknowledged it). Then the topic is read back from the start: every event must be
there, each on its aggregate's key, and each aggregate's events in the order written (first
deliveries); duplicates (allowed: both relays are at-least-once) are counted. A run that loses,
reorders or misroutes an event makes the peer WRONG, not ranked. Runs are interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import asyncpg

from consumerkit.shared import aio

from .broker import traits
from .context import collect, services
from .outbox import _fill, _fresh, settled, start_relay, stop_relays
from .relay_check import PARTITIONS, Verdict, check, read_topic

Log = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class RelaySpec:
    """The relay comparison of a profile: ``rows`` events, ``runs`` interleaved runs."""

    rows: int
    runs: int = 3
    aggregates: int = 1_000
    deadline: float = 300.0


@dataclass(frozen=True, slots=True)
class RelayPeer:
    name: str
    description: str
    workers: int = 0  # faststream-outbox only: max_workers, rows claimed per fetch, per DELETE
    fetch_batch: int = 0
    flush_batch: int = 0

    @property
    def faststream(self) -> bool:
        return self.workers > 0

    @property
    def keeps_order(self) -> bool:
        """Whether its design keeps each aggregate's order (one publisher at a time)."""
        return self.workers <= 1


CONSUMERKIT = RelayPeer("consumerkit", "consumerkit.outbox.Relay, one process, defaults "
                        "(batches of 500, NOTIFY), Kafka sink with acks=all")
PEERS = {p.name: p for p in (
    CONSUMERKIT,
    RelayPeer("faststream-outbox", "faststream-outbox 0.19 as its relay tutorial writes it: one "
              "subscriber (max_workers=1, fetch_batch_size=10), per row an awaited "
              "KafkaBroker.publish (acks=all), then one DELETE per row", 1, 10, 1),
    RelayPeer("faststream-outbox-batched", "the same with fetch_batch_size=500 and "
              "terminal_flush_batch_size=500 (one DELETE per 500 rows), still one worker", 1,
              500, 500),
    RelayPeer("faststream-outbox-8-workers", "the batched settings with max_workers=8 "
              "(rows of one aggregate may be published out of order)", 8, 500, 500),
)}


@dataclass(slots=True)
class Sample:
    run: int
    events_per_s: float | None
    seconds: float
    verdict: Verdict


@dataclass(slots=True)
class PeerResult:
    peer: str
    description: str
    keeps_order: bool
    samples: list[Sample] = field(default_factory=list)
    unavailable: str | None = None

    def summary(self) -> dict[str, Any]:
        exact = bool(self.samples) and all(s.verdict.exact for s in self.samples)
        rates = [s.events_per_s for s in self.samples if s.events_per_s is not None]
        return {"peer": self.peer, "description": self.description,
                "keeps_order": self.keeps_order, "unavailable": self.unavailable,
                "exact": exact and not self.unavailable,
                "median_events_per_s": statistics.median(rates) if exact and rates else None,
                "min_events_per_s": min(rates) if exact and rates else None,
                "max_events_per_s": max(rates) if exact and rates else None,
                "duplicates": sum(s.verdict.duplicates for s in self.samples),
                "samples": [{"run": s.run, "events_per_s": s.events_per_s,
                             "seconds": s.seconds, **asdict(s.verdict)} for s in self.samples]}


def unavailable(peer: RelayPeer) -> str | None:
    if not peer.faststream:
        return None
    try:
        import faststream_outbox  # noqa: F401
        import sqlalchemy.ext.asyncio  # noqa: F401
    except ImportError as exc:
        return f"faststream-outbox is not installed ({exc}): pip install -e '.[bench]'"
    return None


async def _drained(conn: asyncpg.Connection[asyncpg.Record], table: str,
                   procs: list[subprocess.Popen[bytes]], deadline: float) -> float:
    """Seconds from now until ``table`` is empty."""
    start = time.monotonic()
    while await conn.fetchval(f"SELECT count(*) FROM {table}"):
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("the relay process died during the run")
        if time.monotonic() - start > deadline:
            raise RuntimeError(f"the outbox was not drained within {deadline:g} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def run_consumerkit(dsn: str, bootstrap: str, rows: int, aggregates: int,
                          uvloop: bool, deadline: float) -> tuple[float, str]:
    """(seconds, topic) of one consumerkit relay process draining ``rows`` rows."""
    conn = await asyncpg.connect(dsn)
    table, topic = await _fresh(conn, bootstrap)
    relays: list[subprocess.Popen[bytes]] = []
    try:
        fill = conn.transaction()
        await fill.start()
        await _fill(conn, table, rows, aggregates, notify=True)
        relays = [start_relay(dsn, bootstrap, table, topic, f"{table.schema}-0",
                              uvloop=uvloop)]
        watcher = await asyncpg.connect(dsn)
        try:
            await settled(watcher, table, relays)
            await fill.commit()
            seconds = await _drained(watcher, table.events, relays, deadline)
        finally:
            await watcher.close()
        if any(await asyncio.to_thread(stop_relays, relays)):
            raise RuntimeError("the relay process did not stop cleanly")
        return seconds, topic
    finally:
        if conn.is_in_transaction():
            await conn.execute("ROLLBACK")
        await asyncio.to_thread(stop_relays, relays)
        await conn.execute(f'DROP SCHEMA "{table.schema}" CASCADE')
        await conn.close()


async def run_faststream(peer: RelayPeer, dsn: str, bootstrap: str, rows: int,
                         aggregates: int, uvloop: bool, deadline: float) -> tuple[float, str]:
    """(seconds, topic) of one faststream-outbox relay process draining ``rows`` rows."""
    from consumerkit.transport.kafka_admin import create_topic

    from . import outbox_peer_worker as worker

    suffix = uuid.uuid4().hex[:8]
    schema, table = f"fso_bench_{suffix}", f"outbox_{suffix}"
    topic = f"ck-bench-fso-{suffix}"
    await create_topic(bootstrap, topic, PARTITIONS,
                       replication_factor=traits(bootstrap).replication_factor)
    writer = worker.outbox_broker(dsn, worker.outbox_table(schema, table))
    engine = writer.config.broker_config.engine
    assert engine is not None
    watcher = await asyncpg.connect(dsn)
    proc: subprocess.Popen[bytes] | None = None
    try:
        await watcher.execute(f'CREATE SCHEMA "{schema}"')
        async with engine.begin() as ddl:
            await ddl.run_sync(worker.outbox_table(schema, table).metadata.create_all)
        async with engine.connect() as conn:
            fill = await conn.begin()  # invisible to the relay until the clock starts
            for start in range(0, rows, 1000):
                await writer.publish_batch(
                    *({"n": n, "a": f"a-{n % aggregates}", "pad": "x" * 64}
                      for n in range(start, min(rows, start + 1000))),
                    queue=worker.QUEUE, session=conn)
            proc = worker.start(dsn, bootstrap, schema, table, topic, workers=peer.workers,
                                fetch_batch=peer.fetch_batch, flush_batch=peer.flush_batch,
                                uvloop=uvloop)
            assert proc.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
            if line.strip() != b"ready":
                raise RuntimeError(f"faststream-outbox relay did not start: {line!r}")
            await _listening(watcher, f"outbox_{table}", proc)
            await fill.commit()
            seconds = await _drained(watcher, f'"{schema}"."{table}"', [proc], deadline)
        codes = await asyncio.to_thread(stop_relays, [proc])
        if any(codes):
            raise RuntimeError(f"the faststream-outbox relay exited with {codes[0]} on SIGTERM")
        return seconds, topic
    finally:
        if proc is not None:
            await asyncio.to_thread(stop_relays, [proc])
        await watcher.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await watcher.close()
        await engine.dispose()


async def _listening(conn: asyncpg.Connection[asyncpg.Record], channel: str,
                     proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    """Wait until a session LISTENs on ``channel``: a NOTIFY at the COMMIT then wakes the
    relay at once, as it wakes consumerkit's."""
    deadline = time.monotonic() + timeout
    while not await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE $1", f"LISTEN%{channel}%"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"faststream-outbox relay is not listening on {channel}")
        await asyncio.sleep(0.05)


async def measure(peer: RelayPeer, run: int, dsn: str, bootstrap: str, rows: int,
                  aggregates: int, uvloop: bool, deadline: float) -> Sample:
    if peer.faststream:
        seconds, topic = await run_faststream(peer, dsn, bootstrap, rows, aggregates, uvloop,
                                              deadline)
    else:
        seconds, topic = await run_consumerkit(dsn, bootstrap, rows, aggregates, uvloop,
                                               deadline)
    verdict = check(await read_topic(bootstrap, topic, rows), rows, aggregates)
    return Sample(run, rows / seconds if verdict.exact else None, seconds, verdict)


async def compare(dsn: str, bootstrap: str, peers: Sequence[RelayPeer], rows: int,
                  aggregates: int, runs: int, log: Log, uvloop: bool = True,
                  deadline: float = 300.0) -> dict[str, Any]:
    """Every peer ``runs`` times, interleaved (round r starts with the r-th peer)."""
    results = {p.name: PeerResult(p.name, p.description, p.keeps_order,
                                  unavailable=unavailable(p)) for p in peers}
    ready = [p for p in peers if not results[p.name].unavailable]
    for run in range(runs):
        order = ready[run % len(ready):] + ready[:run % len(ready)] if ready else []
        for peer in order:
            try:
                sample = await measure(peer, run, dsn, bootstrap, rows, aggregates, uvloop,
                                       deadline)
            except Exception as exc:  # a crash or a missed deadline is a WRONG run
                sample = Sample(run, None, 0.0, Verdict.failed(f"{type(exc).__name__}: {exc}"))
            results[peer.name].samples.append(sample)
            rate = f"{sample.events_per_s:,.0f} events/s" if sample.events_per_s else "-"
            log(f"relay {peer.name} run {run}: {rate}; "
                f"{'exact' if sample.verdict.exact else 'WRONG'}: {sample.verdict.detail}")
    return {"rows": rows, "aggregates": aggregates, "partitions": PARTITIONS, "runs": runs,
            "peers": [results[p.name].summary() for p in peers]}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.outbox_peers",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=10_000)
    p.add_argument("--aggregates", type=int, default=1_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--peers", default=",".join(PEERS), help="any of: " + ", ".join(PEERS))
    p.add_argument("--postgres")
    p.add_argument("--kafka")
    p.add_argument("--no-uvloop", dest="uvloop", action="store_false")
    args = p.parse_args(argv)
    unknown = set(args.peers.split(",")) - set(PEERS)
    if unknown:
        p.error(f"unknown peers: {', '.join(sorted(unknown))}")
    peers = [PEERS[name] for name in args.peers.split(",")]

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    async def both(svc: Any) -> tuple[dict[str, str], dict[str, Any]]:
        context = await collect(svc, args.uvloop)
        return context, await compare(svc.dsn, svc.bootstrap, peers, args.rows,
                                      args.aggregates, args.runs, log, args.uvloop)

    with services(args.postgres, args.kafka) as svc:
        context, result = aio.run(both(svc), use_uvloop=args.uvloop)
    from .markdown import relay_section

    print(relay_section(result))
    print("\n".join(f"- {k}: {v}" for k, v in context.items()))
    return 0 if all(r["exact"] or r["unavailable"] for r in result["peers"]) else 1


if __name__ == "__main__":
    sys.exit(main())
