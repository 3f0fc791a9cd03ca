"""What a handler receives besides its payload: :class:`HandlerContext` for one event,
:class:`BatchContext` for a batch handler's list of events."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from pydantic import BaseModel

from .errors import ConfigurationError
from .publishes import Publishes, check_published
from .shared.deferred import Deferred, FlushingConnection, Immediate

if TYPE_CHECKING:
    from .envelope import Envelope
    from .outbox.writer import Outbox
    from .types import DbConnection

_handler_log = logging.getLogger("consumerkit.handler")


class HandlerContext:
    """The handler's view of one delivery.

    ``tx`` is the asyncpg connection, already inside the transaction that holds the dedup row:
    everything written through it commits (or rolls back) together with that row, and so does
    every event emitted with :meth:`publish` and every write queued with :meth:`defer`.
    """

    __slots__ = ("_deferred", "_log", "_outbox", "_owner", "_publishes", "attempt", "envelope",
                 "handler", "tx")

    def __init__(
        self, tx: DbConnection, envelope: Envelope, attempt: int,
        log: logging.LoggerAdapter[logging.Logger] | None = None, *, handler: str = "",
        outbox: Outbox | None = None, deferred: Deferred | None = None, owner: int = 0,
        publishes: tuple[Publishes, ...] | None = None,
    ) -> None:
        self._publishes = publishes
        self._deferred = deferred if deferred is not None else Immediate(tx)
        self._owner = owner
        self.tx: DbConnection = cast("DbConnection", FlushingConnection(tx, self._deferred))
        self.envelope = envelope
        self.attempt = attempt
        self.handler = handler
        self._log = log
        self._outbox = outbox

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger whose records carry the event id, type, key, position, handler name and
        attempt."""
        if self._log is None:
            env = self.envelope
            self._log = logging.LoggerAdapter(_handler_log, {
                "event_id": env.event_id, "event_type": env.event_type, "key": env.key,
                "topic": env.topic, "partition": env.partition, "offset": env.offset,
                "handler": self.handler, "attempt": self.attempt,
            })
        return self._log

    def defer(self, query: str, *args: Any) -> None:
        """Queue a write whose result the handler does not need (not awaited): it is sent in
        this delivery's transaction, in the order queued, together with the other queued
        writes (consecutive writes of one query as one pipelined ``executemany``), before any
        other statement through ``ctx.tx`` and before the commit. If it fails, the attempt
        fails as if the handler had raised."""
        self._deferred.add(query, args, self._owner)

    async def publish(
        self, *, event_type: str, aggregate_type: str, aggregate_id: str,
        payload: BaseModel | Mapping[str, Any], headers: Mapping[str, str] | None = None,
        occurred_at: datetime | None = None, dedup_key: str | None = None,
        version: int | None = None,
    ) -> UUID | None:
        """Emit an event through the consumer's outbox, in this delivery's transaction: it is
        published once the transaction commits, and never if it rolls back. Since a committed
        delivery is absorbed as a duplicate when redelivered, the event is emitted once in
        effect. ``causation_id`` (this event's id) and ``correlation_id`` (this event's, or
        its own id if it has none) are added to ``headers`` unless given.

        Returns the new event's id (``None`` if ``dedup_key`` was already used).
        """
        check_published(self._publishes, self.handler, event_type)
        return await _publish(
            self._outbox, self.tx, self.envelope, event_type=event_type,
            aggregate_type=aggregate_type, aggregate_id=aggregate_id, payload=payload,
            headers=headers, occurred_at=occurred_at, dedup_key=dedup_key, version=version)


class BatchContext:
    """A batch handler's view of its events (``@handler("t", batch=True)``).

    ``envelopes[i]`` is the envelope of ``events[i]``. ``tx`` is the connection, inside the
    batch's transaction, which holds the dedup rows of these events and of the rest of the
    batch: what is written through it commits or rolls back with them.
    """

    __slots__ = ("_deferred", "_log", "_outbox", "_owner", "_publishes", "attempt", "envelopes",
                 "handler", "tx")

    def __init__(
        self, tx: DbConnection, envelopes: Sequence[Envelope], attempt: int, *,
        handler: str = "", outbox: Outbox | None = None, deferred: Deferred | None = None,
        owner: int = 0, publishes: tuple[Publishes, ...] | None = None,
    ) -> None:
        self._publishes = publishes
        self._deferred = deferred if deferred is not None else Immediate(tx)
        self._owner = owner
        self.tx: DbConnection = cast("DbConnection", FlushingConnection(tx, self._deferred))
        self.envelopes: tuple[Envelope, ...] = tuple(envelopes)
        self.attempt = attempt
        self.handler = handler
        self._outbox = outbox
        self._log: logging.LoggerAdapter[logging.Logger] | None = None

    @property
    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        """A logger whose records carry the handler name, the attempt, the number of events
        and the first and last event ids."""
        if self._log is None:
            first, last = self.envelopes[0], self.envelopes[-1]
            self._log = logging.LoggerAdapter(_handler_log, {
                "event_type": first.event_type, "handler": self.handler,
                "attempt": self.attempt, "events": len(self.envelopes),
                "first_event_id": first.event_id, "last_event_id": last.event_id,
            })
        return self._log

    def defer(self, query: str, *args: Any) -> None:
        """Queue a write whose result the handler does not need, as
        :meth:`HandlerContext.defer` does; a failing one fails the batch."""
        self._deferred.add(query, args, self._owner)

    async def publish(
        self, *, caused_by: Envelope, event_type: str, aggregate_type: str, aggregate_id: str,
        payload: BaseModel | Mapping[str, Any], headers: Mapping[str, str] | None = None,
        occurred_at: datetime | None = None, dedup_key: str | None = None,
        version: int | None = None,
    ) -> UUID | None:
        """Emit an event through the consumer's outbox in the batch's transaction, as
        :meth:`HandlerContext.publish` does; ``caused_by`` (one of :attr:`envelopes`) is the
        event that caused it, for its ``causation_id`` and ``correlation_id``."""
        check_published(self._publishes, self.handler, event_type)
        return await _publish(
            self._outbox, self.tx, caused_by, event_type=event_type,
            aggregate_type=aggregate_type, aggregate_id=aggregate_id, payload=payload,
            headers=headers, occurred_at=occurred_at, dedup_key=dedup_key, version=version)


async def _publish(
    outbox: Outbox | None, tx: DbConnection, cause: Envelope, *, event_type: str,
    aggregate_type: str, aggregate_id: str, payload: BaseModel | Mapping[str, Any],
    headers: Mapping[str, str] | None, occurred_at: datetime | None, dedup_key: str | None,
    version: int | None,
) -> UUID | None:
    if outbox is None:
        raise ConfigurationError(
            "ctx.publish needs an outbox: pass Consumer(outbox=Outbox(...))")
    linked = {"causation_id": cause.event_id,
              "correlation_id": cause.correlation_id or cause.event_id, **(headers or {})}
    return await outbox.add(
        tx, event_type=event_type, aggregate_type=aggregate_type,
        aggregate_id=aggregate_id, payload=payload, headers=linked,
        occurred_at=occurred_at, dedup_key=dedup_key, version=version)
