"""The seams of consumerkit, as protocols."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

    from .deadletter.entry import DeadLetterEntry
    from .dedup.policy import DedupPolicy
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
    cached: bool = False  # a DUPLICATE the dedup cache recognised, before any transaction


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One event id to claim, and the handler that is about to apply it."""

    envelope: Envelope
    handler: str


class DedupStore(Protocol):
    """Records processed event ids in the handler's own transaction.

    ``claim_many`` runs as the first statement of ``tx``; the rows it writes commit or roll back
    with the handlers' effects. A concurrent claim of an id held by an open transaction waits
    until that transaction ends, then sees its outcome.
    """

    async def claim_many(
        self, tx: DbConnection, namespace: str, requests: Sequence[ClaimRequest], *,
        enforce_window: bool = True,
    ) -> list[Claim]:
        """Claim each request's event id, one :class:`Claim` per request, in order. An id
        that appears twice in ``requests`` is claimed by its first occurrence; later ones come
        back ``DUPLICATE``. With ``enforce_window`` an event older than the store's retention
        comes back ``EXPIRED`` (its original may have been forgotten)."""
        ...

    async def ended(
        self, tx: DbConnection, namespace: str, claimed: Sequence[ClaimRequest], committed: bool,
    ) -> None:
        """Called once ``tx`` has committed or rolled back, with the requests it claimed.
        Must not raise. Stores that live in the database itself have nothing to do."""
        ...


class DedupCache(Protocol):
    """A cache of applied event ids in front of a :class:`DedupStore` (Redis, say).

    The store stays the source of truth: ``known`` is asked before the transaction, and only
    ids whose transaction committed are ``remember``-ed, with a time to live no longer than the
    store's retention. Neither method raises: an unavailable cache answers "nothing known"
    and the consumer carries on with the store alone.
    """

    on_lookup: Callable[[int, int, int], None] | None
    """Told ``(hits, misses, errors)`` of every lookup (the consumer's metrics), if set."""

    def check(self, policy: DedupPolicy) -> None:
        """Refuse (:class:`~consumerkit.errors.ConfigurationError`) a cache that could outlive
        the store's ``policy.retention``; called when the consumer is built."""
        ...

    async def open(self) -> None: ...

    async def known(self, namespace: str, event_ids: Sequence[str]) -> set[str]: ...

    async def remember(self, namespace: str, event_ids: Sequence[str]) -> None: ...

    async def close(self) -> None: ...


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
