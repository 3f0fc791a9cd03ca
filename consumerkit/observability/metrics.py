"""Prometheus metrics, kept by observers of the seam (one registry per consumer or relay by
default, so that two in one process do not clash).

Label children are looked up once per label set and kept: per message the cost is a dict
lookup and a counter increment.
"""

from __future__ import annotations

import contextlib
import time
import weakref
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .observer import BaseObserver

if TYPE_CHECKING:
    from ..envelope import Envelope, RecordLike

M = TypeVar("M", Counter, Gauge, Histogram)

_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, Any]] = (
    weakref.WeakKeyDictionary())

# from a second to a month: the dedup window is usually days
AGE_BUCKETS = (1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 6 * 3600.0, 86400.0, 3 * 86400.0,
               7 * 86400.0, 14 * 86400.0, 30 * 86400.0)
PUBLISH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                   300.0)


def family(registry: CollectorRegistry, kind: type[M], name: str, doc: str,
           labels: Sequence[str], **options: Any) -> M:
    """The metric ``name`` of ``registry``, created on first use: a consumer and a relay may
    share a registry (and ``consumerkit_ready``)."""
    known = _FAMILIES.setdefault(registry, {})
    if name not in known:
        known[name] = kind(name, doc, labelnames=labels, registry=registry, **options)
    metric = known[name]
    assert isinstance(metric, kind)
    return metric


def _ready(registry: CollectorRegistry) -> Gauge:
    return family(registry, Gauge, "consumerkit_ready",
                  "1 when the consumer or relay is ready (see /readyz), else 0",
                  ("role", "name"))


class ConsumerMetrics(BaseObserver):
    """The consumer's metric families in ``registry``, labelled with ``consumer``."""

    __slots__ = (
        "_age",
        "_ahead",
        "_cache",
        "_handler",
        "_handlers",
        "_lag",
        "_messages",
        "_outcomes",
        "_parked_keys",
        "_parked_records",
        "_ready",
        "_retries",
        "_retry",
        "consumer",
        "registry",
    )

    def __init__(self, registry: CollectorRegistry, consumer: str) -> None:
        self.registry = registry
        self.consumer = consumer
        c = consumer
        self._messages = family(registry, Counter, "consumerkit_messages",
                                "Messages by final outcome", ("consumer", "topic", "outcome"))
        self._handler = family(registry, Histogram, "consumerkit_handler_seconds",
                               "Handler run time (every attempt)", ("consumer", "handler"))
        self._retry = family(registry, Counter, "consumerkit_retries",
                             "Handler attempts that failed and will be retried",
                             ("consumer", "handler"))
        self._lag = family(registry, Gauge, "consumerkit_consumer_lag",
                           "End offset minus committed offset of each assigned partition",
                           ("consumer", "topic", "partition"))
        self._age = family(registry, Histogram, "consumerkit_duplicate_age_seconds",
                           "At each duplicate, how long ago the original was applied",
                           ("consumer",), buckets=AGE_BUCKETS).labels(c)
        cache = family(registry, Counter, "consumerkit_dedup_cache_requests",
                       "Event ids asked of the dedup cache, by answer", ("consumer", "result"))
        self._cache = (cache.labels(c, "hit"), cache.labels(c, "miss"), cache.labels(c, "error"))
        self._ahead = family(registry, Gauge, "consumerkit_dedup_partitions_ahead_seconds",
                             "Seconds from now to the end of the newest dedup partition "
                             "(0 or less: behind)", ("consumer",))
        # no series until a consumer that parks reports: a 0 would claim it was looked at
        self._parked_keys = family(registry, Gauge, "consumerkit_parked_keys",
                                   "Keys parked on the assigned partitions (consumerkit parked "
                                   "list)", ("consumer",))
        self._parked_records = family(registry, Gauge, "consumerkit_parked_records",
                                      "Records waiting behind the parked keys of the assigned "
                                      "partitions", ("consumer",))
        self._ready = _ready(registry).labels("consumer", c)
        self._outcomes: dict[tuple[str, str], Any] = {}
        self._handlers: dict[str, Any] = {}
        self._retries: dict[str, Any] = {}

    def _count(self, topic: str, outcome: str) -> None:
        child = self._outcomes.get((topic, outcome))
        if child is None:
            child = self._outcomes[topic, outcome] = self._messages.labels(
                self.consumer, topic, outcome)
        child.inc()

    def applied(self, record: RecordLike, envelope: Envelope, handler: str) -> None:
        self._count(record.topic, "applied")

    def duplicate(self, record: RecordLike, envelope: Envelope | None, handler: str,
                  original_seen_at: datetime | None) -> None:
        self._count(record.topic, "duplicate")
        if original_seen_at is not None:
            self._age.observe(max(0.0, time.time() - original_seen_at.timestamp()))

    def dead_lettered(self, record: RecordLike, envelope: Envelope | None, handler: str,
                      reason: str, detail: str, attempts: int) -> None:
        self._count(record.topic, "dead_lettered")

    def expired_skipped(self, record: RecordLike, envelope: Envelope, handler: str) -> None:
        self._count(record.topic, "expired_skipped")

    def parked(self, record: RecordLike, envelope: Envelope | None, handler: str,
               reason: str, detail: str, attempts: int) -> None:
        self._count(record.topic, "parked")

    def parking(self, keys: int, records: int) -> None:
        self._parked_keys.labels(self.consumer).set(keys)
        self._parked_records.labels(self.consumer).set(records)

    def handler_finished(self, handler: str, seconds: float) -> None:
        child = self._handlers.get(handler)
        if child is None:
            child = self._handlers[handler] = self._handler.labels(self.consumer, handler)
        child.observe(seconds)

    def retry(self, record: RecordLike, envelope: Envelope, handler: str, attempt: int,
              delay: float, error: BaseException) -> None:
        child = self._retries.get(handler)
        if child is None:
            child = self._retries[handler] = self._retry.labels(self.consumer, handler)
        child.inc()

    def cache_lookup(self, hits: int, misses: int, errors: int) -> None:
        for child, n in zip(self._cache, (hits, misses, errors), strict=True):
            if n:
                child.inc(n)

    def lag(self, topic: str, partition: int, lag: int | None) -> None:
        if lag is None:
            with contextlib.suppress(KeyError):
                self._lag.remove(self.consumer, topic, str(partition))
        else:
            self._lag.labels(self.consumer, topic, str(partition)).set(lag)

    def partitions_ahead(self, seconds: float | None) -> None:
        # no series until known: a 0 for a table without partitions would read as behind
        if seconds is not None:
            self._ahead.labels(self.consumer).set(seconds)

    def readiness(self, role: str, name: str, reason: str | None) -> None:
        self._ready.set(1 if reason is None else 0)


class RelayMetrics(BaseObserver):
    """The relay's metric families in ``registry``, labelled ``outbox="schema.table"``."""

    __slots__ = (
        "_failed",
        "_failures",
        "_oldest",
        "_pending",
        "_publish",
        "_published",
        "_ready",
        "outbox",
        "registry",
    )

    def __init__(self, registry: CollectorRegistry, outbox: str, name: str) -> None:
        self.registry = registry
        self.outbox = outbox
        labels = ("outbox",)
        self._published = family(registry, Counter, "consumerkit_outbox_published",
                                 "Outbox events the destination acknowledged",
                                 labels).labels(outbox)
        self._pending = family(registry, Gauge, "consumerkit_outbox_pending",
                               "Outbox rows waiting to be published", labels).labels(outbox)
        self._oldest = family(registry, Gauge, "consumerkit_outbox_oldest_pending_seconds",
                              "Age of the oldest outbox row waiting (0 when none)",
                              labels).labels(outbox)
        self._failed = family(registry, Gauge, "consumerkit_outbox_failed",
                              "Outbox rows given up on (FAILED: retry or skip them)",
                              labels).labels(outbox)
        self._failures = family(registry, Counter, "consumerkit_outbox_publish_failures",
                                "Failed publish attempts, by what follows (retrying, given_up)",
                                ("outbox", "result"))
        self._publish = family(registry, Histogram, "consumerkit_outbox_publish_seconds",
                               "From the row's write time to the destination's acknowledgement",
                               labels, buckets=PUBLISH_BUCKETS).labels(outbox)
        self._ready = _ready(registry).labels("relay", name)

    def relay_published(self, outbox: str, publish_seconds: Sequence[float]) -> None:
        self._published.inc(len(publish_seconds))
        for seconds in publish_seconds:
            self._publish.observe(seconds)

    def relay_failed(self, outbox: str, retrying: int, given_up: int) -> None:
        if retrying:
            self._failures.labels(outbox, "retrying").inc(retrying)
        if given_up:
            self._failures.labels(outbox, "given_up").inc(given_up)

    def relay_backlog(self, outbox: str, pending: int, oldest_seconds: float,
                      failed: int) -> None:
        self._pending.set(pending)
        self._oldest.set(oldest_seconds)
        self._failed.set(failed)

    def readiness(self, role: str, name: str, reason: str | None) -> None:
        self._ready.set(1 if reason is None else 0)

