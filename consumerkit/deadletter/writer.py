"""Sends dead letters to every configured sink, retrying until they are stored."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from ..types import DeadLetterSink
from .entry import DeadLetterEntry

log = logging.getLogger("consumerkit.deadletter")


class DeadLetterWriter:
    """A dead letter is never dropped: a failing sink is retried with back-off (capped at
    ``max_delay``) until it accepts the entry or the message is abandoned (shutdown, revoked
    partition), in which case the offset is not committed and the record comes back."""

    def __init__(self, sinks: Sequence[DeadLetterSink], max_delay: float = 5.0) -> None:
        self.sinks = tuple(sinks)
        self.max_delay = max_delay

    async def write(self, entry: DeadLetterEntry, abandon: asyncio.Event) -> bool:
        """Store ``entry`` in every sink; False if abandoned before all accepted it."""
        for sink in self.sinks:
            delay = 0.1
            while True:
                try:
                    await sink.send(entry)
                    break
                except Exception:
                    log.exception(
                        "dead-letter sink %s failed for %s/%d/%d; retrying in %.1fs",
                        type(sink).__name__, entry.topic, entry.partition, entry.offset, delay,
                    )
                if await wait_or_abandon(abandon, delay):
                    return False
                delay = min(self.max_delay, delay * 2)
        return True


async def wait_or_abandon(abandon: asyncio.Event, delay: float) -> bool:
    """Sleep ``delay`` seconds unless ``abandon`` is set first; True if it was."""
    if abandon.is_set():
        return True
    try:
        await asyncio.wait_for(abandon.wait(), delay)
    except TimeoutError:
        return False
    return True
