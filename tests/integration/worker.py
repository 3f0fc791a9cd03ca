"""A consumer in its own OS process, for crash tests: ``python -m tests.integration.worker``."""

from __future__ import annotations

import argparse
import asyncio
import logging

from consumerkit import Consumer, HandlerContext, Kafka, Limits, Postgres, RetryPolicy
from consumerkit.outbox import Outbox

from ..pooling import POOLER
from .ledger import FAST_GROUP, Step, ledger_handler

BILLED = "step.billed"


async def emit_billed(event: Step, ctx: HandlerContext) -> None:
    """The saga step: every applied event emits one downstream event through the outbox."""
    await ctx.publish(event_type=BILLED, aggregate_type="ledger", aggregate_id=event.key,
                      payload={"key": event.key, "seq": event.seq})


async def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--dsn", "--bootstrap", "--topic", "--schema", "--name"):
        parser.add_argument(name, required=True)
    parser.add_argument("--outbox", action="store_true", help="emit through ctx.publish")
    parser.add_argument("--offset-store", default="kafka", choices=("kafka", "postgres"))
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    consumer = Consumer(
        name=args.name, topics=[args.topic],
        handlers=[ledger_handler(args.schema, emit_billed if args.outbox else None)],
        outbox=Outbox(args.schema) if args.outbox else None,
        postgres=Postgres(dsn=args.dsn, schema=args.schema, pooler=POOLER),
        kafka=Kafka(bootstrap=args.bootstrap, consumer_options={**FAST_GROUP,
            "max_poll_records": 50}),
        limits=Limits(concurrency=args.concurrency, max_in_flight=200),
        retry=RetryPolicy(initial_delay=0.01, max_delay=0.1), offset_store=args.offset_store,
    )
    await consumer.run()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main())
