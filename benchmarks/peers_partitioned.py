"""The set-based loop on dedup tables partitioned by time, as consumerkit's must be for
retention to drop whole partitions: by the day an id was seen (the guarantee consumerkit
keeps), and by the day of the event's own time (a unique key, a weaker guarantee). Reference
points that split the batch handler's gap to the loop on a plain table (target 6)."""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any, ClassVar

import asyncpg

from .effects import q
from .peers import SetBasedPeer


class _DayPartitionedLoop(SetBasedPeer):
    """The set-based loop on a dedup table of one partition per day, from yesterday to three
    days ahead; subclasses say what the table holds and how it is claimed."""

    dedup_table: ClassVar[str]
    columns: ClassVar[str]  # the table's columns and keys
    key: ClassVar[str]  # the partition key
    indexes: ClassVar[tuple[str, ...]] = ()  # columns of the table's plain indexes
    yesterday: ClassVar[str]  # a value of the key in yesterday's partition, for prefill
    days = range(-1, 4)

    @staticmethod
    def bound(day: int) -> str:
        """The partition key's value at the start of ``day`` days from today, in SQL."""
        raise NotImplementedError

    async def prepare(self, conn: asyncpg.Connection[asyncpg.Record]) -> None:
        table = f"{q(self.env.schema)}.{self.dedup_table}"
        await conn.execute(f"CREATE TABLE {table} ({self.columns}) PARTITION BY RANGE "
                           f"({self.key})")
        for columns in self.indexes:
            await conn.execute(f"CREATE INDEX ON {table} ({columns})")
        for day in self.days:
            await conn.execute(
                f"CREATE TABLE {table}_{day + 1} PARTITION OF {table} FOR VALUES FROM "
                f"({self.bound(day)}) TO ({self.bound(day + 1)})")

    async def prefill(self, conn: asyncpg.Connection[asyncpg.Record], rows: int) -> None:
        table = f"{q(self.env.schema)}.{self.dedup_table}"
        await conn.execute(
            f"INSERT INTO {table} ({self.key}, event_id) SELECT {self.yesterday}, 'old-' || g "
            "FROM generate_series(1, $1) AS g", rows)
        await conn.execute(f"ANALYZE {table}")


class SetBasedPartitionedPeer(_DayPartitionedLoop):
    """The set-based loop on the textbook's table partitioned by day, as the dedup table must
    be for retention to drop whole partitions: a partitioned table cannot have a unique index
    on the id alone, so the claim takes a lock per id (in sorted order) and then inserts the
    ids no partition holds. Two statements: the second must start after the locks, so that
    its snapshot sees every claim that held one of them before. The same exactly-once rule
    as consumerkit's claim at the least cost this suite knows, one row per id; a reference
    point for that claim, not a replacement for it: no lock timeout (a stalled holder would
    block it for good), no expiry, no handler names, and two round trips where it has one."""

    name = "set-based-partitioned"
    description = ("the set-based loop on a dedup table partitioned by day: sorted advisory "
                   "locks on the batch's ids, then one INSERT ... WHERE NOT EXISTS RETURNING")
    dedup_table = "processed_by_day"
    columns = "seen_at timestamptz NOT NULL DEFAULT now(), event_id text NOT NULL"
    key = "seen_at"
    indexes = ("event_id",)
    yesterday = "date_trunc('day', now()) - interval '12 hours'"

    @staticmethod
    def bound(day: int) -> str:
        return f"date_trunc('day', now()) + interval '{day} day'"

    async def open(self) -> None:
        await super().open()
        s = q(self.env.schema)
        self.lock_many = (
            "SELECT count(pg_advisory_xact_lock(h)) FROM unnest(ARRAY("
            "SELECT DISTINCT hashtextextended(e, 0) FROM unnest($1::text[]) AS e ORDER BY 1)) AS h")
        self.dedup_many = (
            f"WITH ids AS (SELECT DISTINCT e FROM unnest($1::text[]) AS e) "
            f"INSERT INTO {s}.processed_by_day (event_id) SELECT e FROM ids WHERE NOT EXISTS "
            f"(SELECT 1 FROM {s}.processed_by_day AS p WHERE p.event_id = ids.e "
            # as consumerkit's claim bounds it: the partitions made ahead are not probed
            "AND p.seen_at <= now() + interval '1 day') "
            "RETURNING event_id")

    async def claim_many(self, event_ids: list[str], records: list[Any]) -> set[str]:
        await self.conn.fetchval(self.lock_many, event_ids)
        return await super().claim_many(event_ids, records)


class SetBasedEventDayPeer(_DayPartitionedLoop):
    """The set-based loop on a dedup table partitioned by the day of the event's time (here
    the record's timestamp), not the day the id was seen. Such a table can have a unique key,
    ``(event_id, event_day)``, since the key holds the partition key, so the claim is the
    plain table's ``INSERT ... ON CONFLICT DO NOTHING`` again: no lock per id, one partition
    probed per id. What it gives up is the guarantee: an id that comes back with a time of
    another day (the event published again as a new record, by a producer or a relay that
    stamps a new time) is a new row and a second effect, and a record without a time has no
    partition to go to. consumerkit's claim finds an id whatever time it comes with; this
    peer measures what that costs, not a design consumerkit uses."""

    name = "set-based-event-day"
    description = ("the set-based loop on a dedup table partitioned by the day of the "
                   "record's timestamp, unique on (event_id, event_day): one INSERT ... ON "
                   "CONFLICT DO NOTHING RETURNING, no locks")
    dedup_table = "processed_by_event_day"
    columns = ("event_day date NOT NULL, event_id text NOT NULL, "
               "PRIMARY KEY (event_id, event_day)")
    key = "event_day"
    yesterday = "current_date - 1"

    @staticmethod
    def bound(day: int) -> str:
        return f"current_date + {day}"

    async def open(self) -> None:
        await super().open()
        self.dedup_many = (
            f"INSERT INTO {q(self.env.schema)}.processed_by_event_day (event_id, event_day) "
            "SELECT * FROM unnest($1::text[], $2::date[]) ON CONFLICT DO NOTHING "
            "RETURNING event_id")

    async def claim_many(self, event_ids: list[str], records: list[Any]) -> set[str]:
        days = [_day(r.timestamp) for r in records]
        return {r["event_id"] for r in await self.conn.fetch(self.dedup_many, event_ids, days)}


def _day(timestamp_ms: int) -> date:
    return datetime.fromtimestamp(timestamp_ms / 1000, UTC).date()
