"""What ``consumerkit check`` looks at (a :class:`Deployment`, from the options or a consumer)
and how it says what it found (a :class:`Report`: one line each)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..dedup.policy import DedupPolicy
from ..outbox.table import OutboxTable
from ..retry import RetryPolicy
from ..settings import CommonSettings, ConsumerSettings, RelaySettings
from ..shared.pooler import Pooler
from .check_kafka import WANTED_REPLICATION
from .options import load_settings, sources
from .run import apply_settings
from .target import load_consumer


@dataclass
class Deployment:
    """What to check, from the options or a consumer. Its repr leaves out the DSN and the
    Kafka options (they hold passwords)."""

    dsn: str | None = field(repr=False)
    bootstrap: str | None
    schema: str
    policy: DedupPolicy
    topics: list[str]
    outboxes: list[OutboxTable]
    kafka_options: Mapping[str, Any] = field(repr=False)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    handler_timeout: float | None = 60.0
    published: list[str] = field(default_factory=list)
    idempotence: bool = True  # the relay's
    replication: int = WANTED_REPLICATION
    offset_store: str = "postgres"  # "postgres" needs the offsets table
    pooler: Pooler = "none"  # what the deployment says stands in front of PostgreSQL
    concurrency: int = 4  # the consumers' (a Consumer's default with batches)
    consumer: Any = field(default=None, repr=False)  # the Consumer of MODULE:ATTR, if given
    # the outboxes a connector reads (Debezium): each needs a replication slot reading it
    cdc_outboxes: list[OutboxTable] = field(default_factory=list)


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def ok(self, text: str) -> None:
        print(f"ok       {text}")

    def note(self, text: str) -> None:
        print(f"note     {text}")

    def warn(self, text: str) -> None:
        """A risk the deployment may have chosen: said, but not a failed check."""
        print(f"WARNING  {text}")
        self.warnings.append(text)

    def problem(self, text: str) -> None:
        print(f"PROBLEM  {text}")
        self.problems.append(text)


async def described(args: argparse.Namespace, settings: CommonSettings) -> Deployment:
    deployment = await _given(args, settings)
    deployment.published = args.published or []
    relay = load_settings(args, RelaySettings)
    assert isinstance(relay, RelaySettings)
    deployment.idempotence = relay.enable_idempotence
    deployment.replication = args.min_replication
    return deployment


async def _given(args: argparse.Namespace, settings: CommonSettings) -> Deployment:
    if args.target is None:
        outboxes = [OutboxTable(settings.postgres.schema, t) for t in args.outbox_tables or []]
        return Deployment(
            dsn=settings.dsn(), bootstrap=settings.kafka.bootstrap,
            schema=settings.postgres.schema,
            policy=DedupPolicy(retention=args.retention, partition_interval=args.interval,
                               table=args.table, expired=args.expired),
            topics=args.topics or [],
            outboxes=outboxes, cdc_outboxes=outboxes if args.outbox_cdc else [],
            kafka_options=settings.kafka.client_options(),
            offset_store=getattr(settings, "offset_store", "postgres"),
            pooler=settings.postgres.pooler,
            concurrency=(settings.limits.concurrency if isinstance(settings, ConsumerSettings)
                         else None) or 4)
    assert isinstance(settings, ConsumerSettings)
    consumer = await load_consumer(args.target)
    apply_settings(consumer, settings, sources(args, ConsumerSettings))
    return Deployment(
        dsn=consumer.postgres_dsn, bootstrap=consumer.kafka_bootstrap, schema=consumer.schema,
        policy=consumer.dedup, topics=[*consumer.topics, *(args.topics or [])],
        outboxes=[consumer.outbox.table] if consumer.outbox is not None else [],
        cdc_outboxes=[consumer.outbox.table] if consumer.outbox is not None and (
            consumer.outbox.delete_after_insert or consumer.outbox.table.retention) else [],
        kafka_options=consumer.kafka_options, retry=consumer.retry,
        handler_timeout=consumer.handler_timeout, offset_store=consumer.offset_store,
        pooler=consumer.postgres_pooler, concurrency=consumer.concurrency,
        consumer=consumer)
