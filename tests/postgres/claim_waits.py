"""Waiting, in a test, until a claim waits for another transaction's claim of the same id."""

from __future__ import annotations

import asyncio

from .conftest import Conn


async def claim_waiting(observer: Conn, blocked: Conn, holder: Conn | None = None) -> None:
    """Return once ``blocked`` waits for another transaction (the guard's unique check waits
    on the holder's transaction id: ``holder``'s, if given); polls pg_locks, bounded."""
    pid = blocked.get_server_pid()
    holder_pid = holder.get_server_pid() if holder is not None else None
    for _ in range(1500):
        if await observer.fetchval(
                "SELECT count(*) FROM pg_locks AS w WHERE w.pid = $1"
                " AND w.locktype = 'transactionid' AND NOT w.granted"
                " AND ($2::int IS NULL OR EXISTS (SELECT 1 FROM pg_locks AS h"
                "      WHERE h.pid = $2 AND h.locktype = 'transactionid' AND h.granted"
                "        AND h.transactionid = w.transactionid))", pid, holder_pid):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the second claim never waited for the first")
