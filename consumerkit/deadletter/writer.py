"""Sends dead letters to every configured sink, retrying until they are stored.

Two kinds of sink failure need opposite treatment:

* **transient** (database or broker away, a lock, a timeout): the same entry will be accepted
  later, so it is retried with capped back-off and the record's lane waits. Dropping it would
  lose the message.
* **permanent** (the sink rejects this entry's content: a value PostgreSQL cannot store, a
  record larger than the broker accepts): retrying the same entry can never succeed and would
  stall the lane forever. The entry is retried once without its value and headers, the part
  that is usually to blame, with the detail saying why; if even that is rejected, the sink is
  skipped for this entry, counted in :attr:`DeadLetterWriter.failures` and logged at ERROR.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence

import asyncpg

from ..display import displayable
from ..errors import RecordTooLargeError
from ..shared import failures
from ..types import DeadLetterSink
from .entry import DETAIL_LIMIT, DeadLetterEntry

log = logging.getLogger("consumerkit.deadletter")

PERMANENT_ERRORS: tuple[type[Exception], ...] = (
    asyncpg.DataError,  # 22xxx: the database refuses a value (asyncpg's encoding errors too)
    TypeError,
    ValueError,
    UnicodeError,
    RecordTooLargeError,
)
"""Sink errors that retrying the same entry cannot fix."""

ERROR_TEXT_LIMIT = 500
"""How much of a rejection's message goes into the reduced entry's detail: asyncpg quotes the
offending argument, which may be the whole value that was too big in the first place."""


def is_permanent(exc: BaseException) -> bool:
    """Whether ``exc`` rejects the entry itself rather than reporting an unavailable sink."""
    return isinstance(exc, PERMANENT_ERRORS)


def describe(exc: BaseException) -> str:
    return displayable(failures.describe(exc), ERROR_TEXT_LIMIT)


def reduced(entry: DeadLetterEntry, exc: BaseException) -> DeadLetterEntry:
    """``entry`` without its value and headers, the detail extended with why they were dropped.

    The key, the position, the reason and the ids stay: enough to find the record on the
    source topic (while its retention lasts) and to know why it failed.
    """
    return dataclasses.replace(
        entry, value=None, headers=(),
        # the detail is cut first, so that storing it does not cut off why they were dropped
        detail=f"{displayable(entry.detail, DETAIL_LIMIT - ERROR_TEXT_LIMIT - 40)} "
               f"[value and headers dropped: {describe(exc)}]")


class DeadLetterWriter:
    """A dead letter is not dropped while a sink may still take it: a transiently failing sink
    is retried with back-off (capped at ``max_delay``) until it accepts the entry or the
    message is abandoned (shutdown, revoked partition), in which case the offset is not
    committed and the record comes back. A permanently rejected entry is handled as the module
    docstring says; ``failures`` counts the (sink, entry) pairs finally given up on."""

    def __init__(self, sinks: Sequence[DeadLetterSink], max_delay: float = 5.0) -> None:
        self.sinks = tuple(sinks)
        self.max_delay = max_delay
        self.failures = 0

    async def write(self, entry: DeadLetterEntry, abandon: asyncio.Event) -> bool:
        """Store ``entry`` in every sink that can take it; False if abandoned first."""
        for sink in self.sinks:
            if not await self._send(sink, entry, abandon):
                return False
        return True

    async def _send(
        self, sink: DeadLetterSink, entry: DeadLetterEntry, abandon: asyncio.Event,
    ) -> bool:
        """Deliver ``entry`` (or its reduced form) to ``sink``; False only if abandoned."""
        name = type(sink).__name__
        where = f"{entry.topic}/{entry.partition}/{entry.offset}"
        fields = {"event_id": entry.event_id, "event_type": entry.event_type,
                  "topic": entry.topic, "partition": entry.partition, "offset": entry.offset,
                  "attempt": entry.attempts, "consumer": entry.consumer}
        current, delay = entry, 0.1
        while True:
            try:
                await sink.send(current)
            except Exception as exc:
                if not is_permanent(exc):
                    log.exception(
                        "dead-letter sink %s failed for %s; retrying in %.1fs", name, where, delay,
                        extra=fields)
                elif current is entry:
                    log.warning("dead-letter sink %s rejected %s (%s); retrying without its "
                                "value and headers", name, where, describe(exc), extra=fields)
                    current = reduced(entry, exc)
                    continue
                else:
                    self.failures += 1
                    log.error(
                        "dead-letter sink %s rejected %s even without its value and headers "
                        "(%s); it is NOT stored there (reason %s, event id %r)",
                        name, where, describe(exc), entry.reason, entry.event_id, extra=fields)
                    return True
            else:
                return True
            if await wait_or_abandon(abandon, delay):
                return False
            delay = min(self.max_delay, delay * 2)


async def wait_or_abandon(abandon: asyncio.Event, delay: float) -> bool:
    """Sleep ``delay`` seconds unless ``abandon`` is set first; True if it was."""
    if abandon.is_set():
        return True
    try:
        async with asyncio.timeout(delay):  # not wait_for: it can swallow a cancel on 3.11
            await abandon.wait()
    except TimeoutError:
        return False
    return True
