"""Counters a consumer keeps about what it saw and what it did."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from .observability.observer import BaseObserver

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .envelope import Envelope, RecordLike


@dataclass(slots=True)
class ConsumerStats:
    """Deliveries and their outcomes since the consumer started.

    ``delivered`` counts every record handed to the pipeline (redeliveries included);
    ``applied`` counts handler effects committed; ``duplicates`` counts deliveries absorbed by
    the dedup table.
    ``delivered == applied + duplicates + dead_lettered + expired_skipped +
    unhandled_skipped + parked`` once
    nothing is in flight and nothing was abandoned. The outcome counters are kept by
    :class:`StatsObserver` from the observer seam, as are ``batches``, ``batch_fallbacks``,
    ``cache_hits`` and ``stalls``; the others by the engine itself.
    """

    delivered: int = 0
    applied: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    dead_letter_failures: int = 0  # entries a sink rejected for good, even reduced
    expired_skipped: int = 0
    unhandled_skipped: int = 0  # records of event types no handler takes, skipped
    parked: int = 0  # records held back because their key is parked
    dead_letters_replayed: int = 0  # by consumerkit dead-letters replay or the API
    dead_letters_discarded: int = 0
    dead_letter_replays_failed: int = 0
    retries: int = 0
    abandoned: int = 0
    commits: int = 0
    revocations: int = 0
    batches: int = 0  # transactions that applied several records at once
    batch_fallbacks: int = 0  # batches rolled back and applied again record by record
    cache_hits: int = 0  # deliveries the dedup cache recognised without a transaction
    gap_rereads: int = 0  # fetches read again from a gap, to see it a second time
    hidden_records: int = 0  # records a second read returned where the first had a gap
    gaps_explained: int = 0  # gaps passed at once: the fetch said what left them (markers)
    stalls: int = 0  # times a failure every record would hit stalled the consumer
    offsets_moved_back: int = 0  # partitions read again: the database lost commits (failover)
    dead_letter_reasons: Counter[str] = field(default_factory=Counter)
    skipped_types: Counter[str] = field(default_factory=Counter)  # unhandled_skipped by type


class StatsObserver(BaseObserver):
    """Keeps a :class:`ConsumerStats`'s outcome counters from the observer seam."""

    __slots__ = ("stats",)

    def __init__(self, stats: ConsumerStats) -> None:
        self.stats = stats

    def delivered(self, count: int) -> None:
        self.stats.delivered += count

    def applied(self, record: RecordLike, envelope: Envelope, handler: str) -> None:
        self.stats.applied += 1

    def duplicate(self, record: RecordLike, envelope: Envelope | None, handler: str,
                  original_seen_at: datetime | None) -> None:
        self.stats.duplicates += 1

    def dead_lettered(self, record: RecordLike, envelope: Envelope | None, handler: str,
                      reason: str, detail: str, attempts: int) -> None:
        self.stats.dead_lettered += 1
        self.stats.dead_letter_reasons[reason] += 1

    def expired_skipped(self, record: RecordLike, envelope: Envelope, handler: str) -> None:
        self.stats.expired_skipped += 1

    def unhandled_skipped(self, record: RecordLike, event_type: str, near: str | None) -> None:
        self.stats.unhandled_skipped += 1
        self.stats.skipped_types[event_type] += 1

    def parked(self, record: RecordLike, envelope: Envelope | None, handler: str,
               reason: str, detail: str, attempts: int) -> None:
        self.stats.parked += 1

    def dead_letters_resolved(self, topic: str, outcome: str, count: int) -> None:
        if outcome == "replayed":
            self.stats.dead_letters_replayed += count
        elif outcome == "discarded":
            self.stats.dead_letters_discarded += count
        else:
            self.stats.dead_letter_replays_failed += count

    def abandoned(self, records: Sequence[RecordLike]) -> None:
        self.stats.abandoned += len(records)

    def retry(self, record: RecordLike, envelope: Envelope, handler: str, attempt: int,
              delay: float, error: BaseException) -> None:
        self.stats.retries += 1

    def offsets_moved_back(self, topic: str, partition: int, stored: int | None,
                           position: int) -> None:
        self.stats.offsets_moved_back += 1

    def cache_hits(self, count: int) -> None:
        self.stats.cache_hits += count

    def stalled(self, reason: str | None) -> None:
        if reason is not None:
            self.stats.stalls += 1

    def batch(self, size: int, committed: bool) -> None:
        if committed:
            self.stats.batches += 1
        else:
            self.stats.batch_fallbacks += 1
