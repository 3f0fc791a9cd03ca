"""Retention in both layouts, at the size of a day: one partition dropped vs 200,000 rows
deleted in batches. Both paths must remove every expired row; the drop must win clearly
(docs/dedup.md records the measured figures)."""

from __future__ import annotations

import asyncpg

from consumerkit.dedup.cost import measure_cleanup

ROWS = 200_000


async def test_dropping_a_day_beats_deleting_it(postgres_dsn: str, pg_schema: str) -> None:
    conn = await asyncpg.connect(postgres_dsn)
    try:
        cost = await measure_cleanup(conn, pg_schema, ROWS)
        left = await conn.fetchval(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = $1 AND c.relname LIKE 'cost\\_%'", pg_schema)
    finally:
        await conn.close()
    assert len(cost.dropped) == 1  # exactly the filled day
    assert cost.deleted == ROWS
    assert left == 0  # the measurement cleans up after itself
    # a wide margin: both times move with the machine's load, their ratio much less
    assert cost.ratio > 3, cost
