"""What a handler receives besides its payload."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from pydantic import BaseModel

from .errors import ConfigurationError

if TYPE_CHECKING:
    from .envelope import Envelope
    from .outbox.writer import Outbox
    from .types import DbConnection

_handler_log = logging.getLogger("consumerkit.handler")


class HandlerContext:
    """The handler's view of one delivery.

    ``tx`` is the asyncpg connection, already inside the transaction that holds the dedup row:
    everything written through it commits (or rolls back) together with that row, and so does
    every event emitted with :meth:`publish`.
    """

    __slots__ = ("_log", "_outbox", "attempt", "envelope", "handler", "tx")

    def __init__(
        self, tx: DbConnection, envelope: Envelope, attempt: int,
        log: logging.LoggerAdapter[logging.Logger] | None = None, *, handler: str = "",
        outbox: Outbox | None = None,
    ) -> None:
        self.tx = tx
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

    async def publish(
        self, *, event_type: str, aggregate_type: str, aggregate_id: str,
        payload: BaseModel | Mapping[str, Any], headers: Mapping[str, str] | None = None,
        occurred_at: datetime | None = None, dedup_key: str | None = None,
    ) -> UUID | None:
        """Emit an event through the consumer's outbox, in this delivery's transaction: it is
        published once the transaction commits, and never if it rolls back. Since a committed
        delivery is absorbed as a duplicate when redelivered, the event is emitted once in
        effect. ``causation_id`` (this event's id) and ``correlation_id`` (this event's, or
        its own id if it has none) are added to ``headers`` unless given.

        Returns the new event's id (``None`` if ``dedup_key`` was already used).
        """
        if self._outbox is None:
            raise ConfigurationError(
                "ctx.publish needs an outbox: pass Consumer(outbox=Outbox(...))")
        env = self.envelope
        linked = {"causation_id": env.event_id,
                  "correlation_id": env.correlation_id or env.event_id, **(headers or {})}
        return await self._outbox.add(
            self.tx, event_type=event_type, aggregate_type=aggregate_type,
            aggregate_id=aggregate_id, payload=payload, headers=linked,
            occurred_at=occurred_at, dedup_key=dedup_key)
