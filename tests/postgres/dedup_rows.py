"""Reading and writing dedup rows in tests, whatever their packing: through the ``{table}_ids``
view (one row per id) and rows written the way the claim function writes them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg


async def stored(conn: asyncpg.Connection[asyncpg.Record], schema: str, event_id: str,
                 table: str = "processed_events") -> list[asyncpg.Record]:
    """The stored ids equal to ``event_id`` (namespace, event_id, seen_at, handler, details)."""
    return await conn.fetch(
        f'SELECT * FROM "{schema}".{table}_ids WHERE event_id = $1', event_id)


async def count_ids(conn: asyncpg.Connection[asyncpg.Record], schema: str,
                    table: str = "processed_events", namespace: str | None = None) -> int:
    return int(await conn.fetchval(
        f'SELECT count(*) FROM "{schema}".{table}_ids WHERE $1::text IS NULL OR namespace = $1',
        namespace))


async def store_ids(conn: asyncpg.Connection[asyncpg.Record], schema: str, namespace: str,
                    event_ids: Sequence[str], seen_at: datetime, *, handler: str = "charge",
                    table: str = "processed_events") -> None:
    """One row holding ``event_ids`` as text (as for ids that are not canonical UUIDs)."""
    key = f'"{schema}".consumerkit_name_key'
    await conn.execute(
        f'INSERT INTO "{schema}".{table} (seen_at, namespace_key, handler_key, texts)'
        f" VALUES ($1, {key}($2), {key}($3), $4)", seen_at, namespace, handler, list(event_ids))


def details(row: asyncpg.Record) -> dict[str, Any]:
    """The diagnostics of one id (``DedupPolicy(diagnostics=True)``)."""
    found: dict[str, Any] = json.loads(row["details"])
    return found
