"""The receiver's dedup partitions kept ahead of the clock, for as long as it is open."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import asyncpg

from ..dedup.partitions import maintain
from ..dedup.policy import DedupPolicy
from ..shared.aio import wait_set
from ..shared.failures import describe

log = logging.getLogger("consumerkit.webhook")


async def maintain_forever(pool: asyncpg.Pool, schema: str, dedup: DedupPolicy,
                           namespace: str, interval: timedelta, wanted: asyncio.Event) -> None:
    """Create dedup partitions ahead and drop expired ones every ``interval``, or at once
    when ``wanted`` is set (a claim found no partition for the current time)."""
    while True:
        await wait_set(wanted, interval.total_seconds())
        wanted.clear()
        try:
            async with pool.acquire() as conn:
                await maintain(conn, schema, dedup, namespace=namespace)
        except Exception as exc:
            log.warning("dedup partition maintenance failed, retrying next interval: %s",
                        describe(exc))
