"""Opening and closing what a consumer uses: pools, connections, tasks, bounded stops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg

from ..errors import StartupError
from ..shared import pooler as pools
from ..shared.dsn import parse_dsn, redact_dsn
from ..shared.pooler import Pooler

log = logging.getLogger("consumerkit.consumer")


async def open_pool(dsn: str, name: str, size: int, *, warm: int = 0,
                    on_change: Callable[[], None] | None = None,
                    pooler: Pooler = "none") -> asyncpg.Pool:
    """A pool of up to ``size`` connections, ``warm`` of them opened now: the first
    transactions after a start then wait for no connection, and a server short of
    connections says so at start-up. Connections idle for five minutes close again, down to
    one. ``on_change`` is called whenever a connection opens or closes (the pool reconnects
    silently: a connection to another server looks like any other). ``pooler``: what stands
    in front of PostgreSQL (:mod:`consumerkit.shared.pooler`)."""
    init = None
    if on_change is not None:
        told = on_change

        async def init(conn: asyncpg.Connection[asyncpg.Record]) -> None:
            told()
            conn.add_termination_listener(lambda _conn: told())

    parse_dsn(dsn)  # asyncpg's own words about a malformed DSN may quote its password
    pool: asyncpg.Pool | None = None
    try:
        pool = await pools.create_pool(dsn, pooler=pooler, max_size=size, init=init,
                                       application_name=f"consumerkit:{name}")
        if warm > 1:
            held = await asyncio.gather(*(pool.acquire() for _ in range(min(warm, size))),
                                        return_exceptions=True)
            for conn in held:
                if not isinstance(conn, BaseException):
                    await pool.release(conn)
            for failure in held:
                if isinstance(failure, BaseException):
                    raise failure
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        if pool is not None:
            pool.terminate()
        raise StartupError(
            f"cannot connect to PostgreSQL at {redact_dsn(dsn)}: {type(exc).__name__}: {exc}"
        ) from None
    return pool


@contextlib.asynccontextmanager
async def connect(dsn: str, pooler: Pooler = "none",
                  ) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
    parse_dsn(dsn)  # likewise
    try:
        conn = await pools.connect(dsn, pooler=pooler)
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
