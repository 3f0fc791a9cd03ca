"""Failures that are not the message's: told from a poison message, and waited out by the
whole consumer.

Whose fault a failed attempt is: :mod:`~consumerkit.engine.systemic`. When no cause says, it
is the record's own unless one handler fails with the same retriable error type for
``after_keys`` distinct keys in a row with no success in between (a *streak*: a service it
needs is down).

A systemic failure or a streak stalls the consumer (:class:`Breaker`): the records of the
stalled handlers (of all, when a cause says so) wait instead of spending attempts, and one
of them (the probe, in turns, those not yet tried first) tries again with capped exponential
back-off. The stall ends when a probe gets through, or when no record is left waiting. A
stall a cause vouches for takes no new records meanwhile. A streak may be poison records
each failing alone, which their probes never clear: once every waiting record has failed,
new records come, and when one that never failed gets through, the records that failed
during the stall are judged one by one (their attempts, then the dead letters or parking);
new records failing alike keep the stall. Nothing is dead-lettered for a stall, and no
offset passes a waiting record.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from ..envelope import RecordLike
from ..errors import HandlerSignal, is_retriable
from ..observability.observer import Observer
from ..shared.failures import describe, sqlstate
from .systemic import SYSTEMIC, fault


def key_of(record: RecordLike) -> Hashable:
    """Whom a failure happened to, to tell many keys from one: the record's key on its
    partition, or the record itself when it has none."""
    key = record.key if record.key is not None else record.offset
    return record.topic, record.partition, key


@dataclass(slots=True)
class _Streak:
    error: str  # the error type's qualified name
    keys: set[Hashable] = field(default_factory=set)
    records: dict[int, object] = field(default_factory=dict)  # by id: the ones that failed


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why a failure stalls the consumer: ``reason`` (told to the observers), the handler,
    and whether a cause vouches for it (``certain``) rather than a streak of failures."""

    reason: str
    handler: str
    certain: bool


@dataclass(frozen=True, slots=True)
class StallPolicy:
    """When a failure stalls the consumer, and how patiently it is tried again: after
    failed try ``n`` of the probe the wait is random in ``[base/2, base]`` with ``base =
    min(max_delay, initial_delay * multiplier ** (n - 1))``. ``after_keys`` 0: only the
    causes stall (the SQLSTATEs, ``systemic = True``)."""

    after_keys: int = 5
    initial_delay: float = 0.2
    multiplier: float = 2.0
    max_delay: float = 30.0

    def delay(self, tries: int) -> float:
        base = min(self.max_delay, self.initial_delay * self.multiplier ** min(tries - 1, 64))
        return random.uniform(base / 2, base)  # jitter, not a secret


class Breaker:
    """A consumer's stall: whether it is stalled and why (``reason``), which record probes,
    and each handler's streak of failures. Records are told apart by identity."""

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
        self._certain = False  # a cause vouches for this stall: every handler waits
        self._handlers: set[str] = set()  # else the handlers whose streaks stalled it
        self._tried: dict[int, object] = {}  # the records that failed during the stall
        self._alone: dict[int, object] = {}  # acquitted by a stall: judged one by one

    def holding(self) -> bool:
        """Whether the consumer should take no new records: stalled, a record probes (with
        none, new records must come, or nothing would end the stall), and a cause vouches
        for the stall or a waiting record has not tried yet (a streak's stall that every
        waiting record failed lets new records come and try)."""
        if self.reason is None or self.probe is None:
            return False
        return self._certain or any(id(r) not in self._tried
                                    for r in (self.probe, *self._waiting))

    def blocks(self, handler: str) -> bool:
        """Whether a record of ``handler`` waits for the stall before its next attempt."""
        return self.reason is not None and (self._certain or handler in self._handlers)

    def failed(self, handler: str, key: Hashable, error: BaseException,
               me: object = None) -> Verdict | None:
        """Why the failure of ``me``, a record of ``handler`` (its key ``key``), stalls the
        consumer; ``None``: the failure is the record's own."""
        if isinstance(error, HandlerSignal) or not is_retriable(error):
            return None  # the handler's own decision about this record
        if (said := fault(error)) is not None:
            every, cause = said
            if not every:
                return None  # its data: a check, a unique key, an encoding, ...
            name = SYSTEMIC.get(sqlstate(cause) or "")
            return Verdict(f"handler {handler} cannot run: {f'{name}: ' if name else ''}"
                           f"{describe(cause)}", handler, certain=True)
        after = self.policy.after_keys
        if after <= 0 or (me is not None and id(me) in self._alone):
            return None
        kind = f"{type(error).__module__}.{type(error).__qualname__}"
        streak = self._streaks.get(handler)
        if streak is None or streak.error != kind:
            streak = self._streaks[handler] = _Streak(kind)
        if me is not None:
            streak.records[id(me)] = me
        if len(streak.keys) < after:
            streak.keys.add(key)
        if len(streak.keys) < after:
            return None
        return Verdict(f"handler {handler} failed for {after} keys in a row: "
                       f"{describe(error)}", handler, certain=False)

    def succeeded(self, handler: str, me: object = None) -> None:
        """``me``, a record of ``handler``, was applied: its streak ends, and so does a
        streak's stall of that handler if ``me`` never failed in it (not every record
        fails: those that did are judged one by one)."""
        if self._streaks:
            self._streaks.pop(handler, None)
        if (me is not None and self.blocks(handler) and not self._certain
                and id(me) not in self._tried):
            self._end(acquit=True)

    def stall(self, me: object, verdict: Verdict) -> float | None:
        """Stall (or stay stalled) for ``verdict``; ``me`` becomes the probe if none is. The
        seconds ``me`` waits before trying again as the probe, ``None`` when another record
        probes (``me`` then waits for its turn, :meth:`turn`)."""
        if self.reason is None:
            self.reason, self.tries = verdict.reason, 0
            self.observe.stalled(verdict.reason)
            # a new stall: the records acquitted by the last one wait in it like any other,
            # rather than spend their attempts against what may be a service down after all
            self._alone.clear()
        if verdict.certain:
            self._certain = True
        else:  # the records whose failures made the streak have tried too
            self._handlers.add(verdict.handler)
            if (streak := self._streaks.get(verdict.handler)) is not None:
                self._tried.update(streak.records)
        self._tried[id(me)] = me
        if self.probe is None:
            self.probe = me
        self._changed()  # every record may have tried now: new ones may come
        if self.probe is not me:
            return None
        self.reason = verdict.reason  # the probe's latest: the cause may have changed
        self.tries += 1
        return self.policy.delay(self.tries)

    def resolved(self, me: object, *, ran: bool = True) -> None:
        """``me`` got through (applied, or a duplicate): if it probes, the stall is over; if
        its handler ran (``ran``: not a duplicate, which proves nothing of the cause) and it
        had not failed in the stall either, the failures of a streak's stall were each their
        record's own."""
        if self.probe is me:
            self._end(acquit=ran and id(me) not in self._tried)

    def leave(self, me: object) -> None:
        """``me`` stops probing: it failed for a reason of its own (a poison record says
        nothing of the cause), or it is done, revoked or stopping. A waiting record probes
        next; with none waiting the stall holds nothing back and is over (a record that
        meets the cause again stalls anew)."""
        if self.probe is not me:
            return
        self._tried[id(me)] = me
        if not self._waiting:
            self._end(acquit=False)
            return
        self.probe = self._next()
        self._changed()

    def done(self, me: object) -> None:
        """``me`` is settled, revoked or stopping: it stops probing and is forgotten."""
        self.leave(me)
        self._tried.pop(id(me), None)
        self._alone.pop(id(me), None)
        for streak in self._streaks.values():
            streak.records.pop(id(me), None)

    async def turn(self, me: object, abandon: asyncio.Event) -> bool:
        """Wait until the stall is over, or it is ``me``'s turn to probe; ``False`` when
        ``abandon`` is set first. A probe coming back for its next try hands over to a
        record not yet tried, else to the one that has waited longest: the probes take
        turns, so a stall whose probe is a poison record (one that fails the same way for
        a reason of its own) still ends once the others would pass."""
        if self.reason is not None and self.probe is me and self._waiting:
            self.probe = self._next()
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

    def _next(self) -> object | None:
        """The next probe: the longest waiting of the records not yet tried, else of all."""
        fresh = (r for r in self._waiting if id(r) not in self._tried)
        return next(fresh, self._waiting[0] if self._waiting else None)

    def _end(self, *, acquit: bool) -> None:
        """The stall is over; ``acquit``: a record that never failed in a streak's stall got
        through, so the records that did are judged one by one from now on."""
        if acquit and not self._certain:
            self._alone.update(self._tried)
        self.probe = None
        self._certain = False
        self._handlers.clear()
        self._tried.clear()
        if self.reason is not None:
            self.reason = None
            self.observe.stalled(None)
        self._changed()

    def _changed(self) -> None:
        """Wake the records waiting for their turn, and the engine."""
        self._wake.set()
        self._wake = asyncio.Event()
        if self.on_change is not None:
            self.on_change()
