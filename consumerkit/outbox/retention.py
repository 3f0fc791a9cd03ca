"""An outbox kept for a retention, for change data capture: time partitions dropped whole.

With Debezium (or any reader of the WAL) there is no relay to delete published rows. Deleting
each row in its inserting transaction (``Outbox(delete_after_insert=True)``) keeps nothing to
look at or replay; deleting old rows in batches (:func:`~consumerkit.outbox.cleanup`) bloats
the table and writes WAL for every row. ``OutboxTable(retention=OutboxRetention(...))`` keeps
the events instead in a table range-partitioned on ``created_at`` (the database time of the
insert, never the writer's ``occurred_at``, which may be any time), and the dedup table's
maintenance (:func:`~consumerkit.dedup.partitions.maintain`, through the same owner-created
functions) makes the partitions ahead and detaches and drops whole those past the retention.

The layout differs from the relay's: no ``slot`` column and no unique ``id`` (a unique key of
a partitioned table must hold the partition key); the primary key is ``(seq, created_at)``.
The relay refuses it (it claims rows by slot and deletes what it published). Debezium reads a
partitioned table only through a publication with ``publish_via_partition_root = true``, so
that every change carries the root table's name the connector's ``table.include.list`` and
the EventRouter expect: :func:`consumerkit.migrate` (``outboxes=``) creates that publication,
``{schema}_{table}_cdc``, and :func:`~consumerkit.outbox.debezium.event_router_config` names
it with ``publication.autocreate.mode=disabled``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from ..dedup.layout import existing_layout
from ..dedup.partitioning import PartitionPlan
from ..dedup.partitions import check_partition_names
from ..dedup.policy import check_partitioning
from ..errors import ConfigurationError, StartupError
from ..shared.identifiers import identifier
from ..types import DbConnection

if TYPE_CHECKING:
    from .table import OutboxTable


@dataclass(frozen=True, slots=True)
class OutboxRetention:
    """How long an outbox read by change data capture keeps its events, and in what
    partitions: ``partition_interval`` wide (whole hours dividing a day, or whole days),
    ``premake`` of them made ahead. A partition is dropped once all its rows are older than
    ``retention``: rows live between ``retention`` and ``retention + partition_interval``."""

    retention: timedelta = timedelta(days=7)
    partition_interval: timedelta = timedelta(days=1)
    premake: int = 3

    def __post_init__(self) -> None:
        check_partitioning(self.retention, self.partition_interval, self.premake)


def plan(t: OutboxTable) -> PartitionPlan:
    """What :func:`~consumerkit.dedup.partitions.maintain` needs of ``t``'s partitions."""
    if t.retention is None:
        raise ConfigurationError(f"outbox {t.schema}.{t.table} has no OutboxRetention: its "
                                 "rows are deleted by the relay or by cleanup")
    check_partition_names(t.table)
    return PartitionPlan(t.table, t.retention.retention, t.retention.partition_interval,
                         t.retention.premake)


async def ensure_publication(conn: DbConnection, t: OutboxTable) -> None:
    """Create ``t``'s publication with ``publish_via_partition_root``, or set that option on
    one that exists (the owner's migration: it needs CREATE on the database)."""
    name = identifier(t.publication, "publication name")
    found = await conn.fetchrow(
        """SELECT p.pubviaroot, EXISTS (
               SELECT 1 FROM pg_catalog.pg_publication_rel r WHERE r.prpubid = p.oid
               AND r.prrelid = to_regclass($2)) AS has_table
           FROM pg_catalog.pg_publication p WHERE p.pubname = $1""",
        t.publication, f"{t.schema}.{t.table}")
    if found is None:
        await conn.execute(f"CREATE PUBLICATION {name} FOR TABLE {t.events} "
                           "WITH (publish_via_partition_root = true)")
        return
    if not found["has_table"]:
        raise StartupError(f"publication {t.publication} exists without outbox "
                           f"{t.schema}.{t.table}: drop it or rename the outbox")
    if not found["pubviaroot"]:
        await conn.execute(f"ALTER PUBLICATION {name} SET (publish_via_partition_root = true)")


async def check_outbox_layout(conn: DbConnection, t: OutboxTable) -> None:
    """Refuse an existing table whose layout is not the one ``t`` asks for."""
    found = await existing_layout(conn, t.schema, t.table)
    wanted = "table" if t.retention is None else "partitioned"
    if found is not None and found != wanted:
        have = "time partitions (OutboxRetention)" if found == "partitioned" else \
            "one plain table (the relay's layout)"
        raise StartupError(
            f"outbox {t.schema}.{t.table} exists with {have}; a layout cannot be changed in "
            "place: name another table or keep the layout")
