"""A relay in its own OS process, for crash tests: ``python -m tests.outbox.relay_worker``."""

from __future__ import annotations

import argparse
import asyncio
import logging

from consumerkit import Postgres
from consumerkit.outbox import KafkaSink, Relay
from consumerkit.shared.pooler import POOLERS
from tests.harness.pgbouncer import check_pooler

from ..brokers import PRODUCER_OPTIONS


async def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--dsn", "--bootstrap", "--schema", "--topic", "--name"):
        parser.add_argument(name, required=True)
    parser.add_argument("--pooler", choices=POOLERS, default="none")
    args = parser.parse_args()
    sink = KafkaSink(args.bootstrap, route=args.topic,
                     kafka_options=dict(PRODUCER_OPTIONS))
    relay = Relay(Postgres(dsn=args.dsn, schema=args.schema, pooler=check_pooler(args.pooler)),
                  sink, name=args.name, batch_size=200,
                  rebalance_interval=0.5)
    await relay.run()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(main())
