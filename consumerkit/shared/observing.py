"""What a consumer or a relay needs to be watched from outside, below the engine: the
probe of its database (its readiness' PostgreSQL part) and the metrics endpoint's lifetime."""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
from prometheus_client import CollectorRegistry

from ..observability.server import HealthServer, Readiness
from .failures import describe
from .pooler import Pooler, connect

PING_TIMEOUT = 2.0  # /readyz: PostgreSQL must answer within this


async def serve_metrics(stack: contextlib.AsyncExitStack, registry: CollectorRegistry,
                        readiness: Readiness, host: str, port: int) -> HealthServer:
    """Start the endpoints on ``host:port``, closed when ``stack`` unwinds."""
    server = HealthServer(registry, readiness, host=host, port=port)
    await server.start()
    stack.push_async_callback(server.close)
    return server


class Probe:
    """A connection of its own for readiness checks, so that a check never waits on (or
    interferes with) the work's connection; opened on first use, reopened after a failure."""

    def __init__(self, dsn: str, name: str, pooler: Pooler = "none") -> None:
        self._dsn = dsn
        self._pooler: Pooler = pooler
        self._name = name
        self._conn: asyncpg.Connection[asyncpg.Record] | None = None
        self._lock = asyncio.Lock()

    async def check(self) -> str | None:
        async with self._lock:
            try:
                async with asyncio.timeout(PING_TIMEOUT):
                    if self._conn is None or self._conn.is_closed():
                        self._conn = await connect(
                            self._dsn, pooler=self._pooler,
                            application_name=f"consumerkit-probe {self._name}")
                    await self._conn.fetchval("SELECT 1")
            except Exception as exc:
                await self.close()
                if isinstance(exc, TimeoutError):
                    return f"PostgreSQL did not answer within {PING_TIMEOUT:g}s"
                return f"PostgreSQL does not answer: {describe(exc)}"
            return None

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()
