"""Choosing the dedup store for a policy.

Every store answers the :class:`~consumerkit.types.DedupStore` protocol, so the consumer runs
the same pipeline whatever stands behind it:

- ``DedupPolicy(layout="partitioned")`` (default): :class:`PostgresDedupStore` over a table
  range-partitioned by time; retention drops whole partitions.
- ``DedupPolicy(layout="table")``: :class:`PostgresDedupStore` over one plain table with a
  ``seen_at`` index; retention deletes expired rows in batches.
- :class:`~consumerkit.dedup.memory.InMemoryDedupStore`: tests only, never behind a consumer.

A Redis "seen" cache (:class:`~consumerkit.dedup.redis.RedisDedupCache`) is not a store: it
stands in front of one and PostgreSQL stays the source of truth.
"""

from __future__ import annotations

from ..types import DedupStore
from .policy import DedupPolicy
from .postgres import PostgresDedupStore


def store_for(schema: str, policy: DedupPolicy) -> DedupStore:
    """The PostgreSQL dedup store for ``policy`` in ``schema`` (names validated here)."""
    return PostgresDedupStore(schema, policy)
