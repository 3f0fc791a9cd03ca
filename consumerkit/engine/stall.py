"""Failures that are not the message's: told from a poison message, and waited out by the
whole consumer.

A failed attempt is *systemic* when every record would hit it:

- PostgreSQL refuses what the statements need: a table, column or schema that does not
  exist, a privilege the role lacks, a read-only transaction (:data:`SYSTEMIC`), wherever it
  is raised (the handler, the claim), also as the ``__cause__`` of the handler's own error;
- one handler fails with the same retriable error type for ``after_keys`` distinct keys in
  a row, with no success of that handler in between (a service it needs is down).

A systemic failure stalls the consumer (:class:`Breaker`): the engine takes no new records,
the records in flight wait before their next attempt instead of spending attempts, and one
of them (the probe, in turns) tries again with capped exponential back-off. The stall ends
when a probe's attempt gets through, or when no record is left waiting; the others then go
on. A probe that fails for a reason of its own hands over: a poison record says nothing of
the cause, and ending the stall on it would only start another. Nothing is
dead-lettered for a stall, and no offset passes a waiting record. Poison, a failure of one
record, still spends its attempts and goes to the dead letters (or parks its key) alone.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import asyncpg

from ..envelope import RecordLike
from ..errors import HandlerSignal, is_retriable
from ..observability.observer import Observer
from ..shared.failures import describe

SYSTEMIC: dict[str, str] = {
    "42P01": "undefined_table",
    "42703": "undefined_column",
    "3F000": "invalid_schema_name",
    "42501": "insufficient_privilege",
    "25006": "read_only_sql_transaction",
}
"""The SQLSTATEs that every record would hit: the database's shape or rights, not the data."""

_CAUSES = 5  # how far down a chain of ``raise ... from`` to look


def systemic(error: BaseException) -> str | None:
    """The SQLSTATE condition name when ``error`` (or what it was raised from) is a
    PostgreSQL error every record would hit, else ``None``."""
    cause = systemic_cause(error)
    return None if cause is None else SYSTEMIC[cause.sqlstate]


def systemic_cause(error: BaseException) -> asyncpg.PostgresError | None:
    """``error``, or the error it was raised from, that every record would hit."""
    cause: BaseException | None = error
    for _ in range(_CAUSES):
        if cause is None:
            return None
        if isinstance(cause, asyncpg.PostgresError) and getattr(
                cause, "sqlstate", None) in SYSTEMIC:
            return cause
        cause = cause.__cause__
    return None


def key_of(record: RecordLike) -> Hashable:
    """Whom a failure happened to, to tell many keys from one: the record's key on its
    partition, or the record itself when it has none."""
    key = record.key if record.key is not None else record.offset
    return record.topic, record.partition, key


@dataclass(slots=True)
class _Streak:
    error: str  # the error type's qualified name
    keys: set[Hashable] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class StallPolicy:
    """When a failure stalls the consumer, and how patiently it is tried again: after
    failed try ``n`` of the probe the wait is random in ``[base/2, base]`` with ``base =
    min(max_delay, initial_delay * multiplier ** (n - 1))``. ``after_keys`` 0: only the
    SQLSTATEs stall."""

    after_keys: int = 5
    initial_delay: float = 0.2
    multiplier: float = 2.0
    max_delay: float = 30.0

    def delay(self, tries: int) -> float:
        base = min(self.max_delay, self.initial_delay * self.multiplier ** min(tries - 1, 64))
        return random.uniform(base / 2, base)  # jitter, not a secret


class Breaker:
    """A consumer's stall: whether it is stalled and why (``reason``), which record probes,
    and each handler's streak of failures."""

    def __init__(self, policy: StallPolicy, observe: Observer) -> None:
        self.policy = policy
        self.observe = observe
        self.reason: str | None = None
        self.probe: object | None = None
        self.tries = 0  # failed tries of the probes in this stall
        self.on_change: Callable[[], None] | None = None  # the engine: fetch again, maybe
        self._wake = asyncio.Event()
        self._streaks: dict[str, _Streak] = {}
        self._waiting: list[object] = []  # records waiting for their turn, longest first

    def holding(self) -> bool:
        """Whether the consumer should take no new records: stalled, and a record probes (with
        none left to probe, new records must come, or nothing would end the stall)."""
        return self.reason is not None and self.probe is not None

    def failed(self, handler: str, key: Hashable, error: BaseException) -> str | None:
        """Why the failure of a record of ``handler`` (its key ``key``) stalls the consumer;
        ``None``: the failure is the record's own."""
        if isinstance(error, HandlerSignal) or not is_retriable(error):
            return None  # the handler's own decision about this record
        if (cause := systemic_cause(error)) is not None:
            return (f"handler {handler} cannot run: {SYSTEMIC[cause.sqlstate]}: "
                    f"{describe(cause)}")
        after = self.policy.after_keys
        if after <= 0:
            return None
        kind = f"{type(error).__module__}.{type(error).__qualname__}"
        streak = self._streaks.get(handler)
        if streak is None or streak.error != kind:
            streak = self._streaks[handler] = _Streak(kind)
        if len(streak.keys) < after:
            streak.keys.add(key)
        if len(streak.keys) < after:
            return None
        return f"handler {handler} failed for {after} keys in a row: {describe(error)}"

    def succeeded(self, handler: str) -> None:
        """A record of ``handler`` was applied: its streak ends."""
        if self._streaks:
            self._streaks.pop(handler, None)

    def stall(self, me: object, reason: str) -> float | None:
        """Stall (or stay stalled) for ``reason``; ``me`` becomes the probe if none is. The
        seconds ``me`` waits before trying again as the probe, ``None`` when another record
        probes (``me`` then waits for its turn, :meth:`turn`)."""
        if self.reason is None:
            self.reason, self.tries = reason, 0
            self.observe.stalled(reason)
            self._changed()
        if self.probe is None:
            self.probe = me
        if self.probe is not me:
            return None
        self.reason = reason  # the probe's latest: the cause may have changed meanwhile
        self.tries += 1
        return self.policy.delay(self.tries)

    def resolved(self, me: object) -> None:
        """``me`` got through (applied, or a duplicate): if it probes, the stall is over."""
        if self.probe is me:
            self.probe = None
            if self.reason is not None:
                self.reason = None
                self.observe.stalled(None)
            self._changed()

    def leave(self, me: object) -> None:
        """``me`` stops probing: it failed for a reason of its own (a poison record says
        nothing of the cause), or it is done, revoked or stopping. A waiting record probes
        next; with none waiting the stall holds nothing back and is over (a record that
        meets the cause again stalls anew)."""
        if self.probe is not me:
            return
        self.probe = None
        if not self._waiting and self.reason is not None:
            self.reason = None
            self.observe.stalled(None)
        self._changed()

    async def turn(self, me: object, abandon: asyncio.Event) -> bool:
        """Wait until the stall is over, or it is ``me``'s turn to probe; ``False`` when
        ``abandon`` is set first. A probe coming back for its next try hands over to the
        record that has waited longest: the probes take turns, so a stall whose probe is a
        poison record (one that fails the same way for a reason of its own) still ends once
        the others would pass."""
        if self.reason is not None and self.probe is me and self._waiting:
            self.probe = self._waiting[0]
            self._changed()
        self._waiting.append(me)
        try:
            while self.reason is not None and self.probe is not me:
                if self.probe is None:
                    self.probe = me
                    self._changed()
                    break
                wake = asyncio.ensure_future(self._wake.wait())
                left = asyncio.ensure_future(abandon.wait())
                try:
                    await asyncio.wait({wake, left}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    wake.cancel()
                    left.cancel()
                if abandon.is_set():
                    return False
            return True
        finally:
            self._waiting.remove(me)

    def _changed(self) -> None:
        """Wake the records waiting for their turn, and the engine."""
        self._wake.set()
        self._wake = asyncio.Event()
        if self.on_change is not None:
            self.on_change()
