"""Where the relay delivers outbox events: a Kafka topic, a webhook, or your own sink."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ..errors import PermanentSendError
from .event import OutboxEvent

__all__ = ["OutboxSink", "PermanentSendError"]


class OutboxSink(Protocol):
    """Publishes outbox events and reports, per event, whether the destination acknowledged it.

    ``send`` gets events in outbox order; for each one the result is ``None`` (acknowledged:
    durably accepted by the destination) or the exception that prevented it
    (:class:`PermanentSendError` for a refusal that retrying cannot fix). A sink may send a
    batch concurrently, but must not report an event acknowledged unless the destination
    acknowledged it. ``send`` itself raises only for a failure of the whole batch.
    """

    async def open(self) -> None: ...

    async def send(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]: ...

    async def close(self) -> None: ...
