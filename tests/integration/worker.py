"""A consumer in its own OS process, for crash tests: ``python -m tests.integration.worker``."""

from __future__ import annotations

import argparse
import asyncio
import logging

from consumerkit import Consumer, RetryPolicy

from .ledger import FAST_GROUP, ledger_handler


async def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--dsn", "--bootstrap", "--topic", "--schema", "--name"):
        parser.add_argument(name, required=True)
    args = parser.parse_args()
    consumer = Consumer(
        name=args.name, handlers=[ledger_handler(args.schema)], topics=[args.topic],
        kafka_bootstrap=args.bootstrap, postgres_dsn=args.dsn, schema=args.schema,
        retry=RetryPolicy(initial_delay=0.01, max_delay=0.1), concurrency=8,
        max_in_flight=200, kafka_consumer_options={**FAST_GROUP, "max_poll_records": 50},
    )
    await consumer.run()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main())
