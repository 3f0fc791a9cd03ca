"""Reading dead letters from the table, and sending one back to its topic after a fix."""

from __future__ import annotations

from typing import Any

import asyncpg

from consumerkit import DeadLetterEntry
from consumerkit.deadletter import list_dead_letters


async def show_dead_letters(postgres: str, consumer: str,
                            schema: str = "consumerkit") -> list[DeadLetterEntry]:
    conn = await asyncpg.connect(postgres)
    try:
        entries = await list_dead_letters(conn, schema, consumer, limit=100)
    finally:
        await conn.close()
    for e in entries:
        print(f"{e.topic}/{e.partition}/{e.offset} {e.event_id} {e.reason}: {e.detail}")
    return entries


async def republish(producer: Any, entry: DeadLetterEntry) -> None:
    """Send ``entry`` back to its source topic with its key, value and headers unchanged
    (so with the same event id). A dead-lettered event has no dedup row: once the handler
    is fixed, the republished record is applied once. It lands at the end of the partition,
    after any later events of the same key."""
    await producer.send_and_wait(
        entry.topic, key=entry.key, value=entry.value, headers=list(entry.headers))
