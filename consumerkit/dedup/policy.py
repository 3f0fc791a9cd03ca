"""How long deduplication lasts and what happens to events older than that."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from ..errors import ConfigurationError
from ..shared.identifiers import identifier

ExpiredPolicy = Literal["dead_letter", "skip", "apply"]
Layout = Literal["partitioned", "table"]


@dataclass(frozen=True, slots=True)
class DedupPolicy:
    """Settings of the dedup table.

    ``layout``: ``"partitioned"`` (default) keeps the ids in a table range-partitioned by
    time, and retention drops whole partitions; ``"table"`` keeps them in one plain table with
    a ``seen_at`` index instead of partitions, and retention deletes expired rows in batches
    (both claim alike: :mod:`consumerkit.dedup.rows`). The layout of an existing table cannot
    be changed by a migration: use another ``table`` name.

    ``retention``: how long a processed event id is remembered (default 7 days). It must
    outlast the longest redelivery: handler retries, replays from the dead-letter destination,
    and the topic's own retention if consumers may be reset to the beginning.

    ``partition_interval``: (partitioned layout) the width of one partition (whole hours
    dividing a day, or whole days). Whole partitions are dropped once all their rows are older
    than ``retention``. With either layout it also sets how often a consumer runs maintenance
    by default (a quarter of it, at most hourly).

    ``premake``: (partitioned layout) how many future partitions maintenance keeps ready.

    ``expired``: what to do with an event whose time (``occurred_at`` header, else the record
    timestamp) is older than ``retention``, since its original may have been forgotten:
    ``"dead_letter"`` (default) parks it in the dead-letter destination; ``"skip"`` treats it
    as a duplicate (no effect, counted and logged); ``"apply"`` runs the handler anyway,
    accepting a possible second effect. Never a silent second effect.

    ``clock_skew``: how far a producer's clock may run ahead of the database's (default 1
    hour). Rows are dropped by ``seen_at``, the database's time of the first delivery, but a
    redelivery is judged expired by its event time, the producer's clock. If the producer runs
    ``s`` ahead, an event first seen at ``T`` counts as expired only after ``T + retention + s``
    while its row may be gone from ``T + retention``: a redelivery in between finds no row and
    is not expired, so it would be applied twice. Maintenance therefore keeps partitions
    ``clock_skew`` longer than ``retention``. A clock running behind is harmless (the event
    expires early instead).

    ``claim_lock_timeout``: how long a claim waits for another transaction holding the same
    event id (default 30 s). The holder is normally the same event's previous owner finishing
    up after a rebalance; a holder that never finishes (a zombie consumer stopped mid
    transaction) would otherwise block the new owner forever. Past the timeout the claim
    raises ``asyncpg.LockNotAvailableError`` (SQLSTATE 55P03) and the attempt is retried.

    ``diagnostics``: also store, per claimed id, its event type, id source, topic, partition,
    offset and event time (a ``details`` column, read through the ``{table}_ids`` view). Off by
    default: a dedup row then holds only what deduplication needs, and the same facts are in
    the logs, the traces and the dead letters. On, it roughly doubles the bytes per id.
    """

    retention: timedelta = timedelta(days=7)
    partition_interval: timedelta = timedelta(days=1)
    premake: int = 3
    expired: ExpiredPolicy = "dead_letter"
    table: str = "processed_events"
    clock_skew: timedelta = timedelta(hours=1)
    claim_lock_timeout: timedelta = timedelta(seconds=30)
    layout: Layout = "partitioned"
    diagnostics: bool = False

    def __post_init__(self) -> None:
        identifier(self.table, "dedup table name")
        if self.layout not in ("partitioned", "table"):
            raise ConfigurationError(
                f"unknown dedup layout {self.layout!r}: use 'partitioned' or 'table'")
        check_partitioning(self.retention, self.partition_interval, self.premake)
        if self.expired not in ("dead_letter", "skip", "apply"):
            raise ConfigurationError(f"unknown expired policy {self.expired!r}")
        if self.clock_skew < timedelta(0):
            raise ConfigurationError("clock_skew must not be negative")
        # 0 would mean "wait forever" to PostgreSQL, and the setting has millisecond precision
        if self.claim_lock_timeout < timedelta(milliseconds=1):
            raise ConfigurationError("claim_lock_timeout must be at least 1 millisecond")


def check_partitioning(retention: timedelta, step: timedelta, premake: int) -> None:
    """Partition bounds every process computes alike (whole hours dividing a day, or whole
    days), at least one partition per retention, and a bounded number made ahead."""
    if step <= timedelta(0) or step % timedelta(hours=1):
        raise ConfigurationError("partition_interval must be a positive number of hours")
    if step < timedelta(days=1) and timedelta(days=1) % step:
        raise ConfigurationError("a partition_interval under a day must divide 24 hours")
    if step > timedelta(days=1) and step % timedelta(days=1):
        raise ConfigurationError("a partition_interval over a day must be whole days")
    if retention < step:
        raise ConfigurationError("retention must be at least one partition_interval")
    if not 1 <= premake <= 100:
        raise ConfigurationError("premake must be between 1 and 100")


def cache_ttl(explicit: timedelta | None, default: timedelta, policy: DedupPolicy) -> timedelta:
    """A dedup cache's time to live under ``policy``: an ``explicit`` one longer than the
    retention raises :class:`ConfigurationError` (the cache could then know ids the database
    has forgotten); the ``default`` is lowered to the retention when that is shorter."""
    if explicit is None:
        return min(default, policy.retention)
    if explicit > policy.retention:
        raise ConfigurationError(
            f"the dedup cache ttl ({explicit}) is longer than the dedup retention "
            f"({policy.retention}): it must not outlive the database's rows")
    return explicit
