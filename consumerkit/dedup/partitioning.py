"""What partition maintenance needs to know of a time-partitioned table.

The dedup table and an outbox kept for a retention (:class:`~consumerkit.outbox.OutboxRetention`)
are both range-partitioned by the database time of their rows and both maintained by
:func:`~consumerkit.dedup.partitions.maintain`: partitions created ahead, expired ones detached
and dropped whole. :class:`~consumerkit.dedup.DedupPolicy` is one such description;
:class:`PartitionPlan` is the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from .policy import Layout


class TimePartitioned(Protocol):
    """A table's partitioning: its name, layout, retention, partition width, how many
    partitions are kept ready ahead, and the margin kept past the retention."""

    @property
    def table(self) -> str: ...

    @property
    def layout(self) -> Layout: ...

    @property
    def retention(self) -> timedelta: ...

    @property
    def partition_interval(self) -> timedelta: ...

    @property
    def premake(self) -> int: ...

    @property
    def clock_skew(self) -> timedelta: ...


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    """A partitioned table other than the dedup table (validated by whoever builds it)."""

    table: str
    retention: timedelta
    partition_interval: timedelta
    premake: int
    clock_skew: timedelta = timedelta(0)
    layout: Layout = "partitioned"
