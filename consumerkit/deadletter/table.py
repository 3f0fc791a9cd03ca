"""Dead letters as rows of ``{schema}.dead_letters``, next to the effects they failed to make.

A row keeps the record's exact bytes (key, value and headers), its position and why it failed,
so it can be inspected with SQL and replayed after a fix. Headers are stored as a JSON array of
``[name, base64(value)]`` pairs: order and repeated names survive (Kafka allows both), and any
byte value fits in JSON. Base64 rather than hex because it is a third smaller. A null header
value (legal in Kafka) is stored as JSON ``null`` and read back as ``None``.

PostgreSQL ``text`` and ``jsonb`` cannot hold the NUL character, and asyncpg cannot encode a
lone surrogate as UTF-8; either would make the insert fail on every retry. Both can reach a
dead letter (an event id with control characters is exactly what ``invalid_event_id``
reports), so text columns and header names are escaped instead: NUL becomes the four
characters ``\\x00`` and a surrogate its ``\\udcXX`` escape. Only the text is escaped; key,
value and header values are ``bytea``/base64 and stay exact.

``send`` is idempotent per (consumer, topic, partition, offset): a consumer that crashes after
writing a dead letter but before committing the offset writes it again on redelivery, and the
unique constraint absorbs the repeat (the first row wins).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence

import asyncpg

from ..errors import ConsumerKitError
from ..shared.identifiers import identifier, qualified
from ..types import DbConnection, SinkResources
from .entry import DeadLetterEntry, shown_detail

TABLE = "dead_letters"

_COLUMNS = (
    'consumer, topic, "partition", "offset", key, value, headers, reason, detail, attempts, '
    "event_id, event_type, failed_at"
)


def dead_letter_ddl(schema: str) -> list[str]:
    """Statements creating the dead-letter table (run by :func:`consumerkit.migrate`)."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {qualified(schema, TABLE)} (
            id bigserial PRIMARY KEY,
            consumer text NOT NULL,
            topic text NOT NULL,
            "partition" integer NOT NULL,
            "offset" bigint NOT NULL,
            key bytea,
            value bytea,
            headers jsonb NOT NULL DEFAULT '[]',
            reason text NOT NULL,
            detail text NOT NULL,
            attempts integer NOT NULL DEFAULT 0,
            event_id text,
            event_type text,
            failed_at timestamptz NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            UNIQUE (consumer, topic, "partition", "offset")
        )""",
    ]


def pg_text(text: str) -> str:
    """``text`` as PostgreSQL can store it: NUL and lone surrogates escaped (see above)."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _pg_optional(text: str | None) -> str | None:
    return None if text is None else pg_text(text)


def encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> str:
    """Headers as the JSON text stored in the ``headers`` column (a null value stays null)."""
    return json.dumps([
        [pg_text(name), None if value is None else base64.b64encode(value).decode("ascii")]
        for name, value in headers
    ])


def decode_headers(text: str) -> list[tuple[str, bytes | None]]:
    """The inverse of :func:`encode_headers` (header names are returned as stored)."""
    return [
        (name, None if value is None else base64.b64decode(value))
        for name, value in json.loads(text)
    ]


class DeadLetterTable:
    """:class:`~consumerkit.types.DeadLetterSink` writing to ``{schema}.dead_letters``.

    The consumer's pool is borrowed, never closed here. Each entry is written in its own short
    transaction, outside the failed handler's (which has rolled back).
    """

    def __init__(self) -> None:
        self._pool: asyncpg.Pool[asyncpg.Record] | None = None
        self._insert_sql = ""

    async def open(self, resources: SinkResources) -> None:
        self._pool = resources.pool
        self._insert_sql = (
            f"INSERT INTO {qualified(resources.schema, TABLE)} ({_COLUMNS}) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8, $9, $10, $11, $12, $13) "
            'ON CONFLICT (consumer, topic, "partition", "offset") DO NOTHING')

    async def send(self, entry: DeadLetterEntry) -> None:
        if self._pool is None:
            raise ConsumerKitError("DeadLetterTable is not open: call open() first")
        await self._pool.execute(
            self._insert_sql, entry.consumer, entry.topic, entry.partition, entry.offset,
            entry.key, entry.value, encode_headers(entry.headers), pg_text(entry.reason),
            pg_text(shown_detail(entry.detail)), entry.attempts, _pg_optional(entry.event_id),
            _pg_optional(entry.event_type), entry.failed_at)

    async def close(self) -> None:
        self._pool = None


async def list_dead_letters(
    conn: DbConnection, schema: str, consumer: str | None = None, limit: int = 100,
) -> list[DeadLetterEntry]:
    """The oldest ``limit`` dead letters (of ``consumer`` if given), in the order written."""
    identifier(schema, "schema name")
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM {qualified(schema, TABLE)} "
        "WHERE $1::text IS NULL OR consumer = $1 ORDER BY id LIMIT $2",
        consumer, limit)
    return [
        DeadLetterEntry(
            consumer=row["consumer"], topic=row["topic"], partition=row["partition"],
            offset=row["offset"], key=row["key"], value=row["value"],
            headers=decode_headers(row["headers"]), reason=row["reason"],
            detail=row["detail"], attempts=row["attempts"], event_id=row["event_id"],
            event_type=row["event_type"], failed_at=row["failed_at"],
        )
        for row in rows
    ]
