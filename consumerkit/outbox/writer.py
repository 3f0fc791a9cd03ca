"""Writing events to the outbox inside the caller's transaction.

Per-aggregate order is commit order: before inserting, the writer takes a transaction-scoped
advisory lock per aggregate (keys sorted, so two writers cannot deadlock on them). A second
transaction writing the same aggregate waits for the first to commit or roll back before it
draws its ``seq``, so within an aggregate ``seq`` order is commit order and the committed rows
of an aggregate are always a prefix of its eventual sequence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import orjson
from pydantic import BaseModel

from ..errors import ConfigurationError, NotInTransactionError
from ..observability.tracing import inject
from ..types import DbConnection
from ..versions import check_version, model_version
from ._uuid7 import uuid7
from .cdc import SlotGuard
from .retention import OutboxRetention
from .table import OutboxTable

DEFAULT_SCHEMA = "consumerkit"  # an outbox on its own, in no consumer's schema
RESERVED_HEADERS = frozenset({"id", "event_type", "occurred_at", "aggregate_type"})


@dataclass(frozen=True, slots=True)
class NewEvent:
    """One event to add. ``dedup_key``, if given, is an idempotency key: a second event with
    the same key is not added (keys are kept until ``cleanup`` removes them)."""

    event_type: str
    aggregate_type: str
    aggregate_id: str
    payload: BaseModel | Mapping[str, Any]
    headers: Mapping[str, str] = field(default_factory=dict)
    occurred_at: datetime | None = None
    dedup_key: str | None = None
    event_id: UUID | None = None
    version: int | None = None  # default: the payload model's __event_version__, if any


class Outbox:
    """The writer: ``await outbox.add(conn, ...)`` inside the caller's transaction.

    ``notify`` sends one ``pg_notify`` per statement (PostgreSQL folds identical
    notifications of one transaction into one, delivered at commit). ``delete_after_insert``
    deletes each row in the same transaction right after inserting it: for Debezium, which
    reads the insert from the WAL, with no built-in relay: such an outbox refuses an event
    (:class:`~consumerkit.errors.NoReplicationSlotError`) while no logical replication slot
    reads it, since nothing would ever see the event (checked on the caller's connection,
    then trusted for :data:`~consumerkit.outbox.cdc.SLOT_CHECK_TTL` seconds, not per event;
    ``require_slot=False`` turns the check off); ``retention`` keeps the rows for
    Debezium that long instead, in time partitions dropped whole (``consumerkit.migrate`` and
    ``maintain_outbox`` with ``outbox.table``; a consumer publishing through it maintains
    them). An event's schema version (the
    ``version`` given, else its payload model's ``__event_version__``) is written as the
    ``version_header`` header; an event with neither goes without it (version 1).

    ``schema`` unset: the outbox of a consumer lives in the consumer's schema
    (``Postgres(schema=...)``, ``--postgres-schema``,
    ``TestConsumer.like(..., postgres=Postgres(schema=...))``), and an
    outbox used on its own in ``consumerkit``. Name a schema to keep the outbox there whatever
    the consumer's.
    """

    def __init__(self, schema: str | None = None, table: str = "outbox", *,
                 notify: bool = True, delete_after_insert: bool = False,
                 version_header: str = "event_version",
                 retention: OutboxRetention | None = None, require_slot: bool = True) -> None:
        if delete_after_insert and retention is not None:
            raise ConfigurationError("an outbox either deletes each row as it inserts it "
                                     "(delete_after_insert) or keeps rows for a retention")
        self.schema_given = schema is not None  # else it follows its consumer's
        self.table = OutboxTable(schema or DEFAULT_SCHEMA, table, retention)
        self.version_header = version_header
        self.notify = notify
        self.delete_after_insert = delete_after_insert
        self.require_slot = require_slot
        self._slot = SlotGuard(self.table) if delete_after_insert and require_slot else None
        self._sql = _insert_sql(self.table, notify)
        self._placed: dict[str, Outbox] = {}  # this outbox in other schemas, made once each

    def placed_in(self, schema: str) -> Outbox:
        """This outbox as a consumer of ``schema`` uses it: itself when it names its schema
        (or is in ``schema`` already), else the same outbox in ``schema``."""
        if self.schema_given or schema == self.table.schema:
            return self
        placed = self._placed.get(schema)
        if placed is None:
            table = self.table
            placed = Outbox(schema, table.table, notify=self.notify,
                            delete_after_insert=self.delete_after_insert,
                            version_header=self.version_header, retention=table.retention,
                            require_slot=self.require_slot)
            self._placed[schema] = placed
        return placed

    async def add(
        self, conn: DbConnection, *, event_type: str, aggregate_type: str, aggregate_id: str,
        payload: BaseModel | Mapping[str, Any], headers: Mapping[str, str] | None = None,
        occurred_at: datetime | None = None, dedup_key: str | None = None,
        event_id: UUID | None = None, version: int | None = None,
    ) -> UUID | None:
        """Add one event; returns its id, or ``None`` if ``dedup_key`` was already used."""
        added = await self.add_many(conn, [NewEvent(
            event_type, aggregate_type, aggregate_id, payload, headers or {}, occurred_at,
            dedup_key, event_id, version)])
        return added[0] if added else None

    async def add_many(self, conn: DbConnection, events: Sequence[NewEvent]) -> list[UUID]:
        """Add ``events`` in one statement, in this order; returns the ids added (events whose
        ``dedup_key`` was already used are left out)."""
        if not conn.is_in_transaction():
            raise NotInTransactionError(
                "outbox writes must run inside the caller's transaction "
                "(async with conn.transaction(): ...), so that the events commit or roll back "
                "with the business writes")
        if not events:
            return []
        if self._slot is not None:
            await self._slot.check(conn)
        now = datetime.now(UTC)
        columns: list[list[Any]] = [[] for _ in range(8)]
        locks: set[int] = set()
        for e in events:
            row = _row(e, now, self.version_header)
            for column, value in zip(columns, row, strict=True):
                column.append(value)
            locks.add(self.table.aggregate_lock(e.aggregate_type, str(e.aggregate_id)))
        rows = await conn.fetch(self._sql, sorted(locks), *columns)
        ids = [r["id"] for r in rows]
        if self.delete_after_insert and ids:
            await conn.execute(f"DELETE FROM {self.table.events} WHERE id = ANY($1::uuid[])",
                               ids)
        return ids


def _row(e: NewEvent, now: datetime, version_header: str) -> tuple[Any, ...]:
    for name, value in (("event_type", e.event_type), ("aggregate_type", e.aggregate_type)):
        if not isinstance(value, str) or not value:
            raise ConfigurationError(f"outbox event: {name} must be a non-empty string")
    aggregate_id = str(e.aggregate_id)
    if not aggregate_id:
        raise ConfigurationError("outbox event: aggregate_id must not be empty")
    reserved = RESERVED_HEADERS & set(e.headers)
    if reserved:
        raise ConfigurationError(
            f"outbox event: headers {sorted(reserved)} are set by the relay, not by writers")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in e.headers.items()):
        raise ConfigurationError("outbox event: header names and values must be strings")
    at = e.occurred_at or now
    if at.tzinfo is None:
        raise ConfigurationError("outbox event: occurred_at needs a time zone")
    headers = inject(e.headers)  # the writer's trace goes on with the event
    version = _version(e)
    if version_header in e.headers:
        raise ConfigurationError(f"outbox event: the {version_header!r} header is written "
                                 "from version= or the payload model's __event_version__")
    if version is not None:
        headers = {**headers, version_header: str(version)}
    if isinstance(e.payload, BaseModel):
        payload = e.payload.model_dump_json()
    else:
        payload = orjson.dumps(e.payload).decode()
    return (e.dedup_key, e.event_id or uuid7(), e.aggregate_type, aggregate_id, e.event_type,
            payload, at, orjson.dumps(dict(headers)).decode())


def _version(e: NewEvent) -> int | None:
    if e.version is not None:
        return check_version(e.version, "outbox event: version")
    return model_version(type(e.payload)) if isinstance(e.payload, BaseModel) else None


def _insert_sql(t: OutboxTable, notify: bool) -> str:
    """One statement: the aggregate locks (sorted keys, before any ``seq`` is drawn), the
    idempotency keys, the rows in the given order, and the notification."""
    tail = (f", pg_notify('{t.channel}', '') FROM ins" if notify else " FROM ins")
    return f"""
    WITH locks AS MATERIALIZED (
        SELECT count(*) AS n FROM (
            SELECT pg_advisory_xact_lock(k) FROM unnest($1::bigint[]) WITH ORDINALITY AS l(k, o)
            ORDER BY o) taken
    ), new_keys AS (
        INSERT INTO {t.keys} (dedup_key, id)
        SELECT u.d, u.i FROM unnest($2::text[], $3::uuid[]) AS u(d, i), locks
        WHERE u.d IS NOT NULL
        ON CONFLICT (dedup_key) DO NOTHING
        RETURNING id
    ), ins AS (
        INSERT INTO {t.events} (id, aggregatetype, aggregateid, type, payload, occurred_at,
                                headers)
        SELECT u.i, u.at, u.ai, u.ty, u.p::jsonb, u.oc, u.h::jsonb
        FROM unnest($2::text[], $3::uuid[], $4::text[], $5::text[], $6::text[], $7::text[],
                    $8::timestamptz[], $9::text[])
             WITH ORDINALITY AS u(d, i, at, ai, ty, p, oc, h, n)
        CROSS JOIN locks
        WHERE u.d IS NULL OR u.i IN (SELECT id FROM new_keys)
        ORDER BY u.n
        RETURNING id, seq
    )
    SELECT id{tail} ORDER BY seq"""
