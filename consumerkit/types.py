"""The seams of consumerkit, as protocols."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

    from .deadletter.entry import DeadLetterEntry
    from .envelope import Envelope


DbConnection: TypeAlias = "asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]"
"""A connection as asyncpg hands it out: plain, or borrowed from a pool."""


class ClaimStatus(StrEnum):
    """The outcome of claiming an event id inside the handler's transaction."""

    CLAIMED = "claimed"  # first time seen: run the handler
    DUPLICATE = "duplicate"  # already applied (the original's time is known)
    EXPIRED = "expired"  # older than the dedup window: the expired policy decides


@dataclass(frozen=True, slots=True)
class Claim:
    status: ClaimStatus
    original_seen_at: datetime | None = None


class DedupStore(Protocol):
    """Records processed event ids in the handler's own transaction."""

    async def claim(
        self, tx: DbConnection, namespace: str, envelope: Envelope, handler: str, *,
        enforce_window: bool = True,
    ) -> Claim:
        """Claim ``envelope.event_id`` in ``namespace``; must be the first statement of ``tx``.

        A concurrent claim of the same id waits until this transaction ends, then sees it.
        """
        ...


@dataclass(frozen=True, slots=True)
class SinkResources:
    """What a dead-letter sink may use, handed over by the consumer when it starts."""

    pool: asyncpg.Pool
    schema: str
    kafka_bootstrap: str
    kafka_options: dict[str, Any]
    topics: tuple[str, ...] = ()  # the topics the consumer reads


class DeadLetterSink(Protocol):
    """A destination for messages that cannot be applied. ``send`` must be idempotent per
    (consumer, topic, partition, offset) or tolerate repeats: a crash may resend."""

    async def open(self, resources: SinkResources) -> None: ...

    async def send(self, entry: DeadLetterEntry) -> None: ...

    async def close(self) -> None: ...


Job = Callable[[], Awaitable[None]]
