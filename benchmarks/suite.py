"""The benchmark suite: every peer on every cell of a profile, in one run, on the same
PostgreSQL and broker; results as JSON, Markdown and PNG plots.

    python -m benchmarks [--profile quick|full] [--out results/] [--docs]
                         [--cells main,dup50] [--broker tansu|kafka] [--postgres DSN]
                         [--kafka BOOTSTRAP] [--redis URL]

``--broker kafka`` runs every peer on a three-broker Apache Kafka cluster instead of Tansu
(:mod:`.broker`). ``--docs`` also writes the Markdown summary into ``docs/benchmarks.md``, in
that broker's section. The exit status is 1 when any peer's effects were wrong (the negative
controls of the smoke test aside).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from consumerkit.shared import aio
from tests.harness.kafka import MissingToolError

from . import acceptance, docs, markdown, plots
from .broker import KINDS
from .cleanup import measure_cleanup
from .context import Services, collect, services, tune_gc
from .latency import Pace, measure_latency
from .lineup import PEERS
from .outbox_peers import PEERS as RELAY_PEERS
from .outbox_peers import compare
from .peers import Peer
from .profiles import PROFILES, Cell, Profile
from .report import Summary, peers_json
from .runner import Log, benchmark


async def run_cell(svc: Services, cell: Cell, peers: Sequence[type[Peer]], log: Log,
                   ) -> dict[str, Any]:
    """Measure ``peers`` on ``cell``: throughput runs, then latency runs if the cell has any."""
    settings = dataclasses.replace(cell.settings, redis_url=svc.redis_url)
    ready = [p for p in peers if not p.unavailable(svc.redis_url)]
    for peer in peers:
        if peer not in ready:
            log(f"{cell.name}: {peer.name} unavailable: {peer.unavailable(svc.redis_url)}")
    measured = {s.peer: s for s in await benchmark(svc.dsn, svc.bootstrap, settings, ready, log)
                } if ready else {}
    if cell.latency is not None:
        for peer in ready:
            if cell.latency_peers is None or peer.name in cell.latency_peers:
                await _latency(svc, peer, cell.latency, measured[peer.name], log)
    summaries = [measured.get(p.name) or Summary(p.name, p.description,
                                                 unavailable=p.unavailable(svc.redis_url))
                 for p in peers]
    fields = {k: v for k, v in dataclasses.asdict(settings).items() if k != "redis_url"}
    return {"name": cell.name, "title": cell.title, "settings": fields,
            "latency_pace": dataclasses.asdict(cell.latency) if cell.latency else None,
            "peers": peers_json(summaries)}


async def _latency(svc: Services, peer: type[Peer], pace: Pace, summary: Summary,
                   log: Log) -> None:
    lat = await measure_latency(peer, svc.dsn, svc.bootstrap, svc.redis_url, pace)
    summary.latency = {**lat.summary(), "exact": lat.exact, "detail": lat.detail,
                       "rate": pace.rate}
    log(f"latency {peer.name}: p50 {summary.latency['p50_ms']} ms, p99 "
        f"{summary.latency['p99_ms']} ms; {'exact' if lat.exact else 'WRONG'}: {lat.detail}")


async def run_suite(svc: Services, profile: Profile, log: Log, cells: set[str] | None = None,
                    extra: Sequence[type[Peer]] = (),
                    progress: Callable[[dict[str, Any]], None] = lambda _doc: None,
                    uvloop: bool = True, gc_tuning: bool = True) -> dict[str, Any]:
    """Run ``profile`` (its cells named in ``cells``, else all); ``extra`` peers join every
    cell (the smoke test's broken peers). ``progress`` gets the document after each cell."""
    started = time.monotonic()
    document: dict[str, Any] = {
        "profile": profile.name, "broker": svc.kind,
        "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "context": await collect(svc, uvloop, tune_gc(gc_tuning)), "cells": [],
        "cleanup": None, "relay": None, "seconds": 0.0}
    catalogue = {**PEERS, **profile.extra_peers}
    for cell in profile.cells:
        if cells is not None and cell.name not in cells:
            continue
        log(f"== cell {cell.name}: {cell.title}")
        peers = [catalogue[name] for name in cell.peers] + list(extra)
        document["cells"].append(await run_cell(svc, cell, peers, log))
        document["seconds"] = time.monotonic() - started
        progress(document)
    if profile.cleanup is not None and (cells is None or "cleanup" in cells):
        log("== cleanup: drop partition vs DELETE under load")
        document["cleanup"] = await measure_cleanup(svc.dsn, svc.bootstrap, profile.cleanup,
                                                    log)
    if profile.relay is not None and (cells is None or "relay" in cells):
        spec = profile.relay
        log(f"== relay: consumerkit's relay against faststream-outbox ({spec.rows:,} events)")
        document["relay"] = await compare(svc.dsn, svc.bootstrap, list(RELAY_PEERS.values()),
                                          spec.rows, spec.aggregates, spec.runs, log, uvloop,
                                          spec.deadline)
    document["seconds"] = time.monotonic() - started
    document["acceptance"] = acceptance.judge(document)
    return document


def write(document: dict[str, Any], out: Path) -> list[Path]:
    """``out/<timestamp>.json``, ``.md`` and the PNG plots."""
    out.mkdir(parents=True, exist_ok=True)
    stem = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    json_path, md_path = out / f"{stem}.json", out / f"{stem}.md"
    json_path.write_text(json.dumps(document, indent=1) + "\n")
    md_path.write_text(markdown.render(document))
    return [json_path, md_path, *plots.plot(document, out, stem)]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--profile", choices=sorted(PROFILES), default="quick")
    p.add_argument("--out", type=Path, default=Path("results"))
    p.add_argument("--docs", action="store_true",
                   help="write the summary into docs/benchmarks.md")
    p.add_argument("--cells", help="comma-separated subset of the profile's cells "
                                   "(and 'cleanup', 'relay')")
    p.add_argument("--broker", choices=KINDS, default="tansu",
                   help="the broker every peer runs on: Tansu (default) or Apache Kafka, "
                        "three brokers started for the run (Java 17+ and Maven) unless "
                        "--kafka names a cluster")
    p.add_argument("--postgres", help="DSN (else $CONSUMERKIT_TEST_POSTGRES_DSN, else embedded)")
    p.add_argument("--kafka", help="bootstrap (else $CONSUMERKIT_TEST_KAFKA_BOOTSTRAP, else "
                                   "a broker started for the run, as --broker says)")
    p.add_argument("--redis", help="URL (else $CONSUMERKIT_TEST_REDIS_URL, else "
                                   "redis://127.0.0.1:6379/0 if it answers, else a local "
                                   "redis-server)")
    p.add_argument("--no-uvloop", dest="uvloop", action="store_false",
                   help="run on the standard asyncio loop even when uvloop is installed")
    p.add_argument("--no-gc-tuning", dest="gc_tuning", action="store_false",
                   help="keep CPython's collector settings (else tuned as `consumerkit run` "
                        "tunes them, for every peer)")
    return p.parse_args(argv)


_START = time.monotonic()


def _log(line: str) -> None:
    print(f"[{time.monotonic() - _START:6.1f}s] {line}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    profile = PROFILES[args.profile]()
    cells = set(args.cells.split(",")) if args.cells else None
    try:
        with services(args.postgres, args.kafka, args.redis, want_redis=True,
                      broker_kind=args.broker) as svc:
            document = aio.run(run_suite(svc, profile, _log, cells, uvloop=args.uvloop,
                                         gc_tuning=args.gc_tuning),
                               use_uvloop=args.uvloop)
    except MissingToolError as exc:  # no Java or Maven for --broker kafka: what to install
        print(f"python -m benchmarks: {exc}", file=sys.stderr)
        return 2
    for path in write(document, args.out):
        _log(f"wrote {path}")
    if args.docs:
        _log(f"wrote {docs.write(document)}")
    print(markdown.render(document))
    wrong = [p["peer"] for c in document["cells"] for p in c["peers"]
             if not p["exact"] and not p["unavailable"]]
    wrong += [f"cleanup {p['method']}" for p in document["cleanup"] or [] if not p["exact"]]
    wrong += [f"relay {p['peer']}" for p in (document["relay"] or {}).get("peers", [])
              if not p["exact"] and not p["unavailable"]]
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
