"""What a relay tells of a settled batch: its observers (metrics, traces) hear the
publication delays and the failures, and the log gets one line per failure."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from ..observability.observer import Observer
from .event import OutboxEvent
from .settle import Settlement

log = logging.getLogger("consumerkit.outbox")


def report(outcome: Settlement, events: Sequence[OutboxEvent], observer: Observer,
           relay: str, outbox: str) -> None:
    """Tell ``observer`` and the log what the batch ``events`` of ``relay`` came to."""
    if outcome.delete:
        now = datetime.now(UTC)
        acked = set(outcome.delete)
        observer.relay_published(outbox, [
            max(0.0, (now - e.occurred_at).total_seconds()) for e in events
            if e.seq in acked])
    if outcome.failures:
        given_up = sum(f.failed for f in outcome.failures)
        observer.relay_failed(outbox, len(outcome.failures) - given_up, given_up)
    for f in outcome.failures:
        level = logging.ERROR if f.failed else logging.WARNING
        log.log(level, "outbox event %s %s failed (attempt %d): %s%s", f.event.event_id,
                f.event.event_type, f.event.attempts + 1, f.error,
                "; FAILED, its aggregate waits for retry or skip" if f.failed else
                f"; next attempt in {f.delay:.1f}s",
                extra={"event_id": str(f.event.event_id), "event_type": f.event.event_type,
                       "key": f.event.aggregate_id, "attempt": f.event.attempts + 1,
                       "attempts": f.event.attempts + 1})
    log.debug("outbox relay %s: %d published, %d failed, %d held back", relay,
              len(outcome.delete), len(outcome.failures), len(outcome.held))
