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
import contextlib
import logging
from collections.abc import Iterable, Sequence
from datetime import timedelta

import asyncpg

from ..dedup.partitions import maintain
from ..dedup.policy import DedupPolicy
from ..dedup.postgres import PostgresDedupStore
from ..engine.apply import Applier
from ..engine.decode import Decoded, Decoder
from ..envelope import Record
from ..errors import ConfigurationError, DecodeError, StartupError
from ..migration import migrate
from ..observability.logging import LogObserver, message_fields
from ..observability.observer import Observer, fanout
from ..registry import HandlerRegistry, HandlerSource
from ..route_table import RouteTable
from ..schema import check_synchronous_commit
from ..shared.failures import describe
from ..shared.identifiers import check_name, identifier, redact_dsn
from ..shared.pooler import Pooler, check_pooler, create_pool
from ..shared.webhook import headers as wh
from ..shared.webhook.signature import DEFAULT_TOLERANCE, WebhookSecret, secrets_of, verify
from . import _answers as answers
from ._apply import apply, report
from ._asgi import (
    BodyTooLarge,
    Disconnected,
    Receive,
    Scope,
    Send,
    lifespan,
    read_body,
    request_headers,
)
from ._refusals import claim_refused
from ._request import as_record, attempt_of

log = logging.getLogger("consumerkit.webhook")

_ACQUIRE_TIMEOUT = 10.0  # seconds a request waits for a pool connection before a 503
_STATUS_OF_REASON = {"oversized": 413, "unknown_event_type": 404}  # other reasons: 400


class WebhookReceiver:
    """An ASGI application applying webhook deliveries exactly once in effect.

    ``handlers``: a :class:`~consumerkit.HandlerRegistry`, or functions, modules and registries
    as for a consumer. ``namespace`` scopes the Idempotency-Keys in the dedup table (the same
    namespace as a consumer's name makes a webhook and a Kafka record with one event id count
    as one event). Give ``postgres_dsn`` (the receiver opens and closes its own pool of
    ``pool_size`` connections) or ``pool`` (yours; never closed here).

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
        postgres_dsn: str | None = None, pool: asyncpg.Pool | None = None,
        schema: str = "consumerkit", dedup: DedupPolicy | None = None, migrate: bool = True,
        max_body_bytes: int = 1 << 20, handler_timeout: float | None = 30.0,
        pool_size: int = 10, retry_after: int = 5,
        maintenance_interval: timedelta | None = None,
        secrets: str | WebhookSecret | Iterable[str | WebhookSecret] | None = None,
        allow_unsigned: bool = False, tolerance: float = DEFAULT_TOLERANCE,
        observers: Sequence[Observer] = (), postgres_pooler: Pooler = "none",
    ) -> None:
        self._secrets = secrets_of(secrets)
        if not self._secrets and not allow_unsigned:
            raise ConfigurationError(
                "WebhookReceiver needs secrets= to verify signed requests (or "
                "allow_unsigned=True when another layer authenticates the senders)")
        if not tolerance > 0:
            raise ConfigurationError("tolerance must be positive (seconds)")
        self.tolerance = tolerance
        self.namespace = check_name(namespace, "namespace")
        try:  # what stands in front of PostgreSQL (shared/pooler.py)
            self.pooler = check_pooler(postgres_pooler)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        if (postgres_dsn is None) == (pool is None):
            raise ConfigurationError("give exactly one of postgres_dsn and pool")
        identifier(schema, "schema name")
        if max_body_bytes < 1 or pool_size < 1 or retry_after < 0:
            raise ConfigurationError(
                "max_body_bytes and pool_size must be at least 1, retry_after at least 0")
        if handler_timeout is not None and handler_timeout <= 0:
            raise ConfigurationError("handler_timeout must be positive (or None for no limit)")
        sources = [handlers] if isinstance(handlers, HandlerRegistry) else list(handlers)
        self.routes = RouteTable.build(sources)
        self.schema = schema
        self.dedup = dedup or DedupPolicy()
        self.auto_migrate = migrate
        self.max_body_bytes = max_body_bytes
        self.handler_timeout = handler_timeout
        self.pool_size = pool_size
        self.retry_after = retry_after
        self.maintenance_interval = maintenance_interval or min(
            self.dedup.partition_interval / 4, timedelta(hours=1))
        self._dsn = postgres_dsn
        self._pool = pool
        self._store = PostgresDedupStore(schema, self.dedup)
        self._decoder = Decoder(self.routes, wh.RECEIVER_WIRE, max_body_bytes)
        self._maintenance_wanted = asyncio.Event()
        self._maintenance: asyncio.Task[None] | None = None
        self._open = False
        # outcomes are counted and logged once, by the observers (as for a consumer)
        self.observers = tuple(observers)
        self._observe = fanout([LogObserver(self.namespace, log), *self.observers])
        self._applier = Applier(
            namespace=self.namespace, dedup=self._store, observe=self._observe,
            handler_timeout=handler_timeout, enforce_window=self.dedup.expired != "apply",
            maintenance_wanted=self._maintenance_wanted)

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
                if self.auto_migrate:
                    await migrate(conn, self.schema, self.dedup, namespace=self.namespace)
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
            await self._http(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            await answers.refuse(send, 405, "method_not_allowed", "use POST",
                                 [("Allow", "POST")])
            return
        if not self._open or self._pool is None:
            await answers.unavailable(send, "not_started", "the receiver is not open yet",
                                      self.retry_after)
            return
        headers = request_headers(scope)
        try:
            body = await read_body(receive, headers, self.max_body_bytes)
        except BodyTooLarge:
            await answers.refuse(send, 413, "oversized",
                                 f"the body exceeds {self.max_body_bytes} bytes")
            return
        except Disconnected:
            return
        if self._secrets:  # before anything reads the body: nothing unverified is parsed
            rejected = verify(self._secrets, headers, body, tolerance=self.tolerance)
            if rejected is not None:
                log.warning("refused a webhook request to %r: %s", scope.get("path", "/"),
                            rejected.code)
                await answers.refuse(send, 401, rejected.code, rejected.detail)
                return
        version = wh.version_refusal(headers)
        if version is not None:  # the sender's mistake, not a replay risk: the id stays unspent
            await answers.refuse(send, 400, "invalid_version", version)
            return
        record = as_record(scope, headers, body, self._topic(scope))
        try:
            decoded = self._decoder.decode(record)
        except DecodeError as exc:
            # a signed request refused for good spends its id: see _refusals
            if self._secrets and not await claim_refused(
                    self._pool, self._store, self.namespace, record, exc.reason):
                await answers.unavailable(send, "unavailable", "the database is unavailable",
                                          self.retry_after)
                return
            status = _STATUS_OF_REASON.get(exc.reason, 400)
            await answers.refuse(send, status, exc.reason, exc.detail)
            return
        await self._apply(send, record, decoded, attempt_of(headers))

    def _topic(self, scope: Scope) -> str:
        """``webhook:<path>`` for a path a handler routes on, else ``webhook:<namespace>``:
        the path is the caller's choice, and as a metric label it must stay bounded."""
        topic = f"webhook:{scope.get('path', '/')}"
        return topic if topic in self.routes.by_topic else f"webhook:{self.namespace}"

    async def _apply(self, send: Send, record: Record, decoded: Decoded, attempt: int) -> None:
        assert self._pool is not None
        key = decoded.envelope.event_id
        self._observe.delivered(1)
        try:
            claim = await apply(self._pool, self._applier, decoded, attempt,
                                acquire_timeout=_ACQUIRE_TIMEOUT)
        except Exception as exc:
            if self._secrets and answers.rejected(exc):  # spends the id: see _refusals
                await claim_refused(self._pool, self._store, self.namespace, record, "rejected")
            await answers.failed(send, key, exc, self.retry_after, message_fields(
                record, decoded.envelope, handler=decoded.route.name, attempt=attempt,
                consumer=self.namespace))
            return
        report(self._observe, record, decoded, claim, self.dedup.expired)
        await answers.settled(send, key, claim, self.dedup.expired)

    async def _maintain_forever(self, pool: asyncpg.Pool) -> None:
        """Create dedup partitions ahead and drop expired ones every interval, or at once when
        a claim found no partition for the current time."""
        wanted = self._maintenance_wanted
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.maintenance_interval.total_seconds()):
                    await wanted.wait()
            wanted.clear()
            try:
                async with pool.acquire() as conn:
                    await maintain(conn, self.schema, self.dedup, namespace=self.namespace)
            except Exception as exc:
                log.warning("dedup partition maintenance failed, retrying next interval: %s",
                            describe(exc))

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
