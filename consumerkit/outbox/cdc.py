"""Change data capture's replication slot: made before an outbox's first event, checked by the
writer and by ``consumerkit check``.

A logical replication slot keeps the WAL from the moment it is created, and no earlier. A
connector that creates its slot when it first starts (Debezium does) never sees the events
committed before: with ``Outbox(delete_after_insert=True)`` their rows are gone at commit, so
its snapshot cannot find them either, and they are lost without a word. :func:`prepare_cdc`
creates the publication (the outbox table alone) and the slot ahead of the first event; the
connector is then configured with both (``slot.name``, ``publication.name``:
:func:`~consumerkit.outbox.debezium.event_router_config`).

Which publication a ``pgoutput`` slot streams is chosen by its reader when it connects, not
stored with the slot, so "a slot reads the outbox" means: a logical slot of this database
whose WAL is not lost, and, for ``pgoutput``, a publication that holds the outbox table. Both
are catalog reads on the caller's connection, inside its transaction: no session state, so
they work behind a transaction pooler.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import asyncpg

from ..errors import ConfigurationError, NoReplicationSlotError, StartupError
from ..types import DbConnection
from .retention import ensure_publication
from .table import OutboxTable

__all__ = ["SLOT_CHECK_TTL", "CdcSetup", "SlotGuard", "prepare_cdc", "slot_reading"]

SLOT_CHECK_TTL = 30.0
"""Seconds a writer trusts a slot it found before asking again: one catalog query per writer
per 30 s, not one per event. A slot dropped meanwhile is missed for at most that long; the
slot metrics and ``consumerkit check`` report it."""

_READER = """
SELECT s.slot_name FROM pg_catalog.pg_replication_slots s
WHERE s.slot_type = 'logical' AND s.database = current_database()
  AND coalesce(s.wal_status, '') <> 'lost'
  AND (s.plugin <> 'pgoutput' OR EXISTS (
        SELECT 1 FROM pg_catalog.pg_publication_tables p
        WHERE p.schemaname = $1 AND p.tablename = $2))
ORDER BY s.slot_name <> $3, s.slot_name LIMIT 1"""


async def slot_reading(conn: DbConnection, table: OutboxTable) -> str | None:
    """The name of a logical slot that reads ``table`` (its own slot first), else ``None``."""
    found: str | None = await conn.fetchval(_READER, table.schema, table.table,
                                            table.replication_slot)
    return found


def no_slot_message(table: OutboxTable) -> str:
    return (f"no replication slot reads outbox {table.schema}.{table.table}, which deletes "
            "each event as it inserts it: the event would be lost; create the slot before "
            "the first event: consumerkit migrate --outbox-only --outbox-cdc --schema "
            f"{table.schema} --outbox-table {table.table}")


class SlotGuard:
    """A delete-at-insert writer's check that a slot reads its outbox: asked on the caller's
    connection, then trusted for :data:`SLOT_CHECK_TTL` seconds. A missing slot is never
    cached, so the writer writes as soon as the slot exists."""

    __slots__ = ("_table", "_trusted_until", "ttl")

    def __init__(self, table: OutboxTable, ttl: float = SLOT_CHECK_TTL) -> None:
        self._table = table
        self.ttl = ttl
        self._trusted_until = 0.0

    async def check(self, conn: DbConnection) -> None:
        """Raise :class:`NoReplicationSlotError` when no slot reads the outbox."""
        now = time.monotonic()
        if now < self._trusted_until:
            return
        if await slot_reading(conn, self._table) is None:
            raise NoReplicationSlotError(no_slot_message(self._table))
        self._trusted_until = now + self.ttl


@dataclass(frozen=True, slots=True)
class CdcSetup:
    """What :func:`prepare_cdc` left in place: the connector's ``publication.name`` and
    ``slot.name``, and whether it created the slot (else it was there)."""

    publication: str
    slot: str
    created_slot: bool


async def prepare_cdc(conn: DbConnection, table: OutboxTable) -> CdcSetup:
    """Create ``table``'s publication (the outbox table alone) and its ``pgoutput`` slot,
    unless present: the owner's step after :func:`consumerkit.migrate` (``outboxes=``). Each
    statement commits on its own (a slot cannot be created in a transaction that wrote).
    Needs ``wal_level=logical`` and a role with ``REPLICATION`` (or superuser); creating the
    slot waits for the transactions running at that moment to end."""
    if conn.is_in_transaction():
        raise ConfigurationError("prepare_cdc: call it outside a transaction (a replication "
                                 "slot cannot be created in a transaction that wrote)")
    slot = table.replication_slot
    try:
        await ensure_publication(conn, table)
        found = await conn.fetchrow(
            "SELECT plugin, database = current_database() AS here FROM "
            "pg_catalog.pg_replication_slots WHERE slot_name = $1", slot)
        if found is not None:
            if not found["here"] or found["plugin"] != "pgoutput":
                raise StartupError(f"replication slot {slot} exists for another database or "
                                   "plugin: drop it, or name the outbox otherwise")
            return CdcSetup(table.publication, slot, created_slot=False)
        try:
            await conn.execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                               slot)
        except asyncpg.DuplicateObjectError:  # another migration made it meanwhile
            return CdcSetup(table.publication, slot, created_slot=False)
    except asyncpg.PostgresError as exc:
        raise StartupError(f"change data capture for outbox {table.schema}.{table.table}: "
                           f"{exc} (needs wal_level=logical and a role with REPLICATION and "
                           "CREATE on the database)") from exc
    return CdcSetup(table.publication, slot, created_slot=True)
