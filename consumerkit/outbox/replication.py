"""Replication slots: what each keeps of the WAL, and whether a reader holds it.

Debezium reads the outbox through a logical replication slot. The slot keeps every WAL segment
from its ``restart_lsn`` on until its reader confirms it, so a slot whose reader is down keeps
WAL until the disk fills and PostgreSQL stops. ``consumerkit check`` and the consumer's
metrics (``consumerkit_replication_slot_*``) read the state from here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..types import DbConnection

__all__ = ["DEFAULT_MAX_RETAINED", "SlotState", "replication_slots", "slot_problems"]

DEFAULT_MAX_RETAINED = 1 << 30
"""Retained WAL above which a slot is reported: 1 GiB, 64 default segments."""

# On a standby the current position is the last one replayed (pg_current_wal_lsn() raises).
_QUERY = """
SELECT slot_name, slot_type, coalesce(plugin, '') AS plugin, active,
       coalesce(pg_wal_lsn_diff(
           CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                ELSE pg_current_wal_lsn() END, restart_lsn), 0)::bigint AS retained,
       coalesce(wal_status, '') AS wal_status
FROM pg_replication_slots ORDER BY slot_name
"""


@dataclass(frozen=True, slots=True)
class SlotState:
    """One slot: ``retained_bytes`` of WAL kept for it; ``active`` if a reader holds it."""

    name: str
    kind: str  # "logical" or "physical"
    plugin: str
    active: bool
    retained_bytes: int
    wal_status: str  # "reserved", "extended", "unreserved", "lost" (PostgreSQL 13+)


async def replication_slots(conn: DbConnection) -> list[SlotState]:
    """Every replication slot of the server ``conn`` is connected to."""
    return [SlotState(r["slot_name"], r["slot_type"], r["plugin"], r["active"],
                      max(0, r["retained"]), r["wal_status"])
            for r in await conn.fetch(_QUERY)]


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    value = n / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def slot_problems(slots: Sequence[SlotState], max_retained: int) -> list[str]:
    """One line per slot that is inactive or keeps more than ``max_retained`` bytes of WAL."""
    problems = []
    for slot in slots:
        why = []
        if not slot.active:
            why.append("has no reader (inactive)")
        if slot.retained_bytes > max_retained:
            why.append(f"keeps {_size(slot.retained_bytes)} of WAL (limit "
                       f"{_size(max_retained)})")
        if slot.wal_status == "lost":
            why.append("has lost WAL its reader still needed")
        if why:
            kind = f"{slot.kind}, {slot.plugin}" if slot.plugin else slot.kind
            problems.append(
                f"replication slot {slot.name} ({kind}) {' and '.join(why)}: WAL piles up "
                "until the disk fills; start its reader (e.g. the Debezium connector) or drop "
                "the slot with "
                f"pg_drop_replication_slot('{slot.name}') if nothing will read it again")
    return problems
