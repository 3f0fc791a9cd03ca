"""Deduplication: the policy, the stores (PostgreSQL in two layouts, in-memory for tests), the
caches in front of them (Redis, or the process's memory), maintenance and the
redelivery-horizon check."""

from typing import TYPE_CHECKING

from .memory import InMemoryDedupStore
from .memory_cache import MemoryDedupCache
from .partitions import MaintenanceReport, PartitionInfo, list_partitions, maintain
from .policy import DedupPolicy, ExpiredPolicy, Layout
from .postgres import PostgresDedupStore
from .stores import store_for

if TYPE_CHECKING:
    from .redis import RedisDedupCache

__all__ = [
    "DedupPolicy",
    "ExpiredPolicy",
    "InMemoryDedupStore",
    "Layout",
    "MaintenanceReport",
    "MemoryDedupCache",
    "PartitionInfo",
    "PostgresDedupStore",
    "RedisDedupCache",
    "list_partitions",
    "maintain",
    "store_for",
]


def __getattr__(name: str) -> object:
    # RedisDedupCache needs the optional redis package: imported on first use
    if name == "RedisDedupCache":
        from .redis import RedisDedupCache  # MissingExtraError names the extra

        return RedisDedupCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
