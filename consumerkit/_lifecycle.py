"""Opening and closing what a consumer uses: pools, connections, tasks, bounded stops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg

from ._identifiers import redact_dsn
from .errors import StartupError

log = logging.getLogger("consumerkit.consumer")


async def open_pool(dsn: str, name: str, size: int) -> asyncpg.Pool:
    try:
        pool = await asyncpg.create_pool(
            dsn, min_size=1, max_size=size, timeout=15,
            server_settings={"application_name": f"consumerkit:{name}"[:63]})
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise StartupError(
            f"cannot connect to PostgreSQL at {redact_dsn(dsn)}: {type(exc).__name__}: {exc}"
        ) from None
    assert pool is not None
    return pool


@contextlib.asynccontextmanager
async def connect(dsn: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    try:
        conn = await asyncpg.connect(dsn, timeout=15)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise StartupError(
            f"cannot connect to PostgreSQL at {redact_dsn(dsn)}: {type(exc).__name__}: {exc}"
        ) from None
    try:
        yield conn
    finally:
        await conn.close()


async def bounded(stop: Callable[[], Awaitable[None]], timeout: float) -> None:
    """Close something that may wait on an unreachable broker, but not forever."""
    try:
        await asyncio.wait_for(stop(), timeout)
    except TimeoutError:
        log.warning("gave up closing the Kafka consumer after %.0fs", timeout)


async def cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
