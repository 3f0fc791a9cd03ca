"""Offsets in PostgreSQL, beside the effects: ``{schema}.consumer_offsets``, one row per
consumer group, topic and partition holding the next offset to read.

The consumer writes a partition's row in every transaction that settles records of it
(:meth:`PostgresOffsets.write_in`), so the offset commits, or is lost, with the effects and
the dedup rows; and on its own (:meth:`PostgresOffsets.save`) for what settles without a
transaction (dead letters, cache hits, parked keys). A row only ever moves forward
(``GREATEST``): transactions of one partition commit out of order, and a later one may carry
a lower watermark. ``commits`` counts the transactions that wrote the row: they take its lock
one after another, so each gets the next number and commits in that order, and a database
that lost any of them holds a lower count than the consumer saw answered
(:mod:`~consumerkit.offsets.recheck`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import asyncpg

from ..errors import StartupError
from ..shared.identifiers import qualified
from ..transport.source import Partition
from ..types import DbConnection
from .store import OffsetStoreName

TABLE = "consumer_offsets"


def offsets_ddl(schema: str) -> list[str]:
    """Statements creating the offsets table (run by :func:`consumerkit.migrate`)."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {qualified(schema, TABLE)} (
            consumer_group text NOT NULL,
            topic text NOT NULL,
            "partition" integer NOT NULL,
            next_offset bigint NOT NULL CHECK (next_offset >= 0),
            commits bigint NOT NULL DEFAULT 1,
            updated_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (consumer_group, topic, "partition")
        )""",
    ]


async def require_table(conn: DbConnection, schema: str) -> None:
    """Raise :class:`StartupError` unless ``consumerkit migrate`` created the table."""
    if await conn.fetchval("SELECT to_regclass($1)", f"{schema}.{TABLE}") is None:
        raise StartupError(
            f'offset_store="postgres" (the default) needs the table {schema}.{TABLE}: run '
            "consumerkit migrate (or start once with migrate=True), or keep the offsets in "
            "Kafka only with offset_store=\"kafka\"")


class PostgresOffsets:
    """One consumer group's rows of ``{schema}.consumer_offsets``."""

    name: OffsetStoreName = "postgres"

    def __init__(self, pool: asyncpg.Pool, schema: str, group: str) -> None:
        self.pool = pool
        self.group = group
        table = qualified(schema, TABLE)
        # rows in one order in every transaction: two transactions of the same partitions
        # wait for each other, never deadlock
        upsert = (
            f'INSERT INTO {table} AS o (consumer_group, topic, "partition", next_offset) '
            "SELECT $1, u.t, u.p, u.o FROM unnest($2::text[], $3::int[], $4::bigint[]) "
            "AS u(t, p, o) ORDER BY u.t, u.p "
            'ON CONFLICT (consumer_group, topic, "partition") DO UPDATE '
            "SET next_offset = {offset}, commits = o.commits + 1, updated_at = now() "
            'RETURNING o.topic, o."partition", o.commits')
        self._upsert = upsert.format(offset="GREATEST(o.next_offset, EXCLUDED.next_offset)")
        self._reset = upsert.format(offset="EXCLUDED.next_offset")
        self._select = (
            f'SELECT o.topic, o."partition", o.next_offset, o.commits FROM {table} o '
            "JOIN unnest($2::text[], $3::int[]) AS u(t, p) "
            'ON o.topic = u.t AND o."partition" = u.p WHERE o.consumer_group = $1')

    async def load(self, parts: Sequence[Partition]) -> dict[Partition, int]:
        async with self.pool.acquire() as conn:
            return {part: row[0] for part, row in (await self.rows(conn, parts)).items()}

    async def rows(self, conn: DbConnection, parts: Sequence[Partition],
                   ) -> dict[Partition, tuple[int, int]]:
        """``{partition: (next offset, commits)}`` of ``parts`` that have a row, on ``conn``."""
        if not parts:
            return {}
        rows = await conn.fetch(self._select, self.group, [t for t, _ in parts],
                                [p for _, p in parts])
        return {(row["topic"], row["partition"]): (row["next_offset"], row["commits"])
                for row in rows}

    async def save(self, offsets: Mapping[Partition, int]) -> None:
        async with self.pool.acquire() as conn:
            await self.write_in(conn, offsets)

    async def write_in(self, conn: DbConnection, offsets: Mapping[Partition, int], *,
                       reset: Collection[Partition] = ()) -> dict[Partition, int]:
        """Store ``offsets`` on ``conn`` (in its open transaction, if it has one); those of
        the partitions in ``reset`` even backwards (a row outside the log). Returns each
        row's count of commits, this one's included."""
        counts: dict[Partition, int] = {}
        for statement, parts in ((self._upsert, [p for p in offsets if p not in reset]),
                                 (self._reset, [p for p in offsets if p in reset])):
            if parts:
                for row in await conn.fetch(statement, self.group, [t for t, _ in parts],
                                            [p for _, p in parts], [offsets[p] for p in parts]):
                    counts[(row["topic"], row["partition"])] = row["commits"]
        return counts
