"""consumerkit through PgBouncer against a direct connection, in one run.

    python -m benchmarks.pooler [--events 10000] [--rows 5000] [--runs 3] [--docs]
                                [--postgres DSN] [--kafka BOOTSTRAP]

Two PgBouncers in front of the same PostgreSQL, one in ``pool_mode = session`` and one in
``pool_mode = transaction`` (without protocol-level prepared statements, as PgBouncer before
1.21), and three ways to reach it: ``direct`` (``postgres_pooler="none"``), ``session`` and
``transaction`` (``postgres_pooler`` set to match). Measured on each way, runs interleaved:

- the consumer's batch path: ``consumerkit-batch`` (a batch handler, one set-based upsert per
  batch) reading a backlog of ``events`` messages, as the suite's main cell;
- the relay: one relay process publishing a backlog of ``rows`` outbox rows
  (:mod:`.pooler_relay`).

Each figure is the median of the runs with its ratio to ``direct`` in the same run, and
behind a PgBouncer the statements and server transactions it counted (``SHOW STATS``) per
event. ``--docs`` writes the result to ``benchmarks/pooler.md`` and into
``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from consumerkit.shared import aio
from consumerkit.shared.pooler import Pooler

from . import pgbouncer, pooler_relay
from .context import Services, collect, services
from .peer_consumerkit import ConsumerkitBatchPeer
from .peers import Peer, PeerEnv
from .runner import Settings, benchmark

Log = Callable[[str], None]
MODES: tuple[Pooler, ...] = ("session", "transaction")
POOL_SIZE = 20  # a session pooler pins concurrency + 2 backends per consumer
PREPARED_STATEMENTS = 200  # PgBouncer 1.21+'s compiled default for max_prepared_statements
PREPARED = f"max_prepared_statements={PREPARED_STATEMENTS}"
RESULT = Path(__file__).resolve().parent / "pooler.md"
PAGE = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
BEGIN, END = "<!-- pooler: python -m benchmarks.pooler --docs -->", "<!-- end of pooler -->"
NOTES = """\
On a shared machine the rounds of one way spread by 2x and more (other work runs on the same
cores): read a ratio within 0.2 of 1 as no difference, and one above 1 as noise, not a pooler
making anything faster. In session mode asyncpg resets each connection returned to its pool
(`pg_advisory_unlock_all()`, `CLOSE ALL`, `UNLISTEN *`, `RESET ALL`), which PgBouncer counts
as a transaction of its own: hence fewer statements per transaction than in transaction
mode, where the reset only rolls back.

Where transaction mode's time goes: without named prepared statements each statement with
parameters takes two round trips (Parse and Describe, then Bind and Execute). The consumer's
batch transaction runs six statements (`BEGIN`, the claim, the mark of the transaction, the
handler's upsert, the check before the commit, `COMMIT`), four with parameters: ten round
trips instead of six per batch of a few hundred records, 1 to 2 % of the batch's time on a
local socket. None can be dropped without a guarantee (the mark and the check find a
handler that ended the transaction); folding the mark into the claim would save one of the
ten at the cost of the dedup store's interface. The relay's round runs two statements with
parameters (the claim and the `DELETE`): four round trips instead of two per batch of 500.
Until this benchmark, the relay behind a transaction pooler ran at 0.3x of direct: its
claim's lease check, planned as a join, read and sorted the whole backlog before each
batch's `LIMIT`; it is now a filter on the rows read in order (`consumerkit/outbox/leases.py`).

PgBouncer 1.21 and later can carry protocol-level prepared statements from backend to
backend (`max_prepared_statements`). Given such a binary (`CONSUMERKIT_TEST_PGBOUNCER`;
`scripts/pgbouncer-newer.sh` builds 1.24.1 from Debian 13's source), the benchmark adds a
transaction-mode PgBouncer with `max_prepared_statements=200`, reached two ways:
consumerkit's `postgres_pooler="transaction"`, which sends no named statement, and asyncpg's
named statements (`postgres_pooler="none"`), for the consumer only: that setting keeps the
relay's session locks and LISTEN, which a transaction pooler breaks whatever it does with
statements. Both settings work through either version; the named statements save the
first round trip of each statement with parameters.
"""


@dataclasses.dataclass(frozen=True)
class Way:
    """One way to reach PostgreSQL: a DSN (direct, or a PgBouncer's) and the
    ``Postgres.pooler`` consumerkit is told."""

    name: str
    dsn: str
    pooler: Pooler
    relay: bool = True  # measured for the relay too (not where the relay cannot work)


def through(way: Way) -> type[Peer]:
    """``consumerkit-batch`` reaching PostgreSQL the ``way`` says."""
    dsn = way.dsn

    class Through(ConsumerkitBatchPeer):
        name = f"consumerkit-batch {way.name}"
        pooler = way.pooler
        description = f"consumerkit-batch, Postgres(pooler={pooler!r})"

        def __init__(self, env: PeerEnv) -> None:
            super().__init__(dataclasses.replace(env, dsn=dsn))
            self.env = env  # the runner's own reads (its effects, its poller) stay direct

    return Through


def _figures(way: str, rates: list[float], exact: bool, direct: list[float] | None,
             spent: pgbouncer.Counts | None, events: int) -> dict[str, Any]:
    """``rates`` and ``direct`` (the direct way's, ``None`` if WRONG) run by run: the ratio is
    the median of the rounds' own ratios, so a round slowed by other work on the machine
    slows both sides of its ratio."""
    median = statistics.median(rates) if exact and rates else None
    rounds = [r / d for r, d in zip(rates, direct or [], strict=False) if d]
    return {"way": way, "exact": exact, "median": median, "min": min(rates, default=None),
            "max": max(rates, default=None),
            "ratio": statistics.median(rounds) if exact and rounds else None,
            "round_ratios": rounds,
            "statements_per_event": spent.statements / events if spent else None,
            "statements_per_transaction": spent.statements / spent.transactions
            if spent and spent.transactions else None}


async def consumer_cell(svc: Services, ways: list[Way], events: int, runs: int,
                        log: Log) -> list[dict[str, Any]]:
    """``ways[0]`` is the direct one. Two ways through one PgBouncer share its counts, so
    each way's statements are counted only where it has its PgBouncer to itself."""
    settings = Settings(events=events, keys=1_000, dup_rate=0.1, runs=runs, deadline=300)
    peers = [through(way) for way in ways]
    shared = {w.dsn for w in ways if sum(v.dsn == w.dsn for v in ways) > 1}
    counted = [w for w in ways[1:] if w.dsn not in shared]
    before = {w.name: pgbouncer.counts(w.dsn) for w in counted}
    summaries = {s.peer: s for s in await benchmark(svc.dsn, svc.bootstrap, settings, peers,
                                                    log)}
    spent = {w.name: pgbouncer.counts(w.dsn) - before[w.name] for w in counted}
    direct = summaries[peers[0].name]
    return [_figures(w.name, summaries[p.name].rates, summaries[p.name].exact,
                     direct.rates if direct.exact else None, spent.get(w.name),
                     events * runs)
            for w, p in zip(ways, peers, strict=True)]


def relay_figures(samples: dict[str, list[dict[str, Any]]], rows: int,
                  ) -> list[dict[str, Any]]:
    def exact(way: str) -> bool:
        return all(s["exact"] for s in samples[way])

    direct = [s["events_per_s"] or 0.0 for s in samples["direct"]] if exact("direct") else None
    out = []
    for way, runs in samples.items():
        counted = [s for s in runs if s.get("statements") is not None]
        spent = pgbouncer.Counts(sum(s["transactions"] for s in counted),
                                 sum(s["statements"] for s in counted)) if counted else None
        out.append(_figures(way, [s["events_per_s"] or 0.0 for s in runs], exact(way),
                            direct, spent, rows * len(counted)))
    return out


def _table(rows: list[dict[str, Any]]) -> str:
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = ["| way | events/s median (min-max) | x direct (median of rounds) | "
             "statements per event | statements per transaction |", "|---|---|---|---|---|"]
    for r in rows:
        rate = (f"{r['median']:,.0f} ({r['min']:,.0f}-{r['max']:,.0f})" if r["exact"]
                else "WRONG")
        lines.append(f"| {r['way']} | {rate} | {num(r['ratio'], '.2f')} | "
                     f"{num(r['statements_per_event'], '.3f')} | "
                     f"{num(r['statements_per_transaction'], '.1f')} |")
    return "\n".join(lines)


def render(doc: dict[str, Any]) -> str:
    return (f"{BEGIN}\n## Through PgBouncer\n\n"
            f"`python -m benchmarks.pooler --events {doc['events']} --rows {doc['rows']} "
            f"--runs {doc['runs']}` ({doc['started']}; PgBouncer {doc['pgbouncer']}, "
            f"CPUs: {doc['context'].get('cpus', '?')}): "
            "the same PostgreSQL reached directly and through a PgBouncer in session and in "
            "transaction mode (no protocol-level prepared statements, as before 1.21: "
            "asyncpg's statement cache off), `postgres_pooler` set to match, and with a "
            "1.21+ binary through one tracking them; medians of interleaved runs, ratios "
            "to direct in the same run. Statements and transactions are PgBouncer's own "
            "counts (`SHOW STATS`); a direct connection has none to read.\n\n"
            f"**The consumer's batch path** (`consumerkit-batch`, {doc['events']:,} messages, "
            f"10 % duplicates, 4 partitions):\n\n{_table(doc['consumer'])}\n\n"
            f"**The relay** (one process, a backlog of {doc['rows']:,} outbox rows, polling "
            f"every {pooler_relay.POLL:g} s):\n\n{_table(doc['relay'])}\n\n{NOTES}{END}\n")


def write_docs(text: str, page: Path = PAGE, result: Path = RESULT) -> None:
    """``text`` into ``result`` and in place of the last run's in ``page``."""
    result.write_text(text)
    before = page.read_text()
    if BEGIN in before and END in before:
        head, rest = before.split(BEGIN, 1)
        page.write_text(head + text.rstrip("\n") + rest.split(END, 1)[1])
    else:
        page.write_text(before.rstrip("\n") + "\n\n" + text)


async def run(svc: Services, events: int, rows: int, runs: int, log: Log,
              uvloop: bool = True) -> dict[str, Any]:
    """Both cells through the PgBouncers this starts (stopped afterwards)."""
    from datetime import UTC, datetime

    bouncers = [pgbouncer.start(svc.dsn, mode, POOL_SIZE) for mode in MODES]
    ways = [Way("direct", svc.dsn, "none"),
            *(Way(m, b.dsn, m) for m, b in zip(MODES, bouncers, strict=True))]
    if pgbouncer.tracks_prepared_statements():
        tracked = pgbouncer.start(svc.dsn, "transaction", POOL_SIZE, PREPARED_STATEMENTS)
        bouncers.append(tracked)
        ways += [Way(f"transaction, {PREPARED}", tracked.dsn, "transaction"),
                 # asyncpg's named statements, which such a PgBouncer carries across
                 # backends; the relay's session locks cannot work there
                 Way(f"transaction, {PREPARED}, postgres_pooler='none'", tracked.dsn, "none",
                     relay=False)]
    try:
        doc: dict[str, Any] = {"events": events, "rows": rows, "runs": runs,
                               "started": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                               "pgbouncer": pgbouncer.version(),
                               "context": await collect(svc, uvloop)}
        log("== consumer: the batch path")
        doc["consumer"] = await consumer_cell(svc, ways, events, runs, log)
        log("== relay")
        samples = await pooler_relay.measure(
            svc.dsn, [(w.name, w.dsn, w.pooler) for w in ways if w.relay],
            svc.bootstrap, rows, runs, log, uvloop)
        doc["relay"] = relay_figures(samples, rows)
        return doc
    finally:
        for bouncer in bouncers:
            bouncer.stop()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.pooler",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--events", type=int, default=10_000)
    p.add_argument("--rows", type=int, default=5_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--docs", action="store_true", help="write docs/benchmarks.md's section")
    p.add_argument("--postgres")
    p.add_argument("--kafka")
    p.add_argument("--no-uvloop", dest="uvloop", action="store_false")
    args = p.parse_args(argv)
    if (reason := pgbouncer.missing()) is not None:
        print(f"python -m benchmarks.pooler: {reason}", file=sys.stderr)
        return 2

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with services(args.postgres, args.kafka) as svc:
        doc = aio.run(run(svc, args.events, args.rows, args.runs, log, args.uvloop),
                      use_uvloop=args.uvloop)
    text = render(doc)
    if args.docs:
        write_docs(text)
    print(text)
    return 0 if all(r["exact"] for r in doc["consumer"] + doc["relay"]) else 1


if __name__ == "__main__":
    sys.exit(main())
