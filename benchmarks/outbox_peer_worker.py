"""faststream-outbox relaying one outbox table to Kafka in its own OS process, the peer of
consumerkit's relay in ``benchmarks.outbox_peers``:

    python -m benchmarks.outbox_peer_worker --dsn DSN --bootstrap HOST:PORT --schema S
        --table T --topic TOPIC [--workers 1] [--fetch-batch 10] [--flush-batch 1]
        [--idempotence]

The relay as faststream-outbox's relay tutorial writes it: an ``OutboxBroker`` subscriber on
the outbox queue whose handler publishes each row to Kafka through FastStream's
``KafkaBroker`` (awaiting the broker's ack, ``acks="all"`` as consumerkit's sink), keyed by
the aggregate id so one aggregate stays on one partition. faststream-outbox then deletes the
row (``terminal_flush_batch_size`` rows per ``DELETE``). Prints ``ready`` once both brokers
have started; runs until SIGTERM. ``--idempotence``: the producer's idempotence on, as on
Apache Kafka (Tansu has none).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from faststream.kafka import KafkaBroker
from faststream_outbox import OutboxBroker, make_outbox_table
from sqlalchemy import MetaData, Table
from sqlalchemy.ext.asyncio import create_async_engine

from consumerkit.shared import aio

from .broker import producer_flags

QUEUE = "events"
ROOT = Path(__file__).resolve().parents[1]


def sqlalchemy_url(dsn: str) -> str:
    """``postgresql://...`` as SQLAlchemy's asyncpg URL."""
    return "postgresql+asyncpg://" + dsn.split("://", 1)[1]


def outbox_table(schema: str, table: str) -> Table:
    return make_outbox_table(MetaData(schema=schema), table)


def outbox_broker(dsn: str, table: Table, pool: int = 5) -> OutboxBroker:
    """An ``OutboxBroker`` on ``table``, its engine pooling ``pool`` connections."""
    engine = create_async_engine(sqlalchemy_url(dsn), pool_size=pool)
    return OutboxBroker(engine, outbox_table=table, logger=None)


def start(dsn: str, bootstrap: str, schema: str, table: str, topic: str, *, workers: int,
          fetch_batch: int, flush_batch: int, uvloop: bool) -> subprocess.Popen[bytes]:
    """This module as a process; it prints ``ready`` on its stdout once it runs."""
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.outbox_peer_worker", "--dsn", dsn, "--bootstrap",
         bootstrap, "--schema", schema, "--table", table, "--topic", topic, "--workers",
         str(workers), "--fetch-batch", str(fetch_batch), "--flush-batch", str(flush_batch),
         *producer_flags(bootstrap), *([] if uvloop else ["--no-uvloop"])],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE)


async def relay(args: argparse.Namespace) -> None:
    outbox = outbox_broker(args.dsn, outbox_table(args.schema, args.table),
                           pool=args.workers + 4)
    # a list: FastStream takes a comma-separated string for one host (a cluster's bootstrap)
    kafka = KafkaBroker(args.bootstrap.split(","), acks="all",
                        enable_idempotence=args.idempotence, logger=None)

    @outbox.subscriber(QUEUE, max_workers=args.workers, fetch_batch_size=args.fetch_batch,
                       terminal_flush_batch_size=args.flush_batch, min_fetch_interval=0.05,
                       max_fetch_interval=0.5)
    async def publish(body: dict[str, Any]) -> None:
        await kafka.publish(body, args.topic, key=str(body["a"]).encode())

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await kafka.start()
    await outbox.start()
    print("ready", flush=True)
    try:
        await stop.wait()
    finally:
        await outbox.stop()
        await kafka.stop()


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.outbox_peer_worker")
    for name in ("--dsn", "--bootstrap", "--schema", "--table", "--topic"):
        p.add_argument(name, required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--fetch-batch", type=int, default=10)
    p.add_argument("--flush-batch", type=int, default=1)
    p.add_argument("--idempotence", action="store_true")
    p.add_argument("--no-uvloop", dest="uvloop", action="store_false")
    args = p.parse_args(argv)
    aio.run(relay(args), use_uvloop=args.uvloop)


if __name__ == "__main__":
    main()
