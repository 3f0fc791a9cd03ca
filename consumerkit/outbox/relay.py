"""The relay: publishes committed outbox rows through a sink, then deletes them.

One round: (re)balance slots when due; claim up to ``batch_size`` pending rows of the owned
slots in ``seq`` order; send them; delete the acknowledged ones in one statement; record
failures in the side table. Pending means present in the table: there is no cursor, so a
row whose transaction commits late is claimed whenever it becomes visible. When nothing is
pending the relay waits for a notification, the poll interval, or the next back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import time
from collections.abc import Sequence

import asyncpg
from prometheus_client import CollectorRegistry

from ..errors import ConfigurationError
from ..observability.logging import LogObserver
from ..observability.metrics import RelayMetrics
from ..observability.observer import Observer, fanout
from ..retry import RetryPolicy
from ..settings.groups import Metrics, Postgres
from ..shared import faults, signals
from ..shared.aio import wait_set
from ..shared.failures import BROKEN_CONNECTION
from ..shared.identifiers import redact_dsn
from ..shared.observing import Probe, serve_metrics
from ..shared.pooler import connect
from .event import OutboxEvent
from .leases import LeaseOwner
from .listener import Listener
from .report import report
from .settle import settle
from .sink import OutboxSink
from .slots import SlotOwner
from .store import RelayStore
from .table import OutboxTable

log = logging.getLogger("consumerkit.outbox")

DEFAULT_METRICS = Metrics()
DEFAULT_RETRY = RetryPolicy(max_attempts=10, initial_delay=1.0, max_delay=60.0)
# an outage: drop the connection, pause, connect again
_DB_ERRORS = (TimeoutError, asyncpg.PostgresError, *BROKEN_CONNECTION)


class Relay:
    """Publishes one outbox through ``sink``. Run any number of relays of one outbox at once:
    each owns a share of the slots, so each aggregate has one publisher at a time.

    ``retry`` paces a failing row (attempt ``n`` waits ``min(max_delay, initial_delay *
    2 ** (n - 1))``, jittered down to half) and makes it FAILED after ``max_attempts``; a
    batch of which no event was acknowledged (the broker is down) only pauses the relay with
    the same back-off, without counting attempts. ``notify=False`` relies on polling alone
    (for poolers without LISTEN); the lock connection must still be a real session.
    ``postgres`` is the database (its DSN is required) and, in ``pooler``, what stands in
    front of it. With ``none`` or
    ``session`` the slots are session advisory locks; with ``transaction`` (a backend lent
    for one transaction at a time) they are leases in a table, renewed every round and
    checked by the claim itself (:mod:`.leases`), and the relay polls; given
    ``listen_dsn``, a DSN that reaches PostgreSQL directly, it also LISTENs there
    (:mod:`.listener`), to be woken by a commit as a direct relay is.
    """

    def __init__(
        self, postgres: Postgres, sink: OutboxSink, *, table: str = "outbox",
        batch_size: int = 500, notify: bool = True,
        poll_interval: float = 1.0, rebalance_interval: float = 1.0,
        retry: RetryPolicy = DEFAULT_RETRY, name: str | None = None,
        handle_signals: bool = True, observers: Sequence[Observer] = (),
        metrics: Metrics = DEFAULT_METRICS, registry: CollectorRegistry | None = None,
    ) -> None:
        postgres_dsn = postgres.url()
        if postgres_dsn is None:
            raise ConfigurationError("a relay needs a DSN: Relay(Postgres(dsn=...), sink)")
        self.pooler = postgres.pooler
        schema = postgres.schema
        listen_dsn = postgres.listen_dsn.get_secret_value() if postgres.listen_dsn else None
        if listen_dsn and self.pooler != "transaction":
            raise ConfigurationError("Postgres(listen_dsn=...) is for pooler='transaction' "
                                     "only: otherwise the relay's lock connection listens")
        if batch_size < 1 or poll_interval <= 0 or rebalance_interval <= 0:
            raise ConfigurationError("need batch_size >= 1, poll_interval > 0 and "
                                     "rebalance_interval > 0")
        self.table = OutboxTable(schema, table)
        self.sink = sink
        self.batch_size = batch_size
        self.notify = notify
        self.poll_interval = poll_interval
        self.rebalance_interval = rebalance_interval
        self.retry = retry
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.handle_signals = handle_signals
        self.published = 0
        # metrics are kept when a port or a registry is given; read when run() starts
        self.observers = tuple(observers)
        self.metrics_port = metrics.port
        self.metrics_host = metrics.host
        self.registry = registry
        self.backlog_interval = metrics.refresh_interval  # between the backlog's queries
        self._observer: Observer = fanout([LogObserver(self.name, log), *self.observers])
        self._ready_reason: str | None = "never checked"
        self._backlog_at = -math.inf  # when the backlog was last counted
        self._probe = Probe(postgres_dsn, self.name, self.pooler)
        self._outbox = f"{schema}.{table}"
        self.pauses = 0  # outages: batches of which nothing was acknowledged, lost databases
        self.started = asyncio.Event()
        self._dsn = postgres_dsn
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._owner: SlotOwner | LeaseOwner
        self._leases: LeaseOwner | None = None
        self._listener: Listener | None = None
        if self.pooler == "transaction":  # no session: leases, and polling (LISTEN direct)
            if notify and listen_dsn:
                self._listener = Listener(listen_dsn, self.table.channel,
                                          name=self.name, on_notify=self._wake.set)
            self.notify = self._listener is not None
            self._owner = self._leases = LeaseOwner(postgres_dsn, self.table, name=self.name,
                                                    pooler=self.pooler)
            self._store = RelayStore(self.table, self._leases)
        else:
            self._owner = SlotOwner(postgres_dsn, self.table, name=self.name,
                                    on_notify=self._wake.set if notify else None,
                                    pooler=self.pooler)
            self._store = RelayStore(self.table)
        self._conn: asyncpg.Connection[asyncpg.Record] | None = None
        self._outages = 0
        self._rebalance_at = 0.0

    @property
    def slots(self) -> frozenset[int]:
        """The slots this relay owns now (empty before start and after a lost connection)."""
        return self._owner.owned if self._owner.healthy else frozenset()

    async def readiness(self) -> str | None:
        """``None`` once started, holding its lock connection, with PostgreSQL answering;
        else the reason why not."""
        reason = await self._readiness()
        if reason != self._ready_reason:
            self._ready_reason = reason  # observers hear of changes only
            self._observer.readiness("relay", self.name, reason)
        return reason

    async def _readiness(self) -> str | None:
        if self._stopping.is_set():
            return "stopping"
        if not self.started.is_set():
            return "starting"
        if not self._owner.healthy:
            return "not holding its lock connection to PostgreSQL"
        return await self._probe.check()

    def stop(self) -> None:
        """Ask the relay to stop after the batch in flight (its acks are still recorded)."""
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        """Publish until :meth:`stop` (or SIGTERM/SIGINT with ``handle_signals``)."""
        remove = signals.install(self._on_signal) if self.handle_signals else (lambda: None)
        stack = contextlib.AsyncExitStack()
        try:
            if self.metrics_port is not None and self.registry is None:
                self.registry = CollectorRegistry()  # one per relay: no clash in a process
            if self.registry is not None:
                self._observer = fanout([RelayMetrics(self.registry, self._outbox, self.name),
                                         LogObserver(self.name, log), *self.observers])
            if self.metrics_port is not None:
                assert self.registry is not None
                await serve_metrics(stack, self.registry, self.readiness, self.metrics_host,
                                    self.metrics_port)
            stack.push_async_callback(self._probe.close)
            await self.sink.open()
            try:
                self.started.set()
                log.info("outbox relay %s started on %s (%s)", self.name, self.table.events,
                         redact_dsn(self._dsn))
                while not self._stopping.is_set():
                    try:
                        if await self._round():  # a paused round keeps the back-off growing
                            self._outages = 0
                    except _DB_ERRORS as exc:
                        await self._pause(f"database unavailable: {exc!r}")
                        await self._drop_connections()
            finally:
                await self._drop_connections()
                await self.sink.close()
        finally:
            self._stopping.set()  # however the run ended (a stop, a cancel, an error)
            await self.readiness()  # "stopping", for the gauge and the log
            await stack.aclose()
            remove()
            log.info("outbox relay %s stopped after publishing %d events", self.name,
                     self.published)

    def _on_signal(self, sig: signal.Signals) -> None:
        log.info("outbox relay %s: %s, stopping", self.name, sig.name)
        self.stop()

    async def _round(self) -> bool:
        """Claim, send and settle one batch; ``False`` when the sink failed it whole (the
        relay paused)."""
        if not self._owner.healthy or time.monotonic() >= self._rebalance_at:
            await self._owner.rebalance()
            self._rebalance_at = time.monotonic() + self.rebalance_interval
        conn = await self._connection()
        self._wake.clear()
        owned = self._owner.owned
        if time.monotonic() >= self._backlog_at + self.backlog_interval:
            self._backlog_at = time.monotonic()
            await self._report_backlog(conn)
        events = await self._store.claim(conn, owned, self.batch_size) if owned else []
        if not events:
            await self._idle(conn)
            return True
        try:
            async with self._owner.kept():  # leases renewed while the broker takes its time
                results = await self.sink.send(events)
        except Exception as exc:  # a failed batch is an outage: pause, count no attempt
            # still renewing its leases: a paused relay is alive (live_relays(), cleanup's
            # refusal) and keeps its slots for when the sink is back
            async with self._owner.kept():
                await self._pause(f"sink failed the whole batch: {exc!r}")
            return False
        faults.inject("relay_after_publish")
        await self._settle(conn, events, results)
        return True

    async def _settle(self, conn: asyncpg.Connection[asyncpg.Record],
                      events: list[OutboxEvent], results: list[BaseException | None]) -> None:
        outcome = settle(events, results, self.retry)
        if not self._owner.healthy:
            log.warning("outbox relay %s lost its slot locks during a batch; the batch may "
                        "be published again by another relay", self.name)
        await self._store.delete(conn, outcome.delete)
        await self._store.record_failures(conn, outcome.failures)
        self.published += len(outcome.delete)
        report(outcome, events, self._observer, self.name, self._outbox)

    async def _report_backlog(self, conn: asyncpg.Connection[asyncpg.Record]) -> None:
        pending, oldest, failed = await self._store.backlog(conn)
        self._observer.relay_backlog(self._outbox, pending, oldest, failed)

    async def _idle(self, conn: asyncpg.Connection[asyncpg.Record]) -> None:
        delay = min(self.poll_interval, max(0.0, self._rebalance_at - time.monotonic()))
        retry_in = await self._store.next_retry_in(conn)
        if retry_in is not None:
            delay = min(delay, max(0.01, retry_in))
        if self._listener is not None:
            await self._listener.ensure()
        await self._wait(delay)

    async def _wait(self, delay: float) -> None:
        await wait_set(self._wake, delay)

    async def _pause(self, reason: str) -> None:
        self._outages += 1
        self.pauses += 1
        delay = self.retry.delay(self._outages)
        log.warning("outbox relay %s paused for %.1fs: %s", self.name, delay, reason)
        await wait_set(self._stopping, delay)

    async def _connection(self) -> asyncpg.Connection[asyncpg.Record]:
        if self._conn is None or self._conn.is_closed():
            self._conn = await connect(self._dsn, pooler=self.pooler,
                                       application_name=f"consumerkit-relay {self.name}")
            await self._store.check(self._conn)
        return self._conn

    async def _drop_connections(self) -> None:
        await self._owner.close()
        if self._listener is not None:
            await self._listener.close()
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=5)
            except _DB_ERRORS:
                conn.terminate()
