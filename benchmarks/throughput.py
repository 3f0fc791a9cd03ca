"""Throughput of consumerkit against its peers, measured in one run.

    python -m benchmarks.throughput [--events N] [--keys K] [--dup-rate R] [--runs 3]
                                    [--json out.json] [--postgres DSN] [--kafka BOOTSTRAP]

Prints the median msg/s of ``--runs`` with min and max per peer, the ratios to the raw ceiling
and to the textbook peer, whether each peer's effects were exact, and the run's context.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

from consumerkit.shared import aio

from .context import collect, services, tune_gc
from .lineup import PEERS, SUITE
from .report import Summary, context_lines, table, to_json, write_json
from .runner import Settings, benchmark


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    defaults = Settings()
    p = argparse.ArgumentParser(prog="python -m benchmarks.throughput",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--events", type=int, default=defaults.events,
                   help="messages published, duplicates included (default %(default)s)")
    p.add_argument("--keys", type=int, default=defaults.keys, help="default %(default)s")
    p.add_argument("--dup-rate", type=float, default=defaults.dup_rate,
                   help="share of messages that re-publish an earlier event (default 0.05)")
    p.add_argument("--runs", type=int, default=defaults.runs, help="default %(default)s")
    p.add_argument("--partitions", type=int, default=defaults.partitions,
                   help="default %(default)s")
    p.add_argument("--deadline", type=float, default=defaults.deadline,
                   help="seconds one peer may take for one run (default %(default)s)")
    p.add_argument("--peers", default=",".join(SUITE),
                   help="comma-separated subset of: " + ", ".join(PEERS))
    p.add_argument("--postgres", help="DSN (else $CONSUMERKIT_TEST_POSTGRES_DSN, else embedded)")
    p.add_argument("--kafka", help="bootstrap (else $CONSUMERKIT_TEST_KAFKA_BOOTSTRAP, else "
                                   "an embedded Tansu broker)")
    p.add_argument("--no-uvloop", dest="uvloop", action="store_false",
                   help="run on the standard asyncio loop even when uvloop is installed")
    p.add_argument("--no-gc-tuning", dest="gc_tuning", action="store_false",
                   help="keep CPython's collector settings (else tuned as `consumerkit run` "
                        "tunes them, for every peer)")
    p.add_argument("--json", type=Path, help="also write the results and context here")
    args = p.parse_args(argv)
    unknown = set(args.peers.split(",")) - set(PEERS)
    if unknown:
        p.error(f"unknown peers: {', '.join(sorted(unknown))}")
    if args.runs < 1 or args.events < 1 or args.keys < 1 or not 0 <= args.dup_rate < 1:
        p.error("need --runs >= 1, --events >= 1, --keys >= 1 and 0 <= --dup-rate < 1")
    return args


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    peers = [PEERS[name] for name in args.peers.split(",")]
    with services(args.postgres, args.kafka, want_redis=True) as svc, \
            asyncio.Runner(loop_factory=aio.loop_factory(args.uvloop)) as runner:
        settings = Settings(events=args.events, keys=args.keys, dup_rate=args.dup_rate,
                            runs=args.runs, partitions=args.partitions, deadline=args.deadline,
                            redis_url=svc.redis_url)
        for peer in list(peers):
            reason = peer.unavailable(settings.redis_url)
            if reason:
                _log(f"{peer.name}: unavailable: {reason}")
                peers.remove(peer)
        context = runner.run(collect(svc, args.uvloop, tune_gc(args.gc_tuning)))
        _log("\n".join(f"{k}: {v}" for k, v in context.items()))
        summaries: list[Summary] = runner.run(
            benchmark(svc.dsn, svc.bootstrap, settings, peers, _log))
    workload = (f"{settings.events} messages over {settings.keys} keys, "
                f"{settings.dup_rate:.0%} duplicates, {settings.partitions} partitions, "
                f"one upsert per distinct event; median of {settings.runs} runs")
    print(f"\n{workload}\n\n{table(summaries)}\n\n{context_lines(context)}")
    if args.json:
        fields = {k: v for k, v in dataclasses.asdict(settings).items() if k != "redis_url"}
        write_json(args.json, to_json(summaries, context, {**fields, "peers": args.peers}))
    return 0 if all(s.exact for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
