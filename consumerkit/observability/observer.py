"""The observer seam: the one place each outcome is counted.

The pipeline, the batcher, the engine, the webhook receiver and the relay tell an
:class:`Observer` what happened; :class:`~consumerkit.ConsumerStats`, the Prometheus metrics,
the outcome log lines and the traces are observers. Calls are synchronous and cheap: an
observer increments counters and never awaits.

:func:`fanout` combines observers into one. Observers derive from :class:`BaseObserver` (every
method a no-op) and override what they need; the fan-out calls, per method, only the observers
that override it, so a method nobody overrides costs one call to a no-op. An observer defined
outside consumerkit (one passed in ``observers=``) is guarded: what it raises is logged (once
per method, then at most once a minute with a count) and swallowed, so that a bug in it can
neither fail a message nor stop a consumer. consumerkit's own observers are called directly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..envelope import Envelope, RecordLike
    from ..outbox.replication import SlotState

log = logging.getLogger("consumerkit.observer")

_REPEAT_LOG = 60.0  # seconds between two log lines about the same observer method failing


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

    def unhandled_skipped(self, record: RecordLike, event_type: str, near: str | None) -> None:
        """No handler takes ``record``'s ``event_type`` and the consumer skips such types
        (``Unhandled(policy="skip")``, or an ``Unhandled.ignore`` pattern): nothing written,
        the offset moves on. ``near``: a handled event type close to it (a misspelt
        handler?), else ``None``."""

    def parked(self, record: RecordLike, envelope: Envelope | None, handler: str,
               reason: str, detail: str, attempts: int) -> None:
        """``record`` was parked: its retries ran out (``reason`` ``handler_failed``), or
        its key was parked before it (``key_parked``)."""

    def abandoned(self, records: Sequence[RecordLike]) -> None:
        """``records`` were left unfinished (revocation, shutdown): they will be read again."""

    def handler_finished(self, handler: str, seconds: float) -> None: ...

    def retry(self, record: RecordLike, envelope: Envelope, handler: str, attempt: int,
              delay: float, error: BaseException) -> None: ...

    def cache_hits(self, count: int) -> None:
        """``count`` deliveries were absorbed as duplicates by the dedup cache, before any
        transaction (each is also told as a ``duplicate``)."""

    def batch(self, size: int, committed: bool) -> None:
        """A batch of ``size`` records committed in one transaction, or rolled back (its
        records are then applied one by one)."""

    def offsets_moved_back(self, topic: str, partition: int, stored: int | None,
                           position: int) -> None:
        """After a lost connection the database lacked commits of the partition this
        consumer had seen answered: it moved back (a failover to a standby that missed them, a
        restore). It holds offset ``stored`` (``None``: no row); the consumer, at
        ``position``, reads the partition again from there."""

    # -- the consumer's state --------------------------------------------------------------
    def cache_lookup(self, hits: int, misses: int, errors: int) -> None: ...

    def lag(self, topic: str, partition: int, lag: int | None) -> None:
        """``lag`` is ``None`` once the partition is no longer assigned."""

    def partitions_ahead(self, seconds: float | None) -> None:
        """Seconds from now to the end of the newest dedup partition (``None``: unknown)."""

    def parking(self, keys: int, records: int) -> None:
        """Keys parked on the assigned partitions, and the records waiting behind them."""

    def dead_letters_resolved(self, topic: str, outcome: str, count: int) -> None:
        """``count`` dead letters of ``topic`` replayed, discarded or failed again
        (``outcome``: ``replayed``, ``discarded``, ``replay_failed``) by a command or the
        API (:mod:`consumerkit.engine.dead_letters`)."""

    def stalled(self, reason: str | None) -> None:
        """A failure every record would hit stalled the consumer (``reason``: what it is), or
        the stall is over (``None``)."""

    def replication_slots(self, slots: Sequence[SlotState]) -> None:
        """Every replication slot of the consumer's database (one with an outbox), at each
        maintenance run."""

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

    def unhandled_skipped(self, record: RecordLike, event_type: str, near: str | None) -> None:
        pass

    def parked(self, record: RecordLike, envelope: Envelope | None, handler: str,
               reason: str, detail: str, attempts: int) -> None:
        pass

    def abandoned(self, records: Sequence[RecordLike]) -> None:
        pass

    def handler_finished(self, handler: str, seconds: float) -> None:
        pass

    def retry(self, record: RecordLike, envelope: Envelope, handler: str, attempt: int,
              delay: float, error: BaseException) -> None:
        pass

    def cache_hits(self, count: int) -> None:
        pass

    def batch(self, size: int, committed: bool) -> None:
        pass

    def offsets_moved_back(self, topic: str, partition: int, stored: int | None,
                           position: int) -> None:
        pass

    def cache_lookup(self, hits: int, misses: int, errors: int) -> None:
        pass

    def lag(self, topic: str, partition: int, lag: int | None) -> None:
        pass

    def partitions_ahead(self, seconds: float | None) -> None:
        pass

    def parking(self, keys: int, records: int) -> None:
        pass

    def dead_letters_resolved(self, topic: str, outcome: str, count: int) -> None:
        pass

    def stalled(self, reason: str | None) -> None:
        pass

    def replication_slots(self, slots: Sequence[SlotState]) -> None:
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
            calls = [_guarded(o, name) for o in self.observers if _overrides(o, name)]
            setattr(self, name, _combine(calls, getattr(BaseObserver(), name)))


def _overrides(observer: object, name: str) -> bool:
    if not isinstance(observer, BaseObserver):
        # a plain Protocol implementation: call every method it has (one written before a
        # method was added lacks it)
        return callable(getattr(observer, name, None))
    return getattr(type(observer), name) is not getattr(BaseObserver, name)


def _builtin(observer: object) -> bool:
    return type(observer).__module__.partition(".")[0] == "consumerkit"


def _guarded(observer: object, name: str) -> Callable[..., None]:
    """``observer.name``, called directly if consumerkit's own, else through a guard that
    logs and swallows what it raises (rate-limited: a failing method fails on every call)."""
    call: Callable[..., None] = getattr(observer, name)
    if _builtin(observer):
        return call
    what = f"{type(observer).__qualname__}.{name}"
    logged_at = -_REPEAT_LOG
    failures = 0

    def guard(*args: Any) -> None:
        nonlocal logged_at, failures
        try:
            call(*args)
        except Exception:
            failures += 1
            now = time.monotonic()
            if now - logged_at >= _REPEAT_LOG:
                logged_at = now
                log.exception("observer %s raised (%d times so far); ignored: observers "
                              "must not raise", what, failures)

    return guard


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
    """One observer calling each of ``observers`` in order (one of consumerkit's own itself
    when alone); those defined outside consumerkit are guarded (see the module's text)."""
    if len(observers) == 1 and _builtin(observers[0]):
        return observers[0]
    return Fanout(observers)
