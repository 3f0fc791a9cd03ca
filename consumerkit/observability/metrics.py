"""Prometheus metrics, kept by observers of the seam (one registry per consumer or relay by
default, so that two in one process do not clash).

The consumer's per-message families are plain integers turned into families at scrape time
(:mod:`~consumerkit.observability.tally`); the rest are prometheus-client metrics, whose label
children are looked up once per label set and kept.
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
from .tally import collector

if TYPE_CHECKING:
    from ..envelope import Envelope, RecordLike
    from ..outbox.replication import SlotState

M = TypeVar("M", Counter, Gauge, Histogram)

_FAMILIES: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, Any]] = (
    weakref.WeakKeyDictionary())

SKIPPED_TYPES = 1000  # event type series of consumerkit_unhandled_skipped, at most
OTHER_TYPES = "(other)"  # the event_type label of the skipped types beyond them
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
    """The consumer's metric families in ``registry``, labelled with ``consumer``. The
    per-message ones are kept in a :class:`~consumerkit.observability.tally.Tally` and built
    at scrape time; the gauges, set a few times a minute, are prometheus-client's own."""

    __slots__ = ("_ahead", "_dead_letters", "_lag", "_moved_back", "_parked_keys",
                 "_parked_records", "_ready", "_skipped", "_skipped_by", "_slot_active",
                 "_slot_wal", "_slots", "_tally",
                 "consumer", "registry")

    def __init__(self, registry: CollectorRegistry, consumer: str) -> None:
        self.registry = registry
        self.consumer = consumer
        self._tally = collector(registry).tally(consumer)
        self._tally.stalled = 0  # a run starts unstalled (a registry outlives runs)
        self._lag = family(registry, Gauge, "consumerkit_consumer_lag",
                           "End offset minus committed offset of each assigned partition",
                           ("consumer", "topic", "partition"))
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
        self._ready = _ready(registry).labels("consumer", consumer)
        self._slot_wal = family(registry, Gauge, "consumerkit_replication_slot_wal_bytes",
                                "WAL bytes a replication slot keeps (current position minus "
                                "its restart_lsn)", ("slot",))
        self._slot_active = family(registry, Gauge, "consumerkit_replication_slot_active",
                                   "1 when a reader holds the replication slot, else 0",
                                   ("slot",))
        self._slots: set[str] = set()
        self._moved_back = family(registry, Counter, "consumerkit_offsets_moved_back",
                                  "Partitions read again because their offset rows lacked "
                                  "commits the consumer had seen answered (a failover that "
                                  "lost commits, a restore)", ("consumer", "topic"))
        self._skipped = family(registry, Counter, "consumerkit_unhandled_skipped",
                               "Records skipped because no handler takes their event type "
                               "(Unhandled(policy='skip') or an ignore pattern), by event type",
                               ("consumer", "topic", "event_type"))
        self._skipped_by: dict[tuple[str, str], Any] = {}  # label children, looked up once
        self._dead_letters = family(registry, Counter, "consumerkit_dead_letters_resolved",
                                    "Dead letters replayed, discarded, or whose replay failed "
                                    "again (consumerkit dead-letters replay | discard)",
                                    ("consumer", "topic", "outcome"))

    def offsets_moved_back(self, topic: str, partition: int, stored: int | None,
                           position: int) -> None:
        self._moved_back.labels(self.consumer, topic).inc()

    def applied(self, record: RecordLike, envelope: Envelope, handler: str) -> None:
        self._tally.count(record.topic, "applied")

    def duplicate(self, record: RecordLike, envelope: Envelope | None, handler: str,
                  original_seen_at: datetime | None) -> None:
        self._tally.count(record.topic, "duplicate")
        if original_seen_at is not None:
            self._tally.age.observe(max(0.0, time.time() - original_seen_at.timestamp()))

    def dead_lettered(self, record: RecordLike, envelope: Envelope | None, handler: str,
                      reason: str, detail: str, attempts: int) -> None:
        self._tally.count(record.topic, "dead_lettered")

    def expired_skipped(self, record: RecordLike, envelope: Envelope, handler: str) -> None:
        self._tally.count(record.topic, "expired_skipped")

    def unhandled_skipped(self, record: RecordLike, event_type: str, near: str | None) -> None:
        self._tally.count(record.topic, "unhandled_skipped")
        labels = (record.topic, event_type)
        child = self._skipped_by.get(labels)
        if child is None:
            if len(self._skipped_by) >= SKIPPED_TYPES:  # event types come from producers:
                labels = (record.topic, OTHER_TYPES)   # past a bound, one series for the rest
                child = self._skipped_by.get(labels)
            if child is None:
                child = self._skipped.labels(self.consumer, labels[0], labels[1][:200])
                self._skipped_by[labels] = child
        child.inc()

    def parked(self, record: RecordLike, envelope: Envelope | None, handler: str,
               reason: str, detail: str, attempts: int) -> None:
        self._tally.count(record.topic, "parked")

    def parking(self, keys: int, records: int) -> None:
        self._parked_keys.labels(self.consumer).set(keys)
        self._parked_records.labels(self.consumer).set(records)

    def dead_letters_resolved(self, topic: str, outcome: str, count: int) -> None:
        self._dead_letters.labels(self.consumer, topic, outcome).inc(count)

    def handler_finished(self, handler: str, seconds: float) -> None:
        self._tally.handler_finished(handler, seconds)

    def stalled(self, reason: str | None) -> None:
        self._tally.stall(reason)

    def replication_slots(self, slots: Sequence[SlotState]) -> None:
        names = {slot.name for slot in slots}
        for gone in self._slots - names:  # a dropped slot keeps nothing: no stale series
            for gauge in (self._slot_wal, self._slot_active):
                with contextlib.suppress(KeyError):
                    gauge.remove(gone)
        self._slots = names
        for slot in slots:
            self._slot_wal.labels(slot.name).set(slot.retained_bytes)
            self._slot_active.labels(slot.name).set(1 if slot.active else 0)

    def retry(self, record: RecordLike, envelope: Envelope, handler: str, attempt: int,
              delay: float, error: BaseException) -> None:
        self._tally.retry(handler)

    def cache_lookup(self, hits: int, misses: int, errors: int) -> None:
        cache = self._tally.cache
        cache[0] += hits
        cache[1] += misses
        cache[2] += errors
        self._tally.cache_seen = True

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

