"""Dedup strategies: the two PostgreSQL layouts, the Redis cache in front of PostgreSQL, the
in-memory store for tests, maintenance from a scheduled job, and the redelivery-horizon check
of a deploy step."""

from __future__ import annotations

import logging
from datetime import timedelta

from consumerkit import Consumer, Kafka, Postgres, RetryPolicy
from consumerkit.dedup import DedupPolicy, InMemoryDedupStore, MemoryDedupCache, maintain
from consumerkit.dedup.horizon import redelivery_horizon_check
from consumerkit.dedup.redis import RedisDedupCache
from consumerkit.envelope import Envelope
from consumerkit.types import ClaimRequest, ClaimStatus, DbConnection
from examples import billing

# The default: a table partitioned by day; expired days are dropped whole.
partitioned = DedupPolicy(retention=timedelta(days=7))

# One plain table, no partitions; expired rows (each the ids of one claim) are deleted in
# batches of 10,000, each in a short transaction of its own.
table = DedupPolicy(retention=timedelta(days=7), layout="table", table="processed_ids")


def with_redis_cache(kafka: str, postgres: str, redis_url: str) -> Consumer:
    # PostgreSQL stays the source of truth. Redis is asked before the transaction and told
    # after the commit; it must not remember longer than the dedup retention.
    cache = RedisDedupCache(redis_url, ttl=timedelta(days=1), socket_timeout=0.075,
                            retry_interval=5.0)
    cache.check(partitioned)  # raises ConfigurationError if ttl > retention
    return Consumer(name="billing", handlers=[billing], topics=["orders"],
                    postgres=Postgres(dsn=postgres),
                    kafka=Kafka(bootstrap=kafka),
                    dedup=partitioned,
                    dedup_cache=cache)


def with_memory_cache(kafka: str, postgres: str) -> Consumer:
    # The ids this process applied, kept in its memory (no round trip, no Redis); what
    # another process applied is still absorbed by PostgreSQL.
    return Consumer(name="billing", handlers=[billing], topics=["orders"],
                    postgres=Postgres(dsn=postgres),
                    kafka=Kafka(bootstrap=kafka),
                    dedup=partitioned,
                    dedup_cache=MemoryDedupCache(max_ids=200_000))


async def claim_twice_in_memory(tx: DbConnection) -> list[ClaimStatus]:
    # Tests only: the semantics of the PostgreSQL stores, kept in a dict. ``tx`` only tells
    # transactions apart; nothing is written to it.
    store = InMemoryDedupStore(retention=timedelta(days=7))
    event = Envelope(event_id="evt-1", id_source="header", event_type="order.created",
                     key="order-1", topic="orders", partition=0, offset=0, timestamp=None)
    request = ClaimRequest(event, "billing.charge")
    first = await store.claim_many(tx, "billing", [request, request])
    await store.ended(tx, "billing", [request], committed=True)
    again = await store.claim_many(tx, "billing", [request])
    return [claim.status for claim in [*first, *again]]  # claimed, duplicate, duplicate


async def nightly_cleanup(conn: DbConnection) -> None:
    # For the table layout, maintain() deletes the expired rows batch by batch (call it
    # outside a transaction); for the partitioned one it creates and drops partitions.
    report = await maintain(conn, "consumerkit", table)
    logging.getLogger("jobs").info("deleted %d expired dedup rows", report.deleted)


async def check_window(kafka: str) -> None:
    # Does the dedup window outlast every redelivery: retries, replays of dead letters,
    # a reset of the group to the beginning of its topics?
    findings = await redelivery_horizon_check(
        partitioned, topics=["orders"], kafka_bootstrap=kafka,
        retry=RetryPolicy(max_attempts=6), handler_timeout=60.0,
        parked_for=timedelta(days=3))
    for finding in findings:
        logging.getLogger("deploy").warning("%s", finding)
    if any(finding.level == "error" for finding in findings):
        raise SystemExit("the dedup retention is shorter than a redelivery horizon")
