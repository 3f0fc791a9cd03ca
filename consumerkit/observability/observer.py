"""The observer seam: the one place each outcome is counted.

The pipeline, the batcher, the engine, the webhook receiver and the relay tell an
:class:`Observer` what happened; :class:`~consumerkit.ConsumerStats`, the Prometheus metrics,
the outcome log lines and the traces are observers. Calls are synchronous and cheap: an
observer increments counters, never awaits, and never raises (one that does breaks the
message's processing like a bug in consumerkit would).

:func:`fanout` combines observers into one. Observers derive from :class:`BaseObserver` (every
method a no-op) and override what they need; the fan-out calls, per method, only the observers
that override it, so a method nobody overrides costs one call to a no-op.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..envelope import Envelope, RecordLike


class Observer(Protocol):
    """What consumers, webhook receivers and relays report. ``envelope`` is ``None`` for a
    record that could not be decoded (or was recognised by the dedup cache before decoding);
    ``handler`` is the route's name, ``""`` when unknown."""

    # -- messages --------------------------------------------------------------------------
    def delivered(self, count: int) -> None: ...

    def applied(self, record: RecordLike, envelope: Envelope, handler: str) -> None: ...

    def duplicate(self, record: RecordLike, envelope: Envelope | None, handler: str,
                  original_seen_at: datetime | None) -> None: ...

    def dead_lettered(self, record: RecordLike, envelope: Envelope | None, handler: str,
                      reason: str, detail: str, attempts: int) -> None: ...

    def expired_skipped(self, record: RecordLike, envelope: Envelope, handler: str) -> None: ...

    def abandoned(self, count: int) -> None: ...

    def handler_finished(self, handler: str, seconds: float) -> None: ...

    def retry(self, record: RecordLike, envelope: Envelope, handler: str, attempt: int,
              delay: float, error: BaseException) -> None: ...

    # -- the consumer's state --------------------------------------------------------------
    def cache_lookup(self, hits: int, misses: int, errors: int) -> None: ...

    def lag(self, topic: str, partition: int, lag: int | None) -> None:
        """``lag`` is ``None`` once the partition is no longer assigned."""

    def partitions_ahead(self, seconds: float | None) -> None:
        """Seconds from now to the end of the newest dedup partition (``None``: unknown)."""

    # -- the relay -------------------------------------------------------------------------
    def relay_published(self, outbox: str, publish_seconds: Sequence[float]) -> None: ...

    def relay_failed(self, outbox: str, retrying: int, given_up: int) -> None: ...

    def relay_backlog(self, outbox: str, pending: int, oldest_seconds: float,
                      failed: int) -> None: ...

    # -- both ------------------------------------------------------------------------------
    def readiness(self, role: str, name: str, reason: str | None) -> None:
        """``reason`` is ``None`` when ready, else why not."""


class BaseObserver:
    """Every :class:`Observer` method, doing nothing: derive and override what you need."""

    __slots__ = ()

    def delivered(self, count: int) -> None:
        pass

    def applied(self, record: RecordLike, envelope: Envelope, handler: str) -> None:
        pass

    def duplicate(self, record: RecordLike, envelope: Envelope | None, handler: str,
                  original_seen_at: datetime | None) -> None:
        pass

    def dead_lettered(self, record: RecordLike, envelope: Envelope | None, handler: str,
                      reason: str, detail: str, attempts: int) -> None:
        pass

    def expired_skipped(self, record: RecordLike, envelope: Envelope, handler: str) -> None:
        pass

    def abandoned(self, count: int) -> None:
        pass

    def handler_finished(self, handler: str, seconds: float) -> None:
        pass

    def retry(self, record: RecordLike, envelope: Envelope, handler: str, attempt: int,
              delay: float, error: BaseException) -> None:
        pass

    def cache_lookup(self, hits: int, misses: int, errors: int) -> None:
        pass

    def lag(self, topic: str, partition: int, lag: int | None) -> None:
        pass

    def partitions_ahead(self, seconds: float | None) -> None:
        pass

    def relay_published(self, outbox: str, publish_seconds: Sequence[float]) -> None:
        pass

    def relay_failed(self, outbox: str, retrying: int, given_up: int) -> None:
        pass

    def relay_backlog(self, outbox: str, pending: int, oldest_seconds: float,
                      failed: int) -> None:
        pass

    def readiness(self, role: str, name: str, reason: str | None) -> None:
        pass


METHODS = tuple(name for name in vars(BaseObserver)
                if not name.startswith("_") and callable(getattr(BaseObserver, name)))


class Fanout(BaseObserver):
    """Observers as one: each method is bound once, at construction, to the overriding
    observers' methods (one directly, several through a small loop)."""

    __slots__ = ("observers", *METHODS)

    def __init__(self, observers: Sequence[Observer]) -> None:
        self.observers = tuple(observers)
        for name in METHODS:
            calls = [getattr(o, name) for o in self.observers if _overrides(o, name)]
            setattr(self, name, _combine(calls, getattr(BaseObserver(), name)))


def _overrides(observer: object, name: str) -> bool:
    if not isinstance(observer, BaseObserver):
        return True  # a plain Protocol implementation: call every method
    return getattr(type(observer), name) is not getattr(BaseObserver, name)


def _combine(calls: list[Callable[..., None]], noop: Callable[..., None]) -> Callable[..., None]:
    if not calls:
        return noop
    if len(calls) == 1:
        return calls[0]
    bound = tuple(calls)

    def each(*args: Any) -> None:
        for call in bound:
            call(*args)

    return each


def fanout(observers: Sequence[Observer]) -> Observer:
    """One observer calling each of ``observers`` in order (the one itself when alone)."""
    if len(observers) == 1:
        return observers[0]
    return Fanout(observers)
