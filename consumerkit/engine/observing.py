"""What a consumer needs to be observed: its observers as one, readiness changes told to the
observers, the dedup partitions' lead and the lag."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from ..dedup.partitions import list_partitions
from ..observability.logging import LogObserver
from ..observability.metrics import ConsumerMetrics
from ..observability.observer import Observer, fanout
from ..observability.server import Readiness
from ..observability.tracing import Tracing, default_tracing
from ..shared.observing import Probe, serve_metrics
from ..shared.pooler import Pooler
from ..stats import ConsumerStats, StatsObserver
from ..types import DbConnection
from .lag import track_lag
from .lifecycle import cancel

if TYPE_CHECKING:
    from ..transport.source import Source
    from .runner import Engine


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
