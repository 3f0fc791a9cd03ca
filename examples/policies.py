"""The policies a consumer takes: dedup window, retries and dead-letter destinations."""

from __future__ import annotations

from datetime import timedelta

import examples.billing
from consumerkit import (
    Consumer,
    DeadLetterTable,
    DeadLetterTopic,
    DedupPolicy,
    Kafka,
    Postgres,
    RetryPolicy,
)

# Remember event ids for 30 days, in daily partitions, with 3 partitions made ahead.
# An event older than 30 days that is not in the table is parked in the dead letters.
dedup = DedupPolicy(
    retention=timedelta(days=30),
    partition_interval=timedelta(days=1),
    premake=3,
    expired="dead_letter",
)

# 6 attempts; after failed attempt n the wait is random in [base/2, base] with
# base = min(8, 0.5 * 2 ** (n - 1)): 0.5, 1, 2, 4 and 8 s, at most 15.5 s in all.
retry = RetryPolicy(max_attempts=6, initial_delay=0.5, max_delay=8.0, multiplier=2.0)

# Every dead letter goes to the table AND to "<source topic>.dlq".
dead_letter = (DeadLetterTable(), DeadLetterTopic(suffix=".dlq"))


def build(kafka: str, postgres: str) -> Consumer:
    return Consumer(
        name="billing",
        handlers=[examples.billing.billing],
        topics=["orders"],
        postgres=Postgres(dsn=postgres, schema="billing_consumerkit"),
        kafka=Kafka(bootstrap=kafka),
        dedup=dedup,
        retry=retry,
        dead_letter=dead_letter,
    )
