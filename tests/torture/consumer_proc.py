"""One consumer of the torture group in its own OS process, as ``consumerkit run`` would run
it: ``python -m tests.torture.consumer_proc --dsn ... --bootstrap ... --topic ... --schema ...``.
SIGTERM stops it cleanly; the harness also SIGKILLs, SIGSTOPs and fail-points it."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from consumerkit import Consumer, Kafka, Limits, Postgres, RetryPolicy, Timeouts
from consumerkit.dedup.redis import RedisDedupCache
from consumerkit.shared.pooler import POOLERS
from consumerkit.transport import kafka as kafka_transport
from tests.harness.pgbouncer import check_pooler

from .ledger import make_batch_handler, make_handler

GROUP = "torture"
KAFKA_MUTANT_ENV = "TORTURE_KAFKA_MUTANT"
# quick joins and rebalances on the test broker; a SIGSTOPped member is thrown out after 3 s
GROUP_OPTIONS = {
    "session_timeout_ms": 3000,
    "heartbeat_interval_ms": 300,
    "rebalance_timeout_ms": 3000,
    "metadata_max_age_ms": 2000,
    "max_poll_records": 100,
}


def build(args: argparse.Namespace) -> Consumer:
    cache = RedisDedupCache(args.redis, retry_interval=0.5) if args.redis else None
    return Consumer(
        name=args.name, topics=[args.topic],
        handlers=[(make_batch_handler if args.batch else make_handler)(args.schema)],
        postgres=Postgres(dsn=args.dsn, schema=args.schema, pooler=check_pooler(args.pooler)),
        kafka=Kafka(bootstrap=args.bootstrap, consumer_options=GROUP_OPTIONS),
        limits=Limits(concurrency=4, max_in_flight=args.max_in_flight, max_batch=args.max_batch),
        timeouts=Timeouts(handler=10.0, shutdown=5.0),
        dedup_cache=cache, migrate=False, offset_store=args.offset_store,
        # faults must not exhaust the attempts of a sound event; outages spend none
        retry=RetryPolicy(max_attempts=6, initial_delay=0.02, max_delay=0.2),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--dsn", "--bootstrap", "--topic", "--schema"):
        parser.add_argument(name, required=True)
    parser.add_argument("--redis", default="")
    parser.add_argument("--batch", action="store_true", help="a batch handler, ctx.defer")
    parser.add_argument("--max-batch", type=int, default=500, help="1: a transaction each")
    parser.add_argument("--name", default=GROUP, help="the consumer group (and dedup namespace)")
    parser.add_argument("--max-in-flight", type=int, default=400,
                        help="records fetched but not committed (a Consumer's default: 5000)")
    parser.add_argument("--offset-store", choices=["kafka", "postgres"], default="kafka")
    parser.add_argument("--pooler", choices=POOLERS, default="none")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # rebalances, as the consumer and the group coordinator see them: the first thing to know
    # about an event a consumer skipped (docs/torture-long.md, finding 4)
    for name in ("consumerkit.consumer", "aiokafka.consumer.group_coordinator"):
        logging.getLogger(name).setLevel(logging.INFO)
    # and where each ownership starts, what it drops and what it commits: which commit went
    # past a record never applied
    logging.getLogger("consumerkit.consumer.offsets").setLevel(logging.DEBUG)
    if os.environ.get(KAFKA_MUTANT_ENV) == "read_uncommitted":
        # the negative control of aborted transactions (tests/torture/kafka_faults.py): the
        # consumer reads what transactional producers aborted; the checker must see it
        kafka_transport._CONSUMER_FIXED["isolation_level"] = "read_uncommitted"
    asyncio.run(build(args).run())


if __name__ == "__main__":
    main()
