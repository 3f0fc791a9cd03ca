"""What a consumer or relay needs to be observed: its observers as one, the PostgreSQL part of
its readiness, readiness changes told to the observers, the dedup partitions' lead, the lag
and the metrics endpoint's lifetime."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import asyncpg
from prometheus_client import CollectorRegistry

from ..dedup.partitions import list_partitions
from ..engine.lag import track_lag
from ..engine.lifecycle import cancel
from ..observability.logging import LogObserver
from ..observability.metrics import ConsumerMetrics
from ..observability.observer import Observer, fanout
from ..observability.server import HealthServer, Readiness
from ..observability.tracing import Tracing, default_tracing
from ..stats import ConsumerStats, StatsObserver
from ..types import DbConnection
from .failures import describe
from .pooler import Pooler, connect

if TYPE_CHECKING:
    from ..engine.runner import Engine
    from ..transport.source import Source

PING_TIMEOUT = 2.0  # /readyz: PostgreSQL must answer within this


def consumer_observer(
    name: str, stats: ConsumerStats, extra: Sequence[Observer],
    registry: CollectorRegistry | None,
) -> tuple[Observer, Tracing | None]:
    """The consumer's observers as one (stats, log lines, metrics when ``registry`` is given,
    traces when a :class:`Tracing` is among ``extra`` or a tracer provider is set, then
    ``extra``), and the tracing that wraps handlers, if any."""
    observers: list[Observer] = [StatsObserver(stats), LogObserver(name)]
    if registry is not None:
        observers.append(ConsumerMetrics(registry, name))
    tracing = next((o for o in extra if isinstance(o, Tracing)), None)
    if tracing is None:
        tracing = default_tracing(name)
        if tracing is not None:
            observers.append(tracing)
    observers.extend(extra)
    return fanout(observers), tracing


class Observed:
    """A running consumer's observation: its observers as one (``observer``), the tracing
    that wraps its handlers, the probe of its database and its readiness as last told."""

    def __init__(self, role: str, name: str, observer: Observer, tracing: Tracing | None,
                 probe: Probe) -> None:
        self.role = role
        self.name = name
        self.observer = observer
        self.tracing = tracing
        self.probe = probe
        self._reason: str | None = "never checked"

    def tell(self, reason: str | None) -> None:
        """Tell the observers ``reason`` (``None``: ready) if it changed since last told."""
        if reason != self._reason:
            self._reason = reason
            self.observer.readiness(self.role, self.name, reason)

    def track_lag(self, stack: contextlib.AsyncExitStack, engine: Engine, source: Source,
                  interval: float) -> None:
        """Report the lag every ``interval`` seconds until ``stack`` unwinds."""
        lag = asyncio.create_task(track_lag(engine, source, self.observer, interval))
        stack.push_async_callback(cancel, lag)


async def observe_consumer(
    stack: contextlib.AsyncExitStack, *, name: str, dsn: str, stats: ConsumerStats,
    observers: Sequence[Observer], registry: CollectorRegistry | None,
    readiness: Readiness, metrics_port: int | None, metrics_host: str,
    pooler: Pooler = "none",
) -> Observed:
    """A consumer's observation for one run, and its metrics endpoint when ``metrics_port``
    is given (``registry`` must be given then); all closed when ``stack`` unwinds."""
    probe = Probe(dsn, name, pooler)
    stack.push_async_callback(probe.close)
    observer, tracing = consumer_observer(name, stats, observers, registry)
    if metrics_port is not None:
        assert registry is not None
        await serve_metrics(stack, registry, readiness, metrics_host, metrics_port)
    return Observed("consumer", name, observer, tracing, probe)


async def partitions_ahead(conn: DbConnection, schema: str, table: str) -> float | None:
    """Seconds from now to the end of the newest dedup partition; ``None`` for an
    unpartitioned table."""
    uppers = [p.upper for p in await list_partitions(conn, schema, table)
              if p.upper is not None]
    if not uppers:
        return None
    return (max(uppers) - datetime.now(UTC)).total_seconds()


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
