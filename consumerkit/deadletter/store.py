"""Dead letters as the replay and discard commands see them: the audit columns, the filters
that choose entries, and the SQL that reads and marks them.

An entry is never deleted by a replay or a discard: ``status`` goes from ``waiting`` to
``replayed`` or ``discarded``, with when (``resolved_at``), by which database role
(``resolved_by``, ``current_user``) and the operator's ``resolution_note``. A replay marks its
entry in the transaction that applies it, so the mark and the effects commit together or not
at all. A replay that fails again leaves the entry waiting and records why beside it
(``last_replay_error``, ``replay_attempts``, ``last_replay_at``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..envelope import Record
from ..shared.identifiers import identifier, qualified
from ..types import DbConnection
from .entry import DeadLetterEntry
from .table import TABLE, decode_headers, pg_text

WAITING, REPLAYED, DISCARDED = "waiting", "replayed", "discarded"
STATUSES = (WAITING, REPLAYED, DISCARDED)


def resolution_ddl(schema: str) -> list[str]:
    """The audit columns of a replay or a discard (core migration step 9)."""
    table = qualified(schema, TABLE)
    return [
        f"""ALTER TABLE {table}
            ADD COLUMN IF NOT EXISTS status text NOT NULL DEFAULT 'waiting'
                CHECK (status IN ('waiting', 'replayed', 'discarded')),
            ADD COLUMN IF NOT EXISTS resolved_at timestamptz,
            ADD COLUMN IF NOT EXISTS resolved_by text,
            ADD COLUMN IF NOT EXISTS resolution_note text,
            ADD COLUMN IF NOT EXISTS replay_attempts integer NOT NULL DEFAULT 0,
            ADD COLUMN IF NOT EXISTS last_replay_error text,
            ADD COLUMN IF NOT EXISTS last_replay_at timestamptz""",
        f"""CREATE INDEX IF NOT EXISTS {identifier(TABLE + "_waiting")}
            ON {table} (consumer, topic, "partition", "offset") WHERE status = 'waiting'""",
    ]


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """Which dead letters a command takes; every field given must match (``None``: any).

    ``since``/``until`` bound the time the entry failed (``until`` excluded); ``ids`` are the
    rows' ids (``consumerkit dead-letters`` lists them); ``limit`` caps the entries taken, in
    their original order (topic, partition, offset)."""

    consumer: str | None = None
    reason: str | None = None
    event_type: str | None = None
    topic: str | None = None
    partition: int | None = None
    ids: tuple[int, ...] = ()
    since: datetime | None = None
    until: datetime | None = None
    limit: int | None = None

    def where(self, statuses: tuple[str, ...] = (WAITING,)) -> tuple[str, list[Any]]:
        """A ``WHERE`` clause over ``dead_letters`` and its arguments ($1, $2, ...)."""
        args: list[Any] = [list(statuses)]
        parts = ["status = ANY($1::text[])"]
        for column, value in (("consumer", self.consumer), ("reason", self.reason),
                              ("event_type", self.event_type), ("topic", self.topic),
                              ('"partition"', self.partition)):
            if value is not None:
                args.append(value)
                parts.append(f"{column} = ${len(args)}")
        if self.ids:
            args.append(list(self.ids))
            parts.append(f"id = ANY(${len(args)}::bigint[])")
        if self.since is not None:
            args.append(self.since)
            parts.append(f"failed_at >= ${len(args)}")
        if self.until is not None:
            args.append(self.until)
            parts.append(f"failed_at < ${len(args)}")
        return " AND ".join(parts), args


@dataclass(frozen=True, slots=True)
class StoredDeadLetter:
    """A dead-letter row: the entry, its id, and what became of it."""

    id: int
    entry: DeadLetterEntry
    status: str
    resolved_at: datetime | None
    resolved_by: str | None
    resolution_note: str | None
    replay_attempts: int
    last_replay_error: str | None
    last_replay_at: datetime | None

    def record(self) -> Record:
        """The broker record as it was delivered, to be decoded and applied again (its
        broker timestamp was not kept: ``None``)."""
        e = self.entry
        return Record(e.topic, e.partition, e.offset, e.key, e.value, tuple(e.headers), None)


_SELECT = (
    'SELECT id, consumer, topic, "partition", "offset", key, value, headers, reason, detail, '
    "attempts, event_id, event_type, failed_at, status, resolved_at, resolved_by, "
    "resolution_note, replay_attempts, last_replay_error, last_replay_at FROM {table}")


def _stored(row: Any) -> StoredDeadLetter:
    entry = DeadLetterEntry(
        consumer=row["consumer"], topic=row["topic"], partition=row["partition"],
        offset=row["offset"], key=row["key"], value=row["value"],
        headers=decode_headers(row["headers"]), reason=row["reason"], detail=row["detail"],
        attempts=row["attempts"], event_id=row["event_id"], event_type=row["event_type"],
        failed_at=row["failed_at"])
    return StoredDeadLetter(
        row["id"], entry, row["status"], row["resolved_at"], row["resolved_by"],
        row["resolution_note"], row["replay_attempts"], row["last_replay_error"],
        row["last_replay_at"])


async def select(conn: DbConnection, schema: str, chosen: DeadLetterFilter,
                 statuses: tuple[str, ...] = (WAITING,), *, by_position: bool = True,
                 ) -> list[StoredDeadLetter]:
    """The entries ``chosen`` names, in their original order (topic, partition, offset), or
    in the order written with ``by_position=False`` (the listing)."""
    where, args = chosen.where(statuses)
    order = 'topic, "partition", "offset", id' if by_position else "id"
    sql = f"{_SELECT.format(table=qualified(schema, TABLE))} WHERE {where} ORDER BY {order}"
    if chosen.limit is not None:
        args.append(chosen.limit)
        sql += f" LIMIT ${len(args)}"
    return [_stored(row) for row in await conn.fetch(sql, *args)]


async def fetch(conn: DbConnection, schema: str, entry_id: int) -> StoredDeadLetter | None:
    """The entry ``entry_id``, whatever its status."""
    row = await conn.fetchrow(
        f"{_SELECT.format(table=qualified(schema, TABLE))} WHERE id = $1", entry_id)
    return None if row is None else _stored(row)


def mark_replayed_sql(schema: str) -> str:
    """$1 the id, $2 the note: ``UPDATE 0`` when the entry is no longer waiting."""
    return (f"UPDATE {qualified(schema, TABLE)} SET status = 'replayed', resolved_at = now(), "
            "resolved_by = current_user, resolution_note = $2, "
            "replay_attempts = replay_attempts + 1, last_replay_at = now() "
            "WHERE id = $1 AND status = 'waiting'")


async def first_waiting(conn: DbConnection, schema: str, consumer: str, topics: list[str],
                        ) -> dict[tuple[str, int, bytes | None], int]:
    """The offset of the first waiting entry of each key of ``consumer`` on ``topics``: an
    entry behind one that a replay did not choose must wait for it (the key's order)."""
    rows = await conn.fetch(
        f'SELECT DISTINCT ON (topic, "partition", key) topic, "partition", key, "offset" '
        f"FROM {qualified(schema, TABLE)} WHERE consumer = $1 AND status = 'waiting' "
        'AND topic = ANY($2::text[]) ORDER BY topic, "partition", key, "offset"',
        consumer, topics)
    return {(r["topic"], r["partition"], r["key"]): r["offset"] for r in rows}


async def replay_failed(conn: DbConnection, schema: str, entry_id: int, error: str) -> None:
    """Record beside a waiting entry that a replay failed again, and why."""
    await conn.execute(
        f"UPDATE {qualified(schema, TABLE)} SET replay_attempts = replay_attempts + 1, "
        "last_replay_error = $2, last_replay_at = now() WHERE id = $1 AND status = 'waiting'",
        entry_id, pg_text(error))


async def discard(conn: DbConnection, schema: str, ids: list[int], note: str | None,
                  ) -> list[tuple[str, int]]:
    """Mark the waiting entries among ``ids`` discarded; the topic of each one marked."""
    rows = await conn.fetch(
        f"UPDATE {qualified(schema, TABLE)} SET status = 'discarded', resolved_at = now(), "
        "resolved_by = current_user, resolution_note = $2 "
        "WHERE id = ANY($1::bigint[]) AND status = 'waiting' RETURNING topic, id",
        ids, None if note is None else pg_text(note))
    return [(row["topic"], row["id"]) for row in rows]
