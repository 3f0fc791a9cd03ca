"""Deduplication: the policy, the PostgreSQL store and the maintenance of its partitions."""

from .partitions import MaintenanceReport, PartitionInfo, list_partitions, maintain
from .policy import DedupPolicy, ExpiredPolicy
from .postgres import PostgresDedupStore

__all__ = [
    "DedupPolicy",
    "ExpiredPolicy",
    "MaintenanceReport",
    "PartitionInfo",
    "PostgresDedupStore",
    "list_partitions",
    "maintain",
]
