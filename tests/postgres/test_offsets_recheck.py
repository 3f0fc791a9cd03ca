"""The background check of stored offsets (:meth:`Recheck.run`) at a consumer's stop."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest

from consumerkit.offsets.postgres import PostgresOffsets
from consumerkit.offsets.recheck import Recheck
from consumerkit.stats import ConsumerStats, StatsObserver


async def test_a_pool_closed_under_it_at_the_stop_ends_the_check_silently(
    server_dsn: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """Woken while the consumer stops (every connection the stop closes wakes it), the
    check fails: that is no database outage, and no warning says it is (each transaction
    still draining checks for itself before it applies anything)."""
    caplog.set_level(logging.DEBUG, "consumerkit.consumer")
    pool = await asyncpg.create_pool(server_dsn, min_size=1, max_size=1)
    recheck = Recheck(PostgresOffsets(pool, "consumerkit", "stopping"),
                      StatsObserver(ConsumerStats()), skip_expired=False)
    stopping = asyncio.Event()
    running = asyncio.create_task(recheck.run(pool, stopping))
    try:
        async with asyncio.timeout(30):
            while recheck.pending:  # the first check, owed from the start, is done
                await asyncio.sleep(0.01)
        stopping.set()
        await pool.close()
        recheck.lost()
        await asyncio.wait_for(running, 30)
    finally:
        running.cancel()
    assert [r.getMessage() for r in caplog.records if "stored offsets" in r.getMessage()] == []
