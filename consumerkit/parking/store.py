"""SQL of the parked keys: park records, load a partition's parked keys, list, finish a
replay, discard. Every function takes a connection and validates the schema name.

A key's row in ``parked_keys`` is the lock that orders the consumer and the commands: the
consumer locks it before adding records (and finds it gone once a replay or a discard has
removed it: the key is no longer parked), a replay locks it before removing the key when no
record is left, a discard before removing key and records together.
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Iterable, Sequence

from ..deadletter.table import decode_headers, encode_headers, pg_text
from ..shared.identifiers import identifier, qualified
from ..types import DbConnection
from .entry import ParkedKey, ParkedRecord
from .tables import AUDIT, KEYS, RECORDS

Partition = tuple[str, int]

_RECORD_COLUMNS = ('consumer, topic, "partition", "offset", key, value, headers, timestamp_ms, '
                   "event_id, event_type, reason, detail, attempts")
_WHERE_KEY = 'consumer = $1 AND topic = $2 AND "partition" = $3 AND key = $4'


def _tables(schema: str) -> tuple[str, str, str]:
    identifier(schema, "schema name")
    return qualified(schema, KEYS), qualified(schema, RECORDS), qualified(schema, AUDIT)


async def park(conn: DbConnection, schema: str, records: Sequence[ParkedRecord], *,
               start: bool) -> bool:
    """Store ``records`` (one key of one partition, in offset order) as parked, in one
    transaction. ``start``: the key is parked now (its first record's retries ran out);
    otherwise the records join a park believed to exist, and ``False`` comes back, with
    nothing stored, when it no longer does (replayed or discarded meanwhile). A record
    stored before (a redelivery) is kept as it was."""
    keys, table, _ = _tables(schema)
    first = records[0]
    where = (first.consumer, first.topic, first.partition, first.key)
    async with conn.transaction():
        if start:
            # the row, new or found, locked in one statement: found and then locked in a second
            # one, a replay or discard removing it in between would leave nothing to park under
            await conn.execute(
                f'INSERT INTO {keys} AS k (consumer, topic, "partition", key, reason, detail) '
                'VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (consumer, topic, "partition", key) '
                "DO UPDATE SET reason = k.reason",
                *where, pg_text(first.reason), pg_text(first.detail))
        elif await conn.fetchval(f"SELECT 1 FROM {keys} WHERE {_WHERE_KEY} FOR UPDATE",
                                 *where) is None:
            return False
        await conn.executemany(
            f"INSERT INTO {table} ({_RECORD_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, "
            "$7::jsonb, $8, $9, $10, $11, $12, $13) "
            'ON CONFLICT (consumer, topic, "partition", "offset") DO NOTHING',
            [_row(r) for r in records])
    return True


def _row(r: ParkedRecord) -> tuple[object, ...]:
    return (r.consumer, r.topic, r.partition, r.offset, r.key, r.value,
            encode_headers(r.headers), r.timestamp_ms,
            None if r.event_id is None else pg_text(r.event_id),
            None if r.event_type is None else pg_text(r.event_type),
            pg_text(r.reason), pg_text(r.detail), r.attempts)


async def missing_tables(conn: DbConnection, schema: str) -> str | None:
    """The first of the parking tables that does not exist in ``schema``, if any."""
    for table in (KEYS, RECORDS, AUDIT):
        if await conn.fetchval("SELECT to_regclass($1)", f'"{schema}"."{table}"') is None:
            return table
    return None


async def parked_keys(conn: DbConnection, schema: str, consumer: str,
                      partitions: Iterable[Partition]) -> dict[Partition, dict[bytes, int]]:
    """For each of ``partitions``, its parked keys and how many records wait behind each."""
    keys, table, _ = _tables(schema)
    wanted = list(partitions)
    found: dict[Partition, dict[bytes, int]] = {p: {} for p in wanted}
    if not wanted:
        return found
    rows = await conn.fetch(
        f'SELECT k.topic, k."partition", k.key, (SELECT count(*) FROM {table} r WHERE '
        'r.consumer = k.consumer AND r.topic = k.topic AND r."partition" = k."partition" '
        "AND r.key = k.key AND r.replayed_at IS NULL) AS records "
        f"FROM {keys} k JOIN unnest($2::text[], $3::int[]) AS p(topic, part) "
        'ON k.topic = p.topic AND k."partition" = p.part WHERE k.consumer = $1',
        consumer, [t for t, _ in wanted], [n for _, n in wanted])
    for row in rows:
        found[row["topic"], row["partition"]][bytes(row["key"])] = row["records"]
    return found


async def list_keys(conn: DbConnection, schema: str, consumer: str | None = None,
                    key: bytes | None = None, topic: str | None = None,
                    partition: int | None = None, limit: int = 1000) -> list[ParkedKey]:
    """Parked keys (of ``consumer``, ``key``, ``topic``, ``partition`` when given), oldest
    first, with the number of records waiting and the first one's offset."""
    keys, table, _ = _tables(schema)
    rows = await conn.fetch(
        f'SELECT k.*, count(r.id) AS records, min(r."offset") AS first_offset FROM {keys} k '
        f"LEFT JOIN {table} r ON r.consumer = k.consumer AND r.topic = k.topic AND "
        'r."partition" = k."partition" AND r.key = k.key AND r.replayed_at IS NULL '
        "WHERE ($1::text IS NULL OR k.consumer = $1) AND ($2::bytea IS NULL OR k.key = $2) "
        'AND ($3::text IS NULL OR k.topic = $3) AND ($4::int IS NULL OR k."partition" = $4) '
        'GROUP BY k.consumer, k.topic, k."partition", k.key ORDER BY k.parked_at, k.topic, '
        'k."partition", k.key LIMIT $5',
        consumer, key, topic, partition, limit)
    return [ParkedKey(row["consumer"], row["topic"], row["partition"], bytes(row["key"]),
                      row["reason"], row["detail"], row["parked_at"], row["records"],
                      row["first_offset"]) for row in rows]


async def waiting(conn: DbConnection, schema: str, where: ParkedKey) -> list[ParkedRecord]:
    """The records of a parked key not yet replayed, in offset order."""
    _, table, _ = _tables(schema)
    rows = await conn.fetch(
        f"SELECT id, parked_at, {_RECORD_COLUMNS} FROM {table} WHERE {_WHERE_KEY} "
        'AND replayed_at IS NULL ORDER BY "offset"',
        where.consumer, where.topic, where.partition, where.key)
    return [ParkedRecord(
        consumer=row["consumer"], topic=row["topic"], partition=row["partition"],
        offset=row["offset"], key=bytes(row["key"]), value=row["value"],
        headers=decode_headers(row["headers"]), timestamp_ms=row["timestamp_ms"],
        reason=row["reason"], detail=row["detail"], attempts=row["attempts"],
        event_id=row["event_id"], event_type=row["event_type"], id=row["id"],
        parked_at=row["parked_at"]) for row in rows]


def mark_replayed_sql(schema: str) -> str:
    """``$1``: a parked record's id; run in the transaction that applies it."""
    _, table, _ = _tables(schema)
    return f"UPDATE {table} SET replayed_at = now() WHERE id = $1 AND replayed_at IS NULL"


async def finish(conn: DbConnection, schema: str, where: ParkedKey) -> int | None:
    """Unpark the key if every record of it was replayed: remove key and records and write
    the audit row, under the key's lock. The number of records replayed, or ``None`` when
    records are still waiting (parked meanwhile by the consumer)."""
    keys, table, audit = _tables(schema)
    args = (where.consumer, where.topic, where.partition, where.key)
    async with conn.transaction():
        if await conn.fetchval(f"SELECT 1 FROM {keys} WHERE {_WHERE_KEY} FOR UPDATE",
                               *args) is None:
            return 0  # removed by someone else (a discard) meanwhile
        counts = await conn.fetchrow(
            f"SELECT count(*) FILTER (WHERE replayed_at IS NULL) AS left, "
            f"count(*) AS replayed FROM {table} WHERE {_WHERE_KEY}", *args)
        assert counts is not None
        if counts["left"]:
            return None
        await _remove(conn, keys, table, audit, args, "replayed", counts["replayed"])
        return int(counts["replayed"])


async def discard(conn: DbConnection, schema: str, where: ParkedKey) -> int | None:
    """Drop a parked key and its records, leaving an audit row; the number of records
    dropped (``None``: the key was not parked any more)."""
    keys, table, audit = _tables(schema)
    args = (where.consumer, where.topic, where.partition, where.key)
    async with conn.transaction():
        if await conn.fetchval(f"SELECT 1 FROM {keys} WHERE {_WHERE_KEY} FOR UPDATE",
                               *args) is None:
            return None
        dropped = await conn.fetchval(
            f"SELECT count(*) FROM {table} WHERE {_WHERE_KEY} AND replayed_at IS NULL", *args)
        await _remove(conn, keys, table, audit, args, "discarded", dropped)
        return int(dropped)


async def _remove(conn: DbConnection, keys: str, table: str, audit: str,
                  args: tuple[object, ...], action: str, records: int) -> None:
    await conn.execute(f"DELETE FROM {table} WHERE {_WHERE_KEY}", *args)
    await conn.execute(f"DELETE FROM {keys} WHERE {_WHERE_KEY}", *args)
    await conn.execute(
        f'INSERT INTO {audit} (consumer, topic, "partition", key, action, records, actor) '
        "VALUES ($1, $2, $3, $4, $5, $6, $7)", *args, action, records, actor())


async def last_audit(conn: DbConnection, schema: str, consumer: str, key: bytes,
                     ) -> tuple[str, str, str] | None:
    """The latest replay or discard of ``key``: (action, actor, when), if any."""
    _, _, audit = _tables(schema)
    row = await conn.fetchrow(
        f"SELECT action, actor, done_at FROM {audit} WHERE consumer = $1 AND key = $2 "
        "ORDER BY id DESC LIMIT 1", consumer, key)
    if row is None:
        return None
    return row["action"], row["actor"], f"{row['done_at']:%Y-%m-%d %H:%M:%S %Z}"


async def known_consumer(conn: DbConnection, schema: str, consumer: str) -> bool:
    """Whether ``consumer`` has a parked key, or had one."""
    keys, _, audit = _tables(schema)
    return bool(await conn.fetchval(
        f"SELECT EXISTS (SELECT 1 FROM {keys} WHERE consumer = $1) "
        f"OR EXISTS (SELECT 1 FROM {audit} WHERE consumer = $1)", consumer))


def actor() -> str:
    """Who runs the command: the operating-system user at this host."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in a bare container: the host still says where
        user = "?"
    return f"{user}@{socket.gethostname()}"[:200]
