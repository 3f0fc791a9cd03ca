"""The relay's SQL: claim pending rows of owned slots, delete acknowledged rows, record
failures in the side table. The outbox table itself only ever sees the DELETE."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import orjson

from ..dedup.layout import existing_layout
from ..errors import StartupError
from ..shared import faults
from ..types import DbConnection
from .event import OutboxEvent
from .leases import LeaseOwner
from .table import OutboxTable


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed publication to record: the error, when to try again, and whether the row is
    now FAILED (blocking its aggregate until retried or skipped)."""

    event: OutboxEvent
    error: str
    delay: float
    failed: bool


class RelayStore:
    """Statements of one outbox, built once."""

    def __init__(self, table: OutboxTable, leases: LeaseOwner | None = None) -> None:
        """``leases``: the slot leases of a relay behind a transaction pooler, which the
        claim checks in its own statement."""
        t = table
        self._leases = leases
        lease_condition = None if leases is None else leases.claim_condition("o", "$3", "$4")
        self.table = t
        self._cursor = 0  # read by the relay_cursor mutant only
        # Pending = rows present, in seq order; no cursor. A row is held back while it, or an
        # earlier row of its aggregate still present, is FAILED or waiting for its next
        # attempt: a relay that lost its slot mid-batch may record a failure of a row that
        # another relay has published and deleted since, and that must block nothing.
        self._claim = f"""
            SELECT o.seq, o.id, o.type, o.aggregatetype, o.aggregateid, o.payload::text,
                   o.occurred_at, o.headers::text, coalesce(f.attempts, 0)
            FROM {t.events} o LEFT JOIN {t.failures} f ON f.seq = o.seq
            WHERE o.slot = ANY($1::smallint[])
              AND NOT EXISTS (
                SELECT 1 FROM {t.failures} b
                WHERE b.aggregatetype = o.aggregatetype AND b.aggregateid = o.aggregateid
                  AND b.seq <= o.seq AND (b.failed OR b.next_attempt_at > now())
                  AND EXISTS (SELECT 1 FROM {t.events} e WHERE e.seq = b.seq))
              {f"AND {lease_condition}" if lease_condition else ""}
            ORDER BY o.seq
            LIMIT $2"""
        self._delete = f"""
            WITH cleared AS (DELETE FROM {t.failures} WHERE seq = ANY($1::bigint[]))
            DELETE FROM {t.events} WHERE seq = ANY($1::bigint[])"""
        self._fail = f"""
            INSERT INTO {t.failures} AS f (seq, event_id, event_type, aggregatetype,
                aggregateid, attempts, last_error, next_attempt_at, failed)
            SELECT s, i, ty, at, ai, a, e, now() + d * interval '1 second', fl
            FROM unnest($1::bigint[], $2::uuid[], $3::text[], $4::text[], $5::text[],
                        $6::int[], $7::text[], $8::float8[], $9::bool[])
                 AS u(s, i, ty, at, ai, a, e, d, fl)
            WHERE EXISTS (SELECT 1 FROM {t.events} o WHERE o.seq = u.s)
            ON CONFLICT (seq) DO UPDATE SET attempts = excluded.attempts,
                last_error = excluded.last_error, next_attempt_at = excluded.next_attempt_at,
                failed = excluded.failed, updated_at = now()"""
        self._backlog = f"""
            SELECT (SELECT count(*) FROM {t.events}),
                   (SELECT extract(epoch FROM now() - min(occurred_at))::float8
                    FROM {t.events}),
                   (SELECT count(*) FROM {t.failures} WHERE failed)"""
        self._next_retry = f"""
            SELECT extract(epoch FROM min(next_attempt_at) - now())::float8
            FROM {t.failures} WHERE NOT failed"""

    async def check(self, conn: DbConnection) -> None:
        """Raise :class:`StartupError` unless a relay can publish this outbox: it must keep
        the plain layout (slots and deletes by key), and have its lease table when leases
        are used."""
        t = self.table
        if await existing_layout(conn, t.schema, t.table) == "partitioned":
            raise StartupError(
                f"outbox {t.schema}.{t.table} keeps its events in time partitions for change "
                "data capture (OutboxRetention): the relay cannot publish it; read it "
                "with Debezium, or relay another outbox table")
        if self._leases is not None and await conn.fetchval(
                "SELECT to_regclass($1)", t.leases) is None:
            raise StartupError(
                f"outbox {t.schema}.{t.table} has no slot lease table, which a relay behind a "
                "transaction pooler needs: run `consumerkit migrate` (with the same "
                "--schema and --outbox-table) to upgrade it")

    async def backlog(self, conn: DbConnection) -> tuple[int, float, int]:
        """Rows waiting, the age in seconds of the oldest (by its write time), and rows
        given up on (FAILED)."""
        row = await conn.fetchrow(self._backlog)
        assert row is not None
        return int(row[0]), float(row[1] or 0.0), int(row[2])

    async def claim(self, conn: DbConnection, slots: Collection[int],
                    limit: int) -> list[OutboxEvent]:
        """Pending rows of ``slots``; with leases, only of the slots they cover for half
        their time to live at least (the rest is the batch's time to be sent)."""
        leases = self._leases
        lease = () if leases is None else (leases.holder, leases.ttl / 2)
        rows = await conn.fetch(self._claim, sorted(slots), limit, *lease)
        if faults.inject("relay_cursor"):  # broken on purpose: see faults
            rows = [r for r in rows if r[0] > self._cursor]
            self._cursor = max([self._cursor, *(r[0] for r in rows)])
        # by position, in the SELECT's column order: the relay's hottest Python loop
        return [OutboxEvent(seq, event_id, event_type, aggregate_type, aggregate_id,
                            payload.encode(), occurred_at, orjson.loads(headers), attempts)
                for (seq, event_id, event_type, aggregate_type, aggregate_id, payload,
                     occurred_at, headers, attempts) in rows]

    async def delete(self, conn: DbConnection, seqs: Sequence[int]) -> None:
        """Delete acknowledged rows (and their failure state) in one statement."""
        if seqs:
            await conn.execute(self._delete, list(seqs))

    async def record_failures(self, conn: DbConnection, failures: Sequence[Failure]) -> None:
        if not failures:
            return
        await conn.execute(
            self._fail, [f.event.seq for f in failures], [f.event.event_id for f in failures],
            [f.event.event_type for f in failures], [f.event.aggregate_type for f in failures],
            [f.event.aggregate_id for f in failures],
            [f.event.attempts + 1 for f in failures], [f.error[:2000] for f in failures],
            [f.delay for f in failures], [f.failed for f in failures])

    async def next_retry_in(self, conn: DbConnection) -> float | None:
        """Seconds until the earliest back-off ends (``None``: nothing is waiting)."""
        value: float | None = await conn.fetchval(self._next_retry)
        return value
