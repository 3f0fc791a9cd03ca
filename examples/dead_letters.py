"""Reading dead letters from the table, and replaying them through the consumer after a fix."""

from __future__ import annotations

import asyncpg

from consumerkit import (
    Consumer,
    DeadLetterEntry,
    DeadLetterFilter,
    DeadLetterReplayReport,
    replay_dead_letters,
)
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


async def replay_after_fix(consumer: Consumer, topic: str, note: str,
                           ) -> DeadLetterReplayReport:
    """Apply the waiting dead letters of ``topic`` through ``consumer``'s own handlers, dedup
    claim and outbox, each key's in their original order, once however often this runs;
    each entry is marked replayed (when, by which database role, ``note``), not deleted."""
    report = await replay_dead_letters(consumer, DeadLetterFilter(topic=topic), note=note)
    for failure in report.failures:  # failed again: left waiting, with the new error
        print(f"failed again: {failure}")
    return report
