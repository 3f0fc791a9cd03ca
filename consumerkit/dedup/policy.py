"""How long deduplication lasts and what happens to events older than that."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from .._identifiers import identifier
from ..errors import ConfigurationError

ExpiredPolicy = Literal["dead_letter", "skip", "apply"]


@dataclass(frozen=True, slots=True)
class DedupPolicy:
    """Settings of the time-partitioned dedup table.

    ``retention``: how long a processed event id is remembered (default 7 days). It must
    outlast the longest redelivery: handler retries, replays from the dead-letter destination,
    and the topic's own retention if consumers may be reset to the beginning.

    ``partition_interval``: the width of one partition (whole hours dividing a day, or whole
    days). Whole partitions are dropped once all their rows are older than ``retention``.

    ``premake``: how many future partitions maintenance keeps ready.

    ``expired``: what to do with an event whose time (``occurred_at`` header, else the record
    timestamp) is older than ``retention``, since its original may have been forgotten:
    ``"dead_letter"`` (default) parks it in the dead-letter destination; ``"skip"`` treats it
    as a duplicate (no effect, counted and logged); ``"apply"`` runs the handler anyway,
    accepting a possible second effect. Never a silent second effect.
    """

    retention: timedelta = timedelta(days=7)
    partition_interval: timedelta = timedelta(days=1)
    premake: int = 3
    expired: ExpiredPolicy = "dead_letter"
    table: str = "processed_events"

    def __post_init__(self) -> None:
        identifier(self.table, "dedup table name")
        step = self.partition_interval
        hour = timedelta(hours=1)
        if step <= timedelta(0) or step % hour:
            raise ConfigurationError("partition_interval must be a positive number of hours")
        if step < timedelta(days=1) and timedelta(days=1) % step:
            raise ConfigurationError("a partition_interval under a day must divide 24 hours")
        if step > timedelta(days=1) and step % timedelta(days=1):
            raise ConfigurationError("a partition_interval over a day must be whole days")
        if self.retention < step:
            raise ConfigurationError("retention must be at least one partition_interval")
        if not 1 <= self.premake <= 100:
            raise ConfigurationError("premake must be between 1 and 100")
        if self.expired not in ("dead_letter", "skip", "apply"):
            raise ConfigurationError(f"unknown expired policy {self.expired!r}")
