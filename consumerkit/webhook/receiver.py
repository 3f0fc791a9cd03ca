"""The webhook receiver: an ASGI application that applies each delivered event once.

For each ``POST``: read the body (at most ``max_body_bytes``), verify its Standard Webhooks
signature (401 if it does not verify: :mod:`consumerkit.shared.webhook.signature`), decode it
like a Kafka record whose headers are the request's (``webhook-id``, else ``Idempotency-Key``,
is the event id, ``X-Event-Type`` the route, see :mod:`consumerkit.shared.webhook.headers`),
validate the payload, then claim the key and run the handler in one READ COMMITTED transaction
(the consumer's own transaction path, :mod:`consumerkit.webhook._apply`). The answer follows
:mod:`consumerkit.shared.webhook.status`: 2xx means applied (now or before), 5xx/429 means
"send it again later", other 4xx mean "this request can never succeed".

The handler sees the same :class:`~consumerkit.Envelope` as for a Kafka record: ``event_id``
is the ``webhook-id`` (or Idempotency-Key), ``topic`` is ``"webhook:<path>"`` when a handler
routes on that path (``@handler(topic="webhook:/legacy")``), else ``"webhook:<namespace>"``
(metrics label outcomes by topic: the caller's path would be unbounded), ``partition``
and ``offset`` are -1 (an HTTP request has no position), ``key`` is
``X-Event-Aggregate-Id``, ``timestamp`` the time the request arrived and ``occurred_at``
``X-Event-Occurred-At``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from datetime import timedelta

import asyncpg

from ..dedup.partitions import maintain
from ..dedup.policy import DedupPolicy
from ..dedup.postgres import PostgresDedupStore
from ..engine.apply import Applier
from ..engine.decode import Decoder
from ..errors import ConfigurationError, StartupError
from ..observability.logging import LogObserver
from ..observability.observer import Observer, fanout
from ..registry import HandlerRegistry, HandlerSource
from ..route_table import RouteTable
from ..schema import check_synchronous_commit, migrate_schema
from ..settings.groups import Postgres, Timeouts
from ..shared.identifiers import check_name, redact_dsn
from ..shared.pooler import Pooler, create_pool
from ..shared.webhook import headers as wh
from ..shared.webhook.signature import DEFAULT_TOLERANCE, WebhookSecret, secrets_of
from ._asgi import Receive, Scope, Send, lifespan
from ._deliveries import Deliveries
from ._maintenance import maintain_forever

log = logging.getLogger("consumerkit.webhook")

TIMEOUTS = Timeouts(handler=30.0)
"""The receiver's timeouts when the code gives none: a sender waits for each answer, so a
handler gets half the consumer's minute (``shutdown`` is the ASGI server's, unused here)."""


class WebhookReceiver:
    """An ASGI application applying webhook deliveries exactly once in effect.

    ``handlers``: a :class:`~consumerkit.HandlerRegistry`, or functions, modules and registries
    as for a consumer. ``namespace`` scopes the Idempotency-Keys in the dedup table (the same
    namespace as a consumer's name makes a webhook and a Kafka record with one event id count
    as one event). ``postgres`` is the database as for a consumer
    (:class:`~consumerkit.Postgres`: ``dsn``, ``schema``, ``pooler``): give its ``dsn`` (the
    receiver opens and closes its own pool of ``pool_size`` connections) or ``pool`` (yours;
    never closed here). ``timeouts.handler`` bounds each handler call (default 30 s).

    ``secrets`` (one ``whsec_...`` secret or several, see
    :mod:`consumerkit.shared.webhook.signature`) are the keys a request must be signed with: an
    unsigned, forged or wrongly signed request, or one whose ``webhook-timestamp`` is more than
    ``tolerance`` seconds away from now, is answered 401 before its body is parsed, and nothing
    is stored. Several secrets are accepted during a rotation. Without secrets the receiver
    refuses to be built unless ``allow_unsigned=True`` says that another layer authenticates
    the senders.

    Serve it with any ASGI server: the lifespan protocol opens and closes it, or call
    :meth:`open` and :meth:`close` (or ``async with receiver``) yourself when it is mounted
    inside an application that does not forward lifespan events.
    """

    def __init__(
        self, handlers: HandlerRegistry | Iterable[HandlerSource], *, namespace: str,
        postgres: Postgres | None = None, pool: asyncpg.Pool | None = None,
        timeouts: Timeouts = TIMEOUTS, dedup: DedupPolicy | None = None, migrate: bool = True,
        max_body_bytes: int = 1 << 20, pool_size: int = 10, retry_after: int = 5,
        maintenance_interval: timedelta | None = None,
        secrets: str | WebhookSecret | Iterable[str | WebhookSecret] | None = None,
        allow_unsigned: bool = False, tolerance: float = DEFAULT_TOLERANCE,
        observers: Sequence[Observer] = (),
    ) -> None:
        postgres = Postgres() if postgres is None else postgres
        for name, given, kind in (("postgres", postgres, Postgres),
                                  ("timeouts", timeouts, Timeouts)):
            if not isinstance(given, kind):
                raise ConfigurationError(f"{name}= takes a {kind.__name__}(...), not "
                                         f"{type(given).__name__}")
        secrets_given = secrets_of(secrets)
        if not secrets_given and not allow_unsigned:
            raise ConfigurationError(
                "WebhookReceiver needs secrets= to verify signed requests (or "
                "allow_unsigned=True when another layer authenticates the senders)")
        if not tolerance > 0:
            raise ConfigurationError("tolerance must be positive (seconds)")
        self.namespace = check_name(namespace, "namespace")
        if (postgres.dsn is None) == (pool is None):
            raise ConfigurationError("give exactly one of postgres=Postgres(dsn=...) and pool=")
        if max_body_bytes < 1 or pool_size < 1 or retry_after < 0:
            raise ConfigurationError(
                "max_body_bytes and pool_size must be at least 1, retry_after at least 0")
        self.routes = RouteTable.build(
            [handlers] if isinstance(handlers, HandlerRegistry) else list(handlers))
        self.postgres = postgres
        self.timeouts = timeouts
        self.schema = postgres.schema
        self.pooler: Pooler = postgres.pooler
        self.dedup = dedup or DedupPolicy()
        self.auto_migrate = migrate
        self.pool_size = pool_size
        self.maintenance_interval = maintenance_interval or min(
            self.dedup.partition_interval / 4, timedelta(hours=1))
        self._secrets = secrets_given
        self._dsn = postgres.url()
        self._pool = pool
        self._maintenance_wanted = asyncio.Event()
        self._maintenance: asyncio.Task[None] | None = None
        self._open = False
        # outcomes are counted and logged once, by the observers (as for a consumer)
        self.observers = tuple(observers)
        observe = fanout([LogObserver(self.namespace, log), *self.observers])
        store = PostgresDedupStore(self.schema, self.dedup)
        self._deliveries = Deliveries(
            namespace=self.namespace, routes=self.routes, secrets=secrets_given,
            tolerance=tolerance, max_body_bytes=max_body_bytes, retry_after=retry_after,
            expired=self.dedup.expired, store=store, observe=observe,
            decoder=Decoder(self.routes, wh.RECEIVER_WIRE, max_body_bytes),
            applier=Applier(
                namespace=self.namespace, dedup=store, observe=observe,
                handler_timeout=timeouts.handler, enforce_window=self.dedup.expired != "apply",
                maintenance_wanted=self._maintenance_wanted))

    def __repr__(self) -> str:
        where = redact_dsn(self._dsn) if self._dsn else "a given pool"
        signed = f"{len(self._secrets)} secrets" if self._secrets else "unsigned"
        return (f"WebhookReceiver(namespace={self.namespace!r}, postgres={where!r}, "
                f"{signed})")

    async def open(self) -> None:
        """Connect, create or upgrade the tables (``migrate``), start partition maintenance.
        Raises :class:`StartupError` when PostgreSQL is unreachable or a migration fails."""
        if self._open:
            return
        if not self._secrets:
            log.warning("webhook receiver %s accepts unsigned requests (allow_unsigned=True): "
                        "every sender must be authenticated by another layer", self.namespace)
        if self._dsn is not None:
            self._pool = await _open_pool(self._dsn, self.namespace, self.pool_size,
                                          self.pooler)
        assert self._pool is not None
        try:
            async with self._pool.acquire() as conn:
                if await check_synchronous_commit(conn) == "off":
                    log.warning("PostgreSQL runs with synchronous_commit=off: an effect "
                                "acknowledged to a sender can vanish in a crash")
                if self.auto_migrate:  # what consumerkit.migrate does for a schema, no outbox
                    await migrate_schema(conn, self.schema, self.dedup,
                                         namespace=self.namespace)
                else:
                    await maintain(conn, self.schema, self.dedup, namespace=self.namespace)
        except BaseException:
            await self._close_pool()
            raise
        self._maintenance = asyncio.create_task(self._maintain_forever(self._pool))
        self._open = True

    async def close(self) -> None:
        """Stop maintenance and close the pool if the receiver opened it."""
        self._open = False
        task, self._maintenance = self._maintenance, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._close_pool()

    async def __aenter__(self) -> WebhookReceiver:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send, self.open, self.close)
        elif scope["type"] == "http":
            await self._deliveries.serve(scope, receive, send,
                                         self._pool if self._open else None)

    async def _maintain_forever(self, pool: asyncpg.Pool) -> None:
        await maintain_forever(pool, self.schema, self.dedup, self.namespace,
                               self.maintenance_interval, self._maintenance_wanted)

    async def _close_pool(self) -> None:
        pool = self._pool
        if self._dsn is not None and pool is not None:
            self._pool = None
            await pool.close()


async def _open_pool(dsn: str, namespace: str, size: int, pooler: Pooler) -> asyncpg.Pool:
    try:
        pool = await create_pool(dsn, pooler=pooler, max_size=size,
                                 application_name=f"consumerkit:webhook:{namespace}")
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise StartupError(
            f"cannot connect to PostgreSQL at {redact_dsn(dsn)}: {type(exc).__name__}: {exc}"
        ) from None
    return pool
