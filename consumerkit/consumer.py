"""The consumer: wiring of services, start-up checks, run and graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry

from .deadletter.table import DeadLetterTable
from .dedup.policy import DedupPolicy
from .engine.decode import Decoder
from .engine.options import DEFAULTS, derive
from .engine.run import Run
from .engine.unhandled import TypePolicy
from .engine.unhandled import Unhandled as UnhandledPolicy
from .envelope import WireFormat
from .errors import ConfigurationError
from .observability.observer import Observer
from .offsets import OffsetStoreName
from .outbox.writer import Outbox
from .registry import HandlerSource
from .retry import RetryPolicy
from .route_table import RouteTable
from .settings.groups import Kafka, Limits, Metrics, Postgres, Stall, Timeouts, Unhandled
from .shared.identifiers import check_name, redact_dsn
from .shared.pooler import Pooler
from .stats import ConsumerStats
from .transport.source import Partition, RebalanceHandler, Source
from .types import DeadLetterSink, DedupCache

log = logging.getLogger("consumerkit.consumer")

class Consumer:
    """Consumes ``topics`` as group ``name`` and applies every event's effect exactly once.

    Per message: the event id is claimed in the dedup table as the first statement of a
    transaction, the handler runs in that same transaction (``ctx.tx``), the transaction
    commits, and only then may the offset move past the message. Messages of one key are
    handled one at a time in offset order; different keys run concurrently.

    The options come in groups (:mod:`consumerkit.settings.groups`): ``postgres``,
    ``kafka``, ``limits``, ``timeouts``, ``stall``, ``metrics``, ``unhandled``. The fields a
    group is given are the code's choice, which ``consumerkit run``'s settings never
    override; the others the settings may give. ``source_factory`` replaces the Kafka
    consumer with another :class:`~consumerkit.transport.source.Source` built from the
    engine's rebalance callbacks (``consumerkit.testing`` passes an in-memory one).
    """

    # derived from the groups by set_options() (engine/options.py), read by the engine
    postgres_dsn: str | None
    schema: str
    postgres_pooler: Pooler
    kafka_bootstrap: str | None
    kafka_options: dict[str, Any]  # every client's, TLS and SASL included
    kafka_consumer_options: dict[str, Any]  # the consumer's: those, then its own
    batch_size: int  # records per fetch (max_poll_records)
    keepalive: float  # seconds between polls while full
    rebalance_timeout: float
    concurrency: int
    auto_concurrency: bool  # concurrency follows max_batch
    max_batch: int
    max_in_flight: int
    max_message_bytes: int
    handler_timeout: float | None
    shutdown_timeout: float
    revoke_timeout: float
    stall_after_keys: int  # a failure every record would hit stalls it (see _stall)
    stall_max_delay: float
    metrics_port: int | None
    metrics_host: str
    lag_interval: float  # seconds between end-offset requests for the lag
    parking_interval: float  # seconds between refreshes of the parked keys' gauges
    unhandled: UnhandledPolicy  # what becomes of event types no handler takes
    ignore: tuple[str, ...]  # event types skipped whatever ``unhandled`` says (fnmatch)
    types: TypePolicy  # the two above, checked against the handlers
    offset_store: OffsetStoreName

    def __init__(
        self, *, name: str, handlers: Iterable[HandlerSource], topics: Sequence[str],
        postgres: Postgres = DEFAULTS["postgres"], kafka: Kafka = DEFAULTS["kafka"],
        limits: Limits = DEFAULTS["limits"], timeouts: Timeouts = DEFAULTS["timeouts"],
        stall: Stall = DEFAULTS["stall"], metrics: Metrics = DEFAULTS["metrics"],
        unhandled: Unhandled = DEFAULTS["unhandled"],
        dedup: DedupPolicy | None = None, dedup_cache: DedupCache | None = None,
        outbox: Outbox | None = None,
        retry: RetryPolicy | None = None, wire: WireFormat | None = None,
        dead_letter: DeadLetterSink | Sequence[DeadLetterSink] | None = None,
        offset_store: OffsetStoreName | None = None, migrate: bool = True,
        handle_signals: bool = True, maintenance_interval: timedelta | None = None,
        observers: Sequence[Observer] = (), registry: CollectorRegistry | None = None,
        source_factory: Callable[[RebalanceHandler], Source] | None = None,
    ) -> None:
        self.name = check_name(name, "consumer name")
        self.topics = [check_name(t, "topic") for t in topics]
        if not self.topics:
            raise ConfigurationError("at least one topic is required")
        self.routes = RouteTable.build(handlers)
        self.dedup = dedup or DedupPolicy()
        self.dedup_cache = dedup_cache
        if dedup_cache is not None:
            dedup_cache.check(self.dedup)
        self.outbox = outbox  # placed in the consumer's schema unless it names one
        self.retry = retry or RetryPolicy()
        self.wire = wire or WireFormat()
        sinks = dead_letter if dead_letter is not None else DeadLetterTable()
        self.dead_letter: tuple[DeadLetterSink, ...] = (
            tuple(sinks) if isinstance(sinks, Sequence) else (sinks,))
        if not self.dead_letter:
            raise ConfigurationError("at least one dead-letter destination is required")
        self.auto_migrate = migrate
        self.handle_signals = handle_signals
        self.source_factory = source_factory
        self.maintenance_interval = maintenance_interval or min(
            self.dedup.partition_interval / 4, timedelta(hours=1))
        self.stats = ConsumerStats()
        # metrics are kept when a port or a registry is given; read when run() starts
        self.observers = tuple(observers)
        self.registry = registry
        self._running = False
        self._options: dict[str, Any] = {}
        self.set_options(postgres=postgres, kafka=kafka, limits=limits, timeouts=timeouts,
                         stall=stall, metrics=metrics, unhandled=unhandled,
                         offset_store=offset_store)
        self.started = asyncio.Event()
        self._run: Run | None = None  # what run() opened, while it runs
        self._stop_requested = asyncio.Event()  # a stop was asked (stop(), a signal)
        self._finished = asyncio.Event()

    def options(self) -> dict[str, Any]:
        """The option groups by argument name, and ``offset_store`` (``None`` when the code
        left it to the settings): what :meth:`set_options` takes."""
        return dict(self._options)

    def set_options(self, **options: Any) -> None:
        """Replace option groups (and ``offset_store``) before :meth:`run`, checked, and
        derive again what depends on them, as the constructor does: all or nothing
        (``consumerkit run`` gives so what the code left to its settings)."""
        if self._running:
            raise ConfigurationError("a running consumer cannot be configured")
        unknown = set(options) - {*DEFAULTS, "offset_store"}
        if unknown:
            raise ConfigurationError(f"unknown option groups: {', '.join(sorted(unknown))}")
        merged = {**self._options, **options}
        derived = derive(merged, self.routes, self.dedup, self.retry)
        self._options = merged
        vars(self).update(derived)

    @property
    def postgres(self) -> Postgres:
        group: Postgres = self._options["postgres"]
        return group

    @property
    def kafka(self) -> Kafka:
        group: Kafka = self._options["kafka"]
        return group

    @property
    def outbox(self) -> Outbox | None:
        """The outbox handlers publish through: the one given, in the consumer's schema
        unless it was given a schema of its own (``Outbox(schema=...)``)."""
        given = self._outbox
        return None if given is None else given.placed_in(self.schema)

    @outbox.setter
    def outbox(self, outbox: Outbox | None) -> None:
        self._outbox = outbox

    @property
    def outbox_given(self) -> Outbox | None:
        """The outbox as given, before it is placed in a schema (for a copy of the
        consumer with another schema, :meth:`TestConsumer.like`)."""
        return self._outbox

    def decoder(self) -> Decoder:
        """A decoder of this consumer's records: its handlers, wire format, size limit, and
        what becomes of the event types no handler takes."""
        return Decoder(self.routes, self.wire, self.max_message_bytes, self.types)

    def __repr__(self) -> str:
        dsn = None if self.postgres_dsn is None else redact_dsn(self.postgres_dsn)
        return (f"Consumer(name={self.name!r}, topics={self.topics!r}, "
                f"postgres={dsn!r}, kafka={self.kafka_bootstrap!r})")

    def _require_dsn(self) -> str:
        if self.postgres_dsn is None:
            raise ConfigurationError(
                "no PostgreSQL DSN: pass postgres=Postgres(dsn=...), or set "
                "CONSUMERKIT_POSTGRES_DSN (consumerkit run --postgres)")
        return self.postgres_dsn

    def _services(self) -> tuple[str, str]:
        """The DSN and the bootstrap servers, or a :class:`ConfigurationError` naming the
        setting that is missing."""
        dsn = self._require_dsn()
        if self.kafka_bootstrap is None:
            raise ConfigurationError(
                "no Kafka bootstrap servers: pass kafka=Kafka(bootstrap=...), or set "
                "CONSUMERKIT_KAFKA_BOOTSTRAP (consumerkit run --kafka)")
        return dsn, self.kafka_bootstrap

    @property
    def assignment(self) -> list[Partition]:
        engine = self._run.engine if self._run is not None else None
        return sorted(engine.states) if engine is not None else []

    async def run(self) -> None:
        """Consume until :meth:`stop`, cancellation, or SIGTERM/SIGINT; then shut down
        gracefully. Raises :class:`StartupError` if a service or topic is missing."""
        if self._running:
            raise ConfigurationError("a Consumer runs once; create a new one to run again")
        dsn, bootstrap = self._services()
        self._running = True
        try:
            async with contextlib.AsyncExitStack() as stack:
                self._run = Run(self, dsn, bootstrap, self._stop_requested)
                await self._run.serve(stack)
        finally:
            self._finished.set()

    async def stop(self) -> None:
        """Ask a running consumer to finish in-flight work, commit and close; wait for it."""
        self._request_stop()
        if self._running:
            await self._finished.wait()

    def _request_stop(self) -> None:
        if self._run is not None:
            self._run.request_stop()
        else:
            self._stop_requested.set()

    async def readiness(self) -> str | None:
        """``None`` once start-up is complete, the group is joined (the first assignment,
        even an empty one, came), no failure every record would hit stalls it and PostgreSQL
        answers a query; else the reason why not."""
        if self._run is None:
            return "stopping" if self._stop_requested.is_set() else "starting"
        return await self._run.readiness()
