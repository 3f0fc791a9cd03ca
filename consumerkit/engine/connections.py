"""Where the pipeline's transactions get their connections: from the pool, with a concurrency
slot for a record's own attempt (the batcher holds the slot of a batch itself), given back
whatever happened."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, TypeAlias

import asyncpg

from ..shared.failures import ConnectionLost, HandlerFailure, connection_lost, describe

log = logging.getLogger("consumerkit.pipeline")

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    Connection: TypeAlias = PoolConnectionProxy[asyncpg.Record]


class Connections:
    def __init__(self, pool: asyncpg.Pool, slots: asyncio.Semaphore) -> None:
        self.pool = pool
        self.slots = slots

    @contextlib.asynccontextmanager
    async def attempt(self) -> AsyncIterator[Connection]:
        """A slot and a connection for one record's attempt (taken only once the dedup cache
        did not know the record)."""
        async with self.slots:
            conn = await self.pool.acquire()
            try:
                yield conn
            except Exception as exc:
                if connection_lost(conn):  # whoever raised, the connection died under us
                    failure = isinstance(exc, HandlerFailure)
                    cause = exc.cause if isinstance(exc, HandlerFailure) else exc
                    raise ConnectionLost(cause, during_handler=failure) from exc
                raise
            finally:
                await self.release(conn)

    @contextlib.asynccontextmanager
    async def batch(self) -> AsyncIterator[Connection]:
        """A connection for a batch (whose slot the batcher holds)."""
        conn = await self.pool.acquire()
        try:
            yield conn
        finally:
            await self.release(conn)

    async def release(self, conn: Connection) -> None:
        """Give the connection back. If asyncpg cannot reset it (a query the handler left
        running, a dead socket) it has already terminated it; the attempt's own outcome,
        success or failure, is what counts, not this."""
        try:
            await self.pool.release(conn)
        except Exception as exc:
            log.warning("discarded a connection that could not be reset: %s", describe(exc))
