"""consumerkit of an earlier revision consuming the benchmark topic, in a process of its own.

    CK_BEFORE_DSN=DSN python benchmarks/before_worker.py migrate --schema S --group G
    CK_BEFORE_DSN=DSN python benchmarks/before_worker.py consume --schema S --group G
        --bootstrap HOST:PORT --topic T --event-type TYPE --sql UPSERT --kafka-options JSON
        [--young N] [--uvloop]

:mod:`benchmarks.peer_before` runs it as a script, not with ``-m``, and with ``PYTHONPATH``
set to a tree of that revision: nothing of this tree is imported, so ``consumerkit`` is that
revision's. Its handler is the one the ``consumerkit`` peer uses (one awaited upsert), on
that revision's defaults. ``consume`` first prints ``startup <CPU seconds>`` (imports and
construction, which the runner does not count as consuming), then a line whenever its counts
change, ``<received> <handled> <time.time() of the first delivery, or 0>``, and stops on
SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import signal
import time
from collections.abc import Sequence
from typing import Any

import asyncpg
from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, handler, migrate

DSN_VARIABLE = "CK_BEFORE_DSN"
"""Where the worker reads the database's DSN (an argument would show its password to ``ps``)."""
REPORT_EVERY = 0.005
"""Seconds between two looks at the consumer's counts (the runner samples its peers so)."""


class Amount(BaseModel):
    """The payload every peer decodes (``benchmarks.workload.Amount``)."""

    key: str
    amount: int


async def prepare(args: argparse.Namespace) -> None:
    conn = await asyncpg.connect(os.environ[DSN_VARIABLE])
    try:
        await migrate(conn, args.schema, namespace=args.group)
    finally:
        await conn.close()


def counts(consumer: Any) -> tuple[int, int]:
    s = consumer.stats
    return s.delivered, s.applied + s.duplicates + s.dead_lettered + s.expired_skipped


async def consume(args: argparse.Namespace) -> None:
    sql = args.sql

    @handler(args.event_type)
    async def apply_amount(event: Amount, ctx: HandlerContext) -> None:
        await ctx.tx.execute(sql, event.key, event.amount)

    consumer = Consumer(
        name=args.group, handlers=[apply_amount], topics=[args.topic],
        kafka_bootstrap=args.bootstrap, postgres_dsn=os.environ[DSN_VARIABLE],
        schema=args.schema,
        handle_signals=False, kafka_consumer_options=json.loads(args.kafka_options))
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    if args.young:  # the footing of the peers in the runner's process (consumerkit._heap)
        gc.collect()
        gc.freeze()
        first, middle, old = gc.get_threshold()
        gc.set_threshold(max(first, args.young), middle, old)
    usage = resource.getrusage(resource.RUSAGE_SELF)  # start-up: not the consumer's work
    print("startup", usage.ru_utime + usage.ru_stime, flush=True)
    task = asyncio.create_task(consumer.run())
    stop = asyncio.create_task(stopping.wait())
    last, first_at = (-1, -1), 0.0
    while not (task.done() or stopping.is_set()):
        now = counts(consumer)
        if now[0] and not first_at:
            first_at = time.time()
        if now != last:
            print(now[0], now[1], first_at, flush=True)
            last = now
        await asyncio.wait({task, stop}, timeout=REPORT_EVERY)
    if not task.done():
        await consumer.stop()
    await task
    stop.cancel()
    print(*counts(consumer), first_at, flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="benchmarks/before_worker.py")
    p.add_argument("command", choices=("migrate", "consume"))
    for name in ("--schema", "--group"):
        p.add_argument(name, required=True)
    for name in ("--bootstrap", "--topic", "--event-type", "--sql", "--kafka-options"):
        p.add_argument(name)
    p.add_argument("--young", type=int, default=0, help="the collector's young threshold")
    p.add_argument("--uvloop", action="store_true")
    args = p.parse_args(argv)
    if args.command == "migrate":
        asyncio.run(prepare(args))
        return
    if args.uvloop:
        import uvloop
        uvloop.run(consume(args))
    else:
        asyncio.run(consume(args))


if __name__ == "__main__":
    main()
