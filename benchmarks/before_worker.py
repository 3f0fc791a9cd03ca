"""consumerkit of an earlier revision consuming the benchmark topic, in a process of its own.

    CK_BEFORE_DSN=DSN python -P benchmarks/before_worker.py migrate --schema S --group G
    CK_BEFORE_DSN=DSN python -P benchmarks/before_worker.py consume --schema S --group G
        --bootstrap HOST:PORT --topic T --event-type TYPE --sql UPSERT --kafka-options JSON
        [--young N] [--uvloop]

:mod:`benchmarks.peer_before` runs it by path with ``-P`` (neither this directory nor the
working directory goes on ``sys.path``) and ``PYTHONPATH`` at a tree of that revision, so the
``consumerkit`` imported is that revision's; the first line it prints, ``module <path>``, says
which one was. Its handler is the one the ``consumerkit`` peer uses (one awaited upsert), on
that revision's defaults. ``consume`` then prints ``startup <CPU seconds>`` (imports and
construction, not the consumer's work), a line whenever its counts change, ``<received>
<handled> <time.time() of the first delivery, or 0>``, and, once stopped by SIGTERM (or its
parent's exit), ``cpu <CPU seconds>`` of its whole life.
"""

# no "from __future__ import annotations": the handler's annotations must be objects, since
# its payload model and context type are imported in the function that defines it

import argparse
import asyncio
import gc
import importlib
import json
import os
import resource
import signal
import time
from collections.abc import Sequence
from typing import Any

DSN_VARIABLE = "CK_BEFORE_DSN"
"""Where the worker reads the database's DSN (an argument would show its password to ``ps``)."""
REPORT_EVERY = 0.005
"""Seconds between two looks at the consumer's counts (the runner samples its peers so)."""
_stop_early: list[int] = []  # a SIGTERM that came before the event loop's handler


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def prepare(args: argparse.Namespace) -> None:
    import asyncpg

    from consumerkit import migrate

    conn = await asyncpg.connect(os.environ[DSN_VARIABLE])
    try:
        await migrate(conn, args.schema, namespace=args.group)
    finally:
        await conn.close()


def counts(consumer: Any) -> tuple[int, int]:
    s = consumer.stats
    return s.delivered, s.applied + s.duplicates + s.dead_lettered + s.expired_skipped


async def consume(args: argparse.Namespace) -> None:
    from pydantic import BaseModel

    from consumerkit import HandlerContext, handler

    # the earlier revision's constructor, whose keyword arguments this tree no longer has
    Consumer: Any = importlib.import_module("consumerkit").Consumer

    class Amount(BaseModel):
        """The payload every peer decodes (``benchmarks.workload.Amount``)."""

        key: str
        amount: int

    sql = args.sql

    @handler(args.event_type)
    async def apply_amount(event: Amount, ctx: HandlerContext) -> None:
        await ctx.tx.execute(sql, event.key, event.amount)

    consumer = Consumer(
        name=args.group, handlers=[apply_amount], topics=[args.topic],
        kafka_bootstrap=args.bootstrap, postgres_dsn=os.environ[DSN_VARIABLE],
        schema=args.schema, handle_signals=False,
        kafka_consumer_options=json.loads(args.kafka_options))
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    if _stop_early:
        stopping.set()
    if args.young:  # the footing of the peers in the runner's process (consumerkit.shared.heap)
        gc.collect()
        gc.freeze()
        first, middle, old = gc.get_threshold()
        gc.set_threshold(max(first, args.young), middle, old)
    print("startup", _cpu(), flush=True)
    task = asyncio.create_task(consumer.run())
    stop = asyncio.create_task(stopping.wait())
    parent = os.getppid()
    last, first_at = (-1, -1), 0.0

    def report() -> None:
        nonlocal last, first_at
        now = counts(consumer)
        if now[0] and not first_at:
            first_at = time.time()
        if now != last:
            print(now[0], now[1], first_at, flush=True)
            last = now

    while not (task.done() or stopping.is_set()):
        report()
        if os.getppid() != parent:  # the runner is gone: nobody will stop us
            break
        await asyncio.wait({task, stop}, timeout=REPORT_EVERY)
    if not task.done():
        await consumer.stop()
    await task
    stop.cancel()
    report()


def main(argv: Sequence[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, lambda _signum, _frame: _stop_early.append(1))
    p = argparse.ArgumentParser(prog="benchmarks/before_worker.py")
    p.add_argument("command", choices=("migrate", "consume"))
    for name in ("--schema", "--group"):
        p.add_argument(name, required=True)
    for name in ("--bootstrap", "--topic", "--event-type", "--sql", "--kafka-options"):
        p.add_argument(name)
    p.add_argument("--young", type=int, default=0, help="the collector's young threshold")
    p.add_argument("--uvloop", action="store_true")
    args = p.parse_args(argv)
    print("module", importlib.import_module("consumerkit").__file__, flush=True)
    if args.command == "migrate":
        asyncio.run(prepare(args))
        return
    if args.uvloop:
        import uvloop
        uvloop.run(consume(args))
    else:
        asyncio.run(consume(args))
    print("cpu", _cpu(), flush=True)


if __name__ == "__main__":
    main()
