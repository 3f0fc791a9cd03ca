"""Counters a consumer keeps about what it saw and what it did."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass(slots=True)
class ConsumerStats:
    """Deliveries and their outcomes since the consumer started.

    ``delivered`` counts every record handed to the pipeline (redeliveries included);
    ``applied`` counts handler effects committed; ``duplicates`` counts deliveries absorbed by
    the dedup table. ``delivered == applied + duplicates + dead_lettered + expired_skipped``
    once nothing is in flight and nothing was abandoned.
    """

    delivered: int = 0
    applied: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    dead_letter_failures: int = 0  # entries a sink rejected for good, even reduced
    expired_skipped: int = 0
    retries: int = 0
    abandoned: int = 0
    commits: int = 0
    revocations: int = 0
    batches: int = 0  # transactions that applied several records at once
    batch_fallbacks: int = 0  # batches rolled back and applied again record by record
    cache_hits: int = 0  # deliveries the dedup cache recognised without a transaction
    dead_letter_reasons: Counter[str] = field(default_factory=Counter)
