"""The benchmarks' server counters read on every supported PostgreSQL (18 moved the WAL sync
count from ``pg_stat_wal`` to ``pg_stat_io``)."""

from __future__ import annotations

from benchmarks.pgstats import per_message, snapshot

from .conftest import Conn


async def test_counters_move_with_committed_writes(conn: Conn, schema: str) -> None:
    await conn.execute(f'CREATE SCHEMA "{schema}"')
    await conn.execute(f'CREATE TABLE "{schema}".t (n int)')
    before = await snapshot(conn, statements=False)
    for n in range(5):  # each commit flushes WAL (synchronous_commit is on)
        await conn.execute(f'INSERT INTO "{schema}".t VALUES ($1)', n)
    # statistics are flushed by backends lazily: this session's own counters once it is idle
    await conn.execute("SELECT pg_stat_force_next_flush()")
    after = await snapshot(conn, statements=False)
    assert after.commits - before.commits >= 5
    assert after.wal_syncs is not None
    assert before.wal_syncs is not None
    assert after.wal_syncs > before.wal_syncs
    assert after.wal_bytes is not None
    assert before.wal_bytes is not None
    assert after.wal_bytes > before.wal_bytes
    figures = per_message(before, after, 5)
    assert figures["wal_syncs_per_msg"] is not None
    assert figures["wal_syncs_per_msg"] > 0
