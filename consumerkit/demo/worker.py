"""One process of the pizza shop: a consumer or a relay, so that the demo can SIGKILL it.

    python -m consumerkit.demo.worker ROLE --run RUN [--idempotence]

ROLE is ``billing``, ``inventory``, ``shop`` (consumers) or ``relay-shop``, ``relay-billing``
(relays); ``--idempotence`` turns a relay's idempotent producer on (Apache Kafka has it, Tansu
does not). The broker and database come from ``CONSUMERKIT_KAFKA_BOOTSTRAP`` and
``CONSUMERKIT_POSTGRES_DSN`` (the environment, so the DSN never shows in a process list).
The worker reports its counters to the run's ``workers`` table ten times a second and once
more when it stops; SIGTERM or SIGINT stop it gracefully, and it stops by itself when the
process that started it is gone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys

import asyncpg

from ..consumer import Consumer
from ..outbox import KafkaSink, Relay
from ..settings.groups import Kafka, Postgres, Timeouts
from ..shared import aio
from . import shop

REPORT_INTERVAL = 0.1
RELAYS = {"relay-shop": ("shop_outbox", shop.orders_topic),
          "relay-billing": ("billing_outbox", shop.payments_topic)}
# A SIGKILLed member leaves the group when its session ends: keep that short for the demo.
GROUP = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 300,
         "rebalance_timeout_ms": 10_000}


def build_consumer(role: str, run: str, kafka: str, dsn: str) -> Consumer:
    schema = shop.schema_name(run)
    handlers = {"billing": shop.billing_handlers, "inventory": shop.inventory_handlers,
                "shop": shop.shop_handlers}[role](schema)
    topic = shop.payments_topic(run) if role == "shop" else shop.orders_topic(run)
    return Consumer(
        name=role, handlers=[handlers], topics=[topic],
        postgres=Postgres(dsn=dsn, schema=schema),
        kafka=Kafka(bootstrap=kafka, consumer_options=GROUP),
        timeouts=Timeouts(shutdown=10.0),
        outbox=shop.billing_outbox(schema) if role == "billing" else None)


def build_relay(role: str, run: str, kafka: str, dsn: str, idempotence: bool = False) -> Relay:
    table, topic = RELAYS[role]
    sink = KafkaSink(kafka, route=topic(run),
                     kafka_options={"enable_idempotence": idempotence})
    return Relay(Postgres(dsn=dsn, schema=shop.schema_name(run)), sink, table=table,
                 name=f"{role}-{os.getpid()}", poll_interval=0.5)


class Reporter:
    """Writes a worker's counters to the ``workers`` table."""

    def __init__(self, role: str, run: str, dsn: str) -> None:
        self.role = role
        self.schema = shop.schema_name(run)
        self.dsn = dsn
        self.conn: asyncpg.Connection | None = None

    async def report(self, worker: Consumer | Relay, *, stopped: bool = False) -> None:
        if self.conn is None or self.conn.is_closed():
            self.conn = await asyncpg.connect(self.dsn, timeout=10)
        if isinstance(worker, Relay):
            counts = (0, 0, 0, 0, worker.published)
        else:
            s = worker.stats
            counts = (s.delivered, s.applied, s.duplicates, s.dead_lettered, 0)
        await self.conn.execute(
            f"""INSERT INTO {self.schema}.workers AS w (role, pid, delivered, applied, duplicates,
                    dead_lettered, published, stopped) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                ON CONFLICT (role, pid) DO UPDATE SET delivered = $3, applied = $4,
                    duplicates = $5, dead_lettered = $6, published = $7, stopped = $8""",
            self.role, os.getpid(), *counts, stopped)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()


async def work(role: str, run: str, kafka: str, dsn: str, idempotence: bool = False) -> None:
    worker: Consumer | Relay = (build_relay(role, run, kafka, dsn, idempotence)
                                if role in RELAYS else build_consumer(role, run, kafka, dsn))
    reporter = Reporter(role, run, dsn)
    parent = os.getppid()
    task = asyncio.create_task(worker.run())
    try:
        while not task.done():
            await reporter.report(worker)
            if os.getppid() != parent:  # the demo is gone: do not outlive it
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), REPORT_INTERVAL)
    finally:
        if not task.done():
            if isinstance(worker, Relay):
                worker.stop()
            else:
                await worker.stop()
        await task
        await reporter.report(worker, stopped=True)
        await reporter.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m consumerkit.demo.worker")
    parser.add_argument("role", choices=[*shop.ROLES, *RELAYS])
    parser.add_argument("--run", required=True)
    parser.add_argument("--idempotence", action="store_true",
                        help="the relay's idempotent producer on (the broker must have it)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING,
                        format=f"{args.role}[{os.getpid()}] %(levelname)s %(name)s: %(message)s")
    try:
        kafka = os.environ["CONSUMERKIT_KAFKA_BOOTSTRAP"]
        dsn = os.environ["CONSUMERKIT_POSTGRES_DSN"]
    except KeyError as exc:
        print(f"{args.role}: set {exc.args[0]}", file=sys.stderr)
        return 2
    aio.run(work(args.role, args.run, kafka, dsn, args.idempotence),
            use_uvloop=aio.wanted_from_environment())
    return 0


if __name__ == "__main__":
    sys.exit(main())
