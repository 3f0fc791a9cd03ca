"""What a :class:`~consumerkit.Consumer` derives from its option groups: the values the
engine reads, checked together (each group checks its own fields)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..dedup.horizon import horizon_findings
from ..dedup.policy import DedupPolicy
from ..errors import ConfigurationError
from ..offsets.store import OFFSET_STORES
from ..retry import RetryPolicy
from ..route_table import RouteTable
from ..settings import ConsumerSettings
from ..settings.groups import Group, Kafka, Limits, Metrics, Postgres, Stall, Timeouts, Unhandled
from ..transport.kafka import consumer_options, producer_options
from .unhandled import TypePolicy

DEFAULTS: dict[str, Any] = {
    "postgres": Postgres(), "kafka": Kafka(), "limits": Limits(), "timeouts": Timeouts(),
    "stall": Stall(), "metrics": Metrics(), "unhandled": Unhandled()}
"""Each group as the consumer takes it when the code gives none (none of its fields chosen)."""
OFFSET_STORE = ConsumerSettings.model_fields["offset_store"].default
"""Where offsets are kept when neither the code nor the settings say."""


def derive(options: Mapping[str, Any], routes: RouteTable, dedup: DedupPolicy,
           retry: RetryPolicy) -> dict[str, Any]:
    """The consumer's attributes that follow from ``options`` (its groups and
    ``offset_store``), or a :class:`ConfigurationError` naming what is refused."""
    for name, kind in DEFAULTS.items():
        if not isinstance(options[name], type(kind)):
            raise ConfigurationError(f"{name}= takes a {type(kind).__name__}(...), not "
                                     f"{type(options[name]).__name__}")
    postgres: Postgres = options["postgres"]
    kafka: Kafka = options["kafka"]
    limits: Limits = options["limits"]
    timeouts: Timeouts = options["timeouts"]
    stall: Stall = options["stall"]
    metrics: Metrics = options["metrics"]
    unhandled: Unhandled = options["unhandled"]
    offset_store = options["offset_store"] or OFFSET_STORE
    if offset_store not in OFFSET_STORES:
        raise ConfigurationError(f"offset_store must be one of {', '.join(OFFSET_STORES)}, "
                                 f"not {offset_store!r}")
    shared = kafka.client_options()
    ours = {**shared, **kafka.consumer_options}
    # refuse unsafe settings now; the fetch size follows max_poll_records
    consumer = consumer_options(ours)
    try:
        producer_options(shared)  # dead-letter producers share these
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"{exc} (Kafka(options=...) go to every Kafka client; options of the consumer "
            "alone belong in Kafka(consumer_options=...))") from None
    for finding in horizon_findings(dedup, retry=retry, topic_retention={},
                                    handler_timeout=timeouts.handler):
        if finding.level == "error":
            raise ConfigurationError(finding.message)
    rebalance_timeout = consumer["rebalance_timeout_ms"] / 1000
    # batches: a few at once, so they fill while PostgreSQL works; one record per
    # transaction: more at once, so handlers that wait on I/O overlap
    concurrency = limits.concurrency or (4 if limits.max_batch > 1 else 16)
    return {
        "postgres_dsn": postgres.url(), "schema": postgres.schema,
        "postgres_pooler": postgres.pooler, "kafka_bootstrap": kafka.bootstrap,
        "kafka_options": shared, "kafka_consumer_options": ours,
        "batch_size": int(consumer["max_poll_records"]),
        # while full, poll (with partitions paused) well within max_poll_interval_ms
        "keepalive": consumer.get("max_poll_interval_ms", 300_000) / 4000,
        "rebalance_timeout": rebalance_timeout,
        "concurrency": concurrency, "auto_concurrency": limits.concurrency is None,
        "max_batch": limits.max_batch, "max_in_flight": limits.max_in_flight,
        "max_message_bytes": limits.max_message_bytes,
        "handler_timeout": timeouts.handler, "shutdown_timeout": timeouts.shutdown,
        # a revocation must end well within the group's rebalance timeout, or the member
        # is thrown out of the group mid-revoke and every partition rebalances again
        "revoke_timeout": min(timeouts.shutdown, rebalance_timeout / 2),
        "stall_after_keys": stall.after_keys, "stall_max_delay": stall.max_delay,
        "metrics_port": metrics.port, "metrics_host": metrics.host,
        "lag_interval": metrics.refresh_interval,
        "parking_interval": metrics.refresh_interval * 6,
        "unhandled": unhandled.policy, "ignore": unhandled.ignore,
        "types": TypePolicy.build(unhandled.policy, unhandled.ignore, routes),
        "offset_store": offset_store,
    }


__all__ = ["DEFAULTS", "Group", "derive"]
