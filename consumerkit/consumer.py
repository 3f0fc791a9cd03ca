"""The consumer: wiring of services, start-up checks, run and graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from prometheus_client import CollectorRegistry

from .deadletter.table import DeadLetterTable
from .dedup.policy import DedupPolicy
from .engine.configure import configure, records_given
from .engine.decode import Decoder
from .engine.lifecycle import connect
from .engine.run import Run
from .engine.unhandled import TypePolicy, Unhandled
from .envelope import WireFormat
from .errors import ConfigurationError
from .observability.observer import Observer
from .offsets import OFFSET_STORES, OffsetStoreName
from .outbox.writer import Outbox
from .registry import HandlerSource
from .retry import RetryPolicy
from .route_table import RouteTable
from .schema import migrate
from .shared.identifiers import check_name, redact_dsn
from .shared.pooler import Pooler
from .stats import ConsumerStats
from .transport.kafka import consumer_options, producer_options
from .transport.source import Partition, RebalanceHandler, Source
from .types import DeadLetterSink, DedupCache

log = logging.getLogger("consumerkit.consumer")

class Consumer:
    """Consumes ``topics`` as group ``name`` and applies every event's effect exactly once.

    Per message: the event id is claimed in the dedup table as the first statement of a
    transaction, the handler runs in that same transaction (``ctx.tx``), the transaction
    commits, and only then may the offset move past the message. Messages of one key are
    handled one at a time in offset order; different keys run concurrently.

    ``source_factory``, an attribute read when :meth:`run` starts, replaces the Kafka
    consumer with another :class:`~consumerkit.transport.source.Source` built from the
    engine's rebalance callbacks (``consumerkit.testing`` sets an in-memory one).
    """

    source_factory: Callable[[RebalanceHandler], Source] | None = None
    given: frozenset[str] = frozenset()
    """The keyword arguments the code passed: those it chose, not left at their defaults."""
    # set by configure(), from the constructor too
    schema: str
    concurrency: int
    auto_concurrency: bool  # concurrency follows max_batch
    max_batch: int
    max_in_flight: int
    handler_timeout: float | None
    shutdown_timeout: float
    revoke_timeout: float
    stall_after_keys: int  # a failure every record would hit stalls it (see _stall)
    stall_max_delay: float
    unhandled: Unhandled  # what becomes of event types no handler takes
    ignore: tuple[str, ...]  # event types skipped whatever ``unhandled`` says (fnmatch)
    types: TypePolicy  # the two above, checked against the handlers

    @records_given
    def __init__(
        self, *, name: str, handlers: Iterable[HandlerSource], topics: Sequence[str],
        kafka_bootstrap: str | None = None, postgres_dsn: str | None = None,
        schema: str = "consumerkit",
        dedup: DedupPolicy | None = None, dedup_cache: DedupCache | None = None,
        outbox: Outbox | None = None,
        retry: RetryPolicy | None = None, wire: WireFormat | None = None,
        dead_letter: DeadLetterSink | Sequence[DeadLetterSink] | None = None,
        concurrency: int | None = None, max_batch: int = 500, max_in_flight: int = 5000,
        max_message_bytes: int = 1 << 20,
        migrate: bool = True, kafka_options: Mapping[str, Any] | None = None,
        kafka_consumer_options: Mapping[str, Any] | None = None,
        handler_timeout: float | None = 60.0, shutdown_timeout: float = 30.0,
        stall_after_keys: int = 5, stall_max_delay: float = 30.0,
        handle_signals: bool = True,
        maintenance_interval: timedelta | None = None,
        observers: Sequence[Observer] = (), metrics_port: int | None = None,
        metrics_host: str = "0.0.0.0",  # noqa: S104 - a scrape target listens on all
        registry: CollectorRegistry | None = None,
        offset_store: OffsetStoreName = "postgres",
        unhandled: Unhandled = "dead_letter", ignore: Sequence[str] = (),
        postgres_pooler: Pooler = "none",
    ) -> None:
        self.name = check_name(name, "consumer name")
        self.topics = [check_name(t, "topic") for t in topics]
        if not self.topics:
            raise ConfigurationError("at least one topic is required")
        if offset_store not in OFFSET_STORES:
            raise ConfigurationError(f"offset_store must be one of {', '.join(OFFSET_STORES)}, "
                                     f"not {offset_store!r}")
        # "postgres": each partition's next offset is stored in the effects' transactions,
        # and read from there on assignment (docs/ordering-and-offsets.md)
        self.offset_store: OffsetStoreName = offset_store
        # what stands in front of PostgreSQL (shared/pooler.py): checked by configure()
        self.postgres_pooler: Pooler = postgres_pooler
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
        # None: given later (``consumerkit run`` fills them from its settings)
        self.kafka_bootstrap = kafka_bootstrap
        self.postgres_dsn = postgres_dsn
        self.max_message_bytes = max_message_bytes
        self.auto_migrate = migrate
        self.kafka_options = dict(kafka_options or {})
        self.kafka_consumer_options = {**self.kafka_options, **(kafka_consumer_options or {})}
        # refuse unsafe settings now; the fetch size follows max_poll_records
        options = consumer_options(self.kafka_consumer_options)
        self.batch_size = int(options["max_poll_records"])
        # while full, poll (with partitions paused) well within max_poll_interval_ms
        self.keepalive = options.get("max_poll_interval_ms", 300_000) / 4000
        self.rebalance_timeout = options["rebalance_timeout_ms"] / 1000
        self.auto_concurrency = True
        self._running = False
        self.configure(schema=schema, concurrency=concurrency, max_batch=max_batch,
                       max_in_flight=max_in_flight, handler_timeout=handler_timeout,
                       shutdown_timeout=shutdown_timeout, stall_after_keys=stall_after_keys,
                       stall_max_delay=stall_max_delay, unhandled=unhandled,
                       ignore=ignore)
        try:
            producer_options(self.kafka_options)  # dead-letter producers share these
        except ConfigurationError as exc:
            raise ConfigurationError(
                f"{exc} (kafka_options go to every Kafka client; options of the consumer "
                "alone belong in kafka_consumer_options)") from None
        self.handle_signals = handle_signals
        self.maintenance_interval = maintenance_interval or min(
            self.dedup.partition_interval / 4, timedelta(hours=1))
        self.stats = ConsumerStats()
        # metrics are kept when a port or a registry is given; read when run() starts
        self.observers = tuple(observers)
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.registry = registry
        self.lag_interval = 5.0  # seconds between end-offset requests for the lag
        self.parking_interval = 30.0  # seconds between refreshes of the parked keys' gauges
        self.started = asyncio.Event()
        self._run: Run | None = None  # what run() opened, while it runs
        self._stop_requested = asyncio.Event()  # a stop was asked (stop(), a signal)
        self._finished = asyncio.Event()

    def configure(self, **values: Any) -> None:
        """Change values of the constructor's ``CONFIGURABLE`` arguments before :meth:`run`,
        checked, and what depends on them derived again, as the constructor does. The code's
        values set so are chosen, as if passed (:attr:`given`): settings do not override them
        (``consumerkit run`` sets this way what the code left at its defaults)."""
        if self._running:
            raise ConfigurationError("a running consumer cannot be configured")
        before = dict(vars(self))
        try:
            configure(self, dict(values))
        except ConfigurationError:
            vars(self).update(before)  # all or nothing
            raise
        self.given = self.given | values.keys()  # set by the code: chosen, as if passed

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

    @property
    def postgres_dsn(self) -> str | None:
        return self._dsn

    @postgres_dsn.setter
    def postgres_dsn(self, dsn: str | None) -> None:
        self._dsn = dsn

    def _require_dsn(self) -> str:
        if self._dsn is None:
            raise ConfigurationError(
                "no PostgreSQL DSN: pass postgres_dsn=, or set CONSUMERKIT_POSTGRES_DSN "
                "(consumerkit run --postgres)")
        return self._dsn

    def _services(self) -> tuple[str, str]:
        """The DSN and the bootstrap servers, or a :class:`ConfigurationError` naming the
        setting that is missing."""
        dsn = self._require_dsn()
        if self.kafka_bootstrap is None:
            raise ConfigurationError(
                "no Kafka bootstrap servers: pass kafka_bootstrap=, or set "
                "CONSUMERKIT_KAFKA_BOOTSTRAP (consumerkit run --kafka)")
        return dsn, self.kafka_bootstrap

    @property
    def assignment(self) -> list[Partition]:
        engine = self._run.engine if self._run is not None else None
        return sorted(engine.states) if engine is not None else []

    async def migrate(self) -> None:
        """Create or upgrade consumerkit's tables (idempotent; safe concurrently)."""
        async with connect(self._require_dsn(), self.postgres_pooler) as conn:
            await migrate(conn, self.schema, self.dedup, namespace=self.name)

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
